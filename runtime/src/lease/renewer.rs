//! One task per runtime renews every lease held on it. A call registers its lease, and ends the
//! registration when it drops it: no task is spawned, woken or aborted per call. The task sleeps
//! until the earliest renewal is due, so a call shorter than a third of its lease never makes
//! it run, and a registration wakes it only when its renewal falls due before the task would
//! wake by itself (or the task waits for none).
//!
//! Renewals run concurrently inside the task, so a renewal the store holds up holds up no other
//! lease; a store that panics while renewing, or a log sink that panics while a renewal is
//! logged, fails that renewal alone, which is tried again soon, as after any failed renewal.
//!
//! The task is spawned on the runtime of the first registration made on it, and ends with that
//! runtime. A runtime's renewer is found through the thread's last one (the common case: a
//! worker thread belongs to one runtime), else through a registry of the runtimes' renewers.
//!
//! A multi-thread runtime can leave its timers unfired while a worker blocks: the worker that
//! woke from the timer driver runs a task that blocks its thread, and the other workers sleep
//! on their own, none of them on the driver, so no timer fires until one is woken (tokio issue
//! 4730). A renewer sleeping on its timer then renews nothing, and the blocked body's lease
//! lapses; a renewal under way, waiting on the store's I/O or a timer, never ends. One thread of
//! the process watches every such runtime's renewer: when a renewal has been due, or under
//! way, for more than an eighth of its period, it wakes the renewer from outside the runtime,
//! which wakes a sleeping worker; that worker runs the renewer and then sleeps on the driver, so
//! the runtime's timers and I/O go on again.
//!
//! The watch sleeps until the earliest renewal is overdue (and no longer than half the shortest
//! renewal period it has seen, so a registration made meanwhile is watched too), and parks
//! while no runtime has registered a lease since it last looked: a registration costs it one
//! atomic read, and wakes it only after such a pause.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::{Handle, Id, RuntimeFlavor};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{period_of, renew_judged};
use crate::observe::Renewals;
use crate::store::{RecordKey, Store, Token};

/// A lease registered with its runtime's renewer, renewed until this is dropped.
pub(crate) struct Registration {
    renewer: Arc<Renewer>,
    id: u64,
}

impl Registration {
    /// Registers `token`'s lease on `runtime`'s renewer (the runtime the caller runs on), first
    /// renewed a third of `lease` from now.
    pub(crate) fn new(
        runtime: &Handle,
        store: Arc<dyn Store>,
        rkey: RecordKey,
        token: Token,
        lease: Duration,
    ) -> Registration {
        let renewer = Renewer::of(runtime);
        let period = period_of(lease);
        let due = Instant::now() + period;
        let held = Held {
            store,
            rkey,
            token,
            lease,
            renewals: Renewals::of_current(),
            due: Some(due),
            since: None,
            lost: false,
        };
        let (id, wake) = {
            let mut state = renewer.lock();
            let id = state.next_id;
            state.next_id += 1;
            state.held.insert(id, held);
            state.due.insert((due, id));
            state.shortest = Some(state.shortest.map_or(period, |p| p.min(period)));
            let wake = state.wakes_at.is_none_or(|at| due < at);
            if wake {
                state.wakes_at = Some(due);
                renewer.woken.store(true, Ordering::Release);
            }
            (id, wake)
        };
        if wake {
            renewer.wake.notify_one();
        }
        if renewer.watched {
            watch::waken();
        }
        Registration { renewer, id }
    }

    /// True when the renewer's task was woken and has not run since. Woken from a worker
    /// thread, it waits in that worker's own slot, which no other worker takes from: a body
    /// that blocks the thread would keep it there (see [`drive`](super::drive)).
    pub(crate) fn renewer_woken(&self) -> bool {
        self.renewer.woken.load(Ordering::Acquire)
    }

