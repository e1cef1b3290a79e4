//! What an operator sees of the calls: a [`tracing`] span for each call and each `ctx.once`
//! step, and metrics through the [`metrics`] facade. Neither ever carries an argument's value or
//! a key's text: a call is named by its tool, its story, what happened and its key's short hash.
//!
//! # Spans
//!
//! Each call of a tool is one span, named as OpenTelemetry's semantic conventions for GenAI tool
//! execution name it: [`CALL_SPAN`] (`execute_tool`), with `otel.name` = `execute_tool {tool}`
//! for exporters that build the span's name from it (`tracing-opentelemetry`). Its fields:
//!
//! | field | value |
//! |---|---|
//! | `gen_ai.operation.name` | `execute_tool` |
//! | `gen_ai.tool.name` | the tool's name (a status companion's own name for its calls) |
//! | `gen_ai.tool.type` | `function` |
//! | `gen_ai.tool.call.id` | the id the model's API gave the call, when the caller set one ([`ToolContext::with_tool_call_id`](crate::ToolContext::with_tool_call_id); the [provider adapters](crate::providers) do) |
//! | `jsonrpc.request.id`, `mcp.method.name` | over MCP: the `tools/call` request's id, and `tools/call` |
//! | `error.type`, `otel.status_code` | on an error answer: its code (`CONFLICT`, `PAYMENT_DECLINED`, ...), and `error` |
//! | `toolkey.story` | `read_only`, `idempotent`, `natural` or `unkeyed` |
//! | `toolkey.outcome` | what happened: see [Outcomes](#outcomes) |
//! | `toolkey.key_hash` | the short hash of the call's key (keyed tools and status companions) |
//! | `toolkey.tenant` | the tenant, only when the toolbox allows it ([`ToolboxBuilder::tenant_in_spans`](crate::ToolboxBuilder::tenant_in_spans)) |
//! | `toolkey.lease_renewals` | how often the call's lease (its steps' included) was extended while it ran |
//! | `toolkey.store_ops`, `toolkey.store_ms` | the store operations the call waited for, and the time it waited on them (renewals, which run beside the body, are not waited for) |
//!
//! A `ctx.once` step is a child span, [`STEP_SPAN`] (`once`), with `toolkey.step` (the step's
//! name), `toolkey.key_hash` (the step key's hash), `toolkey.outcome` and, on an error,
//! `error.type`. The executor's own events (a store that refused a write, a lease lost) happen
//! inside the call's span.
//!
//! A call whose caller stopped waiting (its `timeout`) has the outcome `timeout`; when its body
//! ends later, an event in the span, `toolkey.late_outcome`, says how.
//!
//! # Outcomes
//!
//! One word for what toolkey did, or the error code the caller got:
//!
//! | outcome | when |
//! |---|---|
//! | `executed` | the body ran and returned a result |
//! | `replayed` | a recorded outcome answered the call (a recorded error too, with its `error.type`), or a recover hook found the effect |
//! | `conflict` | the key was used with other arguments |
//! | `in_progress` | the key's first call was still running |
//! | `timeout` | the caller stopped waiting |
//! | `unknown` | the outcome is unknown: a stale reservation without a recover hook, or a body that said so |
//! | `cancelled` | the caller dropped a `read_only` call without a `timeout` before it was answered (it runs in the caller's task, so its read ended there) |
//! | an error code | the body ran and failed (`PAYMENT_DECLINED`), or the call was refused before anything ran (`INVALID_ARGUMENTS`, `STORE_UNAVAILABLE`, `APPROVAL_REQUIRED`, `RETRY_LIMIT`, `BUSY`, ...) |
//!
//! Error codes are upper case and toolkey's words lower case, so a tool's own `CONFLICT` is
//! never counted as toolkey's `conflict`. Error codes are labels: a tool that makes codes up
//! from its input would make a metric's label set grow without bound.
//!
//! # Metrics
//!
//! Recorded through whatever `metrics` recorder the program installs (none: nothing is
//! recorded, at the cost of a few no-op calls).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | [`CALLS`] | counter | `tool`, `outcome` |
//! | [`CALL_DURATION`] | histogram, seconds, as the caller waited | `tool`, `outcome` |
//! | [`STORE_DURATION`] | histogram, seconds | `operation`: `reserve`, `complete`, `release`, `renew`, `mark_unknown`, `take_over`, `get`, and the retry limit's `failures`, `count_failure`, `clear_failures` |
//! | [`BODIES_IN_FLIGHT`] | gauge | `tool` |
//!
//! [`Toolbox::stats`](crate::Toolbox::stats) counts the same events without a recorder.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use metrics::{Key, Label, Metadata, SharedString};
use tracing::field::{display, Empty};
use tracing::{Instrument, Span};

