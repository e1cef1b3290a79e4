//! A deterministic, seeded fault-schedule simulation of keyed calls, run against every store.
//!
//! Each schedule draws, from its seed: a few keys of four tools (one with a recover hook and a
//! retry limit, one without either, one of two `ctx.once` steps, and one of two steps and an
//! effect of its own under a retry limit, whose second step is often busy); callers that run
//! concurrently, time out, drop their futures and retry after random delays; bodies that take
//! random time, block their thread, stall past their lease, panic, return retryable or terminal
//! errors or `ToolError::outcome_unknown`; a store that fails before applying, applies and loses
//! the reply, or is slow ([`FaultyStore`]); workers that crash at random times or at a store
//! write (before it is applied, or after, its reply lost: between any two writes of a call, its
//! steps' reservations and records and its own record), each replaced by a fresh toolbox on the
//! same store; and an operator who, at random points, lists the unknown records, shows one, looks
//! at the outside system and resolves it as [`Admin`] does for the `toolkey` command: done with
//! the result the outside system shows, or not done when it shows nothing, and now and then,
//! carelessly, not done for an effect that had happened; or purges expired records. Then the
//! faults stop, the leases lapse, the operator may resolve what is left, every caller asks
//! again, and four invariants are checked against the fake outside system's own ledger:
//!
//! 1. no effect happens twice for one key, unless an operator declared "not done" for an effect
//!    that had happened (counted apart: after it, one more effect is expected);
//! 2. no outcome is lost: an effect that happened is recorded as completed with its own result
//!    (a step's in its own record), or the key is unknown; never absent, failed or completed with
//!    another result;
//! 3. every answer is true: a success or replay returns the first effect's result, "nothing was
//!    done" means this call did nothing, `LEASE_LOST` comes only after another call or an
//!    operator's "done" took the key, `RETRY_LIMIT` says so when the key's action (or a step of
//!    it) had acted, and once faults stop a retry leads to success;
//! 4. no key stays stuck: once faults stop and leases lapse, a key is free, completed, or unknown
//!    for a reason (a crash, a panic, a body that reported an unknown outcome).
//!
//! `TOOLKEY_SIM_SCHEDULES=N` sets the count on the memory store (default 20,000);
//! `TOOLKEY_SIM_REAL_SCHEDULES=N` on SQLite, PostgreSQL and Redis (default 1,000 each);
//! `TOOLKEY_SIM_SEED=S` runs schedule `S` alone (on every store, or one: name its test).
//! The memory store runs on tokio's paused clock, so schedules take no wall time; SQLite,
//! PostgreSQL and Redis run on their real clocks with 1.5 s leases, many schedules at once.
//!
//! Run it with `cargo test -p toolkey-tests --release --all-features --test simulation`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::watch;
use toolkey::admin::{Admin, Resolved};
use toolkey::store::faults::{FaultyStore, Plan};
use toolkey::store::{
    Clock, Entry, EntryState, FailureCounters, Filter, MemoryStore, OperatorCommands, Outcome,
    Record, RecordKey, Reservation, Reservations, Resolution, Store, StoreError, Token,
};
use toolkey::{tool, ErrorCode, Fingerprint, RetryLimit, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::servers;

/// The lease every simulated tool holds (renewed every 500 ms while its body runs). Long enough
/// that a renewal delayed by a busy machine (a debug build on two cores) still lands in time:
/// a worker starved of CPU for longer than its lease loses it, and no lease protocol can stop
/// the work it already started. Bodies that block their thread past the lease are the
/// regression test `faults.rs::a_body_that_blocks_its_thread_keeps_its_lease`.
const LEASE: Duration = Duration::from_millis(1500);
const TOOLS: [&str; 4] = ["charge", "blind", "ship", "pay"];
/// The steps of the multi-step tools, by tool.
const STEPS: [(&str, &str); 4] = [
    ("ship", "pick"),
    ("ship", "label"),
    ("pay", "charge"),
    ("pay", "notify"),
];
/// How long an operator's "done" keeps its record (the command's default).
const RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

// ---------------------------------------------------------------------------------------------
// The outside system and the workers.

/// One effect in the outside system: its result, and the call whose body made it.
#[derive(Debug, Clone)]
struct Effect {
    result: String,
    call: String,
}

/// The outside system (its ledger is the truth the invariants are checked against) and the
/// schedule's source of randomness for bodies.
struct World {
    rng: Mutex<fastrand::Rng>,
    /// Effects per ledger key: `charge:c0`, `blind:b1`, `ship:s0/pick`, `ship:s0/label`.
    ledger: Mutex<BTreeMap<String, Vec<Effect>>>,
    next_effect: AtomicU64,
    /// Keys whose outcome became unknown for a reason: why.
    unknown_because: Mutex<BTreeMap<String, String>>,
    /// While true, bodies and lookups misbehave; after the faults stop they behave.
    faulty: AtomicBool,
    /// On tokio's paused clock a blocked thread is played by stalling its task (see [`stall`]).
    paused: bool,
    stalls: Mutex<HashMap<tokio::task::Id, tokio::time::Instant>>,
    /// Each call attempt as it starts and as it is answered: what a stuck schedule reports.
    trail: Mutex<Vec<String>>,
    /// Who held each record, by record key, in order: tells a true `LEASE_LOST` from a false one.
    holders: Mutex<HashMap<String, Vec<Holding>>>,
    /// Writes refused as if another call held the record when none did: the ledger key of the
    /// record's action, when, and what was refused.
    false_takeovers: Mutex<Vec<(String, tokio::time::Instant, String)>>,
    /// Per ledger key, how many effects it had each time an operator declared "not done" for an
    /// effect that had happened: from there, one more effect is expected.
    not_done_on_done: Mutex<BTreeMap<String, Vec<usize>>>,
    /// Bodies stalled past their lease, by ledger key: set true when they go on.
    hangs: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// The operator's actions that took effect, and how many declared "not done" for an effect
    /// that had happened.
    operator_actions: AtomicUsize,
    careless: AtomicUsize,
    /// Of those, how many declared "not done" while the record's worker was alive, frozen.
    live_not_done: AtomicUsize,
}

/// One holder of a record, in the order they came.
#[derive(Debug, Clone, PartialEq)]
enum Holding {
    /// A call's reservation (a reserve or a take-over).
    Call(Token),
    /// A take-over sent whose reply has not come (or was lost): it may hold the record.
    MaybeCall(u64),
    /// An operator's "done" (while it is being applied, or applied).
    OperatorDone,
}

impl World {
    fn new(seed: u64, paused: bool) -> World {
        World {
            rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x5eed_b0d1)),
            ledger: Mutex::default(),
            next_effect: AtomicU64::new(1),
            unknown_because: Mutex::default(),
            faulty: AtomicBool::new(true),
            paused,
            stalls: Mutex::default(),
            trail: Mutex::default(),
            holders: Mutex::default(),
            false_takeovers: Mutex::default(),
            not_done_on_done: Mutex::default(),
            hangs: Mutex::default(),
            operator_actions: AtomicUsize::new(0),
            careless: AtomicUsize::new(0),
            live_not_done: AtomicUsize::new(0),
        }
    }

    fn rng<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut self.rng.lock().unwrap())
    }

    fn effect(&self, key: &str, call: &str) -> String {
        let result = format!("fx-{}", self.next_effect.fetch_add(1, Ordering::SeqCst));
        self.ledger
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push(Effect {
                result: result.clone(),
                call: call.to_string(),
            });
        result
    }

    /// The result of `key`'s action as the outside system shows it: the first effect since an
    /// operator last declared it not done (or the one before, if none came since).
    fn first(&self, key: &str) -> Option<String> {
        let ledger = self.ledger.lock().unwrap();
        let bounds = self.not_done_on_done.lock().unwrap();
        current(ledger.get(key)?, bounds.get(key))
    }

    /// How many effects the action of `owner` (its own and its steps') had since an operator last
    /// declared them not done.
    fn acted(&self, owner: &str) -> usize {
        let ledger = self.ledger.lock().unwrap();
        let bounds = self.not_done_on_done.lock().unwrap();
        ledger
            .iter()
            .filter(|(k, _)| *k == owner || k.starts_with(&format!("{owner}/")))
            .map(|(k, effects)| {
                let since = bounds.get(k).and_then(|b| b.last()).copied().unwrap_or(0);
                effects.len().saturating_sub(since)
            })
            .sum()
    }

    fn held(&self, rkey: &RecordKey, holding: Holding) {
        self.holders
            .lock()
            .unwrap()
            .entry(rkey.key.clone())
            .or_default()
            .push(holding);
    }

    /// True when someone took `rkey` after `token` held it: another call, or an operator's
    /// "done". An operator's "not done" alone deletes the record and holds nothing.
    fn taken_from(&self, rkey: &RecordKey, token: &Token) -> bool {
        let holders = self.holders.lock().unwrap();
        let Some(held) = holders.get(&rkey.key) else {
            return false;
        };
        let mine = held.iter().position(|h| *h == Holding::Call(token.clone()));
        mine.is_some_and(|at| {
            held[at + 1..]
                .iter()
                .any(|h| *h != Holding::Call(token.clone()))
        })
    }

    /// Stalls the body of `key`'s action, and its lease's renewals, for `d` or until an operator
    /// resolves its record: a worker that is alive but frozen past its lease.
    async fn hang(&self, key: &str, d: Duration) {
        let (tx, mut rx) = watch::channel(false);
        self.hangs.lock().unwrap().insert(key.to_string(), tx);
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = rx.wait_for(|thawed| *thawed) => {}
        }
        if let Some(tx) = self.hangs.lock().unwrap().remove(key) {
            tx.send_replace(true);
        }
    }

    /// Waits while `key`'s body hangs.
    async fn hung(&self, key: &str) {
        let rx = self.hangs.lock().unwrap().get(key).map(|tx| tx.subscribe());
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|thawed| *thawed).await;
        }
    }

    fn thaw(&self, key: &str) {
        if let Some(tx) = self.hangs.lock().unwrap().get(key) {
            tx.send_replace(true);
        }
    }

    fn unknown(&self, key: &str, why: &str) {
        self.unknown_because
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_insert_with(|| why.to_string());
    }

    /// Blocks the calling task's thread for `d`: for real with `std::thread::sleep`, or, on the
    /// paused clock, by stalling every store call this task makes until `d` has passed. (A call
    /// without a timeout runs its body in its caller's task.)
    async fn block(&self, d: Duration) {
        if self.paused {
            let until = tokio::time::Instant::now() + d;
            // A call made outside any task (the schedule's last round of asking again) runs its
            // body there: nothing else of its own waits behind it.
            let Some(id) = tokio::task::try_id() else {
                tokio::time::sleep_until(until).await;
                return;
            };
            self.stalls.lock().unwrap().insert(id, until);
            tokio::time::sleep_until(until).await;
            self.stalls.lock().unwrap().remove(&id);
        } else {
            std::thread::sleep(d);
        }
    }

    /// Waits while the calling task's thread is blocked (see [`World::block`]).
    async fn stall(&self) {
        let Some(id) = tokio::task::try_id() else {
            return;
        };
        let until = self.stalls.lock().unwrap().get(&id).copied();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

/// The first effect of each stretch of `effects` that an operator's "not done" on a done effect
/// (at the counts in `bounds`) began: the results a call may truly have been answered.
fn firsts<'e>(effects: &'e [Effect], bounds: Option<&Vec<usize>>) -> Vec<&'e Effect> {
    let mut starts: Vec<usize> = vec![0];
    starts.extend(bounds.into_iter().flatten().copied());
    starts.sort_unstable();
    starts.dedup();
    starts.iter().filter_map(|&at| effects.get(at)).collect()
}

