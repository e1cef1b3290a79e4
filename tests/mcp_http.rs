//! A toolbox served over MCP's streamable HTTP transport behind bearer tokens, driven by the
//! official Python SDK's client (`tests/mcp_http/client.py`, in a child process) and by rmcp's
//! client: principals never reach each other's records, a bad credential runs nothing, a client
//! that drops mid-call and reconnects gets its first call's result as a replay, and progress
//! notifications arrive in order. Every scenario ends with an exact count of charges on a fake
//! ledger.
//!
//! The Python SDK is `TOOLKEY_MCP_PYTHON` (default `target/mcp-venv/bin/python`, which
//! `.ci/services.sh` installs). A missing SDK fails these tests, naming `scripts/test.sh`.
#![cfg(feature = "mcp-http")]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, MetaObject, NumberOrString, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use toolkey::providers::mcp::http::{bearer_token, McpHttp, Parts, Principal, Refusal};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::mcp_wire::{rpc_answer, wire_answer, wire_error};
use toolkey_tests::{billing, mcp_python};

use billing::{RefundOrder, Refunds};
use mcp_python::python;

// ---- the server -------------------------------------------------------------------------------

/// A fake outside payment system: every charge it made, and how long each of a charge's three
/// stages takes.
#[derive(Default)]
struct Ledger {
    charges: Mutex<Vec<Payment>>,
    stage_ms: AtomicU64,
}

impl Ledger {
    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// One charge the payment system made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Payment {
    /// The payment system's id.
    id: String,
    order: String,
    cents: i64,
    /// The tenant the charge was made for.
    tenant: String,
}

/// Charge an order, in three stages, reporting progress before each.
#[tool(idempotent(
    key = "charge:<ctx.run_id>:<order>",
    status = false,
    on_in_progress = "wait(20s)"
))]
async fn charge(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    /// The order to charge.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Payment, ToolError> {
    let stage = Duration::from_millis(ledger.stage_ms.load(Ordering::SeqCst));
    for i in 1..=3 {
        ctx.progress(f64::from(i), Some(3.0), &format!("stage {i} of 3"))
            .await;
        tokio::time::sleep(stage).await;
    }
    let mut charges = ledger.charges.lock().unwrap();
    let payment = Payment {
        id: format!("ch_{}", charges.len() + 1),
        order,
        cents,
        tenant: ctx.tenant().unwrap_or_default().to_string(),
    };
    charges.push(payment.clone());
    Ok(payment)
}

/// Alice and Bob, each their own tenant; an Alice of another tenant; Carol is known and may
/// not use the server; every other credential is refused.
fn authenticate(request: &Parts) -> Result<Principal, Refusal> {
    match bearer_token(request) {
        Some("alice-token") => Ok(Principal::new("alice")),
        Some("other-alice-token") => Ok(Principal::new("alice").with_tenant("elsewhere")),
        Some("bob-token") => Ok(Principal::new("bob")),
        Some("carol-token") => Err(Refusal::forbidden("carol may not use this server")),
        Some(_) => Err(Refusal::unauthenticated("unknown token")),
        None => Err(Refusal::unauthenticated("a bearer token is required")),
    }
}

struct Server {
    url: String,
    ledger: Arc<Ledger>,
    refunds: Arc<Refunds>,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// A server on a free local port whose charges take three stages of `stage` each.
    async fn start(stage: Duration) -> Server {
        Server::start_with(stage, |mcp| mcp).await
    }

    /// [`Server::start`], the endpoint configured by `configure`.
    async fn start_with(stage: Duration, configure: impl FnOnce(McpHttp) -> McpHttp) -> Server {
        let ledger = Arc::new(Ledger::default());
        ledger
            .stage_ms
            .store(stage.as_millis() as u64, Ordering::SeqCst);
        let refunds = Arc::new(Refunds::default());
        let toolbox = Toolbox::builder()
            .shared_state(ledger.clone())
            .shared_state(refunds.clone())
            .tool(Charge)
            .tool(RefundOrder)
            .build()
            .expect("a valid toolbox");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let mcp = configure(McpHttp::new(toolbox, authenticate));
        let served = tokio::spawn(mcp.serve(listener, async {
            let _ = stopped.await;
        }));
        Server {
            url,
            ledger,
            refunds,
            stop,
            served,
        }
    }

