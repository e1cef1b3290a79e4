//! The toolbox: a tool that does not exist, a call not approved, a task that failed, a call
//! that did not answer in time.

use std::time::Duration;

use super::{Named, NEW_CALL_NEW_ACTION};
use crate::story::Story;
use crate::{ErrorCode, ToolError};

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