use crate::key::log_hash;
use crate::story::Story;
use crate::{ErrorCode, ToolError};

/// The name of a call's span (OpenTelemetry's GenAI operation).
pub const CALL_SPAN: &str = "execute_tool";
/// The name of a `ctx.once` step's span, a child of its call's.
pub const STEP_SPAN: &str = "once";
/// Calls, by `tool` and `outcome`.
pub const CALLS: &str = "toolkey_calls_total";
/// How long callers waited for their answers, in seconds, by `tool` and `outcome`.
pub const CALL_DURATION: &str = "toolkey_call_duration_seconds";
/// How long store operations took, in seconds, by `operation`.
pub const STORE_DURATION: &str = "toolkey_store_duration_seconds";
/// Bodies running now, by `tool`: those whose caller stopped waiting included.
pub const BODIES_IN_FLIGHT: &str = "toolkey_bodies_in_flight";

/// Says once, to the recorder installed when a toolbox is built, what each metric is.
pub(crate) fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(CALLS, Unit::Count, "Tool calls, by tool and outcome");
    metrics::describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "How long a tool call's caller waited for its answer"
    );
    metrics::describe_histogram!(
        STORE_DURATION,
        Unit::Seconds,
        "How long an idempotency store operation took, by operation"
    );
    metrics::describe_gauge!(
        BODIES_IN_FLIGHT,
        Unit::Count,
        "Tool bodies running, their callers' timeouts notwithstanding"
    );
}

/// What a toolbox's owner chose to show in spans.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    /// Record `toolkey.tenant` on each call's span.
    pub(crate) tenant: bool,
}

/// How the caller named one call, for traces: never part of a key, never read by a tool.
#[derive(Clone, Debug)]
pub(crate) enum CallId {
    /// The id the model's API gave the tool call (`gen_ai.tool.call.id`).
    Tool(Arc<str>),
    /// The JSON-RPC id of the MCP `tools/call` request (`jsonrpc.request.id`).
    McpRequest(Arc<str>),
}

/// What toolkey did with a call or a step, as the executor decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Happened {
    /// The body started.
    Executed = 1,
    /// A recorded outcome answers.
    Replayed,
    /// The key is held with another fingerprint.
    Conflict,
    /// The key's first call still runs.
    InProgress,
    /// A stale reservation, with nothing to ask.
    Unknown,
}

impl Happened {
    fn word(self) -> Word {
        match self {
            Happened::Executed => Word::Executed,
            Happened::Replayed => Word::Replayed,
            Happened::Conflict => Word::Conflict,
            Happened::InProgress => Word::InProgress,
            Happened::Unknown => Word::Unknown,
        }
    }

    fn load(cell: &AtomicU8) -> Option<Happened> {
        Some(match cell.load(Ordering::Acquire) {
            1 => Happened::Executed,
            2 => Happened::Replayed,
            3 => Happened::Conflict,
            4 => Happened::InProgress,
            5 => Happened::Unknown,
            _ => return None,
        })
    }
}

/// toolkey's words for what happened, in the order of [`WORDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    Executed,
    Replayed,
    Conflict,
    InProgress,
    Timeout,
    Unknown,
    Cancelled,
}

const WORDS: [Word; 7] = [
    Word::Executed,
    Word::Replayed,
    Word::Conflict,
    Word::InProgress,
    Word::Timeout,
    Word::Unknown,
    Word::Cancelled,
];

impl Word {
    fn as_str(self) -> &'static str {
        match self {
            Word::Executed => "executed",
            Word::Replayed => "replayed",
            Word::Conflict => "conflict",
            Word::InProgress => "in_progress",
            Word::Timeout => "timeout",
            Word::Unknown => "unknown",
            Word::Cancelled => "cancelled",
        }
    }
}

/// A call's or step's outcome: one of toolkey's words, or the error code the caller got.
#[derive(Clone, Copy)]
enum Outcome<'a> {
    Word(Word),
    Code(&'a str),
}

