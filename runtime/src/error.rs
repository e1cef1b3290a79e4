//! The errors a tool call can end in, and the JSON form the model reads.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The error codes toolkey itself produces.
///
/// A tool may use any other code through [`ToolError::new`]; these are the ones the runtime
/// answers with, each with a fixed meaning the model can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The arguments do not fit the tool's schema. Nothing ran and nothing was recorded.
    InvalidArguments,
    /// No tool of that name is in the toolbox.
    UnknownTool,
    /// A call with the same key is running now.
    InProgress,
    /// A call with the same key but other arguments ran or is running.
    Conflict,
    /// The caller stopped waiting; the work may still finish.
    Timeout,
    /// Whether the effect happened cannot be told, and there is no recover hook to find out.
    OutcomeUnknown,
    /// The store could not be reached; the tool did not run.
    StoreUnavailable,
    /// A stored record could not be read; the tool did not run again.
    StoreCorrupt,
    /// An `unkeyed` tool was not approved.
    ApprovalRequired,
    /// A key needs a context field (`ctx.step`, `ctx.tenant`, `ctx.event_id`) the caller did
    /// not set.
    MissingContext,
    /// A defect inside the toolbox or the tool (a panic, a result that cannot be serialized).
    Internal,
    /// The work finished, but its reservation's lease lapsed while it ran (it could not be
    /// renewed in time) and the key was no longer its own (another call took it over, or a
    /// person resolved the record): the action may have happened twice.
    LeaseLost,
    /// The same call failed with retryable errors as many times as its tool's retry limit allows
    /// within the limit's window: it is not run again until the window ends. Not retryable.
    RetryLimit,
    /// The tool's concurrency limit was reached and no slot freed within the tool's timeout;
    /// nothing ran. Retryable.
    Busy,
    /// The call needs a person's approval, recorded as a request that nobody has decided yet;
    /// nothing ran. The same call, made again after the decision, runs if it was approved.
    AwaitingApproval,
    /// A person denied this exact call (its tool, key and arguments); nothing ran, and it
    /// never will under that request. Not retryable.
    ApprovalDenied,
}

impl ErrorCode {
    /// The code as the model sees it, for example `"IN_PROGRESS"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArguments => "INVALID_ARGUMENTS",
            ErrorCode::UnknownTool => "UNKNOWN_TOOL",
            ErrorCode::InProgress => "IN_PROGRESS",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::StoreUnavailable => "STORE_UNAVAILABLE",
            ErrorCode::StoreCorrupt => "STORE_CORRUPT",
            ErrorCode::ApprovalRequired => "APPROVAL_REQUIRED",
            ErrorCode::MissingContext => "MISSING_CONTEXT",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::LeaseLost => "LEASE_LOST",
            ErrorCode::RetryLimit => "RETRY_LIMIT",
            ErrorCode::Busy => "BUSY",
            ErrorCode::AwaitingApproval => "AWAITING_APPROVAL",
            ErrorCode::ApprovalDenied => "APPROVAL_DENIED",
        }
    }

    const ALL: [ErrorCode; 16] = [
        ErrorCode::InvalidArguments,
        ErrorCode::UnknownTool,
        ErrorCode::InProgress,
        ErrorCode::Conflict,
        ErrorCode::Timeout,
        ErrorCode::OutcomeUnknown,
        ErrorCode::StoreUnavailable,
        ErrorCode::StoreCorrupt,
        ErrorCode::ApprovalRequired,
        ErrorCode::MissingContext,
        ErrorCode::Internal,
        ErrorCode::LeaseLost,
        ErrorCode::RetryLimit,
        ErrorCode::Busy,
        ErrorCode::AwaitingApproval,
        ErrorCode::ApprovalDenied,
    ];

    /// The code for a code string, if it is one of toolkey's own.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ErrorCode> for Cow<'static, str> {
    fn from(code: ErrorCode) -> Self {
        Cow::Borrowed(code.as_str())
    }
}

