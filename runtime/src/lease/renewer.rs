//! One task per runtime renews every lease held on it. A call registers its lease, and ends the
//! registration when it drops it: no task is spawned, woken or aborted per call. The task sleeps
//! until the earliest renewal is due, so a call shorter than a third of its lease never makes
//! it run, and a registration wakes it only when its renewal falls due before the task would
//! wake by itself (or the task waits for none).
//!
//! Renewals run concurrently inside the task, so a renewal the store holds up holds up no other
//! lease; a store that panics while renewing fails that renewal alone, which is tried again
//! soon, as after any failed renewal.
//!
//! The task is spawned on the runtime of the first registration made on it, and ends with that
//! runtime. A runtime's renewer is found through the thread's last one (the common case: a
//! worker thread belongs to one runtime), else through a registry of the runtimes' renewers.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{next_renewal, period_of, renew_once};
use crate::observe::Renewals;
use crate::store::{RecordKey, Store, StoreError, Token};

/// A lease registered with its runtime's renewer, renewed until this is dropped.
pub(crate) struct Registration {
    renewer: Arc<Renewer>,
    id: u64,
}

impl Registration {
    /// Registers `token`'s lease on the current runtime's renewer, first renewed a third of
    /// `lease` from now.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        rkey: RecordKey,
        token: Token,
        lease: Duration,
    ) -> Registration {
        let renewer = Renewer::current();
        let period = period_of(lease);
        let due = Instant::now() + period;
        let held = Held {
            store,
            rkey,
            token,
            lease,
            renewals: Renewals::of_current(),
            due: Some(due),
            lost: false,
        };
        let (id, wake) = {
            let mut state = renewer.lock();
            let id = state.next_id;
            state.next_id += 1;
            state.held.insert(id, held);
            state.due.insert((due, id));
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
}

#[derive(Default)]
struct State {
    held: HashMap<u64, Held>,
    /// When each lease's next renewal is due, earliest first.
    due: BTreeSet<(Instant, u64)>,
    next_id: u64,
    /// When the task wakes by itself; none while it waits to be woken.
    wakes_at: Option<Instant>,
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
    lost: bool,
}

/// The renewers of the runtimes that have one.
static RENEWERS: Mutex<Vec<(Id, Arc<Renewer>)>> = Mutex::new(Vec::new());

thread_local! {
    /// The renewer this thread registered with last, and its runtime.
    static LAST: RefCell<Option<(Id, Arc<Renewer>)>> = const { RefCell::new(None) };
}

impl Renewer {
    /// The current runtime's renewer, its task started if it has none.
    fn current() -> Arc<Renewer> {
        let handle = Handle::current();
        let id = handle.id();
        let near = LAST.try_with(|last| {
            let mut last = last.borrow_mut();
            if let Some((at, renewer)) = &*last {
                if *at == id && !renewer.ended.load(Ordering::Acquire) {
                    return renewer.clone();
                }
            }
            let renewer = Renewer::of(&handle, id);
            *last = Some((id, renewer.clone()));
            renewer
        });
        // A thread whose locals are being torn down asks the registry.
        near.unwrap_or_else(|_| Renewer::of(&handle, id))
    }

    /// `handle`'s renewer, from the registry or started.
    fn of(handle: &Handle, id: Id) -> Arc<Renewer> {
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
            });
            renewers.retain(|(_, renewer)| !renewer.ended.load(Ordering::Acquire));
            renewers.push((id, renewer.clone()));
            renewer
        };
        // Spawned outside the registry's lock: on a runtime shutting down, the task is dropped
        // at once, and its drop takes that lock.
        handle.spawn(run(Ended(renewer.clone())));
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
                    under_way.push(renew(
                        id,
                        held.store.clone(),
                        held.rkey.clone(),
                        held.token.clone(),
                        held.lease,
                    ));
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
            Some((id, renewed)) = under_way.next(), if !under_way.is_empty() => {
                settle(renewer, id, renewed);
            }
            () = renewer.wake.notified() => {}
            () = &mut sleep, if next.is_some() => {}
        }
    }
}

/// One renewal of lease `id`.
async fn renew(
    id: u64,
    store: Arc<dyn Store>,
    rkey: RecordKey,
    token: Token,
    lease: Duration,
) -> (u64, Result<bool, StoreError>) {
    (id, renew_once(&*store, &rkey, &token, lease).await)
}

/// Schedules lease `id`'s next renewal after one ended: a period on, soon after a failure, or
/// none once the lease is lost. A lease whose registration ended meanwhile is forgotten.
fn settle(renewer: &Renewer, id: u64, renewed: Result<bool, StoreError>) {
    let now = Instant::now();
    let mut state = renewer.lock();
    let Some(held) = state.held.get_mut(&id) else {
        return;
    };
    match next_renewal(renewed, period_of(held.lease), &held.renewals, &held.rkey) {
        Some(wait) => {
            let due = now + wait;
            held.due = Some(due);
            state.due.insert((due, id));
        }
        None => held.lost = true,
    }
}
