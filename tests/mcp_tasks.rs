//! Long calls as MCP tasks (the Tasks extension, SEP-2663) over streamable HTTP, driven by the
//! official Python SDK's client (`tests/mcp_tasks/client.py`, which writes the extension on the
//! SDK's extension API) and by rmcp's client: a call that outlasts the client's patience
//! becomes a task the client polls to its result; the task outlives its server process (a
//! SQLite file; the server a child process, killed and started again) and another instance on
//! a shared PostgreSQL store answers its polls; another principal polling its id finds nothing;
//! a client without tasks still gets `TIMEOUT` naming the status tool. Every scenario ends with
//! an exact count of invoices on the fake billing ledger.
//!
//! The Python SDK is found as in tests/mcp_http.rs; PostgreSQL is `TOOLKEY_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`). A missing one fails these tests, naming
//! `scripts/test.sh`.
#![cfg(all(feature = "mcp-http", feature = "sqlite", feature = "postgres", unix))]

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, ErrorCode, GetTaskParams, GetTaskResult, NumberOrString,
    ProgressNotificationParam, ProgressToken, RequestMetaObject, TaskPayload, TaskStatus,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolkey::providers::mcp::http::{bearer_token, McpHttp, Parts, Principal, Refusal};
use toolkey::store::{MemoryStore, PostgresStore, SqliteStore, Store};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::{billing, child, mcp_python, servers};

use billing::{journal_count, Billing, Invoice, SendInvoice, SendInvoiceBriefLease};
use mcp_python::python;

// ---- the servers ------------------------------------------------------------------------------

/// Alice and Bob, each in a tenant of their own, named for `run` (so runs sharing a PostgreSQL
/// database never meet), and Carol, Alice's colleague in her tenant; every other credential is
/// refused.
fn principals(run: &str) -> impl Fn(&Parts) -> Result<Principal, Refusal> + Send + Sync + 'static {
    let run = run.to_string();
    move |request: &Parts| match bearer_token(request) {
        Some("alice-token") => Ok(Principal::new("alice").with_tenant(format!("alice-{run}"))),
        Some("bob-token") => Ok(Principal::new("bob").with_tenant(format!("bob-{run}"))),
        Some("carol-token") => Ok(Principal::new("carol").with_tenant(format!("alice-{run}"))),
        _ => Err(Refusal::unauthenticated("unknown token")),
    }
}

/// A toolbox with the design's invoice tool on `store`, its `timeout` overridden.
fn invoicing(store: Arc<dyn Store>, billing: Arc<Billing>, timeout: Option<Duration>) -> Toolbox {
    Toolbox::builder()
        .shared_store(store)
        .shared_state(billing)
        .tool(SendInvoice)
        .timeout("send_invoice", timeout)
        .build()
        .expect("a valid toolbox")
}

/// A server in this process, on a free local port, whose keyed calls become tasks `after`.
struct Server {
    url: String,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(toolbox: Toolbox, run: &str, after: Duration) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let mcp = McpHttp::new(toolbox, principals(run)).with_tasks_after(Some(after));
        let served = tokio::spawn(mcp.serve(listener, async {
            let _ = stopped.await;
        }));
        Server { url, stop, served }
    }

    /// Stops the server, waiting for bodies still running.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.served)
            .await
            .expect("the server stops in time")
            .expect("the server task ends")
            .expect("the server ends cleanly");
    }
}

/// The child process's part: a server on the SQLite file in `TOOLKEY_CHILD` (and its billing
/// ledger's journal beside it), on `TOOLKEY_CHILD_PORT`, until it is killed. Nothing when
/// `TOOLKEY_CHILD` is not set.
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let var = |name: &str| std::env::var(name).unwrap().parse::<u64>().unwrap();
    let port = var("TOOLKEY_CHILD_PORT") as u16;
    let delay = Duration::from_millis(var("TOOLKEY_CHILD_DELAY_MS"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let toolbox = Toolbox::builder()
            .store(SqliteStore::open(dir.join("store.db")).unwrap())
            .state(Billing::journaled(&dir.join("ledger.jsonl"), delay))
            .tool(SendInvoiceBriefLease)
            .build()
            .unwrap();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        // Written whole, then renamed: the test never reads half a URL.
        std::fs::write(dir.join("url.tmp"), url).unwrap();
        std::fs::rename(dir.join("url.tmp"), dir.join("url")).unwrap();
        McpHttp::new(toolbox, principals("file"))
            .with_tasks_after(Some(Duration::from_millis(300)))
            .serve(listener, std::future::pending())
            .await
            .unwrap();
    });
}