/// The result the record of an action must hold: the first effect of the last stretch that has
/// one.
fn current(effects: &[Effect], bounds: Option<&Vec<usize>>) -> Option<String> {
    firsts(effects, bounds).last().map(|e| e.result.clone())
}

/// How one body run ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Ok,
    RetryableBefore,
    TerminalBefore,
    UnknownAfter,
    UnknownBefore,
    PanicBefore,
    PanicAfter,
}

/// One worker process: its toolbox's state. When it crashes, every task of it stops at its next
/// await (a store call, a body's wait) and never goes on.
struct Worker {
    world: Arc<World>,
    alive: AtomicBool,
    crashed: watch::Sender<bool>,
    /// Reservations this worker holds (as far as it knows), by token.
    held: Mutex<HashMap<Token, RecordKey>>,
    /// Which ledger key a record key belongs to.
    owners: Arc<Vec<(String, String)>>,
    /// The store write at which this worker crashes (counting from 1), and whether after it
    /// was applied (its reply lost) or before.
    crash_at: Option<(u64, bool)>,
    writes: AtomicU64,
    schedule: Weak<Schedule>,
}

impl Worker {
    /// Returns only while the worker lives.
    async fn alive(&self) {
        if !self.alive.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    async fn pause(&self, d: Duration) {
        tokio::time::sleep(d).await;
        self.alive().await;
    }

    fn crash(&self) {
        self.alive.store(false, Ordering::SeqCst);
        // `send_replace`, not `send`: a call that subscribes after the crash (it took this
        // worker as current just before it was replaced) must still see it, or it waits forever.
        self.crashed.send_replace(true);
        for rkey in self.held.lock().unwrap().values() {
            if let Some(owner) = self.owner(rkey) {
                self.world
                    .unknown(&owner, "a worker crashed holding the key");
            }
        }
    }

    fn owner(&self, rkey: &RecordKey) -> Option<String> {
        self.owners
            .iter()
            .find(|(order, _)| rkey.key.contains(order.as_str()))
            .map(|(_, key)| key.clone())
    }

    /// Crashes this worker where it stands, and puts a fresh one in its place.
    fn crash_here(self: &Arc<Self>) {
        match self.schedule.upgrade() {
            Some(schedule) => schedule.crash(self),
            None => self.crash(),
        }
    }

    /// The body of `charge`, `blind` and `pay`'s own effect: some work, perhaps a blocked
    /// thread, perhaps (`may_hang`, a tool no other call takes over) a stall past its lease
    /// before it acts, then an ending.
    async fn body(&self, key: &str, call: &str, may_hang: bool) -> Result<String, ToolError> {
        let faulty = self.world.faulty.load(Ordering::SeqCst);
        let (work, block, hang, ending) = self.world.rng(|r| {
            let work = Duration::from_millis(r.u64(0..250));
            let block = (r.u8(0..10) == 0).then(|| Duration::from_millis(r.u64(150..900)));
            let hang = (faulty && may_hang && r.u8(0..12) == 0)
                .then(|| LEASE * 2 + Duration::from_millis(r.u64(0..2000)));
            let ending = if !faulty {
                Ending::Ok
            } else {
                match r.u8(0..100) {
                    0..60 => Ending::Ok,
                    60..70 => Ending::RetryableBefore,
                    70..78 => Ending::TerminalBefore,
                    78..85 => Ending::UnknownAfter,
                    85..89 => Ending::UnknownBefore,
                    89..94 => Ending::PanicBefore,
                    _ => Ending::PanicAfter,
                }
            };
            (work, block, hang, ending)
        });
        self.pause(work).await;
        if let Some(block) = block {
            self.world.block(block).await;
            self.alive().await;
        }
        if let Some(hang) = hang {
            self.world.unknown(key, "a worker stalled past its lease");
            self.world
                .trail
                .lock()
                .unwrap()
                .push(format!("{call}: its body stalls past its lease"));
            self.world.hang(key, hang).await;
            self.alive().await;
        }
        match ending {
            Ending::Ok => Ok(self.world.effect(key, call)),
            Ending::RetryableBefore => {
                Err(ToolError::new("GATEWAY_BUSY", "the gateway is busy").with_retryable(true))
            }
            Ending::TerminalBefore => Err(ToolError::new("DECLINED", "the card was declined")),
            Ending::UnknownAfter => {
                self.world.effect(key, call);
                self.world
                    .unknown(key, "the body reported an unknown outcome");
                Err(ToolError::outcome_unknown("the gateway's reply was lost"))
            }
            Ending::UnknownBefore => {
                self.world
                    .unknown(key, "the body reported an unknown outcome");
                Err(ToolError::outcome_unknown("the gateway did not answer"))
            }
            Ending::PanicBefore => {
                self.world.unknown(key, "the body panicked");
                panic!("sim: the body panicked before acting")
            }
            Ending::PanicAfter => {
                self.world.effect(key, call);
                self.world.unknown(key, "the body panicked");
                panic!("sim: the body panicked after acting")
            }
        }
    }

    /// A recover hook: asks the outside system for the effect of `key`.
    async fn lookup(&self, key: &str) -> Result<Option<String>, ToolError> {
        let (wait, fails) = self.world.rng(|r| (r.u64(0..50), r.u8(0..20) == 0));
        self.pause(Duration::from_millis(wait)).await;
        if fails && self.world.faulty.load(Ordering::SeqCst) {
            return Err(
                ToolError::new("LOOKUP_FAILED", "the ledger did not answer").with_retryable(true)
            );
        }
        Ok(self.world.first(key))
    }

    /// One step of `ship` or `pay`: some work, then its effect; a step that is `busy` often
    /// fails retryably before acting while faults last.
    async fn step(&self, key: &str, call: &str, busy: bool) -> Result<String, ToolError> {
        let (work, fails) = self.world.rng(|r| (r.u64(0..100), r.u8(0..5) < 2));
        self.pause(Duration::from_millis(work)).await;
        if busy && fails && self.world.faulty.load(Ordering::SeqCst) {
            return Err(ToolError::new("NOTIFY_BUSY", "the notifier is busy").with_retryable(true));
        }
        Ok(self.world.effect(key, call))
    }
}

/// Charge an order.
#[tool(
    idempotent(key = "charge:<order>", recover = find_charge),
    lease = "1500ms",
    retry_limit = "2/3s"
)]
async fn charge(
    worker: State<Worker>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    worker
        .body(&format!("charge:{order}"), ctx.run_id(), false)
        .await
}

