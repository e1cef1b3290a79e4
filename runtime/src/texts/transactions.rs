//! Transactional tools: a body whose transaction was rolled back, a commit whose answer was lost.

use crate::{ErrorCode, ToolError};

/// The body's transaction was rolled back (the body failed, panicked, or the database ended the
/// transaction before its commit was sent): nothing of the call was kept.
pub(crate) fn rolled_back(tool: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        format!("`{tool}` failed and its transaction was rolled back: nothing was done"),
    )
    .with_retryable(true)
    .with_suggestion("call again with the same arguments: it runs once")
}

/// The commit was sent and its answer lost, and the record could not be read since. Whatever
/// the database did, the retry is safe: the key's record is there, completed, only if the commit
/// landed.
pub(crate) fn commit_unconfirmed(tool: &str) -> ToolError {
    ToolError::new(
        ErrorCode::StoreUnavailable,
        format!("the database did not confirm the commit of `{tool}`, and could not be read since"),
    )
    .with_retryable(true)
    .with_suggestion("call again with the same arguments shortly: it answers what was committed, or runs once if nothing was")
}
