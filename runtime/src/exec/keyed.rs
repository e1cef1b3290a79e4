//! The keyed path: reserve → run the body (renewing its lease) → complete or release; a
//! replay, a `CONFLICT`, an `IN_PROGRESS`, or a stale reservation handed to the recover hook.
//!
//! Everything here runs as the call's work (see [`Executor::run`]): a caller that stops
//! waiting (its timeout, or its future dropped) never cancels it and never releases a key whose
//! work still runs.
//!
//! The retry limit is kept while the call holds the key, so no other process runs the call in
//! between: its failures are read before the tool's code runs (with the reserve, or before a
//! stale reservation is taken over), and a failure is counted before the key is released.

use std::sync::Arc;
use std::time::Duration;

use super::limits::{self, counts_as_failure, Limit, Slot};
use super::{Executor, ToolOutput};
use crate::lease::{Panic, Renewal, What, Write};
use crate::observe::{self, Happened, StoreOp};
use crate::once::{OnceScope, Terms};
use crate::reservation::{panicked, recordable, Claim, Found};
use crate::store::{Outcome, RecordKey, Store, Token};
use crate::texts;
use crate::tool::{Call, Invocation, Recover};
use crate::{ErrorCode, ToolContext, ToolDefinition, ToolError};

/// Runs a keyed call to its end. `tool` is the tool's name as the toolbox
/// shares it (its steps' records are labelled with it); `rkey` its record, in the caller's
/// tenant.
pub(super) async fn run(
    exec: Arc<Executor>,
    def: Arc<ToolDefinition>,
    tool: Arc<str>,
    call: Call,
    rkey: Option<RecordKey>,
    ctx: ToolContext,
    slot: Option<Arc<Slot>>,
) -> Result<ToolOutput, ToolError> {
    let def = &*def;
    let settings = &def.settings;
    let limit = Limit::of(def);
    let call_has_recover = call.recover.is_some();
    let (Some(key), Some(fingerprint), Some(rkey)) = (call.key, call.fingerprint, rkey) else {
        return Err(texts::keyed_without_key(&def.name));
    };
    // A key on the call's place in the run is new at every call: its failures are counted by
    // what the model's retry repeats (the key at a fixed place, and the fingerprint), read once
    // the call holds its own key.
    let by_call = match (limit, call.limit_key) {
        (Some(_), Some(limit_key)) => Some(limits::by_call(&ctx, &limit_key, &fingerprint)),
        _ => None,
    };
    let counted = by_call.as_ref().unwrap_or(&rkey);
    let store = exec.store.clone();
    let recorder = exec.recorder.clone();
    // The scope of the call's steps holds its key, lent from there for logs.
    let terms = Terms {
        lease: settings.lease,
        retain: settings.retain,
        per_call: def.key_follows_step(),
    };
    let scope = Arc::new(
        OnceScope::new(
            tool,
            store.clone(),
            recorder.clone(),
            key,
            fingerprint,
            terms,
        )
        .with_transactions(exec.transactions.clone()),
    );
    let key = scope.key();
    let log_key = key.for_logs();
    observe::key(key.as_str());
    let deadline = settings
        .wait_in_progress
        .map(|d| tokio::time::Instant::now() + d);
    let claim = Claim {
        store: &store,
        recorder: &recorder,
        rkey: &rkey,
        label: &def.name,
        fingerprint: scope.fingerprint(),
        lease: settings.lease,
        what: What::Tool(&def.name),
    };
    let mut recover_hook = call.recover;
    let invocation = || Invocation {
        ctx: ctx.clone().with_call(scope.clone()),
        state: exec.state.clone(),
    };

    // The failures counted before this call ran, once it holds the key (with a limit).
    let mut prior = None;
    // Settle what the key's record says until this call holds the key (or has its answer).
    let (token, mut renewal) = loop {
        let found = match claim.reserve().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(tool = %def.name, key = %log_key, error = %e, "store refused the reservation; the tool did not run");
                return Err(e.refusal());
            }
        };
        match found {
            Found::Reserved { token, failures } => {
                tracing::debug!(tool = %def.name, key = %log_key, "reserved; running");
                if limit.is_some() && by_call.is_none() {
                    prior = Some(failures);
                }
                break (token, None);
            }
            Found::Conflict(other) => return Err(conflict(&exec, def, &log_key, other)),
            Found::Completed(outcome) => return replay(&exec, def, &log_key, outcome),
            Found::InProgress { since } => {
                if deadline.is_some_and(|deadline| tokio::time::Instant::now() < deadline) {
                    tokio::time::sleep(poll_interval(settings.wait_in_progress)).await;
                    continue;
                }
                exec.stats.in_progress.inc();
                observe::mark(Happened::InProgress);
                tracing::debug!(tool = %def.name, key = %log_key, "in progress");
                return Err(texts::in_progress(def.named(), since));
            }
            Found::Stale {
                token,
                since,
                reported,
            } => {
                let Some(recover) = recover_hook.take() else {
                    exec.stats.unknown.inc();
                    observe::mark(Happened::Unknown);
                    tracing::warn!(tool = %def.name, key = %log_key, "stale reservation and no recover hook: outcome unknown");
                    return Err(texts::outcome_unknown(def.named(), since, reported));
                };
                // Boxed: a path this rare would otherwise more than double the size of every
                // call's state, which each call allocates and moves.
                let stale = Stale {
                    exec: &exec,
                    def,
                    claim: &claim,
                    counted,
                    log_key: &log_key,
                    scope: &scope,
                    ctx: &ctx,
                };
                match Box::pin(stale.take_over(token, recover)).await {
                    TakeOver::Answered(answer) => return answer,
                    TakeOver::Beaten(recover) => {
                        recover_hook = Some(recover);
                        continue;
                    }
                    TakeOver::Run {
                        token,
                        renewal,
                        failures,
                    } => {
                        prior = failures;
                        break (token, Some(renewal));
                    }
                }
            }
        }
    };

    let holder = claim.holder(&token);
    if let (Some(_), Some(by_call), None) = (limit, &by_call, prior) {
        match observe::store(StoreOp::Failures, store.failures(by_call)).await {
            Ok(failures) => prior = Some(failures),
            Err(e) => {
                holder.write(Write::Release, renewal).await;
                return Err(e.refusal());
            }
        }
    }
    // A call that failed as often as its limit allows does not run: the key is freed, and the
    // window's end lets the call run again. The count came with the reservation (or was read
    // before a take-over; for a key on the call's place, just now).
    let prior = prior.unwrap_or(0);
    if let Some(limit) = limit.filter(|limit| prior >= limit.failures) {
        exec.stats.retry_limited.inc();
        tracing::warn!(tool = %def.name, key = %log_key, failures = prior, "retry limit reached: the call was refused without running");
        holder.write(Write::Release, renewal).await;
        // Refused before the body, maybe in another process than the attempts: what their
        // steps did is read from the store.
        let kept = steps_kept(&store, counted, None).await;
        return Err(kept.reached(limit, def, prior, None));
    }
    // Under a concurrency limit, wait for a slot with the lease renewed; none in time: BUSY, the
    // key is freed, and the body never runs.
    let permit = match &slot {
        Some(slot) => {
            // The wait may be long: the runtime's renewer renews the lease meanwhile.
            let waiting = claim.keep_renewed(&token, renewal.take());
            match slot.acquire().await {
                Ok(permit) => {
                    renewal = Some(waiting);
                    Some(permit)
                }
                Err(first) => {
                    if first {
                        exec.stats.busy.inc();
                    }
                    holder.write(Write::Release, Some(waiting)).await;
                    return Err(slot.busy(&def.name));
                }
            }
        }
        None => None,
    };

    exec.stats.executed.inc();
    let _running = observe::body_started();
    // The lookup's renewal (after a take-over) holds the lease until the body's own starts.
    let (ran, renewal) = claim
        .drive(&token, renewal, (call.body)(invocation()))
        .await;
    drop(permit);
    // A result no replay could read back is an unknown outcome, as one that does not serialize.
    let ran = ran.map(|ended| ended.and_then(|value| recordable(value, claim.what)));
    // A failure is counted before the key is freed: the next call reads the count.
    let reached = match limit.filter(|_| invites_retry(&ran, call_has_recover)) {
        Some(limit) => {
            let steps = !scope.steps_finished().is_empty();
            count_failure(&store, counted, limit, def, steps).await
        }
        None => None,
    };
    let kept = match reached {
        Some(_) => steps_kept(&store, counted, Some(&*scope)).await,
        None => Kept::Nothing,
    };
    if let Ok(Err(err)) = &ran {
        // An unknown outcome is kept whatever a step met: the body may have acted past it, and
        // a released key would let a retry act again.
        let unknown = err.is(ErrorCode::OutcomeUnknown);
        if scope.parent_must_be_released() && !unknown {
            // A step met another action's record, or a step still running elsewhere: recording
            // this answer as the call's outcome would block the call that owns those steps.
            exec.stats.released.inc();
            holder.write(Write::Release, Some(renewal)).await;
            let answer = stop_if_reached(&exec, def, limit, reached, err.clone(), false, &kept);
            return Err(after_steps(def, &scope, answer));
        }
    }
    let value = holder
        .settle(settings.retain, ran, renewal, Some(&exec.stats))
        .await
        .map_err(|err| texts::looked_up_on_retry(err, call_has_recover, def.key_follows_step()))
        .map_err(|err| {
            // An unknown outcome is kept as the key's record: the body may have acted.
            let unknown = err.is(ErrorCode::OutcomeUnknown);
            stop_if_reached(&exec, def, limit, reached, err, unknown, &kept)
        })
        .map_err(|err| after_steps(def, &scope, err))?;
    let steps = prior > 0 && !scope.steps_finished().is_empty();
    clear_failures(&store, counted, Some(prior), def, steps).await;
    Ok(ToolOutput {
        value,
        replayed: false,
    })
}

