//! Provider messages through their adapters: one call at a time, and whole conversations.

use serde_json::{json, Map, Value};
use toolkey::providers::{anthropic, mcp, openai};
use toolkey::ErrorCode;

use super::{arguments, tool_name};
use crate::gen::Gen;
use crate::harness::{check_error_json, check_size, Effects, Fixture, Tally};

/// How a provider message carries a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Provider {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Mcp,
}

impl Provider {
    /// The `type` field a call message must have (MCP params have none).
    fn call_type(self) -> Option<&'static str> {
        match self {
            Provider::OpenAiChat => Some("function"),
            Provider::OpenAiResponses => Some("function_call"),
            Provider::Anthropic => Some("tool_use"),
            Provider::Mcp => None,
        }
    }

    /// True when the provider sends arguments as a string of JSON.
    fn arguments_as_text(self) -> bool {
        matches!(self, Provider::OpenAiChat | Provider::OpenAiResponses)
    }
}

/// A provider's call message: well formed with generated arguments most of the time, else any
/// JSON or bytes.
fn provider_message(g: &mut Gen, fx: &Fixture, provider: Provider) -> Value {
    match g.range(0, 9) {
        8 => return g.json(),
        9 => {
            let bytes = g.bytes(512);
            return serde_json::from_slice(bytes).unwrap_or(Value::Null);
        }
        _ => {}
    }
    let name = tool_name(g, fx);
    let args = arguments(g, fx, &name);
    let arguments = match g.range(0, 5) {
        // As the provider sends them.
        0..=2 if provider.arguments_as_text() => Value::String(args.to_string()),
        0..=2 => args,
        // The other way, or bytes as text, or nothing.
        3 if provider.arguments_as_text() => args,
        3 => Value::String(args.to_string()),
        4 => Value::String(String::from_utf8_lossy(g.bytes(256)).into_owned()),
        _ => Value::Null,
    };
    let name = match g.range(0, 9) {
        8 => Value::Null,
        9 => g.json(),
        _ => Value::String(name),
    };
    let call_type = match (provider.call_type(), g.range(0, 9)) {
        (Some(t), 0..=6) => Value::String(t.into()),
        (_, 7) => Value::String(g.text()),
        (_, 8) => g.json(),
        _ => Value::Null,
    };
    let id = if g.chance(7, 8) {
        Value::String(format!("call_{}", g.text()))
    } else {
        g.json()
    };
    let mut message = Map::new();
    let mut put = |key: &str, value: Value| {
        if !value.is_null() {
            message.insert(key.to_string(), value);
        }
    };
    match provider {
        Provider::OpenAiChat => {
            put("id", id);
            put("type", call_type);
            put("function", json!({"name": name, "arguments": arguments}));
        }
        Provider::OpenAiResponses => {
            put("type", call_type);
            put("call_id", id);
            put("name", name);
            put("arguments", arguments);
        }
        Provider::Anthropic => {
            put("type", call_type);
            put("id", id);
            put("name", name);
            put("input", arguments);
        }
        Provider::Mcp => {
            put("name", name);
            put("arguments", arguments);
        }
    }
    Value::Object(message)
}

/// What the adapter must answer for `message`, as far as the provider's own rules decide it.
enum Expected {
    /// A `type` other than the provider's call type: refused.
    WrongType,
    /// No tool name, or one the toolbox lacks.
    UnknownTool,
    /// Arguments that are not JSON, or not an object: refused.
    Malformed,
    /// A call of a tool with these arguments (`None` when they hold a `null` somewhere, which
    /// the adapter may drop for an optional field: the schema alone cannot judge them).
    Call(String, Option<Value>),
}

fn expected(fx: &Fixture, provider: Provider, message: &Value) -> Expected {
    let (name, arguments) = match provider {
        Provider::OpenAiChat => (
            &message["function"]["name"],
            &message["function"]["arguments"],
        ),
        Provider::OpenAiResponses | Provider::Mcp => (&message["name"], &message["arguments"]),
        Provider::Anthropic => (&message["name"], &message["input"]),
    };
    if let (Some(t), Some(Value::String(found))) = (provider.call_type(), message.get("type")) {
        if found != t {
            return Expected::WrongType;
        }
    }
    let Some(name) = name.as_str().filter(|n| fx.tools.contains_key(*n)) else {
        return Expected::UnknownTool;
    };
    let args = match arguments {
        Value::String(text) if text.trim().is_empty() => json!({}),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(value) => value,
            Err(_) => return Expected::Malformed,
        },
        other => other.clone(),
    };
    let args = match args {
        Value::Null => json!({}),
        Value::Object(_) => args,
        _ => return Expected::Malformed,
    };
    let judged = (!has_null(&args)).then_some(args);
    Expected::Call(name.to_string(), judged)
}