    /// Stops the server, waiting for bodies still running; the ledger's final count.
    async fn stop(self) -> usize {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.served)
            .await
            .expect("the server stops in time")
            .expect("the server task ends")
            .expect("the server ends cleanly");
        self.ledger.count()
    }
}

// ---- the Python SDK's client ------------------------------------------------------------------

/// What one run of `client.py` printed, and how it ended.
struct PySession {
    code: Option<i32>,
    lines: Vec<Value>,
}

/// One Python client session: connects with `token`, makes `calls`
/// (`[{"tool", "arguments", "meta"?, "progress"?}]`) in order.
async fn python_session(python: &PathBuf, url: &str, token: &str, calls: Value) -> PySession {
    python_plan(python, json!({"url": url, "token": token, "calls": calls})).await
}

async fn python_plan(python: &PathBuf, plan: Value) -> PySession {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_http/client.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .arg(plan.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the Python client finishes in time")
        .expect("the Python client starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let session = PySession {
        code: out.status.code(),
        lines,
    };
    if !matches!(session.code, Some(0 | 3)) {
        panic!(
            "the Python client failed ({:?}):\n{stdout}\n{}",
            session.code,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    session
}

/// A call of `charge` for order-1 in run `run`, as the Python plan names it.
fn py_charge(run: &str, progress: bool) -> Value {
    json!({
        "tool": "charge",
        "arguments": {"order": "order-1", "cents": 500},
        "meta": {"toolkey/run_id": run},
        "progress": progress,
    })
}

/// The charge id of a wire `CallToolResult`, and whether it is a replay.
fn wire_outcome(result: &Value) -> (String, bool) {
    assert_eq!(result["isError"], false, "{result}");
    let id = result["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a charge: {result}"))
        .to_string();
    (id, result["_meta"]["toolkey/replayed"] == true)
}

// ---- rmcp's client ----------------------------------------------------------------------------

/// One progress notification: how far, of how much, and the message.
type Report = (f64, Option<f64>, Option<String>);

/// An rmcp client handler that keeps the progress notifications it receives, and says when the
/// first one came.
#[derive(Default)]
struct Progress {
    seen: Mutex<Vec<Report>>,
    first: Notify,
}

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.seen
            .lock()
            .unwrap()
            .push((params.progress, params.total, params.message));
        self.first.notify_one();
    }
}

impl Progress {
    /// Waits until `n` notifications were handled.
    async fn wait_for(&self, n: usize) {
        let handled = async {
            while self.seen.lock().unwrap().len() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), handled)
            .await
            .unwrap_or_else(|_| panic!("{n} progress notifications: {:?}", self.seen));
    }
}

type Client = RunningService<RoleClient, Arc<Progress>>;

async fn rmcp_client(url: &str, token: &str) -> Result<Client, String> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    Arc::new(Progress::default())
        .serve(transport)
        .await
        .map_err(|e| e.to_string())
}

/// `charge` for order-1 in run `run`, asking for progress.
fn rmcp_charge(run: &str) -> CallToolRequestParams {
    let mut meta = RequestMetaObject::with_progress_token(ProgressToken(NumberOrString::Number(1)));
    meta.0.insert("toolkey/run_id".into(), json!(run));
    let mut params = CallToolRequestParams::new("charge").with_arguments(
        json!({"order": "order-1", "cents": 500})
            .as_object()
            .unwrap()
            .clone(),
    );
    params.meta = Some(meta);
    params
}

fn rmcp_outcome(result: &CallToolResult) -> (String, bool) {
    let value = serde_json::to_value(result).unwrap();
    wire_outcome(&value)
}

async fn rmcp_call(client: &Client, run: &str) -> CallToolResult {
    tokio::time::timeout(Duration::from_secs(30), client.call_tool(rmcp_charge(run)))
        .await
        .expect("the call is answered in time")
        .expect("tools/call succeeds")
}

/// A raw `initialize` POST with `token`: the HTTP status and the session id it was given.
async fn raw_initialize(url: &str, token: Option<&str>) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}})
            .to_string(),
        )
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let _ = response.text().await;
    (status, session, challenge)
}

