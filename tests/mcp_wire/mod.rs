//! What an MCP server answered, read off the wire: a `tools/call` result's id or error code and
//! its replay mark, and the JSON-RPC answer in a response body, whether sent as JSON or as an
//! event stream.

use serde_json::Value;

/// What a wire `CallToolResult` answers: the `id` of what the call made, or the error's code;
/// and whether it is a replay.
pub fn wire_answer(result: &Value) -> (String, bool) {
    if result["isError"] == true {
        return (
            wire_error(result)["code"].as_str().unwrap().to_string(),
            false,
        );
    }
    let id = result["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a result with an id: {result}"));
    (id.to_string(), result["_meta"]["toolkey/replayed"] == true)
}

/// The error of a wire `CallToolResult`: `{"code", "message", "retryable", "suggestion"}`.
pub fn wire_error(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().expect("a text block");
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

/// The JSON-RPC answer (the message with an `id`) in a response body: the body itself when it
/// is JSON, or one of the `data:` lines of an event stream.
pub fn rpc_answer(body: &str) -> Option<Value> {
    std::iter::once(body)
        .chain(body.lines().filter_map(|line| line.strip_prefix("data:")))
        .filter_map(|message| serde_json::from_str::<Value>(message.trim()).ok())
        .find(|message| message.get("id").is_some())
}
