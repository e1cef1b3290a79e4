//! MCP: `tools/call` in, a `CallToolResult` out; with feature `mcp`, [`McpServer`] serves a whole
//! toolbox over stdio on rmcp, the official Rust MCP SDK; with feature `mcp-http`,
//! [`McpHttp`](http::McpHttp) serves it over streamable HTTP, every request authenticated, each
//! principal fixing its calls' tenant and scoping the run ids it names (see [`http`]), as an
//! OAuth 2.1 resource server when given its [protected resource](http#oauth); with `mcp-oauth`,
//! `oauth::JwtAuthenticator` checks bearer JWTs against their issuer's keys.
//!
//! A result is a text block with the result's JSON, plus the result itself as
//! `structuredContent` when it is an object (MCP's structured content is always one). A replay
//! says so twice: in a second text block the model reads (the first block and
//! `structuredContent` stay the result itself, as the tool's output schema describes it), and
//! in `_meta` for programs: `{"toolkey/replayed": true}`. An error is `isError: true` with the
//! error's JSON form, `{"error": {"code", "message", "retryable", "suggestion"}}`, as text.
//!
//! # Run ids
//!
//! Keys that use `ctx.run_id` need a run id, and MCP has none, so [`McpServer`] makes one per
//! session: `mcp-<uuid>`, generated when the client sends `initialize`. Every call of one
//! connection — one agent session — shares it, and a new connection starts a new run.
//!
//! A request in no session has no run: the 2026-07-28 protocol has no sessions, and rmcp serves
//! each such HTTP request with a server of its own, so a run made for a request would be made
//! again for its retry, and the retry would act again. A call whose key needs a run
//! (`<ctx.run_id>` or `<ctx.step>`, its status companion's too) must then name its run in
//! `_meta` (accepted over HTTP, scoped to the principal), or it is answered `MISSING_CONTEXT`,
//! saying so, and nothing runs. Any other call runs with an empty run id.
//!
//! A run id or event id a client names in a request's `_meta` (`toolkey/run_id`,
//! `toolkey/event_id`) is refused by default: the request is answered with the error
//! `RUN_ID_NOT_ACCEPTED` and nothing runs. Were it trusted, a client naming another client's
//! run would be answered with that client's results, and its own action would never happen. A
//! server whose clients have their own notion of a run (an agent runtime that resumes runs
//! across connections) opts in with [`McpServer::with_client_run_ids`], and what a client names is
//! then scoped to that client ([`ClientRunIds`]): to its session, or to a principal the server
//! sets for it. The run id the tools see carries the scope
//! (`mcp-principal:<length of the principal>:<principal>:<run id>`), so two clients naming the
//! same run id name two runs.
//!
//! ```json
//! {"name": "refund", "arguments": {..},
//!  "_meta": {"toolkey/run_id": "run-7", "toolkey/step": 4, "toolkey/event_id": "evt-81"}}
//! ```
//!
//! # Steps
//!
//! MCP has no conversation a server could count calls in, so a key that uses `<ctx.step>`
//! needs the client to name the step in `_meta["toolkey/step"]`: the call's position in its
//! run's log (see [`ToolContext`]). A request without one leaves the step unset, and such a key
//! answers `MISSING_CONTEXT`. The server does not count calls itself: a retry of one call would
//! count as the next step, and a retried refund would be a second refund. A step is always
//! within the call's run, so naming one reaches no other client's records.
//!
//! The tenant is the server's ([`McpServer::with_tenant`]) — over HTTP, the authenticated
//! principal's — never the client's: records are kept per tenant, and a tenant a client could
//! name would let it read another's.
//!
//! # Progress
//!
//! A request whose `_meta` carries a `progressToken` gets a `notifications/progress` for each
//! [`ctx.progress(..)`](ToolContext::progress) its tool's body makes, in order, before the
//! result.

//! # Tasks
//!
//! A long call need not outlast the client's patience. When a client declares the Tasks
//! extension (`io.modelcontextprotocol/tasks`, SEP-2663) on its request, a keyed call still
//! running after 10 s ([`McpServer::with_tasks_after`]), or past its tool's own `timeout`, is
//! answered with a task (`resultType: "task"`); the body goes on as always. The client polls
//! `tasks/get`: `working` while the call runs, `completed` once it ended, with the answer the
//! call itself gave: its result, marked as a replay exactly when the call's answer was one (a
//! duplicate that waited for another caller's call and replayed it), or the `isError` answer
//! (the extension keeps `failed` for protocol errors). The task follows its own call, whoever
//! reserved the key first: a duplicate that took the key once the first call freed it, and
//! acted, ends with its own result. Should the process running the call stop first, the
//! task reads the call's record in the toolbox's store: its result, `OUTCOME_UNKNOWN` for a call
//! that stopped without recording what it did (do not repeat it), or [`NO_OUTCOME`] for one
//! that released its key (call again).
//!
//! A task is announced only once it exists durably (the call's record is in progress, and a
//! task record names it), so it survives a restart, and any instance on a shared store
//! (PostgreSQL, Redis, one SQLite file) answers its polls. A task belongs to its tenant and to
//! the caller that made it, over HTTP its principal, else its session: anyone else asking for
//! its id is told there is no such task. Its id is random and carries no argument. The same
//! call again from the same caller while it runs (the task's answer lost with a dropped
//! connection) is answered with the same task.
//! `tasks/cancel` is acknowledged and changes nothing: a body is never cancelled, and the
//! task ends as its call does. A client that does not declare the extension waits as before,
//! and a call past its `timeout` answers `TIMEOUT`, naming the status tool.

