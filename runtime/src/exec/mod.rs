//! The executor: runs one call of a tool, whatever its story, given the tool's definition and
//! prepared call, a store, the shared state and the caller's context.
//!
//! A caller that stops waiting (the tool's `timeout`, or its future dropped) never cancels a
//! call that may change something. A call with a `timeout` runs in a task of its own, so that
//! its caller can be answered `TIMEOUT` on time even while the body keeps its thread. A call
//! without one starts in its caller's task: if its work ends without waiting (a store in
//! memory, a body that does not wait), it is answered there, sparing a task and the hand-off
//! between threads; at its first wait it moves to a task of its own, which runs to its end
//! whether or not the caller still polls or waits. Two kinds of call are answered in the
//! caller's task and never moved, since neither has work to protect: a `read_only` call without
//! a timeout (dropping it cancels a read), and a keyed call whose completed record the store
//! holds in this process's memory (a replay or `CONFLICT`, no body runs).
//!
//! A keyed (`idempotent`) call takes [the keyed path](keyed): reserve → run → complete or
//! release, with replays, conflicts and stale reservations settled first. Every other call runs
//! its body, once approved if it is `unkeyed`. The executor also answers status companions from
//! the store, and counts what it did.
//!
//! Before a body runs, the call meets its tool's [limits](limits): a call that failed as often
//! as its retry limit allows within the window is answered `RETRY_LIMIT` without running, and a
//! body beyond its tool's concurrency limit waits for a slot within the call's timeout, or the
//! call is answered `BUSY`.
//!
//! It knows nothing of tool registries: [`Toolbox`](crate::Toolbox) looks a call up and hands it
//! here.

mod keyed;
mod limits;
#[cfg(test)]
mod tests;
mod transactional;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::approval::{Bound, Gate};
use crate::context::StateMap;
use crate::lease::{Recorder, ShutdownReport, What};
use crate::observe::{self, Observed, ToolTelemetry};
use crate::reservation::panicked;
use crate::stats::{Counters, Stats};
use crate::store::{Record, RecordKey, RecordKeyRef, Store, StoreError};
use crate::story::Story;
use crate::texts;
use crate::tool::{Call, Invocation, Tool, ToolDefinition};
use crate::{ToolContext, ToolError};
use async_trait::async_trait;
use futures_util::FutureExt;
pub(crate) use limits::steps_mark;
use limits::{Limit, Limits, Slot, Tally};
use serde_json::Value;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// What a successful call returns.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolOutput {
    /// The tool's result as JSON.
    pub value: Value,
    /// True when this is the recorded result of an earlier call, not a new execution.
    pub replayed: bool,
}

/// The answer to a call of `tool` whose task ended without one: a panic past the body's own
/// catch (the work may have been done, and not recorded), or a runtime shutting down.
fn task_ended(tool: &str, ended: tokio::task::JoinError) -> ToolError {
    match ended.try_into_panic() {
        Ok(panic) => panicked(What::Tool(tool), "call", panic),
        Err(ended) => texts::task_failed(tool, &ended.to_string()),
    }
}

/// Decides whether an `unkeyed` tool may run. Every toolbox holding an `unkeyed` tool needs one.
///
/// A closure `Fn(&ApprovalRequest) -> bool` is an approver; implement the trait for one that
/// asks a person.
#[async_trait]
pub trait Approver: Send + Sync + 'static {
    /// True to let the call run.
    async fn approve(&self, request: &ApprovalRequest<'_>) -> bool;
}

#[async_trait]
impl<F> Approver for F
where
    F: Fn(&ApprovalRequest<'_>) -> bool + Send + Sync + 'static,
{
    async fn approve(&self, request: &ApprovalRequest<'_>) -> bool {
        self(request)
    }
}

/// One call of an `unkeyed` tool, waiting for approval.
#[derive(Debug)]
#[non_exhaustive]
pub struct ApprovalRequest<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The arguments, as the model sent them (already valid).
    pub arguments: &'a Value,
    /// The caller's context.
    pub context: &'a ToolContext,
}

