//! Provider tool calls in, provider result messages out — OpenAI Chat Completions, OpenAI
//! Responses, Anthropic and MCP — through the same toolbox, so a retried call replays whatever
//! API it came from. Each scenario ends with an exact count of effects in the fake systems.

mod catalog;
mod common;

use serde_json::{json, Value};
use toolkey::providers::{anthropic, mcp, openai};
use toolkey::ToolContext;

fn ctx() -> ToolContext {
    ToolContext::new("run-1")
}

/// The JSON a result message carries as text.
fn parsed(text: &Value) -> Value {
    serde_json::from_str(text.as_str().expect("text content")).expect("the content is JSON")
}

fn error_code(text: &Value) -> String {
    parsed(text)["error"]["code"]
        .as_str()
        .expect("an error")
        .to_string()
}

fn chat_call(id: &str, name: &str, arguments: &Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
}

#[tokio::test]
async fn openai_chat_tool_calls_run_once_replay_and_conflict() {
    let fx = catalog::fixture();
    let args = catalog::arguments("send_invoice");

    let first = openai::handle_tool_call(
        &fx.toolbox,
        &chat_call("call_1", "send_invoice", &args),
        &ctx(),
    )
    .await;
    assert_eq!(first["role"], "tool");
    assert_eq!(first["tool_call_id"], "call_1");
    let invoice = parsed(&first["content"]);
    assert_eq!(invoice["id"], "inv-1");

    // The model retries with a new call id: the same invoice comes back.
    let retry = openai::handle_tool_call(
        &fx.toolbox,
        &chat_call("call_2", "send_invoice", &args),
        &ctx(),
    )
    .await;
    assert_eq!(retry["tool_call_id"], "call_2");
    assert_eq!(parsed(&retry["content"]), invoice);

    let mut other = args.clone();
    other["amount"] = json!(99.0);
    let conflict = openai::handle_tool_call(
        &fx.toolbox,
        &chat_call("call_3", "send_invoice", &other),
        &ctx(),
    )
    .await;
    assert_eq!(error_code(&conflict["content"]), "CONFLICT");
    assert_eq!(parsed(&conflict["content"])["error"]["retryable"], false);

    assert_eq!(fx.billing.count(), 1);
}

#[tokio::test]
async fn openai_strict_mode_nulls_mean_not_given() {
    let fx = catalog::fixture();
    let search = chat_call(
        "call_1",
        "search_orders",
        &catalog::strict_arguments("search_orders"),
    );
    let found = openai::handle_tool_call(&fx.toolbox, &search, &ctx()).await;
    let orders = parsed(&found["content"]);
    // `limit: null` is the default, 20 (the fake returns at most 3); `min_total: null` is none.
    assert_eq!(orders.as_array().map(Vec::len), Some(3), "{found}");
    assert_eq!(orders[0]["total"], 10.0);

    let ship = chat_call(
        "call_2",
        "create_shipment",
        &catalog::strict_arguments("create_shipment"),
    );
    let shipped = openai::handle_tool_call(&fx.toolbox, &ship, &ctx()).await;
    assert_eq!(parsed(&shipped["content"])["pieces"], 2, "{shipped}");
    assert_eq!(fx.carrier.shipments.lock().unwrap().len(), 1);

    // A null for a required field is still an error the model can fix.
    let mut missing = catalog::strict_arguments("search_orders");
    missing["query"] = Value::Null;
    let refused = openai::handle_tool_call(
        &fx.toolbox,
        &chat_call("call_3", "search_orders", &missing),
        &ctx(),
    )
    .await;
    let error = parsed(&refused["content"]);
    assert_eq!(error["error"]["code"], "INVALID_ARGUMENTS");
    assert!(
        error["error"]["suggestion"]
            .as_str()
            .unwrap()
            .contains("query"),
        "{error}"
    );
}

