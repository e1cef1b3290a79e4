//! The keyed path: reserve → run the body (renewing its lease) → complete or release.
//!
//! Everything here runs inside a task of its own, spawned by `Toolbox::call`: a caller that stops
//! waiting (its timeout, or its future dropped) never cancels the work and never releases a key
//! whose work still runs.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::key::log_hash;
use crate::lease::{unreserve, Landed, Recorder, Renewal, Write};
use crate::store::{Outcome, Record, RecordKey, Reservation, Store, Token};
use crate::texts;
use crate::tool::{Call, Invocation};
use crate::toolbox::{Inner, Registered, ToolOutput};
use crate::{ErrorCode, Fingerprint, IdempotencyKey, ToolContext, ToolError};

/// What a keyed call gives its context for `ctx.once` steps: the store, and the parent call's
/// key and fingerprint, to which every step is bound.
pub(crate) struct OnceScope {
    store: Arc<dyn Store>,
    recorder: Arc<Recorder>,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    lease: Duration,
    retain: Duration,
    /// Set when the parent's recover hook answered "not found": no effect of this call exists,
    /// so a step left unknown (or abandoned by a crash) may run again.
    recovered_not_found: AtomicBool,
    /// Set when a step met a record the parent must not be recorded over (another action's
    /// step, or a step still running elsewhere): the parent's key is released, not recorded.
    release_parent: AtomicBool,
}

impl OnceScope {
    pub(crate) fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub(crate) async fn run_step<T, E, F>(
        &self,
        tenant: &str,
        step: &str,
        work: F,
    ) -> Result<T, ToolError>
    where
        F: Future<Output = Result<T, E>> + Send,
        T: Serialize + DeserializeOwned,
        E: Into<ToolError>,
    {
        let key = self.key.step_key(step);
        let rkey = RecordKey::new(tenant, key.as_str());
        let what = format!("step `{step}` (key hash {})", key.for_logs());
        let token = loop {
            let token = Token::generate();
            let reservation = match self
                .store
                .reserve(&rkey, &self.fingerprint, &token, self.lease)
                .await
            {
                Ok(reservation) => reservation,
                Err(e) => {
                    // The reserve may have been applied with its reply lost: free it, so the
                    // step did not run and its key stays usable.
                    unreserve(&self.recorder, &self.store, &rkey, &token, &what).await;
                    return Err(texts::step_store_error(step, e));
                }
            };
            let record = match reservation {
                Reservation::Reserved(token) => break token,
                Reservation::Existing(record) => record,
            };
            if record.fingerprint() != &self.fingerprint {
                self.release_parent.store(true, Ordering::SeqCst);
                return Err(texts::step_conflict(step));
            }
            let value = match record {
                Record::Completed {
                    outcome: Outcome::Ok(value),
                    ..
                } => value,
                Record::Completed {
                    outcome: Outcome::Err(err),
                    ..
                } => return Err(err),
                Record::InProgress { .. } => {
                    self.release_parent.store(true, Ordering::SeqCst);
                    return Err(texts::step_in_progress(step));
                }
                Record::Stale { token, .. } if self.recovered_not_found.load(Ordering::SeqCst) => {
                    match self
                        .store
                        .take_over(&rkey, &token, self.lease)
                        .await
                        .map_err(|e| texts::step_store_error(step, e))?
                    {
                        Some(token) => break token,
                        // Another caller took it first: read the record again.
                        None => continue,
                    }
                }
                Record::Stale { .. } => return Err(texts::step_unknown(step)),
            };
            return serde_json::from_value(value)
                .map_err(|e| texts::step_result_unfit(step, &e.to_string()));
        };
        let recorded = async {
            let value = work.await.map_err(Into::into)?;
            // The step acted: a result that cannot be recorded makes its outcome unknown, never
            // a failure, or a retry would act again.
            serde_json::to_value(&value).map_err(|e| texts::step_unrecordable(step, &e.to_string()))
        };
        let (ran, renewal) = drive(&self.store, &rkey, &token, self.lease, None, recorded).await;
        let holder = Holder {
            store: &self.store,
            recorder: &self.recorder,
            rkey: &rkey,
            token: &token,
            what: &what,
        };
        let value = settle(&holder, self.retain, ran, renewal, None).await?;
        serde_json::from_value(value).map_err(|e| texts::step_result_unfit(step, &e.to_string()))
    }
}