// `McpServer` exists with feature `mcp` only, `http` with `mcp-http`; the docs name them either way.
#![cfg_attr(not(feature = "mcp-http"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "mcp")]
mod server;
#[cfg(feature = "mcp")]
mod tasks;

#[cfg(feature = "mcp-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp-http")))]
pub mod http;

#[cfg(feature = "mcp-oauth")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp-oauth")))]
pub mod oauth;

#[cfg(feature = "mcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp")))]
pub use server::McpServer;

use serde_json::{json, Map, Value};

use super::{run, str_field};
use crate::{texts, ToolContext, ToolError, ToolOutput, Toolbox};

/// The `_meta` key of a request that names the run id (a string).
pub const META_RUN_ID: &str = "toolkey/run_id";
/// The `_meta` key of a request that names the step (a non-negative integer).
pub const META_STEP: &str = "toolkey/step";
/// The `_meta` key of a request that names the event id (a string).
pub const META_EVENT_ID: &str = "toolkey/event_id";
/// The `_meta` key of a result that marks it as a replay of an earlier call's outcome.
pub const META_REPLAYED: &str = "toolkey/replayed";

/// The error code of a request that names a run id or event id a server does not accept.
pub const RUN_ID_NOT_ACCEPTED: &str = "RUN_ID_NOT_ACCEPTED";

/// The error code of a task whose call ended without recording an outcome: a failure its tool
/// marked as safe to retry released its key. Calling again with the same arguments is safe.
pub const NO_OUTCOME: &str = "NO_OUTCOME";

/// Whether a server accepts the run ids and event ids clients name in `_meta`, and to whom
/// they are scoped. See [Run ids](self#run-ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientRunIds {
    /// A request that names one is refused with [`RUN_ID_NOT_ACCEPTED`]; every call runs in its
    /// session's run. The default.
    #[default]
    Refused,
    /// Accepted and scoped to the client's session: a run id names one of this session's runs,
    /// and another session naming the same run id names another run. Runs end with the session;
    /// a request in no session naming one is answered `MISSING_CONTEXT`, and nothing runs.
    Session,
    /// Accepted and scoped to a principal the server sets for this client (the user it
    /// authenticated, the account a stdio server was started for): the sessions of one
    /// principal share their runs, so a run resumes across connections, and no other
    /// principal can name them. The principal must identify the client: two clients given one
    /// principal share their runs.
    Principal(String),
}

impl ClientRunIds {
    /// The identity a client named, scoped to that client; an error when it is refused, or
    /// scoped to a session and the request has none.
    fn scope(
        &self,
        named: &str,
        key: &str,
        session_run_id: Option<&str>,
    ) -> Result<String, ToolError> {
        let (kind, scope) = match self {
            ClientRunIds::Refused => {
                return Err(texts::client_run_id_refused(RUN_ID_NOT_ACCEPTED, key))
            }
            ClientRunIds::Session => (
                "mcp-session",
                session_run_id.ok_or_else(|| texts::no_session_for_run(key))?,
            ),
            ClientRunIds::Principal(principal) => ("mcp-principal", principal.as_str()),
        };
        // The scope's length first, so no scope and name can pass for another pair.
        Ok(format!("{kind}:{}:{scope}:{named}", scope.len()))
    }
}

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
                reply["content"]
                    .as_array_mut()
                    .expect("content is a list")
                    .push(json!({"type": "text", "text": texts::MCP_REPLAY_NOTE}));
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

/// The context of one call: the session's run id, and the step a request's `_meta` names; the
/// run id and event id it names when `client_run_ids` accepts them, scoped to the client. See
/// [Run ids](self#run-ids).
///
/// ```
/// use serde_json::json;
/// use toolkey::providers::mcp::{context_from_meta, ClientRunIds};
///
/// let meta = json!({"toolkey/step": 4});
/// let ctx = context_from_meta(meta.as_object(), "mcp-session", &ClientRunIds::Refused).unwrap();
/// assert_eq!((ctx.run_id(), ctx.step()), ("mcp-session", Some(4)));
///
/// let meta = json!({"toolkey/run_id": "run-7"});
/// let refused = context_from_meta(meta.as_object(), "mcp-session", &ClientRunIds::Refused);
/// assert_eq!(refused.unwrap_err().code(), "RUN_ID_NOT_ACCEPTED");
///
/// let alice = ClientRunIds::Principal("alice".into());
/// let ctx = context_from_meta(meta.as_object(), "mcp-session", &alice).unwrap();
/// assert_eq!(ctx.run_id(), "mcp-principal:5:alice:run-7");
/// ```
pub fn context_from_meta(
    meta: Option<&Map<String, Value>>,
    session_run_id: &str,
    client_run_ids: &ClientRunIds,
) -> Result<ToolContext, ToolError> {
    call_context(meta, Some(session_run_id), client_run_ids, None)
}