impl<'a> Outcome<'a> {
    /// What `happened` (if the executor said) and the answer (`Ok(replayed)` or the error) make.
    fn of(happened: Option<Happened>, answer: Result<bool, &'a ToolError>) -> Outcome<'a> {
        match (happened, answer) {
            (Some(Happened::Executed), Err(err)) if err.is(ErrorCode::OutcomeUnknown) => {
                Outcome::Word(Word::Unknown)
            }
            (Some(Happened::Executed), Err(err)) => Outcome::Code(err.code()),
            (Some(happened), _) => Outcome::Word(happened.word()),
            (None, Ok(true)) => Outcome::Word(Word::Replayed),
            (None, Ok(false)) => Outcome::Word(Word::Executed),
            (None, Err(err)) => Outcome::Code(err.code()),
        }
    }

    fn as_str(self) -> &'a str {
        match self {
            Outcome::Word(word) => word.as_str(),
            Outcome::Code(code) => code,
        }
    }
}

/// Where toolkey's metrics say they come from.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One tool's name and metric keys, made once when the toolbox is built: a call then builds no
/// label and hashes no key, which keeps it cheap when no recorder is installed (each metric is
/// then a call that does nothing). Each recording still asks the recorder in force at that
/// moment, so a recorder installed after the toolbox was built, or one local to a thread, gets
/// every call.
pub(crate) struct ToolTelemetry {
    name: Arc<str>,
    /// [`CALLS`] and [`CALL_DURATION`] for each of [`WORDS`].
    calls: [Key; 7],
    durations: [Key; 7],
    in_flight: Key,
}

impl ToolTelemetry {
    /// The tool's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The name and keys of tool `name`.
    pub(crate) fn new(name: &str) -> Arc<ToolTelemetry> {
        let name: Arc<str> = Arc::from(name);
        let keys = |metric: &'static str| {
            WORDS.map(|word| Key::from_parts(metric, call_labels(&name, word.as_str().into())))
        };
        Arc::new(ToolTelemetry {
            calls: keys(CALLS),
            durations: keys(CALL_DURATION),
            in_flight: Key::from_parts(BODIES_IN_FLIGHT, vec![tool_label(&name)]),
            name,
        })
    }

    /// Counts one call that ended in `outcome` after `took`.
    fn count(&self, outcome: Outcome<'_>, took: Duration) {
        let record = |calls: &Key, durations: &Key| {
            metrics::with_recorder(|recorder| {
                recorder.register_counter(calls, &METADATA).increment(1);
                recorder
                    .register_histogram(durations, &METADATA)
                    .record(took);
            })
        };
        match outcome {
            Outcome::Word(word) => {
                let at = WORDS.iter().position(|w| *w == word).unwrap_or_default();
                record(&self.calls[at], &self.durations[at]);
            }
            // An error code: keys made for this call.
            Outcome::Code(code) => {
                let labels = call_labels(&self.name, code.to_owned().into());
                let calls = Key::from_parts(CALLS, labels.clone());
                record(&calls, &Key::from_parts(CALL_DURATION, labels));
            }
        }
    }

    /// One more body in flight (`true`), or one fewer.
    fn in_flight(&self, more: bool) {
        metrics::with_recorder(|recorder| {
            let gauge = recorder.register_gauge(&self.in_flight, &METADATA);
            if more {
                gauge.increment(1.0)
            } else {
                gauge.decrement(1.0)
            }
        });
    }
}

fn tool_label(name: &Arc<str>) -> Label {
    Label::new("tool", SharedString::from(name.clone()))
}

fn call_labels(name: &Arc<str>, outcome: SharedString) -> Vec<Label> {
    vec![tool_label(name), Label::new("outcome", outcome)]
}

/// Who answered a call first: its task, or its caller's timeout.
const PENDING: u8 = 0;
const ANSWERED: u8 = 1;
const TIMED_OUT: u8 = 2;

struct Inner {
    span: Span,
    start: Instant,
    tool: Arc<ToolTelemetry>,
    happened: AtomicU8,
    answer: AtomicU8,
    store_nanos: AtomicU64,
    store_ops: AtomicU32,
    renewals: AtomicU32,
}

/// One call as it is observed: its span, its start, and what the executor reported of it.
/// Cheap to clone; the caller and the call's task share it.
#[derive(Clone)]
pub(crate) struct Observed(Arc<Inner>);

tokio::task_local! {
    /// The call whose task this is: store operations and lease renewals report to it.
    static CURRENT: Observed;
}

/// `execute_tool {tool}`, formatted only when a subscriber records the span.
struct SpanName<'a>(&'static str, &'a str);

impl fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

