//! `examples/mcp_server`, started as a child process and driven over stdio by rmcp's own client:
//! keys, replays and CONFLICT hold over MCP as they do in process. And in-process servers, one
//! per session over a duplex pipe, on one store: what a client names in `_meta` never reaches
//! another client's records; a body's progress reaches the client that asked for it, in order.
#![cfg(feature = "mcp")]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, MetaObject, RequestMetaObject, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use toolkey::providers::mcp::{ClientRunIds, McpServer};
use toolkey::Toolbox;
use toolkey_tests::billing;

use billing::{RefundOrder, Refunds};

/// Builds the example with the features and profile this test was built with — nothing to do
/// when `cargo test` built it already — and returns its executable, as cargo reports it (so the
/// target directory and its layout are cargo's business, not the test's).
fn server_binary() -> PathBuf {
    let features: Vec<&str> = [
        ("mcp", true),
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args([
            "build",
            "-p",
            "toolkey",
            "--example",
            "mcp_server",
            "--message-format=json",
            "--no-default-features",
        ])
        .args(["--features", &features.join(",")]);
    if !cfg!(debug_assertions) {
        cargo.arg("--release");
    }
    let output = cargo.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "building examples/mcp_server failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == "mcp_server"
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the example's executable")
}

type Client = RunningService<RoleClient, ()>;

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let arguments = arguments
        .as_object()
        .expect("arguments are an object")
        .clone();
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("tools/call {tool} failed: {e}"))
}

/// The result's text block, parsed as JSON.
fn text(result: &CallToolResult) -> Value {
    let text = &result
        .content
        .first()
        .and_then(|c| c.as_text())
        .expect("a text block")
        .text;
    serde_json::from_str(text).expect("the text is JSON")
}

fn replayed(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.get("toolkey/replayed"))
        == Some(&json!(true))
}

/// The second text block: what a replay tells the model.
fn note(result: &CallToolResult) -> String {
    result
        .content
        .get(1)
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

fn hints(tool: &Tool) -> [Option<bool>; 4] {
    let a = tool.annotations.as_ref().expect("annotations");
    [
        a.read_only_hint,
        a.destructive_hint,
        a.idempotent_hint,
        a.open_world_hint,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoices_over_mcp_run_once_replay_and_conflict() {
    let binary = server_binary();
    let transport =
        TokioChildProcess::new(tokio::process::Command::new(&binary)).expect("the server starts");
    let client: Client = ().serve(transport).await.expect("the server initializes");

    let session = async {
        let tools = client.list_all_tools().await.expect("tools/list");
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort();
        assert_eq!(names, ["invoice_status", "list_invoices", "send_invoice"]);
        let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap();
        // read-only, destructive, idempotent, open world
        assert_eq!(
            hints(tool("send_invoice")),
            [Some(false), Some(true), Some(true), Some(true)]
        );
        assert_eq!(
            hints(tool("invoice_status")),
            [Some(true), Some(false), Some(true), Some(true)]
        );
        assert_eq!(
            hints(tool("list_invoices")),
            [Some(true), Some(false), Some(true), Some(true)]
        );
        let send = tool("send_invoice");
        assert_eq!(
            send.input_schema["required"],
            json!(["customer", "period", "amount", "memo"])
        );
        assert_eq!(
            send.output_schema
                .as_ref()
                .expect("an object result has an output schema")["type"],
            "object"
        );

        let args = json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "October hosting"});
        let first = call(&client, "send_invoice", args.clone()).await;
        assert_eq!(first.is_error, Some(false), "{first:?}");
        let invoice = first
            .structured_content
            .clone()
            .expect("structured content");
        assert_eq!(invoice["id"], "inv-1");
        assert_eq!(
            text(&first),
            invoice,
            "the text block is a copy of the structured result"
        );
        assert!(!replayed(&first));
        assert_eq!(first.content.len(), 1);

        // The model rewords the memo (ignored by the key's fingerprint): the same action.
        let reworded = json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "Hosting, October"});
        let second = call(&client, "send_invoice", reworded).await;
        assert_eq!(second.is_error, Some(false), "{second:?}");
        assert_eq!(second.structured_content.as_ref(), Some(&invoice));
        assert!(replayed(&second), "the second call is a replay: {second:?}");
        assert_eq!(
            text(&second),
            invoice,
            "the first block is still the result itself"
        );
        assert!(
            note(&second).contains("not done again"),
            "the model reads that it is a replay: {second:?}"
        );

        let other_amount = json!({"customer": "acme", "period": "2026-10", "amount": 99.0, "memo": "October hosting"});
        let third = call(&client, "send_invoice", other_amount).await;
        assert_eq!(third.is_error, Some(true), "{third:?}");
        let error = text(&third);
        assert_eq!(error["error"]["code"], "CONFLICT");
        assert_eq!(error["error"]["retryable"], false);

        let status = call(
            &client,
            "invoice_status",
            json!({"customer": "ACME ", "period": "2026-10"}),
        )
        .await;
        assert_eq!(
            status.structured_content.as_ref().unwrap()["status"],
            "completed"
        );
        assert_eq!(
            status.structured_content.as_ref().unwrap()["result"]["id"],
            "inv-1"
        );

        let unknown = call(&client, "send_invoices", json!({})).await;
        assert_eq!(unknown.is_error, Some(true));
        assert_eq!(text(&unknown)["error"]["code"], "UNKNOWN_TOOL");

        let ledger = call(&client, "list_invoices", json!({})).await;
        let invoices = &ledger
            .structured_content
            .as_ref()
            .expect("structured content")["invoices"];
        assert_eq!(
            invoices.as_array().map(Vec::len),
            Some(1),
            "exactly one invoice was sent: {invoices}"
        );
    };
    tokio::time::timeout(Duration::from_secs(60), session)
        .await
        .expect("the MCP session finishes in time");
    client.cancel().await.expect("the client closes");
}

