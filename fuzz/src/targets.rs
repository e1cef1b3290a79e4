//! The fuzz targets: each takes an input's bytes and panics when a property fails.
//!
//! | target | input | properties beyond "no panic, no hang" |
//! |---|---|---|
//! | [`toolbox_call`] | a tool name and arguments | schema-invalid ⇒ `INVALID_ARGUMENTS` and no write; schema-valid ⇒ accepted; read-only tools never write; a retry replays; a set in another order replays; the status tool reports the result |
//! | [`status_call`] | a status companion's arguments | never a write; an answer of the documented shapes, or `INVALID_ARGUMENTS` |
//! | [`openai_tool_call`] | a Chat Completions `tool_calls` entry | the tool message's shape; errors in the content; malformed calls refused with no write |
//! | [`openai_function_call`] | a Responses `function_call` item | the same, as a `function_call_output` item |
//! | [`anthropic_tool_use`] | an Anthropic `tool_use` block | the same, as a `tool_result` block whose `is_error` is true exactly for errors |
//! | [`openai_tool_calls`], [`openai_function_calls`], [`anthropic_tool_uses`] | a whole conversation of calls, answers and anything else | every answer has the provider's shape and answers a call of the conversation; with the answers appended, nothing is left to answer |
//! | [`mcp_tools_call`] | MCP `tools/call` params and their `_meta` | the same, as a `CallToolResult`; `_meta` gives a context or `MISSING_CONTEXT` |
//! | [`key_derivation`] | key part values, two at a time | a key never exceeds its length nor loses its namespace; two values share a key exactly when they normalize alike; control characters never reach a key |
//! | [`fingerprint`] | any JSON | a value read back from its JSON text keeps its fingerprint; values equal by the documented rule share a fingerprint, others do not |
//! | [`operator::shell_quoting`](crate::operator::shell_quoting) | tenants, keys and revisions | each value quoted for pasting is, to a real POSIX shell, that value alone; the `resolve` line `show` prints passes exactly the record's tenant, key and revision; a value no command line can carry gets no line |
//! | [`operator::cli_resolve`](crate::operator::cli_resolve) | a record's tenant and key, `--result`, `--retain`, a store path | the pasted line, run, resolves the record it names or is refused changing nothing; no other record is touched; a retention too short is refused; a path to no file is refused and makes none |
//! | [`operator::admin_operations`](crate::operator::admin_operations) | lookalike records in every state, then resolutions, listings and purges | a resolution applies exactly to the unknown record and revision named, as asked, and changes no other record; a refusal changes nothing; listings admit only what their filter admits |

use serde_json::{json, Map, Value};
use toolkey::providers::{anthropic, mcp, openai};
use toolkey::{ErrorCode, Fingerprint, Story, ToolError, ToolOutput};

use crate::gen::Gen;
use crate::harness::{check_error_json, check_invalid, check_size, Effects, Fixture, Tally};
use crate::keys;

