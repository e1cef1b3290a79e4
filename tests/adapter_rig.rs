//! Toolbox tools inside a rig agent: full agent turns against rig's own scripted completion
//! model (no network), effects counted on the fake billing system.

use std::sync::Arc;
use std::time::Duration;

use billing::{Billing, SendInvoicePatient};
use rig_agent::AgentBuilder;
use rig_core::completion::CompletionRequest;
use rig_core::message::{Message, ToolResultContent, UserContent};
use rig_core::test_utils::{MockCompletionModel, MockTurn};
use rig_core::tool::ToolErrorKind;
use serde_json::{json, Value};
use toolkey::adapters::rig::{tool_context, tools};
use toolkey::{ToolContext, Toolbox};
use toolkey_tests::billing;

/// Billing answers after 300 ms: past the tool's 200 ms timeout.
fn slow_billing() -> (Arc<Billing>, Toolbox) {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoicePatient)
        .build()
        .unwrap();
    (billing, toolbox)
}

/// The text of the tool result that ends the request's conversation, and whether rig marked
/// it as an error.
fn last_tool_result(request: &CompletionRequest) -> (String, bool) {
    let Some(Message::User { content }) = request.chat_history.last() else {
        panic!("the request ends with no tool result: {request:?}");
    };
    let Some(UserContent::ToolResult(result)) = content.last() else {
        panic!("the request ends with no tool result: {request:?}");
    };
    let text = result
        .content
        .iter()
        .map(|block| match block {
            ToolResultContent::Text(text) => text.text.clone(),
            other => panic!("a tool result that is not text: {other:?}"),
        })
        .collect();
    (text, result.is_error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_retry_after_a_timeout_is_a_replay_with_one_invoice() {
    let (billing, toolbox) = slow_billing();
    let args = json!({"customer": "acme", "period": "2026-10", "amount": 120.0,
                      "memo": "October hosting"});
    let retry = json!({"customer": "acme", "period": "2026-10", "amount": 120.0,
                       "memo": "Hosting for October"});
    let model = MockCompletionModel::from_turns([
        MockTurn::tool_call("call_1", "send_invoice", args),
        // The model reads TIMEOUT, retryable, and asks again, rewording the free-text memo.
        MockTurn::tool_call("call_2", "send_invoice", retry),
        MockTurn::text("Invoice inv-1 is sent."),
    ]);
    let agent = AgentBuilder::new(model.clone())
        .dynamic_tools(tools(&toolbox))
        .build();

    let answer = agent
        .prompt("Invoice acme 120 EUR for October 2026 hosting.")
        .tool_context(tool_context(&ToolContext::new("run-7")))
        .max_turns(5)
        .await
        .expect("the run ends with the model's answer");

    assert_eq!(answer.output(), "Invoice inv-1 is sent.");
    let requests = model.requests();
    assert_eq!(requests.len(), 3);

    let (timeout, is_error) = last_tool_result(&requests[1]);
    assert!(is_error, "a timeout is an error result: {timeout}");
    let timeout: Value = serde_json::from_str(&timeout).unwrap();
    assert_eq!(timeout["error"]["code"], "TIMEOUT");
    assert_eq!(timeout["error"]["retryable"], true);

    let (replay, is_error) = last_tool_result(&requests[2]);
    assert!(!is_error, "{replay}");
    let replay: Value = serde_json::from_str(&replay).unwrap();
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["result"]["id"], "inv-1");
    assert_eq!(replay["result"]["memo"], "October hosting");

    assert_eq!(billing.count(), 1, "one invoice for one action");
    assert_eq!(toolbox.stats().executed, 1);
    assert_eq!(toolbox.stats().replayed, 1);
    assert!(toolbox.shutdown().await.unrecorded.is_empty());
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_arguments_under_the_same_key_are_a_conflict_the_model_reads() {
    let (billing, toolbox) = slow_billing();
    *billing.delay.lock().unwrap() = Duration::ZERO;
    let model = MockCompletionModel::from_turns([
        MockTurn::tool_call(
            "call_1",
            "send_invoice",
            json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "m"}),
        ),
        MockTurn::tool_call(
            "call_2",
            "send_invoice",
            json!({"customer": "acme", "period": "2026-10", "amount": 99.0, "memo": "m"}),
        ),
        MockTurn::text("I need to ask you first."),
    ]);
    let agent = AgentBuilder::new(model.clone())
        .dynamic_tools(tools(&toolbox))
        .build();

    agent
        .prompt("Invoice acme.")
        .tool_context(tool_context(&ToolContext::new("run-8")))
        .max_turns(5)
        .await
        .unwrap();

    let (conflict, is_error) = last_tool_result(&model.requests()[2]);
    assert!(is_error);
    let conflict: Value = serde_json::from_str(&conflict).unwrap();
    assert_eq!(conflict["error"]["code"], "CONFLICT", "{conflict}");
    assert_eq!(conflict["error"]["retryable"], false);
    assert_eq!(billing.count(), 1);
}