/// Looks the charge up before a retry acts.
async fn find_charge(
    worker: State<Worker>,
    _ctx: &ToolContext,
    order: String,
) -> Result<Option<String>, ToolError> {
    worker.lookup(&format!("charge:{order}")).await
}

/// Charge an order, with no way to look it up.
#[tool(idempotent(key = "blind:<order>"), lease = "1500ms")]
async fn blind(
    worker: State<Worker>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    worker
        .body(&format!("blind:{order}"), ctx.run_id(), true)
        .await
}

/// Ship an order in two steps, each at most once.
#[tool(idempotent(key = "ship:<order>", recover = resume_shipping), lease = "1500ms")]
async fn ship(worker: State<Worker>, ctx: &ToolContext, order: String) -> Result<Value, ToolError> {
    let key = format!("ship:{order}");
    let call = ctx.run_id().to_string();
    let pick: String = ctx
        .once("pick", worker.step(&format!("{key}/pick"), &call, false))
        .await?;
    let (block_between, panic_between) = worker.world.rng(|r| (r.u8(0..20) == 0, r.u8(0..20) == 0));
    if worker.world.faulty.load(Ordering::SeqCst) {
        if block_between {
            worker.world.block(Duration::from_millis(400)).await;
        }
        if panic_between {
            worker.world.unknown(&key, "the body panicked");
            panic!("sim: the body panicked between the steps");
        }
    }
    let label: String = ctx
        .once("label", worker.step(&format!("{key}/label"), &call, false))
        .await?;
    Ok(json!({"pick": pick, "label": label}))
}

/// Looks the shipment up: not started (safe to run), done (its result), or stopped between
/// its steps (nobody can tell from outside whether the step that was running acted).
async fn resume_shipping(
    worker: State<Worker>,
    _ctx: &ToolContext,
    order: String,
) -> Result<Option<Value>, ToolError> {
    let key = format!("ship:{order}");
    let pick = worker.world.first(&format!("{key}/pick"));
    let label = worker.world.first(&format!("{key}/label"));
    match (pick, label) {
        (None, None) => Ok(None),
        (Some(pick), Some(label)) => Ok(Some(json!({"pick": pick, "label": label}))),
        _ => {
            worker
                .world
                .unknown(&key, "the shipment stopped between its steps");
            Err(ToolError::new(
                "PARTLY_SHIPPED",
                "the shipment stopped between its steps",
            ))
        }
    }
}

/// Pay for an order: charge the card, notify the customer (a notifier that is often busy), then
/// book the payment. Under a retry limit, and with no way to look it up: a key left unknown
/// waits for an operator.
#[tool(
    idempotent(key = "pay:<order>"),
    lease = "1500ms",
    retry_limit = "2/3s"
)]
async fn pay(worker: State<Worker>, ctx: &ToolContext, order: String) -> Result<Value, ToolError> {
    let key = format!("pay:{order}");
    let call = ctx.run_id().to_string();
    let charge: String = ctx
        .once(
            "charge",
            worker.step(&format!("{key}/charge"), &call, false),
        )
        .await?;
    let notify: String = ctx
        .once("notify", worker.step(&format!("{key}/notify"), &call, true))
        .await?;
    let book = worker.body(&key, &call, true).await?;
    Ok(json!({"charge": charge, "notify": notify, "book": book}))
}

/// A worker's view of the shared store: stalls while its task's thread is blocked, stops for
/// good when the worker crashes, and keeps track of the reservations the worker holds.
struct WorkerStore {
    store: Arc<dyn Store>,
    worker: Arc<Worker>,
}

impl WorkerStore {
    async fn call<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.worker.world.stall().await;
        self.worker.alive().await;
        let answer = op.await;
        self.worker.alive().await;
        answer
    }

    /// A store write: [`call`](Self::call), unless this worker crashes at it (before it is
    /// applied, or after, with its reply lost).
    async fn write<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let n = self.worker.writes.fetch_add(1, Ordering::SeqCst) + 1;
        // Crashes stop with the faults.
        let crash = self
            .worker
            .crash_at
            .filter(|(at, _)| *at == n && self.worker.world.faulty.load(Ordering::SeqCst))
            .map(|(_, after)| after);
        if crash == Some(false) {
            self.worker.crash_here();
        }
        self.worker.world.stall().await;
        self.worker.alive().await;
        let answer = op.await;
        // Crashes stop with the faults, also for a write held until they stopped.
        if crash == Some(true) && self.worker.world.faulty.load(Ordering::SeqCst) {
            self.worker.crash_here();
        }
        self.worker.alive().await;
        answer
    }

    /// A fenced write of `token` the store refused: the caller will be told another call took
    /// the key over. Noted when nobody did.
    fn refused(&self, key: &RecordKey, token: &Token, what: &str) {
        let world = &self.worker.world;
        if world.taken_from(key, token) {
            return;
        }
        if let Some(owner) = self.worker.owner(key) {
            world.false_takeovers.lock().unwrap().push((
                owner,
                tokio::time::Instant::now(),
                format!("{what} of {}", key.key),
            ));
        }
    }

    fn hold(&self, token: &Token, key: &RecordKey) {
        self.worker
            .held
            .lock()
            .unwrap()
            .insert(token.clone(), key.clone());
    }

    fn drop_hold(&self, token: &Token, answer: &Result<bool, StoreError>) {
        if answer.is_ok() {
            self.worker.held.lock().unwrap().remove(token);
        }
    }
}