fn has_null(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.iter().any(has_null),
        Value::Object(map) => map.values().any(has_null),
        _ => false,
    }
}

/// Reads an adapter's reply back into the answer: the text the model reads, and whether the
/// provider's own error flag is set (`None` where it has none).
fn reply_text(provider: Provider, message: &Value, reply: &Value) -> (String, Option<bool>) {
    let keys = |v: &Value| -> Vec<String> {
        let mut keys: Vec<String> = v
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys
    };
    let id_of = |field: &str| match message.get(field) {
        Some(Value::String(id)) => id.clone(),
        _ => String::new(),
    };
    match provider {
        Provider::OpenAiChat => {
            assert_eq!(keys(reply), ["content", "role", "tool_call_id"], "{reply}");
            assert_eq!(reply["role"], "tool");
            assert_eq!(reply["tool_call_id"], id_of("id").as_str(), "{reply}");
            (reply["content"].as_str().expect("text").to_string(), None)
        }
        Provider::OpenAiResponses => {
            assert_eq!(keys(reply), ["call_id", "output", "type"], "{reply}");
            assert_eq!(reply["type"], "function_call_output");
            assert_eq!(reply["call_id"], id_of("call_id").as_str(), "{reply}");
            (reply["output"].as_str().expect("text").to_string(), None)
        }
        Provider::Anthropic => {
            assert_eq!(
                keys(reply),
                ["content", "is_error", "tool_use_id", "type"],
                "{reply}"
            );
            assert_eq!(reply["type"], "tool_result");
            assert_eq!(reply["tool_use_id"], id_of("id").as_str(), "{reply}");
            let is_error = reply["is_error"].as_bool().expect("a bool");
            (
                reply["content"].as_str().expect("text").to_string(),
                Some(is_error),
            )
        }
        Provider::Mcp => {
            let is_error = reply["isError"].as_bool().expect("a bool");
            let content = reply["content"].as_array().expect("a content array");
            // The result's own text, and for a replay a second block with the note.
            let replayed = reply.get("_meta").is_some();
            assert_eq!(content.len(), 1 + usize::from(replayed), "{reply}");
            assert!(content
                .iter()
                .all(|c| c["type"] == "text" && c["text"].is_string()));
            let text = content[0]["text"].as_str().expect("text").to_string();
            for key in keys(reply) {
                match key.as_str() {
                    "content" | "isError" => {}
                    "structuredContent" => {
                        assert!(!is_error, "{reply}");
                        let parsed: Value = serde_json::from_str(&text).expect("JSON text");
                        assert!(parsed.is_object(), "{reply}");
                        assert_eq!(reply["structuredContent"], parsed, "{reply}");
                    }
                    "_meta" => assert_eq!(reply["_meta"], json!({"toolkey/replayed": true})),
                    other => panic!("a CallToolResult with `{other}`: {reply}"),
                }
            }
            (text, Some(is_error))
        }
    }
}

