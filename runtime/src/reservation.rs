//! The reservation protocol, the one a keyed call and each of its `ctx.once` steps follow:
//! reserve the key ([`Claim::reserve`]) → judge the record found there ([`Found`]) → take a
//! stale one over ([`Claim::take_over`]) → run the work under the lease ([`Claim::drive`]) →
//! end the reservation ([`Holder::settle`]: complete, release or mark unknown).
//!
//! What to do with each finding is the caller's policy, not this module's: the executor waits on
//! a record in progress, asks a recover hook about a stale one and keeps the retry limit; a step
//! refuses both unless its parent's hook found nothing. Either way, the store is reached only
//! from here (and from [`lease`](crate::lease), which renews the lease and retries the ending
//! writes).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::lease::{drive, Landed, Panic, Recorder, Renewal, What, Write, FIRST_RETRY};
use crate::observe::{self, StoreOp};
use crate::stats::Counters;
use crate::store::{
    nests_deeper, Outcome, Record, RecordKey, Reservation, Store, StoreError, Token,
    MAX_RESULT_DEPTH,
};
use crate::texts::{self, Other};
use crate::{ErrorCode, Fingerprint, ToolError};

/// One call's (or one step's) claim on its key: where its record lives, what it is, and how
/// long each hold of it lasts.
pub(crate) struct Claim<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) recorder: &'a Arc<Recorder>,
    pub(crate) rkey: &'a RecordKey,
    /// What the record is labelled with for operators: the tool's name, or `tool/step`.
    pub(crate) label: &'a str,
    /// The arguments' fingerprint the record is bound to.
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) lease: Duration,
    /// What holds the key, for logs and texts: the tool or the tool's step, never a key.
    pub(crate) what: What<'a>,
}

/// What reserving a key found.
pub(crate) enum Found {
    /// The key was free: the claim holds it under `token`. `failures`: those counted for the
    /// key in a retry limit's window, read with the reservation.
    Reserved { token: Token, failures: u64 },
    /// A call with other arguments made the key's record; `Other` says whether it ran, runs,
    /// or left its outcome unknown.
    Conflict(Other),
    /// A call with the same arguments ended in `Outcome`: the answer to replay.
    Completed(Outcome),
    /// A call with the same arguments holds the key, its lease kept, since `since`.
    InProgress { since: SystemTime },
    /// A call with the same arguments held the key under `token` and its outcome is unknown:
    /// its lease lapsed, or (`reported`) its body said it could not tell whether it acted.
    Stale {
        token: Token,
        since: SystemTime,
        reported: bool,
    },
}

impl<'a> Claim<'a> {
    /// Tries to reserve the key under a token drawn for it, and judges the record found.
    ///
    /// A store that failed may have applied the reserve with its reply lost: the drawn token's
    /// reservation is freed before the error is handed back, so that "nothing was done" holds
    /// and the key stays usable.
    pub(crate) async fn reserve(&self) -> Result<Found, StoreError> {
        let token = Token::generate();
        let reserve =
            self.store
                .reserve(self.rkey, self.label, self.fingerprint, &token, self.lease);
        let record = match observe::store(StoreOp::Reserve, reserve).await {
            Ok(Reservation::Reserved { token, failures }) => {
                return Ok(Found::Reserved { token, failures })
            }
            Ok(Reservation::Existing(record)) => record,
            Err(e) => {
                self.unreserve(&token).await;
                return Err(e);
            }
        };
        if record.fingerprint() != self.fingerprint {
            return Ok(Found::Conflict(match record {
                Record::Completed { .. } => Other::Ran,
                Record::InProgress { .. } => Other::Running,
                Record::Stale { .. } => Other::Unknown,
            }));
        }
        Ok(match record {
            Record::Completed { outcome, .. } => Found::Completed(outcome),
            Record::InProgress { since, .. } => Found::InProgress { since },
            Record::Stale {
                token,
                since,
                reported,
                ..
            } => Found::Stale {
                token,
                since,
                reported,
            },
        })
    }

    /// Takes over the stale reservation held by `stale`: the new token, or `None` when another
    /// caller took it first (the record is to be read again).
    pub(crate) async fn take_over(&self, stale: &Token) -> Result<Option<Token>, StoreError> {
        let take_over = self.store.take_over(self.rkey, stale, self.lease);
        observe::store(StoreOp::TakeOver, take_over).await
    }

    /// Runs `work` holding the key under `token`, its lease renewed meanwhile, catching a panic
    /// (see [`drive`]); `handover` is an earlier renewal of the same hold.
    pub(crate) async fn drive<T, F>(
        &self,
        token: &Token,
        handover: Option<Renewal>,
        work: F,
    ) -> (Result<T, Panic>, Renewal)
    where
        F: Future<Output = T> + Send,
    {
        drive(self.store, self.rkey, token, self.lease, handover, work).await
    }

    /// Keeps the hold under `token` renewed while the caller waits before its work starts:
    /// `renewal` goes on, or a new one starts.
    pub(crate) fn keep_renewed(&self, token: &Token, renewal: Option<Renewal>) -> Renewal {
        match renewal {
            Some(renewal) => renewal.resume(self.store, self.rkey, token),
            None => Renewal::start(
                self.store.clone(),
                self.rkey.clone(),
                token.clone(),
                self.lease,
            ),
        }
    }