#[async_trait]
impl Reservations for WorkerStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        // Held from the request on: a reserve whose reply is lost may hold the key.
        self.hold(token, key);
        let world = &self.worker.world;
        world.held(key, Holding::Call(token.clone()));
        let answer = self
            .write(self.store.reserve(key, tool, fingerprint, token, lease))
            .await;
        if let Ok(Reservation::Existing(_)) = &answer {
            self.worker.held.lock().unwrap().remove(token);
            let mut holders = world.holders.lock().unwrap();
            if let Some(held) = holders.get_mut(&key.key) {
                held.retain(|h| *h != Holding::Call(token.clone()));
            }
        }
        answer
    }
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let answer = self
            .write(self.store.complete(key, token, outcome, retain))
            .await;
        self.drop_hold(token, &answer);
        if let Ok(false) = answer {
            self.refused(key, token, "the outcome");
        }
        answer
    }
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let answer = self.write(self.store.release(key, token)).await;
        self.drop_hold(token, &answer);
        answer
    }
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        // A body stalled past its lease stalls its renewals too: the whole worker is frozen.
        if let Some(owner) = self.worker.owner(key) {
            self.worker.world.hung(&owner).await;
        }
        self.call(self.store.renew(key, token, lease)).await
    }
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let answer = self.write(self.store.mark_unknown(key, token)).await;
        self.drop_hold(token, &answer);
        // Refused, the executor reads the record: still this token's, the mark had landed.
        if let Ok(false) = answer {
            let held = self.store.get(key).await;
            let ours = matches!(&held, Ok(Some(Record::Stale { token: t, .. })) if t == token);
            if held.is_ok() && !ours {
                self.refused(key, token, "the unknown mark");
            }
        }
        answer
    }
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        // Until its reply comes, a take-over may hold the record.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let maybe = Holding::MaybeCall(NEXT.fetch_add(1, Ordering::SeqCst));
        let world = &self.worker.world;
        world.held(key, maybe.clone());
        let answer = self.write(self.store.take_over(key, stale, lease)).await;
        if let Ok(taken) = &answer {
            let mut holders = world.holders.lock().unwrap();
            let held = holders.entry(key.key.clone()).or_default();
            let at = held.iter().position(|h| *h == maybe).expect("pushed above");
            match taken {
                Some(token) => held[at] = Holding::Call(token.clone()),
                None => {
                    held.remove(at);
                }
            }
        }
        if let Ok(Some(token)) = &answer {
            self.hold(token, key);
        }
        answer
    }
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.call(self.store.get(key)).await
    }
}

#[async_trait]
impl OperatorCommands for WorkerStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.call(self.store.purge_expired(limit)).await
    }
    async fn now(&self) -> Result<SystemTime, StoreError> {
        self.call(self.store.now()).await
    }
}

#[async_trait]
impl FailureCounters for WorkerStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        self.write(self.store.count_failure(key, window)).await
    }
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        self.call(self.store.failures(key)).await
    }
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.write(self.store.clear_failures(key)).await
    }
}

// ---------------------------------------------------------------------------------------------
// One schedule.

/// A store the simulation can run schedules on.
#[derive(Clone)]
struct Target {
    name: &'static str,
    store: Arc<dyn Store>,
    paused: bool,
}

/// What one call attempt was answered.
#[derive(Debug, Clone)]
enum Answer {
    Ok {
        value: Value,
        replayed: bool,
    },
    Err(ToolError),
    /// The worker crashed under the call.
    Lost,
    /// The caller stopped waiting and dropped the call's future.
    Dropped,
}

impl Answer {
    /// True when a caller would ask again: the answer invites it, or there was none.
    fn asks_again(&self) -> bool {
        match self {
            Answer::Ok { .. } => false,
            Answer::Lost | Answer::Dropped => true,
            Answer::Err(e) => {
                e.is_retryable() || e.is(ErrorCode::InProgress) || e.is(ErrorCode::Timeout)
            }
        }
    }
}

struct Attempt {
    call: String,
    answer: Answer,
    /// When the call was made and answered.
    start: tokio::time::Instant,
    end: tokio::time::Instant,
    /// How many effects the key's action (its own and its steps') had when the call was
    /// answered, since an operator last declared one not done.
    acted: usize,
}

struct Caller {
    tool: &'static str,
    order: String,
    attempts: Vec<Attempt>,
    /// The answers once faults stopped and leases lapsed.
    settled: Vec<Attempt>,
}

struct Schedule {
    me: Weak<Schedule>,
    world: Arc<World>,
    faults: Arc<FaultyStore<Arc<dyn Store>>>,
    /// The operator's view of the store: its own connection, without the workers' faults.
    admin: Admin,
    tenant: String,
    owners: Arc<Vec<(String, String)>>,
    current: Mutex<(Arc<Worker>, Toolbox)>,
    workers: Mutex<Vec<(Arc<Worker>, Toolbox)>>,
    /// Draws each worker's timeouts and the store write it may crash at.
    draws: Mutex<fastrand::Rng>,
    /// How many more workers may crash at a store write, and how many did.
    write_crashes_left: AtomicUsize,
    write_crashes: AtomicUsize,
}

/// What a schedule found.
#[derive(Default)]
struct Report {
    effects: usize,
    step_effects: usize,
    write_crashes: usize,
    operator_actions: usize,
    careless: usize,
    retry_limits: usize,
    violations: Vec<String>,
}

impl Schedule {
    fn worker(&self) -> (Arc<Worker>, Toolbox) {
        let mut rng = self.draws.lock().unwrap();
        let crash_at = (self.write_crashes_left.load(Ordering::SeqCst) > 0 && rng.u8(0..3) == 0)
            .then(|| (rng.u64(1..=16), rng.bool()));
        let worker = Arc::new(Worker {
            world: self.world.clone(),
            alive: AtomicBool::new(true),
            crashed: watch::channel(false).0,
            held: Mutex::default(),
            owners: self.owners.clone(),
            crash_at,
            writes: AtomicU64::new(0),
            schedule: self.me.clone(),
        });
        let store = WorkerStore {
            store: self.faults.clone(),
            worker: worker.clone(),
        };
        // `charge` and `pay` keep their own retry limit; the others none. A limit's window ends
        // before the schedule's callers ask again once faults stop, so a retry still leads to
        // success then.
        let mut builder = Toolbox::builder()
            .store(store)
            .shared_state(worker.clone())
            .tool(Charge)
            .tool(Blind)
            .tool(Ship)
            .tool(Pay)
            .default_retry_limit(RetryLimit::off());
        for tool in TOOLS {
            let timeout = match rng.u8(0..3) {
                0 => None,
                1 => Some(Duration::from_millis(rng.u64(20..150))),
                _ => Some(Duration::from_millis(rng.u64(150..600))),
            };
            builder = builder.timeout(tool, timeout);
        }
        let toolbox = builder.build().unwrap();
        self.workers
            .lock()
            .unwrap()
            .push((worker.clone(), toolbox.clone()));
        (worker, toolbox)
    }

    fn current(&self) -> (Arc<Worker>, Toolbox) {
        self.current.lock().unwrap().clone()
    }

    fn crash_and_replace(&self) {
        let (worker, _) = self.current();
        worker.crash();
        let fresh = self.worker();
        *self.current.lock().unwrap() = fresh;
    }

    /// `worker` crashes at a store write: replaced if it is the current one.
    fn crash(&self, worker: &Arc<Worker>) {
        self.write_crashes_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok();
        self.write_crashes.fetch_add(1, Ordering::SeqCst);
        if Arc::ptr_eq(&self.current().0, worker) {
            self.crash_and_replace();
        } else {
            worker.crash();
        }
    }

    /// One attempt of `tool` for `order`, as call `call`, perhaps dropped after `outer`.
    async fn attempt(
        &self,
        tool: &str,
        order: &str,
        call: &str,
        outer: Option<Duration>,
    ) -> Attempt {
        let start = tokio::time::Instant::now();
        let (worker, toolbox) = self.current();
        let mut crashed = worker.crashed.subscribe();
        let ctx = ToolContext::new(call).with_tenant(self.tenant.clone());
        let args = json!({ "order": order });
        let answer = async {
            let call = toolbox.call(tool, args, &ctx);
            let answered = match outer {
                Some(limit) => match tokio::time::timeout(limit, call).await {
                    Ok(answered) => answered,
                    Err(_) => return Answer::Dropped,
                },
                None => call.await,
            };
            match answered {
                Ok(out) => Answer::Ok {
                    value: out.value,
                    replayed: out.replayed,
                },
                Err(e) => Answer::Err(e),
            }
        };
        let trail = |line: String| self.world.trail.lock().unwrap().push(line);
        trail(format!("{call}: {tool} {order} (dropped after {outer:?})"));
        let answer = tokio::select! {
            biased;
            _ = crashed.wait_for(|c| *c) => Answer::Lost,
            answer = answer => answer,
        };
        trail(format!("{call}: {answer:?}"));
        Attempt {
            call: call.to_string(),
            answer,
            start,
            end: tokio::time::Instant::now(),
            acted: self.world.acted(&format!("{tool}:{order}")),
        }
    }
}

