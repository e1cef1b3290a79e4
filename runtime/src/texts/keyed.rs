//! The keyed path: a key running, held by another action or left unknown; replays, panics and
//! lapsed leases.

use std::time::SystemTime;

use super::{without_values, Named, NEW_CALL_NEW_ACTION};
use crate::error::Mark;
use crate::story::Story;
use crate::{ErrorCode, ToolError};

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