/// How taking over a stale reservation ended.
enum TakeOver {
    /// The call is answered: the recover hook found its outcome, or could not look.
    Answered(Result<ToolOutput, ToolError>),
    /// Another caller took the reservation over first: the hook is handed back, and the key's
    /// record read again.
    Beaten(Recover),
    /// The hook found no effect: the body runs under `token`, its lease renewed by `renewal`;
    /// `failures` were counted before (with a retry limit).
    Run {
        token: Token,
        renewal: Renewal,
        failures: Option<u64>,
    },
}

/// A keyed call that met a stale reservation of its key, with a recover hook to ask.
struct Stale<'a> {
    exec: &'a Arc<Executor>,
    def: &'a ToolDefinition,
    /// The call's claim on its key.
    claim: &'a Claim<'a>,
    /// Where the call's failures are counted: `rkey`, or the call's place-free record.
    counted: &'a RecordKey,
    log_key: &'a crate::key::LogHash<'a>,
    scope: &'a Arc<OnceScope>,
    ctx: &'a ToolContext,
}

impl Stale<'_> {
    /// Takes over the reservation held by `stale` and asks `recover` whether the earlier call
    /// acted: its finding is recorded as the outcome; nothing found, the body runs.
    async fn take_over(self, stale: Token, recover: Recover) -> TakeOver {
        let Stale {
            exec,
            def,
            claim,
            counted,
            log_key,
            scope,
            ctx,
        } = self;
        let store = &exec.store;
        let (settings, limit) = (&def.settings, Limit::of(def));
        let what = claim.what;
        // Checked before taking the record over, which leaves it as it is when refused.
        let failures = match limit {
            Some(limit) => {
                let failures =
                    match observe::store(StoreOp::Failures, store.failures(counted)).await {
                        Ok(failures) => failures,
                        Err(e) => return TakeOver::Answered(Err(e.refusal())),
                    };
                if failures >= limit.failures {
                    exec.stats.retry_limited.inc();
                    tracing::warn!(tool = %def.name, key = %log_key, failures, "retry limit reached: the call was refused without running");
                    // The record is unknown: an earlier attempt may have acted.
                    let refused = limit.reached_unknown(def, failures, None);
                    return TakeOver::Answered(Err(refused));
                }
                Some(failures)
            }
            None => None,
        };
        let token = match claim.take_over(&stale).await {
            Ok(Some(token)) => token,
            // Another caller took it over first.
            Ok(None) => return TakeOver::Beaten(recover),
            Err(e) => return TakeOver::Answered(Err(e.refusal())),
        };
        tracing::info!(tool = %def.name, key = %log_key, "took over a stale reservation; asking the recover hook");
        exec.stats.recovered.inc();
        let invocation = Invocation {
            ctx: ctx.clone().with_call(scope.clone()),
            state: exec.state.clone(),
        };
        let (looked, renewal) = claim.drive(&token, None, recover(invocation)).await;
        let holder = claim.holder(&token);
        let looked = looked
            .map(|ended| ended.and_then(|found| found.map(|v| recordable(v, what)).transpose()));
        let answer = match looked {
            Ok(Ok(Some(found))) => {
                let found = holder
                    .record(Outcome::Ok(found), settings.retain, renewal)
                    .await;
                if found.is_ok() {
                    clear_failures(store, counted, failures, def, false).await;
                }
                found.map(|value| ToolOutput {
                    value,
                    replayed: true,
                })
            }
            // Not found: safe to act, under the token just taken over; steps an earlier
            // attempt left unknown may run again, since none of their effects exists.
            Ok(Ok(None)) => {
                scope.recovered_not_found();
                return TakeOver::Run {
                    token,
                    renewal,
                    failures,
                };
            }
            Ok(Err(err)) => {
                // The lookup failed: the outcome is as unknown as before. Never release
                // here, or the next call would act without looking.
                let reached = match limit.filter(|_| counts_as_failure(&err)) {
                    Some(limit) => count_failure(store, counted, limit, def, false).await,
                    None => None,
                };
                let answer = holder.keep_unknown(renewal, err).await;
                Err(stop_if_reached(
                    exec,
                    def,
                    limit,
                    reached,
                    answer,
                    true,
                    &Kept::Nothing,
                ))
            }
            Err(panic) => {
                let answer = panicked(what, "recover hook", panic);
                Err(holder.keep_unknown(renewal, answer).await)
            }
        };
        TakeOver::Answered(answer)
    }
}

