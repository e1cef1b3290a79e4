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

use serde_json::{json, Value};
use toolkey::{ErrorCode, Story, ToolError, ToolOutput};

use crate::gen::Gen;
use crate::harness::{check_error_json, check_invalid, Effects, Fixture};
use crate::keys;

mod identity;
mod providers;
mod toolbox;

pub use identity::{fingerprint, key_derivation};
pub use providers::{
    anthropic_tool_use, anthropic_tool_uses, mcp_tools_call, openai_function_call,
    openai_function_calls, openai_tool_call, openai_tool_calls,
};
pub use toolbox::{status_call, toolbox_call};

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
