//! Retry limits and concurrency limits.

use std::time::Duration;

use super::Named;
use crate::{ErrorCode, ToolError};

/// The same call failed `failures` times within `window` (each time with an answer that invited
/// a retry), and its tool's retry limit allows no more. `last`: the code of the failure this
/// answer replaces, when the limit was reached by this very call.
/// A keyed tool's failures are counted by its key (`by_key`), whatever the other arguments:
/// the texts say so, since a call with other arguments under the key is refused too.
pub(crate) fn retry_limit(
    tool: &str,
    by_key: bool,
    failures: u64,
    window: Duration,
    last: Option<&str>,
) -> ToolError {
    let window = humantime::format_duration(window);
    let (counted, these) = match by_key {
        true => (
            "for this key (every call with the same key counts, whatever its other arguments)",
            "for this key",
        ),
        false => ("with these arguments", "with these arguments"),
    };
    let message = match last {
        Some(code) => format!(
            "`{tool}` failed again (`{code}`): it has now failed {failures} times {counted} within {window}, its retry limit"
        ),
        None => format!(
            "`{tool}` failed {failures} times {counted} within {window}, its retry limit, so it was not run again"
        ),
    };
    ToolError::new(ErrorCode::RetryLimit, message)
        .with_retryable(false)
        .with_suggestion(format!(
            "stop calling `{tool}` {these}: retrying will not help now; tell the user that it keeps failing, and let them decide what to do"
        ))
}

/// What is known of the steps (`ctx.once`) a call that reached its retry limit finished before
/// it failed: their effects are kept, whatever the call's later failures.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StepsKept<'a> {
    /// These steps of this very call finished.
    Named(&'a [Box<str>]),
    /// A step of an attempt of the call finished (as the store remembers it).
    Some,
    /// Whether a step finished could not be read.
    Maybe,
}

/// [`retry_limit`] for a keyed call a step of which finished before the call failed: part of
/// the action was done and is kept, so the answer says so, and that the user must not do the
/// action another way (pay by hand what was already charged).
pub(crate) fn retry_limit_after_steps(
    def: Named<'_>,
    failures: u64,
    window: Duration,
    last: Option<&str>,
    steps: StepsKept<'_>,
) -> ToolError {
    let limit = retry_limit(def.tool, !def.per_call, failures, window, last);
    let these = match def.per_call {
        true => "with these arguments",
        false => "for this key",
    };
    let (done, told) = match steps {
        StepsKept::Named(names) => {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            let (step, is) = match names.len() {
                1 => ("step", "was"),
                _ => ("steps", "were"),
            };
            let names = names.join(", ");
            (
                format!("part of the action was done: {step} {names} of this call finished before it failed, and what {is} done is kept (it is not undone)"),
                format!("that {step} {names} of the action {is} done and is kept, and the rest was not"),
            )
        }
        StepsKept::Some => (
            "part of the action was done: a step of an earlier attempt of this call finished, and what it did is kept (it is not undone)".to_string(),
            "that part of the action was done and is kept, and the rest was not".to_string(),
        ),
        StepsKept::Maybe => (
            "part of the action may have been done: whether a step of an earlier attempt finished could not be read, and what a step did is kept (it is not undone)".to_string(),
            "that part of the action may have been done and is kept".to_string(),
        ),
    };
    ToolError::new(ErrorCode::RetryLimit, format!("{}; {done}", limit.message()))
        .with_retryable(false)
        .with_suggestion(format!(
            "stop calling `{}` {these}: retrying will not help now; tell the user {told}, and that they must not redo the action by other means (it would be done twice); let them decide how to finish it",
            def.tool
        ))
}

/// [`retry_limit`] for a keyed call whose record is kept unknown: its last attempt may have
/// acted (a reply lost, a lookup that could not look), so the answer says the action may have
/// happened, never only that it keeps failing (the user could do it again by hand).
pub(crate) fn retry_limit_unknown(
    def: Named<'_>,
    failures: u64,
    window: Duration,
    last: Option<&str>,
) -> ToolError {
    let limit = retry_limit(def.tool, !def.per_call, failures, window, last);
    let these = match def.per_call {
        true => "with these arguments",
        false => "for this key",
    };
    let check = match def.status {
        Some(status) => format!(
            "`{status}` with the same arguments tells what is recorded, and a person can check the outside system"
        ),
        None => "a person must check the outside system".to_string(),
    };
    ToolError::new(
        ErrorCode::RetryLimit,
        format!(
            "{}; whether `{}` acted is unknown: its outcome was never recorded",
            limit.message(),
            def.tool
        ),
    )
    .with_retryable(false)
    .with_suggestion(format!(
        "stop calling `{}` {these}, and do not do the action another way: it may have been done; tell the user it is unknown whether it happened ({check})",
        def.tool
    ))
}

/// The tool's concurrency limit (`slots` bodies at once) was reached, and no slot freed within
/// `waited`: nothing ran.
pub(crate) fn busy(tool: &str, slots: usize, waited: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::Busy,
        format!(
            "`{tool}` is busy: {slots} of its calls are running, its limit, and none ended within {}; this call did not run",
            humantime::format_duration(waited)
        ),
    )
    .with_retryable(true)
    .with_suggestion("nothing was done: call again with the same arguments a little later")
}
