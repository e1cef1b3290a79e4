//! Keeping a reservation held: the work run under it ([`drive`]) with its lease renewed beside
//! it, and the writes that end it (complete, release, mark unknown) retried until the store
//! takes them. The [reservation protocol](crate::reservation) decides which write ends a hold;
//! this module sees that it lands.
//!
//! Two promises rest here. A body that blocks its thread must not lose its lease: the renewal
//! runs in the runtime's renewer task (one per runtime, see [`renewer`]), so it goes on while
//! the body's task is stuck (on a multi-thread runtime; see [`Toolbox`](crate::Toolbox) on
//! blocking work). And an outcome the process knows must not be lost to one failed write: a
//! write the store did not take is retried, under the renewed lease, with backoff, until it
//! lands or the process stops; `Toolbox::shutdown` waits for that (with a bound) and reports
//! what it could not write.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::task::TaskTracker;

use crate::key::log_hash;
use crate::observe::{self, Renewals, StoreOp};
use crate::store::{Outcome, Record, RecordKey, Store, StoreError, Token};

/// How soon a failed renewal or write is tried again, at first and at most.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(10);
const LAST_RETRY: Duration = Duration::from_secs(2);

mod renewer;

use renewer::Registration;

/// Renews one reservation's lease until dropped: registered with the runtime's renewer task, or,
/// on a current-thread runtime, paused once the work that renewed it from its own task has ended
/// (see [`drive`]), and registered if the lease must outlast the call.
pub(crate) enum Renewal {
    /// Renewed by the runtime's renewer.
    Running(Registration),
    /// Not renewing: the work's own task renewed the lease while the work ran, every third of
    /// a lease while the store answered. [`resume`](Self::resume) registers it.
    Paused { lease: Duration, lost: bool },
}

impl Renewal {
    /// Starts renewing `token`'s lease every third of `lease`; a failed renewal is tried again
    /// soon, so a short outage does not let the lease lapse.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        rkey: RecordKey,
        token: Token,
        lease: Duration,
    ) -> Renewal {
        let runtime = tokio::runtime::Handle::current();
        Renewal::Running(Registration::new(&runtime, store, rkey, token, lease))
    }

    /// This renewal, renewed by the runtime's renewer: a paused one is registered.
    pub(crate) fn resume(self, store: &Arc<dyn Store>, rkey: &RecordKey, token: &Token) -> Renewal {
        match self {
            Renewal::Paused { lease, lost: false } => {
                Renewal::start(store.clone(), rkey.clone(), token.clone(), lease)
            }
            running_or_lost => running_or_lost,
        }
    }

    /// True once a renewal found the reservation no longer held by its token: the lease
    /// lapsed and another call took the key over (or the reservation was ended).
    pub(crate) fn lost(&self) -> bool {
        match self {
            Renewal::Running(registration) => registration.lost(),
            Renewal::Paused { lost, .. } => *lost,
        }
    }
}

/// How often a lease is renewed: every third of it, at most every 10 ms.
fn period_of(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

/// Renews `token`'s lease every third of `lease` until a renewal finds it no longer held by the
/// token; a failed renewal is tried again soon, so a short outage does not let the lease lapse.
async fn renew_until_lost(
    store: &dyn Store,
    rkey: &RecordKey,
    token: &Token,
    lease: Duration,
    renewals: &Renewals,
) {
    let mut wait = period_of(lease);
    loop {
        tokio::time::sleep(wait).await;
        match renew_judged(store, rkey, token, lease, renewals).await {
            Some(next) => wait = next,
            None => return,
        }
    }
}

/// Renews `token`'s lease once, and says when the next renewal is due: a period after one that
/// renewed it (counted for the call), soon after one that failed (logged), none once the lease
/// is lost (the reservation no longer held by the token).
///
/// A panic fails this renewal alone, and it is tried again soon: the store's is logged as a
/// failed renewal; one while the renewal is counted or logged (a log subscriber's, a metrics
/// recorder's) is not. Left to unwind, it would stop the renewals of the work's own task, or the
/// runtime's renewer task and with it every lease on the runtime: the leases would lapse under
/// their running bodies.
async fn renew_judged(
    store: &dyn Store,
    rkey: &RecordKey,
    token: &Token,
    lease: Duration,
    renewals: &Renewals,
) -> Option<Duration> {
    let period = period_of(lease);
    let retry = (period / 8).max(FIRST_RETRY).min(period);
    let judged = async {
        let renew = AssertUnwindSafe(store.renew(rkey, token, lease)).catch_unwind();
        let renewed = observe::store(StoreOp::Renew, renew)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::unavailable(
                    "the store panicked while renewing the lease",
                ))
            });
        match renewed {
            Ok(true) => {
                renewals.renewed();
                Some(period)
            }
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(parent: &renewals.span(), key = %log_hash(&rkey.key), error = %e, "could not renew the lease; trying again");
                Some(retry)
            }
        }
    };
    AssertUnwindSafe(judged)
        .catch_unwind()
        .await
        .unwrap_or(Some(retry))
}