/// How long a schedule may take (on the paused clock this costs no wall time): one that takes
/// longer is stuck, and reported as such.
const SCHEDULE_LIMIT: Duration = Duration::from_secs(120);

/// Runs schedule `seed` on `target` to its end and checks it; a schedule that never ends is a
/// violation too (a call, a shutdown or a key that waits forever).
async fn run_schedule(target: &Target, seed: u64) -> Report {
    let world = Arc::new(World::new(seed, target.paused));
    let run = run_schedule_unbounded(target, seed, world.clone());
    match tokio::time::timeout(SCHEDULE_LIMIT, run).await {
        Ok(report) => {
            // A schedule run alone shows what happened, when it failed.
            if env_u64("TOOLKEY_SIM_SEED").is_some() && !report.violations.is_empty() {
                let trail = world.trail.lock().unwrap().join("\n    ");
                let _ = writeln!(std::io::stderr(), "schedule {seed}:\n    {trail}");
            }
            report
        }
        Err(_) => {
            let trail = world.trail.lock().unwrap();
            let last = trail[trail.len().saturating_sub(8)..].join("\n    ");
            Report {
                violations: vec![format!(
                    "the schedule did not end within {SCHEDULE_LIMIT:?}: something waits forever; its last calls:\n    {last}"
                )],
                ..Report::default()
            }
        }
    }
}

async fn run_schedule_unbounded(target: &Target, seed: u64, world: Arc<World>) -> Report {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (fail_before, lose_reply, delay) = (rng.f64() * 0.15, rng.f64() * 0.15, rng.f64() * 0.2);
    let faults = Arc::new(FaultyStore::new(
        target.store.clone(),
        Plan::random(rng.u64(..))
            .fail_before(fail_before)
            .lose_reply(lose_reply)
            .delay(delay, Duration::from_millis(60)),
    ));
    let mut owners = Vec::new();
    for tool in TOOLS {
        for i in 0..rng.usize(1..=2) {
            let order = format!("{}{i}q", &tool[..1]);
            owners.push((order.clone(), format!("{tool}:{order}")));
        }
    }
    let owners = Arc::new(owners);
    let tenant = format!("sim-{seed}-{}", Token::generate());
    let schedule = Arc::new_cyclic(|me| Schedule {
        me: me.clone(),
        world: world.clone(),
        faults: faults.clone(),
        admin: Admin::new(target.store.clone()),
        tenant,
        owners: owners.clone(),
        current: Mutex::new(placeholder()),
        workers: Mutex::default(),
        draws: Mutex::new(fastrand::Rng::with_seed(rng.u64(..))),
        write_crashes_left: AtomicUsize::new(rng.usize(0..=2)),
        write_crashes: AtomicUsize::new(0),
    });
    let first = schedule.worker();
    *schedule.current.lock().unwrap() = first;

    // Callers: each a key, a few attempts, random gaps, sometimes an outer timeout.
    let callers: Vec<_> = (0..rng.usize(2..=6))
        .map(|c| {
            let (order, key) = owners[rng.usize(..owners.len())].clone();
            let tool = TOOLS
                .into_iter()
                .find(|t| key.starts_with(&format!("{t}:")))
                .unwrap();
            let plan: Vec<(Duration, Option<Duration>)> = (0..rng.usize(1..=4))
                .map(|_| {
                    let gap = Duration::from_millis(rng.u64(0..400));
                    let outer = (rng.u8(0..4) == 0).then(|| Duration::from_millis(rng.u64(5..300)));
                    (gap, outer)
                })
                .collect();
            let schedule = schedule.clone();
            tokio::spawn(async move {
                let mut caller = Caller {
                    tool,
                    order,
                    attempts: Vec::new(),
                    settled: Vec::new(),
                };
                for (n, (gap, outer)) in plan.into_iter().enumerate() {
                    tokio::time::sleep(gap).await;
                    let call = format!("call-{c}-{n}");
                    let attempt = schedule.attempt(tool, &caller.order, &call, outer).await;
                    let again = attempt.answer.asks_again();
                    caller.attempts.push(attempt);
                    if !again {
                        break;
                    }
                }
                caller
            })
        })
        .collect();

    // Crashes: each replaces the current worker by a fresh one.
    let crashes: Vec<Duration> = (0..rng.usize(0..=2))
        .map(|_| Duration::from_millis(rng.u64(0..1200)))
        .collect();
    let crasher = {
        let schedule = schedule.clone();
        let mut crashes = crashes;
        crashes.sort();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for at in crashes {
                tokio::time::sleep_until(start + at).await;
                schedule.crash_and_replace();
            }
        })
    };

    // The operator: at random points, resolves an unknown record or purges expired ones.
    let operator = {
        let schedule = schedule.clone();
        let mut at: Vec<Duration> = (0..rng.usize(0..=3))
            .map(|_| Duration::from_millis(rng.u64(0..3000)))
            .collect();
        at.sort();
        let mut rng = fastrand::Rng::with_seed(rng.u64(..));
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for at in at {
                tokio::time::sleep_until(start + at).await;
                if rng.u8(0..4) == 0 {
                    schedule.purge().await;
                } else {
                    schedule.resolve_one(&mut rng, true).await;
                }
            }
        })
    };
    let operator_clears_up = rng.bool();

    let mut callers_done = Vec::new();
    for caller in callers {
        callers_done.push(caller.await.expect("a caller task"));
    }
    crasher.await.expect("the crasher task");
    operator.await.expect("the operator task");

    // The faults stop; the living workers finish their work; the leases lapse.
    faults.stop();
    world.faulty.store(false, Ordering::SeqCst);
    let living: Vec<Toolbox> = schedule
        .workers
        .lock()
        .unwrap()
        .iter()
        .filter(|(w, _)| w.alive.load(Ordering::SeqCst))
        .map(|(_, t)| t.clone())
        .collect();
    for toolbox in &living {
        let _ = toolbox.shutdown().await;
    }
    tokio::time::sleep(LEASE * 3).await;
    // Half the time an operator resolves, carefully, every record left unknown.
    if operator_clears_up {
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..20 {
            if !schedule.resolve_one(&mut rng, false).await {
                break;
            }
        }
    }

    // Every caller without its answer asks again, until it has one.
    for (c, caller) in callers_done.iter_mut().enumerate() {
        let needs = caller
            .attempts
            .last()
            .is_none_or(|a| !matches!(a.answer, Answer::Ok { .. }));
        if !needs {
            continue;
        }
        for n in 0..12 {
            let call = format!("settle-{c}-{n}");
            let attempt = schedule
                .attempt(caller.tool, &caller.order, &call, None)
                .await;
            let again = match &attempt.answer {
                Answer::Err(e) => {
                    e.is_retryable() || e.is(ErrorCode::InProgress) || e.is(ErrorCode::Timeout)
                }
                Answer::Ok { .. } => false,
                Answer::Lost | Answer::Dropped => true,
            };
            caller.settled.push(attempt);
            if !again {
                break;
            }
            tokio::time::sleep(LEASE).await;
        }
    }
    let (_, toolbox) = schedule.current();
    let _ = toolbox.shutdown().await;

    check(&schedule, &callers_done, &toolbox).await
}

