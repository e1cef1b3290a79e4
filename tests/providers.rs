//! Provider tool calls in, provider result messages out — OpenAI Chat Completions, OpenAI
//! Responses, Anthropic and MCP — through the same toolbox, so a retried call replays whatever
//! API it came from, and says so in what the model reads. Each scenario ends with an exact
//! count of effects in the fake systems.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use toolkey::providers::{anthropic, mcp, openai};
use toolkey::store::SqliteStore;
use toolkey::{ErrorCode, ToolContext, Toolbox};
use toolkey_tests::{billing, catalog};

use billing::{RefundOrder, Refunds};

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

/// A replay's text: marked, with a note for the model; its `result` is the earlier result.
fn replayed_result(text: &Value) -> Value {
    let reply = parsed(text);
    assert_eq!(reply["replayed"], true, "a replay says so: {reply}");
    let note = reply["note"].as_str().expect("a note for the model");
    assert!(note.contains("not done again"), "{note}");
    reply["result"].clone()
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
    assert!(parsed(&first["content"]).get("replayed").is_none());
    assert_eq!(replayed_result(&retry["content"]), invoice);

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
    assert_eq!(replayed_result(&again["output"])["id"], "inv-1");

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
            replayed_result(&replay["content"])["id"].clone()
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
    // The model reads the replay in a second text block; the first is still the result itself.
    let blocks = replay["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{replay}");
    assert_eq!(blocks[0], first["content"][0]);
    assert!(
        blocks[1]["text"]
            .as_str()
            .unwrap()
            .contains("not done again"),
        "{replay}"
    );
    // And the structured result still fits the tool's output schema.
    let output_schema =
        fx.toolbox.definition("send_invoice").unwrap().to_mcp()["outputSchema"].clone();
    let validator = jsonschema::validator_for(&output_schema).expect("a valid schema");
    assert!(validator.is_valid(&replay["structuredContent"]), "{replay}");

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

/// A tool whose arguments carry a flattened enum is told to each model as one object, the
/// branch it does not take left out or `null`: through every provider, one refund.
#[tokio::test]
async fn a_flattened_enums_arguments_are_one_refund_through_every_provider() {
    let fx = catalog::fixture();
    let strict = catalog::strict_arguments("refund");
    assert_eq!(strict["iban"], Value::Null);
    let args = catalog::arguments("refund");
    let item = json!({"type": "function_call", "call_id": "c", "name": "refund", "arguments": strict.to_string()});
    let block = json!({"type": "tool_use", "id": "t", "name": "refund", "input": args});
    let texts = [
        openai::handle_tool_call(&fx.toolbox, &chat_call("c", "refund", &strict), &ctx()).await
            ["content"]
            .clone(),
        openai::handle_function_call(&fx.toolbox, &item, &ctx()).await["output"].clone(),
        anthropic::handle_tool_use(&fx.toolbox, &block, &ctx()).await["content"].clone(),
    ];
    let over_mcp = mcp::handle_tools_call(
        &fx.toolbox,
        &json!({"name": "refund", "arguments": args}),
        &ctx(),
    )
    .await;
    assert_eq!(
        parsed(&over_mcp["content"][0]["text"]),
        json!("rf-1"),
        "{over_mcp}"
    );
    assert_eq!(over_mcp["_meta"]["toolkey/replayed"], true, "{over_mcp}");
    assert_eq!(parsed(&texts[0]), json!("rf-1"), "{}", texts[0]);
    for text in &texts[1..] {
        let replay = parsed(text);
        assert_eq!(
            (&replay["result"], &replay["replayed"]),
            (&json!("rf-1"), &json!(true)),
            "{text}"
        );
    }
    // The other branch, from a strict model: the card's fields `null`, the same key.
    let bank = json!({
        "order_id": "ord-1042", "cents": 1250, "method": "bank", "last4": null, "iban": "DE02"
    });
    let text = openai::handle_tool_call(&fx.toolbox, &chat_call("d", "refund", &bank), &ctx())
        .await["content"]
        .clone();
    assert_eq!(error_code(&text), "CONFLICT", "{text}");
    assert_eq!(fx.payments.refunds.lock().unwrap().len(), 1);
}

/// Two flattened enums, one of them with a newtype variant (`Card(CardRef)`): every export
/// offers both enums' fields, and a call built from each is one payout.
#[tokio::test]
async fn two_flattened_enums_and_a_newtype_variant_are_one_payout_through_every_provider() {
    let fx = catalog::fixture();
    let def = fx.toolbox.definition("pay_out").unwrap();
    for (what, schema) in [
        ("openai", def.to_openai()["function"]["parameters"].clone()),
        ("anthropic", def.to_anthropic()["input_schema"].clone()),
        ("gemini", def.to_gemini()["parameters"].clone()),
    ] {
        let offered: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        assert_eq!(
            offered,
            [
                "payout_id",
                "cents",
                "method",
                "last4",
                "iban",
                "speed",
                "fee_cents"
            ],
            "{what}: {schema:#}"
        );
        assert_eq!(
            schema["properties"]["method"]["enum"],
            json!(["card", "bank"]),
            "{what}"
        );
    }
    let strict = catalog::strict_arguments("pay_out");
    let args = catalog::arguments("pay_out");
    let item = json!({"type": "function_call", "call_id": "c", "name": "pay_out", "arguments": strict.to_string()});
    let block = json!({"type": "tool_use", "id": "t", "name": "pay_out", "input": args});
    let first = openai::handle_tool_call(&fx.toolbox, &chat_call("c", "pay_out", &strict), &ctx())
        .await["content"]
        .clone();
    assert_eq!(parsed(&first), json!("po-1"), "{first}");
    let replays = [
        openai::handle_function_call(&fx.toolbox, &item, &ctx()).await["output"].clone(),
        anthropic::handle_tool_use(&fx.toolbox, &block, &ctx()).await["content"].clone(),
    ];
    for text in &replays {
        let replay = parsed(text);
        assert_eq!(
            (&replay["result"], &replay["replayed"]),
            (&json!("po-1"), &json!(true)),
            "{text}"
        );
    }
    let over_mcp = mcp::handle_tools_call(
        &fx.toolbox,
        &json!({"name": "pay_out", "arguments": args}),
        &ctx(),
    )
    .await;
    assert_eq!(over_mcp["_meta"]["toolkey/replayed"], true, "{over_mcp}");
    // The other speed under the key is another payout.
    let standard = json!({
        "payout_id": "po-7", "cents": 900, "method": "card", "last4": "4242", "iban": null,
        "speed": "standard", "fee_cents": null
    });
    let text = openai::handle_tool_call(&fx.toolbox, &chat_call("d", "pay_out", &standard), &ctx())
        .await["content"]
        .clone();
    assert_eq!(error_code(&text), "CONFLICT", "{text}");
    // A fee beside the standard speed goes with no branch of `speed`.
    let mix = json!({
        "payout_id": "po-8", "cents": 900, "method": "bank", "iban": "DE02",
        "speed": "standard", "fee_cents": 50
    });
    let err = fx.toolbox.call("pay_out", mix, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        err.message()
            .contains("field `fee_cents` does not go with the other fields given"),
        "{err:?}"
    );
    // The companion reads both enums' fields as the tool does.
    let status = |args: Value| {
        let toolbox = fx.toolbox.clone();
        async move { toolbox.call("payout_status", args, &ctx()).await }
    };
    let same = status(args).await.unwrap().value;
    assert_eq!(
        (&same["status"], &same["result"]),
        (&json!("completed"), &json!("po-1")),
        "{same}"
    );
    assert!(same.get("note").is_none(), "{same}");
    let standard = status(standard).await.unwrap().value;
    assert_eq!(standard["status"], "conflict", "{standard}");
    assert_eq!(
        *fx.payments.refunds.lock().unwrap(),
        ["po-7:900:card 4242:instant, fee 50"]
    );
}

// Steps from the conversation: a two-turn conversation whose turns each ask for the same
// refund (`refund:<ctx.run_id>:<ctx.step>`) gives two refunds, and the same conversation handed
// to a new toolbox on the same store after a "restart" replays instead of refunding again.

fn refund_toolbox(store: &Path, refunds: &Arc<Refunds>) -> Toolbox {
    Toolbox::builder()
        .store(SqliteStore::open(store).expect("the store opens"))
        .shared_state(refunds.clone())
        .tool(RefundOrder)
        .build()
        .expect("a valid toolbox")
}

/// Runs the two-turn scenario of one adapter. `turn(toolbox, log, call_id)` appends the
/// model's message with one refund call (with the given id) to the log; `answer(toolbox, log)`
/// runs the adapter over the log and returns the texts of its answers, which it appends.
async fn two_turns_then_restart<A>(
    turn: impl Fn(&mut Vec<Value>, &str),
    answer: impl Fn(Toolbox, Vec<Value>) -> A,
    texts: impl Fn(&[Value]) -> Vec<Value>,
    append: impl Fn(&mut Vec<Value>, Vec<Value>),
) where
    A: Future<Output = Vec<Value>>,
{
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("toolkey.db");
    let refunds = Arc::new(Refunds::default());
    let toolbox = refund_toolbox(&store, &refunds);

    let mut log = vec![json!({"role": "user", "content": "Refund 5 EUR on order-1."})];
    turn(&mut log, "call_0");
    let first = answer(toolbox.clone(), log.clone()).await;
    assert_eq!(first.len(), 1);
    assert_eq!(parsed(&texts(&first)[0])["id"], "re_1");
    append(&mut log, first);
    log.push(
        json!({"role": "user", "content": "The customer was charged twice: refund 5 EUR more."}),
    );
    // Some servers number call ids per turn: the second turn's call is `call_0` again.
    turn(&mut log, "call_0");
    let second = answer(toolbox.clone(), log.clone()).await;
    assert_eq!(second.len(), 1);
    let refund = parsed(&texts(&second)[0]);
    assert_eq!(
        refund["id"], "re_2",
        "the second turn's refund runs: {refund}"
    );
    assert_eq!(refunds.count(), 2);

    // The process dies before the answer is saved; another one picks the run up.
    assert!(toolbox.shutdown().await.is_clean());
    drop(toolbox);
    let restarted = refund_toolbox(&store, &refunds);
    let again = answer(restarted.clone(), log.clone()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(replayed_result(&texts(&again)[0]), refund);
    assert_eq!(
        refunds.count(),
        2,
        "the restart replays instead of refunding again"
    );

    // Once the answer is in the log, nothing is left to run.
    append(&mut log, again);
    assert!(answer(restarted, log).await.is_empty());
    assert_eq!(refunds.count(), 2);
}

fn run_ctx() -> ToolContext {
    ToolContext::new("run-9")
}

#[tokio::test]
async fn openai_chat_conversation_steps_survive_turns_and_restarts() {
    two_turns_then_restart(
        |log, id| {
            log.push(json!({"role": "assistant", "content": null, "tool_calls": [
                chat_call(id, "refund_order", &json!({"order": "order-1", "cents": 500}))
            ]}))
        },
        |toolbox, log| async move { openai::handle_tool_calls(&toolbox, &log, &run_ctx()).await },
        |answers| answers.iter().map(|a| a["content"].clone()).collect(),
        |log, answers| log.extend(answers),
    )
    .await;
}

#[tokio::test]
async fn openai_responses_conversation_steps_survive_turns_and_restarts() {
    two_turns_then_restart(
        |log, id| {
            log.push(json!({"type": "reasoning", "id": "rs_1", "summary": []}));
            log.push(json!({"type": "function_call", "id": "fc_1", "call_id": id, "name": "refund_order", "arguments": "{\"order\": \"order-1\", \"cents\": 500}"}));
        },
        |toolbox, log| async move {
            openai::handle_function_calls(&toolbox, &log, &run_ctx()).await
        },
        |outputs| outputs.iter().map(|o| o["output"].clone()).collect(),
        |log, outputs| log.extend(outputs),
    )
    .await;
}

#[tokio::test]
async fn anthropic_conversation_steps_survive_turns_and_restarts() {
    two_turns_then_restart(
        |log, id| {
            log.push(json!({"role": "assistant", "content": [
                {"type": "text", "text": "Refunding."},
                {"type": "tool_use", "id": id, "name": "refund_order", "input": {"order": "order-1", "cents": 500}}
            ]}))
        },
        |toolbox, log| async move { anthropic::handle_tool_uses(&toolbox, &log, &run_ctx()).await },
        |results| results.iter().map(|r| r["content"].clone()).collect(),
        |log, results| log.push(json!({"role": "user", "content": results})),
    )
    .await;
}

#[tokio::test]
async fn calls_of_one_message_and_of_later_turns_take_the_next_steps() {
    let dir = tempfile::tempdir().unwrap();
    let refunds = Arc::new(Refunds::default());
    let toolbox = refund_toolbox(&dir.path().join("toolkey.db"), &refunds);
    let refund = |id: &str, cents: i64| {
        chat_call(
            id,
            "refund_order",
            &json!({"order": "order-1", "cents": cents}),
        )
    };
    let mut log = vec![
        json!({"role": "user", "content": "Refund both lines of order-1."}),
        json!({"role": "assistant", "tool_calls": [refund("a", 300), refund("b", 200)]}),
    ];
    let answers = openai::handle_tool_calls(&toolbox, &log, &run_ctx()).await;
    let ids: Vec<Value> = answers
        .iter()
        .map(|a| parsed(&a["content"])["id"].clone())
        .collect();
    assert_eq!(ids, [json!("re_1"), json!("re_2")]);
    // Only one of the two answers was saved before a crash: the other call replays.
    log.push(answers[0].clone());
    let rest = openai::handle_tool_calls(&toolbox, &log, &run_ctx()).await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["tool_call_id"], "b");
    assert_eq!(replayed_result(&rest[0]["content"])["id"], "re_2");
    assert_eq!(refunds.count(), 2);
}

#[tokio::test]
async fn a_step_key_without_a_step_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let refunds = Arc::new(Refunds::default());
    let toolbox = refund_toolbox(&dir.path().join("toolkey.db"), &refunds);
    let call = chat_call(
        "call_1",
        "refund_order",
        &json!({"order": "order-1", "cents": 500}),
    );
    for _ in 0..2 {
        let reply = openai::handle_tool_call(&toolbox, &call, &run_ctx()).await;
        let error = parsed(&reply["content"]);
        assert_eq!(error["error"]["code"], "MISSING_CONTEXT", "{error}");
        assert_eq!(error["error"]["retryable"], false);
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("ctx.step"),
            "{error}"
        );
    }
    let reply = openai::handle_tool_call(&toolbox, &call, &run_ctx().with_step(0)).await;
    assert_eq!(parsed(&reply["content"])["id"], "re_1");
    assert_eq!(refunds.count(), 1);
}