#[tokio::test]
async fn openai_chat_malformed_calls_become_errors_the_model_reads() {
    let fx = catalog::fixture();
    let cases = [
        (
            json!({"id": "c1", "type": "function", "function": {"name": "send_invoice", "arguments": "{\"customer\": "}}),
            "INVALID_ARGUMENTS",
        ),
        (
            json!({"id": "c2", "type": "function", "function": {"name": "send_invoice", "arguments": "[1, 2]"}}),
            "INVALID_ARGUMENTS",
        ),
        (
            json!({"id": "c3", "type": "function", "function": {"name": "send_invoice", "arguments": "{\"amount\": \"lots\"}"}}),
            "INVALID_ARGUMENTS",
        ),
        (
            json!({"id": "c4", "type": "function", "function": {"name": "send_invoices", "arguments": "{}"}}),
            "UNKNOWN_TOOL",
        ),
        (json!({"id": "c5", "type": "function"}), "UNKNOWN_TOOL"),
        (
            json!({"id": "c6", "type": "custom", "custom": {"name": "x", "input": "y"}}),
            "INVALID_ARGUMENTS",
        ),
        (json!("not even an object"), "UNKNOWN_TOOL"),
    ];
    for (call, code) in cases {
        let reply = openai::handle_tool_call(&fx.toolbox, &call, &ctx()).await;
        assert_eq!(reply["role"], "tool");
        assert_eq!(
            reply["tool_call_id"],
            call.get("id").cloned().unwrap_or(json!(""))
        );
        assert_eq!(error_code(&reply["content"]), code, "{call} -> {reply}");
    }
    let unknown = openai::handle_tool_call(
        &fx.toolbox,
        &chat_call("c7", "send_invoices", &json!({})),
        &ctx(),
    )
    .await;
    let suggestion = parsed(&unknown["content"])["error"]["suggestion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        suggestion.contains("send_invoice"),
        "the error names the tools that exist: {suggestion}"
    );
    let not_json = openai::handle_tool_call(
        &fx.toolbox,
        &json!({"id": "c8", "function": {"name": "ping", "arguments": "{"}}),
        &ctx(),
    )
    .await;
    assert_eq!(parsed(&not_json["content"])["error"]["retryable"], true);
    assert_eq!(fx.billing.count(), 0);
}

#[tokio::test]
async fn openai_responses_function_calls_round_trip() {
    let fx = catalog::fixture();
    let item = |call_id: &str, arguments: &Value| json!({"type": "function_call", "id": "fc_1", "call_id": call_id, "name": "send_invoice", "arguments": arguments.to_string()});
    let args = catalog::arguments("send_invoice");
    let first = openai::handle_function_call(&fx.toolbox, &item("call_a", &args), &ctx()).await;
    assert_eq!(first["type"], "function_call_output");
    assert_eq!(first["call_id"], "call_a");
    assert_eq!(parsed(&first["output"])["id"], "inv-1");
    let again = openai::handle_function_call(&fx.toolbox, &item("call_b", &args), &ctx()).await;
    assert_eq!(parsed(&again["output"])["id"], "inv-1");

    let malformed = json!({"type": "function_call", "call_id": "call_c", "name": "send_invoice", "arguments": "amount=5"});
    let reply = openai::handle_function_call(&fx.toolbox, &malformed, &ctx()).await;
    assert_eq!(reply["call_id"], "call_c");
    assert_eq!(error_code(&reply["output"]), "INVALID_ARGUMENTS");
    let wrong = json!({"type": "message", "call_id": "call_d", "content": []});
    assert_eq!(
        error_code(&openai::handle_function_call(&fx.toolbox, &wrong, &ctx()).await["output"]),
        "INVALID_ARGUMENTS"
    );
    let unknown =
        json!({"type": "function_call", "call_id": "call_e", "name": "nope", "arguments": "{}"});
    assert_eq!(
        error_code(&openai::handle_function_call(&fx.toolbox, &unknown, &ctx()).await["output"]),
        "UNKNOWN_TOOL"
    );

    assert_eq!(fx.billing.count(), 1);
}