/// A raw request without a body (GET listens on a session, DELETE closes it): the status.
async fn raw_request(url: &str, method: Method, token: &str, session: &str) -> u16 {
    let response = reqwest::Client::new()
        .request(method, url)
        .header("accept", "text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .expect("the server answers");
    response.status().as_u16()
}

/// A raw JSON-RPC POST on a session: the status and the body.
async fn raw_post(url: &str, token: &str, session: &str, message: Value) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(message.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A `tools/call` of `tool` as the 2026-07-28 protocol sends it: no session, the version,
/// capabilities and client in the request's own `_meta`, beside `meta`.
fn stateless_call(tool: &str, arguments: Value, meta: Value) -> String {
    let mut meta = meta;
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
    meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "raw", "version": "0"});
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments, "_meta": meta}})
    .to_string()
}

/// POSTs `body`, a 2026-07-28 `tools/call` of `tool` (see [`stateless_call`]), with `token`,
/// its `Host` header `host` when given: the HTTP status, and the result the JSON-RPC answer
/// carries (`null` without one).
async fn stateless_post(
    url: &str,
    token: &str,
    tool: &str,
    body: &str,
    host: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool);
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let response = request
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let answer = rpc_answer(&text).map_or(Value::Null, |message| message["result"].clone());
    (status, answer)
}

/// An rmcp client on the 2026-07-28 protocol: `server/discover`, then every request on its own,
/// in no session.
async fn rmcp_stateless_client(url: &str, token: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    Arc::new(Progress::default())
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("the client discovers the server")
}

/// README's refund (`refund:<ctx.run_id>:<ctx.step>`) of order-1 by rmcp's `client`, with
/// `meta`: its answer on the wire.
async fn rmcp_refund(client: &Client, meta: Value) -> Value {
    let mut params = CallToolRequestParams::new("refund_order").with_arguments(
        json!({"order": "order-1", "cents": 500})
            .as_object()
            .unwrap()
            .clone(),
    );
    params.meta = Some(RequestMetaObject(MetaObject(
        meta.as_object().unwrap().clone(),
    )));
    let result = tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
        .await
        .expect("the call is answered in time")
        .expect("tools/call succeeds");
    serde_json::to_value(result).unwrap()
}