/// An error a tool call ends in: a code, a message, whether a retry is safe, and what to do.
///
/// ```
/// use toolkey::ToolError;
///
/// let err = ToolError::new("PAYMENT_DECLINED", "card declined")
///     .with_retryable(false)
///     .with_suggestion("ask the user for another card");
/// assert_eq!(err.code(), "PAYMENT_DECLINED");
/// assert_eq!(err.to_json()["error"]["retryable"], false);
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolError {
    code: Cow<'static, str>,
    message: String,
    retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    suggestion: Option<String>,
    /// What the runtime needs to know of this error beyond its words: never sent, never stored,
    /// never compared. Texts are for readers; decisions read this.
    #[serde(skip)]
    mark: Mark,
}

/// What the runtime decides by, beside an error's words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Mark {
    #[default]
    None,
    /// [`ToolError::outcome_unknown`]'s suggestion, not yet fitted to the tool that answered.
    UnfittedSuggestion,
    /// Arguments refused as no whole call of the tool (a field of their own missing, or fields
    /// of two branches of a flattened enum), though each value given may be right.
    NotAWholeCall,
}

/// Two errors are equal when a model reads them alike: the mark is left out.
impl PartialEq for ToolError {
    fn eq(&self, other: &Self) -> bool {
        (&self.code, &self.message, self.retryable, &self.suggestion)
            == (
                &other.code,
                &other.message,
                other.retryable,
                &other.suggestion,
            )
    }
}

impl ToolError {
    /// An error with a code of the tool's choosing. Not retryable unless set.
    pub fn new(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ToolError {
            code: code.into(),
            message: message.into(),
            retryable: false,
            suggestion: None,
            mark: Mark::None,
        }
    }

    /// Whether calling again with the same arguments is safe and may succeed.
    ///
    /// For a keyed tool, a retryable error releases the key (the next call runs the body again);
    /// a terminal one is recorded and replayed to every later call with the same key.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// What the model should do next, in words it can act on.
    pub fn with_suggestion(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        if self.mark == Mark::UnfittedSuggestion {
            self.mark = Mark::None;
        }
        self
    }

    /// The error code, for example `"CONFLICT"`.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The code as one of toolkey's own, if it is one.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.code)
    }

    /// True when the code is `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code == code.as_str()
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether a retry with the same arguments is safe.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// What to do next, if the error says.
    pub fn suggestion(&self) -> Option<&str> {
        self.suggestion.as_deref()
    }

    /// The form the model reads:
    /// `{"error": {"code", "message", "retryable", "suggestion"}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "code": self.code,
                "message": self.message,
                "retryable": self.retryable,
                "suggestion": self.suggestion,
            }
        })
    }

    pub(crate) fn invalid_arguments(message: String, suggestion: String) -> Self {
        ToolError::new(ErrorCode::InvalidArguments, message)
            .with_retryable(true)
            .with_suggestion(suggestion)
    }

    pub(crate) fn with_mark(mut self, mark: Mark) -> Self {
        self.mark = mark;
        self
    }

    pub(crate) fn mark(&self) -> Mark {
        self.mark
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ToolError::new(ErrorCode::Internal, message)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<std::convert::Infallible> for ToolError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_form_has_all_four_fields() {
        let err = ToolError::new(ErrorCode::InProgress, "running").with_suggestion("call x_status");
        assert_eq!(
            err.to_json(),
            json!({"error": {"code": "IN_PROGRESS", "message": "running", "retryable": false, "suggestion": "call x_status"}})
        );
        assert_eq!(err.error_code(), Some(ErrorCode::InProgress));
        assert_eq!(ToolError::new("X", "y").error_code(), None);
    }

    #[test]
    fn round_trips_through_serde() {
        let err = ToolError::new("PAYMENT_DECLINED", "no").with_retryable(true);
        let back: ToolError = serde_json::from_str(&serde_json::to_string(&err).unwrap()).unwrap();
        assert_eq!(back, err);
    }
}