impl Observed {
    /// Opens the span of one call of the tool `telemetry` names.
    pub(crate) fn start(
        telemetry: &Arc<ToolTelemetry>,
        story: Story,
        call_id: Option<&CallId>,
        tenant: Option<&str>,
    ) -> Observed {
        let tool = &*telemetry.name;
        let span = tracing::info_span!(
            CALL_SPAN,
            otel.name = %SpanName(CALL_SPAN, tool),
            otel.status_code = Empty,
            gen_ai.operation.name = CALL_SPAN,
            gen_ai.tool.name = tool,
            gen_ai.tool.type = "function",
            gen_ai.tool.call.id = Empty,
            jsonrpc.request.id = Empty,
            mcp.method.name = Empty,
            error.type = Empty,
            toolkey.story = story.as_str(),
            toolkey.outcome = Empty,
            toolkey.key_hash = Empty,
            toolkey.tenant = Empty,
            toolkey.lease_renewals = Empty,
            toolkey.store_ops = Empty,
            toolkey.store_ms = Empty,
        );
        if !span.is_disabled() {
            match call_id {
                Some(CallId::Tool(id)) => {
                    span.record("gen_ai.tool.call.id", &**id);
                }
                Some(CallId::McpRequest(id)) => {
                    span.record("jsonrpc.request.id", &**id);
                    span.record("mcp.method.name", "tools/call");
                }
                None => {}
            }
            if let Some(tenant) = tenant {
                span.record("toolkey.tenant", tenant);
            }
        }
        Observed(Arc::new(Inner {
            span,
            start: Instant::now(),
            tool: telemetry.clone(),
            happened: AtomicU8::new(0),
            answer: AtomicU8::new(PENDING),
            store_nanos: AtomicU64::new(0),
            store_ops: AtomicU32::new(0),
            renewals: AtomicU32::new(0),
        }))
    }

    /// The call's span.
    pub(crate) fn span(&self) -> &Span {
        &self.0.span
    }

    /// The tool's name, shared: built once per tool when the toolbox is built.
    pub(crate) fn tool_name(&self) -> Arc<str> {
        self.0.tool.name.clone()
    }

    /// Runs `work` as this call's: inside its span, with its store operations, renewals and
    /// what the executor reports counted for it.
    pub(crate) fn scope<F: Future>(&self, work: F) -> impl Future<Output = F::Output> {
        CURRENT
            .scope(self.clone(), work)
            .instrument(self.0.span.clone())
    }

    /// Runs `work` as this call's, as [`scope`](Self::scope) does, when it does not wait.
    pub(crate) fn in_scope<R>(&self, work: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self.clone(), || self.0.span.in_scope(work))
    }

    /// The call is answered with `answer` (`Ok(replayed)` or the error): records its outcome,
    /// counts it and its latency, and what it cost in the store. Called when the call's task
    /// ends (or, for a call refused before it had one, by the caller). A call whose caller
    /// already timed out gets an event saying how its body ended instead.
    pub(crate) fn finish(&self, answer: Result<bool, &ToolError>) {
        let inner = &*self.0;
        let outcome = Outcome::of(Happened::load(&inner.happened), answer);
        if self.claim(ANSWERED) {
            self.answered(outcome, answer.err().map(ToolError::code));
        } else {
            tracing::info!(parent: &inner.span, toolkey.late_outcome = outcome.as_str(), "the body ended after its caller stopped waiting");
        }
        if !inner.span.is_disabled() {
            let nanos = inner.store_nanos.load(Ordering::Relaxed);
            inner.span.record(
                "toolkey.lease_renewals",
                inner.renewals.load(Ordering::Relaxed),
            );
            inner
                .span
                .record("toolkey.store_ops", inner.store_ops.load(Ordering::Relaxed));
            inner.span.record("toolkey.store_ms", nanos as f64 / 1e6);
        }
    }
    /// The caller stops waiting: true when its answer is the call's (its task had not answered
    /// yet; record it with [`timed_out`](Self::timed_out)), false when the task answered first.
    pub(crate) fn claim_timeout(&self) -> bool {
        self.claim(TIMED_OUT)
    }

    /// True when the call had no answer yet, and now has `answer`'s side.
    fn claim(&self, answer: u8) -> bool {
        self.0
            .answer
            .compare_exchange(PENDING, answer, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Records the answer of a caller that stopped waiting: `timeout`, or what a retry limit
    /// made of it.
    pub(crate) fn timed_out(&self, answer: Result<bool, &ToolError>) {
        let outcome = match answer {
            Err(err) if err.is(ErrorCode::Timeout) => Outcome::Word(Word::Timeout),
            answer => Outcome::of(None, answer),
        };
        self.answered(outcome, answer.err().map(ToolError::code));
    }
    fn answered(&self, outcome: Outcome<'_>, error: Option<&str>) {
        let inner = &*self.0;
        let span = &inner.span;
        // A disabled span still looks each field up by name: skip that when nothing listens.
        if !span.is_disabled() {
            span.record("toolkey.outcome", outcome.as_str());
            if let Some(code) = error {
                span.record("error.type", code);
                span.record("otel.status_code", "error");
            }
        }
        inner.tool.count(outcome, inner.start.elapsed());
    }
}

/// Records a call whose caller went away before it was answered (a `read_only` call run in the
/// caller's task, whose read ends with it) as `cancelled`, unless [disarmed](Self::disarm) once
/// it is answered.
pub(crate) struct CancelGuard<'a>(Option<&'a Observed>);