    /// True once a renewal found the reservation no longer held by its token.
    pub(crate) fn lost(&self) -> bool {
        self.renewer
            .lock()
            .held
            .get(&self.id)
            .is_some_and(|held| held.lost)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let held = {
            let mut state = self.renewer.lock();
            let held = state.held.remove(&self.id);
            if let Some(due) = held.as_ref().and_then(|held| held.due) {
                state.due.remove(&(due, self.id));
            }
            if let Some(since) = held.as_ref().and_then(|held| held.since) {
                state.started.remove(&(since, self.id));
            }
            held
        };
        // The store and the key are let go of outside the lock.
        drop(held);
    }
}

/// One runtime's renewer: the leases it holds, and the wake-up of its task.
struct Renewer {
    state: Mutex<State>,
    wake: Notify,
    /// Set when a registration wakes the task, cleared each time the task runs.
    woken: AtomicBool,
    /// Set when the task has ended (its runtime shut down): a registration finds a new one.
    ended: AtomicBool,
    /// Whether the watch looks after this renewer: true on a multi-thread runtime.
    watched: bool,
    /// The runtime, for the watch to wake (taken when the task ends, so a renewer a thread
    /// still knows does not keep a runtime that is gone).
    runtime: Mutex<Option<Handle>>,
    /// Set once the watch has found a renewal of this runtime overdue (logged the first time).
    held_up: AtomicBool,
}

#[derive(Default)]
struct State {
    held: HashMap<u64, Held>,
    /// When each lease's next renewal is due, earliest first.
    due: BTreeSet<(Instant, u64)>,
    /// When each renewal under way started, earliest first.
    started: BTreeSet<(Instant, u64)>,
    next_id: u64,
    /// When the task wakes by itself; none while it waits to be woken.
    wakes_at: Option<Instant>,
    /// The shortest renewal period of a lease registered here: the watch looks at least twice
    /// in that time.
    shortest: Option<Duration>,
    /// `next_id` when the watch last looked: a registration made since keeps it awake.
    looked: u64,
}

/// A lease the renewer holds.
struct Held {
    store: Arc<dyn Store>,
    rkey: RecordKey,
    token: Token,
    lease: Duration,
    /// The call the lease is held for: renewals are counted there and logged in its span.
    renewals: Renewals,
    /// When its next renewal is due: none while one is under way, or once the lease was lost.
    due: Option<Instant>,
    /// When its renewal under way started: none while none is.
    since: Option<Instant>,
    lost: bool,
}

/// The renewers of the runtimes that have one.
static RENEWERS: Mutex<Vec<(Id, Arc<Renewer>)>> = Mutex::new(Vec::new());

thread_local! {
    /// The renewer this thread registered with last, and its runtime.
    static LAST: RefCell<Option<(Id, Arc<Renewer>)>> = const { RefCell::new(None) };
}

impl Renewer {
    /// `handle`'s renewer, its task started if it has none.
    fn of(handle: &Handle) -> Arc<Renewer> {
        let id = handle.id();
        let near = LAST.try_with(|last| {
            let mut last = last.borrow_mut();
            if let Some((at, renewer)) = &*last {
                if *at == id && !renewer.ended.load(Ordering::Acquire) {
                    return renewer.clone();
                }
            }
            let renewer = Renewer::registered(handle, id);
            *last = Some((id, renewer.clone()));
            renewer
        });
        // A thread whose locals are being torn down asks the registry.
        near.unwrap_or_else(|_| Renewer::registered(handle, id))
    }

