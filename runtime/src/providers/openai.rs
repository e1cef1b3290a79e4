//! OpenAI: Chat Completions `tool_calls` and Responses `function_call` items.
//!
//! ```no_run
//! # async fn turn(toolbox: toolkey::Toolbox, assistant: serde_json::Value) {
//! use toolkey::providers::openai;
//! use toolkey::ToolContext;
//!
//! // `assistant` is `choices[0].message` of a Chat Completions response.
//! let mut messages = vec![assistant.clone()];
//! for (step, call) in assistant["tool_calls"].as_array().into_iter().flatten().enumerate() {
//!     let ctx = ToolContext::new("run-7").with_step(step as u64);
//!     messages.push(openai::handle_tool_call(&toolbox, call, &ctx).await);
//! }
//! # }
//! ```

use serde_json::{json, Value};

use super::{content, run, str_field, wrong_type};
use crate::{ToolContext, Toolbox};

/// Runs one entry of a Chat Completions assistant message's `tool_calls`
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a string of
/// JSON) and returns the tool message to append: `{"role": "tool", "tool_call_id", "content"}`.
///
/// The content is the result as JSON text, or the error's JSON form
/// (`{"error": {"code", "message", "retryable", "suggestion"}}`): Chat Completions has no error
/// flag, so the model reads it from the content.
pub async fn handle_tool_call(toolbox: &Toolbox, tool_call: &Value, ctx: &ToolContext) -> Value {
    let id = str_field(tool_call, "id").unwrap_or_default();
    let result = match str_field(tool_call, "type") {
        Some(other) if other != "function" => Err(wrong_type("function", other)),
        _ => {
            let function = tool_call.get("function").unwrap_or(&Value::Null);
            run(
                toolbox,
                str_field(function, "name"),
                function.get("arguments"),
                ctx,
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
/// The output is the result as JSON text, or the error's JSON form.
pub async fn handle_function_call(toolbox: &Toolbox, item: &Value, ctx: &ToolContext) -> Value {
    let call_id = str_field(item, "call_id").unwrap_or_default();
    let result = match str_field(item, "type") {
        Some(other) if other != "function_call" => Err(wrong_type("function_call", other)),
        _ => run(toolbox, str_field(item, "name"), item.get("arguments"), ctx).await,
    };
    let (output, _) = content(&result);
    json!({"type": "function_call_output", "call_id": call_id, "output": output})
}
