//! Approvals: a call that waits for a person, was denied, or is not the call a request covers.

use std::time::SystemTime;

use super::Named;
use crate::{ErrorCode, ToolError};

/// The call waits for a person's decision on its request (`revision`), which stays open until
/// `expires_at`. Nothing ran.
pub(crate) fn awaiting_approval(
    def: Named<'_>,
    revision: u64,
    expires_at: SystemTime,
) -> ToolError {
    let follow = match def.status {
        Some(status) => format!(
            ", or call `{status}` with the same arguments, which answers `awaiting_approval` until then"
        ),
        None => String::new(),
    };
    ToolError::new(
        ErrorCode::AwaitingApproval,
        format!(
            "`{}` needs a person's approval before it runs, and nothing was done: approval request {revision} waits for a decision ({})",
            def.tool,
            left(expires_at)
        ),
    )
    .with_retryable(false)
    .with_suggestion(format!(
        "tell the user that a person must approve this action first; once they have decided, call `{}` again with the same arguments{follow}; do not change the arguments, since an approval covers only these",
        def.tool
    ))
}

/// A person denied this exact call.
pub(crate) fn approval_denied(def: Named<'_>, revision: u64) -> ToolError {
    ToolError::new(
        ErrorCode::ApprovalDenied,
        format!(
            "a person denied this `{}` call (approval request {revision}), and nothing was done; the denial is final for these arguments",
            def.tool
        ),
    )
    .with_retryable(false)
    .with_suggestion("tell the user the action was denied; do not call again with the same arguments")
}

/// Another call under the same key, with other arguments, has a request that is open or was
/// decided: this call is not covered by it, and may not replace it.
pub(crate) fn approval_conflict(def: Named<'_>, revision: u64, status: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Conflict,
        format!(
            "a `{}` call with different arguments under this call's key has approval request {revision} ({status}); an approval covers only the arguments it was asked for, so this call is not covered by it and nothing was done",
            def.tool
        ),
    )
    .with_retryable(false)
    .with_suggestion(
        "ask the user before changing the action; to go on with the action as it was asked, call again with the same arguments as then",
    )
}

/// Until when a request stays open, said from now.
fn left(expires_at: SystemTime) -> String {
    match expires_at.duration_since(SystemTime::now()) {
        Ok(d) if d.as_secs() >= 120 => format!("open for another {} min", d.as_secs() / 60),
        Ok(d) => format!("open for another {} s", d.as_secs()),
        Err(_) => "its time is up".to_string(),
    }
}

/// A status companion's detail: the call of `target` waits for a person's decision.
pub(crate) fn status_awaiting_approval(target: &str) -> String {
    format!("this `{target}` call waits for a person's approval and nothing was done yet; tell the user, and call `{target}` again with the same arguments once they have decided")
}

/// A status companion's detail: a person denied the call of `target`.
pub(crate) fn status_approval_denied(target: &str) -> String {
    format!("a person denied this `{target}` call and nothing was done; do not call it again with the same arguments")
}

/// A status companion's detail: the call of `target` was approved and has not run yet.
pub(crate) fn status_approved(target: &str) -> String {
    format!("a person approved this `{target}` call and it has not run yet; call `{target}` again with the same arguments to run it")
}