impl Schedule {
    /// Purges expired records, as `toolkey purge` does.
    async fn purge(&self) {
        if self.admin.purge(100, |_| {}).await.is_ok() {
            self.world.operator_actions.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Lists the tenant's unknown records, shows one, looks at the outside system and resolves
    /// it, as an operator with the `toolkey` command does: done with the result the outside
    /// system shows, not done when it shows nothing; and (`careless` allowed, now and then) not
    /// done although it shows the effect. False when nothing was left to resolve.
    async fn resolve_one(&self, rng: &mut fastrand::Rng, careless: bool) -> bool {
        let filter = Filter {
            tenant: Some(self.tenant.clone()),
            state: Some(EntryState::Unknown),
            ..Filter::default()
        };
        let Ok(unknown) = self.admin.list(&filter, 50).await else {
            return false;
        };
        if unknown.is_empty() {
            return false;
        }
        let picked = &unknown[rng.usize(..unknown.len())];
        let Ok(Some(entry)) = self.admin.show(&picked.key).await else {
            return false;
        };
        let Some((_, owner)) = self.owners.iter().find(|(o, _)| entry.key.key.contains(o)) else {
            return false;
        };
        let world = &self.world;
        // What the outside system shows: the ledger key of the record's own effect, and the
        // result the record would hold had it finished.
        let label = entry.tool.clone().unwrap_or_default();
        let (effect, found) = match label.split_once('/') {
            Some((_, step)) => {
                let key = format!("{owner}/{step}");
                let found = world.first(&key).map(|r| json!(r));
                (Some(key), found)
            }
            None if label == "ship" => {
                let found = match (
                    world.first(&format!("{owner}/pick")),
                    world.first(&format!("{owner}/label")),
                ) {
                    (Some(pick), Some(label)) => Some(json!({"pick": pick, "label": label})),
                    _ => None,
                };
                (None, found)
            }
            None if label == "pay" => {
                let found = match (
                    world.first(&format!("{owner}/charge")),
                    world.first(&format!("{owner}/notify")),
                    world.first(owner),
                ) {
                    (Some(charge), Some(notify), Some(book)) => {
                        Some(json!({"charge": charge, "notify": notify, "book": book}))
                    }
                    _ => None,
                };
                (Some(owner.clone()), found)
            }
            None => (Some(owner.clone()), world.first(owner).map(|r| json!(r))),
        };
        let careless = careless && found.is_some() && rng.u8(0..5) == 0;
        let resolution = match found {
            Some(result) if !careless => Resolution::Done {
                outcome: Outcome::Ok(result),
                retain: RETAIN,
            },
            _ => Resolution::NotDone,
        };
        let done = matches!(resolution, Resolution::Done { .. });
        // Noted before it applies: a worker's write refused meanwhile was refused for it.
        if done {
            world.held(&entry.key, Holding::OperatorDone);
        }
        let effects = |key: &str| world.ledger.lock().unwrap().get(key).map_or(0, Vec::len);
        let counted = effect.as_deref().map(effects);
        // A "not done" while the record's worker is alive, frozen past its lease before it
        // acted, is as false as one for an effect that happened: the worker goes on to act, and
        // no store can stop it (only its writes are fenced). Counted apart with those.
        let live = !done && world.hangs.lock().unwrap().contains_key(owner.as_str());
        let applied = matches!(
            self.admin
                .resolve(&entry.key, &entry.revision, &resolution)
                .await,
            Ok(Resolved::Applied)
        );
        world.trail.lock().unwrap().push(format!(
            "operator: {label} record of `{owner}` resolved {} ({}){}",
            if done { "done" } else { "not done" },
            if applied { "applied" } else { "refused" },
            if careless {
                ", although the outside system shows its effect"
            } else {
                ""
            },
        ));
        if applied {
            world.operator_actions.fetch_add(1, Ordering::SeqCst);
            if careless || live {
                world.careless.fetch_add(1, Ordering::SeqCst);
                if live {
                    world.live_not_done.fetch_add(1, Ordering::SeqCst);
                }
                if let (Some(key), Some(counted)) = (effect, counted) {
                    let mut bounds = world.not_done_on_done.lock().unwrap();
                    // A live worker's effect, still to come, is the action declared not done.
                    let ours = usize::from(live && !careless);
                    bounds.entry(key).or_default().push(counted + ours);
                }
            }
            // A worker frozen past its lease goes on just after: the moment that tells.
            world.thaw(owner);
        } else if done {
            let mut holders = world.holders.lock().unwrap();
            if let Some(held) = holders.get_mut(&entry.key.key) {
                if let Some(at) = held.iter().rposition(|h| *h == Holding::OperatorDone) {
                    held.remove(at);
                }
            }
        }
        true
    }
}

/// A toolbox-less placeholder until the first worker exists.
fn placeholder() -> (Arc<Worker>, Toolbox) {
    let world = Arc::new(World::new(0, false));
    let worker = Arc::new(Worker {
        world,
        alive: AtomicBool::new(false),
        crashed: watch::channel(false).0,
        held: Mutex::default(),
        owners: Arc::default(),
        crash_at: None,
        writes: AtomicU64::new(0),
        schedule: Weak::new(),
    });
    (worker, Toolbox::builder().build().unwrap())
}

// ---------------------------------------------------------------------------------------------
// The invariants.

async fn check(schedule: &Schedule, callers: &[Caller], toolbox: &Toolbox) -> Report {
    let world = &schedule.world;
    let ledger = world.ledger.lock().unwrap().clone();
    let bounds = world.not_done_on_done.lock().unwrap().clone();
    let unknown_because = world.unknown_because.lock().unwrap().clone();
    let false_takeovers = world.false_takeovers.lock().unwrap().clone();
    let mut violations = Vec::new();
    let mut v = |text: String| violations.push(text);
    let ctx = ToolContext::new("checker").with_tenant(schedule.tenant.clone());
    let attempts = || {
        callers
            .iter()
            .flat_map(|c| c.attempts.iter().chain(&c.settled))
    };
    // The results a call may truly have been answered for a ledger key, and the one its record
    // must hold.
    let truths = |key: &str| -> Vec<String> {
        ledger.get(key).map_or_else(Vec::new, |effects| {
            firsts(effects, bounds.get(key))
                .into_iter()
                .map(|e| e.result.clone())
                .collect()
        })
    };
    let now = |key: &str| ledger.get(key).and_then(|e| current(e, bounds.get(key)));

    // 1. No effect twice, per key and per step, within each stretch an operator's "not done" on
    // a done effect began.
    for (key, effects) in &ledger {
        let mut starts: Vec<usize> = vec![0];
        starts.extend(bounds.get(key).into_iter().flatten().copied());
        starts.push(effects.len());
        starts.sort_unstable();
        let twice = starts.windows(2).any(|w| w[1] - w[0] > 1);
        if twice {
            // Each acting call and what it was answered.
            let calls: Vec<String> = effects
                .iter()
                .map(|e| {
                    let answer = attempts()
                        .find(|a| a.call == e.call)
                        .map(|a| match &a.answer {
                            Answer::Ok { .. } => "ok".to_string(),
                            Answer::Err(err) => err.code().to_string(),
                            Answer::Lost => "lost".to_string(),
                            Answer::Dropped => "dropped".to_string(),
                        });
                    format!("{}: {}", e.call, answer.unwrap_or_default())
                })
                .collect();
            let declared = match bounds.get(key) {
                Some(at) => format!(", an operator declared it not done after effect(s) {at:?}"),
                None => String::new(),
            };
            v(format!(
                "invariant 1: `{key}` happened {} times (by {calls:?}){declared}",
                effects.len()
            ));
        }
    }

    // Records an operator's "not done" on a done effect deleted, with no effect since: the
    // outcome was declared away, not lost.
    let declared_away = |key: &str| {
        let (effects, last) = (
            ledger.get(key).map_or(0, Vec::len),
            bounds.get(key).and_then(|b| b.last()),
        );
        last.is_some_and(|&at| at == effects)
    };

    for (order, key) in schedule.owners.iter() {
        let tool = key.split(':').next().unwrap();
        // What the outside system says the result is.
        let truth: Option<Value> = match tool {
            "ship" => match (now(&format!("{key}/pick")), now(&format!("{key}/label"))) {
                (Some(pick), Some(label)) => Some(json!({"pick": pick, "label": label})),
                _ => None,
            },
            "pay" => match (
                now(&format!("{key}/charge")),
                now(&format!("{key}/notify")),
                now(key),
            ) {
                (Some(charge), Some(notify), Some(book)) => {
                    Some(json!({"charge": charge, "notify": notify, "book": book}))
                }
                _ => None,
            },
            _ => now(key).map(|r| json!(r)),
        };
        // A result any call may have been answered: each part one the outside system had.
        let true_answer = |value: &Value| -> bool {
            let part = |name: &str, ledger_key: String| {
                value[name]
                    .as_str()
                    .is_some_and(|r| truths(&ledger_key).iter().any(|t| t == r))
            };
            match tool {
                "ship" => {
                    part("pick", format!("{key}/pick")) && part("label", format!("{key}/label"))
                }
                "pay" => {
                    part("charge", format!("{key}/charge"))
                        && part("notify", format!("{key}/notify"))
                        && part("book", key.clone())
                }
                _ => value
                    .as_str()
                    .is_some_and(|r| truths(key).iter().any(|t| t == r)),
            }
        };
        // Whether the action's own effect happened (a step's is its own record's), since an
        // operator last declared it not done: what came before belongs to the action declared
        // not done.
        let since = |k: &str| {
            let from = bounds.get(k).and_then(|b| b.last()).copied().unwrap_or(0);
            ledger
                .get(k)
                .map_or(0, |effects| effects.len().saturating_sub(from))
        };
        let acted = match tool {
            "ship" => since(&format!("{key}/pick")) + since(&format!("{key}/label")) > 0,
            _ => since(key) > 0,
        };
        let because = unknown_because.get(key);

        // 2 and 4. The record, read without faults, and the status companion's answer.
        let status = toolbox
            .call(&format!("{tool}_status"), json!({"order": order}), &ctx)
            .await;
        let status = match status {
            Ok(out) => out.value,
            Err(e) => {
                v(format!(
                    "invariant 2: the status of `{key}` could not be read: {e:?}"
                ));
                continue;
            }
        };
        match status["status"].as_str().unwrap_or_default() {
            "completed" => {
                if Some(&status["result"]) != truth.as_ref() {
                    v(format!(
                        "invariant 2: `{key}` is recorded as {} but the outside system says {truth:?}",
                        status["result"]
                    ));
                }
            }
            "failed" => {
                let code = status["error"]["code"].as_str().unwrap_or_default();
                if acted || code != "DECLINED" {
                    v(format!(
                        "invariant 2: `{key}` is recorded as failed with {code} (acted: {acted})"
                    ));
                }
            }
            "not_found" => {
                // `ship`'s steps are checked in their own records below.
                if acted && tool != "ship" && !declared_away(key) {
                    v(format!(
                        "invariant 2: `{key}` acted but its record is gone (status not_found)"
                    ));
                }
            }
            "unknown" => {
                if because.is_none() {
                    v(format!(
                        "invariant 4: `{key}` is stuck as unknown after faults stopped and leases lapsed, and nothing made its outcome unknown (acted: {acted})"
                    ));
                }
            }
            other => v(format!(
                "invariant 4: `{key}` is stuck as {other} after faults stopped and leases lapsed"
            )),
        }
        // Each step that acted keeps its result in its own record (or is unknown), as an
        // operator reads it.
        for (_, step) in STEPS.iter().filter(|(t, _)| *t == tool) {
            let step_key = format!("{key}/{step}");
            let Some(truth) = now(&step_key) else {
                continue;
            };
            let filter = Filter {
                tenant: Some(schedule.tenant.clone()),
                tool: Some(format!("{tool}/{step}")),
                ..Filter::default()
            };
            let entries = match schedule.admin.list(&filter, 50).await {
                Ok(entries) => entries,
                Err(e) => {
                    v(format!(
                        "invariant 2: the records of `{tool}/{step}` could not be listed: {e}"
                    ));
                    continue;
                }
            };
            let entry: Option<&Entry> = entries.iter().find(|e| e.key.key.contains(order.as_str()));
            match entry.map(|e| (e.state, &e.outcome)) {
                Some((EntryState::Completed, Some(Outcome::Ok(result))))
                    if *result == json!(truth) => {}
                Some((EntryState::Unknown, _)) => {}
                None if declared_away(&step_key) => {}
                other => v(format!(
                    "invariant 2: step `{step_key}` acted ({truth}) but its record is {other:?}"
                )),
            }
        }

        // 3. Every answer true.
        for caller in callers.iter().filter(|c| c.order == *order) {
            for attempt in caller.attempts.iter().chain(&caller.settled) {
                let did: usize = ledger
                    .iter()
                    .filter(|(k, _)| *k == key || k.starts_with(&format!("{key}/")))
                    .flat_map(|(_, effects)| effects)
                    .filter(|e| e.call == attempt.call)
                    .count();
                match &attempt.answer {
                    Answer::Ok { value, replayed } if !true_answer(value) => {
                        v(format!(
                            "invariant 3: {} was answered {value} (replayed: {replayed}) but the outside system says {truth:?}",
                            attempt.call
                        ));
                    }
                    Answer::Err(e) if e.is(ErrorCode::StoreUnavailable) => {
                        // "Nothing was done", or, for a step, "step `x` did not run".
                        let step = STEPS
                            .iter()
                            .filter(|(t, _)| *t == tool)
                            .map(|(_, s)| *s)
                            .find(|s| e.message().contains(&format!("step `{s}` did not run")));
                        let did = match step {
                            Some(step) => {
                                ledger.get(&format!("{key}/{step}")).map_or(0, |effects| {
                                    effects.iter().filter(|e| e.call == attempt.call).count()
                                })
                            }
                            None => did,
                        };
                        if did > 0 {
                            v(format!(
                                "invariant 3: {} was told `{}` but it acted {did} times",
                                attempt.call,
                                e.message()
                            ));
                        }
                    }
                    Answer::Err(e) if e.is(ErrorCode::LeaseLost) => {
                        // True only if another call or an operator's "done" took a record of
                        // this call's action from it while it ran.
                        let untrue: Vec<&String> = false_takeovers
                            .iter()
                            .filter(|(owner, at, _)| {
                                owner == key && (attempt.start..=attempt.end).contains(at)
                            })
                            .map(|(_, _, what)| what)
                            .collect();
                        if !untrue.is_empty() {
                            v(format!(
                                "invariant 3: {} was told `{}` but nobody took the key over ({untrue:?} refused while no other call or operator held it)",
                                attempt.call,
                                e.message()
                            ));
                        }
                    }
                    // The action (or a step of it) had acted: the answer must say it did, or
                    // may have, or the user may do it again by hand.
                    Answer::Err(e)
                        if e.is(ErrorCode::RetryLimit)
                            && attempt.acted > 0
                            && !speaks_of_an_effect(e) =>
                    {
                        v(format!(
                            "invariant 3: {} was told `{}` ({:?}) although `{key}` had acted {} times",
                            attempt.call,
                            e.message(),
                            e.suggestion().unwrap_or_default(),
                            attempt.acted
                        ));
                    }
                    Answer::Err(e)
                        if e.error_code().is_none()
                            && !matches!(
                                e.code(),
                                "DECLINED"
                                    | "GATEWAY_BUSY"
                                    | "LOOKUP_FAILED"
                                    | "PARTLY_SHIPPED"
                                    | "NOTIFY_BUSY"
                            ) =>
                    {
                        v(format!(
                            "invariant 3: {} was answered an unexpected {e:?}",
                            attempt.call
                        ));
                    }
                    _ => {}
                }
            }
            // Once faults stopped, asking again leads to success, a recorded terminal error, or
            // an unknown outcome with its reason.
            let Some(last) = caller.settled.last() else {
                continue;
            };
            match &last.answer {
                Answer::Ok { .. } => {}
                Answer::Err(e) if e.code() == "DECLINED" => {}
                Answer::Err(e) if e.code() == "PARTLY_SHIPPED" && because.is_some() => {}
                Answer::Err(e) if e.is(ErrorCode::OutcomeUnknown) && because.is_some() => {}
                other => v(format!(
                    "invariant 3: once faults stopped, {} asking again for `{key}` ended in {other:?}",
                    last.call
                )),
            }
        }
    }
    let retry_limits = attempts()
        .filter(|a| matches!(&a.answer, Answer::Err(e) if e.is(ErrorCode::RetryLimit)))
        .count();
    let step_effects = ledger
        .iter()
        .filter(|(k, _)| k.contains('/'))
        .map(|(_, e)| e.len())
        .sum();
    Report {
        effects: ledger.values().map(Vec::len).sum(),
        step_effects,
        write_crashes: schedule.write_crashes.load(Ordering::SeqCst),
        operator_actions: world.operator_actions.load(Ordering::SeqCst),
        careless: world.careless.load(Ordering::SeqCst),
        retry_limits,
        violations,
    }
}

/// True when a `RETRY_LIMIT` answer tells that the action acted, or may have: that it happened,
/// or a step of it finished, not only that it keeps failing.
fn speaks_of_an_effect(e: &ToolError) -> bool {
    let text = format!("{} {}", e.message(), e.suggestion().unwrap_or_default());
    [
        "acted",
        "may have",
        "was done",
        "were done",
        "has been done",
        "happened",
        "finished",
    ]
    .iter()
    .any(|phrase| text.contains(phrase))
}

// ---------------------------------------------------------------------------------------------
// Running many schedules, per store.

/// A store clock that reads tokio's clock, so the paused clock moves leases too.
struct TokioClock {
    start: SystemTime,
    at: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.start + self.at.elapsed()
    }
}

fn env_u64(var: &str) -> Option<u64> {
    std::env::var(var).ok().map(|v| {
        v.trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a number, not {v:?}"))
    })
}

/// Panics in simulated bodies are expected; every other panic is still printed.
fn quiet_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<&str>()
                .copied()
                .unwrap_or_default();
            if !text.starts_with("sim: ") {
                default(info);
            }
        }));
    });
}

