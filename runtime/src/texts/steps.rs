//! Steps (`ctx.once`).

use super::{without_values, NEW_CALL_NEW_ACTION};
use crate::{ErrorCode, ToolError};

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