/// Runs a keyed call to its end, inside its own task.
pub(crate) async fn run_keyed(
    inner: Arc<Inner>,
    tool: Arc<Registered>,
    call: Call,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let def = &tool.definition;
    let settings = &def.settings;
    let call_has_recover = call.recover.is_some();
    let (Some(key), Some(fingerprint)) = (call.key, call.fingerprint) else {
        return Err(texts::keyed_without_key(&def.name));
    };
    let store = inner.store.clone();
    let rkey = RecordKey::new(ctx.scope(), key.as_str());
    let log_key = key.for_logs();
    let deadline = settings
        .wait_in_progress
        .map(|d| tokio::time::Instant::now() + d);
    let recorder = inner.recorder.clone();
    let what = format!("`{}`", def.name);
    let scope = Arc::new(OnceScope {
        store: store.clone(),
        recorder: recorder.clone(),
        key: key.clone(),
        fingerprint,
        lease: settings.lease,
        retain: settings.retain,
        recovered_not_found: AtomicBool::new(false),
        release_parent: AtomicBool::new(false),
    });
    let mut recover_hook = call.recover;
    let invocation = || Invocation {
        ctx: ctx.clone().with_call(scope.clone()),
        state: inner.state.clone(),
    };

    // Settle what the key's record says until this call holds the key (or has its answer).
    let (token, renewal) = loop {
        let token = Token::generate();
        let reservation = match store
            .reserve(&rkey, &fingerprint, &token, settings.lease)
            .await
        {
            Ok(reservation) => reservation,
            Err(e) => {
                tracing::warn!(tool = %def.name, key = %log_key, error = %e, "store refused the reservation; the tool did not run");
                // The reserve may have been applied with its reply lost: free it under the
                // token this call drew, so "nothing was done" holds and the key stays usable.
                unreserve(&recorder, &store, &rkey, &token, &what).await;
                return Err(texts::store_error(e));
            }
        };
        let record = match reservation {
            Reservation::Reserved(token) => {
                tracing::debug!(tool = %def.name, key = %log_key, "reserved; running");
                break (token, None);
            }
            Reservation::Existing(record) => record,
        };
        if record.fingerprint() != &fingerprint {
            inner.stats.conflicts.inc();
            tracing::info!(tool = %def.name, key = %log_key, "conflict: same key, other arguments");
            return Err(texts::conflict(
                def,
                matches!(record, Record::Completed { .. }),
            ));
        }
        match record {
            Record::Completed { outcome, .. } => {
                inner.stats.replayed.inc();
                tracing::debug!(tool = %def.name, key = %log_key, "replayed");
                return match outcome {
                    Outcome::Ok(value) => Ok(ToolOutput {
                        value,
                        replayed: true,
                    }),
                    Outcome::Err(err) => Err(err),
                };
            }
            Record::InProgress { since, .. } => {
                if deadline.is_some_and(|deadline| tokio::time::Instant::now() < deadline) {
                    tokio::time::sleep(poll_interval(settings.wait_in_progress)).await;
                    continue;
                }
                inner.stats.in_progress.inc();
                tracing::debug!(tool = %def.name, key = %log_key, "in progress");
                return Err(texts::in_progress(def, since));
            }
            Record::Stale {
                token,
                since,
                reported,
                ..
            } => {
                let Some(recover) = recover_hook.take() else {
                    inner.stats.unknown.inc();
                    tracing::warn!(tool = %def.name, key = %log_key, "stale reservation and no recover hook: outcome unknown");
                    return Err(texts::outcome_unknown(def, since, reported));
                };
                let Some(token) = store
                    .take_over(&rkey, &token, settings.lease)
                    .await
                    .map_err(texts::store_error)?
                else {
                    // Another caller took it over first; ask again what the record says now.
                    recover_hook = Some(recover);
                    continue;
                };
                tracing::info!(tool = %def.name, key = %log_key, "took over a stale reservation; asking the recover hook");
                inner.stats.recovered.inc();
                let (looked, renewal) = drive(
                    &store,
                    &rkey,
                    &token,
                    settings.lease,
                    None,
                    recover(invocation()),
                )
                .await;
                let holder = Holder {
                    store: &store,
                    recorder: &recorder,
                    rkey: &rkey,
                    token: &token,
                    what: &what,
                };
                match looked {
                    Ok(Ok(Some(found))) => {
                        let found =
                            record_outcome(&holder, Outcome::Ok(found), settings.retain, renewal)
                                .await;
                        return found.map(|value| ToolOutput {
                            value,
                            replayed: true,
                        });
                    }
                    // Not found: safe to act, under the token just taken over; steps an earlier
                    // attempt left unknown may run again, since none of their effects exists.
                    Ok(Ok(None)) => {
                        scope.recovered_not_found.store(true, Ordering::SeqCst);
                        break (token, Some(renewal));
                    }
                    Ok(Err(err)) => {
                        // The lookup failed: the outcome is as unknown as before. Never release
                        // here, or the next call would act without looking.
                        holder.write(Write::MarkUnknown, Some(renewal)).await;
                        return Err(err);
                    }
                    Err(panic) => {
                        holder.write(Write::MarkUnknown, Some(renewal)).await;
                        return Err(panicked(&what, "recover hook", panic));
                    }
                }
            }
        }
    };

    inner.stats.executed.inc();
    // The lookup's renewal (after a take-over) holds the lease until the body's own starts.
    let (ran, renewal) = drive(
        &store,
        &rkey,
        &token,
        settings.lease,
        renewal,
        (call.body)(invocation()),
    )
    .await;
    let holder = Holder {
        store: &store,
        recorder: &recorder,
        rkey: &rkey,
        token: &token,
        what: &what,
    };
    if let Ok(Err(err)) = &ran {
        if scope.release_parent.load(Ordering::SeqCst) {
            // A step met another action's record, or a step still running elsewhere: recording
            // this answer as the call's outcome would block the call that owns those steps.
            inner.stats.released.inc();
            holder.write(Write::Release, Some(renewal)).await;
            return Err(err.clone());
        }
    }
    let value = settle(&holder, settings.retain, ran, renewal, Some(&inner))
        .await
        .map_err(|err| texts::looked_up_on_retry(err, call_has_recover))?;
    Ok(ToolOutput {
        value,
        replayed: false,
    })
}