/// The seeds to run: `TOOLKEY_SIM_SEED` alone, or `count` of them.
fn seeds(count: u64) -> Vec<u64> {
    match env_u64("TOOLKEY_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=count).collect(),
    }
}

/// Prints the summary line and fails the test naming every failed schedule.
fn conclude(store: &str, test: &str, results: Vec<(u64, Report)>) {
    let schedules = results.len();
    let sum = |part: fn(&Report) -> usize| -> usize { results.iter().map(|(_, r)| part(r)).sum() };
    let effects = sum(|r| r.effects);
    let step_effects = sum(|r| r.step_effects);
    let write_crashes = sum(|r| r.write_crashes);
    let actions = sum(|r| r.operator_actions);
    let careless = sum(|r| r.careless);
    let retry_limits = sum(|r| r.retry_limits);
    let failed: Vec<&(u64, Report)> = results
        .iter()
        .filter(|(_, r)| !r.violations.is_empty())
        .collect();
    let violations: usize = failed.iter().map(|(_, r)| r.violations.len()).sum();
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "simulation: {schedules} schedules, {effects} effects ({step_effects} by steps), \
         {write_crashes} crashes at a store write, {actions} operator actions ({careless} not-done \
         on a done effect or a live worker), {retry_limits} retry limits, {violations} violations ({store})"
    );
    for (seed, report) in failed.iter().take(20) {
        let _ = writeln!(err, "schedule {seed} ({store}) failed:");
        for violation in &report.violations {
            let _ = writeln!(err, "  {violation}");
        }
        let _ = writeln!(
            err,
            "  re-run it alone: TOOLKEY_SIM_SEED={seed} cargo test --release --all-features --test simulation {test}"
        );
    }
    assert!(
        failed.is_empty(),
        "{} of {schedules} schedules on {store} broke an invariant (seeds {:?}); see above",
        failed.len(),
        failed.iter().map(|(s, _)| *s).take(20).collect::<Vec<_>>()
    );
}