/// One provider message through its adapter.
fn provider_call(bytes: &[u8], tally: &Tally, provider: Provider) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        // A call may replay an earlier call's result: answers are bounded by all input so far.
        let mut sent = 0;
        for _ in 0..g.range(1, 3) {
            let message = provider_message(&mut g, fx, provider);
            sent += message.to_string().len();
            let mut ctx = Fixture::context();
            if provider == Provider::Mcp {
                let meta = mcp_meta(&mut g);
                let client_run_ids = match g.range(0, 2) {
                    0 => mcp::ClientRunIds::Refused,
                    1 => mcp::ClientRunIds::Session,
                    _ => mcp::ClientRunIds::Principal(g.text()),
                };
                match mcp::context_from_meta(meta.as_object(), "mcp-session", &client_run_ids) {
                    Ok(from_meta) => ctx = from_meta.with_tenant("tenant-fuzz"),
                    Err(err) => {
                        // The server answers with this error, and nothing runs.
                        check_error_json(&err.to_json());
                        assert!(
                            err.is(ErrorCode::MissingContext)
                                || err.code() == mcp::RUN_ID_NOT_ACCEPTED,
                            "{meta}: {err:?}"
                        );
                        tally.answer::<()>(&Err(err));
                        continue;
                    }
                }
            }
            let toolbox = &fx.toolbox;
            let (reply, done) = fx.observe(async {
                match provider {
                    Provider::OpenAiChat => openai::handle_tool_call(toolbox, &message, &ctx).await,
                    Provider::OpenAiResponses => {
                        openai::handle_function_call(toolbox, &message, &ctx).await
                    }
                    Provider::Anthropic => {
                        anthropic::handle_tool_use(toolbox, &message, &ctx).await
                    }
                    Provider::Mcp => mcp::handle_tools_call(toolbox, &message, &ctx).await,
                }
            });
            check_size(&reply.to_string(), sent);
            let (text, flag) = reply_text(provider, &message, &reply);
            let parsed: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("the model reads text that is not JSON ({e}): {text}"));
            let error = parsed
                .as_object()
                .filter(|o| o.len() == 1 && o.contains_key("error"))
                .map(|_| &parsed);
            if let Some(is_error) = flag {
                assert_eq!(is_error, error.is_some(), "{reply}");
            }
            let code = error.map(|e| {
                check_error_json(e);
                e["error"]["code"].as_str().unwrap_or_default().to_string()
            });
            tally.code(code.as_deref());
            let refused = code.as_deref().is_some_and(|c| {
                [
                    ErrorCode::InvalidArguments,
                    ErrorCode::UnknownTool,
                    ErrorCode::MissingContext,
                ]
                .iter()
                .any(|refusal| c == refusal.as_str())
            });
            if refused {
                assert_eq!(
                    done,
                    Effects {
                        writes: 0,
                        effects: 0
                    },
                    "{message} -> {reply}"
                );
            }
            let must_be = |wanted: ErrorCode| {
                assert_eq!(
                    code.as_deref(),
                    Some(wanted.as_str()),
                    "{message} -> {reply}"
                );
                assert_eq!(
                    done,
                    Effects {
                        writes: 0,
                        effects: 0
                    },
                    "{message}"
                );
            };
            match expected(fx, provider, &message) {
                Expected::WrongType | Expected::Malformed => must_be(ErrorCode::InvalidArguments),
                Expected::UnknownTool => must_be(ErrorCode::UnknownTool),
                Expected::Call(name, Some(args)) => {
                    let info = &fx.tools[&name];
                    if !info.leniently_valid(&args) {
                        must_be(ErrorCode::InvalidArguments);
                    }
                    if !info.keyed() {
                        assert_eq!(done.writes, 0, "`{name}` wrote: {message}");
                    }
                }
                Expected::Call(name, None) => {
                    if !fx.tools[&name].keyed() {
                        assert_eq!(done.writes, 0, "`{name}` wrote: {message}");
                    }
                }
            }
        }
    })
}

/// A run's conversation as a provider keeps it: assistant turns with calls (well formed or
/// not), answers to some of them (by a call's id, or any id), and messages of any shape.
/// Returns the messages and the ids of the calls in them.
fn conversation(g: &mut Gen, fx: &Fixture, provider: Provider) -> (Vec<Value>, Vec<Value>) {
    let mut messages = Vec::new();
    let mut ids: Vec<Value> = Vec::new();
    for _ in 0..g.range(1, 5) {
        match g.range(0, 4) {
            0 | 1 => {
                let calls: Vec<Value> = (0..g.range(0, 3))
                    .map(|_| provider_message(g, fx, provider))
                    .collect();
                for call in &calls {
                    let id = match provider {
                        Provider::OpenAiResponses => &call["call_id"],
                        _ => &call["id"],
                    };
                    ids.push(id.clone());
                }
                match provider {
                    Provider::OpenAiChat => {
                        messages.push(json!({"role": "assistant", "tool_calls": calls}))
                    }
                    Provider::Anthropic => {
                        messages.push(json!({"role": "assistant", "content": calls}))
                    }
                    _ => messages.extend(calls),
                }
            }
            2 => {
                let id = if !ids.is_empty() && g.chance(3, 4) {
                    g.pick(&ids).clone()
                } else {
                    Value::String(g.text())
                };
                messages.push(match provider {
                    Provider::OpenAiChat => {
                        json!({"role": "tool", "tool_call_id": id, "content": "{}"})
                    }
                    Provider::Anthropic => json!({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": id, "content": "{}"}
                    ]}),
                    _ => json!({"type": "function_call_output", "call_id": id, "output": "{}"}),
                });
            }
            _ => messages.push(g.json()),
        }
    }
    (messages, ids)
}