/// The answer to a call of `def`'s tool with `fingerprint` whose key holds a completed record
/// made with `held` and ended in `outcome`, read from memory without a round trip
/// ([`Store::completed_here`]): its replay, or `CONFLICT` when the record was made with other
/// arguments. Answered in the caller's task: no body runs.
pub(super) fn answer_completed(
    exec: &Executor,
    def: &ToolDefinition,
    key: &crate::IdempotencyKey,
    fingerprint: &crate::Fingerprint,
    held: &crate::Fingerprint,
    outcome: Outcome,
) -> Result<ToolOutput, ToolError> {
    observe::key(key.as_str());
    let log_key = key.for_logs();
    if held != fingerprint {
        return Err(conflict(exec, def, &log_key, texts::Other::Ran));
    }
    replay(exec, def, &log_key, outcome)
}

/// `err`, or, for a tool keyed on its place in the run a step of which acted (or may have) in
/// this call, `err` no longer inviting a retry: the model's retry is a new call with a key of
/// its own, which would do that step again.
fn after_steps(def: &ToolDefinition, scope: &OnceScope, err: ToolError) -> ToolError {
    if err.is_retryable() && def.key_follows_step() && scope.a_step_acted() {
        texts::steps_done_per_call(err)
    } else {
        err
    }
}

