//! Every text a model reads: error messages, suggestions, notes and the status companions'
//! descriptions.
//!
//! They are part of the API: a model follows them literally, so each says what happened and what
//! to do next. They live here, in one room, so they can be read (and reviewed) side by side, and
//! so one test can hold them all to the rules:
//!
//! - a text names tools, steps, fields and settings, never a key's values or an argument: keys
//!   and arguments carry personal data, and a terminal error is recorded and replayed; so every
//!   function here takes names, durations and times, never a value;
//! - a message starts in lower case and has no trailing period, as Rust's own messages do;
//! - a suggestion says what to do next, and whether to retry.

use std::time::{Duration, SystemTime};

use crate::error::Mark;
use crate::story::Story;
use crate::{ErrorCode, ToolError};

/// The names a text about one call uses: the tool's, and its status companion's when it has one
/// (texts point the model there). A definition gives them with `ToolDefinition::named`, so this
/// module needs no definition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named<'a> {
    pub(crate) tool: &'a str,
    pub(crate) status: Option<&'a str>,
    /// The key holds the call's place in the run (`<ctx.step>`): a new call of the tool, the
    /// model's retry included, has a key of its own and is a new action, so no answer may
    /// tell the model that calling again is safe once the tool may have acted.
    pub(crate) per_call: bool,
}

/// Why a new call of a tool keyed on its place in the run would act again.
const NEW_CALL_NEW_ACTION: &str =
    "a new call of this tool is a new action, since its key is the call's place in the run";

// ---------------------------------------------------------------------------------------------
// Arguments

/// What a suggestion says when the arguments are not an object of named fields.
const SEND_AN_OBJECT: &str =
    "send a JSON object with the fields the tool's schema lists, then call again";

/// The arguments are a JSON value of another kind than an object (`kind`: "an array", ...).
pub(crate) fn arguments_not_an_object(tool: &str, kind: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` must be a JSON object of named fields, not {kind}"),
        SEND_AN_OBJECT.into(),
    )
}

/// How `tool`'s refusal of its arguments begins; a problem at the top follows it directly.
fn invalid_arguments_prefix(tool: &str) -> String {
    format!("invalid arguments for `{tool}`: ")
}

/// The arguments do not fit the tool's schema. `path` is the field serde names (`.` for the
/// whole object), `problem` serde's words; the suggestion names the field and, when the schema
/// says, what it expects (`expected`).
pub(crate) fn invalid_arguments(
    tool: &str,
    path: &str,
    problem: &str,
    field: Option<&str>,
    expected: Option<&str>,
) -> ToolError {
    let message = match path {
        "." => format!("{}{problem}", invalid_arguments_prefix(tool)),
        _ => format!("{}`{path}`: {problem}", invalid_arguments_prefix(tool)),
    };
    let suggestion = match (field, expected) {
        (Some(field), Some(expected)) => format!("send `{field}` as {expected}, then call again"),
        (Some(field), None) => {
            format!("fix `{field}` as the tool's schema describes, then call again")
        }
        (None, _) => FIX_AS_THE_SCHEMA_SAYS.into(),
    };
    ToolError::invalid_arguments(message, suggestion)
}

/// A provider's arguments string is not JSON (`problem`: the parser's words).
pub(crate) fn arguments_not_json(tool: &str, problem: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` are not valid JSON: {problem}"),
        SEND_ONE_OBJECT.into(),
    )
}

/// A provider's arguments are a JSON value of another kind than an object.
pub(crate) fn provider_arguments_not_an_object(tool: &str, kind: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` must be a JSON object, not {kind}"),
        SEND_ONE_OBJECT.into(),
    )
}

const FIX_AS_THE_SCHEMA_SAYS: &str =
    "fix the arguments as the tool's schema describes, each field of the type it gives, then call again";

const SEND_ONE_OBJECT: &str =
    "send the arguments as one JSON object with the fields the tool's schema lists, then call again";

/// A message item of the wrong type (a `text` block where a `tool_use` was expected).
pub(crate) fn wrong_item_type(expected: &str, found: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("expected a `{expected}` item, got `{found}`"),
    )
    .with_suggestion(format!("send tool calls as `{expected}` items"))
}

/// The arguments cannot be fingerprinted (`problem`: why).
pub(crate) fn unfingerprintable(problem: &str) -> ToolError {
    ToolError::internal(format!("cannot fingerprint the arguments: {problem}"))
}

// ---------------------------------------------------------------------------------------------
// Keys and the caller's context

/// A key field holds a control character: named by its field, never shown.
pub(crate) fn control_character(field: &str, from_ctx: bool) -> ToolError {
    if from_ctx {
        ToolError::new(
            ErrorCode::MissingContext,
            format!("the caller's `ctx.{field}` holds a control character, which cannot be part of an idempotency key"),
        )
        .with_suggestion(RUNTIME_DEFECT)
    } else {
        ToolError::new(
            ErrorCode::InvalidArguments,
            format!("`{field}` holds a control character (such as NUL or a line break inside the text), which cannot be part of an idempotency key"),
        )
        .with_suggestion(format!("send `{field}` without control characters; the same value will be refused again"))
    }
}

const RUNTIME_DEFECT: &str =
    "this is a defect in the agent runtime, not in the arguments: report it; do not retry";

/// The key uses `ctx.{field}`, and the caller's context has none.
pub(crate) fn missing_context(field: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("this tool's key uses `ctx.{field}`, and the caller's ToolContext has none"),
    )
    .with_suggestion(RUNTIME_DEFECT)
}

/// An agent framework ran a tool without the run context the program should have passed.
#[cfg(feature = "rig")]
pub(crate) fn no_run_context() -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        "the program running this agent gave the tool no run context, so nothing ran",
    )
    .with_suggestion(
        "this is a defect in the program, not in the arguments: tell the user the action could not be done; do not retry",
    )
}

/// An MCP request's `_meta.{key}` is not what it must be (`expected`).
pub(crate) fn bad_meta(key: &str, expected: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("the request's `_meta.{key}` must be {expected}"),
    )
    .with_suggestion(
        "this is a defect in the MCP client, not in the arguments: report it; do not retry",
    )
}

/// An MCP request names a run id or event id (`_meta.{key}`) the server does not accept.
pub(crate) fn client_run_id_refused(code: &'static str, key: &str) -> ToolError {
    ToolError::new(
        code,
        format!("this server does not accept client run ids: the request names `_meta.{key}`"),
    )
    .with_suggestion("this is a defect in the MCP client, not in the arguments: remove the run id from the request (every call of a session runs in the session's own run), or ask the server's operator to accept client run ids; do not retry as is")
}

/// An MCP request with no session and no run named calls `tool`, whose key needs a run
/// (`ctx.run_id`, `ctx.step`). `may_name`: the server accepts the run ids clients name.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn run_required(tool: &str, may_name: bool) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("`{tool}` keys each action by its run (`ctx.run_id` or `ctx.step`), and this request names no run and belongs to no MCP session, so nothing ran: a run made for one request would be made again for its retry, and the retry would act again"),
    )
    .with_suggestion(match may_name {
        true => "name the run in the request's `_meta[\"toolkey/run_id\"]`, the same on every retry of this call, or call within an MCP session (`initialize`); do not retry as is",
        false => "call within an MCP session (`initialize` first): this server does not accept run ids named in `_meta`; do not retry as is",
    })
}