    /// The hold under `token`, through which it ends.
    pub(crate) fn holder<'h>(&'h self, token: &'h Token) -> Holder<'h> {
        Holder {
            store: self.store,
            recorder: self.recorder,
            rkey: self.rkey,
            token,
            what: self.what,
        }
    }

    /// Frees a reservation the reserve may have written under `token` before its reply was
    /// lost: tried a few times at once, then in the background until the store answers.
    async fn unreserve(&self, token: &Token) {
        let mut wait = FIRST_RETRY;
        for _ in 0..3 {
            let release = observe::store(StoreOp::Release, self.store.release(self.rkey, token));
            if release.await.is_ok() {
                return;
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
        self.holder(token).write(Write::Release, None).await;
    }
}

/// The reservation a call or step holds, and where its ending writes go.
pub(crate) struct Holder<'a> {
    store: &'a Arc<dyn Store>,
    recorder: &'a Arc<Recorder>,
    rkey: &'a RecordKey,
    token: &'a Token,
    /// What holds it, for logs and texts: the tool or the tool's step, never a key.
    what: What<'a>,
}

impl Holder<'_> {
    /// Writes `write`, retrying it in the background (under `renewal`) until the store takes it.
    pub(crate) async fn write(&self, write: Write, renewal: Option<Renewal>) -> (Landed, Write) {
        self.recorder
            .write(self.store, self.rkey, self.token, write, renewal, self.what)
            .await
    }

    /// Marks the reservation unknown (the work may have been done) and answers `answer`; or
    /// `LEASE_LOST` when the key was taken over before the mark landed: the record is then
    /// another call's, which may act too, and `answer` would say what no longer holds.
    pub(crate) async fn keep_unknown(&self, renewal: Renewal, answer: ToolError) -> ToolError {
        match self.write(Write::MarkUnknown, Some(renewal)).await {
            (Landed::Yes, _) => answer,
            (Landed::TakenOver, _) => texts::lease_lost(self.what),
        }
    }

    /// Records what the work ended in, as the state machine says, and hands it back: a result
    /// or a final error is recorded, a retryable error releases the key, an unknown outcome (a
    /// panic too) is kept unknown. A call's ending is counted in `counters` (a step's is not:
    /// its parent's is).
    pub(crate) async fn settle(
        &self,
        retain: Duration,
        ran: Result<Result<Value, ToolError>, Panic>,
        renewal: Renewal,
        counters: Option<&Counters>,
    ) -> Result<Value, ToolError> {
        match ran {
            Ok(Ok(value)) => self.record(Outcome::Ok(value), retain, renewal).await,
            Ok(Err(err)) if err.is(ErrorCode::OutcomeUnknown) => {
                let answer = self.keep_unknown(renewal, err).await;
                // Counted when the key is kept unknown, not when another call took it over.
                if let Some(counters) = counters.filter(|_| answer.is(ErrorCode::OutcomeUnknown)) {
                    counters.unknown.inc();
                }
                Err(answer)
            }
            Ok(Err(err)) if err.is_retryable() => {
                if let Some(counters) = counters {
                    counters.released.inc();
                }
                self.write(Write::Release, Some(renewal)).await;
                Err(err)
            }
            Ok(Err(err)) => self.record(Outcome::Err(err), retain, renewal).await,
            Err(panic) => {
                let answer = panicked(self.what, "body", panic);
                Err(self.keep_unknown(renewal, answer).await)
            }
        }
    }

    /// Records `outcome` and hands it back as the caller's answer. A write the store did not
    /// take goes on in the background until it lands; a reservation taken over meanwhile (its
    /// lease lapsed) is said so in the answer: another call may have acted too.
    pub(crate) async fn record(
        &self,
        outcome: Outcome,
        retain: Duration,
        renewal: Renewal,
    ) -> Result<Value, ToolError> {
        // The outcome goes into the write and comes back as the answer: no copy on the call
        // path.
        let (landed, write) = self
            .write(Write::Complete(outcome, retain), Some(renewal))
            .await;
        if landed == Landed::TakenOver {
            return Err(texts::lease_lost(self.what));
        }
        match write {
            Write::Complete(Outcome::Ok(value), _) => Ok(value),
            Write::Complete(Outcome::Err(err), _) => Err(err),
            Write::Release | Write::MarkUnknown => {
                unreachable!("the write handed back is the one given")
            }
        }
    }
}

/// A result, done work, as it can be recorded. One nested deeper than [`MAX_RESULT_DEPTH`] would
/// be recorded as text no replay or status call could read back, so, like a result that cannot
/// be serialized, it makes the outcome unknown: `OUTCOME_UNKNOWN`, naming `what` acted.
pub(crate) fn recordable(value: Value, what: What<'_>) -> Result<Value, ToolError> {
    if !nests_deeper(&value, MAX_RESULT_DEPTH) {
        return Ok(value);
    }
    let problem = format!("it nests deeper than {MAX_RESULT_DEPTH} levels of arrays and objects");
    Err(match what {
        What::Step { step, .. } => texts::step_unrecordable(step, &problem),
        What::Tool(_) => texts::unrecordable_result(&problem),
    })
}

/// A panic's answer. The panic itself is dropped here, unread: its message can hold argument
/// values, and the panic hook has already printed it where the process logs.
pub(crate) fn panicked(what: What<'_>, part: &str, panic: Panic) -> ToolError {
    drop(panic);
    texts::panicked(what, part)
}