/// `CONFLICT`: the key's record was made by a call with other arguments, which `other` says
/// ran, runs, or left its outcome unknown.
pub(super) fn conflict(
    exec: &Executor,
    def: &ToolDefinition,
    log_key: &dyn std::fmt::Display,
    other: texts::Other,
) -> ToolError {
    exec.stats.conflicts.inc();
    observe::mark(Happened::Conflict);
    tracing::info!(tool = %def.name, key = %log_key, "conflict: same key, other arguments");
    texts::conflict(def.named(), other)
}

/// The recorded outcome, replayed.
pub(super) fn replay(
    exec: &Executor,
    def: &ToolDefinition,
    log_key: &dyn std::fmt::Display,
    outcome: Outcome,
) -> Result<ToolOutput, ToolError> {
    exec.stats.replayed.inc();
    observe::mark(Happened::Replayed);
    tracing::debug!(tool = %def.name, key = %log_key, "replayed");
    match outcome {
        Outcome::Ok(value) => Ok(ToolOutput {
            value,
            replayed: true,
        }),
        Outcome::Err(err) => Err(err),
    }
}

/// True when the body's ending, as the caller will be answered, invites a retry: a retryable
/// error, or an unknown outcome (a panic too) that a recover hook will look up.
fn invites_retry(ran: &Result<Result<serde_json::Value, ToolError>, Panic>, recover: bool) -> bool {
    match ran {
        Ok(Ok(_)) => false,
        Ok(Err(err)) if err.is(ErrorCode::OutcomeUnknown) => recover || err.is_retryable(),
        Ok(Err(err)) => counts_as_failure(err),
        Err(_) => recover,
    }
}

/// Counts a failure of `rkey`; the count when it reached `limit`. A store that does not take
/// the count is logged and the call answered as it ended: the limit never turns an outage into
/// refusals. `steps`: a step of the call finished, which is noted first beside the count, so
/// that a refusal made anywhere later can say that part of the action was done; a failure whose
/// note the store did not take is not counted, so that no refusal is silent about it.
async fn count_failure(
    store: &Arc<dyn Store>,
    rkey: &RecordKey,
    limit: Limit,
    def: &ToolDefinition,
    steps: bool,
) -> Option<u64> {
    if steps {
        // Kept as long as the step's record, whose effect it speaks of: a window of the count's
        // could end before a later window's refusals, and leave them silent.
        let keep = def.settings.retain.max(limit.window);
        let mark = limits::steps_mark(rkey);
        let noted = store.count_failure(&mark, keep);
        if let Err(e) = observe::store(StoreOp::CountFailure, noted).await {
            tracing::warn!(tool = %def.name, key = %crate::key::log_hash(&rkey.key), error = %e, "could not note for the retry limit that a step finished; the failure is not counted");
            return None;
        }
    }
    let count = store.count_failure(rkey, limit.window);
    match observe::store(StoreOp::CountFailure, count).await {
        Ok(failures) => (failures >= limit.failures).then_some(failures),
        Err(e) => {
            tracing::warn!(tool = %def.name, key = %crate::key::log_hash(&rkey.key), error = %e, "could not count a failure for the retry limit");
            None
        }
    }
}