impl<'a> CancelGuard<'a> {
    pub(crate) fn new(observed: &'a Observed) -> Self {
        CancelGuard(Some(observed))
    }

    /// The call is being answered: nothing to record on drop.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        let Some(observed) = self.0 else {
            return;
        };
        if observed.claim(ANSWERED) {
            observed.answered(Outcome::Word(Word::Cancelled), None);
        }
    }
}

/// Reports what the executor decided for the current call.
pub(crate) fn mark(happened: Happened) {
    let _ = CURRENT.try_with(|call| call.0.happened.store(happened as u8, Ordering::Release));
}

/// Records the current call's key, as its short hash.
pub(crate) fn key(key: &str) {
    let _ = CURRENT.try_with(|call| {
        if !call.0.span.is_disabled() {
            call.0
                .span
                .record("toolkey.key_hash", display(log_hash(key)));
        }
    });
}

/// A body running, counted in [`BODIES_IN_FLIGHT`] until dropped.
pub(crate) struct Running(Option<Arc<ToolTelemetry>>);

/// The current call's body starts: the call is `executed`, and its body in flight until the
/// returned guard is dropped.
pub(crate) fn body_started() -> Running {
    let tool = CURRENT
        .try_with(|call| {
            call.0
                .happened
                .store(Happened::Executed as u8, Ordering::Release);
            call.0.tool.clone()
        })
        .ok();
    if let Some(tool) = &tool {
        tool.in_flight(true);
    }
    Running(tool)
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tool) = &self.0 {
            tool.in_flight(false);
        }
    }
}

/// A store operation, as [`STORE_DURATION`] labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    Reserve,
    Complete,
    Release,
    Renew,
    MarkUnknown,
    TakeOver,
    Get,
    /// The retry limit's reads and writes of a key's failure count.
    Failures,
    CountFailure,
    ClearFailures,
}

impl StoreOp {
    /// Its [`STORE_DURATION`] key, made at compile time.
    fn key(self) -> &'static Key {
        static RESERVE: [Label; 1] = [Label::from_static_parts("operation", "reserve")];
        static COMPLETE: [Label; 1] = [Label::from_static_parts("operation", "complete")];
        static RELEASE: [Label; 1] = [Label::from_static_parts("operation", "release")];
        static RENEW: [Label; 1] = [Label::from_static_parts("operation", "renew")];
        static MARK_UNKNOWN: [Label; 1] = [Label::from_static_parts("operation", "mark_unknown")];
        static TAKE_OVER: [Label; 1] = [Label::from_static_parts("operation", "take_over")];
        static GET: [Label; 1] = [Label::from_static_parts("operation", "get")];
        static FAILURES: [Label; 1] = [Label::from_static_parts("operation", "failures")];
        static COUNT_FAILURE: [Label; 1] = [Label::from_static_parts("operation", "count_failure")];
        static CLEAR_FAILURES: [Label; 1] =
            [Label::from_static_parts("operation", "clear_failures")];
        static KEYS: [Key; 10] = [
            Key::from_static_parts(STORE_DURATION, &RESERVE),
            Key::from_static_parts(STORE_DURATION, &COMPLETE),
            Key::from_static_parts(STORE_DURATION, &RELEASE),
            Key::from_static_parts(STORE_DURATION, &RENEW),
            Key::from_static_parts(STORE_DURATION, &MARK_UNKNOWN),
            Key::from_static_parts(STORE_DURATION, &TAKE_OVER),
            Key::from_static_parts(STORE_DURATION, &GET),
            Key::from_static_parts(STORE_DURATION, &FAILURES),
            Key::from_static_parts(STORE_DURATION, &COUNT_FAILURE),
            Key::from_static_parts(STORE_DURATION, &CLEAR_FAILURES),
        ];
        &KEYS[self as usize]
    }
}