/// A write that ends a reservation.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// Record the outcome, kept for the retention.
    Complete(Outcome, Duration),
    /// Free the key (a retryable failure, or a reservation nothing ran under).
    Release,
    /// Keep the record as unknown.
    MarkUnknown,
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landed {
    /// The store holds what the write meant (by this attempt or an earlier one whose reply was
    /// lost).
    Yes,
    /// The reservation was no longer this token's: its lease lapsed and another call took the
    /// key over.
    TakenOver,
}

impl Write {
    fn what(&self) -> &'static str {
        match self {
            Write::Complete(..) => "outcome",
            Write::Release => "release",
            Write::MarkUnknown => "unknown mark",
        }
    }

    /// Applies the write once. A fenced write that changes nothing may have been applied by an
    /// earlier attempt whose reply was lost: a `complete` sent again says so itself (the store
    /// knows the token that completed the record; a record holding an equal outcome may be
    /// another holder's), a mark's record tells by its token.
    async fn apply(
        &self,
        store: &dyn Store,
        rkey: &RecordKey,
        token: &Token,
    ) -> Result<Landed, StoreError> {
        let applied = match self {
            Write::Complete(outcome, retain) => {
                let complete = store.complete(rkey, token, outcome, *retain);
                observe::store(StoreOp::Complete, complete).await?
            }
            Write::MarkUnknown => {
                observe::store(StoreOp::MarkUnknown, store.mark_unknown(rkey, token)).await?
            }
            // Not held by this token: nothing of this reservation holds the key.
            Write::Release => {
                let release = observe::store(StoreOp::Release, store.release(rkey, token));
                return release.await.map(|_| Landed::Yes);
            }
        };
        if applied {
            return Ok(Landed::Yes);
        }
        let landed = match self {
            Write::MarkUnknown => matches!(
                observe::store(StoreOp::Get, store.get(rkey)).await?,
                Some(Record::Stale { token: held, .. }) if held == *token
            ),
            _ => false,
        };
        Ok(if landed {
            Landed::Yes
        } else {
            Landed::TakenOver
        })
    }
}

/// A write not yet taken by the store, as [`Toolbox::shutdown`](crate::Toolbox::shutdown)
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrecorded {
    /// What ran: the tool (or the tool's step).
    pub what: String,
    /// The key, as a short hash (keys carry argument values).
    pub key_hash: String,
    /// The tenant of the record.
    pub tenant: String,
    /// Which write: `"outcome"`, `"release"` or `"unknown mark"`.
    pub write: &'static str,
    /// The store's last error.
    pub error: String,
}

/// What [`Toolbox::shutdown`](crate::Toolbox::shutdown) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "writes the store did not take are lost when the process exits: log or act on them"]
pub struct ShutdownReport {
    /// Writes still not taken by the store when the wait ended. Each is still being retried
    /// while the process runs; when it exits, the key's lease lapses and the key reads as
    /// unknown.
    pub unrecorded: Vec<Unrecorded>,
}

impl ShutdownReport {
    /// True when every outcome was recorded.
    pub fn is_clean(&self) -> bool {
        self.unrecorded.is_empty()
    }
}

/// The writes retried in the background, shared by a toolbox's calls.
#[derive(Default)]
pub(crate) struct Recorder {
    tracker: TaskTracker,
    pending: Mutex<HashMap<u64, Unrecorded>>,
    next: AtomicU64,
}