/// An MCP request names a run id or event id (`_meta.{key}`) to be scoped to its session, and
/// belongs to none.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn no_session_for_run(key: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("this server keeps the run ids clients name per MCP session, and this request names `_meta.{key}` without one, so nothing ran"),
    )
    .with_suggestion("call within an MCP session (`initialize` first), naming the same run on every retry of this call; do not retry as is")
}

/// A body asked for state of a type the toolbox was not given.
pub(crate) fn no_state(type_name: &str) -> ToolError {
    ToolError::internal(format!(
        "no state of type `{type_name}` in the toolbox: add it with Toolbox::builder().state(..)"
    ))
}

// ---------------------------------------------------------------------------------------------
// The toolbox

/// UNKNOWN_TOOL with `message`, suggesting the tools that exist.
pub(crate) fn no_such_tool<'a>(
    message: String,
    names: impl IntoIterator<Item = &'a str>,
) -> ToolError {
    let names: Vec<&str> = names.into_iter().collect();
    ToolError::new(ErrorCode::UnknownTool, message)
        .with_suggestion(format!("use one of: {}", names.join(", ")))
}

/// The message of UNKNOWN_TOOL for a call naming `name`.
pub(crate) fn unknown_tool(name: &str) -> String {
    format!("there is no tool named `{name}`")
}

/// The message of UNKNOWN_TOOL for a provider's call that names no tool.
pub(crate) const NO_TOOL_NAMED: &str = "the tool call names no tool";

/// An `unkeyed` tool's call was not approved.
pub(crate) fn not_approved(tool: &str) -> ToolError {
    ToolError::new(
        ErrorCode::ApprovalRequired,
        format!("`{tool}` has effects and no idempotency key, and this call was not approved"),
    )
    .with_suggestion("ask the user to approve this action before calling again")
}

/// The task running a call ended without an answer (`problem`: the runtime's words).
pub(crate) fn task_failed(tool: &str, problem: &str) -> ToolError {
    ToolError::internal(format!("the task of `{tool}` failed: {problem}"))
}

/// The caller stopped waiting after `limit`: what a retry would do depends on the story.
pub(crate) fn timed_out(def: Named<'_>, story: Story, limit: Duration) -> ToolError {
    let message = format!(
        "`{}` did not answer within {}; it may still finish",
        def.tool,
        humantime::format_duration(limit)
    );
    match story {
        Story::Unkeyed => ToolError::new(ErrorCode::Timeout, message)
            .with_retryable(false)
            .with_suggestion("the outcome is unknown: do not repeat this call; ask the user to check whether it happened"),
        Story::Idempotent if def.per_call => ToolError::new(ErrorCode::Timeout, message)
            .with_retryable(false)
            .with_suggestion(format!(
                "the outcome is unknown, and {NEW_CALL_NEW_ACTION}: do not call `{}` again; ask the user to check whether it happened",
                def.tool
            )),
        Story::Idempotent => {
            let status = match def.status {
                Some(status) => format!("call `{status}` with the same arguments to learn the outcome, or "),
                None => String::new(),
            };
            ToolError::new(ErrorCode::Timeout, message)
                .with_retryable(true)
                .with_suggestion(format!("{status}call again with the same arguments: it will not run twice"))
        }
        Story::ReadOnly | Story::Natural => ToolError::new(ErrorCode::Timeout, message)
            .with_retryable(true)
            .with_suggestion("call again with the same arguments"),
    }
}

// ---------------------------------------------------------------------------------------------
// Retry limits and concurrency limits

/// The same call failed `failures` times within `window` (each time with an answer that invited
/// a retry), and its tool's retry limit allows no more. `last`: the code of the failure this
/// answer replaces, when the limit was reached by this very call.
/// A keyed tool's failures are counted by its key (`by_key`), whatever the other arguments:
/// the texts say so, since a call with other arguments under the key is refused too.
pub(crate) fn retry_limit(
    tool: &str,
    by_key: bool,
    failures: u64,
    window: Duration,
    last: Option<&str>,
) -> ToolError {
    let window = humantime::format_duration(window);
    let (counted, these) = match by_key {
        true => (
            "for this key (every call with the same key counts, whatever its other arguments)",
            "for this key",
        ),
        false => ("with these arguments", "with these arguments"),
    };
    let message = match last {
        Some(code) => format!(
            "`{tool}` failed again (`{code}`): it has now failed {failures} times {counted} within {window}, its retry limit"
        ),
        None => format!(
            "`{tool}` failed {failures} times {counted} within {window}, its retry limit, so it was not run again"
        ),
    };
    ToolError::new(ErrorCode::RetryLimit, message)
        .with_retryable(false)
        .with_suggestion(format!(
            "stop calling `{tool}` {these}: retrying will not help now; tell the user that it keeps failing, and let them decide what to do"
        ))
}

