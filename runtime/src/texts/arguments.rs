//! A call's arguments: not an object, not JSON, not as the tool's schema says.

use crate::{ErrorCode, ToolError};

/// What a suggestion says when the arguments are not an object of named fields.
const SEND_AN_OBJECT: &str =
    "send a JSON object with the fields the tool's schema lists, then call again";

/// The arguments are a JSON value of another kind than an object (`kind`: "an array", ...).
pub(crate) fn arguments_not_an_object(tool: &str, kind: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` must be a JSON object of named fields, not {kind}"),
        SEND_AN_OBJECT.into(),
    )
}

/// How `tool`'s refusal of its arguments begins; a problem at the top follows it directly.
fn invalid_arguments_prefix(tool: &str) -> String {
    format!("invalid arguments for `{tool}`: ")
}

/// The arguments do not fit the tool's schema. `path` is the field serde names (`.` for the
/// whole object), `problem` serde's words; the suggestion names the field and, when the schema
/// says, what it expects (`expected`).
pub(crate) fn invalid_arguments(
    tool: &str,
    path: &str,
    problem: &str,
    field: Option<&str>,
    expected: Option<&str>,
) -> ToolError {
    let message = match path {
        "." => format!("{}{problem}", invalid_arguments_prefix(tool)),
        _ => format!("{}`{path}`: {problem}", invalid_arguments_prefix(tool)),
    };
    let suggestion = match (field, expected) {
        (Some(field), Some(expected)) => format!("send `{field}` as {expected}, then call again"),
        (Some(field), None) => {
            format!("fix `{field}` as the tool's schema describes, then call again")
        }
        (None, _) => FIX_AS_THE_SCHEMA_SAYS.into(),
    };
    ToolError::invalid_arguments(message, suggestion)
}

/// A provider's arguments string is not JSON (`problem`: the parser's words).
pub(crate) fn arguments_not_json(tool: &str, problem: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` are not valid JSON: {problem}"),
        SEND_ONE_OBJECT.into(),
    )
}

/// A provider's arguments are a JSON value of another kind than an object.
pub(crate) fn provider_arguments_not_an_object(tool: &str, kind: &str) -> ToolError {
    ToolError::invalid_arguments(
        format!("the arguments for `{tool}` must be a JSON object, not {kind}"),
        SEND_ONE_OBJECT.into(),
    )
}

const FIX_AS_THE_SCHEMA_SAYS: &str =
    "fix the arguments as the tool's schema describes, each field of the type it gives, then call again";

const SEND_ONE_OBJECT: &str =
    "send the arguments as one JSON object with the fields the tool's schema lists, then call again";

/// A message item of the wrong type (a `text` block where a `tool_use` was expected).
pub(crate) fn wrong_item_type(expected: &str, found: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("expected a `{expected}` item, got `{found}`"),
    )
    .with_suggestion(format!("send tool calls as `{expected}` items"))
}

/// The arguments cannot be fingerprinted (`problem`: why).
pub(crate) fn unfingerprintable(problem: &str) -> ToolError {
    ToolError::internal(format!("cannot fingerprint the arguments: {problem}"))
}
