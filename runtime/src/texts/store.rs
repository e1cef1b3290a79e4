//! Stores: what a store's failure means for the call it stopped.

use super::NEW_CALL_NEW_ACTION;
use crate::{ErrorCode, ToolError};

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
