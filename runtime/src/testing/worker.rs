//! One worker's view of the scenario's store, with the switches the catalogue needs: hold the
//! tool's record write (a body slow after its effect), fail the renewals (a worker cut off from
//! the store), and one fault at one store-write boundary of the call — the worker dies there (a
//! process killed), dies just after it (killed once the key is reserved), or the store fails
//! that write once (not applied, or applied with its reply lost).
//!
//! A boundary is named by what the call writes, not by when: the `nth` write `op` of the tool's
//! own record or of one `ctx.once` step's, told apart by the label and key each reservation
//! carries. So a check can first watch a call write (a probe), then stop a new call at each of
//! those writes in turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::store::{
    FailureCounters, OperatorCommands, Outcome, Record, RecordKey, Reservation, Reservations,
    Store, StoreError, Token,
};
use crate::Fingerprint;

/// A write of a call to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WriteOp {
    Reserve,
    Complete,
    Release,
    MarkUnknown,
    TakeOver,
}

/// Whose record a write is: the checked tool's own, one of its steps', or another's (a tool the
/// body called through a toolbox on the same store).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Holder {
    Tool,
    Step(String),
    Other(String),
}

/// One store-write boundary of a call: its `nth` write `op` (from 0) for `holder`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Boundary {
    pub(crate) op: WriteOp,
    pub(crate) holder: Holder,
    pub(crate) nth: usize,
}

impl Boundary {
    /// The tool's record write (its outcome, or its unknown mark).
    pub(crate) fn is_tool_record(&self) -> bool {
        self.holder == Holder::Tool && matches!(self.op, WriteOp::Complete | WriteOp::MarkUnknown)
    }

    /// A write of one of the tool's `ctx.once` steps.
    pub(crate) fn is_step(&self) -> bool {
        matches!(self.holder, Holder::Step(_))
    }
}

impl std::fmt::Display for Boundary {
    /// `step `ship`'s reservation`, `the tool's record`, `the second take-over of step `ship``.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whose = match &self.holder {
            Holder::Tool => "the tool's".to_string(),
            Holder::Step(step) => format!("step `{step}`'s"),
            Holder::Other(label) => format!("`{label}`'s"),
        };
        let what = match self.op {
            WriteOp::Reserve => "reservation",
            WriteOp::Complete => "record",
            WriteOp::Release => "release",
            WriteOp::MarkUnknown => "unknown mark",
            WriteOp::TakeOver => "take-over",
        };
        match self.nth {
            0 => write!(f, "{whose} {what}"),
            n => write!(f, "{whose} {what} (write {} of its kind)", n + 1),
        }
    }
}

/// What happens at the fault's boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// The worker dies: this write and every later operation never reach the store and never
    /// answer.
    Die,
    /// The write is applied, then the worker dies before it hears the answer.
    DieAfter,
    /// The store fails the write once, before applying it.
    FailBefore,
    /// The store applies the write and its reply is lost, once.
    LoseReply,
}

impl Action {
    /// `not applied`, `applied, its reply lost`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Action::Die => "the worker died before it reached the store",
            Action::DieAfter => "applied, then the worker died",
            Action::FailBefore => "not applied",
            Action::LoseReply => "applied, its reply lost",
        }
    }
}

/// What the gate lets a write do.
enum Fate {
    Go,
    FailBefore,
    LoseReply,
    DieAfter,
}

/// What a worker saw written.
#[derive(Default)]
struct Seen {
    /// Whose each record key is, learnt from the reservation's label.
    holders: HashMap<(String, String), Holder>,
    counts: HashMap<(WriteOp, Holder), usize>,
    writes: Vec<Boundary>,
    /// The tool's own record keys, in the order reserved.
    tool_keys: Vec<RecordKey>,
}

/// The switches of one worker.
pub(crate) struct Control {
    /// The checked tool: its reservation is labelled with its name, its steps' with
    /// `tool/step`.
    tool: String,
    held: watch::Sender<bool>,
    /// The tool's record write arrived.
    recorded: watch::Sender<bool>,
    /// The fault fired.
    fired: watch::Sender<bool>,
    dead: AtomicBool,
    fault: Mutex<Option<(Boundary, Action)>>,
    renewals_fail: AtomicBool,
    seen: Mutex<Seen>,
}

impl Control {
    pub(crate) fn new(tool: &str) -> Arc<Control> {
        Arc::new(Control {
            tool: tool.to_string(),
            held: watch::channel(false).0,
            recorded: watch::channel(false).0,
            fired: watch::channel(false).0,
            dead: AtomicBool::new(false),
            fault: Mutex::new(None),
            renewals_fail: AtomicBool::new(false),
            seen: Mutex::default(),
        })
    }

    /// The tool's record writes wait (true) or go through (false).
    pub(crate) fn hold_records(&self, hold: bool) {
        self.held.send_replace(hold);
    }

    /// `action` at boundary `at`, once.
    pub(crate) fn fault(&self, at: Boundary, action: Action) {
        *lock(&self.fault) = Some((at, action));
    }

    /// Every renewal fails before it reaches the store.
    pub(crate) fn fail_renewals(&self) {
        self.renewals_fail.store(true, Ordering::SeqCst);
    }

    /// Waits until the tool's record write arrived (the body ended), up to `limit`; true if it
    /// did.
    pub(crate) async fn record_reached(&self, limit: Duration) -> bool {
        wait(&self.recorded, limit).await
    }

    /// Waits until the fault fired, up to `limit`; true if it did.
    pub(crate) async fn fault_fired(&self, limit: Duration) -> bool {
        wait(&self.fired, limit).await
    }

    /// True once the fault fired.
    pub(crate) fn fired(&self) -> bool {
        *self.fired.borrow()
    }