/// Arguments for `tool` (or for an unknown tool): raw bytes read as JSON, any JSON, or the
/// tool's schema filled in and then broken a little.
fn arguments(g: &mut Gen, fx: &Fixture, tool: &str) -> Value {
    // The first choice is what an input too short to choose gets: the common case.
    match (g.range(0, 9), fx.tools.get(tool)) {
        (9, _) => {
            let bytes = g.bytes(512);
            serde_json::from_slice(bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
        }
        (7 | 8, _) | (_, None) => g.json(),
        (_, Some(info)) => {
            let valid = g.valid(&info.schema, &info.schema);
            g.mutate(valid)
        }
    }
}

/// A tool name: one the toolbox has, most of the time.
fn tool_name(g: &mut Gen, fx: &Fixture) -> String {
    if g.chance(7, 8) {
        g.pick(&fx.names).clone()
    } else {
        g.text()
    }
}

/// What the toolbox does with arguments the runtime reads as `null`: no arguments at all.
fn as_call_args(args: &Value) -> Value {
    if args.is_null() {
        json!({})
    } else {
        args.clone()
    }
}

/// Checks one call's answer against the tool's schema and story.
fn judge(
    fx: &Fixture,
    name: &str,
    args: &Value,
    result: &Result<ToolOutput, ToolError>,
    done: Effects,
) {
    if let Err(err) = result {
        check_error_json(&err.to_json());
    }
    let Some(info) = fx.tools.get(name) else {
        let err = result.as_ref().expect_err("an unknown tool answered");
        assert!(err.is(ErrorCode::UnknownTool), "{name:?}: {err:?}");
        assert_eq!(
            done,
            Effects {
                writes: 0,
                effects: 0
            },
            "{name:?}"
        );
        return;
    };
    let args = as_call_args(args);
    match result {
        Err(err) if err.is(ErrorCode::InvalidArguments) => {
            check_invalid(err, done, name);
            assert!(
                !info.strictly_valid(&args)
                    || keys::has_control_in_key(name, &args)
                    || has_inexact_whole_float(&args),
                "`{name}` refused arguments its schema accepts: {args}\n{err:?}"
            );
        }
        _ => assert!(
            info.leniently_valid(&args),
            "`{name}` accepted arguments its schema refuses: {args}\nanswer: {result:?}, {done:?}"
        ),
    }
    if !info.keyed() {
        assert_eq!(done.writes, 0, "`{name}` is not keyed and wrote: {args}");
    }
    if info.is_status || info.story == Story::ReadOnly {
        assert_eq!(done.effects, 0, "`{name}` is read-only and acted: {args}");
    }
}

/// True when `args` hold a whole float of 2^53 or more in size. JSON Schema's `integer` takes
/// one, but it stands for several integers the model may have written (`9007199254740993.0`
/// reads as ...992), so an integer field refuses it rather than act on another number.
fn has_inexact_whole_float(args: &Value) -> bool {
    match args {
        Value::Number(n) => {
            n.is_f64()
                && n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9_007_199_254_740_992.0)
        }
        Value::Array(items) => items.iter().any(has_inexact_whole_float),
        Value::Object(map) => map.values().any(has_inexact_whole_float),
        _ => false,
    }
}

/// Tool arguments through [`toolkey::Toolbox::call`]: up to three calls on one store, each
/// judged by the tool's schema and story, each accepted keyed call retried (as sent, and with
/// its sets in another order) and looked up with its status tool.
pub fn toolbox_call(bytes: &[u8], tally: &Tally) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        // A call may replay an earlier call's result: answers are bounded by all input so far.
        let mut sent = 0;
        for _ in 0..g.range(1, 3) {
            let name = tool_name(&mut g, fx);
            let args = arguments(&mut g, fx, &name);
            sent += name.len() + args.to_string().len();
            let (result, done) = fx.call(&name, args.clone());
            tally.answer(&result);
            judge(fx, &name, &args, &result, done);
            let answer = match &result {
                Ok(output) => output.value.to_string(),
                Err(err) => err.to_json().to_string(),
            };
            check_size(&answer, sent);
            let keyed = fx.tools.get(&name).is_some_and(|info| info.keyed());
            if let (Ok(first), true) = (&result, keyed) {
                check_retry(fx, &name, &as_call_args(&args), first);
            }
        }
    })
}

/// A keyed call that was accepted is answered the same on a retry, without running again;
/// with its sets in another order too; and its status tool reports its result.
fn check_retry(fx: &Fixture, name: &str, args: &Value, first: &ToolOutput) {
    let info = &fx.tools[name];
    let mut retries = vec![args.clone()];
    if !info.set_fields.is_empty() {
        let mut reordered = args.clone();
        for field in &info.set_fields {
            if let Some(Value::Array(items)) = reordered.get_mut(field) {
                items.reverse();
            }
        }
        retries.push(reordered);
    }
    for retry in retries {
        let (again, done) = fx.call(name, retry.clone());
        let again = again.unwrap_or_else(|e| {
            panic!("`{name}` accepted {args} and then answered its retry {retry} with {e:?}")
        });
        assert!(again.replayed, "`{name}`: a retry of {args} ran again");
        assert_eq!(again.value, first.value, "`{name}`: a retry of {args}");
        assert_eq!(done.effects, 0, "`{name}`: a retry of {args} acted");
    }
    if let Some(status) = &info.status_tool {
        let (answer, done) = fx.call(status, args.clone());
        let answer = answer.unwrap_or_else(|e| panic!("`{status}` with {args}: {e:?}"));
        assert_eq!(
            answer.value["status"], "completed",
            "`{status}` with {args}"
        );
        assert_eq!(
            answer.value["result"], first.value,
            "`{status}` with {args}"
        );
        assert_eq!(done.writes, 0, "`{status}` wrote");
    }
}