// ---- the scenarios, with the Python SDK -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_principals_never_see_each_others_records() {
    let python = python();
    let server = Server::start(Duration::ZERO).await;
    let twice = json!([py_charge("run-1", false), py_charge("run-1", false)]);

    // Alice and Bob make the same call, naming the same run id: one charge each.
    let alice = python_session(&python, &server.url, "alice-token", twice.clone()).await;
    let bob = python_session(&python, &server.url, "bob-token", twice).await;
    let outcomes = |s: &PySession| s.lines.iter().map(wire_outcome).collect::<Vec<_>>();
    assert_eq!(
        outcomes(&alice),
        [("ch_1".to_string(), false), ("ch_1".to_string(), true)]
    );
    assert_eq!(
        outcomes(&bob),
        [("ch_2".to_string(), false), ("ch_2".to_string(), true)]
    );
    assert_eq!(alice.lines[0]["structuredContent"]["tenant"], "alice");
    assert_eq!(bob.lines[0]["structuredContent"]["tenant"], "bob");

    // A new connection of Alice's continues her run: a replay of her own charge.
    let again = python_session(
        &python,
        &server.url,
        "alice-token",
        json!([py_charge("run-1", false)]),
    )
    .await;
    assert_eq!(outcomes(&again), [("ch_1".to_string(), true)]);
    assert_eq!(server.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_bad_credential_is_refused_and_nothing_runs() {
    let python = python();
    let server = Server::start(Duration::ZERO).await;
    for token in ["mallory-token", ""] {
        let refused = python_session(
            &python,
            &server.url,
            token,
            json!([py_charge("run-1", false)]),
        )
        .await;
        assert_eq!(
            refused.code,
            Some(3),
            "token {token:?}: {:?}",
            refused.lines
        );
        assert_eq!(refused.lines, [json!({"refused": 401})]);
    }
    assert_eq!(server.stop().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_dropped_mid_call_reconnects_to_a_replay() {
    let python = python();
    let server = Server::start(Duration::from_millis(400)).await;

    // The client exits at the first progress notification: the body has started, not finished.
    let dropped = python_plan(
        &python,
        json!({"url": server.url, "token": "alice-token",
               "calls": [py_charge("run-9", true)], "exit_after_progress": true}),
    )
    .await;
    assert_eq!((dropped.code, dropped.lines.len()), (Some(0), 0));
    assert_eq!(server.ledger.count(), 0, "the body was still running");

    // It reconnects and names its run again: the first call's charge, as a replay.
    let again = python_session(
        &python,
        &server.url,
        "alice-token",
        json!([py_charge("run-9", false)]),
    )
    .await;
    assert_eq!(
        again.lines.iter().map(wire_outcome).collect::<Vec<_>>(),
        [("ch_1".to_string(), true)]
    );
    assert_eq!(server.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_progress_notifications_arrive_in_order() {
    let python = python();
    let server = Server::start(Duration::from_millis(50)).await;
    let session = python_session(
        &python,
        &server.url,
        "bob-token",
        json!([py_charge("run-1", true)]),
    )
    .await;
    let reply = &session.lines[0];
    assert_eq!(wire_outcome(reply), ("ch_1".to_string(), false));
    assert_eq!(
        reply["progress"],
        json!([
            [1.0, 3.0, "stage 1 of 3"],
            [2.0, 3.0, "stage 2 of 3"],
            [3.0, 3.0, "stage 3 of 3"]
        ])
    );
    assert_eq!(server.stop().await, 1);
}

// ---- the scenarios, with rmcp's client --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_principals_never_see_each_others_records() {
    let server = Server::start(Duration::ZERO).await;
    let alice = rmcp_client(&server.url, "alice-token").await.unwrap();
    let bob = rmcp_client(&server.url, "bob-token").await.unwrap();

    assert_eq!(
        rmcp_outcome(&rmcp_call(&alice, "run-1").await),
        ("ch_1".into(), false)
    );
    assert_eq!(
        rmcp_outcome(&rmcp_call(&bob, "run-1").await),
        ("ch_2".into(), false)
    );
    assert_eq!(
        rmcp_outcome(&rmcp_call(&bob, "run-1").await),
        ("ch_2".into(), true)
    );
    assert_eq!(
        rmcp_outcome(&rmcp_call(&alice, "run-1").await),
        ("ch_1".into(), true)
    );
    for client in [alice, bob] {
        client.cancel().await.expect("the client closes");
    }
    assert_eq!(server.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_bad_credential_is_refused_and_nothing_runs() {
    let server = Server::start(Duration::ZERO).await;
    let refused = rmcp_client(&server.url, "mallory-token").await;
    assert!(refused.is_err(), "a bad token opens no session");

    // Over plain HTTP: 401 with a bearer challenge, and no session.
    let (status, session, challenge) = raw_initialize(&server.url, Some("mallory-token")).await;
    assert_eq!((status, session, challenge.as_str()), (401, None, "Bearer"));
    let (status, session, _) = raw_initialize(&server.url, None).await;
    assert_eq!((status, session), (401, None));
    // Known, and not allowed: 403, no challenge (another token would not help).
    let (status, session, challenge) = raw_initialize(&server.url, Some("carol-token")).await;
    assert_eq!((status, session, challenge.as_str()), (403, None, ""));
    assert_eq!(server.stop().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_the_principal_that_opened_it() {
    let server = Server::start(Duration::ZERO).await;
    let (status, session, _) = raw_initialize(&server.url, Some("alice-token")).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _) = raw_post(&server.url, "alice-token", &session, initialized).await;
    assert_eq!(status, 202);

    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge", "arguments": {"order": "order-1", "cents": 500},
        "_meta": {"toolkey/run_id": "run-1"}}});
    // Bob presents Alice's session id with his own valid token: to him it does not exist. He
    // can neither call on it, nor listen on it, nor close it.
    let (status, body) = raw_post(&server.url, "bob-token", &session, call.clone()).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        raw_request(&server.url, Method::GET, "bob-token", &session).await,
        404
    );
    assert_eq!(
        raw_request(&server.url, Method::DELETE, "bob-token", &session).await,
        404
    );
    assert_eq!(server.ledger.count(), 0);
    // A bad token on Alice's session is refused before anything else.
    let (status, _) = raw_post(&server.url, "mallory-token", &session, call.clone()).await;
    assert_eq!(status, 401);
    assert_eq!(server.ledger.count(), 0);
    // Alice's own call on it runs; it asked for no progress, and gets none.
    let (_, body) = raw_post(&server.url, "alice-token", &session, call.clone()).await;
    assert!(body.contains("ch_1"), "{body}");
    assert!(!body.contains("notifications/progress"), "{body}");
    // Asking for it (a `progressToken`), she gets the stages, in order, then the result.
    let mut asked = call;
    asked["id"] = json!(3);
    asked["params"]["arguments"]["order"] = json!("order-2");
    asked["params"]["_meta"]["progressToken"] = json!("tok-7");
    let (_, body) = raw_post(&server.url, "alice-token", &session, asked).await;
    let at = |text: &str| {
        body.find(text)
            .unwrap_or_else(|| panic!("{text:?} in {body}"))
    };
    assert!(at("stage 1 of 3") < at("stage 2 of 3"), "{body}");
    assert!(at("stage 2 of 3") < at("stage 3 of 3"), "{body}");
    assert!(at("stage 3 of 3") < at("ch_2"), "{body}");
    assert_eq!(
        body.matches("\"progressToken\":\"tok-7\"").count(),
        3,
        "{body}"
    );
    assert_eq!(server.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_its_principal_in_its_tenant() {
    let server = Server::start(Duration::ZERO).await;
    let (status, session, _) = raw_initialize(&server.url, Some("alice-token")).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _) = raw_post(&server.url, "alice-token", &session, initialized).await;
    assert_eq!(status, 202);

    // An Alice of another tenant is another caller: to her the session does not exist.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge", "arguments": {"order": "order-1", "cents": 500},
        "_meta": {"toolkey/run_id": "run-1"}}});
    let (status, body) = raw_post(&server.url, "other-alice-token", &session, call.clone()).await;
    assert_eq!(status, 404, "{body}");
    for method in [Method::GET, Method::DELETE] {
        let status = raw_request(&server.url, method.clone(), "other-alice-token", &session);
        assert_eq!(status.await, 404, "{method}");
    }
    assert_eq!(server.ledger.count(), 0);
    // Alice's own call on it runs.
    let (_, body) = raw_post(&server.url, "alice-token", &session, call).await;
    assert!(
        body.contains("ch_1") && body.contains("\"tenant\":\"alice\""),
        "{body}"
    );
    assert_eq!(server.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_dropped_mid_call_reconnects_to_a_replay() {
    let server = Server::start(Duration::from_millis(400)).await;
    let progress = Arc::new(Progress::default());
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.as_str())
            .auth_header("alice-token"),
    );
    let client = progress.clone().serve(transport).await.unwrap();
    let peer = client.peer().clone();
    let call = tokio::spawn(async move { peer.call_tool(rmcp_charge("run-9")).await });
    tokio::time::timeout(Duration::from_secs(10), progress.first.notified())
        .await
        .expect("the body reports its first stage");
    // The connection drops mid-call: the pending call is abandoned and the session closed.
    call.abort();
    client.cancel().await.expect("the client closes");
    assert_eq!(server.ledger.count(), 0, "the body was still running");

    let again = rmcp_client(&server.url, "alice-token").await.unwrap();
    assert_eq!(
        rmcp_outcome(&rmcp_call(&again, "run-9").await),
        ("ch_1".into(), true)
    );
    again.cancel().await.expect("the client closes");
    assert_eq!(server.stop().await, 1);
}

// rmcp's client hands each notification to a task of its own: on one thread those tasks run in
// the order the notifications arrived, so the log shows the order on the wire.
#[tokio::test(flavor = "current_thread")]
async fn rmcp_progress_notifications_arrive_in_order() {
    let server = Server::start(Duration::from_millis(50)).await;
    let progress = Arc::new(Progress::default());
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.as_str()).auth_header("bob-token"),
    );
    let client = progress.clone().serve(transport).await.unwrap();
    assert_eq!(
        rmcp_outcome(&rmcp_call(&client, "run-1").await),
        ("ch_1".into(), false)
    );
    let stage = |i: f64| (i, Some(3.0), Some(format!("stage {i} of 3")));
    progress.wait_for(3).await;
    assert_eq!(
        *progress.seen.lock().unwrap(),
        [stage(1.0), stage(2.0), stage(3.0)]
    );
    client.cancel().await.expect("the client closes");
    assert_eq!(server.stop().await, 1);
}