#[test]
fn memory_store() {
    let _turn = ONE_AT_A_TIME.blocking_lock();
    quiet_simulated_panics();
    let seeds = seeds(env_u64("TOOLKEY_SIM_SCHEDULES").unwrap_or(MEMORY_SCHEDULES));
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&seed) = seeds.get(i) else { break };
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .start_paused(true)
                    .build()
                    .unwrap();
                let report = runtime.block_on(async {
                    let clock = TokioClock {
                        start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                        at: tokio::time::Instant::now(),
                    };
                    let target = Target {
                        name: "memory",
                        store: Arc::new(MemoryStore::with_clock(clock)),
                        paused: true,
                    };
                    run_schedule(&target, seed).await
                });
                results.lock().unwrap().push((seed, report));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(seed, _)| *seed);
    conclude("memory", "memory_store", results);
}

/// One store's simulation at a time: run side by side, they would starve each other's lease
/// renewals of CPU on a small machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `count` schedules on a store with a real clock, many at once, on `runtime`.
async fn real_clock(target: Target, count: u64, test: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    quiet_simulated_panics();
    let seeds = seeds(count);
    // Bodies that block their thread hold a worker thread each. The runtimes below have more
    // threads than the blocked bodies of the schedules run at once ever hold together, so
    // blocked bodies never starve the lease renewals (as the docs tell users: blocking work
    // belongs on `spawn_blocking` or a runtime with room). Blocking every worker thread is the
    // one way to stop a renewal, and no lease protocol survives it.
    // Schedules mostly wait (timeouts, retry delays, leases lapsing): 48 run at once, each
    // starting as soon as one ends, keep two cores busy without starving renewals.
    let at_once = Arc::new(tokio::sync::Semaphore::new(48));
    let runs: Vec<_> = seeds
        .iter()
        .map(|&seed| {
            let target = target.clone();
            let at_once = at_once.clone();
            tokio::spawn(async move {
                let _slot = at_once.acquire_owned().await.expect("never closed");
                (seed, run_schedule(&target, seed).await)
            })
        })
        .collect();
    let mut results = Vec::new();
    for run in runs {
        results.push(run.await.expect("a schedule task"));
    }
    conclude(target.name, test, results);
}

/// The schedules per store, debug build or release: on two cores the debug build runs the
/// memory store's 20,000 in about 30 s, and each real-clock store's 1,000 in two to three
/// minutes (schedules mostly wait on real timers). `TOOLKEY_SIM_REAL_SCHEDULES=N` sets the
/// count on the real-clock stores.
const MEMORY_SCHEDULES: u64 = 20_000;
const REAL_SCHEDULES: u64 = 1_000;

fn real_schedules() -> u64 {
    env_u64("TOOLKEY_SIM_REAL_SCHEDULES").unwrap_or(REAL_SCHEDULES)
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 192)]
async fn sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = toolkey::store::SqliteStore::open(dir.path().join("simulation.db")).unwrap();
    let target = Target {
        name: "sqlite",
        store: Arc::new(store),
        paused: false,
    };
    real_clock(target, real_schedules(), "sqlite_store").await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 192)]
async fn postgres_store() {
    const VAR: &str = "TOOLKEY_POSTGRES_URL";
    let url = servers::url(VAR, "postgres://postgres@127.0.0.1:5432/test");
    // A table of its own: the operator's purge deletes every expired record of its table.
    let store = match toolkey::store::PostgresStore::builder(&url)
        .table("simulation_records")
        .pool_size(64)
        .connect()
        .await
    {
        Ok(store) => store,
        Err(e) => return servers::unreachable("PostgreSQL", VAR, &url, e),
    };
    let target = Target {
        name: "postgres",
        store: Arc::new(store),
        paused: false,
    };
    real_clock(target, real_schedules(), "postgres_store").await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 192)]
async fn redis_store() {
    const VAR: &str = "TOOLKEY_REDIS_URL";
    let url = servers::url(VAR, "redis://127.0.0.1:6379");
    // A prefix of its own: the operator's purge deletes every expired record under it.
    let store = match toolkey::store::RedisStore::builder(&url)
        .prefix("toolkey-simulation")
        .connect()
        .await
    {
        Ok(store) => store,
        Err(e) => return servers::unreachable("Redis", VAR, &url, e),
    };
    let target = Target {
        name: "redis",
        store: Arc::new(store),
        paused: false,
    };
    real_clock(target, real_schedules(), "redis_store").await;
}

impl toolkey::store::Approvals for WorkerStore {
    toolkey::store::forward!(Approvals, |worker| &worker.store);
}
