//! `ctx.once` steps: each step of a multi-step tool keyed under its parent call's key, bound to
//! the parent's fingerprint, and held like the call itself (see [`lease`](crate::lease)).
//!
//! A keyed call hands its context a [`OnceScope`]; the context's `once` runs a step through it.
//! Nothing here knows the executor or the toolbox: a scope is the parent's store, key,
//! fingerprint and settings, and two flags the parent reads when its body ends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use crate::lease::{Recorder, What};
use crate::observe::{self, Happened};
use crate::reservation::{recordable, Claim, Found};
use crate::store::{Outcome, RecordKey, Store, StoreError};
use crate::{texts, Fingerprint, IdempotencyKey, ToolError};

// Steps whose writes commit with their record.
mod transactional;

/// How a call's steps are held: leased and retained as the call is.
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    pub(crate) retain: Duration,
    /// The call is keyed on its place in the run (`<ctx.step>`).
    pub(crate) per_call: bool,
}

/// What a keyed call gives its context for `ctx.once` steps: the store, and the parent call's
/// key and fingerprint, to which every step is bound.
pub(crate) struct OnceScope {
    /// The parent's tool name: it labels each step's record for operators (`tool/step`).
    tool: Arc<str>,
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
    /// The parent is keyed on its place in the run (`<ctx.step>`): a new call would not replay
    /// the steps that finished, and the steps' answers must not say it would.
    per_call: bool,
    /// The names of the steps this call has used (running, or ended): a name used again is
    /// refused, since its step would otherwise be skipped and answered with the first one's
    /// result or error. A step that failed retryably recorded nothing: its name is given back,
    /// and it may be tried again. A list, not a set: a call has few steps, and a set would draw
    /// its hasher's random keys on every keyed call, steps or not.
    used: Mutex<Vec<Box<str>>>,
    /// Set once a step of this call acted or may have (it ran, or replayed an earlier run): a
    /// new call would not find it.
    acted: AtomicBool,
    /// The steps of this call that finished with a result, now or in an earlier attempt: what
    /// they did is kept whatever the call's end, and a retry limit's answer says so.
    finished: Mutex<Vec<Box<str>>>,
    /// The store's database, for transactional steps; `None` when the store is not one.
    transactions: Option<crate::store::transaction::Transactions>,
}

impl OnceScope {
    /// The scope of one keyed call of tool `tool` (its name as the toolbox shares it), holding
    /// `key` with `fingerprint`; its steps are held on `terms`.
    pub(crate) fn new(
        tool: Arc<str>,
        store: Arc<dyn Store>,
        recorder: Arc<Recorder>,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        terms: Terms,
    ) -> OnceScope {
        OnceScope {
            tool,
            store,
            recorder,
            key,
            fingerprint,
            lease: terms.lease,
            retain: terms.retain,
            recovered_not_found: AtomicBool::new(false),
            release_parent: AtomicBool::new(false),
            per_call: terms.per_call,
            used: Mutex::default(),
            acted: AtomicBool::new(false),
            finished: Mutex::default(),
            transactions: None,
        }
    }

    /// Runs transactional steps in `transactions`, the database of the store.
    pub(crate) fn with_transactions(
        mut self,
        transactions: Option<crate::store::transaction::Transactions>,
    ) -> OnceScope {
        self.transactions = transactions;
        self
    }

    /// The parent call's key.
    pub(crate) fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The parent call's fingerprint, to which its key and every step are bound.
    pub(crate) fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The parent's recover hook found no effect of the call: steps it left unknown may run.
    pub(crate) fn recovered_not_found(&self) {
        self.recovered_not_found.store(true, Ordering::SeqCst);
    }

    /// True when a step met a record the parent must not be recorded over.
    pub(crate) fn parent_must_be_released(&self) -> bool {
        self.release_parent.load(Ordering::SeqCst)
    }

