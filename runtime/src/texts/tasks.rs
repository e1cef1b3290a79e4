//! MCP tasks.

use super::{Named, NEW_CALL_NEW_ACTION};
use crate::ToolError;

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