// ---- requests in no session (the 2026-07-28 protocol) ------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_sessionless_refund_keyed_on_its_run_never_gets_a_run_per_request() {
    let server = Server::start(Duration::ZERO).await;
    // rmcp's client on 2026-07-28: no session, so rmcp serves each request with a server of
    // its own.
    let client = rmcp_stateless_client(&server.url, "alice-token").await;

    // README's refund at step 4, twice, naming no run: refused both times, saying what to do.
    let step_4 = json!({"toolkey/step": 4});
    let first = rmcp_refund(&client, step_4.clone()).await;
    let again = rmcp_refund(&client, step_4).await;
    assert_eq!(
        [wire_answer(&first), wire_answer(&again)],
        [
            ("MISSING_CONTEXT".into(), false),
            ("MISSING_CONTEXT".into(), false)
        ]
    );
    let error = wire_error(&first);
    assert_eq!(error["retryable"], false, "{error}");
    let suggestion = error["suggestion"].as_str().unwrap();
    assert!(suggestion.contains("toolkey/run_id"), "{suggestion}");
    assert_eq!(server.refunds.count(), 0);

    // Naming its run, the retry finds the first call's refund.
    let run_4 = json!({"toolkey/run_id": "run-7", "toolkey/step": 4});
    let first = rmcp_refund(&client, run_4.clone()).await;
    let again = rmcp_refund(&client, run_4.clone()).await;
    assert_eq!(
        [wire_answer(&first), wire_answer(&again)],
        [("re_1".into(), false), ("re_1".into(), true)]
    );
    // Bob naming Alice's run names one of his own.
    let bob = rmcp_stateless_client(&server.url, "bob-token").await;
    assert_eq!(
        wire_answer(&rmcp_refund(&bob, run_4).await),
        ("re_2".into(), false)
    );

    // In a session (rmcp's default client), the session's run keys the step: a replay.
    let session = rmcp_client(&server.url, "alice-token").await.unwrap();
    let first = rmcp_refund(&session, json!({"toolkey/step": 4})).await;
    let again = rmcp_refund(&session, json!({"toolkey/step": 4})).await;
    assert_eq!(
        [wire_answer(&first), wire_answer(&again)],
        [("re_3".into(), false), ("re_3".into(), true)]
    );
    for client in [client, bob, session] {
        client.cancel().await.expect("the client closes");
    }
    let refunds = server.refunds.clone();
    server.stop().await;
    assert_eq!(refunds.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_charge_resent_byte_for_byte_charges_once() {
    let server = Server::start(Duration::ZERO).await;
    let order = json!({"order": "order-1", "cents": 500});

    // A charge keyed on its run, naming none, sent again byte for byte after the connection
    // dropped: refused both times, and nothing ran.
    let body = stateless_call("charge", order.clone(), json!({}));
    let first = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    let again = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    assert_eq!((first.0, again.0), (200, 200));
    assert_eq!(
        [wire_answer(&first.1), wire_answer(&again.1)],
        [
            ("MISSING_CONTEXT".into(), false),
            ("MISSING_CONTEXT".into(), false)
        ]
    );
    assert_eq!(server.ledger.count(), 0);

    // Naming its run: one charge, and the resent request is its replay.
    let body = stateless_call("charge", order, json!({"toolkey/run_id": "run-9"}));
    let first = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    let again = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    assert_eq!(
        [wire_answer(&first.1), wire_answer(&again.1)],
        [("ch_1".into(), false), ("ch_1".into(), true)]
    );
    // The same bytes from Bob name a run of his own.
    let bob = stateless_post(&server.url, "bob-token", "charge", &body, None).await;
    assert_eq!(wire_answer(&bob.1), ("ch_2".into(), false));
    assert_eq!(server.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sessionless_retry_after_a_dropped_connection_acts_once() {
    let python = python();
    let server = Server::start(Duration::ZERO).await;
    let refund = |meta: Value| {
        json!({"tool": "refund_order", "arguments": {"order": "order-1", "cents": 500},
               "meta": meta})
    };
    let plan = json!({"url": server.url, "token": "alice-token", "calls": [
        refund(json!({"toolkey/step": 4})),
        refund(json!({"toolkey/step": 4})),
        refund(json!({"toolkey/run_id": "run-7", "toolkey/step": 4})),
        refund(json!({"toolkey/run_id": "run-7", "toolkey/step": 4})),
    ]});
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_http/stateless.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(plan.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the Python client finishes in time")
        .expect("the Python client starts");
    assert!(
        out.status.success(),
        "the Python client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Each call by a client of its own, on 2026-07-28: no session ties them together.
    assert!(
        lines.iter().all(|line| line["protocol"] == "2026-07-28"),
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().map(wire_answer).collect::<Vec<_>>(),
        [
            ("MISSING_CONTEXT".into(), false),
            ("MISSING_CONTEXT".into(), false),
            ("re_1".into(), false),
            ("re_1".into(), true),
        ]
    );
    let refunds = server.refunds.clone();
    server.stop().await;
    assert_eq!(refunds.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_note_speaks_of_what_an_mcp_result_holds() {
    let server = Server::start(Duration::ZERO).await;
    let body = stateless_call(
        "charge",
        json!({"order": "order-1", "cents": 500}),
        json!({"toolkey/run_id": "run-1"}),
    );
    let _ = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    let (_, replay) = stateless_post(&server.url, "alice-token", "charge", &body, None).await;
    assert_eq!(wire_answer(&replay), ("ch_1".into(), true));
    // The note follows the result's own text block; an MCP result has no `result` field.
    let note = replay["content"][1]["text"].as_str().unwrap();
    assert!(note.contains("not done again"), "{note}");
    assert!(!note.contains("`result`"), "{note}");
    assert!(note.contains("the result above"), "{note}");
    assert_eq!(server.stop().await, 1);
}

// ---- hosts -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_host_list_allows_no_host() {
    let charge = stateless_call(
        "charge",
        json!({"order": "order-1", "cents": 500}),
        json!({"toolkey/run_id": "run-1"}),
    );
    // A configured list of hosts that came out empty allows none: not the forged one, not even
    // the address the server listens on.
    let no_hosts = Vec::<String>::new();
    let server = Server::start_with(Duration::ZERO, |mcp| mcp.with_allowed_hosts(no_hosts)).await;
    for host in [Some("attacker.example"), None] {
        let (status, answer) =
            stateless_post(&server.url, "alice-token", "charge", &charge, host).await;
        assert_eq!(status, 403, "Host {host:?}: {answer}");
    }
    let (status, session, _) = raw_initialize(&server.url, Some("alice-token")).await;
    assert_eq!((status, session), (403, None));
    assert_eq!(server.stop().await, 0);

    // A list that names a host allows that host only.
    let server = Server::start_with(Duration::ZERO, |mcp| {
        mcp.with_allowed_hosts(["mcp.example.com"])
    })
    .await;
    let forged = Some("attacker.example");
    let (status, _) = stateless_post(&server.url, "alice-token", "charge", &charge, forged).await;
    assert_eq!(status, 403);
    let named = Some("mcp.example.com");
    let (status, answer) =
        stateless_post(&server.url, "alice-token", "charge", &charge, named).await;
    assert_eq!(
        (status, wire_answer(&answer)),
        (200, ("ch_1".into(), false))
    );
    assert_eq!(server.stop().await, 1);
}

/// The MCP guide's HTTP block compiles only with feature `mcp-http` (the guide's blocks are
/// doctests of the facade, and CI runs them with every feature), and it never serves: its shown
/// lines must be `examples/mcp_http.rs`'s, in order, so it cannot drift from the example that
/// runs.
#[test]
fn guide_http_block_is_an_excerpt_of_the_example() {
    let guide = include_str!("../src/guide/mcp.md");
    let example = include_str!("../examples/mcp_http.rs");
    let start = guide
        .find("```rust,no_run\n# #[cfg(feature = \"mcp-http\")]")
        .expect("the MCP guide shows the HTTP server");
    let block = &guide[start..]
        .lines()
        .skip(1)
        .take_while(|line| *line != "```")
        .collect::<Vec<_>>();
    let mut lines = example.lines().map(str::trim);
    for wanted in block
        .iter()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.trim())
        .filter(|l| !l.is_empty())
    {
        assert!(
            lines.any(|line| line == wanted),
            "the MCP guide's HTTP block line {wanted:?} is not in examples/mcp_http.rs (in order)"
        );
    }
}