/// Times one store operation: into [`STORE_DURATION`], and into the current call's store time
/// (except a renewal, which the call does not wait for).
pub(crate) async fn store<T>(op: StoreOp, work: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let out = work.await;
    let took = start.elapsed();
    metrics::with_recorder(|recorder| {
        recorder
            .register_histogram(op.key(), &METADATA)
            .record(took)
    });
    if op != StoreOp::Renew {
        let _ = CURRENT.try_with(|call| call.waited(took));
    }
    out
}

impl Observed {
    fn waited(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.0.store_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.0.store_ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a lease renewal, in the runtime's renewer task, reports to the call it was started in.
/// It holds the call weakly: the lease may stay registered after the call has ended (while a
/// write is retried in the background), and must not keep the call's span open meanwhile.
#[derive(Clone)]
pub(crate) struct Renewals(Weak<Inner>);

impl Renewals {
    /// For the current call (none outside a call).
    pub(crate) fn of_current() -> Renewals {
        Renewals(
            CURRENT
                .try_with(|call| Arc::downgrade(&call.0))
                .unwrap_or_default(),
        )
    }

    /// The call's span, for a renewal's event (none once the call has ended).
    pub(crate) fn span(&self) -> Span {
        self.0
            .upgrade()
            .map_or_else(Span::none, |call| call.span.clone())
    }

    /// The lease was extended.
    pub(crate) fn renewed(&self) {
        if let Some(call) = self.0.upgrade() {
            call.renewals.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One `ctx.once` step as it is observed: a child span of its call's.
pub(crate) struct Step {
    span: Span,
    happened: AtomicU8,
}

impl Step {
    /// Opens the span of step `step`, whose record key is `key`.
    pub(crate) fn start(step: &str, key: &str) -> Step {
        let span = tracing::info_span!(
            STEP_SPAN,
            otel.name = %SpanName(STEP_SPAN, step),
            otel.status_code = Empty,
            error.type = Empty,
            toolkey.step = step,
            toolkey.key_hash = %log_hash(key),
            toolkey.outcome = Empty,
        );
        Step {
            span,
            happened: AtomicU8::new(0),
        }
    }

    /// The step's span.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// What the step's reservation met.
    pub(crate) fn mark(&self, happened: Happened) {
        self.happened.store(happened as u8, Ordering::Release);
    }

    /// The step ended with `result`.
    pub(crate) fn finish<T>(&self, result: &Result<T, ToolError>) {
        if self.span.is_disabled() {
            return;
        }
        let answer = result.as_ref().map(|_| false);
        let outcome = Outcome::of(Happened::load(&self.happened), answer);
        self.span.record("toolkey.outcome", outcome.as_str());
        if let Err(err) = result {
            self.span.record("error.type", err.code());
            self.span.record("otel.status_code", "error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_toolkey_words_or_error_codes() {
        let declined = ToolError::new("PAYMENT_DECLINED", "declined");
        let unknown = ToolError::new(ErrorCode::OutcomeUnknown, "unknown");
        let conflict = ToolError::new(ErrorCode::Conflict, "conflict");
        let of = |happened, answer| Outcome::of(happened, answer).as_str().to_string();
        assert_eq!(of(None, Ok(false)), "executed");
        assert_eq!(of(None, Ok(true)), "replayed");
        assert_eq!(of(Some(Happened::Executed), Ok(false)), "executed");
        assert_eq!(
            of(Some(Happened::Executed), Err(&declined)),
            "PAYMENT_DECLINED"
        );
        assert_eq!(of(Some(Happened::Executed), Err(&unknown)), "unknown");
        // A tool's own CONFLICT stays its code; toolkey's conflict is the word.
        assert_eq!(of(Some(Happened::Executed), Err(&conflict)), "CONFLICT");
        assert_eq!(of(Some(Happened::Conflict), Err(&conflict)), "conflict");
        assert_eq!(of(Some(Happened::Replayed), Err(&declined)), "replayed");
        assert_eq!(
            of(Some(Happened::InProgress), Err(&declined)),
            "in_progress"
        );
        assert_eq!(of(Some(Happened::Unknown), Err(&unknown)), "unknown");
        assert_eq!(of(None, Err(&declined)), "PAYMENT_DECLINED");
    }
}