/// Runs calls: what one toolbox's calls share (store, state, approver, counters, the tasks of
/// bodies still running and the writes still being retried).
pub(crate) struct Executor {
    store: Arc<dyn Store>,
    state: Arc<StateMap>,
    approver: Option<Arc<dyn Approver>>,
    stats: Counters,
    /// The bodies' tasks, which outlive a caller that stopped waiting.
    tracker: TaskTracker,
    recorder: Arc<Recorder>,
    shutdown_grace: Duration,
    limits: Limits,
    telemetry: observe::Options,
    gate: Gate,
    /// The database of the store, for transactional tools; `None` when the store is not one.
    transactions: Option<crate::store::transaction::Transactions>,
}

impl Executor {
    /// An executor over `store` and `state`; `approver` decides `unkeyed` calls (none: every
    /// such call is refused); `shutdown` waits up to `shutdown_grace` for unrecorded outcomes;
    /// `telemetry` says what the calls' spans may show.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        state: Arc<StateMap>,
        approver: Option<Arc<dyn Approver>>,
        shutdown_grace: Duration,
        telemetry: observe::Options,
    ) -> Executor {
        Executor {
            store,
            state,
            approver,
            stats: Counters::default(),
            tracker: TaskTracker::new(),
            recorder: Arc::default(),
            shutdown_grace,
            limits: Limits::default(),
            telemetry,
            gate: Gate::default(),
            transactions: None,
        }
    }

    /// True when a call of `def` may wait for a person's approval in this toolbox.
    pub(crate) fn may_need_approval(&self, def: &ToolDefinition) -> bool {
        def.settings.approval || !self.gate.rules.is_empty()
    }

    /// Sets which calls wait for a person's approval, and how their requests are kept.
    pub(crate) fn set_gate(&mut self, gate: Gate) {
        self.gate = gate;
    }

    /// Runs transactional tools' calls in `transactions`, the database of the store.
    pub(crate) fn with_transactions(
        mut self,
        transactions: Option<crate::store::transaction::Transactions>,
    ) -> Executor {
        self.transactions = transactions;
        self
    }

    /// Opens the span of one call of `tool` (see [`observe`]).
    pub(crate) fn observe(
        &self,
        tool: &Arc<ToolTelemetry>,
        story: Story,
        ctx: &ToolContext,
    ) -> Observed {
        let tenant = ctx.tenant().filter(|_| self.telemetry.tenant);
        Observed::start(tool, story, ctx.call_id(), tenant)
    }

    /// Bounds `tool` to `limit` bodies at once in this process.
    pub(crate) fn limit_concurrency(&mut self, tool: &str, limit: std::num::NonZeroUsize) {
        self.limits.limit_concurrency(tool, limit);
    }

    /// True when spans (and an operator's logs) may name a call's tenant.
    pub(crate) fn tenant_in_spans(&self) -> bool {
        self.telemetry.tenant
    }

    /// The store that enforces keys.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Counts of what this executor did.
    pub(crate) fn stats(&self) -> Stats {
        self.stats.snapshot()
    }

    /// One call of `tool`, whose definition (as the toolbox holds it, overrides applied) is
    /// `def` and whose spans and metrics `telemetry` names: its arguments validated and
    /// prepared, an `unkeyed` call approved, then [run](Self::run).
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &dyn Tool,
        def: &Arc<ToolDefinition>,
        telemetry: &Arc<ToolTelemetry>,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let observed = self.observe(telemetry, def.story, ctx);
        let prepared = async {
            let call = def.prepare(tool, &args, ctx)?;
            // A call without a key has no record to count its failures under: it is counted in
            // memory by its tool and the arguments that define it.
            let (tally, keyed_args) = if def.story != Story::Idempotent {
                let tally = Tally::new(observed.tool_name(), args, Limit::of(def));
                (Some(Arc::new(tally)), None)
            } else {
                (None, Some(args))
            };
            if let Some(tally) = &tally {
                // Refused before anyone is asked to approve it.
                self.limits
                    .refuse_if_reached(def, ctx, tally)
                    .inspect_err(|_| self.stats.retry_limited.inc())?;
            }
            // The arguments as the model sent them, now known valid.
            let args = match (&tally, &keyed_args) {
                (Some(tally), _) => tally.args(),
                (None, Some(args)) => args,
                (None, None) => unreachable!("a call's arguments are held by one of the two"),
            };
            if self.gate.needs(def, args) {
                let keyed = call.key.as_ref().zip(call.fingerprint.as_ref());
                self.admit(def, keyed, args, ctx).await?;
            } else if def.story == Story::Unkeyed {
                self.approve(def, args, ctx).await?;
            }
            Ok((call, tally))
        };
        match prepared.instrument(observed.span().clone()).await {
            Ok((call, tally)) => {
                self.run_tallied(def.clone(), call, ctx, tally, &observed)
                    .await
            }
            Err(err) => {
                observed.finish(Err(&err));
                Err(err)
            }
        }
    }

    /// Meets the approval a call needs: bound to its key, or for a call without one (or a key
    /// new at every call) to the fingerprint of its whole arguments, used up by one run. A
    /// keyed call whose completed record this process holds is a replay or `CONFLICT`, runs
    /// nothing, and is let through to be answered so; so is a call keyed on its step whose
    /// record exists (the retry of a step that ran).
    async fn admit(
        &self,
        def: &ToolDefinition,
        keyed: Option<(&crate::IdempotencyKey, &crate::Fingerprint)>,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<(), ToolError> {
        let whole;
        let bound = match keyed {
            Some((key, fingerprint)) if !def.key_follows_step() => {
                let here = RecordKeyRef::new(ctx.scope(), key.as_str());
                if self.store.completed_here(here).is_some() {
                    return Ok(());
                }
                Bound {
                    key: key.as_str(),
                    fingerprint: fingerprint.to_hex(),
                    once: false,
                }
            }
            Some((key, _)) => {
                // A key new at every call: a retry of the same step finds its record, and is
                // answered by it (replay, CONFLICT, IN_PROGRESS) without another approval.
                let rkey = RecordKey::new(ctx.scope(), key.as_str());
                if self
                    .store
                    .get(&rkey)
                    .await
                    .map_err(StoreError::refusal)?
                    .is_some()
                {
                    return Ok(());
                }
                whole = crate::Fingerprint::of(args)
                    .map_err(|e| texts::unfingerprintable(&e.to_string()))?
                    .to_hex();
                Bound {
                    key: &whole,
                    fingerprint: whole.clone(),
                    once: true,
                }
            }
            None => {
                whole = crate::Fingerprint::of(args)
                    .map_err(|e| texts::unfingerprintable(&e.to_string()))?
                    .to_hex();
                Bound {
                    key: &whole,
                    fingerprint: whole.clone(),
                    once: true,
                }
            }
        };
        self.gate.admit(&*self.store, def, bound, args, ctx).await
    }

    async fn approve(
        &self,
        def: &ToolDefinition,
        arguments: &Value,
        ctx: &ToolContext,
    ) -> Result<(), ToolError> {
        let request = ApprovalRequest {
            tool: &def.name,
            arguments,
            context: ctx,
        };
        let approved = match &self.approver {
            Some(approver) => approver.approve(&request).await,
            None => false,
        };
        if approved {
            Ok(())
        } else {
            Err(texts::not_approved(&def.name))
        }
    }

    /// Runs a prepared call, in a task of its own when it has a `timeout` (see the module's
    /// docs), and waits for it up to that `timeout`. The work goes on when the caller stops
    /// waiting, and [`shutdown`](Self::shutdown) waits for it.
    #[cfg(test)]
    pub(crate) async fn run(
        self: &Arc<Self>,
        def: Arc<ToolDefinition>,
        call: Call,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let observed = self.observe(&ToolTelemetry::new(&def.name), def.story, ctx);
        self.run_tallied(def, call, ctx, None, &observed).await
    }

    /// [`run`](Self::run), with the tally that counts a call without a key against its retry
    /// limit. The call's `timeout` covers its wait for a slot under a concurrency limit too: a
    /// call that got no slot by then is answered `BUSY`, and its body never runs. The task
    /// records the call's answer in `observed` when it ends, unless the caller's timeout
    /// answered first.
    async fn run_tallied(
        self: &Arc<Self>,
        def: Arc<ToolDefinition>,
        call: Call,
        ctx: &ToolContext,
        tally: Option<Arc<Tally>>,
        observed: &Observed,
    ) -> Result<ToolOutput, ToolError> {
        let timeout = def.settings.timeout;
        let slot = self.limits.slot(&def.name, timeout);
        if def.story == Story::ReadOnly && timeout.is_none() {
            return self
                .run_inline(&def, call, ctx, tally, slot, observed)
                .await;
        }
        // A keyed call's record: answered from memory with the key borrowed, else owned by the
        // keyed path.
        let rkey = match (&call.key, def.story) {
            (Some(key), Story::Idempotent) => {
                let here = RecordKeyRef::new(ctx.scope(), key.as_str());
                if let Some(answer) = self.answer_here(&def, &call, here, observed) {
                    return answer;
                }
                Some(RecordKey::from(here))
            }
            _ => None,
        };
        let body = self.boxed_work(
            def.clone(),
            call,
            rkey,
            ctx,
            slot.clone(),
            tally.clone(),
            observed,
        );
        let Some(limit) = timeout else {
            // No deadline to keep: the work starts in the caller's task. Work that ends without
            // waiting (a store in memory, a body that does not wait) is answered there, with no
            // task; work that waits goes on in a task of its own, which the runtime polls
            // whether or not its caller does, and which a caller that stops waiting leaves
            // running.
            // Boxed first, so the wrappers move a pointer rather than the whole call.
            let mut work = Box::pin(
                AssertUnwindSafe(self.tracker.track_future(observed.scope(body))).catch_unwind(),
            );
            let ended = match futures_util::poll!(&mut work) {
                std::task::Poll::Ready(ended) => Ok(ended),
                std::task::Poll::Pending => tokio::spawn(work).await,
            };
            // Past the body's own catch (a panic: the work may have been done, and not
            // recorded), or a runtime shutting down that dropped the task.
            let ended = ended
                .map_err(|e| task_ended(&def.name, e))
                .and_then(|ended| {
                    ended.map_err(|panic| panicked(What::Tool(&def.name), "call", panic))
                });
            return ended.unwrap_or_else(|err| {
                observed.finish(Err(&err));
                Err(err)
            });
        };
        // Boxed first, so the wrappers move a pointer rather than the whole call.
        let mut task = self.tracker.spawn(observed.scope(body));
        let joined = match tokio::time::timeout(limit, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                if let Some(slot) = slot {
                    if let Some(first) = slot.give_up() {
                        if first {
                            self.stats.busy.inc();
                        }
                        // The body will not run: wait for the task to free what it held (a
                        // keyed call's reservation), so that "nothing was done" holds when
                        // the answer arrives. Its own wait for a slot has ended too.
                        let _ = task.await;
                        return Err(slot.busy(&def.name));
                    }
                }
                if !observed.claim_timeout() {
                    // The body ended as the wait did, and its answer is the one recorded.
                    return task.await.unwrap_or_else(|e| Err(task_ended(&def.name, e)));
                }
                self.stats.timeouts.inc();
                let timed_out = Err(texts::timed_out(def.named(), def.story, limit));
                let answer: Result<ToolOutput, ToolError> = match tally {
                    Some(tally) => tally
                        .settle(&self.limits, &def, ctx, timed_out)
                        .inspect_err(|e| self.count_retry_limited(e)),
                    None => timed_out,
                };
                observed.timed_out(answer.as_ref().map(|out| out.replayed));
                return answer;
            }
        };
        joined.unwrap_or_else(|e| {
            let err = task_ended(&def.name, e);
            observed.finish(Err(&err));
            Err(err)
        })
    }

    /// The work of a call that does not run inline: the keyed path, or a body without a key, then
    /// its answer recorded in `observed`. Made and boxed in a frame of its own, so that the call's
    /// state (about 3 KB) is copied once, into its box, rather than moved through the caller's
    /// frame on its way there.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn boxed_work(
        self: &Arc<Self>,
        def: Arc<ToolDefinition>,
        call: Call,
        rkey: Option<RecordKey>,
        ctx: &ToolContext,
        slot: Option<Arc<Slot>>,
        tally: Option<Arc<Tally>>,
        observed: &Observed,
    ) -> std::pin::Pin<Box<impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send>>
    {
        let (exec, ctx, observed) = (self.clone(), ctx.clone(), observed.clone());
        Box::pin(async move {
            let answer = if call.tx.is_some() {
                transactional::run(exec, def, call, rkey, ctx).await
            } else if def.story == Story::Idempotent {
                keyed::run(exec, def, observed.tool_name(), call, rkey, ctx, slot).await
            } else {
                let answer = exec.run_unkeyed(&def, call, ctx.clone(), slot).await;
                match tally {
                    Some(tally) => tally
                        .settle(&exec.limits, &def, &ctx, answer)
                        .inspect_err(|e| exec.count_retry_limited(e)),
                    None => answer,
                }
            };
            observed.finish(answer.as_ref().map(|out| out.replayed));
            answer
        })
    }

    /// The answer to a keyed call whose record `rkey` the store holds in memory, completed
    /// ([`Store::completed_here`]): a replay or `CONFLICT`, made in the caller's task with no
    /// round trip. `None`: the call takes the keyed path.
    fn answer_here(
        &self,
        def: &ToolDefinition,
        call: &Call,
        rkey: RecordKeyRef<'_>,
        observed: &Observed,
    ) -> Option<Result<ToolOutput, ToolError>> {
        let (Some(key), Some(fingerprint)) = (&call.key, &call.fingerprint) else {
            return None;
        };
        let Some(Record::Completed {
            fingerprint: held,
            outcome,
            ..
        }) = self.store.completed_here(rkey)
        else {
            return None;
        };
        let answer = observed
            .in_scope(|| keyed::answer_completed(self, def, key, fingerprint, &held, outcome));
        observed.finish(answer.as_ref().map(|out| out.replayed));
        Some(answer)
    }

    /// A `read_only` call without a timeout, run in the caller's task: it has no effect a
    /// caller that stops waiting could leave half done, and no deadline another task must keep,
    /// so it is spared a task of its own. A caller that drops it cancels its read, and its span
    /// and metrics say `cancelled`.
    async fn run_inline(
        &self,
        def: &ToolDefinition,
        call: Call,
        ctx: &ToolContext,
        tally: Option<Arc<Tally>>,
        slot: Option<Arc<Slot>>,
        observed: &Observed,
    ) -> Result<ToolOutput, ToolError> {
        let cancelled = observe::CancelGuard::new(observed);
        let run = self.run_unkeyed(def, call, ctx.clone(), slot);
        let answer = observed.scope(run).await;
        let answer = match tally {
            Some(tally) => tally
                .settle(&self.limits, def, ctx, answer)
                .inspect_err(|e| self.count_retry_limited(e)),
            None => answer,
        };
        cancelled.disarm();
        observed.finish(answer.as_ref().map(|out| out.replayed));
        answer
    }

    /// Counts an answer a [`Tally`] turned into `RETRY_LIMIT` (the keyed path counts its own).
    fn count_retry_limited(&self, err: &ToolError) {
        if err.is(crate::ErrorCode::RetryLimit) {
            self.stats.retry_limited.inc();
        }
    }

    /// A call without a key (`read_only`, `natural`, an approved `unkeyed`): its body runs every
    /// time (once a slot is free, under a concurrency limit), and nothing is recorded.
    async fn run_unkeyed(
        &self,
        def: &ToolDefinition,
        call: Call,
        ctx: ToolContext,
        slot: Option<Arc<Slot>>,
    ) -> Result<ToolOutput, ToolError> {
        let permit = match &slot {
            Some(slot) => match slot.acquire().await {
                Ok(permit) => Some(permit),
                Err(first) => {
                    if first {
                        self.stats.busy.inc();
                    }
                    return Err(slot.busy(&def.name));
                }
            },
            None => None,
        };
        self.stats.executed.inc();
        let _running = observe::body_started();
        let invocation = Invocation {
            ctx,
            state: self.state.clone(),
        };
        let ran = AssertUnwindSafe((call.body)(invocation))
            .catch_unwind()
            .await;
        drop(permit);
        match ran {
            Ok(result) => result.map(|value| ToolOutput {
                value,
                replayed: false,
            }),
            Err(panic) => Err(panicked(What::Tool(&def.name), "body", panic)),
        }
    }

    /// Waits for every body still running, then up to the shutdown grace for the outcomes the
    /// store did not take at once, and reports those it still has not taken.
    pub(crate) async fn shutdown(&self) -> ShutdownReport {
        self.tracker.close();
        self.tracker.wait().await;
        self.tracker.reopen();
        self.recorder.drain(self.shutdown_grace).await
    }
}