    /// `handle`'s renewer, from the registry or started.
    fn registered(handle: &Handle, id: Id) -> Arc<Renewer> {
        let renewer = {
            let mut renewers = RENEWERS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, renewer)) = renewers
                .iter()
                .find(|(at, renewer)| *at == id && !renewer.ended.load(Ordering::Acquire))
            {
                return renewer.clone();
            }
            let renewer = Arc::new(Renewer {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                woken: AtomicBool::new(false),
                ended: AtomicBool::new(false),
                watched: handle.runtime_flavor() == RuntimeFlavor::MultiThread,
                runtime: Mutex::new(Some(handle.clone())),
                held_up: AtomicBool::new(false),
            });
            renewers.retain(|(_, renewer)| !renewer.ended.load(Ordering::Acquire));
            renewers.push((id, renewer.clone()));
            renewer
        };
        // Spawned outside the registry's lock: on a runtime shutting down, the task is dropped
        // at once, and its drop takes that lock.
        handle.spawn(run(Ended(renewer.clone())));
        if renewer.watched {
            watch::start();
        }
        renewer
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The renewer's hold on itself in its task: when the task ends (its runtime shut down, the
/// task dropped), the renewer is marked ended and leaves the registry.
struct Ended(Arc<Renewer>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Release);
        self.0
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        RENEWERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, renewer)| !Arc::ptr_eq(renewer, &self.0));
    }
}

/// The renewer's task: starts the renewals that are due, settles those that end, and sleeps
/// until the next is due or a registration wakes it.
async fn run(ended: Ended) {
    let renewer = &*ended.0;
    let mut under_way = FuturesUnordered::new();
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
        renewer.woken.store(false, Ordering::Release);
        let now = Instant::now();
        let next = {
            let mut state = renewer.lock();
            while let Some(&(at, id)) = state.due.first() {
                if at > now {
                    break;
                }
                state.due.pop_first();
                if let Some(held) = state.held.get_mut(&id) {
                    held.due = None;
                    held.since = Some(now);
                    under_way.push(renew(id, held));
                    state.started.insert((now, id));
                }
            }
            let next = state.due.first().map(|&(at, _)| at);
            state.wakes_at = next;
            next
        };
        if let Some(at) = next {
            sleep.as_mut().reset(at);
        }
        tokio::select! {
            biased;
            Some((id, next)) = under_way.next(), if !under_way.is_empty() => {
                settle(renewer, id, next);
            }
            () = renewer.wake.notified() => {}
            () = &mut sleep, if next.is_some() => {}
        }
    }
}

/// One renewal of `held`, lease `id`, and when the next is due (see [`renew_judged`]): judged,
/// counted and logged here, outside the renewer's lock, which every keyed call takes.
fn renew(id: u64, held: &Held) -> impl Future<Output = (u64, Option<Duration>)> + 'static {
    let (store, rkey, token) = (held.store.clone(), held.rkey.clone(), held.token.clone());
    let (lease, renewals) = (held.lease, held.renewals.clone());
    async move {
        (
            id,
            renew_judged(&*store, &rkey, &token, lease, &renewals).await,
        )
    }
}

/// Schedules lease `id`'s next renewal `next` from now, or marks it lost (none). A lease whose
/// registration ended meanwhile is forgotten.
fn settle(renewer: &Renewer, id: u64, next: Option<Duration>) {
    let now = Instant::now();
    let mut state = renewer.lock();
    let Some(held) = state.held.get_mut(&id) else {
        return;
    };
    let since = held.since.take();
    match next {
        Some(wait) => {
            let due = now + wait;
            held.due = Some(due);
            state.due.insert((due, id));
        }
        None => held.lost = true,
    }
    if let Some(since) = since {
        state.started.remove(&(since, id));
    }
}

/// The watch over the renewers of multi-thread runtimes (see the module's doc).
mod watch {
    use super::*;

    /// Set while the watch is parked until a registration wakes it.
    static ASLEEP: AtomicBool = AtomicBool::new(false);
    /// The watch's thread; none if the process could not start one.
    static THREAD: OnceLock<Option<Thread>> = OnceLock::new();

