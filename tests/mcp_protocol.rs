//! MCP's 2026-07-28 protocol end to end, beside the revisions before it: `server/discover`, the
//! routing headers held against the body, `resultType` on every result, a tool list's cache
//! fields; and several server instances sharing one store behind one address, as a stateless
//! deployment runs them: a call answered by one instance and its retry by another do the work
//! once, the retry marked a replay, with the official Python SDK and with rmcp's client, on
//! 2026-07-28 and on the revision before it. Every scenario ends with an exact count of
//! invoices on a fake billing system.
#![cfg(all(feature = "mcp-http", feature = "postgres", feature = "redis"))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolkey::providers::mcp::http::{bearer_token, McpHttp, Parts, Principal, Refusal};
use toolkey::store::{PostgresStore, RedisStore, Store};
use toolkey::Toolbox;
use toolkey_tests::mcp_wire::{rpc_answer, wire_answer};
use toolkey_tests::{billing, mcp_python, servers};

use billing::{Billing, SendInvoice};
use mcp_python::python;

// ---- the deployment ----------------------------------------------------------------------------

fn authenticate(request: &Parts) -> Result<Principal, Refusal> {
    match bearer_token(request) {
        Some("alice-token") => Ok(Principal::new("alice")),
        _ => Err(Refusal::unauthenticated("unknown token")),
    }
}

/// Where the instances keep their records: one store, shared.
#[derive(Clone, Copy, Debug)]
enum Shared {
    Postgres,
    Redis,
}

impl Shared {
    /// A store on the shared server, in a table (or key prefix) of this test's own: each
    /// instance connects on its own, as a process of its own would.
    async fn connect(self, place: &str) -> Arc<dyn Store> {
        match self {
            Shared::Postgres => {
                let url = servers::url(
                    "TOOLKEY_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                let store = PostgresStore::builder(&url)
                    .table(place)
                    .connect()
                    .await
                    .unwrap_or_else(|e| {
                        servers::unreachable("PostgreSQL", "TOOLKEY_POSTGRES_URL", &url, e);
                        unreachable!()
                    });
                Arc::new(store)
            }
            Shared::Redis => {
                let url = servers::url("TOOLKEY_REDIS_URL", "redis://127.0.0.1:6379");
                let store = RedisStore::builder(&url)
                    .prefix(format!("{place}:"))
                    .connect()
                    .await
                    .unwrap_or_else(|e| {
                        servers::unreachable("Redis", "TOOLKEY_REDIS_URL", &url, e);
                        unreachable!()
                    });
                Arc::new(store)
            }
        }
    }
}

/// Two server instances, each its own toolbox on its own connection to one shared store, behind
/// one address (a front that sends each new connection to the instance it is set to), and the
/// billing system both send invoices through.
struct Deployment {
    url: String,
    billing: Arc<Billing>,
    front: Arc<AtomicUsize>,
    /// The connections each instance was sent.
    served: Arc<[AtomicUsize; 2]>,
    instances: Vec<(oneshot::Sender<()>, JoinHandle<std::io::Result<()>>)>,
}

impl Deployment {
    async fn start(shared: Shared, place: &str) -> Deployment {
        let billing = Arc::new(Billing::default());
        let mut instances = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let store = shared.connect(place).await;
            let toolbox = Toolbox::builder()
                .store(store)
                .shared_state(billing.clone())
                .tool(SendInvoice)
                .build()
                .expect("a valid toolbox");
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(listener.local_addr().unwrap());
            let (stop, stopped) = oneshot::channel::<()>();
            let mcp = McpHttp::new(toolbox, authenticate);
            let served = tokio::spawn(mcp.serve(listener, async {
                let _ = stopped.await;
            }));
            instances.push((stop, served));
        }
        let front = Arc::new(AtomicUsize::new(0));
        let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(forward(
            listener,
            [addrs[0], addrs[1]],
            front.clone(),
            served.clone(),
        ));
        Deployment {
            url,
            billing,
            front,
            served,
            instances,
        }
    }

    /// From now on, new connections go to instance `i`.
    fn route_to(&self, i: usize) {
        self.front.store(i, Ordering::SeqCst);
    }

    /// The connections each instance was sent so far.
    fn served(&self) -> [usize; 2] {
        [0, 1].map(|i| self.served[i].load(Ordering::SeqCst))
    }

    /// Stops both instances; the invoices sent.
    async fn stop(self) -> usize {
        for (stop, served) in self.instances {
            let _ = stop.send(());
            tokio::time::timeout(Duration::from_secs(30), served)
                .await
                .expect("the instance stops in time")
                .expect("the instance's task ends")
                .expect("the instance ends cleanly");
        }
        self.billing.count()
    }
}

