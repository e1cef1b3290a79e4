//! The transactional path: a keyed call whose body writes in the transaction that holds its
//! key's record (see [`transaction`](crate::store::transaction)). The same judgement of the
//! record found as every keyed call's (replay, `CONFLICT`, `IN_PROGRESS`), the same answers;
//! what differs is that nothing is ever left unknown by this call: its record commits with its
//! writes, or neither does.
//!
//! It runs as the call's work, like the keyed path: a caller that stops waiting leaves the
//! transaction to commit or roll back as one.
// Without a database feature no transactional tool can be declared (a `TxBody` has no value),
// and what runs one is never reached.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[cfg(feature = "postgres")]
use futures_util::FutureExt;

use super::keyed::{conflict, poll_interval, replay};
use super::{Executor, ToolOutput};
use crate::lease::What;
use crate::observe::{self, Happened};
use crate::reservation::{panicked, recordable};
use crate::store::transaction::{TxCall, TxEnded, TxWork};
use crate::store::{Outcome, Record, RecordKey};
use crate::texts::{self, Other};
use crate::tool::{Call, Invocation, TxBody, TxInner};
use crate::{ToolContext, ToolDefinition, ToolError};

/// Runs a transactional call to its end.
pub(super) async fn run(
    exec: Arc<Executor>,
    def: Arc<ToolDefinition>,
    call: Call,
    rkey: Option<RecordKey>,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let def = &*def;
    let settings = &def.settings;
    let (Some(key), Some(fingerprint), Some(rkey), Some(body)) =
        (call.key, call.fingerprint, rkey, call.tx)
    else {
        return Err(texts::keyed_without_key(&def.name));
    };
    let Some(transactions) = exec.transactions.clone() else {
        // The toolbox refuses such a tool when it is built; a definition changed since is a
        // defect.
        return Err(ToolError::internal(format!(
            "`{}` is transactional and its toolbox's store is not a database",
            def.name
        )));
    };
    observe::key(key.as_str());
    let log_key = key.for_logs();
    let tx_call = TxCall {
        rkey: &rkey,
        label: &def.name,
        fingerprint: &fingerprint,
        lease: settings.lease,
        retain: settings.retain,
        wait: settings.wait_in_progress.unwrap_or(Duration::ZERO),
    };
    let deadline = settings
        .wait_in_progress
        .map(|d| tokio::time::Instant::now() + d);
    let invocation = Invocation {
        ctx,
        state: exec.state.clone(),
    };
    let mut work = bind(body, invocation, &def.name);
    loop {
        let Some(ended) = transactions.transact(&tx_call, &mut work).await else {
            return Err(ToolError::internal(format!(
                "`{}` writes to another database than its toolbox's store",
                def.name
            )));
        };
        match ended {
            TxEnded::Committed(outcome) => {
                exec.stats.executed.inc();
                tracing::debug!(tool = %def.name, key = %log_key, "committed");
                return match outcome {
                    Outcome::Ok(value) => Ok(ToolOutput {
                        value,
                        replayed: false,
                    }),
                    Outcome::Err(err) => Err(err),
                };
            }
            TxEnded::Found(record) => {
                if record.fingerprint() != &fingerprint {
                    let other = match record {
                        Record::Completed { .. } => Other::Ran,
                        Record::InProgress { .. } => Other::Running,
                        Record::Stale { .. } => Other::Unknown,
                    };
                    return Err(conflict(&exec, def, &log_key, other));
                }
                match record {
                    Record::Completed { outcome, .. } => {
                        return replay(&exec, def, &log_key, outcome)
                    }
                    // Held by a call of another kind (a tool without a transaction on the same
                    // key): waited for as the keyed path waits.
                    Record::InProgress { since, .. } => {
                        if deadline.is_some_and(|at| tokio::time::Instant::now() < at) {
                            tokio::time::sleep(poll_interval(settings.wait_in_progress)).await;
                            continue;
                        }
                        return Err(in_progress(&exec, def, since));
                    }
                    // Only a call of another kind leaves a record unknown.
                    Record::Stale {
                        since, reported, ..
                    } => {
                        exec.stats.unknown.inc();
                        observe::mark(Happened::Unknown);
                        return Err(texts::outcome_unknown(def.named(), since, reported));
                    }
                }
            }
            TxEnded::Busy => return Err(in_progress(&exec, def, SystemTime::now())),
            TxEnded::RolledBack(err) => {
                exec.stats.executed.inc();
                exec.stats.released.inc();
                let unknown = err.is(crate::ErrorCode::OutcomeUnknown);
                tracing::debug!(tool = %def.name, key = %log_key, code = %err.code(), "rolled back");
                // Rolled back: whatever the body could not tell, nothing of it was kept.
                return Err(match unknown {
                    true => texts::rolled_back(&def.name),
                    false => err,
                });
            }
            TxEnded::Aborted(problem) => {
                exec.stats.executed.inc();
                exec.stats.released.inc();
                tracing::warn!(tool = %def.name, key = %log_key, problem = %problem, "the transaction was rolled back before its commit");
                return Err(texts::rolled_back(&def.name));
            }
            TxEnded::Refused(e) => {
                tracing::warn!(tool = %def.name, key = %log_key, error = %e, "the database refused the transaction; the tool did not run");
                return Err(e.refusal());
            }
            TxEnded::Unsettled(problem) => {
                exec.stats.executed.inc();
                tracing::warn!(tool = %def.name, key = %log_key, problem = %problem, "the commit's answer was lost and the record could not be read");
                return Err(texts::commit_unconfirmed(&def.name));
            }
        }
    }
}

fn in_progress(exec: &Executor, def: &ToolDefinition, since: SystemTime) -> ToolError {
    exec.stats.in_progress.inc();
    observe::mark(Happened::InProgress);
    texts::in_progress(def.named(), since)
}

/// The body with its invocation bound, as the store takes it: a panic caught and a result no
/// replay could read turned into errors that roll the transaction back.
fn bind(body: TxBody, invocation: Invocation, tool: &str) -> TxWork {
    let tool: Arc<str> = tool.into();
    match body.0 {
        #[cfg(feature = "postgres")]
        TxInner::Postgres(body) => TxWork::Postgres(Some(Box::new(move |tx| {
            Box::pin(async move {
                let ran = AssertUnwindSafe(body(invocation, tx)).catch_unwind().await;
                ended(ran, &tool)
            })
        }))),
        #[cfg(feature = "sqlite")]
        TxInner::Sqlite(body) => TxWork::Sqlite(Some(Box::new(move |tx| {
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| body(invocation, tx)));
            ended(ran, &tool)
        }))),
    }
}

fn ended(
    ran: Result<Result<serde_json::Value, ToolError>, crate::lease::Panic>,
    tool: &str,
) -> Result<serde_json::Value, ToolError> {
    match ran {
        Ok(ran) => ran.and_then(|value| recordable(value, What::Tool(tool))),
        Err(panic) => Err(panicked(What::Tool(tool), "body", panic)),
    }
}