/// What is known of the steps (`ctx.once`) a call that reached its retry limit finished before
/// it failed: their effects are kept, whatever the call's later failures.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StepsKept<'a> {
    /// These steps of this very call finished.
    Named(&'a [Box<str>]),
    /// A step of an attempt of the call finished (as the store remembers it).
    Some,
    /// Whether a step finished could not be read.
    Maybe,
}

/// [`retry_limit`] for a keyed call a step of which finished before the call failed: part of
/// the action was done and is kept, so the answer says so, and that the user must not do the
/// action another way (pay by hand what was already charged).
pub(crate) fn retry_limit_after_steps(
    def: Named<'_>,
    failures: u64,
    window: Duration,
    last: Option<&str>,
    steps: StepsKept<'_>,
) -> ToolError {
    let limit = retry_limit(def.tool, !def.per_call, failures, window, last);
    let these = match def.per_call {
        true => "with these arguments",
        false => "for this key",
    };
    let (done, told) = match steps {
        StepsKept::Named(names) => {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            let (step, is) = match names.len() {
                1 => ("step", "was"),
                _ => ("steps", "were"),
            };
            let names = names.join(", ");
            (
                format!("part of the action was done: {step} {names} of this call finished before it failed, and what {is} done is kept (it is not undone)"),
                format!("that {step} {names} of the action {is} done and is kept, and the rest was not"),
            )
        }
        StepsKept::Some => (
            "part of the action was done: a step of an earlier attempt of this call finished, and what it did is kept (it is not undone)".to_string(),
            "that part of the action was done and is kept, and the rest was not".to_string(),
        ),
        StepsKept::Maybe => (
            "part of the action may have been done: whether a step of an earlier attempt finished could not be read, and what a step did is kept (it is not undone)".to_string(),
            "that part of the action may have been done and is kept".to_string(),
        ),
    };
    ToolError::new(ErrorCode::RetryLimit, format!("{}; {done}", limit.message()))
        .with_retryable(false)
        .with_suggestion(format!(
            "stop calling `{}` {these}: retrying will not help now; tell the user {told}, and that they must not redo the action by other means (it would be done twice); let them decide how to finish it",
            def.tool
        ))
}

/// [`retry_limit`] for a keyed call whose record is kept unknown: its last attempt may have
/// acted (a reply lost, a lookup that could not look), so the answer says the action may have
/// happened, never only that it keeps failing (the user could do it again by hand).
pub(crate) fn retry_limit_unknown(
    def: Named<'_>,
    failures: u64,
    window: Duration,
    last: Option<&str>,
) -> ToolError {
    let limit = retry_limit(def.tool, !def.per_call, failures, window, last);
    let these = match def.per_call {
        true => "with these arguments",
        false => "for this key",
    };
    let check = match def.status {
        Some(status) => format!(
            "`{status}` with the same arguments tells what is recorded, and a person can check the outside system"
        ),
        None => "a person must check the outside system".to_string(),
    };
    ToolError::new(
        ErrorCode::RetryLimit,
        format!(
            "{}; whether `{}` acted is unknown: its outcome was never recorded",
            limit.message(),
            def.tool
        ),
    )
    .with_retryable(false)
    .with_suggestion(format!(
        "stop calling `{}` {these}, and do not do the action another way: it may have been done; tell the user it is unknown whether it happened ({check})",
        def.tool
    ))
}

/// The tool's concurrency limit (`slots` bodies at once) was reached, and no slot freed within
/// `waited`: nothing ran.
pub(crate) fn busy(tool: &str, slots: usize, waited: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::Busy,
        format!(
            "`{tool}` is busy: {slots} of its calls are running, its limit, and none ended within {}; this call did not run",
            humantime::format_duration(waited)
        ),
    )
    .with_retryable(true)
    .with_suggestion("nothing was done: call again with the same arguments a little later")
}

// ---------------------------------------------------------------------------------------------
// The keyed path

/// A keyed tool's `prepare` gave no key: a defect of the tool's implementation.
pub(crate) fn keyed_without_key(tool: &str) -> ToolError {
    ToolError::internal(format!("`{tool}` is idempotent but prepared no key"))
}

/// An operator asked for the record of a tool that keeps none.
pub(crate) fn no_record_key(tool: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("`{tool}` has no idempotency key, so its calls leave no record"),
    )
    .with_retryable(false)
}

/// The same key is running in another call.
pub(crate) fn in_progress(def: Named<'_>, since: SystemTime) -> ToolError {
    ToolError::new(
        ErrorCode::InProgress,
        format!(
            "`{}` with these arguments is already running (started {})",
            def.tool,
            ago(since)
        ),
    )
    .with_suggestion(match def.per_call {
        true => format!(
            "it is still running, and {NEW_CALL_NEW_ACTION}: do not call `{}` again; ask the user to check later whether it happened",
            def.tool
        ),
        false => format!("{}; do not start it again", status_hint(def)),
    })
}

/// What the record of another action under a call's key says of it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Other {
    /// Its outcome is recorded.
    Ran,
    /// It holds the key, its lease kept.
    Running,
    /// It stopped renewing its lease, or said it could not tell whether it acted.
    Unknown,
}

/// The same key ran, runs, or was left unknown with other arguments.
pub(crate) fn conflict(def: Named<'_>, other: Other) -> ToolError {
    let when = match other {
        Other::Ran => "already ran under this call's key",
        Other::Running => "is running under this call's key",
        Other::Unknown => "started under this call's key, and its outcome is unknown",
    };
    ToolError::new(
        ErrorCode::Conflict,
        format!(
            "another action {when}: a `{}` call with different arguments, or a call of another tool that builds the same key; this call would be a second, different action under that key",
            def.tool
        ),
    )
    .with_suggestion("ask the user before changing or adding to what was done")
}

