//! Tool calls in, tool results out: each LLM API's tool-call message run through a [`Toolbox`],
//! and the result as the message that API expects back.
//!
//! | API | call in | result out | module |
//! |---|---|---|---|
//! | OpenAI Chat Completions | a `tool_calls` entry | `{"role": "tool", "tool_call_id", "content"}` | [`openai`] |
//! | OpenAI Responses | a `function_call` item | a `function_call_output` item | [`openai`] |
//! | Anthropic Messages | a `tool_use` block | a `tool_result` block with `is_error` | [`anthropic`] |
//! | MCP | `tools/call` params | a `CallToolResult`; with feature `mcp`, a whole server | [`mcp`] |
//!
//! Every call goes through [`Toolbox::call`], so keys, replays, `IN_PROGRESS` and `CONFLICT`
//! hold whichever API the model speaks. A malformed call (arguments that are not JSON, no tool
//! name, a tool that does not exist) becomes an error result the model can read and act on,
//! never a panic: `{"error": {"code", "message", "retryable", "suggestion"}}`.
//!
//! A `null` for an optional argument means "not given": OpenAI's strict mode makes models send
//! one for every optional field they leave out, and other models do it on their own.
//!
//! Give each call its own [`ToolContext`] step when keys use `ctx.step`: two calls of one
//! message are two steps.

pub mod anthropic;
pub mod mcp;
pub mod openai;

use serde_json::{Map, Value};

use crate::export::openai::drop_optional_nulls;
use crate::{ErrorCode, ToolContext, ToolError, ToolOutput, Toolbox};

/// Runs one call as a provider sent it: the tool's name, and its arguments as the provider
/// holds them (a JSON object, or a string of JSON).
pub(crate) async fn run(
    toolbox: &Toolbox,
    name: Option<&str>,
    arguments: Option<&Value>,
    ctx: &ToolContext,
) -> Result<ToolOutput, ToolError> {
    let Some(name) = name else {
        return Err(toolbox.no_such_tool("the tool call names no tool".into()));
    };
    let Some(definition) = toolbox.definition(name) else {
        return toolbox.call(name, Value::Object(Map::new()), ctx).await;
    };
    let mut arguments = parse_arguments(name, arguments)?;
    drop_optional_nulls(&mut arguments, definition.input_schema());
    toolbox.call(name, arguments, ctx).await
}

/// The arguments as a JSON object: a string is parsed, a missing or `null` one is `{}`.
fn parse_arguments(tool: &str, arguments: Option<&Value>) -> Result<Value, ToolError> {
    let retry = "send the arguments as one JSON object with the fields the tool's schema lists, then call again";
    let value = match arguments {
        None | Some(Value::Null) => return Ok(Value::Object(Map::new())),
        Some(Value::String(text)) if text.trim().is_empty() => {
            return Ok(Value::Object(Map::new()))
        }
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
            ToolError::invalid_arguments(
                format!("the arguments for `{tool}` are not valid JSON: {e}"),
                retry.into(),
            )
        })?,
        Some(value) => value.clone(),
    };
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Map::new())),
        other => Err(ToolError::invalid_arguments(
            format!(
                "the arguments for `{tool}` must be a JSON object, not {}",
                kind(&other)
            ),
            retry.into(),
        )),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The text the model reads: the result as JSON, or the error's JSON form; and whether it is an
/// error.
pub(crate) fn content(result: &Result<ToolOutput, ToolError>) -> (String, bool) {
    match result {
        Ok(output) => (output.value.to_string(), false),
        Err(err) => (err.to_json().to_string(), true),
    }
}

/// A field of a provider message, if it is a string.
pub(crate) fn str_field<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

/// An error for a message of the wrong type (a `text` block where a `tool_use` was expected).
pub(crate) fn wrong_type(expected: &str, found: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("expected a `{expected}` item, got `{found}`"),
    )
    .with_suggestion(format!("send tool calls as `{expected}` items"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_parse_from_text_or_object() {
        assert_eq!(
            parse_arguments("t", Some(&json!("{\"a\": 1}"))).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(
            parse_arguments("t", Some(&json!({"a": 1}))).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(parse_arguments("t", None).unwrap(), json!({}));
        assert_eq!(parse_arguments("t", Some(&json!(""))).unwrap(), json!({}));
        assert_eq!(
            parse_arguments("t", Some(&json!("null"))).unwrap(),
            json!({})
        );
        let err = parse_arguments("t", Some(&json!("{\"a\": "))).unwrap_err();
        assert!(
            err.is(ErrorCode::InvalidArguments) && err.is_retryable(),
            "{err}"
        );
        let err = parse_arguments("t", Some(&json!("[1, 2]"))).unwrap_err();
        assert!(err.message().contains("not an array"), "{err}");
    }
}