    /// Starts the watch, unless it has started.
    pub(super) fn start() {
        THREAD.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("toolkey-lease-watch".into())
                .spawn(run);
            match started {
                Ok(thread) => Some(thread.thread().clone()),
                Err(error) => {
                    tracing::warn!(%error, "could not start the thread that watches lease renewals: a worker that blocks its thread can hold renewals up until another worker wakes");
                    None
                }
            }
        });
    }

    /// Wakes the watch if it is parked: called after each registration on a watched renewer,
    /// whose lock it held (the watch parks only after looking at every renewer under its lock,
    /// so either it sees the registration, or the registration sees it asleep).
    pub(super) fn waken() {
        if ASLEEP.load(Ordering::Relaxed) && ASLEEP.swap(false, Ordering::AcqRel) {
            if let Some(Some(thread)) = THREAD.get() {
                thread.unpark();
            }
        }
    }

    /// The watch's thread: looks at every watched renewer, wakes those with a renewal overdue,
    /// and sleeps until it should look again, or parks while no runtime has used its renewer.
    fn run() {
        loop {
            if let Some(at) = look() {
                let now = Instant::now();
                if at > now {
                    std::thread::park_timeout(at - now);
                }
                continue;
            }
            ASLEEP.store(true, Ordering::SeqCst);
            if look().is_some() {
                ASLEEP.store(false, Ordering::SeqCst);
                continue;
            }
            std::thread::park();
        }
    }

    /// Looks at every watched renewer, wakes each whose earliest renewal is overdue, and says
    /// when to look again: none if no renewer holds a lease or was registered with since the
    /// last look.
    fn look() -> Option<Instant> {
        let renewers: Vec<Arc<Renewer>> = RENEWERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, renewer)| renewer.watched)
            .map(|(_, renewer)| renewer.clone())
            .collect();
        let now = Instant::now();
        let mut again: Option<Instant> = None;
        for renewer in renewers {
            let (next, overdue) = look_at(&renewer, now);
            if overdue {
                wake(&renewer);
            }
            again = match (again, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        again
    }

    /// When to look at `renewer` again (none while it holds nothing and was not registered with
    /// since the last look), and whether a renewal is overdue: due more than an eighth of its
    /// period ago, when the renewer would have started it, or under way for longer than that.
    pub(super) fn look_at(renewer: &Renewer, now: Instant) -> (Option<Instant>, bool) {
        let mut state = renewer.lock();
        let fresh = state.next_id != state.looked;
        state.looked = state.next_id;
        if state.held.is_empty() && !fresh {
            return (None, false);
        }
        let half = state.shortest.map_or(Duration::from_millis(5), |p| p / 2);
        let mut again = now + half;
        let mut overdue = false;
        // The earliest renewal due, and the earliest under way: one under way waits on the
        // runtime's timers or I/O too, which the same stall holds up.
        for first in [state.due.first(), state.started.first()] {
            let Some(&(at, id)) = first else {
                continue;
            };
            let grace = state
                .held
                .get(&id)
                .map_or(Duration::ZERO, |held| period_of(held.lease) / 8);
            if at + grace <= now {
                overdue = true;
                again = again.min(now + grace.max(Duration::from_millis(1)));
            } else {
                again = again.min(at + grace);
            }
        }
        (Some(again), overdue)
    }

    /// Wakes `renewer` from outside its runtime: a task spawned from here wakes a sleeping
    /// worker, which runs it (it wakes the renewer), takes the renewer over from a blocked
    /// worker's queue if it waits there, and sleeps on the runtime's driver after.
    fn wake(renewer: &Arc<Renewer>) {
        let runtime = renewer
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(runtime) = runtime else {
            return;
        };
        if !renewer.held_up.swap(true, Ordering::Relaxed) {
            tracing::warn!("a lease renewal was overdue on a multi-thread runtime (a tool body may be blocking its worker thread; run blocking work with tokio::task::spawn_blocking): the renewer was woken from outside the runtime");
        }
        let renewer = renewer.clone();
        drop(runtime.spawn(async move { renewer.wake.notify_one() }));
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::lease::{drive, Renewal};
    use crate::store::faults::{Fault, FaultyStore, Op, Plan};
    use crate::store::{MemoryStore, Reservation, Reservations};
    use crate::Fingerprint;
    use std::sync::atomic::AtomicUsize;

    /// A memory store whose renewals are counted, faulted as `plan` says.
    fn store(plan: Plan) -> Arc<FaultyStore<MemoryStore>> {
        Arc::new(FaultyStore::new(MemoryStore::new(), plan))
    }

    /// `key` reserved in `store` under a new token.
    async fn reserved(store: &Arc<FaultyStore<MemoryStore>>, key: &str) -> (RecordKey, Token) {
        let rkey = RecordKey::new("acme", key);
        let token = Token::generate();
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let reserved = store
            .reserve(&rkey, "tool", &fp, &token, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(reserved, Reservation::Reserved { .. }));
        (rkey, token)
    }

    /// `token`'s lease registered on the current runtime's renewer.
    fn register(
        store: Arc<FaultyStore<MemoryStore>>,
        rkey: RecordKey,
        token: Token,
        lease: Duration,
    ) -> Registration {
        Registration::new(&Handle::current(), store, rkey, token, lease)
    }

    /// The leases a renewer holds, and the renewals it has due.
    fn held(renewer: &Renewer) -> (usize, usize) {
        let state = renewer.lock();
        (state.held.len(), state.due.len())
    }

    const LEASE: Duration = Duration::from_millis(300);

    /// A registered lease is renewed every third of it; once its registration ends the renewer
    /// holds nothing and has nothing due, and renews no more.
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_renewed_while_registered_and_forgotten_after() {
        let store = store(Plan::script([]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store.clone(), rkey, token, LEASE);
        let renewer = registration.renewer.clone();
        assert_eq!(held(&renewer), (1, 1));
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(store.calls(Op::Renew), 3, "renewed at 100, 200 and 300 ms");
        assert!(renewer.lock().started.is_empty(), "none under way");
        assert!(!registration.lost());
        drop(registration);
        assert_eq!(held(&renewer), (0, 0));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(store.calls(Op::Renew), 3);
    }

    /// A renewal that finds the reservation no longer held by its token marks the lease lost,
    /// and it is not renewed again; a failed renewal is tried again soon, and the lease goes on.
    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_is_not_renewed_again_and_a_failed_renewal_is_retried() {
        let failing = store(Plan::script([(Op::Renew, Fault::FailBefore)]));
        let released = store(Plan::script([]));
        let (kept_key, kept_token) = reserved(&failing, "kept").await;
        let (lost_key, lost_token) = reserved(&released, "lost").await;
        let kept = register(failing.clone(), kept_key, kept_token, LEASE);
        let lost = register(
            released.clone(),
            lost_key.clone(),
            lost_token.clone(),
            LEASE,
        );
        released.release(&lost_key, &lost_token).await.unwrap();
        // At 100 ms one renewal fails, and the other finds its key released.
        tokio::time::sleep(Duration::from_millis(110)).await;
        assert_eq!(
            (failing.calls(Op::Renew), released.calls(Op::Renew)),
            (1, 1)
        );
        assert!(lost.lost() && !kept.lost());
        assert_eq!(
            held(&kept.renewer),
            (2, 1),
            "the lost lease has nothing due"
        );
        // The failed one is tried again 12.5 ms later (an eighth of its period), then renewed
        // every 100 ms: at 112.5, 212.5, 312.5 and 412.5 ms. The lost one, never again.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            (failing.calls(Op::Renew), released.calls(Op::Renew)),
            (5, 1)
        );
        assert!(lost.lost() && !kept.lost());
    }

    /// A log subscriber that runs its closure at each event, and does nothing else.
    struct OnEvent<F>(F);

    impl<F: Fn() + Send + Sync + 'static> tracing::Subscriber for OnEvent<F> {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            (self.0)();
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A log sink whose first event panics.
    fn panicking_log() -> tracing::subscriber::DefaultGuard {
        let panicked = AtomicBool::new(false);
        tracing::subscriber::set_default(OnEvent(move || {
            if !panicked.swap(true, Ordering::Relaxed) {
                panic!("the log sink failed");
            }
        }))
    }

    /// A failed renewal is logged outside the renewer's lock, which every keyed call on the
    /// runtime takes: a slow log sink holds up no call.
    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_is_logged_outside_the_renewers_lock() {
        // Each event: whether the renewer's lock was held when it was logged.
        let seen: Arc<Mutex<Option<Arc<Renewer>>>> = Arc::default();
        let events: Arc<Mutex<Vec<bool>>> = Arc::default();
        let witness = {
            let (seen, events) = (seen.clone(), events.clone());
            OnEvent(move || {
                if let Some(renewer) = &*seen.lock().unwrap() {
                    let held = renewer.state.try_lock().is_err();
                    events.lock().unwrap().push(held);
                }
            })
        };
        let _log = tracing::subscriber::set_default(witness);
        let store = store(Plan::script([(Op::Renew, Fault::FailBefore)]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store.clone(), rkey, token, LEASE);
        *seen.lock().unwrap() = Some(registration.renewer.clone());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.calls(Op::Renew), 2, "failed, then retried");
        let events = events.lock().unwrap().clone();
        assert!(!events.is_empty(), "the failure was logged");
        assert!(events.iter().all(|held| !held), "{events:?}");
        assert!(!registration.lost());
    }

    /// A renewal that fails in any way a store fails (not applied, applied with its reply lost,
    /// a panic) is logged once and tried again soon, and the lease goes on, renewed every third
    /// of it after.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_fails_in_any_way_is_logged_and_tried_again() {
        let events = Arc::new(AtomicUsize::new(0));
        let _log = tracing::subscriber::set_default(OnEvent({
            let events = events.clone();
            move || {
                events.fetch_add(1, Ordering::Relaxed);
            }
        }));
        for fault in [Fault::FailBefore, Fault::LoseReply, Fault::Panic] {
            let store = store(Plan::script([(Op::Renew, fault)]));
            let (rkey, token) = reserved(&store, "k").await;
            let before = events.load(Ordering::Relaxed);
            let registration = register(store.clone(), rkey, token, LEASE);
            // Fails at 100 ms; tried again at 112.5 ms, then every 100 ms.
            tokio::time::sleep(Duration::from_millis(450)).await;
            assert_eq!(store.calls(Op::Renew), 5, "{fault:?}");
            assert_eq!(
                events.load(Ordering::Relaxed) - before,
                1,
                "{fault:?}: the failure logged once"
            );
            assert!(!registration.lost(), "{fault:?}");
        }
    }

    /// A log sink that panics while a failed renewal is logged fails that renewal alone: the
    /// renewer goes on, retries it soon, and renews this lease and others as before. Left to
    /// unwind, the panic ended the renewer's task, and no lease on the runtime was renewed again.
    #[tokio::test(start_paused = true)]
    async fn a_log_sink_that_panics_fails_one_renewal_not_the_renewer() {
        let _log = panicking_log();
        let store = store(Plan::script([(Op::Renew, Fault::FailBefore)]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store.clone(), rkey, token, LEASE);
        // Fails at 100 ms and its warning panics; tried again at 112.5 ms, then every 100 ms.
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(store.calls(Op::Renew), 5);
        assert!(!registration.lost());
        let renewer = registration.renewer.clone();
        assert!(!renewer.ended.load(Ordering::Acquire));
        // A lease registered after the panic is renewed too.
        let (rkey, token) = reserved(&store, "later").await;
        let later = register(store.clone(), rkey, token, LEASE);
        assert!(Arc::ptr_eq(&later.renewer, &renewer));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.calls(Op::Renew), 7, "each lease renewed once more");
        assert!(!later.lost() && !registration.lost());
    }

    /// On a current-thread runtime the work's own task renews its lease: there too, a log sink
    /// that panics fails one renewal, and neither the work nor its lease ends with it.
    #[tokio::test(start_paused = true)]
    async fn a_log_sink_that_panics_fails_one_renewal_of_the_works_own_task() {
        let _log = panicking_log();
        let faulty = store(Plan::script([(Op::Renew, Fault::FailBefore)]));
        let (rkey, token) = reserved(&faulty, "k").await;
        let store: Arc<dyn Store> = faulty.clone();
        let work = async {
            tokio::time::sleep(Duration::from_millis(450)).await;
            7
        };
        let (done, renewal) = drive(&store, &rkey, &token, LEASE, None, work).await;
        assert!(matches!(done, Ok(7)));
        assert_eq!(
            faulty.calls(Op::Renew),
            5,
            "failed at 100 ms, then renewed 4 times"
        );
        assert!(matches!(renewal, Renewal::Paused { lost: false, .. }));
    }

    /// A registration that ends while its renewal is under way is forgotten when the renewal
    /// ends: nothing held, nothing due.
    #[tokio::test(start_paused = true)]
    async fn a_registration_ended_during_its_renewal_is_forgotten() {
        let store = store(Plan::script([(
            Op::Renew,
            Fault::Delay(Duration::from_millis(500)),
        )]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store.clone(), rkey, token, LEASE);
        let renewer = registration.renewer.clone();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.calls(Op::Renew), 1);
        assert_eq!(held(&renewer), (1, 0), "under way: held, nothing due");
        assert_eq!(renewer.lock().started.len(), 1, "under way since 100 ms");
        drop(registration);
        assert_eq!(renewer.lock().started.len(), 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(held(&renewer), (0, 0));
        assert_eq!(store.calls(Op::Renew), 1);
    }

    /// A registration wakes the renewer only when its renewal falls due before the renewer would
    /// wake by itself (or it waits for none): calls back to back with one lease wake it once.
    #[tokio::test(start_paused = true)]
    async fn a_registration_wakes_the_renewer_only_when_it_is_due_first() {
        let store = store(Plan::script([]));
        let (rkey, token) = reserved(&store, "k").await;
        let first = register(store.clone(), rkey.clone(), token.clone(), LEASE);
        assert!(first.renewer_woken(), "the renewer waited for none");
        tokio::task::yield_now().await;
        assert!(
            !first.renewer_woken(),
            "it ran, and sleeps until the first is due"
        );
        for _ in 0..10 {
            let later = register(store.clone(), rkey.clone(), token.clone(), LEASE);
            assert!(!later.renewer_woken(), "due after the first: not woken");
        }
        let sooner = register(
            store.clone(),
            rkey.clone(),
            token.clone(),
            Duration::from_millis(60),
        );
        assert!(sooner.renewer_woken(), "due before the first: woken");
        drop((first, sooner));
        assert_eq!(held(&Renewer::of(&Handle::current())), (0, 0));
    }

    /// The watch finds a renewal overdue once it is due by more than an eighth of its period,
    /// looks again within half the shortest period while a lease is held, and, once nothing is
    /// held and nothing was registered since its last look, has nothing to look at (it parks).
    /// A current-thread runtime's renewer is not watched: no other thread of it could run it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_watch_finds_an_overdue_renewal_and_rests_when_nothing_is_held() {
        let store = store(Plan::script([]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store.clone(), rkey, token, LEASE);
        let renewer = registration.renewer.clone();
        assert!(renewer.watched);
        let now = Instant::now();
        let ms = Duration::from_millis;
        let (again, overdue) = watch::look_at(&renewer, now);
        assert!(!overdue);
        assert_eq!(again, Some(now + ms(50)), "half the 100 ms period");
        let (again, overdue) = watch::look_at(&renewer, now + ms(90));
        assert!(!overdue, "due at 100 ms");
        assert!(again.is_some_and(|at| at <= now + ms(90) + ms(50)));
        let (_, overdue) = watch::look_at(&renewer, now + ms(120));
        assert!(overdue, "due at 100 ms, and not started 12.5 ms after");
        drop(registration);
        let _ = watch::look_at(&renewer, now);
        assert_eq!(watch::look_at(&renewer, now), (None, false));
    }

    #[tokio::test]
    async fn a_current_thread_runtimes_renewer_is_not_watched() {
        let store = store(Plan::script([]));
        let (rkey, token) = reserved(&store, "k").await;
        let registration = register(store, rkey, token, LEASE);
        assert!(!registration.renewer.watched);
    }
}