/// An earlier call of this key stopped without recording its outcome (`reported`: it said it
/// could not tell), and there is no recover hook to look.
pub(crate) fn outcome_unknown(def: Named<'_>, since: SystemTime, reported: bool) -> ToolError {
    let why = if reported {
        "could not tell whether it acted"
    } else {
        "stopped without recording its outcome (a crash or a lost worker)"
    };
    let check = match def.status {
        Some(status) => format!("call `{status}`, or ask a person to check the outside system"),
        None => "ask a person to check the outside system".to_string(),
    };
    ToolError::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "an earlier `{}` call for this key (started {}) {why}",
            def.tool,
            ago(since)
        ),
    )
    .with_suggestion(format!("do not repeat the action; {check}"))
}

// A constructor with toolkey's own words: defined here, beside the words, so that `error` (the
// type) needs nothing of `texts`.
impl ToolError {
    /// The body could not tell whether its effect happened (the request went out, the reply was
    /// lost). The key is kept as *unknown*: the next call asks the tool's `recover` hook, and
    /// without one answers `OUTCOME_UNKNOWN`.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        ToolError::new(ErrorCode::OutcomeUnknown, message)
            .with_suggestion(
                "do not repeat the action; check its status, or ask a person to look in the outside system",
            )
            .with_mark(Mark::UnfittedSuggestion)
    }
}

/// `err` with the suggestion every [`ToolError::outcome_unknown`] starts with (a body's own, a
/// panic's) fitted to the tool that answered: the status tool it has, or a person when it has
/// none; for a tool whose repetition changes nothing more (`read_only`, `natural`), that calling
/// again is safe. A suggestion the tool wrote itself is kept.
pub(crate) fn fit_unknown(err: ToolError, def: Named<'_>, story: Story) -> ToolError {
    if err.mark() != Mark::UnfittedSuggestion {
        return err;
    }
    let tool = def.tool;
    match story {
        Story::ReadOnly => err.with_retryable(true).with_suggestion(format!(
            "`{tool}` only reads, so calling again is safe: call it once more with the same arguments, and if it fails again tell the user it is failing"
        )),
        Story::Natural => err.with_retryable(true).with_suggestion(format!(
            "repeating `{tool}` has no further effect, so calling again is safe: call it once more with the same arguments, and if it fails again tell the user it is failing"
        )),
        Story::Idempotent | Story::Unkeyed => {
            let check = match def.status {
                Some(status) => format!(
                    "call `{status}` with the same arguments, or ask a person to look in the outside system"
                ),
                None => "ask a person to look in the outside system".to_string(),
            };
            err.with_suggestion(format!("do not repeat the action; {check}"))
        }
    }
}

/// With a recover hook, a retry after an unknown outcome looks before it acts: say so. Not for
/// a tool keyed on its place in the run (`per_call`): the model's retry has a key of its own, and
/// nothing to look up under it.
pub(crate) fn looked_up_on_retry(err: ToolError, has_recover: bool, per_call: bool) -> ToolError {
    if has_recover && !per_call && err.is(ErrorCode::OutcomeUnknown) {
        ToolError::new(ErrorCode::OutcomeUnknown, err.message().to_string())
            .with_retryable(true)
            .with_suggestion("call again with the same arguments: the retry looks the outcome up before acting, so it will not act twice")
    } else {
        err
    }
}

/// The body (or the recover hook) returned `Ok`, and its result cannot be serialized: the
/// effect happened, so the outcome is unknown, never a failure.
pub(crate) fn unrecordable_result(problem: &str) -> ToolError {
    let problem = without_values(problem);
    ToolError::new(
        ErrorCode::OutcomeUnknown,
        format!("the tool acted, but its result cannot be recorded ({problem}), so it is kept as unknown"),
    )
    .with_suggestion("do not repeat the action: it was done; ask a person to look up its result in the outside system")
}

/// A panic's answer (`part`: "body" or "recover hook" of `what`). The panic's message is left
/// out: it can hold argument values, and the panic hook has already printed it where the
/// process logs.
pub(crate) fn panicked(what: impl std::fmt::Display, part: &str) -> ToolError {
    ToolError::outcome_unknown(format!("the {part} of {what} panicked"))
}

/// The work finished, but its lease had lapsed and the key was no longer its own: another call
/// took it over, or a person resolved the record. The store cannot tell which, so both are named.
pub(crate) fn lease_lost(what: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::LeaseLost,
        format!("{what} finished, but its reservation lapsed while it ran (it could not be renewed in time) and its outcome could not be recorded: another call took the key over, or a person judged this call dead and resolved its record (as done, or as not done and another call ran since); the action may have happened twice"),
    )
    .with_suggestion("do not repeat the action; ask a person to check the outside system for a duplicate")
}

/// What a replay's text says to the model beside the earlier call's result, so the model does
/// not tell the user the work was done again.
pub(crate) const REPLAY_NOTE: &str = "This action had already been done by an earlier call with the same arguments, and it was not done again: `result` is that earlier call's result. Tell the user it had already been done, not that it was done now.";

/// [`REPLAY_NOTE`] as an MCP result's second text block, after the block that holds the result
/// (an MCP result has no `result` field).
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) const MCP_REPLAY_NOTE: &str = "This action had already been done by an earlier call with the same arguments, and it was not done again: the result above is that earlier call's result. Tell the user it had already been done, not that it was done now.";

fn status_hint(def: Named<'_>) -> String {
    match def.status {
        Some(status) => format!("call `{status}` with the same arguments to follow it"),
        None => "wait, then call again with the same arguments".to_string(),
    }
}

fn ago(since: SystemTime) -> String {
    match SystemTime::now().duration_since(since) {
        Ok(d) => format!("{:.1} s ago", d.as_secs_f64()),
        Err(_) => "just now".to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Steps (`ctx.once`)

/// `ctx.once` outside a keyed tool's body.
pub(crate) fn step_outside_keyed_tool(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        format!(
            "ctx.once(\"{step}\") needs a keyed tool: only an `idempotent` tool's steps have a key"
        ),
    )
}

/// A step name outside the grammar.
pub(crate) fn bad_step_name(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        format!("step name {step:?} must be 1 to 64 ASCII letters, digits, `-`, `_` or `.`"),
    )
}