#[tokio::test]
async fn anthropic_tool_use_round_trips_with_is_error() {
    let fx = catalog::fixture();
    let block = |id: &str, input: Value| json!({"type": "tool_use", "id": id, "name": "send_invoice", "input": input});
    let args = catalog::arguments("send_invoice");

    let first =
        anthropic::handle_tool_use(&fx.toolbox, &block("toolu_1", args.clone()), &ctx()).await;
    assert_eq!(first["type"], "tool_result");
    assert_eq!(first["tool_use_id"], "toolu_1");
    assert_eq!(first["is_error"], false);
    assert_eq!(parsed(&first["content"])["id"], "inv-1");

    let replay =
        anthropic::handle_tool_use(&fx.toolbox, &block("toolu_2", args.clone()), &ctx()).await;
    assert_eq!(
        (
            replay["is_error"].clone(),
            parsed(&replay["content"])["id"].clone()
        ),
        (json!(false), json!("inv-1"))
    );

    let mut other = args.clone();
    other["amount"] = json!(1.0);
    let conflict = anthropic::handle_tool_use(&fx.toolbox, &block("toolu_3", other), &ctx()).await;
    assert_eq!(conflict["is_error"], true);
    assert_eq!(error_code(&conflict["content"]), "CONFLICT");

    // Malformed: input that is not an object, a string that is not JSON, no name, another block.
    let cases = [
        (block("toolu_4", json!(42)), "INVALID_ARGUMENTS"),
        (
            block("toolu_5", json!("{\"customer\": ")),
            "INVALID_ARGUMENTS",
        ),
        (
            json!({"type": "tool_use", "id": "toolu_6", "input": {}}),
            "UNKNOWN_TOOL",
        ),
        (
            json!({"type": "tool_use", "id": "toolu_7", "name": "nope", "input": {}}),
            "UNKNOWN_TOOL",
        ),
        (
            json!({"type": "text", "text": "hello"}),
            "INVALID_ARGUMENTS",
        ),
    ];
    for (block, code) in cases {
        let reply = anthropic::handle_tool_use(&fx.toolbox, &block, &ctx()).await;
        assert_eq!(reply["is_error"], true, "{block}");
        assert_eq!(
            reply["tool_use_id"],
            block.get("id").cloned().unwrap_or(json!(""))
        );
        assert_eq!(error_code(&reply["content"]), code, "{block} -> {reply}");
    }
    assert_eq!(fx.billing.count(), 1);
}

#[tokio::test]
async fn mcp_tools_call_params_round_trip() {
    let fx = catalog::fixture();
    let params = json!({"name": "send_invoice", "arguments": catalog::arguments("send_invoice")});
    let first = mcp::handle_tools_call(&fx.toolbox, &params, &ctx()).await;
    assert_eq!(first["isError"], false);
    assert_eq!(first["structuredContent"]["id"], "inv-1");
    assert_eq!(
        parsed(&first["content"][0]["text"]),
        first["structuredContent"]
    );
    assert!(first.get("_meta").is_none());

    let replay = mcp::handle_tools_call(&fx.toolbox, &params, &ctx()).await;
    assert_eq!(replay["_meta"][mcp::META_REPLAYED], true);
    assert_eq!(replay["structuredContent"], first["structuredContent"]);

    // Not an object result: text only.
    let pong = mcp::handle_tools_call(&fx.toolbox, &json!({"name": "ping"}), &ctx()).await;
    assert_eq!(
        pong,
        json!({"content": [{"type": "text", "text": "\"pong\""}], "isError": false})
    );

    let malformed = mcp::handle_tools_call(&fx.toolbox, &json!({"arguments": {}}), &ctx()).await;
    assert_eq!(malformed["isError"], true);
    assert_eq!(error_code(&malformed["content"][0]["text"]), "UNKNOWN_TOOL");
    let bad_args = mcp::handle_tools_call(
        &fx.toolbox,
        &json!({"name": "send_invoice", "arguments": [1]}),
        &ctx(),
    )
    .await;
    assert_eq!(
        error_code(&bad_args["content"][0]["text"]),
        "INVALID_ARGUMENTS"
    );
    assert_eq!(fx.billing.count(), 1);
}

#[tokio::test]
async fn every_catalog_tool_accepts_its_arguments_through_every_provider() {
    // One toolbox per provider: the strict and the full arguments of a keyed tool differ, and
    // would rightly be a CONFLICT in one toolbox.
    let (chat, responses, claude, mcp) = (
        catalog::fixture(),
        catalog::fixture(),
        catalog::fixture(),
        catalog::fixture(),
    );
    for def in chat.toolbox.definitions() {
        let name = def.name();
        let args = catalog::arguments(name);
        let strict = catalog::strict_arguments(name);
        let item = json!({"type": "function_call", "call_id": "c", "name": name, "arguments": strict.to_string()});
        let block = json!({"type": "tool_use", "id": "t", "name": name, "input": args});
        let texts = [
            openai::handle_tool_call(&chat.toolbox, &chat_call("c", name, &strict), &ctx()).await
                ["content"]
                .clone(),
            openai::handle_function_call(&responses.toolbox, &item, &ctx()).await["output"].clone(),
            anthropic::handle_tool_use(&claude.toolbox, &block, &ctx()).await["content"].clone(),
            mcp::handle_tools_call(
                &mcp.toolbox,
                &json!({"name": name, "arguments": args}),
                &ctx(),
            )
            .await["content"][0]["text"]
                .clone(),
        ];
        for text in texts {
            assert!(
                parsed(&text).get("error").is_none(),
                "`{name}` refused its arguments: {text}"
            );
        }
    }
}