/// A server process, killed outright (SIGKILL: no shutdown, nothing flushed) when dropped, so
/// a failing test leaves none behind.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server process on the SQLite file in `dir`, on `port` (0: any free one), whose invoices
/// take `delay`: the process, and its URL once it listens.
async fn server_process(dir: &Path, port: u16, delay: Duration) -> (ServerProcess, String) {
    let url_file = dir.join("url");
    let _ = std::fs::remove_file(&url_file);
    let port = port.to_string();
    let delay = delay.as_millis().to_string();
    let child = ServerProcess(child::spawn_self(&[
        ("TOOLKEY_CHILD", dir.as_os_str()),
        ("TOOLKEY_CHILD_PORT", port.as_ref()),
        ("TOOLKEY_CHILD_DELAY_MS", delay.as_ref()),
    ]));
    let listening = async {
        loop {
            if let Ok(url) = std::fs::read_to_string(&url_file) {
                return url;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let url = tokio::time::timeout(Duration::from_secs(20), listening)
        .await
        .expect("the server process listens in time");
    (child, url)
}

/// Kills a server process outright and reaps it.
fn kill(server: ServerProcess) {
    drop(server);
}

/// The port of `http://127.0.0.1:<port>/mcp`.
fn port_of(url: &str) -> u16 {
    url::Url::parse(url).unwrap().port().unwrap()
}

/// A PostgreSQL store with a small pool, on a table of these tests' own; an unreachable server
/// fails the test.
async fn postgres() -> Option<Arc<dyn Store>> {
    const VAR: &str = "TOOLKEY_POSTGRES_URL";
    let url = servers::url(VAR, "postgres://postgres@127.0.0.1:5432/test");
    let store = PostgresStore::builder(&url)
        .table("mcp_tasks_records")
        .pool_size(2)
        .timeout(Duration::from_secs(3))
        .connect()
        .await;
    match store {
        Ok(store) => Some(Arc::new(store)),
        Err(err) => {
            servers::unreachable("PostgreSQL", VAR, &url, err);
            None
        }
    }
}

/// A run name no other test run shares.
fn fresh_run() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

// ---- what the clients send and get ------------------------------------------------------------

fn invoice_args() -> Value {
    json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "October"})
}

/// The invoice id of a wire `CallToolResult`, and whether it is a replay.
fn invoice_of(result: &Value) -> (String, bool) {
    assert_eq!(result["isError"], false, "{result}");
    let invoice: Invoice = serde_json::from_value(result["structuredContent"].clone())
        .unwrap_or_else(|e| panic!("an invoice ({e}): {result}"));
    (invoice.id, result["_meta"]["toolkey/replayed"] == true)
}

/// The error a wire `CallToolResult` carries: `{"code", "message", "retryable", "suggestion"}`.
fn error_of(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().expect("a text block");
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

// ---- the Python SDK's client ------------------------------------------------------------------

/// One run of `client.py`, read line by line as it prints.
struct PyClient {
    process: tokio::process::Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PyClient {
    /// Starts `client.py` on `plan` (see the script's docs).
    fn start(python: &Path, plan: Value) -> PyClient {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_tasks/client.py");
        let mut process = tokio::process::Command::new(python)
            .arg(script)
            .arg(plan.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the Python client starts");
        let stdin = process.stdin.take().unwrap();
        let lines = BufReader::new(process.stdout.take().unwrap()).lines();
        PyClient {
            process,
            stdin,
            lines,
        }
    }

    /// The next line the client printed.
    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the Python client says something in time")
            .unwrap()
            .expect("the Python client printed a line before it ended (its stderr is above)");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Lets a holding client go on polling.
    async fn go(&mut self) {
        self.stdin.write_all(b"go\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Waits for the client to end, successfully.
    async fn finish(mut self) {
        let status = tokio::time::timeout(Duration::from_secs(60), self.process.wait())
            .await
            .expect("the Python client ends in time")
            .unwrap();
        assert!(status.success(), "the Python client failed: {status}");
    }
}

/// A plan calling `send_invoice` as `token`; the SDK waits at most 1 s for any answer.
fn py_plan(url: &str, token: &str, tasks: bool) -> Value {
    json!({"url": url, "token": token, "tasks": tasks, "read_timeout": 1.0,
           "call": {"tool": "send_invoice", "arguments": invoice_args()}})
}

/// What the `tk-` task a line announces says.
fn announced(line: &Value) -> String {
    let task = &line["task"];
    assert_eq!(
        (&task["resultType"], &task["status"]),
        (&json!("task"), &json!("working")),
        "{line}"
    );
    let id = task["taskId"].as_str().unwrap().to_string();
    assert!(id.starts_with("tk-"), "{id}");
    id
}

/// A poller's line: what each poll said, then the task's result.
fn polled_to_completion(line: &Value) -> &Value {
    assert_eq!(line["status"], "completed", "{line}");
    let statuses = line["statuses"].as_array().unwrap();
    assert_eq!(statuses.last().unwrap(), "completed", "{line}");
    assert!(
        statuses[..statuses.len() - 1]
            .iter()
            .all(|s| s == "working"),
        "{line}"
    );
    &line["result"]
}

/// A poller's line for a task the server says does not exist for it.
fn refused_poll(line: &Value) {
    assert_eq!(line["error"]["code"], -32602, "{line}");
    assert!(
        line["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("no such task"),
        "{line}"
    );
    assert_eq!(line["statuses"], json!([]), "{line}");
}

// ---- the scenarios, with the Python SDK -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_a_call_longer_than_the_request_timeout_becomes_a_task_polled_to_its_result() {
    let python = python();
    // The invoice takes 2 s, the client waits 1 s for any answer, and the call becomes a task
    // after 300 ms.
    let billing = Arc::new(Billing::with_delay(Duration::from_secs(2)));
    let toolbox = invoicing(Arc::new(MemoryStore::new()), billing.clone(), None);
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let mut plan = py_plan(&server.url, "alice-token", true);
    plan["resolve"] = json!(true);

    // The SDK's `Client.call_tool` resolves the task through the extension: it polls until the
    // task ends, and returns the call's own result.
    let mut client = PyClient::start(&python, plan);
    let line = client.line().await;
    client.finish().await;
    assert_eq!(invoice_of(&line["result"]), ("inv-1".to_string(), false));
    assert!(line["task"].as_str().unwrap().starts_with("tk-"), "{line}");
    let statuses = line["statuses"].as_array().unwrap();
    assert_eq!(statuses.first().unwrap(), "working", "{line}");
    assert_eq!(statuses.last().unwrap(), "completed", "{line}");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_without_tasks_gets_timeout_naming_the_status_tool() {
    let python = python();
    // The tool answers TIMEOUT after 500 ms; the invoice takes 1.5 s. The server makes tasks,
    // after 300 ms, for clients that declare them: this one does not.
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let toolbox = invoicing(
        Arc::new(MemoryStore::new()),
        billing.clone(),
        Some(Duration::from_millis(500)),
    );
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let mut plan = py_plan(&server.url, "alice-token", false);
    plan["read_timeout"] = json!(10.0);
    let mut client = PyClient::start(&python, plan);
    let line = client.line().await;
    client.finish().await;
    let error = error_of(&line["result"]);
    assert_eq!(
        (&error["code"], &error["retryable"]),
        (&json!("TIMEOUT"), &json!(true))
    );
    assert!(
        error["suggestion"]
            .as_str()
            .unwrap()
            .contains("`invoice_status`"),
        "{error}"
    );
    assert_eq!(billing.count(), 0, "the body still runs");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_a_task_outlives_its_server_process() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("ledger.jsonl");
    let (first, url) = server_process(dir.path(), 0, Duration::from_millis(1500)).await;

    // Alice's call becomes a task; her client holds its polls while the server is replaced.
    let mut plan = py_plan(&url, "alice-token", true);
    plan["hold"] = json!(true);
    plan["pollers"] = json!([
        {"url": url, "token": "alice-token"},
        {"url": url, "token": "bob-token"},
        {"url": url, "token": "carol-token"},
    ]);
    let mut client = PyClient::start(&python, plan);
    announced(&client.line().await);

    // The body ends and its outcome is recorded; then the process is killed outright.
    until_recorded(&url).await;
    kill(first);
    assert_eq!(journal_count(&journal), 1);

    // A new process on the same file and port answers the polls.
    let (second, again) = server_process(dir.path(), port_of(&url), Duration::ZERO).await;
    assert_eq!(again, url);
    client.go().await;
    let alice = client.line().await;
    assert_eq!(
        invoice_of(polled_to_completion(&alice)),
        ("inv-1".to_string(), false)
    );
    assert_eq!(alice["statuses"], json!(["completed"]));
    // Bob, polling Alice's task id, is told there is no such task; so is Carol, who shares
    // Alice's tenant (and its records), not her tasks.
    refused_poll(&client.line().await);
    refused_poll(&client.line().await);
    client.finish().await;
    kill(second);
    assert_eq!(journal_count(&journal), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_a_task_whose_server_died_mid_call_says_do_not_repeat() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("ledger.jsonl");
    // The invoice would take a minute: the process dies long before.
    let (first, url) = server_process(dir.path(), 0, Duration::from_secs(60)).await;
    let mut plan = py_plan(&url, "alice-token", true);
    plan["hold"] = json!(true);
    let mut client = PyClient::start(&python, plan);
    announced(&client.line().await);
    kill(first);

    // Once the dead call's 1 s lease lapses, nobody knows whether it acted.
    let (second, _) = server_process(dir.path(), port_of(&url), Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    client.go().await;
    let alice = client.line().await;
    let error = error_of(polled_to_completion(&alice));
    assert_eq!(
        (&error["code"], &error["retryable"]),
        (&json!("OUTCOME_UNKNOWN"), &json!(false))
    );
    assert!(
        error["suggestion"]
            .as_str()
            .unwrap()
            .starts_with("do not repeat"),
        "{error}"
    );
    client.finish().await;
    kill(second);
    assert_eq!(journal_count(&journal), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_a_second_postgres_instance_answers_the_poll() {
    let python = python();
    let (Some(store_a), Some(store_b)) = (postgres().await, postgres().await) else {
        return;
    };
    let run = fresh_run();
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let a = Server::start(
        invoicing(store_a, billing.clone(), None),
        &run,
        Duration::from_millis(300),
    )
    .await;
    let b = Server::start(
        invoicing(store_b, billing.clone(), None),
        &run,
        Duration::from_millis(300),
    )
    .await;

    // Alice calls instance A, and polls instance B; so does Bob, with her task id.
    let mut plan = py_plan(&a.url, "alice-token", true);
    plan["pollers"] =
        json!([{"url": b.url, "token": "alice-token"}, {"url": b.url, "token": "bob-token"}]);
    let mut client = PyClient::start(&python, plan);
    announced(&client.line().await);
    let alice = client.line().await;
    assert_eq!(
        invoice_of(polled_to_completion(&alice)),
        ("inv-1".to_string(), false)
    );
    assert_eq!(alice["statuses"][0], "working", "B saw the call run on A");
    refused_poll(&client.line().await);
    client.finish().await;
    a.stop().await;
    b.stop().await;
    assert_eq!(billing.count(), 1);
}

// ---- rmcp's client ----------------------------------------------------------------------------

/// An rmcp client handler that declares the Tasks extension at `initialize`, or not, and keeps
/// the progress notifications it receives.
#[derive(Clone, Default)]
struct Caller {
    tasks: bool,
    progress: Arc<Mutex<Vec<f64>>>,
}

impl ClientHandler for Caller {
    fn get_info(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        if self.tasks {
            config.capabilities = ClientCapabilities::builder().enable_tasks().build();
        }
        config
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }
}

type Client = RunningService<RoleClient, Caller>;

async fn rmcp_client(url: &str, token: &str, tasks: bool) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    Caller {
        tasks,
        ..Caller::default()
    }
    .serve(transport)
    .await
    .expect("the client connects")
}

fn tool_call(name: &'static str) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(invoice_args().as_object().unwrap().clone())
}

/// Calls `send_invoice` once: its result, or its task.
async fn call(client: &Client) -> CallToolResponse {
    tokio::time::timeout(
        Duration::from_secs(30),
        client.peer().call_tool_once(tool_call("send_invoice")),
    )
    .await
    .expect("the call is answered in time")
    .expect("tools/call succeeds")
}

fn task_id(response: CallToolResponse) -> String {
    match response {
        CallToolResponse::Task(task) => {
            assert_eq!(task.task.status, TaskStatus::Working);
            task.task.task_id
        }
        CallToolResponse::Complete(result) => panic!("a result, not a task: {result:?}"),
        other => panic!("{other:?}"),
    }
}

/// Polls a task until it ends: what each poll said, and its last state.
async fn poll(
    client: &Client,
    task_id: &str,
) -> Result<(Vec<TaskStatus>, GetTaskResult), ServiceError> {
    let mut statuses = Vec::new();
    let polled = async {
        loop {
            let got = client.peer().get_task(GetTaskParams::new(task_id)).await?;
            statuses.push(got.task.status());
            if got.task.status().is_terminal() {
                return Ok(got);
            }
            let interval = got.task.task.poll_interval_ms.unwrap_or(100);
            tokio::time::sleep(Duration::from_millis(interval)).await;
        }
    };
    let last = tokio::time::timeout(Duration::from_secs(30), polled)
        .await
        .expect("the task ends in time")?;
    Ok((statuses, last))
}

/// The call's result a completed task holds, as JSON.
fn task_result(task: &GetTaskResult) -> Value {
    match &task.task.payload {
        TaskPayload::Completed { result } => {
            let result = Value::Object(result.clone());
            serde_json::from_value::<CallToolResult>(result.clone()).expect("a CallToolResult");
            result
        }
        other => panic!("not completed: {other:?}"),
    }
}

fn not_found(polled: Result<(Vec<TaskStatus>, GetTaskResult), ServiceError>) {
    match polled {
        Err(ServiceError::McpError(error)) => {
            assert_eq!(error.code, ErrorCode::INVALID_PARAMS, "{error:?}");
            assert!(error.message.starts_with("no such task"), "{error:?}");
        }
        other => panic!("no such task, not {other:?}"),
    }
}

/// Waits until the status companion reads the invoice as recorded.
async fn until_recorded(url: &str) {
    until_status(url, "completed").await
}

/// Waits until the status companion reads the invoice's `status` as `status`.
async fn until_status(url: &str, wanted: &str) {
    let client = rmcp_client(url, "alice-token", false).await;
    let recorded = async {
        loop {
            let status = client
                .peer()
                .call_tool(tool_call("invoice_status"))
                .await
                .expect("invoice_status answers");
            let status = serde_json::to_value(status).unwrap();
            if status["structuredContent"]["status"] == wanted {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), recorded)
        .await
        .unwrap_or_else(|_| panic!("the invoice reads {wanted} in time"));
    client.cancel().await.expect("the client closes");
}

// ---- the scenarios, with rmcp's client --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_call_past_its_timeout_becomes_a_task_polled_to_its_result() {
    // The tool stops waiting after 500 ms, long before the server's own threshold (10 s); the
    // invoice takes 1.5 s.
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let toolbox = invoicing(
        Arc::new(MemoryStore::new()),
        billing.clone(),
        Some(Duration::from_millis(500)),
    );
    let server = Server::start(toolbox, "memory", Duration::from_secs(10)).await;
    let alice = rmcp_client(&server.url, "alice-token", true).await;
    let bob = rmcp_client(&server.url, "bob-token", true).await;
    let carol = rmcp_client(&server.url, "carol-token", true).await;

    let task = task_id(call(&alice).await);
    // The same call again, while the first runs, is that call: it gets its task again (as a
    // client whose connection dropped before the task's answer came would).
    assert_eq!(task_id(call(&alice).await), task);
    // Carol's call of the same invoice (she shares Alice's tenant) follows Alice's, as a task
    // of her own.
    let carols = task_id(call(&carol).await);
    assert_ne!(carols, task);
    // Bob, naming Alice's task, is told there is none, and so is Carol, who shares Alice's
    // tenant, not her tasks; a cancel changes nothing either way.
    not_found(poll(&bob, &task).await);
    not_found(poll(&carol, &task).await);
    bob.peer()
        .cancel_task(CancelTaskParams::new(task.clone()))
        .await
        .expect_err("no such task for Bob");
    alice
        .peer()
        .cancel_task(CancelTaskParams::new(task.clone()))
        .await
        .expect("a cancel is acknowledged");

    // Alice polls it to its end from another connection: the task is hers, not her session's.
    let again = rmcp_client(&server.url, "alice-token", true).await;
    let (statuses, last) = poll(&again, &task).await.unwrap();
    assert_eq!(statuses.first(), Some(&TaskStatus::Working));
    assert_eq!(statuses.last(), Some(&TaskStatus::Completed));
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    // Carol's followed Alice's call: its result is a replay, and says so.
    let (_, last) = poll(&carol, &carols).await.unwrap();
    assert_eq!(invoice_of(&task_result(&last)), ("inv-1".to_string(), true));
    // The call again is a replay of the same invoice.
    match call(&alice).await {
        CallToolResponse::Complete(result) => assert_eq!(
            invoice_of(&serde_json::to_value(result).unwrap()),
            ("inv-1".to_string(), true)
        ),
        other => panic!("{other:?}"),
    }
    for client in [alice, bob, carol, again] {
        client.cancel().await.expect("the client closes");
    }
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_without_tasks_gets_timeout_naming_the_status_tool() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let toolbox = invoicing(
        Arc::new(MemoryStore::new()),
        billing.clone(),
        Some(Duration::from_millis(500)),
    );
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let client = rmcp_client(&server.url, "alice-token", false).await;
    let result = match call(&client).await {
        CallToolResponse::Complete(result) => serde_json::to_value(result).unwrap(),
        other => panic!("a result, not {other:?}"),
    };
    let error = error_of(&result);
    assert_eq!(
        (&error["code"], &error["retryable"]),
        (&json!("TIMEOUT"), &json!(true))
    );
    assert!(
        error["suggestion"]
            .as_str()
            .unwrap()
            .contains("`invoice_status`"),
        "{error}"
    );
    // Nor may it ask after tasks: it never said it could read them.
    let refused = client.peer().get_task(GetTaskParams::new("tk-0")).await;
    assert!(
        matches!(refused, Err(ServiceError::McpError(_))),
        "{refused:?}"
    );
    client.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_second_postgres_instance_answers_the_poll() {
    let (Some(store_a), Some(store_b)) = (postgres().await, postgres().await) else {
        return;
    };
    let run = fresh_run();
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let a = Server::start(
        invoicing(store_a, billing.clone(), None),
        &run,
        Duration::from_millis(300),
    )
    .await;
    let b = Server::start(
        invoicing(store_b, billing.clone(), None),
        &run,
        Duration::from_millis(300),
    )
    .await;
    let on_a = rmcp_client(&a.url, "alice-token", true).await;
    let task = task_id(call(&on_a).await);
    on_a.cancel().await.expect("the client closes");

    let on_b = rmcp_client(&b.url, "alice-token", true).await;
    let bob_on_b = rmcp_client(&b.url, "bob-token", true).await;
    not_found(poll(&bob_on_b, &task).await);
    let (statuses, last) = poll(&on_b, &task).await.unwrap();
    assert_eq!(statuses.first(), Some(&TaskStatus::Working));
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    for client in [on_b, bob_on_b] {
        client.cancel().await.expect("the client closes");
    }
    a.stop().await;
    b.stop().await;
    assert_eq!(billing.count(), 1);
}

/// Whether the billing system is down: a call then fails after its delay, retryably.
#[derive(Default)]
struct Outage(AtomicBool);

impl Outage {
    fn is_on(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Whether billing was down: it is back from now on.
    fn end(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

/// Send an invoice; while billing is down, fail after the delay, and say a retry is safe.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    name = "send_invoice"
)]
async fn send_invoice_in_an_outage(
    billing: State<Billing>,
    outage: State<Outage>,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    if outage.is_on() {
        let delay = *billing.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        return Err(
            ToolError::new("BILLING_DOWN", "the billing system is down").with_retryable(true)
        );
    }
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_task_whose_call_failed_retryably_says_call_again() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(800)));
    let outage = Arc::new(Outage(AtomicBool::new(true)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .shared_state(outage.clone())
        .tool(SendInvoiceInAnOutage)
        .build()
        .unwrap();
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let alice = rmcp_client(&server.url, "alice-token", true).await;

    // The call fails after it became a task: the failure released the key, and the task
    // answers as the call would have, with the tool's error, which says a retry is safe.
    let task = task_id(call(&alice).await);
    let (_, last) = poll(&alice, &task).await.unwrap();
    let error = error_of(&task_result(&last));
    assert_eq!(
        (&error["code"], &error["retryable"]),
        (&json!("BILLING_DOWN"), &json!(true))
    );
    assert_eq!(billing.count(), 0);

    // Billing is back; the retry runs, once, and becomes a task of its own. The first task
    // does not follow it: its call ended.
    outage.0.store(false, Ordering::SeqCst);
    let retry = task_id(call(&alice).await);
    assert_ne!(retry, task);
    let (statuses, last) = poll(&alice, &task).await.unwrap();
    assert_eq!(statuses, [TaskStatus::Completed]);
    assert_eq!(error_of(&task_result(&last))["code"], "BILLING_DOWN");
    let (_, last) = poll(&alice, &retry).await.unwrap();
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    alice.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

/// Send an invoice, in three stages, reporting progress before each.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    name = "send_invoice"
)]
async fn send_invoice_in_stages(
    billing: State<Billing>,
    ctx: &ToolContext,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    for i in 1..=3 {
        ctx.progress(f64::from(i), Some(3.0), &format!("stage {i} of 3"))
            .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_progress_stops_once_a_call_is_a_task() {
    // The stages take 400 ms each; the call becomes a task after 300 ms, during the first.
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoiceInStages)
        .build()
        .unwrap();
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let alice = rmcp_client(&server.url, "alice-token", true).await;
    let mut asking = tool_call("send_invoice");
    asking.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
        NumberOrString::Number(1),
    )));
    let task = task_id(alice.peer().call_tool_once(asking).await.unwrap());
    let (_, last) = poll(&alice, &task).await.unwrap();
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    // The first stage was reported while the request was open; the extension has no progress
    // for tasks, and the later stages went to no one.
    assert_eq!(*alice.service().progress.lock().unwrap(), [1.0]);
    alice.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

/// Send an invoice; the same call again while one runs waits for it (up to 20 s) and replays
/// it. While billing is down, the next call fails after the delay, retryably, and billing is
/// back.
#[tool(
    idempotent(
        key = "invoice:<customer>:<period>",
        status = "invoice_status",
        on_in_progress = "wait(20s)"
    ),
    name = "send_invoice"
)]
async fn send_invoice_or_wait(
    billing: State<Billing>,
    outage: State<Outage>,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    if outage.end() {
        let delay = *billing.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        return Err(
            ToolError::new("BILLING_DOWN", "the billing system is down").with_retryable(true)
        );
    }
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

/// A server whose duplicate calls wait, its invoices taking `delay`, billing down for the next
/// call when `outage`; Alice's call, made by a client without tasks, running; and Carol's call
/// of the same invoice (she shares Alice's tenant), by a client with tasks, waiting behind it
/// and announced as a task. The server, Alice's call, Carol's client and her task.
async fn duplicate_waiting_as_a_task(
    billing: &Arc<Billing>,
    outage: bool,
) -> (Server, JoinHandle<CallToolResponse>, Client, String) {
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .shared_state(Arc::new(Outage(AtomicBool::new(outage))))
        .tool(SendInvoiceOrWait)
        .build()
        .unwrap();
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let alice = rmcp_client(&server.url, "alice-token", false).await;
    let first = tokio::spawn(async move {
        let answer = call(&alice).await;
        alice.cancel().await.expect("the client closes");
        answer
    });
    until_status(&server.url, "in_progress").await;
    let carol = rmcp_client(&server.url, "carol-token", true).await;
    let task = task_id(call(&carol).await);
    (server, first, carol, task)
}

fn complete(response: CallToolResponse) -> Value {
    match response {
        CallToolResponse::Complete(result) => serde_json::to_value(result).unwrap(),
        other => panic!("a result, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_waiting_duplicate_as_a_task_ends_with_a_replay_marked_as_one() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let (server, first, carol, task) = duplicate_waiting_as_a_task(&billing, false).await;
    let first = complete(first.await.unwrap());
    assert_eq!(invoice_of(&first), ("inv-1".to_string(), false));

    // Carol's call did not send the invoice: its task's result is Alice's, marked a replay, as
    // the same call without a task is answered.
    let (_, last) = poll(&carol, &task).await.unwrap();
    let result = task_result(&last);
    assert_eq!(invoice_of(&result), ("inv-1".to_string(), true));
    assert_eq!(result["content"][1]["type"], "text", "{result}");
    let without_task = rmcp_client(&server.url, "carol-token", false).await;
    assert_eq!(
        invoice_of(&complete(call(&without_task).await)),
        ("inv-1".to_string(), true)
    );
    for client in [carol, without_task] {
        client.cancel().await.expect("the client closes");
    }
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_waiting_duplicate_that_takes_the_key_is_the_task_that_acted() {
    // Alice's call fails retryably after 1 s and frees the key; Carol's, waiting, takes it and
    // sends the invoice.
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1000)));
    let (server, first, carol, task) = duplicate_waiting_as_a_task(&billing, true).await;
    let error = error_of(&complete(first.await.unwrap()));
    assert_eq!(
        (&error["code"], &error["retryable"]),
        (&json!("BILLING_DOWN"), &json!(true))
    );

    // Carol's task follows her own call, which sent the invoice: not "no outcome".
    let (statuses, last) = poll(&carol, &task).await.unwrap();
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false),
        "{statuses:?}"
    );
    carol.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

/// Send an invoice, whose record is kept for a second once it is sent.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    retain = "1s",
    name = "send_invoice"
)]
async fn send_invoice_kept_briefly(
    billing: State<Billing>,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_task_lives_as_long_as_its_call_runs() {
    // The invoice takes 2.5 s, more than the second its records are kept once it is sent.
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(2500)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoiceKeptBriefly)
        .build()
        .unwrap();
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let alice = rmcp_client(&server.url, "alice-token", true).await;
    let task = task_id(call(&alice).await);
    let (statuses, last) = poll(&alice, &task)
        .await
        .expect("the task is found for as long as its call runs");
    assert_eq!(statuses.first(), Some(&TaskStatus::Working));
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    alice.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_a_call_whose_task_answer_was_lost_finds_its_task_again() {
    // The invoice takes 1.5 s; the call becomes a task after 300 ms.
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(1500)));
    let toolbox = invoicing(Arc::new(MemoryStore::new()), billing.clone(), None);
    let server = Server::start(toolbox, "memory", Duration::from_millis(300)).await;
    let alice = rmcp_client(&server.url, "alice-token", true).await;
    // The task is announced; its answer is lost with the connection.
    let lost = task_id(call(&alice).await);
    alice.cancel().await.expect("the client closes");

    // Alice reconnects and calls again: the same task, which ends with the one invoice.
    let again = rmcp_client(&server.url, "alice-token", true).await;
    let task = task_id(call(&again).await);
    assert_eq!(task, lost);
    let (_, last) = poll(&again, &task).await.unwrap();
    assert_eq!(
        invoice_of(&task_result(&last)),
        ("inv-1".to_string(), false)
    );
    again.cancel().await.expect("the client closes");
    server.stop().await;
    assert_eq!(billing.count(), 1);
}
