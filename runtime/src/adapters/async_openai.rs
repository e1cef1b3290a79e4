//! [async-openai](https://crates.io/crates/async-openai)'s typed Chat Completions tools, tool
//! calls and tool messages (feature `async-openai`).
//!
//! [`tools`] gives the request's `tools` list; [`handle_tool_calls`] answers the calls of the
//! run's conversation that have no tool message yet, each with its position in the
//! conversation as its step, as [`providers::openai::handle_tool_calls`] does for JSON
//! messages; [`handle_tool_call`] answers one call with the context as given. The model reads
//! the same text either way: the result as JSON, a replay wrapped with a note that it was not
//! done again, an error as `{"error": {"code", "message", "retryable", "suggestion"}}`.
//!
//! One turn of an agent loop, with the client's `chat().create(..)` where the model answers:
//!
//! ```
//! use async_openai::types::chat::{
//!     ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
//!     ChatCompletionRequestMessage, ChatCompletionRequestUserMessage,
//!     ChatCompletionResponseMessage, CreateChatCompletionRequest, FunctionCall,
//! };
//! use toolkey::adapters::async_openai as tk;
//! use toolkey::{tool, Toolbox, ToolContext, ToolError};
//!
//! /// Today's exchange rate from one currency to another.
//! #[tool(read_only)]
//! async fn rate(from: String, to: String) -> Result<f64, ToolError> {
//!     Ok(if from == to { 1.0 } else { 1.08 })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let toolbox = Toolbox::builder().tool(Rate).build().unwrap();
//! let mut messages: Vec<ChatCompletionRequestMessage> =
//!     vec![ChatCompletionRequestUserMessage::from("How many USD is one EUR?").into()];
//! let request = CreateChatCompletionRequest {
//!     model: "gpt-5".into(),
//!     messages: messages.clone(),
//!     tools: Some(tk::tools(&toolbox)),
//!     ..Default::default()
//! };
//! # let _ = request;
//! // `client.chat().create(request).await?.choices[0].message`, here written out:
//! let reply = ChatCompletionResponseMessage {
//!     tool_calls: Some(vec![ChatCompletionMessageToolCalls::Function(
//!         ChatCompletionMessageToolCall {
//!             id: "call_1".into(),
//!             function: FunctionCall {
//!                 name: "rate".into(),
//!                 arguments: r#"{"from": "EUR", "to": "USD"}"#.into(),
//!             },
//!         },
//!     )]),
//!     ..Default::default()
//! };
//! messages.push(tk::assistant_message(&reply).into());
//! let ctx = ToolContext::new("run-7");
//! for answer in tk::handle_tool_calls(&toolbox, &messages, &ctx).await {
//!     messages.push(answer.into());
//! }
//! // The next request sends `messages`, the tool message with the rate included.
//! assert_eq!(messages.len(), 3);
//! # }
//! ```
//!
//! [`providers::openai::handle_tool_calls`]: crate::providers::openai::handle_tool_calls

use ::async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestAssistantMessageContent, ChatCompletionRequestMessage,
    ChatCompletionRequestToolMessage, ChatCompletionRequestToolMessageContent,
    ChatCompletionResponseMessage, ChatCompletionTool, ChatCompletionTools, FunctionObject,
};
use serde_json::Value;

use crate::providers::{content, run, unanswered, with_call_id, Entry};
use crate::texts::wrong_item_type;
use crate::{ToolContext, Toolbox};

/// The toolbox's tools for a request's `tools`, status companions included: each as
/// [`ToolDefinition::to_openai`](crate::ToolDefinition::to_openai) exports it, with the same
/// strict-mode schema where the tool's arguments allow one.
///
/// ```
/// use toolkey::{tool, Toolbox, ToolError};
/// use async_openai::types::chat::ChatCompletionTools;
///
/// /// Today's exchange rate from one currency to another.
/// #[tool(read_only)]
/// async fn rate(from: String, to: String) -> Result<f64, ToolError> {
///     Ok(1.08)
/// }
///
/// let toolbox = Toolbox::builder().tool(Rate).build().unwrap();
/// let tools = toolkey::adapters::async_openai::tools(&toolbox);
/// let ChatCompletionTools::Function(tool) = &tools[0] else { panic!("a function tool") };
/// assert_eq!(tool.function.name, "rate");
/// assert_eq!(tool.function.strict, Some(true));
/// ```
pub fn tools(toolbox: &Toolbox) -> Vec<ChatCompletionTools> {
    toolbox
        .definitions()
        .iter()
        .map(|definition| {
            let mut exported = definition.to_openai();
            let function = exported["function"].take();
            ChatCompletionTools::Function(ChatCompletionTool {
                function: FunctionObject {
                    name: definition.name().to_string(),
                    description: Some(definition.description().to_string()),
                    parameters: Some(function["parameters"].clone()),
                    strict: function["strict"].as_bool(),
                },
            })
        })
        .collect()
}