/// The fake outside system of the strict-null tools below: every effect, named.
#[derive(Default)]
struct Sent(std::sync::Mutex<Vec<String>>);

impl Sent {
    fn send(&self, what: String) -> usize {
        let mut sent = self.0.lock().unwrap();
        sent.push(what);
        sent.len()
    }
}

/// A card's details; its network has a default, so strict mode offers it as `null`.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct CardDetails {
    last4: String,
    #[serde(default)]
    network: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum Method {
    Card { card: CardDetails },
    Bank { iban: String },
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "speed", rename_all = "snake_case")]
enum Pace {
    Instant { fee: u32 },
    Standard,
}

#[toolkey::tool(idempotent(key = "pay:<order>"))]
async fn pay(
    sent: toolkey::State<Sent>,
    order: String,
    #[serde(flatten)] method: Method,
    #[serde(flatten)] pace: Pace,
) -> Result<usize, toolkey::ToolError> {
    Ok(sent.send(format!("{order}:{method:?}:{pace:?}")))
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Dims {
    w: u32,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Crate {
    w: u32,
    #[serde(default)]
    stackable: bool,
}

/// Two branches with an object field of one name and different shapes.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "by", rename_all = "snake_case")]
enum Freight {
    Air { parcel: Dims },
    Sea { parcel: Crate },
}

#[toolkey::tool(idempotent(key = "freight:<order>"))]
async fn send_freight(
    sent: toolkey::State<Sent>,
    order: String,
    #[serde(flatten)] how: Freight,
) -> Result<usize, toolkey::ToolError> {
    Ok(sent.send(format!("{order}:{how:?}")))
}

/// Found in review: strict mode offers a defaulted field inside a branch's object as `null`, and
/// the call a strict model then makes was refused ("invalid type: null"). Beside a second
/// flattened enum the branch was never found (its keys are not all the branch's); of two
/// branches with a field of one name, the first was taken whatever the tag said. The branch
/// whose tags agree with the call's, and whose fields cover the call's fields of that union,
/// now guides the nulls: both calls run, once each.
#[tokio::test]
async fn strict_nulls_inside_a_branchs_object_are_not_given() {
    let sent = Arc::new(Sent::default());
    let tb = Toolbox::builder()
        .shared_state(sent.clone())
        .tool(Pay)
        .tool(SendFreight)
        .build()
        .unwrap();
    for name in ["pay", "send_freight"] {
        let exported = tb.definition(name).unwrap().to_openai();
        assert_eq!(exported["function"]["strict"], true, "{exported:#}");
    }
    let pay = json!({
        "order": "o-1", "method": "card", "card": {"last4": "4242", "network": null},
        "iban": null, "speed": "standard", "fee": null
    });
    let sea = json!({"order": "o-2", "by": "sea", "parcel": {"w": 3, "stackable": null}});
    for (name, args) in [("pay", pay), ("send_freight", sea)] {
        let reply = openai::handle_tool_call(&tb, &chat_call(name, name, &args), &ctx()).await;
        assert!(parsed(&reply["content"]).is_number(), "{reply}");
    }
    assert_eq!(
        *sent.0.lock().unwrap(),
        [
            "o-1:Card { card: CardDetails { last4: \"4242\", network: \"\" } }:Standard",
            "o-2:Sea { parcel: Crate { w: 3, stackable: false } }"
        ]
    );
}
