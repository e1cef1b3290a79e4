//! Anthropic: `tool_use` content blocks in, `tool_result` blocks out.
//!
//! ```no_run
//! # async fn turn(toolbox: toolkey::Toolbox, response: serde_json::Value) {
//! use serde_json::json;
//! use toolkey::providers::anthropic;
//! use toolkey::ToolContext;
//!
//! // Every `tool_use` block of the assistant's message is answered in one user message.
//! let mut results = Vec::new();
//! let blocks = response["content"].as_array().into_iter().flatten();
//! for (step, block) in blocks.filter(|b| b["type"] == "tool_use").enumerate() {
//!     let ctx = ToolContext::new("run-7").with_step(step as u64);
//!     results.push(anthropic::handle_tool_use(&toolbox, block, &ctx).await);
//! }
//! let reply = json!({"role": "user", "content": results});
//! # }
//! ```

use serde_json::{json, Value};

use super::{content, run, str_field, wrong_type};
use crate::{ToolContext, Toolbox};

/// Runs one `tool_use` block (`{"type": "tool_use", "id", "name", "input"}`) and returns the
/// `tool_result` block that answers it: `{"type": "tool_result", "tool_use_id", "content",
/// "is_error"}`.
///
/// The content is the result as JSON text, or the error's JSON form with `is_error: true`.
pub async fn handle_tool_use(toolbox: &Toolbox, block: &Value, ctx: &ToolContext) -> Value {
    let id = str_field(block, "id").unwrap_or_default();
    let result = match str_field(block, "type") {
        Some(other) if other != "tool_use" => Err(wrong_type("tool_use", other)),
        _ => run(toolbox, str_field(block, "name"), block.get("input"), ctx).await,
    };
    let (content, is_error) = content(&result);
    json!({"type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error})
}
