//! OpenAI: Chat Completions `tool_calls` and Responses `function_call` items.
//!
//! Hand the run's whole conversation to [`handle_tool_calls`] (or the Responses `input` list
//! to [`handle_function_calls`]): it answers the calls that have no answer yet, each with its
//! position in the conversation as its step (see [Steps](super#steps)).
//!
//! ```no_run
//! # async fn turn(toolbox: toolkey::Toolbox, messages: &mut Vec<serde_json::Value>, response: serde_json::Value) {
//! use toolkey::providers::openai;
//! use toolkey::ToolContext;
//!
//! // `messages` is the run's conversation from its start; the response's message joins it.
//! messages.push(response["choices"][0]["message"].clone());
//! let ctx = ToolContext::new("run-7");
//! let answers = openai::handle_tool_calls(&toolbox, messages, &ctx).await;
//! messages.extend(answers);
//! # }
//! ```

use serde_json::{json, Value};

use super::{content, run, str_field, unanswered, with_call_id, Entry};
use crate::texts;
use crate::{ToolContext, Toolbox};

/// Answers the tool calls of a Chat Completions conversation that have no `tool` message yet,
/// in order, and returns the `tool` messages to append.
///
/// `messages` is the run's conversation from its start, the assistant message with the new
/// `tool_calls` included. Each call runs with `ctx` and its step: its position among every
/// `tool_calls` entry of the conversation's assistant messages (the run's first call is step
/// 0). A conversation handed over again — after a crash, or from another process on the same
/// store — gives each call the same step, so a keyed call replays instead of running again.
pub async fn handle_tool_calls(
    toolbox: &Toolbox,
    messages: &[Value],
    ctx: &ToolContext,
) -> Vec<Value> {
    let entries = messages.iter().flat_map(|message| {
        let calls = match str_field(message, "role") {
            Some("assistant") => message.get("tool_calls").and_then(Value::as_array),
            _ => None,
        };
        let answer = match str_field(message, "role") {
            Some("tool") => Some(Entry::Answer(
                str_field(message, "tool_call_id").unwrap_or_default(),
            )),
            _ => None,
        };
        calls
            .into_iter()
            .flatten()
            .map(|call| Entry::Call(str_field(call, "id").unwrap_or_default(), call))
            .chain(answer)
    });
    let mut answers = Vec::new();
    for (step, call) in unanswered(entries) {
        answers.push(handle_tool_call(toolbox, call, &ctx.clone().with_step(step)).await);
    }
    answers
}

/// Answers the `function_call` items of a Responses API conversation that have no
/// `function_call_output` yet, in order, and returns the items to send in the next request's
/// `input`.
///
/// `items` is the run's `input` list from its start with the latest response's `output` items
/// appended. Each call runs with `ctx` and its step: its position among every `function_call`
/// item of the list, so handing the same list over again replays what ran.
///
/// With `previous_response_id` the API keeps the conversation and a request carries only the
/// new items; the list the program sends is then not the run's log, and its calls would be
/// numbered from 0 every turn. Keep the run's items (every `output` item and every
/// `function_call_output`) in a list of your own and hand that list over.
pub async fn handle_function_calls(
    toolbox: &Toolbox,
    items: &[Value],
    ctx: &ToolContext,
) -> Vec<Value> {
    let entries = items.iter().filter_map(|item| {
        let id = str_field(item, "call_id").unwrap_or_default();
        match str_field(item, "type") {
            Some("function_call") => Some(Entry::Call(id, item)),
            Some("function_call_output") => Some(Entry::Answer(id)),
            _ => None,
        }
    });
    let mut outputs = Vec::new();
    for (step, item) in unanswered(entries) {
        outputs.push(handle_function_call(toolbox, item, &ctx.clone().with_step(step)).await);
    }
    outputs
}

/// Runs one entry of a Chat Completions assistant message's `tool_calls`
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a string of
/// JSON) and returns the tool message to append: `{"role": "tool", "tool_call_id", "content"}`.
///
/// The content is the result as JSON text (a replay wrapped with a note, see
/// [Replays](super#replays)), or the error's JSON form
/// (`{"error": {"code", "message", "retryable", "suggestion"}}`): Chat Completions has no error
/// flag, so the model reads it from the content. The call runs with `ctx` as given: see
/// [`handle_tool_calls`] for a step per call.
pub async fn handle_tool_call(toolbox: &Toolbox, tool_call: &Value, ctx: &ToolContext) -> Value {
    let id = str_field(tool_call, "id").unwrap_or_default();
    let result = match str_field(tool_call, "type") {
        Some(other) if other != "function" => Err(texts::wrong_item_type("function", other)),
        _ => {
            let function = tool_call.get("function").unwrap_or(&Value::Null);
            let ctx = with_call_id(ctx, id);
            run(
                toolbox,
                str_field(function, "name"),
                function.get("arguments"),
                &ctx,
            )
            .await
        }
    };
    let (content, _) = content(&result);
    json!({"role": "tool", "tool_call_id": id, "content": content})
}

/// Runs one `function_call` item of a Responses API output
/// (`{"type": "function_call", "call_id", "name", "arguments"}`) and returns the item to send
/// back in the next request's `input`: `{"type": "function_call_output", "call_id", "output"}`.
///
/// The output is the result as JSON text (a replay wrapped with a note), or the error's JSON
/// form. The call runs with `ctx` as given: see [`handle_function_calls`] for a step per call.
pub async fn handle_function_call(toolbox: &Toolbox, item: &Value, ctx: &ToolContext) -> Value {
    let call_id = str_field(item, "call_id").unwrap_or_default();
    let result = match str_field(item, "type") {
        Some(other) if other != "function_call" => {
            Err(texts::wrong_item_type("function_call", other))
        }
        _ => {
            let ctx = with_call_id(ctx, call_id);
            run(
                toolbox,
                str_field(item, "name"),
                item.get("arguments"),
                &ctx,
            )
            .await
        }
    };
    let (output, _) = content(&result);
    json!({"type": "function_call_output", "call_id": call_id, "output": output})
}