/// The front: each connection accepted on `listener` goes to the instance `front` names.
async fn forward(
    listener: TcpListener,
    instances: [SocketAddr; 2],
    front: Arc<AtomicUsize>,
    served: Arc<[AtomicUsize; 2]>,
) {
    while let Ok((mut client, _)) = listener.accept().await {
        let i = front.load(Ordering::SeqCst);
        served[i].fetch_add(1, Ordering::SeqCst);
        let target = instances[i];
        tokio::spawn(async move {
            if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
    }
}

/// A place of this test's own in the shared store.
fn place(name: &str) -> String {
    format!("mcp_protocol_{name}_{}", std::process::id())
}

/// The invoice for acme's `period`, as a call's arguments.
fn invoice(period: &str) -> Value {
    json!({"customer": "acme", "period": period, "amount": 120.0, "memo": "October"})
}

/// The names of a `tools/list` result's tools, in order.
fn tool_names(list: &Value) -> Vec<&str> {
    list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("a tool list: {list}"))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect()
}

// ---- clients -----------------------------------------------------------------------------------

/// Runs one of the Python SDK scripts of `tests/mcp_http/` with `plan`: the lines it printed.
async fn python_script(script: &str, plan: Value) -> Vec<Value> {
    let script = format!("{}/mcp_http/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(python())
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
        "the Python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// One call of `send_invoice` for `period` by a Python client of its own, on 2026-07-28
/// (`stateless.py`: discovery, no session) or on the revision before it (`client.py`: a
/// session): the answer, and the revision the client spoke.
async fn python_call(url: &str, period: &str, stateless: bool) -> (Value, String) {
    let calls = json!([{"tool": "send_invoice", "arguments": invoice(period)}]);
    let plan = json!({"url": url, "token": "alice-token", "calls": calls});
    let script = if stateless {
        "stateless.py"
    } else {
        "client.py"
    };
    let mut lines = python_script(script, plan).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = lines.remove(0);
    let protocol = line["protocol"].as_str().unwrap().to_string();
    (line, protocol)
}

type Client = RunningService<RoleClient, ()>;

/// An rmcp client of its own: on 2026-07-28 (`server/discover`, no session) when `stateless`,
/// else through `initialize` and a session, on the newest revision before it.
async fn rmcp_client(url: &str, stateless: bool) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header("alice-token"),
    );
    let connected = if stateless {
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        ().serve_with_lifecycle(transport, lifecycle).await
    } else {
        ().serve(transport).await
    };
    connected.expect("the client connects")
}

/// One call of `send_invoice` for `period` by an rmcp client of its own (see [`rmcp_client`]):
/// the answer on the wire, and the revision the client spoke.
async fn rmcp_call(url: &str, period: &str, stateless: bool) -> (Value, String) {
    let client = rmcp_client(url, stateless).await;
    let protocol = client
        .peer_info()
        .map(|info| info.protocol_version.to_string())
        .unwrap_or_default();
    let params = CallToolRequestParams::new("send_invoice")
        .with_arguments(invoice(period).as_object().unwrap().clone());
    let result = tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
        .await
        .expect("the call is answered in time")
        .expect("tools/call succeeds");
    let _ = client.cancel().await;
    (serde_json::to_value(result).unwrap(), protocol)
}

// ---- a retry on another instance ---------------------------------------------------------------

/// Each client, on each revision, calls through the front while it routes to one instance; the
/// front turns to the other, and a new client (a retry after a dropped connection) makes the
/// same call there.
async fn retry_on_the_other_instance(shared: Shared, name: &str) {
    let deployment = Deployment::start(shared, &place(name)).await;
    let mut invoices = 0;
    for (client, stateless, period) in [
        ("python", true, "2026-10"),
        ("python", false, "2026-11"),
        ("rmcp", true, "2026-12"),
        ("rmcp", false, "2027-01"),
    ] {
        let call = |url: String| async move {
            match client {
                "python" => python_call(&url, period, stateless).await,
                _ => rmcp_call(&url, period, stateless).await,
            }
        };
        deployment.route_to(0);
        let before = deployment.served();
        let (first, protocol) = call(deployment.url.clone()).await;
        deployment.route_to(1);
        let middle = deployment.served();
        let (retry, again) = call(deployment.url.clone()).await;
        let after = deployment.served();
        let what = format!("{client} on {protocol} ({shared:?})");
        // The call went to the first instance only, its retry to the second only.
        assert!(
            middle[0] > before[0] && middle[1] == before[1],
            "{what}: {before:?} {middle:?}"
        );
        assert!(
            after[1] > middle[1] && after[0] == middle[0],
            "{what}: {middle:?} {after:?}"
        );
        assert_eq!(protocol, again, "{what}");
        assert_eq!(
            protocol == "2026-07-28",
            stateless,
            "{what}: the client spoke the revision it was meant to"
        );
        invoices += 1;
        let id = format!("inv-{invoices}");
        assert_eq!(wire_answer(&first), (id.clone(), false), "{what}: {first}");
        assert_eq!(wire_answer(&retry), (id, true), "{what}: {retry}");
        assert_eq!(deployment.billing.count(), invoices, "{what}");
    }
    assert_eq!(deployment.stop().await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_over_postgres_is_a_replay() {
    retry_on_the_other_instance(Shared::Postgres, "pg_retry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_over_redis_is_a_replay() {
    retry_on_the_other_instance(Shared::Redis, "redis_retry").await;
}

// ---- the protocol on the wire ------------------------------------------------------------------

/// A raw POST of `message` on 2026-07-28, with the routing headers `method` and `name` (when
/// given): the HTTP status and the JSON-RPC answer.
async fn post_2026(url: &str, message: Value, method: &str, name: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", "Bearer alice-token")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let response = request
        .body(message.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let answer =
        rpc_answer(&text).unwrap_or_else(|| panic!("a JSON-RPC answer ({status}): {text}"));
    (status, answer)
}

/// A 2026-07-28 request: the version, capabilities and client in its own `_meta`.
fn request_2026(method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_and_every_result_speak_2026_07_28() {
    let deployment = Deployment::start(Shared::Postgres, &place("wire")).await;
    let url = deployment.url.clone();

    let (status, discover) = post_2026(
        &url,
        request_2026("server/discover", json!({})),
        "server/discover",
        None,
    )
    .await;
    assert_eq!(status, 200, "{discover}");
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete", "{discover}");
    let versions: Vec<&str> = result["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("supported versions: {discover}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // The new revision, and the ones before it for clients that speak them.
    for version in ["2026-07-28", "2025-11-25", "2025-06-18"] {
        assert!(versions.contains(&version), "{version}: {versions:?}");
    }
    assert!(result["capabilities"]["tools"].is_object(), "{discover}");

    let (status, list) = post_2026(
        &url,
        request_2026("tools/list", json!({})),
        "tools/list",
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    let result = &list["result"];
    assert_eq!(result["resultType"], "complete", "{list}");
    assert_eq!(result["ttlMs"], 60_000, "{list}");
    assert_eq!(result["cacheScope"], "private", "{list}");
    assert_eq!(
        tool_names(result),
        ["invoice_status", "send_invoice"],
        "{list}"
    );

    let call = request_2026(
        "tools/call",
        json!({"name": "send_invoice", "arguments": invoice("2026-10")}),
    );
    let (status, answer) = post_2026(&url, call.clone(), "tools/call", Some("send_invoice")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert_eq!(wire_answer(&answer["result"]), ("inv-1".into(), false));
    let (_, again) = post_2026(&url, call, "tools/call", Some("send_invoice")).await;
    assert_eq!(again["result"]["resultType"], "complete", "{again}");
    assert_eq!(wire_answer(&again["result"]), ("inv-1".into(), true));
    // An error is a result too: the model reads it, and it says its type.
    let bad = request_2026(
        "tools/call",
        json!({"name": "send_invoice", "arguments": {"customer": "acme"}}),
    );
    let (status, refused) = post_2026(&url, bad, "tools/call", Some("send_invoice")).await;
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["result"]["resultType"], "complete", "{refused}");
    assert_eq!(wire_answer(&refused["result"]).0, "INVALID_ARGUMENTS");
    assert_eq!(deployment.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_headers_that_contradict_the_body_are_refused_and_nothing_runs() {
    let deployment = Deployment::start(Shared::Postgres, &place("headers")).await;
    let url = deployment.url.clone();
    let call = request_2026(
        "tools/call",
        json!({"name": "send_invoice", "arguments": invoice("2026-10")}),
    );
    // A middlebox routes on the headers: one that names another method or tool than the body
    // is the protocol's header mismatch (HTTP 400, -32020), and the tool never runs.
    for (method, name) in [
        ("tools/list", Some("send_invoice")),
        ("tools/call", Some("list_invoices")),
        ("tools/call", None),
    ] {
        let (status, answer) = post_2026(&url, call.clone(), method, name).await;
        assert_eq!(status, 400, "{method} {name:?}: {answer}");
        assert_eq!(
            answer["error"]["code"], -32020,
            "{method} {name:?}: {answer}"
        );
    }
    assert_eq!(deployment.billing.count(), 0);
    // The same request with headers that agree runs once.
    let (status, answer) = post_2026(&url, call, "tools/call", Some("send_invoice")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(wire_answer(&answer["result"]), ("inv-1".into(), false));
    assert_eq!(deployment.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_an_older_revision_gets_its_results_as_it_speaks_them() {
    let deployment = Deployment::start(Shared::Postgres, &place("legacy")).await;
    let client = rmcp_client(&deployment.url, false).await;
    let protocol = client.peer_info().unwrap().protocol_version.to_string();
    assert_ne!(protocol, "2026-07-28");
    let list = client.list_tools(None).await.expect("tools/list succeeds");
    let list = serde_json::to_value(&list).unwrap();
    // No `resultType` for a revision that has none; the tools as on 2026-07-28.
    assert!(list.get("resultType").is_none(), "{protocol}: {list}");
    assert_eq!(
        tool_names(&list),
        ["invoice_status", "send_invoice"],
        "{list}"
    );
    let _ = client.cancel().await;
    assert_eq!(deployment.stop().await, 0);
}
