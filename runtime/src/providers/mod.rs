//! Tool calls in, tool results out: each LLM API's tool-call message run through a [`Toolbox`],
//! and the result as the message that API expects back.
//!
//! | API | call in | result out | module |
//! |---|---|---|---|
//! | OpenAI Chat Completions | a `tool_calls` entry | `{"role": "tool", "tool_call_id", "content"}` | [`openai`] |
//! | OpenAI Responses | a `function_call` item | a `function_call_output` item | [`openai`] |
//! | Anthropic Messages | a `tool_use` block | a `tool_result` block with `is_error` | [`anthropic`] |
//! | MCP | `tools/call` params | a `CallToolResult`; with feature `mcp`, a whole server (stdio), with `mcp-http` over HTTP | [`mcp`] |
//!
//! Every call goes through [`Toolbox::call`], so keys, replays, `IN_PROGRESS` and `CONFLICT`
//! hold whichever API the model speaks. A malformed call (arguments that are not JSON, no tool
//! name, a tool that does not exist) becomes an error result the model can read and act on,
//! never a panic: `{"error": {"code", "message", "retryable", "suggestion"}}`.
//!
//! A `null` for an optional argument means "not given": OpenAI's strict mode makes models send
//! one for every optional field they leave out, and other models do it on their own.
//!
//! # Replays
//!
//! A replayed result says so in the text the model reads, so the model does not tell the user
//! it did the work a second time: instead of the bare result, the text is
//! `{"replayed": true, "note": "...", "result": <the earlier call's result>}`. Over MCP the
//! result's own text block and `structuredContent` stay as they are (they must match the tool's
//! output schema), and a second text block carries the note.
//!
//! # Steps
//!
//! A key that uses `<ctx.step>` needs each call's step: its position in the run's log, unique
//! within the run and the same when the run is resumed (see [`ToolContext`]). The
//! conversation is that log, so each adapter has a function that takes the run's whole
//! conversation and answers the tool calls in it that have no answer yet, each with its
//! position among all the tool calls of the conversation as its step:
//! [`openai::handle_tool_calls`] (Chat Completions `messages`),
//! [`openai::handle_function_calls`] (Responses `input` items) and
//! [`anthropic::handle_tool_uses`] (Messages `messages`). Handing them the same conversation
//! again — after a crash, from another process on the same store — replays the calls that ran
//! instead of running them again. Pass the conversation from the run's start: a conversation
//! whose oldest messages were cut off numbers its calls from a later start, and a new call
//! would take an earlier call's step. A program that trims history keeps its own count and
//! sets [`ToolContext::step`] itself.
//!
//! The one-call functions ([`openai::handle_tool_call`], ...) run the call with the context
//! as given: set its step when the tool's key uses `<ctx.step>`, or the call is refused with
//! `MISSING_CONTEXT`.

pub mod anthropic;
pub mod mcp;
pub mod openai;

use serde_json::{json, Map, Value};

use crate::export::openai::drop_optional_nulls;
pub(crate) use crate::texts::REPLAY_NOTE;
use crate::{texts, ToolContext, ToolDefinition, ToolError, ToolOutput, Toolbox};

/// Runs one call as a provider sent it: the tool's name, and its arguments as the provider
/// holds them (a JSON object, or a string of JSON).
pub(crate) async fn run(
    toolbox: &Toolbox,
    name: Option<&str>,
    arguments: Option<&Value>,
    ctx: &ToolContext,
) -> Result<ToolOutput, ToolError> {
    let Some(name) = name else {
        return Err(toolbox.no_such_tool(texts::NO_TOOL_NAMED.into()));
    };
    let Some(definition) = toolbox.definition(name) else {
        return toolbox.call(name, Value::Object(Map::new()), ctx).await;
    };
    let arguments = call_arguments(definition, arguments)?;
    toolbox.call(name, arguments, ctx).await
}

