//! Transactional tools: a body whose transaction was rolled back, a commit whose answer was lost.
// Without a database feature no transactional tool can be declared (a `TxBody` has no value),
// and what runs one is never reached.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

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

/// A transactional step failed and its transaction was rolled back: the step wrote nothing,
/// though steps before it may have acted.
pub(crate) fn step_rolled_back(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        format!("step `{step}` failed and its transaction was rolled back: the step wrote nothing"),
    )
    .with_retryable(true)
    .with_suggestion(
        "call again with the same arguments: the steps that finished are not done again",
    )
}

/// A transactional step's commit was sent and its answer lost, and its record could not be read
/// since.
pub(crate) fn step_commit_unconfirmed(step: &str) -> ToolError {
    ToolError::new(
        ErrorCode::StoreUnavailable,
        format!("the database did not confirm the commit of step `{step}`, and could not be read since"),
    )
    .with_retryable(true)
    .with_suggestion("call again with the same arguments shortly: the step answers what was committed, or runs once if nothing was")
}