/// Serves `server` to a new in-process client over a duplex pipe: one connection, one session.
async fn connect(server: McpServer) -> Client {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("the server initializes")
}

/// `refund_order` with `_meta`, as an agent runtime sends it.
async fn refund(client: &Client, cents: i64, meta: Value) -> CallToolResult {
    let mut params = CallToolRequestParams::new("refund_order").with_arguments(
        json!({"order": "order-1", "cents": cents})
            .as_object()
            .unwrap()
            .clone(),
    );
    params.meta = Some(RequestMetaObject(MetaObject(
        meta.as_object().unwrap().clone(),
    )));
    client
        .call_tool(params)
        .await
        .expect("tools/call is answered")
}

/// The refund id of a result, or its error code.
fn outcome(result: &CallToolResult) -> String {
    let value = text(result);
    match value.get("error") {
        Some(error) => error["code"].as_str().unwrap().to_string(),
        None => value["id"].as_str().unwrap().to_string(),
    }
}

struct Sessions {
    toolbox: Toolbox,
    refunds: Arc<Refunds>,
}

impl Sessions {
    fn new() -> Self {
        let refunds = Arc::new(Refunds::default());
        let toolbox = Toolbox::builder()
            .shared_state(refunds.clone())
            .tool(RefundOrder)
            .build()
            .expect("a valid toolbox");
        Sessions { toolbox, refunds }
    }