/// A whole conversation through a provider's conversation handler: every answer has the
/// provider's shape and answers a call of the conversation, and the conversation with those
/// answers appended has nothing left to answer (a resumed run does not run a call twice).
fn conversation_call(bytes: &[u8], tally: &Tally, provider: Provider) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        let (mut messages, ids) = conversation(&mut g, fx, provider);
        // An answer names its call's id, or "" for a call whose id is not a string.
        let call_ids: Vec<&str> = ids.iter().map(|id| id.as_str().unwrap_or("")).collect();
        let sent = Value::Array(messages.clone()).to_string().len();
        let toolbox = &fx.toolbox;
        let ctx = toolkey::ToolContext::new("run-fuzz").with_tenant("tenant-fuzz");
        let handle = |messages: Vec<Value>| {
            let ctx = ctx.clone();
            async move {
                match provider {
                    Provider::OpenAiChat => {
                        openai::handle_tool_calls(toolbox, &messages, &ctx).await
                    }
                    Provider::OpenAiResponses => {
                        openai::handle_function_calls(toolbox, &messages, &ctx).await
                    }
                    _ => anthropic::handle_tool_uses(toolbox, &messages, &ctx).await,
                }
            }
        };
        let (answers, _) = fx.observe(handle(messages.clone()));
        let id_field = match provider {
            Provider::OpenAiResponses => "call_id",
            _ => "id",
        };
        for answer in &answers {
            check_size(&answer.to_string(), sent);
            let id = match provider {
                Provider::OpenAiChat => &answer["tool_call_id"],
                Provider::OpenAiResponses => &answer["call_id"],
                _ => &answer["tool_use_id"],
            };
            let id = id.as_str().expect("an answer's id is a string");
            assert!(call_ids.contains(&id), "an answer to no call: {answer}");
            let call = json!({ id_field: id });
            let (text, _) = reply_text(provider, &call, answer);
            let parsed: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("the model reads text that is not JSON ({e}): {text}"));
            let code = parsed
                .as_object()
                .filter(|o| o.len() == 1 && o.contains_key("error"))
                .map(|_| {
                    check_error_json(&parsed);
                    parsed["error"]["code"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                });
            tally.code(code.as_deref());
        }
        match provider {
            Provider::Anthropic if !answers.is_empty() => {
                messages.push(json!({"role": "user", "content": answers}))
            }
            _ => messages.extend(answers),
        }
        let (left, _) = fx.observe(handle(messages.clone()));
        assert!(
            left.is_empty(),
            "answered calls were answered again: {left:?}\nconversation: {messages:?}"
        );
    })
}

/// A Chat Completions conversation through [`openai::handle_tool_calls`].
pub fn openai_tool_calls(bytes: &[u8], tally: &Tally) {
    conversation_call(bytes, tally, Provider::OpenAiChat)
}

/// A Responses `input` list through [`openai::handle_function_calls`].
pub fn openai_function_calls(bytes: &[u8], tally: &Tally) {
    conversation_call(bytes, tally, Provider::OpenAiResponses)
}

/// A Messages conversation through [`anthropic::handle_tool_uses`].
pub fn anthropic_tool_uses(bytes: &[u8], tally: &Tally) {
    conversation_call(bytes, tally, Provider::Anthropic)
}

/// An MCP request's `_meta`: the keys toolkey reads, with values of every type, or any JSON.
fn mcp_meta(g: &mut Gen) -> Value {
    if g.chance(1, 4) {
        return g.json();
    }
    let mut meta = Map::new();
    for key in [mcp::META_RUN_ID, mcp::META_STEP, mcp::META_EVENT_ID] {
        match g.range(0, 3) {
            0 => {}
            1 => {
                meta.insert(key.into(), Value::String(g.text()));
            }
            2 => {
                meta.insert(key.into(), g.number());
            }
            _ => {
                meta.insert(key.into(), g.json());
            }
        }
    }
    Value::Object(meta)
}

/// A Chat Completions `tool_calls` entry through [`openai::handle_tool_call`].
pub fn openai_tool_call(bytes: &[u8], tally: &Tally) {
    provider_call(bytes, tally, Provider::OpenAiChat)
}

/// A Responses `function_call` item through [`openai::handle_function_call`].
pub fn openai_function_call(bytes: &[u8], tally: &Tally) {
    provider_call(bytes, tally, Provider::OpenAiResponses)
}

/// An Anthropic `tool_use` block through [`anthropic::handle_tool_use`].
pub fn anthropic_tool_use(bytes: &[u8], tally: &Tally) {
    provider_call(bytes, tally, Provider::Anthropic)
}

/// MCP `tools/call` params, in the context their `_meta` names, through
/// [`mcp::handle_tools_call`].
pub fn mcp_tools_call(bytes: &[u8], tally: &Tally) {
    provider_call(bytes, tally, Provider::Mcp)
}