    /// The writes this worker made, in order (a fault's write included).
    pub(crate) fn writes(&self) -> Vec<Boundary> {
        lock(&self.seen).writes.clone()
    }

    /// The tool's own record keys this worker reserved (one per call it ran).
    pub(crate) fn tool_keys(&self) -> Vec<RecordKey> {
        lock(&self.seen).tool_keys.clone()
    }

    /// Lets a write through, fails it, or kills the worker at it. `label`: the reservation's.
    async fn write(&self, op: WriteOp, rkey: &RecordKey, label: Option<&str>) -> Fate {
        self.alive().await;
        let boundary = {
            let mut seen = lock(&self.seen);
            let id = (rkey.tenant.clone(), rkey.key.clone());
            let holder = match label {
                Some(label) => {
                    let holder = self.holder(label);
                    if holder == Holder::Tool && !seen.holders.contains_key(&id) {
                        seen.tool_keys.push(rkey.clone());
                    }
                    seen.holders.insert(id, holder.clone());
                    holder
                }
                None => seen
                    .holders
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| Holder::Other("?".into())),
            };
            let count = seen.counts.entry((op, holder.clone())).or_default();
            let boundary = Boundary {
                op,
                holder,
                nth: *count,
            };
            *count += 1;
            seen.writes.push(boundary.clone());
            boundary
        };
        let record = boundary.is_tool_record();
        if record {
            self.recorded.send_replace(true);
        }
        let action = {
            let mut fault = lock(&self.fault);
            match fault.as_ref() {
                Some((at, _)) if *at == boundary => fault.take().map(|(_, action)| action),
                _ => None,
            }
        };
        if let Some(action) = action {
            // Once the write is applied, when it is: a check that moves on when the fault
            // fired must find the store as the fault left it.
            match action {
                Action::Die => {
                    self.dead.store(true, Ordering::SeqCst);
                    self.fired.send_replace(true);
                    self.alive().await;
                }
                Action::DieAfter => return Fate::DieAfter,
                Action::FailBefore => {
                    self.fired.send_replace(true);
                    return Fate::FailBefore;
                }
                Action::LoseReply => return Fate::LoseReply,
            }
        }
        if record {
            let mut held = self.held.subscribe();
            let _ = held.wait_for(|h| !*h).await;
        }
        Fate::Go
    }

    fn holder(&self, label: &str) -> Holder {
        if label == self.tool {
            return Holder::Tool;
        }
        match label
            .strip_prefix(self.tool.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
        {
            Some(step) => Holder::Step(step.to_string()),
            None => Holder::Other(label.to_string()),
        }
    }

    /// Never returns once the worker is dead.
    async fn alive(&self) {
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    /// Dies now: never returns.
    async fn die(&self) -> ! {
        self.dead.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await;
        unreachable!("a pending future never ends")
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

async fn wait(flag: &watch::Sender<bool>, limit: Duration) -> bool {
    let mut flag = flag.subscribe();
    tokio::time::timeout(limit, flag.wait_for(|f| *f))
        .await
        .is_ok_and(|f| f.is_ok())
}

/// A store seen through one worker's [`Control`].
pub(crate) struct WorkerStore {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) control: Arc<Control>,
}

fn unavailable(why: &str) -> StoreError {
    StoreError::Unavailable(format!("retry check: {why}"))
}

impl WorkerStore {
    /// Runs `op` as its write's fate says.
    async fn gated<T>(
        &self,
        op: WriteOp,
        rkey: &RecordKey,
        label: Option<&str>,
        apply: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.control.write(op, rkey, label).await {
            Fate::Go => apply.await,
            Fate::FailBefore => Err(unavailable("the store failed this write")),
            Fate::LoseReply => {
                let _ = apply.await;
                self.control.fired.send_replace(true);
                Err(unavailable(
                    "the store applied this write and its reply was lost",
                ))
            }
            Fate::DieAfter => {
                let _ = apply.await;
                self.control.dead.store(true, Ordering::SeqCst);
                self.control.fired.send_replace(true);
                self.control.die().await
            }
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
        let reserve = self.inner.reserve(key, tool, fingerprint, token, lease);
        self.gated(WriteOp::Reserve, key, Some(tool), reserve).await
    }
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let complete = self.inner.complete(key, token, outcome, retain);
        self.gated(WriteOp::Complete, key, None, complete).await
    }
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let release = self.inner.release(key, token);
        self.gated(WriteOp::Release, key, None, release).await
    }
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.control.alive().await;
        if self.control.renewals_fail.load(Ordering::SeqCst) {
            return Err(unavailable("this worker's renewals do not reach the store"));
        }
        self.inner.renew(key, token, lease).await
    }
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let mark = self.inner.mark_unknown(key, token);
        self.gated(WriteOp::MarkUnknown, key, None, mark).await
    }
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let take_over = self.inner.take_over(key, stale, lease);
        self.gated(WriteOp::TakeOver, key, None, take_over).await
    }
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.control.alive().await;
        self.inner.get(key).await
    }
}

#[async_trait]
impl OperatorCommands for WorkerStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.control.alive().await;
        self.inner.purge_expired(limit).await
    }
    async fn now(&self) -> Result<SystemTime, StoreError> {
        self.control.alive().await;
        self.inner.now().await
    }
}

#[async_trait]
impl FailureCounters for WorkerStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        self.control.alive().await;
        self.inner.count_failure(key, window).await
    }
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        self.control.alive().await;
        self.inner.failures(key).await
    }
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.control.alive().await;
        self.inner.clear_failures(key).await
    }
}

impl crate::store::Approvals for WorkerStore {
    crate::store::forward!(Approvals, |worker| &worker.inner);
}