/// `err`, or `RETRY_LIMIT` in its place when this failure reached the limit. `unknown`: the
/// key's record is kept unknown (the call may have acted), which the answer keeps saying;
/// otherwise it says what `kept` knows of the steps that finished.
fn stop_if_reached(
    exec: &Executor,
    def: &ToolDefinition,
    limit: Option<Limit>,
    reached: Option<u64>,
    err: ToolError,
    unknown: bool,
    kept: &Kept,
) -> ToolError {
    match (limit, reached) {
        (Some(limit), Some(failures)) if err.is_retryable() => {
            tracing::warn!(tool = %def.name, failures, code = %err.code(), "retry limit reached: the model is told to stop");
            exec.stats.retry_limited.inc();
            match unknown {
                true => limit.reached_unknown(def, failures, Some(err.code())),
                false => kept.reached(limit, def, failures, Some(err.code())),
            }
        }
        _ => err,
    }
}

/// What is known, when a call's retry limit stops it, of the steps it finished before: what
/// they did is kept, and the answer must say so.
enum Kept {
    /// No step finished.
    Nothing,
    /// These steps of this very call finished.
    Named(Vec<Box<str>>),
    /// A step of an earlier attempt finished (the store noted it beside the count).
    Earlier,
    /// The store could not say.
    Maybe,
}

impl Kept {
    /// `RETRY_LIMIT` for a call of `def`'s tool after `failures`, saying what was kept.
    fn reached(
        &self,
        limit: Limit,
        def: &ToolDefinition,
        failures: u64,
        last: Option<&str>,
    ) -> ToolError {
        let steps = match self {
            Kept::Nothing => return limit.reached(def, failures, last),
            Kept::Named(names) => texts::StepsKept::Named(names),
            Kept::Earlier => texts::StepsKept::Some,
            Kept::Maybe => texts::StepsKept::Maybe,
        };
        texts::retry_limit_after_steps(def.named(), failures, limit.window, last, steps)
    }
}

/// The steps finished before a call of `counted` was stopped by its retry limit: this call's
/// (in `scope`), else any an earlier attempt noted in the store.
async fn steps_kept(
    store: &Arc<dyn Store>,
    counted: &RecordKey,
    scope: Option<&OnceScope>,
) -> Kept {
    if let Some(names) = scope.map(|scope| scope.steps_finished().clone()) {
        if !names.is_empty() {
            return Kept::Named(names);
        }
    }
    let mark = limits::steps_mark(counted);
    match observe::store(StoreOp::Failures, store.failures(&mark)).await {
        Ok(0) => Kept::Nothing,
        Ok(_) => Kept::Earlier,
        Err(_) => Kept::Maybe,
    }
}

/// After a success, forgets the failures counted before it (when there were any), and the note
/// that a step had finished when `steps` (a step of the call finished, so one may have been
/// noted): the call's record says what was done from now on.
async fn clear_failures(
    store: &Arc<dyn Store>,
    rkey: &RecordKey,
    prior: Option<u64>,
    def: &ToolDefinition,
    steps: bool,
) {
    if prior.unwrap_or(0) == 0 {
        return;
    }
    if let Err(e) = observe::store(StoreOp::ClearFailures, store.clear_failures(rkey)).await {
        tracing::warn!(tool = %def.name, key = %crate::key::log_hash(&rkey.key), error = %e, "could not clear the failures counted for the retry limit; they end with their window");
    }
    if steps {
        let mark = limits::steps_mark(rkey);
        let _ = observe::store(StoreOp::ClearFailures, store.clear_failures(&mark)).await;
    }
}

pub(super) fn poll_interval(wait: Option<Duration>) -> Duration {
    let wait = wait.unwrap_or_default();
    (wait / 20).clamp(Duration::from_millis(5), Duration::from_millis(100))
}