    /// Runs step `step` of the parent call for `tenant` at most once (see
    /// [`ToolContext::once`](crate::ToolContext::once)).
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
        if !valid_step_name(step) {
            return Err(texts::bad_step_name(step));
        }
        if !self.take_name(step) {
            tracing::error!(tool = %self.tool, step, "a step name was used twice in one call: refused");
            // A defect of the tool's code, not an outcome: the key is freed, so that once the
            // code is fixed the call can finish (its finished steps replay).
            self.release_parent.store(true, Ordering::SeqCst);
            return Err(texts::step_reused(step));
        }
        let key = self.key.step_key(step);
        let observed = observe::Step::start(step, key.as_str());
        let span = observed.span().clone();
        let result = self
            .step(&observed, tenant, step, &key, work)
            .instrument(span)
            .await;
        observed.finish(&result);
        if result.as_ref().is_err_and(ToolError::is_retryable) {
            self.used().retain(|name| **name != *step);
        }
        result
    }

    fn used(&self) -> std::sync::MutexGuard<'_, Vec<Box<str>>> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `step` for this call; false when the call already used it.
    fn take_name(&self, step: &str) -> bool {
        let mut used = self.used();
        if used.iter().any(|name| **name == *step) {
            return false;
        }
        used.push(step.into());
        true
    }

    /// True when a step of this call acted or may have: it ran, or replayed an earlier run.
    pub(crate) fn a_step_acted(&self) -> bool {
        self.acted.load(Ordering::SeqCst)
    }

    /// The steps of this call that finished with a result (now, or in an earlier attempt).
    pub(crate) fn steps_finished(&self) -> std::sync::MutexGuard<'_, Vec<Box<str>>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finished(&self, step: &str) {
        self.steps_finished().push(step.into());
    }

    async fn step<T, E, F>(
        &self,
        observed: &observe::Step,
        tenant: &str,
        step: &str,
        key: &IdempotencyKey,
        work: F,
    ) -> Result<T, ToolError>
    where
        F: Future<Output = Result<T, E>> + Send,
        T: Serialize + DeserializeOwned,
        E: Into<ToolError>,
    {
        let rkey = RecordKey::new(tenant, key.as_str());
        let label = format!("{}/{step}", self.tool);
        let claim = Claim {
            store: &self.store,
            recorder: &self.recorder,
            rkey: &rkey,
            label: &label,
            fingerprint: &self.fingerprint,
            lease: self.lease,
            what: What::Step {
                step,
                key: key.as_str(),
            },
        };
        let refused = |e: StoreError| e.step_refusal(step, self.per_call);
        // A step waits for no other and asks no recover hook: what the parent's hook found
        // decides whether a stale step may run again.
        let token = loop {
            let value = match claim.reserve().await.map_err(refused)? {
                Found::Reserved { token, .. } => {
                    self.acted.store(true, Ordering::SeqCst);
                    break token;
                }
                Found::Conflict(_) => {
                    self.release_parent.store(true, Ordering::SeqCst);
                    observed.mark(Happened::Conflict);
                    return Err(texts::step_conflict(step, self.per_call));
                }
                Found::Completed(outcome) => {
                    observed.mark(Happened::Replayed);
                    self.acted.store(true, Ordering::SeqCst);
                    match outcome {
                        Outcome::Ok(value) => {
                            self.finished(step);
                            value
                        }
                        Outcome::Err(err) => return Err(err),
                    }
                }
                Found::InProgress { .. } => {
                    self.release_parent.store(true, Ordering::SeqCst);
                    observed.mark(Happened::InProgress);
                    return Err(texts::step_in_progress(step, self.per_call));
                }
                Found::Stale { token, .. } if self.recovered_not_found.load(Ordering::SeqCst) => {
                    match claim.take_over(&token).await.map_err(refused)? {
                        Some(token) => {
                            self.acted.store(true, Ordering::SeqCst);
                            break token;
                        }
                        // Another caller took it first: read the record again.
                        None => continue,
                    }
                }
                Found::Stale { .. } => {
                    observed.mark(Happened::Unknown);
                    return Err(texts::step_unknown(step));
                }
            };
            return self.read_back(step, value);
        };
        observed.mark(Happened::Executed);
        let what = claim.what;
        let recorded = async {
            let value = work.await.map_err(Into::into)?;
            // The step acted: a result that cannot be recorded makes its outcome unknown, never
            // a failure, or a retry would act again.
            let value = serde_json::to_value(&value)
                .map_err(|e| texts::step_unrecordable(step, &e.to_string()))?;
            let value = recordable(value, what)?;
            // Nor a result that would not read back into its type (a field serde skips when
            // writing and requires when reading, a NaN written as `null`): the step hands back
            // what a replay would, and a replay could not. (Read once its depth is known to be
            // bounded.)
            if let Err(e) = T::deserialize(&value) {
                return Err(texts::step_unrecordable(step, &e.to_string()));
            }
            Ok(value)
        };
        let (ran, renewal) = claim.drive(&token, None, recorded).await;
        let holder = claim.holder(&token);
        let value = holder.settle(self.retain, ran, renewal, None).await?;
        self.finished(step);
        self.read_back(step, value)
    }

    /// A step's recorded result, read into its type. One that no longer fits (the step's type
    /// changed since it ran) is refused, and the parent's key released rather than recorded
    /// with that failure: the step did its work, and the call can finish once the code reads
    /// its result again.
    pub(crate) fn read_back<T: DeserializeOwned>(
        &self,
        step: &str,
        value: Value,
    ) -> Result<T, ToolError> {
        serde_json::from_value(value).map_err(|e| {
            self.release_parent.store(true, Ordering::SeqCst);
            texts::step_result_unfit(step, &e.to_string())
        })
    }
}

/// 1 to 64 ASCII letters, digits, `-`, `_` or `.`: a step name becomes part of a record key.
fn valid_step_name(step: &str) -> bool {
    !step.is_empty()
        && step.len() <= 64
        && step
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