/// The arguments of a call of the tool `definition` describes, as the toolbox takes them: a
/// string parsed, `{}` for none, `null`s for optional fields left out.
pub(crate) fn call_arguments(
    definition: &ToolDefinition,
    arguments: Option<&Value>,
) -> Result<Value, ToolError> {
    let mut arguments = parse_arguments(definition.name(), arguments)?;
    drop_optional_nulls(&mut arguments, definition.input_schema());
    Ok(arguments)
}

/// `ctx` with the id the provider gave the call, for its span (none when the id is empty).
pub(crate) fn with_call_id(ctx: &ToolContext, id: &str) -> ToolContext {
    match id {
        "" => ctx.clone(),
        id => ctx.clone().with_tool_call_id(id),
    }
}

/// The arguments as a JSON object: a string is parsed, a missing or `null` one is `{}`.
fn parse_arguments(tool: &str, arguments: Option<&Value>) -> Result<Value, ToolError> {
    let value = match arguments {
        None | Some(Value::Null) => return Ok(Value::Object(Map::new())),
        Some(Value::String(text)) if text.trim().is_empty() => {
            return Ok(Value::Object(Map::new()))
        }
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| texts::arguments_not_json(tool, &e.to_string()))?,
        Some(value) => value.clone(),
    };
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Map::new())),
        other => Err(texts::provider_arguments_not_an_object(tool, kind(&other))),
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

/// The text the model reads: the result as JSON (wrapped with a note when it is a replay, see
/// [Replays](self#replays)), or the error's JSON form; and whether it is an error.
pub(crate) fn content(result: &Result<ToolOutput, ToolError>) -> (String, bool) {
    match result {
        Ok(output) if output.replayed => (
            json!({"replayed": true, "note": REPLAY_NOTE, "result": output.value}).to_string(),
            false,
        ),
        Ok(output) => (output.value.to_string(), false),
        Err(err) => (err.to_json().to_string(), true),
    }
}

/// One entry of a conversation, as [`unanswered`] reads it.
pub(crate) enum Entry<'a> {
    /// A tool call the model made, with its id.
    Call(&'a str, &'a Value),
    /// The answer to the call with this id.
    Answer(&'a str),
}

/// The calls of a conversation that have no answer yet, each with its step: its position among
/// all the calls, answered or not.
///
/// An answer settles the latest unanswered call before it with its id, never a later one: some
/// servers reuse call ids from turn to turn (`call_0` every turn), and an answer from an earlier
/// turn must not pass for the answer to a new call.
pub(crate) fn unanswered<'a>(
    entries: impl IntoIterator<Item = Entry<'a>>,
) -> Vec<(u64, &'a Value)> {
    let mut calls: Vec<(&str, &Value, bool)> = Vec::new();
    for entry in entries {
        match entry {
            Entry::Call(id, call) => calls.push((id, call, false)),
            Entry::Answer(id) => {
                if let Some(call) = calls
                    .iter_mut()
                    .rev()
                    .find(|(call_id, _, answered)| *call_id == id && !answered)
                {
                    call.2 = true;
                }
            }
        }
    }
    calls
        .into_iter()
        .zip(0u64..)
        .filter(|((_, _, answered), _)| !answered)
        .map(|((_, call, _), step)| (step, call))
        .collect()
}

/// A field of a provider message, if it is a string.
pub(crate) fn str_field<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn unanswered_calls_keep_their_position_and_answers_never_reach_forward() {
        let (a, b, c) = (json!("a"), json!("b"), json!("c"));
        // Turn one: call_0 answered. Turn two reuses the id: its call_0 is still open.
        let entries = vec![
            Entry::Call("call_0", &a),
            Entry::Answer("call_0"),
            Entry::Call("call_0", &b),
            Entry::Call("call_1", &c),
            Entry::Answer("call_1"),
        ];
        assert_eq!(unanswered(entries), vec![(1, &b)]);
        // An answer that comes before its call answers nothing.
        let entries = vec![Entry::Answer("x"), Entry::Call("x", &a)];
        assert_eq!(unanswered(entries), vec![(0, &a)]);
    }

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
