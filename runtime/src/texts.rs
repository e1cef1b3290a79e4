//! The texts a model reads: error messages and suggestions. They are part of the API: each says
//! what happened and what to do next in words a model can follow literally, and none carries a
//! key's or an argument's values.

use crate::{ErrorCode, ToolError};

/// A step of this key already ran, or runs, for a call with other arguments.
pub(crate) fn step_conflict(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Conflict,
        format!("step `{step}` of this key already ran for a call with different arguments; this call would be a second, different action under the same key"),
    )
    .suggestion("ask the user before changing or adding to what was done; to finish the earlier action, call again with its arguments")
}

/// A step of this key is running in another call.
pub(crate) fn step_in_progress(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InProgress,
        format!("step `{step}` of this call is running in another call"),
    )
    .suggestion("wait, then call again with the same arguments: finished steps are not done again")
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
    .suggestion("do not repeat the action; ask a person to check the outside system for a duplicate")
}
