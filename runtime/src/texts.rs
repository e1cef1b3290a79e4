//! The texts a model reads: error messages, suggestions and notes. They are part of the API:
//! each says what happened and what to do next in words a model can follow literally, and none
//! carries a key's or an argument's values.

use crate::{ErrorCode, ToolError};

/// A step of this key already ran, or runs, for a call with other arguments.
pub(crate) fn step_conflict(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Conflict,
        format!("step `{step}` of this key already ran for a call with different arguments; this call would be a second, different action under the same key"),
    )
    .with_suggestion("ask the user before changing or adding to what was done; to finish the earlier action, call again with its arguments")
}

/// A step of this key is running in another call.
pub(crate) fn step_in_progress(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InProgress,
        format!("step `{step}` of this call is running in another call"),
    )
    .with_suggestion(
        "wait, then call again with the same arguments: finished steps are not done again",
    )
}

/// A step started earlier and never recorded its outcome, and nothing has looked it up.
pub(crate) fn step_unknown(step: &str) -> ToolError {
    ToolError::outcome_unknown(format!(
        "step `{step}` started earlier and never recorded whether it acted"
    ))
}

/// The work finished, but its lease had lapsed and another call took the key over.
pub(crate) fn lease_lost(what: &str) -> ToolError {
    ToolError::new(
        ErrorCode::LeaseLost,
        format!("{what} finished, but its reservation lapsed while it ran (it could not be renewed in time) and another call took the key over: the action may have happened twice"),
    )
    .with_suggestion("do not repeat the action; ask a person to check the outside system for a duplicate")
}

/// What a replay's text says to the model beside the earlier call's result, so the model does
/// not tell the user the work was done again.
pub(crate) const REPLAY_NOTE: &str = "This action had already been done by an earlier call with the same arguments, and it was not done again: `result` is that earlier call's result. Tell the user it had already been done, not that it was done now.";

/// An MCP request names a run id or event id (`_meta.{key}`) the server does not accept.
pub(crate) fn client_run_id_refused(code: &'static str, key: &str) -> ToolError {
    ToolError::new(
        code,
        format!("this server does not accept client run ids: the request names `_meta.{key}`"),
    )
    .with_suggestion("this is a defect in the MCP client, not in the arguments: remove the run id from the request (every call of a session runs in the session's own run), or ask the server's operator to accept client run ids; do not retry as is")
}
