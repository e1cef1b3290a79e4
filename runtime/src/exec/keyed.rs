//! The keyed path: reserve → run the body (renewing its lease) → complete or release; a
//! replay, a `CONFLICT`, an `IN_PROGRESS`, or a stale reservation handed to the recover hook.
//!
//! Everything here runs inside the call's own task (see [`Executor::run`]): a caller that stops
//! waiting (its timeout, or its future dropped) never cancels the work and never releases a key
//! whose work still runs.

use std::sync::Arc;
use std::time::Duration;

use super::{Executor, ToolOutput};
use crate::lease::{drive, panicked, record_outcome, settle, unreserve, Holder, What, Write};
use crate::once::OnceScope;
use crate::store::{Outcome, Record, RecordKey, Reservation, StoreError, Token};
use crate::texts;
use crate::tool::{Call, Invocation};
use crate::{ToolContext, ToolDefinition, ToolError};

/// Runs a keyed call to its end, inside its own task.
pub(super) async fn run(
    exec: Arc<Executor>,
    def: Arc<ToolDefinition>,
    call: Call,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let def = &*def;
    let settings = &def.settings;
    let call_has_recover = call.recover.is_some();
    let (Some(key), Some(fingerprint)) = (call.key, call.fingerprint) else {
        return Err(texts::keyed_without_key(&def.name));
    };
    let store = exec.store.clone();
    let rkey = RecordKey::new(ctx.scope(), key.as_str());
    let log_key = key.for_logs();
    let deadline = settings
        .wait_in_progress
        .map(|d| tokio::time::Instant::now() + d);
    let recorder = exec.recorder.clone();
    let what = What::Tool(&def.name);
    let scope = Arc::new(OnceScope::new(
        Arc::from(def.name.as_str()),
        store.clone(),
        recorder.clone(),
        key.clone(),
        fingerprint,
        settings.lease,
        settings.retain,
    ));
    let mut recover_hook = call.recover;
    let invocation = || Invocation {
        ctx: ctx.clone().with_call(scope.clone()),
        state: exec.state.clone(),
    };

    // Settle what the key's record says until this call holds the key (or has its answer).
    let (token, renewal) = loop {
        let token = Token::generate();
        let reservation = match store
            .reserve(&rkey, &def.name, &fingerprint, &token, settings.lease)
            .await
        {
            Ok(reservation) => reservation,
            Err(e) => {
                tracing::warn!(tool = %def.name, key = %log_key, error = %e, "store refused the reservation; the tool did not run");
                // The reserve may have been applied with its reply lost: free it under the
                // token this call drew, so "nothing was done" holds and the key stays usable.
                unreserve(&recorder, &store, &rkey, &token, what).await;
                return Err(e.refusal());
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
            exec.stats.conflicts.inc();
            tracing::info!(tool = %def.name, key = %log_key, "conflict: same key, other arguments");
            return Err(texts::conflict(
                def.named(),
                matches!(record, Record::Completed { .. }),
            ));
        }
        match record {
            Record::Completed { outcome, .. } => {
                exec.stats.replayed.inc();
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
                exec.stats.in_progress.inc();
                tracing::debug!(tool = %def.name, key = %log_key, "in progress");
                return Err(texts::in_progress(def.named(), since));
            }
            Record::Stale {
                token,
                since,
                reported,
                ..
            } => {
                let Some(recover) = recover_hook.take() else {
                    exec.stats.unknown.inc();
                    tracing::warn!(tool = %def.name, key = %log_key, "stale reservation and no recover hook: outcome unknown");
                    return Err(texts::outcome_unknown(def.named(), since, reported));
                };
                let Some(token) = store
                    .take_over(&rkey, &token, settings.lease)
                    .await
                    .map_err(StoreError::refusal)?
                else {
                    // Another caller took it over first; ask again what the record says now.
                    recover_hook = Some(recover);
                    continue;
                };
                tracing::info!(tool = %def.name, key = %log_key, "took over a stale reservation; asking the recover hook");
                exec.stats.recovered.inc();
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
                    what,
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
                        scope.recovered_not_found();
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
                        return Err(panicked(what, "recover hook", panic));
                    }
                }
            }
        }
    };

    exec.stats.executed.inc();
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
        what,
    };
    if let Ok(Err(err)) = &ran {
        if scope.parent_must_be_released() {
            // A step met another action's record, or a step still running elsewhere: recording
            // this answer as the call's outcome would block the call that owns those steps.
            exec.stats.released.inc();
            holder.write(Write::Release, Some(renewal)).await;
            return Err(err.clone());
        }
    }
    let value = settle(&holder, settings.retain, ran, renewal, Some(&exec.stats))
        .await
        .map_err(|err| texts::looked_up_on_retry(err, call_has_recover))?;
    Ok(ToolOutput {
        value,
        replayed: false,
    })
}

fn poll_interval(wait: Option<Duration>) -> Duration {
    let wait = wait.unwrap_or_default();
    (wait / 20).clamp(Duration::from_millis(5), Duration::from_millis(100))
}