/// A step of this key already ran, or runs, for a call with other arguments. `per_call`: the
/// tool is keyed on its place in the run, so a new call would not finish the earlier action.
pub(crate) fn step_conflict(step: &str, per_call: bool) -> ToolError {
    ToolError::new(
        ErrorCode::Conflict,
        format!("step `{step}` of this key already ran for a call with different arguments; this call would be a second, different action under the same key"),
    )
    .with_suggestion(match per_call {
        true => "ask the user before changing or adding to what was done",
        false => "ask the user before changing or adding to what was done; to finish the earlier action, call again with its arguments",
    })
}

/// A step of this key is running in another call.
pub(crate) fn step_in_progress(step: &str, per_call: bool) -> ToolError {
    ToolError::new(
        ErrorCode::InProgress,
        format!("step `{step}` of this call is running in another call"),
    )
    .with_suggestion(match per_call {
        true => format!("the other call may still act, and {NEW_CALL_NEW_ACTION}: do not call again; ask the user to check later what was done"),
        false => "wait, then call again with the same arguments: finished steps are not done again".to_string(),
    })
}

/// A step name used twice in one call: the step would be skipped, answered with the first
/// one's result or error.
pub(crate) fn step_reused(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        format!("step `{step}` was already used in this call, and a step runs once: each step of a call needs a name of its own (a loop names each round, as `{step}-1`, `{step}-2`), or the later ones would be skipped; this one did not run, and the tool's code must be fixed"),
    )
    .with_suggestion("do not repeat the action: what finished before it is done; tell the user that the tool is defective and what it reported")
}

/// A retryable failure of a tool keyed on its place in the run, after steps of the call
/// finished: the model's retry, a new call, would do them again.
pub(crate) fn steps_done_per_call(err: ToolError) -> ToolError {
    err.with_retryable(false).with_suggestion(format!("steps of this call finished before it failed, and {NEW_CALL_NEW_ACTION}: it would do them again, so do not call again; ask the user to check what was done"))
}

/// A step started earlier and never recorded its outcome, and nothing has looked it up.
pub(crate) fn step_unknown(step: &str) -> ToolError {
    ToolError::outcome_unknown(format!(
        "step `{step}` started earlier and never recorded whether it acted"
    ))
}

/// A step's recorded result no longer deserializes into the type the step returns (the call's
/// key is freed, not recorded with this).
pub(crate) fn step_result_unfit(step: &str, problem: &str) -> ToolError {
    let problem = without_values(problem);
    ToolError::internal(format!(
        "the recorded result of step `{step}` no longer fits its type: {problem}; the step did its work, and will not run again"
    ))
    .with_suggestion("do not repeat the action: the step's work is done, and this call can finish only once the tool's code reads its result; tell the user that the tool is defective and what it reported")
}

/// A step acted, and its result cannot be recorded (it does not serialize, or would not read
/// back into its type): unknown, never a failure, or a retry would act again.
pub(crate) fn step_unrecordable(step: &str, problem: &str) -> ToolError {
    let problem = without_values(problem);
    ToolError::outcome_unknown(format!(
        "step `{step}` acted, but its result cannot be recorded: {problem}"
    ))
}

/// serde's account of a problem with the values it quotes left out (`string "…"`, `integer
/// `…``): a result can hold an argument, and no text a model reads carries one. The names it
/// takes from the type, a missing or duplicate field's, are kept.
fn without_values(problem: &str) -> String {
    let mut kept = String::with_capacity(problem.len());
    let mut chars = problem.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                kept.push_str("\"…\"");
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
            }
            '`' => {
                let named = ["missing field ", "duplicate field "]
                    .iter()
                    .any(|field| kept.ends_with(field));
                let quoted: String = chars.by_ref().take_while(|&c| c != '`').collect();
                kept.push('`');
                kept.push_str(if named { &quoted } else { "…" });
                kept.push('`');
            }
            c => kept.push(c),
        }
    }
    kept
}

// ---------------------------------------------------------------------------------------------
// Stores

/// What kind of store failure stopped a call: a `StoreError` says which (its `refusal` builds the
/// answer), and its text goes in as `problem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreFailure {
    /// Not reached, or no answer.
    Unreachable,
    /// Configured wrongly.
    Misconfigured,
    /// A stored record could not be read.
    Corrupt,
}

/// A store failure before the tool ran: only an unreachable store is worth retrying.
pub(crate) fn store_error(failure: StoreFailure, problem: &str) -> ToolError {
    let message = format!("{problem}; the tool did not run");
    match failure {
        StoreFailure::Misconfigured => ToolError::new(ErrorCode::StoreUnavailable, message)
            .with_suggestion("do not retry: the tool's store is misconfigured; tell the user that an operator must fix it"),
        StoreFailure::Corrupt => ToolError::new(ErrorCode::StoreCorrupt, message)
            .with_suggestion("do not repeat the action; a person must look at the stored record"),
        StoreFailure::Unreachable => ToolError::new(ErrorCode::StoreUnavailable, message)
            .with_retryable(true)
            .with_suggestion("retry shortly: nothing was done"),
    }
}

/// A store failure met by a step: earlier steps may have acted, so "nothing was done" would not
/// be true; the step itself did not run. A misconfigured or corrupt store keeps its own answer.
pub(crate) fn step_store_error(
    step: &str,
    failure: StoreFailure,
    problem: &str,
    per_call: bool,
) -> ToolError {
    match failure {
        // The steps before this one would run again in a new call.
        StoreFailure::Unreachable if per_call => ToolError::new(
            ErrorCode::StoreUnavailable,
            format!("the store could not be reached, so step `{step}` did not run"),
        )
        .with_suggestion(format!(
            "the steps before it may have acted, and {NEW_CALL_NEW_ACTION}: do not call again; ask the user to check what was done"
        )),
        StoreFailure::Unreachable => ToolError::new(
            ErrorCode::StoreUnavailable,
            format!("the store could not be reached, so step `{step}` did not run"),
        )
        .with_retryable(true)
        .with_suggestion(
            "retry shortly with the same arguments: finished steps are not done again",
        ),
        _ => store_error(failure, problem),
    }
}