/// A status companion's arguments, after its target ran once with valid arguments (so some
/// answers are `completed`): never a write, never an effect, always a documented shape.
pub fn status_call(bytes: &[u8], tally: &Tally) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        let statuses: Vec<&str> = fx
            .names
            .iter()
            .filter(|n| fx.tools[*n].is_status)
            .map(String::as_str)
            .collect();
        let status = *g.pick(&statuses);
        let target = fx
            .tools
            .values()
            .find(|t| t.status_tool.as_deref() == Some(status))
            .expect("a status tool has a target");
        // Run the target once, so that the status tool has something to find.
        let seeded = g.valid(&target.schema, &target.schema);
        let _ = fx.call(&target.name, seeded.clone());
        for _ in 0..g.range(1, 3) {
            let args = if g.chance(1, 4) {
                g.mutate(seeded.clone())
            } else {
                arguments(&mut g, fx, status)
            };
            let (result, done) = fx.call(status, args.clone());
            tally.answer(&result);
            judge(fx, status, &args, &result, done);
            assert_eq!(
                done,
                Effects {
                    writes: 0,
                    effects: 0
                },
                "`{status}` {args}"
            );
            match &result {
                Ok(output) => {
                    let value = &output.value;
                    let fields: Vec<&str> = match value["status"].as_str() {
                        Some("not_found" | "conflict") => vec!["detail", "status"],
                        Some("in_progress" | "unknown") => vec!["since", "status"],
                        Some("completed") => vec!["completed_at", "result", "status"],
                        Some("failed") => vec!["completed_at", "error", "status"],
                        _ => panic!("`{status}` answered {value}"),
                    };
                    // A record found with only the key checked says so in a note.
                    let noted = value.get("note").is_some_and(Value::is_string);
                    assert!(
                        !noted
                            || !matches!(value["status"].as_str(), Some("not_found" | "conflict")),
                        "`{status}` answered {value}"
                    );
                    let mut keys: Vec<&str> = value
                        .as_object()
                        .map(|o| {
                            o.keys()
                                .map(String::as_str)
                                .filter(|k| *k != "note")
                                .collect()
                        })
                        .unwrap_or_default();
                    keys.sort_unstable();
                    assert_eq!(keys, fields, "`{status}` answered {value}");
                }
                Err(err) => assert!(
                    err.is(ErrorCode::InvalidArguments),
                    "`{status}` with {args}: {err:?}"
                ),
            }
        }
    })
}

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

/// Key derivation, through the tools of [`keys`]: see [`keys::check`].
pub fn key_derivation(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    keys::check(&mut g, tally);
}

/// [`Fingerprint::of`] on any JSON: the value sent as JSON text and read back has the same
/// fingerprint; values equal by the documented rule (object key order, a whole float and the
/// integer it equals) share it, and values that differ do not.
pub fn fingerprint(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    let value = if g.chance(3, 4) {
        g.json()
    } else {
        serde_json::from_slice(g.bytes(1024)).unwrap_or(Value::Null)
    };
    let other = match g.range(0, 3) {
        0 => value.clone(),
        1 => respell_numbers(&value),
        2 => g.mutate(value.clone()),
        _ => g.json(),
    };
    let fp = Fingerprint::of(&value).expect("any JSON has a fingerprint");
    tally.code(None);
    let text = value.to_string();
    let reparsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("JSON text does not read back ({e}): {text}"));
    assert_eq!(
        Fingerprint::of(&reparsed).expect("fingerprint"),
        fp,
        "{text}"
    );
    let other_fp = Fingerprint::of(&other).expect("fingerprint");
    assert_eq!(
        same_value(&value, &other),
        fp == other_fp,
        "{value} and {other}"
    );
}

/// The whole number a JSON number is, when it is one an `i64` or `u64` holds (a float spelled
/// `1e16` included).
fn whole(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    let fits = (-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&f);
    (f.fract() == 0.0 && fits).then_some(f as i128)
}

/// The same value with its numbers spelled the other way where that keeps the value: integers
/// a float holds exactly as floats, whole floats as the integers they equal.
fn respell_numbers(value: &Value) -> Value {
    match value {
        Value::Number(n) => match whole(n) {
            Some(i) if n.is_f64() => match i64::try_from(i) {
                Ok(i) => Value::from(i),
                Err(_) => Value::from(u64::try_from(i).expect("a whole float in range")),
            },
            Some(i) if (i as f64) as i128 == i => Value::from(i as f64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(respell_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), respell_numbers(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Equality by the documented rule: numbers by value, where a whole float equals the integer
/// it is; object key order does not matter (serde_json's maps have none).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (whole(x), whole(y)) {
            (Some(i), Some(j)) => i == j,
            (None, None) => x.as_f64() == y.as_f64(),
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}