#[tokio::test]
async fn a_run_without_toolkeys_context_runs_nothing_and_says_why() {
    let (billing, toolbox) = slow_billing();
    let model = MockCompletionModel::from_turns([
        MockTurn::tool_call(
            "call_1",
            "send_invoice",
            json!({"customer": "acme", "period": "2026-10", "amount": 1.0, "memo": ""}),
        ),
        MockTurn::text("It could not be done."),
    ]);
    let agent = AgentBuilder::new(model.clone())
        .dynamic_tools(tools(&toolbox))
        .build();

    agent.prompt("Invoice acme.").max_turns(3).await.unwrap();

    let (text, is_error) = last_tool_result(&model.requests()[1]);
    assert!(is_error);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["code"], "MISSING_CONTEXT", "{error}");
    assert_eq!(error["error"]["retryable"], false);
    assert!(toolbox.shutdown().await.unrecorded.is_empty());
    assert_eq!(billing.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rig_sees_toolkeys_error_kind_code_and_retryability() {
    let (billing, toolbox) = slow_billing();
    let tools = tools(&toolbox);
    let send = tools
        .iter()
        .find(|tool| tool.name().as_str() == "send_invoice")
        .unwrap();
    let mut context = tool_context(&ToolContext::new("run-9").with_tenant("acme-corp"));
    let args = json!({"customer": "acme", "period": "2026-11", "amount": 5.0, "memo": ""});

    let err = send
        .execute_with(&mut context, args.clone())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ToolErrorKind::Timeout);
    assert_eq!(err.code(), Some("TIMEOUT"));
    assert_eq!(err.retryable(), Some(true));

    let err = send
        .execute_with(&mut context, json!({"customer": "acme"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ToolErrorKind::InvalidArgs);
    assert_eq!(err.code(), Some("INVALID_ARGUMENTS"));

    // The status companion is a rig tool too, and the tenant reached the store: the record
    // is found under the same tenant.
    assert!(toolbox.shutdown().await.unrecorded.is_empty());
    let status = tools
        .iter()
        .find(|tool| tool.name().as_str() == "invoice_status")
        .unwrap();
    let out = status.execute_with(&mut context, args).await.unwrap();
    let found: Value = serde_json::from_str(out.as_text().unwrap()).unwrap();
    assert_eq!(found["status"], "completed", "{found}");
    let mut other_tenant = tool_context(&ToolContext::new("run-9").with_tenant("other"));
    let out = status
        .execute_with(
            &mut other_tenant,
            json!({"customer": "acme", "period": "2026-11"}),
        )
        .await
        .unwrap();
    let found: Value = serde_json::from_str(out.as_text().unwrap()).unwrap();
    assert_eq!(found["status"], "not_found", "{found}");
    assert_eq!(billing.count(), 1);
}
