//! Transactional steps: a `ctx.once` step whose writes to the store's database commit in one
//! transaction with the step's record (see [`transaction`](crate::store::transaction)), so a
//! step that writes a row never leaves its outcome unknown, whatever the call does after it.
// Without a database feature no transactional tool can be declared (a `TxBody` has no value),
// and what runs one is never reached.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::{valid_step_name, OnceScope};
use crate::observe::{self, Happened};
use crate::store::transaction::{TxCall, TxEnded, TxWork};
use crate::store::{Outcome, Record, RecordKey};
use crate::{texts, ToolError};

impl OnceScope {
    /// Runs the transactional step `step` of the parent call for `tenant` at most once: its
    /// result, recorded as JSON, or the error it ended in. Nothing is ever left unknown by the
    /// step itself: its writes and its record commit together, or neither does.
    pub(crate) async fn run_tx_step(
        &self,
        tenant: &str,
        step: &str,
        mut work: TxWork,
    ) -> Result<Value, ToolError> {
        if !valid_step_name(step) {
            return Err(texts::bad_step_name(step));
        }
        let database = work.database();
        let Some(transactions) = &self.transactions else {
            return Err(ToolError::internal(format!(
                "step `{step}` writes in a {database} transaction, and the toolbox's store is not a {database} store given with .store(..)"
            )));
        };
        if !self.take_name(step) {
            tracing::error!(tool = %self.tool, step, "a step name was used twice in one call: refused");
            self.release_parent.store(true, Ordering::SeqCst);
            return Err(texts::step_reused(step));
        }
        let key = self.key.step_key(step);
        let observed = observe::Step::start(step, key.as_str());
        let rkey = RecordKey::new(tenant, key.as_str());
        let label = format!("{}/{step}", self.tool);
        let call = TxCall {
            rkey: &rkey,
            label: &label,
            fingerprint: &self.fingerprint,
            lease: self.lease,
            retain: self.retain,
            // A step waits for no other: it is told the step is running.
            wait: std::time::Duration::ZERO,
        };
        let result = match transactions.transact(&call, &mut work).await {
            None => Err(ToolError::internal(format!(
                "step `{step}` writes in a {database} transaction, and the toolbox's store is not a {database} store"
            ))),
            Some(ended) => self.ended(&observed, step, ended),
        };
        observed.finish(&result);
        if result.as_ref().is_err_and(ToolError::is_retryable) {
            self.used().retain(|name| **name != *step);
        }
        result
    }

    fn ended(
        &self,
        observed: &observe::Step,
        step: &str,
        ended: TxEnded,
    ) -> Result<Value, ToolError> {
        let acted = || self.acted.store(true, Ordering::SeqCst);
        match ended {
            TxEnded::Committed(outcome) => {
                observed.mark(Happened::Executed);
                acted();
                match outcome {
                    Outcome::Ok(value) => {
                        self.finished(step);
                        Ok(value)
                    }
                    Outcome::Err(err) => Err(err),
                }
            }
            TxEnded::Found(record) if record.fingerprint() != &self.fingerprint => {
                self.release_parent.store(true, Ordering::SeqCst);
                observed.mark(Happened::Conflict);
                Err(texts::step_conflict(step, self.per_call))
            }
            TxEnded::Found(Record::Completed { outcome, .. }) => {
                observed.mark(Happened::Replayed);
                acted();
                match outcome {
                    Outcome::Ok(value) => {
                        self.finished(step);
                        Ok(value)
                    }
                    Outcome::Err(err) => Err(err),
                }
            }
            TxEnded::Found(Record::InProgress { .. }) | TxEnded::Busy => {
                self.release_parent.store(true, Ordering::SeqCst);
                observed.mark(Happened::InProgress);
                Err(texts::step_in_progress(step, self.per_call))
            }
            // Only a step of another kind under this name leaves its record unknown.
            TxEnded::Found(Record::Stale { .. }) => {
                observed.mark(Happened::Unknown);
                Err(texts::step_unknown(step))
            }
            TxEnded::RolledBack(err) if err.is(crate::ErrorCode::OutcomeUnknown) => {
                Err(texts::step_rolled_back(step))
            }
            TxEnded::RolledBack(err) => Err(err),
            TxEnded::Aborted(problem) => {
                tracing::warn!(tool = %self.tool, step, problem = %problem, "the step's transaction was rolled back before its commit");
                Err(texts::step_rolled_back(step))
            }
            TxEnded::Refused(e) => Err(e.step_refusal(step, self.per_call)),
            TxEnded::Unsettled(problem) => {
                tracing::warn!(tool = %self.tool, step, problem = %problem, "the step's commit answer was lost and its record could not be read");
                Err(texts::step_commit_unconfirmed(step))
            }
        }
    }
}