impl Recorder {
    /// Applies `write`; if the store does not take it, retries it in the background (keeping
    /// `renewal` alive, so the lease holds meanwhile) and answers as if it landed: the outcome is
    /// known and will be recorded. `TakenOver` only when the store said so. The write comes
    /// back (a recorded result is the caller's answer): it is copied only for a retry.
    pub(crate) async fn write(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        rkey: &RecordKey,
        token: &Token,
        write: Write,
        renewal: Option<Renewal>,
        what: What<'_>,
    ) -> (Landed, Write) {
        let first = write.apply(&**store, rkey, token).await;
        let error = match first {
            Ok(landed) => {
                if landed == Landed::TakenOver {
                    tracing::error!(what = %what, key = %log_hash(&rkey.key), write = write.what(), "the reservation was taken over after its lease lapsed: this call's {} was not written", write.what());
                }
                return (landed, write);
            }
            Err(e) => e,
        };
        tracing::warn!(what = %what, key = %log_hash(&rkey.key), error = %error, "the store did not take the {}; retrying it until it does", write.what());
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Unrecorded {
                what: what.to_string(),
                key_hash: log_hash(&rkey.key).to_string(),
                tenant: rkey.tenant.clone(),
                write: write.what(),
                error: error.to_string(),
            },
        );
        // The lease must hold while the write is retried, after the call has ended.
        let renewal = renewal.map(|renewal| renewal.resume(store, rkey, token));
        let (recorder, store, rkey, token) =
            (self.clone(), store.clone(), rkey.clone(), token.clone());
        let what = what.to_string();
        let retried = write.clone();
        self.tracker.spawn(async move {
            let write = retried;
            let _renewal = renewal;
            let mut wait = FIRST_RETRY;
            loop {
                tokio::time::sleep(wait).await;
                match write.apply(&*store, &rkey, &token).await {
                    Ok(landed) => {
                        recorder.lock().remove(&id);
                        match landed {
                            Landed::Yes => tracing::info!(what, key = %log_hash(&rkey.key), "the {} was written after retries", write.what()),
                            Landed::TakenOver => tracing::error!(what, key = %log_hash(&rkey.key), "the reservation was taken over before the {} could be written", write.what()),
                        }
                        return;
                    }
                    Err(e) => {
                        if let Some(entry) = recorder.lock().get_mut(&id) {
                            entry.error = e.to_string();
                        }
                        wait = (wait * 2).min(LAST_RETRY);
                    }
                }
            }
        });
        (Landed::Yes, write)
    }

    /// Waits up to `bound` for the background writes, and reports those still pending.
    pub(crate) async fn drain(&self, bound: Duration) -> ShutdownReport {
        self.tracker.close();
        let _ = tokio::time::timeout(bound, self.tracker.wait()).await;
        self.tracker.reopen();
        let mut unrecorded: Vec<Unrecorded> = self.lock().values().cloned().collect();
        unrecorded.sort_by(|a, b| (&a.tenant, &a.key_hash).cmp(&(&b.tenant, &b.key_hash)));
        for entry in &unrecorded {
            tracing::error!(what = %entry.what, key = %entry.key_hash, write = entry.write, error = %entry.error, "shutdown: not written to the store yet");
        }
        ShutdownReport { unrecorded }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Unrecorded>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What holds a reservation, named for logs and texts: the tool, or one of its steps with the
/// step key's short hash. Formatted only when a log line or an answer needs it, so the call
/// path neither allocates the name nor hashes the key.
#[derive(Clone, Copy)]
pub(crate) enum What<'a> {
    /// A tool's call: `` `send_invoice` ``.
    Tool(&'a str),
    /// A step of a tool's call: `` step `email` (key hash 1f2e…) ``.
    Step {
        /// The step's name.
        step: &'a str,
        /// The step's record key (never shown; its hash is).
        key: &'a str,
    },
}

impl std::fmt::Display for What<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Tool(name) => write!(f, "`{name}`"),
            What::Step { step, key } => write!(f, "step `{step}` (key hash {})", log_hash(key)),
        }
    }
}

/// What a caught panic carries; never read (see [`panicked`]).
pub(crate) type Panic = Box<dyn std::any::Any + Send>;

/// Runs `work` while its lease is renewed (so a body that blocks its thread cannot stop the
/// renewal on a multi-thread runtime), catching a panic. The renewal goes on until it is
/// dropped; `handover`, an earlier renewal of the same reservation, ends once this one runs.
///
/// On a multi-thread runtime the lease is registered with the runtime's renewer task, which
/// another worker runs while the work's thread is blocked. A current-thread runtime has no other
/// thread: a body that blocks it stops every task alike, so the work's own task renews the
/// lease while the work waits, sparing a task, and the renewal is handed back
/// [paused](Renewal::Paused).
pub(crate) async fn drive<T, F>(
    store: &Arc<dyn Store>,
    rkey: &RecordKey,
    token: &Token,
    lease: Duration,
    handover: Option<Renewal>,
    work: F,
) -> (Result<T, Panic>, Renewal)
where
    F: Future<Output = T> + Send,
{
    let work = AssertUnwindSafe(work).catch_unwind();
    let runtime = tokio::runtime::Handle::current();
    let one_thread = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
    let (done, renewal) = if one_thread {
        drop(handover);
        let renewals = Renewals::of_current();
        let renew = renew_until_lost(&**store, rkey, token, lease, &renewals);
        let mut renew = std::pin::pin!(renew);
        let mut work = std::pin::pin!(work);
        let mut lost = false;
        let done = std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(done) = work.as_mut().poll(cx) {
                return std::task::Poll::Ready(done);
            }
            // Once lost, never renewed again; the work goes on, and its ending says so.
            if !lost && renew.as_mut().poll(cx).is_ready() {
                lost = true;
            }
            std::task::Poll::Pending
        })
        .await;
        (done, Renewal::Paused { lease, lost })
    } else {
        let registration =
            Registration::new(&runtime, store.clone(), rkey.clone(), token.clone(), lease);
        // A task woken from a worker thread waits in that worker's own slot, which no other
        // worker takes from: when this registration (or an earlier one of this call, while it
        // waited for a concurrency slot) woke the renewer and it has not run since, let it out
        // of that slot (the yield lets it be polled, or moves it to the queue other workers
        // take from) before a body that blocks this thread can keep it there. Outside any task
        // (a caller's `block_on`) the renewer went to the runtime's shared queue.
        if registration.renewer_woken() && tokio::task::try_id().is_some() {
            tokio::task::yield_now().await;
        }
        drop(handover);
        (work.await, Renewal::Running(registration))
    };
    if renewal.lost() {
        tracing::error!(key = %log_hash(&rkey.key), "the lease was lost while the work ran: another call took the key over, and may have acted too");
    }
    (done, renewal)
}