/// [`context_from_meta`] for a request that may belong to no session (`session_run_id`:
/// `None`), calling `tool` (when known) in `toolbox`. Such a request has no run of its own: a
/// call whose key needs one (`<ctx.run_id>`, `<ctx.step>`) and names none is refused, since a
/// run made for the request would be made again for its retry. Any other runs with an empty run
/// id, which no key reads.
pub(crate) fn call_context(
    meta: Option<&Map<String, Value>>,
    session_run_id: Option<&str>,
    client_run_ids: &ClientRunIds,
    tool: Option<(&Toolbox, &str)>,
) -> Result<ToolContext, ToolError> {
    let empty = Map::new();
    let meta = meta.unwrap_or(&empty);
    let text = |key: &str| match meta.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.is_empty() => Ok(Some(text.clone())),
        Some(_) => Err(texts::bad_meta(key, "a non-empty string")),
    };
    let scoped = |key: &str| match text(key)? {
        Some(named) => client_run_ids.scope(&named, key, session_run_id).map(Some),
        None => Ok(None),
    };
    let run_id = match (scoped(META_RUN_ID)?, session_run_id) {
        (Some(named), _) => named,
        (None, Some(session)) => session.to_string(),
        (None, None) => match tool {
            Some((toolbox, name)) if needs_run(toolbox, name) => {
                let may_name = client_run_ids != &ClientRunIds::Refused;
                return Err(texts::run_required(name, may_name));
            }
            _ => String::new(),
        },
    };
    let mut ctx = ToolContext::new(run_id);
    match meta.get(META_STEP) {
        None | Some(Value::Null) => {}
        Some(step) => {
            ctx = ctx.with_step(
                step.as_u64()
                    .ok_or_else(|| texts::bad_meta(META_STEP, "a non-negative integer"))?,
            )
        }
    }
    if let Some(event) = scoped(META_EVENT_ID)? {
        ctx = ctx.with_event(event);
    }
    Ok(ctx)
}

/// Whether a call of `name` keys its record by its run: its key, or for a status companion its
/// tool's, names `ctx.run_id` or `ctx.step` (a step is a place within one run).
fn needs_run(toolbox: &Toolbox, name: &str) -> bool {
    toolbox.record_template(name).is_some_and(|template| {
        crate::key::placeholders(template).any(|name| matches!(name, "ctx.run_id" | "ctx.step"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn results_carry_structure_replays_and_errors() {
        let ok = Ok(ToolOutput {
            value: json!({"id": "inv-1"}),
            replayed: true,
        });
        assert_eq!(
            call_tool_result(&ok),
            json!({
                "content": [
                    {"type": "text", "text": "{\"id\":\"inv-1\"}"},
                    {"type": "text", "text": texts::MCP_REPLAY_NOTE}
                ],
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
    fn meta_names_the_step_and_scoped_run_and_event_ids() {
        let meta = json!({"toolkey/run_id": "run-7", "toolkey/step": 4, "toolkey/event_id": "evt-1", "progressToken": 1});
        let refused = context_from_meta(meta.as_object(), "session", &ClientRunIds::Refused);
        assert_eq!(refused.unwrap_err().code(), RUN_ID_NOT_ACCEPTED);
        let only_event = json!({"toolkey/event_id": "evt-1"});
        let refused = context_from_meta(only_event.as_object(), "session", &ClientRunIds::Refused);
        assert_eq!(refused.unwrap_err().code(), RUN_ID_NOT_ACCEPTED);

        let ctx = context_from_meta(meta.as_object(), "mcp-1", &ClientRunIds::Session).unwrap();
        assert_eq!(
            (ctx.run_id(), ctx.step(), ctx.event_id()),
            (
                "mcp-session:5:mcp-1:run-7",
                Some(4),
                Some("mcp-session:5:mcp-1:evt-1")
            )
        );
        // The scope's length keeps the pair apart: principal "a:1" with run "x" is not
        // principal "a" with run "1:x".
        let scoped = |principal: &str, run: &str| {
            let meta = json!({"toolkey/run_id": run});
            let policy = ClientRunIds::Principal(principal.into());
            context_from_meta(meta.as_object(), "s", &policy)
                .unwrap()
                .run_id()
                .to_string()
        };
        assert_ne!(scoped("a:1", "x"), scoped("a", "1:x"));
        assert_eq!(scoped("alice", "run-7"), scoped("alice", "run-7"));

        let none = context_from_meta(None, "session", &ClientRunIds::Refused).unwrap();
        assert_eq!((none.run_id(), none.step()), ("session", None));
        let bad = json!({"toolkey/step": "four"});
        assert!(context_from_meta(bad.as_object(), "session", &ClientRunIds::Refused).is_err());
        let bad = json!({"toolkey/run_id": 7});
        assert!(context_from_meta(bad.as_object(), "session", &ClientRunIds::Session).is_err());
    }
}
