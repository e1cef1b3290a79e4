//! MCP: `tools/call` in, a `CallToolResult` out; with feature `mcp`, [`McpServer`] serves a whole
//! toolbox over stdio on rmcp, the official Rust MCP SDK.
//!
//! A result is a text block with the result's JSON, plus the result itself as
//! `structuredContent` when it is an object (MCP's structured content is always one). A replay
//! says so in `_meta`: `{"toolkey/replayed": true}`. An error is `isError: true` with the
//! error's JSON form, `{"error": {"code", "message", "retryable", "suggestion"}}`, as text.
//!
//! # Run ids
//!
//! Keys that use `ctx.run_id` need a run id, and MCP has none, so [`McpServer`] makes one per
//! session: `mcp-<uuid>`, generated when the client sends `initialize`. Every call of one
//! connection — one agent session — shares it, and a new connection starts a new run. A client
//! that has its own notion of a run (an agent runtime that resumes runs across connections)
//! names it in each request's `_meta`, with the step and event when keys use them:
//!
//! ```json
//! {"name": "refund", "arguments": {..},
//!  "_meta": {"toolkey/run_id": "run-7", "toolkey/step": 4, "toolkey/event_id": "evt-81"}}
//! ```
//!
//! The tenant is the server's ([`McpServer::with_tenant`]), never the client's: records are kept per
//! tenant, and a tenant a client could name would let it read another's.

// `McpServer` exists with feature `mcp` only; the docs name it either way.
#![cfg_attr(not(feature = "mcp"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "mcp")]
mod server;

#[cfg(feature = "mcp")]
pub use server::McpServer;

use serde_json::{json, Map, Value};

use super::{run, str_field};
use crate::{ErrorCode, ToolContext, ToolError, ToolOutput, Toolbox};

/// The `_meta` key of a request that names the run id (a string).
pub const META_RUN_ID: &str = "toolkey/run_id";
/// The `_meta` key of a request that names the step (a non-negative integer).
pub const META_STEP: &str = "toolkey/step";
/// The `_meta` key of a request that names the event id (a string).
pub const META_EVENT_ID: &str = "toolkey/event_id";
/// The `_meta` key of a result that marks it as a replay of an earlier call's outcome.
pub const META_REPLAYED: &str = "toolkey/replayed";

/// Runs the params of one `tools/call` request (`{"name", "arguments"}`) and returns the
/// `CallToolResult`: `{"content", "structuredContent"?, "isError", "_meta"?}`.
///
/// For an MCP stack other than rmcp; [`McpServer`] uses it too.
pub async fn handle_tools_call(toolbox: &Toolbox, params: &Value, ctx: &ToolContext) -> Value {
    let result = run(
        toolbox,
        str_field(params, "name"),
        params.get("arguments"),
        ctx,
    )
    .await;
    call_tool_result(&result)
}

/// A call's outcome as MCP's `CallToolResult`.
pub(crate) fn call_tool_result(result: &Result<ToolOutput, ToolError>) -> Value {
    match result {
        Ok(output) => {
            let mut reply = json!({
                "content": [{"type": "text", "text": output.value.to_string()}],
                "isError": false,
            });
            if output.value.is_object() {
                reply["structuredContent"] = output.value.clone();
            }
            if output.replayed {
                reply["_meta"] = json!({META_REPLAYED: true});
            }
            reply
        }
        Err(err) => json!({
            "content": [{"type": "text", "text": err.to_json().to_string()}],
            "isError": true,
        }),
    }
}

/// The context of one call: the run id, step and event id a request's `_meta` names, the
/// session's run id where it names none. See [Run ids](self#run-ids).
///
/// ```
/// use serde_json::json;
/// use toolkey::providers::mcp::context_from_meta;
///
/// let meta = json!({"toolkey/run_id": "run-7", "toolkey/step": 4});
/// let ctx = context_from_meta(meta.as_object(), "mcp-session").unwrap();
/// assert_eq!((ctx.run_id(), ctx.step()), ("run-7", 4));
/// let ctx = context_from_meta(None, "mcp-session").unwrap();
/// assert_eq!(ctx.run_id(), "mcp-session");
/// ```
pub fn context_from_meta(
    meta: Option<&Map<String, Value>>,
    session_run_id: &str,
) -> Result<ToolContext, ToolError> {
    let empty = Map::new();
    let meta = meta.unwrap_or(&empty);
    let text = |key: &str| match meta.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.is_empty() => Ok(Some(text.clone())),
        Some(_) => Err(bad_meta(key, "a non-empty string")),
    };
    let run_id = text(META_RUN_ID)?.unwrap_or_else(|| session_run_id.to_string());
    let mut ctx = ToolContext::new(run_id);
    match meta.get(META_STEP) {
        None | Some(Value::Null) => {}
        Some(step) => {
            ctx = ctx.with_step(
                step.as_u64()
                    .ok_or_else(|| bad_meta(META_STEP, "a non-negative integer"))?,
            )
        }
    }
    if let Some(event) = text(META_EVENT_ID)? {
        ctx = ctx.with_event(event);
    }
    Ok(ctx)
}

fn bad_meta(key: &str, expected: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("the request's `_meta.{key}` must be {expected}"),
    )
    .with_suggestion(
        "this is a defect in the MCP client, not in the arguments: report it; do not retry",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_carry_structure_replays_and_errors() {
        let ok = Ok(ToolOutput {
            value: json!({"id": "inv-1"}),
            replayed: true,
        });
        assert_eq!(
            call_tool_result(&ok),
            json!({
                "content": [{"type": "text", "text": "{\"id\":\"inv-1\"}"}],
                "structuredContent": {"id": "inv-1"},
                "isError": false,
                "_meta": {"toolkey/replayed": true}
            })
        );
        let scalar = Ok(ToolOutput {
            value: json!(3),
            replayed: false,
        });
        assert_eq!(
            call_tool_result(&scalar),
            json!({"content": [{"type": "text", "text": "3"}], "isError": false})
        );
        let err = Err(ToolError::new(ErrorCode::Conflict, "no"));
        let reply = call_tool_result(&err);
        assert_eq!(reply["isError"], true);
        let text: Value =
            serde_json::from_str(reply["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["error"]["code"], "CONFLICT");
    }

    #[test]
    fn meta_names_run_step_and_event() {
        let meta = json!({"toolkey/run_id": "run-7", "toolkey/step": 4, "toolkey/event_id": "evt-1", "progressToken": 1});
        let ctx = context_from_meta(meta.as_object(), "session").unwrap();
        assert_eq!(
            (ctx.run_id(), ctx.step(), ctx.event_id()),
            ("run-7", 4, Some("evt-1"))
        );
        let bad = json!({"toolkey/step": "four"});
        assert!(context_from_meta(bad.as_object(), "session").is_err());
        let bad = json!({"toolkey/run_id": 7});
        assert!(context_from_meta(bad.as_object(), "session").is_err());
    }
}
