//! Toolbox tools through async-openai's typed Chat Completions messages: a full agent loop
//! against a scripted model (no network) that reads the tool messages and decides as a model
//! would, effects counted on fake outside systems.

use std::sync::Arc;
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionMessageCustomToolCall, ChatCompletionMessageToolCall,
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionResponseMessage, CreateChatCompletionRequest, CreateChatCompletionResponse,
    CustomTool, FunctionCall,
};
use billing::{Billing, RefundOrder, Refunds, SendInvoicePatient};
use serde_json::{json, Value};
use toolkey::adapters::async_openai::{assistant_message, handle_tool_calls, tools};
use toolkey::{ToolContext, Toolbox};
use toolkey_tests::billing;

fn text(message: &ChatCompletionRequestMessage) -> Option<Value> {
    let ChatCompletionRequestMessage::Tool(tool) = message else {
        return None;
    };
    let ChatCompletionRequestToolMessageContent::Text(text) = &tool.content else {
        return None;
    };
    serde_json::from_str(text).ok()
}

fn call(id: &str, name: &str, arguments: Value) -> ChatCompletionMessageToolCalls {
    ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
        id: id.into(),
        function: FunctionCall {
            name: name.into(),
            arguments: arguments.to_string(),
        },
    })
}

/// A model that invoices acme, retries what it is told is safe to retry, and reports what
/// the last tool message says. It sees the request as the wire carries it.
fn scripted_model(request: &Value) -> Value {
    let request: CreateChatCompletionRequest = serde_json::from_value(request.clone()).unwrap();
    assert!(request
        .tools
        .as_ref()
        .is_some_and(|tools| !tools.is_empty()));
    let round = request
        .messages
        .iter()
        .filter(|message| matches!(message, ChatCompletionRequestMessage::Assistant(_)))
        .count();
    let invoice = json!({"customer": "acme", "period": "2026-10", "amount": 120.0,
                         "memo": if round == 0 { "October hosting" } else { "Hosting, October" }});
    let message = match request.messages.last().and_then(text) {
        None => ChatCompletionResponseMessage {
            tool_calls: Some(vec![call("call_0", "send_invoice", invoice)]),
            ..Default::default()
        },
        Some(answer) if answer["error"]["retryable"] == true => ChatCompletionResponseMessage {
            tool_calls: Some(vec![call(
                &format!("call_{round}"),
                "send_invoice",
                invoice,
            )]),
            ..Default::default()
        },
        Some(answer) if answer["replayed"] == true => ChatCompletionResponseMessage {
            content: Some(format!(
                "Invoice {} had already been sent.",
                answer["result"]["id"].as_str().unwrap()
            )),
            ..Default::default()
        },
        Some(answer) => ChatCompletionResponseMessage {
            content: Some(format!("Done: {answer}")),
            ..Default::default()
        },
    };
    json!({
        "id": format!("chatcmpl-{round}"),
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": null}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_retry_after_a_timeout_is_a_replay_with_one_invoice() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoicePatient)
        .build()
        .unwrap();
    let ctx = ToolContext::new("run-7");
    let mut messages: Vec<ChatCompletionRequestMessage> =
        vec![ChatCompletionRequestUserMessage::from("Invoice acme 120 EUR for October.").into()];

    let mut answers = Vec::new();
    let reply = loop {
        let request = CreateChatCompletionRequest {
            model: "scripted".into(),
            messages: messages.clone(),
            tools: Some(tools(&toolbox)),
            ..Default::default()
        };
        let response: CreateChatCompletionResponse =
            serde_json::from_value(scripted_model(&serde_json::to_value(&request).unwrap()))
                .unwrap();
        let message = &response.choices[0].message;
        messages.push(assistant_message(message).into());
        if message.tool_calls.is_none() {
            break message.content.clone().unwrap();
        }
        assert!(answers.len() < 4, "the model keeps calling: {answers:?}");
        for answer in handle_tool_calls(&toolbox, &messages, &ctx).await {
            messages.push(answer.into());
            answers.push(text(messages.last().unwrap()).unwrap());
        }
    };

    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["error"]["code"], "TIMEOUT");
    assert_eq!(answers[0]["error"]["retryable"], true);
    assert_eq!(answers[1]["replayed"], true, "{}", answers[1]);
    assert_eq!(answers[1]["result"]["memo"], "October hosting");
    assert_eq!(reply, "Invoice inv-1 had already been sent.");
    assert_eq!(billing.count(), 1, "one invoice for one action");
    assert!(toolbox.shutdown().await.unrecorded.is_empty());
    assert_eq!(billing.count(), 1);
}

#[test]
fn the_typed_tools_are_the_openai_export() {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(SendInvoicePatient)
        .build()
        .unwrap();
    let typed = tools(&toolbox);
    assert_eq!(typed.len(), 2, "the tool and its status companion");
    for (tool, definition) in typed.iter().zip(toolbox.definitions()) {
        assert_eq!(serde_json::to_value(tool).unwrap(), definition.to_openai());
    }
}

#[tokio::test]
async fn a_conversation_handed_over_again_replays_each_call_at_its_step() {
    let refunds = Arc::new(Refunds::default());
    let toolbox = Toolbox::builder()
        .shared_state(refunds.clone())
        .tool(RefundOrder)
        .build()
        .unwrap();
    let ctx = ToolContext::new("run-3");
    let reply = ChatCompletionResponseMessage {
        tool_calls: Some(vec![
            call(
                "call_0",
                "refund_order",
                json!({"order": "o-1", "cents": 500}),
            ),
            call(
                "call_1",
                "refund_order",
                json!({"order": "o-1", "cents": 500}),
            ),
        ]),
        ..Default::default()
    };
    let messages: Vec<ChatCompletionRequestMessage> = vec![
        ChatCompletionRequestUserMessage::from("Refund o-1 twice, 5 EUR each.").into(),
        assistant_message(&reply).into(),
    ];

    let first = handle_tool_calls(&toolbox, &messages, &ctx).await;
    assert_eq!(first.len(), 2);
    assert_eq!(refunds.count(), 2, "two calls at two steps are two refunds");

    // A crash before the answers were saved: the same conversation comes back.
    let again = handle_tool_calls(&toolbox, &messages, &ctx).await;
    assert_eq!(again.len(), 2);
    assert_eq!(
        refunds.count(),
        2,
        "a resumed conversation refunds nothing again"
    );
    for answer in again {
        let answer = text(&answer.into()).unwrap();
        assert_eq!(answer["replayed"], true, "{answer}");
    }

    // Answered calls are not answered twice.
    let mut answered = messages.clone();
    answered.extend(first.into_iter().map(ChatCompletionRequestMessage::from));
    assert!(handle_tool_calls(&toolbox, &answered, &ctx)
        .await
        .is_empty());
    assert_eq!(refunds.count(), 2);
}

#[tokio::test]
async fn a_custom_tool_call_is_answered_with_an_error_the_model_reads() {
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoicePatient)
        .build()
        .unwrap();
    let reply = ChatCompletionResponseMessage {
        tool_calls: Some(vec![ChatCompletionMessageToolCalls::Custom(
            ChatCompletionMessageCustomToolCall {
                id: "call_c".into(),
                custom_tool: CustomTool {
                    name: "send_invoice".into(),
                    input: "acme 2026-10".into(),
                },
            },
        )]),
        ..Default::default()
    };
    let messages = vec![assistant_message(&reply).into()];
    let answers = handle_tool_calls(&toolbox, &messages, &ToolContext::new("run-4")).await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].tool_call_id, "call_c");
    let answer = text(&answers[0].clone().into()).unwrap();
    assert_eq!(answer["error"]["code"], "INVALID_ARGUMENTS", "{answer}");
    assert_eq!(billing.count(), 0);
}