    async fn client(&self, policy: ClientRunIds) -> Client {
        connect(McpServer::new(self.toolbox.clone()).with_client_run_ids(policy)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_run_ids_are_refused_by_default_and_steps_stay_in_the_session() {
    let sessions = Sessions::new();
    let a = sessions.client(ClientRunIds::default()).await;
    let b = sessions.client(ClientRunIds::default()).await;

    // Naming a run id (or an event id) is refused: nothing runs.
    let named = refund(
        &a,
        500,
        json!({"toolkey/run_id": "run-7", "toolkey/step": 1}),
    )
    .await;
    assert_eq!(named.is_error, Some(true));
    assert_eq!(outcome(&named), "RUN_ID_NOT_ACCEPTED");
    assert_eq!(text(&named)["error"]["retryable"], false);
    let event = refund(
        &a,
        500,
        json!({"toolkey/event_id": "evt-1", "toolkey/step": 1}),
    )
    .await;
    assert_eq!(outcome(&event), "RUN_ID_NOT_ACCEPTED");
    // A step key without a step is refused too: the server does not count calls.
    assert_eq!(
        outcome(&refund(&a, 500, json!({})).await),
        "MISSING_CONTEXT"
    );
    assert_eq!(sessions.refunds.count(), 0);

    // Steps name calls of the session's own run: B's step 1 is not A's.
    let first = refund(&a, 500, json!({"toolkey/step": 1})).await;
    assert_eq!(outcome(&first), "re_1");
    let other = refund(&b, 500, json!({"toolkey/step": 1})).await;
    assert_eq!(outcome(&other), "re_2");
    assert!(!replayed(&other));
    let retry = refund(&a, 500, json!({"toolkey/step": 1})).await;
    assert_eq!((outcome(&retry), replayed(&retry)), ("re_1".into(), true));
    assert_eq!(sessions.refunds.count(), 2);
    for client in [a, b] {
        client.cancel().await.expect("the client closes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_naming_another_sessions_run_gets_its_own_refund() {
    let sessions = Sessions::new();
    let a = sessions.client(ClientRunIds::Session).await;
    let b = sessions.client(ClientRunIds::Session).await;
    let meta = json!({"toolkey/run_id": "run-7", "toolkey/step": 1});

    let first = refund(&a, 500, meta.clone()).await;
    assert_eq!(outcome(&first), "re_1");
    // B names A's run id and step: a run of its own session, so its own refund.
    let other = refund(&b, 500, meta.clone()).await;
    assert_eq!(outcome(&other), "re_2");
    assert!(!replayed(&other));
    // A's retry replays A's refund.
    let retry = refund(&a, 500, meta).await;
    assert_eq!((outcome(&retry), replayed(&retry)), ("re_1".into(), true));
    assert_eq!(sessions.refunds.count(), 2);
    for client in [a, b] {
        client.cancel().await.expect("the client closes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principals_runs_resume_across_connections_and_no_one_else_reaches_them() {
    let sessions = Sessions::new();
    let alice = || ClientRunIds::Principal("alice".into());
    let meta = json!({"toolkey/run_id": "agent:run-7", "toolkey/step": 1});

    let a = sessions.client(alice()).await;
    assert_eq!(outcome(&refund(&a, 500, meta.clone()).await), "re_1");
    a.cancel().await.expect("the client closes");

    // Alice reconnects and resumes her run: the call replays.
    let again = sessions.client(alice()).await;
    let resumed = refund(&again, 500, meta.clone()).await;
    assert_eq!(
        (outcome(&resumed), replayed(&resumed)),
        ("re_1".into(), true)
    );
    // Bob names the same run and step: his own refund.
    let bob = sessions.client(ClientRunIds::Principal("bob".into())).await;
    assert_eq!(outcome(&refund(&bob, 500, meta.clone()).await), "re_2");
    // Principal `alice:agent` naming run `run-7` would spell Alice's pair if principal and run
    // were only joined with the separator: it names a run of its own.
    let forger = sessions
        .client(ClientRunIds::Principal("alice:agent".into()))
        .await;
    let forged = json!({"toolkey/run_id": "run-7", "toolkey/step": 1});
    let forged = refund(&forger, 500, forged).await;
    assert_eq!(
        (outcome(&forged), replayed(&forged)),
        ("re_3".into(), false)
    );
    assert_eq!(sessions.refunds.count(), 3);
    for client in [again, bob, forger] {
        client.cancel().await.expect("the client closes");
    }
}

/// Count to `n`, reporting each number as progress.
#[toolkey::tool(read_only)]
async fn count_to(
    ctx: &toolkey::ToolContext,
    /// How far to count.
    n: u32,
) -> Result<u32, toolkey::ToolError> {
    for i in 1..=n {
        ctx.progress(f64::from(i), Some(f64::from(n)), &format!("counted {i}"))
            .await;
    }
    Ok(n)
}

/// A client that keeps the progress notifications it receives.
#[derive(Default)]
struct ProgressLog(std::sync::Mutex<Vec<Report>>);

/// One progress notification: how far, of how much, and the message.
type Report = (f64, Option<f64>, Option<String>);

impl rmcp::ClientHandler for ProgressLog {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let mut log = self.0.lock().unwrap();
        log.push((params.progress, params.total, params.message));
    }
}

// rmcp's client hands each notification to a task of its own: on one thread those tasks run in
// the order the notifications arrived, so the log shows the order on the wire.
#[tokio::test(flavor = "current_thread")]
async fn progress_reaches_the_client_that_asked_for_it_in_order() {
    let toolbox = Toolbox::builder()
        .tool(CountTo)
        .build()
        .expect("a valid toolbox");
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = McpServer::new(toolbox).serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let log = Arc::new(ProgressLog::default());
    let client = log
        .clone()
        .serve(client_io)
        .await
        .expect("the server initializes");
    // rmcp's client asks for progress on every request (a `progressToken` in `_meta`).
    let params = CallToolRequestParams::new("count_to")
        .with_arguments(json!({"n": 3}).as_object().unwrap().clone());
    let counted = client.call_tool(params).await.expect("tools/call");
    assert_eq!(text(&counted), json!(3));
    let handled = async {
        while log.0.lock().unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), handled)
        .await
        .expect("three notifications");
    let counted = |i: f64| (i, Some(3.0), Some(format!("counted {i}")));
    assert_eq!(
        *log.0.lock().unwrap(),
        [counted(1.0), counted(2.0), counted(3.0)]
    );
    client.cancel().await.expect("the client closes");
}