// ---------------------------------------------------------------------------------------------
// MCP tasks

/// A task's status message while its call still runs.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn task_working(tool: &str) -> String {
    format!("`{tool}` is still running; poll again for its result")
}

/// The result of a task whose call ended without recording an outcome: a failure its tool
/// marked as safe to retry released the key, and the answer went with it; or the call stopped
/// (a crash) and another call took the key over, so the record is that call's now.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn task_unrecorded(code: &'static str, def: Named<'_>) -> ToolError {
    match def.per_call {
        // Steps of the call may have acted, and a new call would do them again.
        true => ToolError::new(
            code,
            format!("`{}` ended without recording an outcome, so its answer was not kept", def.tool),
        )
        .with_retryable(false)
        .with_suggestion(format!(
            "{NEW_CALL_NEW_ACTION}: do not call again; ask the user to check what was done"
        )),
        false => ToolError::new(
            code,
            format!(
                "`{}` ended without recording an outcome under this task (a failure safe to retry freed its key, or another call took the key over after this one stopped), so its answer was not kept",
                def.tool
            ),
        )
        .with_retryable(true)
        .with_suggestion("call again with the same arguments: it will not run twice"),
    }
}

/// The JSON-RPC error message for a task id this caller has no task under.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) const TASK_NOT_FOUND: &str =
    "no such task: it was never created for this caller, or it has expired";

/// The JSON-RPC error message for a task the store could not be asked about (`problem`: the
/// store's words).
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn task_unreadable(problem: &str) -> String {
    format!("the task could not be read ({problem}); ask again shortly")
}

// ---------------------------------------------------------------------------------------------
// Status companions

/// A status answer's note when the arguments gave fields beside the key but not a whole call
/// (`err`: the target's refusal, naming what is missing), so the record was checked against
/// the key alone.
pub(crate) fn status_partial_call(target: &str, err: &ToolError) -> String {
    format!(
        "only the key was checked: the arguments beside it are not a whole `{target}` call ({}), so whether this record is theirs is not known; give every argument of the `{target}` call asked about to learn whether this record is that call's, not another action's under the same key",
        err.message()
    )
}

/// The description of `target`'s status companion, written here once, not in every expansion.
pub(crate) fn status_description(target: &str) -> String {
    format!(
        "Read-only. Tells whether `{target}` already ran for these values and what it returned: not_found, in_progress, completed (with its result), failed (with its error), unknown, or conflict (another action holds the key: these values did not run). Call it with the same arguments as the `{target}` call when that call timed out or its outcome is unclear, before calling `{target}` again."
    )
}

/// A status answer's detail when the key has no record: no call ran, or one that failed in a way
/// safe to retry freed the key (steps it finished keep their own records, so a step may have
/// acted: a charge made before a later step failed), or the record's retention ended.
pub(crate) fn status_not_found(target: &str) -> String {
    format!(
        "no `{target}` call with these values is running or recorded as finished: none ran, or one failed in a way that is safe to retry (any step it finished, such as a payment, is kept and not done again when `{target}` is called again), or its record's retention ended"
    )
}

/// A status answer's detail when no record is held, and a failed `target` call with these
/// values had finished a step (as its retry limit's count remembers): part of the action was
/// done.
pub(crate) fn status_not_found_after_steps(target: &str) -> String {
    format!(
        "no `{target}` call with these values is running or recorded as finished, but one failed after a step of it finished: part of the action was done; any step it finished, such as a payment, is kept and not done again when `{target}` is called again; tell the user so, and that they must not redo the action by other means"
    )
}

/// A status answer's detail when the key's record was made by another action than the one the
/// arguments describe.
pub(crate) fn status_conflict(target: &str) -> String {
    format!(
        "another action holds this key (a `{target}` call with other arguments, or a call of another tool that builds the same key): `{target}` has not run with these arguments, and a `{target}` call with them is refused with CONFLICT"
    )
}