type Panic = Box<dyn std::any::Any + Send>;

/// The reservation a call or step holds, and where its ending writes go.
struct Holder<'a> {
    store: &'a Arc<dyn Store>,
    recorder: &'a Arc<Recorder>,
    rkey: &'a RecordKey,
    token: &'a Token,
    what: &'a str,
}

impl Holder<'_> {
    /// Writes `write`, retrying it in the background (under `renewal`) until the store takes it.
    async fn write(&self, write: Write, renewal: Option<Renewal>) -> (Landed, Write) {
        self.recorder
            .write(self.store, self.rkey, self.token, write, renewal, self.what)
            .await
    }
}

/// Runs `work` while its lease is renewed from a task of its own (so a body that blocks its
/// thread cannot stop the renewal), catching a panic. The renewal goes on until it is dropped;
/// `handover`, an earlier renewal of the same reservation, ends once this one runs.
async fn drive<T, F>(
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
    let renewal = Renewal::start(store.clone(), rkey.clone(), token.clone(), lease);
    // A task spawned from a worker thread waits in that worker's own slot, which no other worker
    // takes from: let the renewal be polled once (it then waits on a timer, whose wake-up any
    // worker handles) before a body that blocks this thread can keep it there.
    tokio::task::yield_now().await;
    drop(handover);
    let done = AssertUnwindSafe(work).catch_unwind().await;
    if renewal.lost() {
        tracing::error!(key = %log_hash(&rkey.key), "the lease was lost while the work ran: another call took the key over, and may have acted too");
    }
    (done, renewal)
}

/// Records what the body ended in, as the state machine says, and hands it back.
async fn settle(
    holder: &Holder<'_>,
    retain: Duration,
    ran: Result<Result<Value, ToolError>, Panic>,
    renewal: Renewal,
    inner: Option<&Inner>,
) -> Result<Value, ToolError> {
    match ran {
        Ok(Ok(value)) => record_outcome(holder, Outcome::Ok(value), retain, renewal).await,
        Ok(Err(err)) if err.is(ErrorCode::OutcomeUnknown) => {
            if let Some(inner) = inner {
                inner.stats.unknown.inc();
            }
            holder.write(Write::MarkUnknown, Some(renewal)).await;
            Err(err)
        }
        Ok(Err(err)) if err.is_retryable() => {
            if let Some(inner) = inner {
                inner.stats.released.inc();
            }
            holder.write(Write::Release, Some(renewal)).await;
            Err(err)
        }
        Ok(Err(err)) => record_outcome(holder, Outcome::Err(err), retain, renewal).await,
        Err(panic) => {
            holder.write(Write::MarkUnknown, Some(renewal)).await;
            Err(panicked(holder.what, "body", panic))
        }
    }
}

/// Records `outcome` and hands it back as the caller's answer. A write the store did not take
/// goes on in the background until it lands; a reservation taken over meanwhile (its lease
/// lapsed) is said so in the answer: another call may have acted too.
async fn record_outcome(
    holder: &Holder<'_>,
    outcome: Outcome,
    retain: Duration,
    renewal: Renewal,
) -> Result<Value, ToolError> {
    // The outcome goes into the write and comes back as the answer: no copy on the call path.
    let (landed, write) = holder
        .write(Write::Complete(outcome, retain), Some(renewal))
        .await;
    if landed == Landed::TakenOver {
        return Err(texts::lease_lost(holder.what));
    }
    match write {
        Write::Complete(Outcome::Ok(value), _) => Ok(value),
        Write::Complete(Outcome::Err(err), _) => Err(err),
        Write::Release | Write::MarkUnknown => {
            unreachable!("the write handed back is the one given")
        }
    }
}

fn poll_interval(wait: Option<Duration>) -> Duration {
    let wait = wait.unwrap_or_default();
    (wait / 20).clamp(Duration::from_millis(5), Duration::from_millis(100))
}

/// A panic's answer; the panic itself is dropped here, unread (see [`texts::panicked`]).
pub(crate) fn panicked(what: &str, part: &str, panic: Panic) -> ToolError {
    drop(panic);
    texts::panicked(what, part)
}