/// Runs one entry of an assistant message's `tool_calls` and returns the tool message that
/// answers it.
///
/// The call runs with `ctx` as given: set its step when the tool's key uses `<ctx.step>`, or
/// use [`handle_tool_calls`], which numbers the calls of the conversation. A custom tool call
/// (toolkey's tools are all functions) is answered with an `INVALID_ARGUMENTS` error the model
/// can read, as are arguments that are not a JSON object.
///
/// ```
/// use async_openai::types::chat::{
///     ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
///     ChatCompletionRequestToolMessageContent, FunctionCall,
/// };
/// use toolkey::{tool, Toolbox, ToolContext, ToolError};
///
/// /// Today's exchange rate from one currency to another.
/// #[tool(read_only)]
/// async fn rate(from: String, to: String) -> Result<f64, ToolError> {
///     Ok(1.08)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let toolbox = Toolbox::builder().tool(Rate).build().unwrap();
/// let call = ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
///     id: "call_1".into(),
///     function: FunctionCall { name: "rate".into(), arguments: r#"{"from": "EUR"}"#.into() },
/// });
/// let ctx = ToolContext::new("run-7");
/// let answer = toolkey::adapters::async_openai::handle_tool_call(&toolbox, &call, &ctx).await;
/// assert_eq!(answer.tool_call_id, "call_1");
/// let ChatCompletionRequestToolMessageContent::Text(text) = answer.content else { panic!() };
/// assert!(text.contains(r#""code":"INVALID_ARGUMENTS""#), "{text}");
/// # }
/// ```
pub async fn handle_tool_call(
    toolbox: &Toolbox,
    tool_call: &ChatCompletionMessageToolCalls,
    ctx: &ToolContext,
) -> ChatCompletionRequestToolMessage {
    let (id, result) = match tool_call {
        ChatCompletionMessageToolCalls::Function(call) => {
            let arguments = Value::String(call.function.arguments.clone());
            let ctx = with_call_id(ctx, &call.id);
            let result = run(toolbox, Some(&call.function.name), Some(&arguments), &ctx).await;
            (&call.id, result)
        }
        ChatCompletionMessageToolCalls::Custom(call) => {
            (&call.id, Err(wrong_item_type("function", "custom")))
        }
    };
    let (text, _) = content(&result);
    ChatCompletionRequestToolMessage {
        content: ChatCompletionRequestToolMessageContent::Text(text),
        tool_call_id: id.clone(),
    }
}

/// Answers the tool calls of a conversation that have no tool message yet, in order, and
/// returns the tool messages to append.
///
/// `messages` is the run's conversation from its start, the assistant message with the new
/// `tool_calls` included. Each call runs with `ctx` and its step: its position among every
/// tool call of the conversation's assistant messages (the run's first call is step 0). A
/// conversation handed over again — after a crash, or from another process on the same store
/// — gives each call the same step, so a keyed call replays instead of running again (see
/// [Steps](crate::providers#steps)).
pub async fn handle_tool_calls(
    toolbox: &Toolbox,
    messages: &[ChatCompletionRequestMessage],
    ctx: &ToolContext,
) -> Vec<ChatCompletionRequestToolMessage> {
    let calls: Vec<&ChatCompletionMessageToolCalls> = messages
        .iter()
        .flat_map(|message| match message {
            ChatCompletionRequestMessage::Assistant(assistant) => {
                assistant.tool_calls.as_deref().unwrap_or_default()
            }
            _ => &[],
        })
        .collect();
    // `unanswered` pairs ids with opaque values: each call's value is its index in `calls`.
    let indexes: Vec<Value> = (0..calls.len()).map(Value::from).collect();
    let mut index = indexes.iter();
    let entries = messages.iter().flat_map(|message| {
        let mut entries = Vec::new();
        match message {
            ChatCompletionRequestMessage::Assistant(assistant) => {
                for call in assistant.tool_calls.as_deref().unwrap_or_default() {
                    if let Some(index) = index.next() {
                        entries.push(Entry::Call(call_id(call), index));
                    }
                }
            }
            ChatCompletionRequestMessage::Tool(answer) => {
                entries.push(Entry::Answer(answer.tool_call_id.as_str()))
            }
            _ => {}
        }
        entries
    });
    let mut answers = Vec::new();
    for (step, index) in unanswered(entries) {
        let Some(call) = index.as_u64().and_then(|i| calls.get(i as usize)) else {
            continue;
        };
        answers.push(handle_tool_call(toolbox, call, &ctx.clone().with_step(step)).await);
    }
    answers
}

/// The request message that carries a response's assistant message into the conversation:
/// its text, refusal and tool calls, so the next request and [`handle_tool_calls`] see the
/// calls the model made.
pub fn assistant_message(
    response: &ChatCompletionResponseMessage,
) -> ChatCompletionRequestAssistantMessage {
    ChatCompletionRequestAssistantMessage {
        content: response
            .content
            .clone()
            .map(ChatCompletionRequestAssistantMessageContent::Text),
        refusal: response.refusal.clone(),
        tool_calls: response.tool_calls.clone(),
        ..Default::default()
    }
}

fn call_id(call: &ChatCompletionMessageToolCalls) -> &str {
    match call {
        ChatCompletionMessageToolCalls::Function(call) => &call.id,
        ChatCompletionMessageToolCalls::Custom(call) => &call.id,
    }
}