/// A status answer's note when the arguments named the key but not a whole call, so the record
/// could not be checked against them.
pub(crate) fn status_key_only(target: &str) -> String {
    format!(
        "only the key was checked, since no argument of `{target}` that tells calls under one key apart was given: give them as the `{target}` call had them (a default spelled out) to learn whether this record is that call's, not another action's under the same key"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    const STORIES: [Story; 4] = [
        Story::ReadOnly,
        Story::Idempotent,
        Story::Natural,
        Story::Unkeyed,
    ];

    fn named(status: Option<&str>) -> Named<'_> {
        Named {
            tool: "send_invoice",
            status,
            per_call: false,
        }
    }

    /// A tool keyed on its place in the run (`refund:<ctx.run_id>:<ctx.step>`).
    fn per_call() -> Named<'static> {
        Named {
            tool: "refund",
            status: None,
            per_call: true,
        }
    }

    /// Every error text this module writes, from the names a call has (tool, step, field,
    /// type, setting) and the words of the libraries below (serde, the store's driver).
    fn every_error() -> Vec<ToolError> {
        let since = SystemTime::now() - Duration::from_secs(3);
        let mut errors = vec![
            arguments_not_an_object("send_invoice", "an array"),
            invalid_arguments(
                "send_invoice",
                ".",
                "missing field `amount`",
                Some("amount"),
                Some("number (Amount in EUR.)"),
            ),
            invalid_arguments(
                "send_invoice",
                "amount",
                "invalid type",
                Some("amount"),
                None,
            ),
            invalid_arguments("send_invoice", ".", "expected a map", None, None),
            arguments_not_json("send_invoice", "expected value at line 1 column 1"),
            provider_arguments_not_an_object("send_invoice", "a string"),
            wrong_item_type("tool_use", "text"),
            unfingerprintable("a number that is not finite"),
            control_character("customer", false),
            control_character("tenant", true),
            missing_context("step"),
            #[cfg(feature = "rig")]
            no_run_context(),
            bad_meta("toolkey/step", "a non-negative integer"),
            client_run_id_refused("RUN_ID_NOT_ACCEPTED", "toolkey/run_id"),
            run_required("refund", true),
            run_required("refund", false),
            no_session_for_run("toolkey/run_id"),
            no_state("app::Billing"),
            no_such_tool(
                unknown_tool("send_invoic"),
                ["send_invoice", "invoice_status"],
            ),
            no_such_tool(NO_TOOL_NAMED.into(), ["send_invoice"]),
            not_approved("wire_money"),
            task_failed("send_invoice", "task 7 was cancelled"),
            keyed_without_key("send_invoice"),
            looked_up_on_retry(
                ToolError::outcome_unknown("the payment provider timed out"),
                true,
                false,
            ),
            unrecordable_result("key must be a string"),
            panicked("`send_invoice`", "body"),
            lease_lost("`send_invoice`"),
            step_outside_keyed_tool("email"),
            bad_step_name("e mail"),
            step_conflict("email", false),
            step_conflict("email", true),
            step_in_progress("email", false),
            step_in_progress("email", true),
            step_reused("email"),
            step_unknown("email"),
            step_result_unfit("email", "invalid type: map, expected a string"),
            step_result_unfit(
                "email",
                "invalid type: string \"invoice:acme:2026-10\", expected u64",
            ),
            step_unrecordable("email", "unknown variant `2026-10`, expected `a` or `b`"),
            step_unrecordable("email", "key must be a string"),
            StoreError::Unavailable("connection refused".into()).refusal(),
            StoreError::Config("invalid table name".into()).refusal(),
            StoreError::Corrupt {
                tenant: "acme".into(),
                key: "invoice:acme:2026-10".into(),
                detail: "unknown state".into(),
            }
            .refusal(),
            StoreError::Unavailable("connection refused".into()).step_refusal("email", false),
            StoreError::Unavailable("connection refused".into()).step_refusal("email", true),
            StoreError::Config("invalid table name".into()).step_refusal("email", false),
            task_unrecorded("NO_OUTCOME", named(Some("invoice_status"))),
            task_unrecorded("NO_OUTCOME", per_call()),
            steps_done_per_call(
                StoreError::Unavailable("connection refused".into()).step_refusal("email", false),
            ),
            retry_limit("send_invoice", false, 5, Duration::from_secs(600), None),
            retry_limit(
                "send_invoice",
                true,
                5,
                Duration::from_secs(600),
                Some("GATEWAY_BUSY"),
            ),
            busy("send_invoice", 2, Duration::from_secs(2)),
        ];
        let steps: [Box<str>; 2] = ["charge".into(), "email".into()];
        for def in [named(Some("invoice_status")), per_call()] {
            for kept in [
                StepsKept::Named(&steps[..1]),
                StepsKept::Named(&steps),
                StepsKept::Some,
                StepsKept::Maybe,
            ] {
                let window = Duration::from_secs(600);
                errors.push(retry_limit_after_steps(def, 3, window, None, kept));
                errors.push(retry_limit_after_steps(
                    def,
                    3,
                    window,
                    Some("GATEWAY_BUSY"),
                    kept,
                ));
            }
        }
        for status in [None, Some("invoice_status")] {
            let def = named(status);
            for story in STORIES {
                errors.push(timed_out(def, story, Duration::from_secs(2)));
            }
            errors.push(in_progress(def, since));
            for other in [Other::Ran, Other::Running, Other::Unknown] {
                errors.push(conflict(def, other));
            }
            errors.push(outcome_unknown(def, since, true));
            errors.push(outcome_unknown(def, since, false));
        }
        errors.push(timed_out(
            per_call(),
            Story::Idempotent,
            Duration::from_secs(2),
        ));
        errors.push(in_progress(per_call(), since));
        errors
    }

    /// serde quotes the values it could not read; a text about a result keeps the problem
    /// and leaves those out, whatever they hold.
    #[test]
    fn a_serde_problem_is_told_without_the_values_it_quotes() {
        let cases = [
            (
                r#"invalid type: string "ann@example.com", expected struct Contact"#,
                r#"invalid type: string "…", expected struct Contact"#,
            ),
            (
                r#"invalid type: string "a \"quoted\" `one`", expected u64"#,
                r#"invalid type: string "…", expected u64"#,
            ),
            (
                "invalid value: integer `5`, expected a number below 3",
                "invalid value: integer `…`, expected a number below 3",
            ),
            (
                "unknown variant `ann`, expected `a` or `b`",
                "unknown variant `…`, expected `…` or `…`",
            ),
            ("missing field `tags`", "missing field `tags`"),
            ("duplicate field `id`", "duplicate field `id`"),
            (
                "invalid type: null, expected f64",
                "invalid type: null, expected f64",
            ),
            (r#"cut short: string "ann"#, r#"cut short: string "…""#),
            ("cut short: `ann", "cut short: `…`"),
        ];
        for (problem, told) in cases {
            assert_eq!(without_values(problem), told, "{problem}");
        }
    }

    #[test]
    fn no_text_carries_a_key_or_an_argument() {
        // A corrupt record's error is the one text given a key: it names it by hash only.
        let corrupt = StoreError::Corrupt {
            tenant: "acme".into(),
            key: "invoice:acme:2026-10".into(),
            detail: "unknown state".into(),
        }
        .refusal();
        assert!(
            !corrupt.message().contains("invoice:acme:2026-10"),
            "{corrupt:?}"
        );
        assert!(corrupt.message().contains("key hash"), "{corrupt:?}");
        // Every other text is written from names alone: the only arguments of these functions
        // are names, durations, times and library words. A key's value or an argument could only
        // get in through a format string that reads one, and none does.
        for err in every_error() {
            let json = err.to_json().to_string();
            for value in ["invoice:acme:2026-10", "2026-10"] {
                assert!(!json.contains(value), "{value} in {json}");
            }
        }
    }

    #[test]
    fn messages_and_suggestions_read_as_the_model_expects() {
        for err in every_error() {
            let message = err.message();
            assert!(!message.is_empty(), "{err:?}");
            let first = message.chars().next().unwrap();
            assert!(
                !first.is_uppercase(),
                "a message starts in lower case: {message}"
            );
            assert!(!message.ends_with('.'), "no trailing period: {message}");
            if let Some(suggestion) = err.suggestion() {
                assert!(
                    !suggestion.is_empty() && !suggestion.ends_with('.'),
                    "{err:?}"
                );
            }
            // A code toolkey answers with is one of its own.
            assert!(
                err.error_code().is_some()
                    || ["RUN_ID_NOT_ACCEPTED", "NO_OUTCOME"].contains(&err.code()),
                "{err:?}"
            );
        }
    }

    #[test]
    fn task_texts_read_as_the_model_expects() {
        let texts = [
            task_working("send_invoice"),
            TASK_NOT_FOUND.to_string(),
            task_unreadable("connection refused"),
        ];
        for text in texts {
            assert!(!text.starts_with(char::is_uppercase), "{text}");
            assert!(!text.ends_with('.'), "{text}");
        }
        let unrecorded = task_unrecorded("NO_OUTCOME", named(None));
        assert!(unrecorded.is_retryable(), "{unrecorded:?}");
    }

    #[test]
    fn a_timeout_is_retryable_except_for_an_unkeyed_tool() {
        for story in STORIES {
            let err = timed_out(named(None), story, Duration::from_secs(2));
            assert_eq!(err.is_retryable(), story != Story::Unkeyed, "{story:?}");
        }
        let keyed = timed_out(
            named(Some("invoice_status")),
            Story::Idempotent,
            Duration::from_secs(2),
        );
        assert!(keyed.suggestion().unwrap().contains("`invoice_status`"));
    }

    #[test]
    fn a_retry_limit_stops_the_model_and_busy_invites_a_later_retry() {
        let window = Duration::from_secs(600);
        for last in [None, Some("GATEWAY_BUSY")] {
            let err = retry_limit("send_invoice", false, 5, window, last);
            assert!(
                err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
                "{err:?}"
            );
            assert!(err.message().contains("5 times"), "{err:?}");
            assert!(err.message().contains("10m"), "{err:?}");
            let suggestion = err.suggestion().unwrap();
            assert!(
                suggestion.starts_with("stop calling `send_invoice`"),
                "{err:?}"
            );
            assert!(suggestion.contains("tell the user"), "{err:?}");
        }
        let last = retry_limit("send_invoice", false, 5, window, Some("GATEWAY_BUSY"));
        assert!(last.message().contains("`GATEWAY_BUSY`"), "{last:?}");
        let busy = busy("send_invoice", 2, Duration::from_millis(1500));
        assert!(busy.is(ErrorCode::Busy) && busy.is_retryable(), "{busy:?}");
        assert!(busy.message().contains("1s 500ms"), "{busy:?}");
        assert!(busy.suggestion().unwrap().starts_with("nothing was done"));
    }

    /// A tool keyed on its place in the run: the model's retry is a new call with a key of its
    /// own, so no answer after the tool may have acted invites one.
    #[test]
    fn a_tool_keyed_on_its_place_in_the_run_is_never_called_again_on_advice() {
        let since = SystemTime::now();
        let advice = [
            timed_out(per_call(), Story::Idempotent, Duration::from_secs(2)),
            in_progress(per_call(), since),
            looked_up_on_retry(ToolError::outcome_unknown("lost reply"), true, true),
            step_in_progress("email", true),
            StoreError::Unavailable("connection refused".into()).step_refusal("email", true),
            task_unrecorded("NO_OUTCOME", per_call()),
            steps_done_per_call(
                ToolError::new("MAIL_DOWN", "the mail server is down").with_retryable(true),
            ),
        ];
        for err in advice {
            assert!(!err.is_retryable(), "{err:?}");
            let suggestion = err.suggestion().unwrap();
            assert!(suggestion.contains("do not"), "{err:?}");
            assert!(!suggestion.contains("call again with"), "{err:?}");
        }
        let conflict = step_conflict("email", true);
        assert!(!conflict.suggestion().unwrap().contains("call again"));
        // Keyed on the action, the same answers invite the retry that replays.
        let keyed = timed_out(named(None), Story::Idempotent, Duration::from_secs(2));
        assert!(keyed.is_retryable(), "{keyed:?}");
        let looked = looked_up_on_retry(ToolError::outcome_unknown("lost reply"), true, false);
        assert!(looked.is_retryable(), "{looked:?}");
    }

    #[test]
    fn a_keyed_tools_retry_limit_says_it_counts_by_key() {
        let window = Duration::from_secs(600);
        let keyed = retry_limit("transfer", true, 10, window, None);
        assert!(keyed.message().contains("for this key"), "{keyed:?}");
        assert!(
            keyed.message().contains("whatever its other arguments"),
            "{keyed:?}"
        );
        assert!(!keyed.message().contains("these arguments"), "{keyed:?}");
        assert!(keyed
            .suggestion()
            .unwrap()
            .contains("`transfer` for this key"));
        assert!(
            keyed.message().contains("for this key (every call"),
            "{keyed:?}"
        );
        let unkeyed = retry_limit("transfer", false, 10, window, None);
        assert!(
            unkeyed.message().contains("with these arguments"),
            "{unkeyed:?}"
        );
    }

    #[test]
    fn only_an_unreachable_store_is_worth_retrying() {
        let down = StoreError::Unavailable("connection refused".into()).refusal();
        assert!(down.is(ErrorCode::StoreUnavailable) && down.is_retryable());
        let wrong = StoreError::Config("invalid table name".into()).refusal();
        assert!(wrong.is(ErrorCode::StoreUnavailable) && !wrong.is_retryable());
        assert!(wrong.suggestion().unwrap().starts_with("do not retry"));
        // Nor inside a step: a misconfigured store is not "could not be reached".
        let step = StoreError::Config("invalid table name".into()).step_refusal("email", false);
        assert!(!step.is_retryable(), "{step:?}");
        assert!(step.suggestion().unwrap().starts_with("do not retry"));
    }
}
