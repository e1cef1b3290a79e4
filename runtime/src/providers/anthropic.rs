//! Anthropic: `tool_use` content blocks in, `tool_result` blocks out.
//!
//! Hand the run's whole conversation to [`handle_tool_uses`]: it answers the `tool_use` blocks
//! that have no `tool_result` yet, each with its position in the conversation as its step
//! (see [Steps](super#steps)).
//!
//! ```no_run
//! # async fn turn(toolbox: toolkey::Toolbox, messages: &mut Vec<serde_json::Value>, response: serde_json::Value) {
//! use serde_json::json;
//! use toolkey::providers::anthropic;
//! use toolkey::ToolContext;
//!
//! // `messages` is the run's conversation from its start; the response joins it.
//! messages.push(json!({"role": "assistant", "content": response["content"]}));
//! let ctx = ToolContext::new("run-7");
//! let results = anthropic::handle_tool_uses(&toolbox, messages, &ctx).await;
//! messages.push(json!({"role": "user", "content": results}));
//! # }
//! ```

use serde_json::{json, Value};

use super::{content, run, str_field, unanswered, with_call_id, Entry};
use crate::texts;
use crate::{ToolContext, Toolbox};

/// Answers the `tool_use` blocks of a Messages API conversation that have no `tool_result`
/// yet, in order, and returns the `tool_result` blocks for the next user message.
///
/// `messages` is the run's conversation from its start, the assistant message with the new
/// `tool_use` blocks included. Each call runs with `ctx` and its step: its position among every
/// `tool_use` block of the conversation's assistant messages, so handing the same conversation
/// over again — after a crash, or from another process on the same store — replays what ran.
pub async fn handle_tool_uses(
    toolbox: &Toolbox,
    messages: &[Value],
    ctx: &ToolContext,
) -> Vec<Value> {
    let entries = messages.iter().flat_map(|message| {
        let role = str_field(message, "role");
        let blocks = message.get("content").and_then(Value::as_array);
        blocks.into_iter().flatten().filter_map(move |block| {
            match (role, str_field(block, "type")) {
                (Some("assistant"), Some("tool_use")) => Some(Entry::Call(
                    str_field(block, "id").unwrap_or_default(),
                    block,
                )),
                (Some("user"), Some("tool_result")) => Some(Entry::Answer(
                    str_field(block, "tool_use_id").unwrap_or_default(),
                )),
                _ => None,
            }
        })
    });
    let mut results = Vec::new();
    for (step, block) in unanswered(entries) {
        results.push(handle_tool_use(toolbox, block, &ctx.clone().with_step(step)).await);
    }
    results
}

/// Runs one `tool_use` block (`{"type": "tool_use", "id", "name", "input"}`) and returns the
/// `tool_result` block that answers it: `{"type": "tool_result", "tool_use_id", "content",
/// "is_error"}`.
///
/// The content is the result as JSON text (a replay wrapped with a note, see
/// [Replays](super#replays)), or the error's JSON form with `is_error: true`. The call runs with
/// `ctx` as given: see [`handle_tool_uses`] for a step per call.
pub async fn handle_tool_use(toolbox: &Toolbox, block: &Value, ctx: &ToolContext) -> Value {
    let id = str_field(block, "id").unwrap_or_default();
    let result = match str_field(block, "type") {
        Some(other) if other != "tool_use" => Err(texts::wrong_item_type("tool_use", other)),
        _ => {
            let ctx = with_call_id(ctx, id);
            run(toolbox, str_field(block, "name"), block.get("input"), &ctx).await
        }
    };
    let (content, is_error) = content(&result);
    json!({"type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error})
}
