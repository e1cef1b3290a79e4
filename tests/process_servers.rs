//! Workers on several OS processes sharing a PostgreSQL or Redis store, or a Redis store on a
//! Redis Cluster: each key executes once, a paused worker that lost its lease cannot overwrite
//! the new owner's outcome, and a store that goes away fails closed and is used again when it is
//! back.
//!
//! The test binary runs itself as the worker process: `child_process_entry` does the worker's
//! part when `TOOLKEY_CHILD` is set, and nothing otherwise.
#![cfg(all(feature = "postgres", feature = "redis", unix))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::json;
use toolkey::store::{PostgresStore, RedisStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::{child, servers};

const POSTGRES: (&str, &str) = (
    "TOOLKEY_POSTGRES_URL",
    "postgres://postgres@127.0.0.1:5432/test",
);
const REDIS: (&str, &str) = ("TOOLKEY_REDIS_URL", "redis://127.0.0.1:6379");
/// Comma-separated node URLs.
const REDIS_CLUSTER: (&str, &str) = (
    "TOOLKEY_REDIS_CLUSTER_URLS",
    "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002,\
redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005",
);

/// The store named `kind`; an unreachable server fails the test.
async fn store(kind: &str) -> Option<Arc<dyn Store>> {
    let (var, default) = match kind {
        "postgres" => POSTGRES,
        "redis-cluster" => REDIS_CLUSTER,
        _ => REDIS,
    };
    let url = servers::url(var, default);
    let store: Result<Arc<dyn Store>, _> = match kind {
        "postgres" => PostgresStore::connect(&url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn Store>),
        "redis-cluster" => RedisStore::cluster_builder(url.split(',').map(str::trim))
            .connect()
            .await
            .map(|s| Arc::new(s) as Arc<dyn Store>),
        _ => RedisStore::connect(&url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn Store>),
    };
    match store {
        Ok(store) => Some(store),
        Err(err) => {
            servers::unreachable(kind, var, &url, err);
            None
        }
    }
}

/// The outside system: a ledger of effects in a SQLite file all processes share.
struct Ledger {
    db: Mutex<Connection>,
    executions: AtomicUsize,
    /// Set in a worker that should signal and then sleep in its body.
    slow: Option<PathBuf>,
}

impl Ledger {
    fn open(dir: &Path, slow: Option<PathBuf>) -> Ledger {
        let db = Connection::open(dir.join("ledger.db")).unwrap();
        db.busy_timeout(Duration::from_secs(30)).unwrap();
        db.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, action TEXT NOT NULL, pid INTEGER NOT NULL)").unwrap();
        Ledger {
            db: Mutex::new(db),
            executions: AtomicUsize::new(0),
            slow,
        }
    }

    fn record(&self, action: &str) {
        self.db
            .lock()
            .unwrap()
            .execute(
                "INSERT INTO effects (action, pid) VALUES (?1, ?2)",
                rusqlite::params![action, std::process::id()],
            )
            .unwrap();
    }

    fn count(&self) -> usize {
        let n: i64 = self
            .db
            .lock()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM effects", [], |r| r.get(0))
            .unwrap();
        n as usize
    }

    fn distinct(&self) -> usize {
        let n: i64 = self
            .db
            .lock()
            .unwrap()
            .query_row("SELECT COUNT(DISTINCT action) FROM effects", [], |r| {
                r.get(0)
            })
            .unwrap();
        n as usize
    }
}

/// Ship one order; short lease so a paused worker loses it quickly.
#[tool(idempotent(key = "ship:<order>", recover = never_found), lease = "1s")]
async fn ship(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.executions.fetch_add(1, Ordering::SeqCst);
    if let Some(signal) = &ledger.slow {
        std::fs::write(signal, "in body").unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ledger.record(&order);
    Ok(format!("shipped {order} by {}", std::process::id()))
}

/// The tests' outside system keeps no trace a lookup could find before the effect is recorded.
async fn never_found(_ledger: State<Ledger>, _order: String) -> Result<Option<String>, ToolError> {
    Ok(None)
}

fn toolbox(store: Arc<dyn Store>, ledger: Arc<Ledger>) -> Toolbox {
    Toolbox::builder()
        .shared_store(store)
        .shared_state(ledger)
        .tool(Ship)
        .build()
        .unwrap()
}

fn spawn_child(kind: &str, mode: &str, dir: &Path, tenant: &str) -> Child {
    child::spawn_self(&[
        ("TOOLKEY_CHILD", mode.as_ref()),
        ("TOOLKEY_CHILD_STORE", kind.as_ref()),
        ("TOOLKEY_CHILD_DIR", dir.as_os_str()),
        ("TOOLKEY_CHILD_TENANT", tenant.as_ref()),
    ])
}

/// The worker's part, when this binary runs as a child process; nothing otherwise.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let kind = std::env::var("TOOLKEY_CHILD_STORE").unwrap();
    let dir = PathBuf::from(std::env::var("TOOLKEY_CHILD_DIR").unwrap());
    let tenant = std::env::var("TOOLKEY_CHILD_TENANT").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = store(&kind).await.expect("the parent reached the server");
        let ctx = ToolContext::new("run").with_tenant(tenant);
        if mode == "slow" {
            let ledger = Arc::new(Ledger::open(&dir, Some(dir.join("signal"))));
            let _ = toolbox(store, ledger)
                .call("ship", json!({"order": "o-paused"}), &ctx)
                .await;
            return;
        }
        let toolbox = toolbox(store, Arc::new(Ledger::open(&dir, None)));
        let mut tasks = Vec::new();
        for task in 0..16 {
            let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..50 {
                    let order = format!("o-{}", (i + task * 3) % 50);
                    match toolbox.call("ship", json!({"order": order}), &ctx).await {
                        Ok(_) => {}
                        Err(err) if err.is(ErrorCode::InProgress) => {}
                        Err(err) => panic!("unexpected {err:?}"),
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert!(toolbox.shutdown().await.is_clean());
    });
}

fn tenant() -> String {
    format!("t-{}", uuid::Uuid::new_v4())
}

async fn four_processes_sixteen_tasks_fifty_keys(kind: &str) {
    if store(kind).await.is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), None);
    let tenant = tenant();
    let mut children: Vec<Child> = (0..4)
        .map(|_| spawn_child(kind, "race", dir.path(), &tenant))
        .collect();
    for child in &mut children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
    assert_eq!(
        ledger.count(),
        50,
        "exactly one execution per key through {kind}"
    );
    assert_eq!(ledger.distinct(), 50);
}

#[test]
fn four_processes_through_postgres_execute_each_key_once() {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(four_processes_sixteen_tasks_fifty_keys("postgres"));
}

#[test]
fn four_processes_through_redis_execute_each_key_once() {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(four_processes_sixteen_tasks_fifty_keys("redis"));
}

#[test]
fn four_processes_through_a_redis_cluster_execute_each_key_once() {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(four_processes_sixteen_tasks_fifty_keys("redis-cluster"));
}

/// A worker paused (SIGSTOP) inside its body stops renewing; its lease lapses, another worker
/// takes the key over and records its outcome; the paused worker, resumed, cannot overwrite it.
async fn a_paused_worker_cannot_complete_after_a_takeover(kind: &str) {
    let Some(store) = store(kind).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(dir.path(), None));
    let tenant = tenant();
    let mut child = spawn_child(kind, "slow", dir.path(), &tenant);
    child::wait_for(
        &dir.path().join("signal"),
        "the worker never reached its body",
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());

    let toolbox = toolbox(store, ledger.clone());
    let ctx = ToolContext::new("run").with_tenant(tenant);
    let args = json!({"order": "o-paused"});
    let err = toolbox.call("ship", args.clone(), &ctx).await.unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mine = toolbox.call("ship", args.clone(), &ctx).await.unwrap();
    assert!(!mine.replayed);

    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    assert!(child.wait().unwrap().success());
    let status = toolbox
        .call("ship_status", json!({"order": "o-paused"}), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    assert_eq!(
        status.value["result"], mine.value,
        "the store keeps the new owner's outcome"
    );
    assert_eq!(
        ledger.count(),
        2,
        "both bodies ran: the paused one's effect is the cost of its pause"
    );
}

#[tokio::test]
async fn a_paused_postgres_worker_cannot_complete_after_a_takeover() {
    a_paused_worker_cannot_complete_after_a_takeover("postgres").await;
}

#[tokio::test]
async fn a_paused_redis_worker_cannot_complete_after_a_takeover() {
    a_paused_worker_cannot_complete_after_a_takeover("redis").await;
}

#[tokio::test]
async fn a_paused_redis_cluster_worker_cannot_complete_after_a_takeover() {
    a_paused_worker_cannot_complete_after_a_takeover("redis-cluster").await;
}

/// Through a proxy that plays the server going away mid-run and coming back.
/// (Not on a cluster: its nodes announce their own addresses, which a proxy cannot stand in for;
/// the cluster's own failure, a failover, is tested in `store_redis_cluster`.)
async fn an_outage_fails_closed_and_passes(kind: &str) {
    let (var, default) = if kind == "postgres" { POSTGRES } else { REDIS };
    let url = servers::url(var, default);
    if store(kind).await.is_none() {
        return;
    }
    let (proxy, through) = servers::behind_proxy(&url).await;
    let store: Arc<dyn Store> = match kind {
        "postgres" => Arc::new(
            PostgresStore::builder(through.as_str())
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap(),
        ),
        _ => Arc::new(
            RedisStore::builder(through.as_str())
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap(),
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(dir.path(), None));
    let toolbox = toolbox(store, ledger.clone());
    let ctx = ToolContext::new("run").with_tenant(tenant());
    toolbox
        .call("ship", json!({"order": "before"}), &ctx)
        .await
        .unwrap();

    proxy.stop().await;
    for i in 0..3 {
        let err = toolbox
            .call("ship", json!({"order": format!("during-{i}")}), &ctx)
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::StoreUnavailable), "{err:?}");
        assert!(err.is_retryable());
    }
    assert_eq!(
        ledger.executions.load(Ordering::SeqCst),
        1,
        "no body ran without a reservation"
    );

    proxy.restart().await;
    let mut back = None;
    for _ in 0..50 {
        match toolbox.call("ship", json!({"order": "after"}), &ctx).await {
            Ok(out) => {
                back = Some(out);
                break;
            }
            Err(err) if err.is(ErrorCode::StoreUnavailable) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(err) => panic!("unexpected {err:?}"),
        }
    }
    assert!(
        back.is_some(),
        "the same toolbox works again once the server is back"
    );
    assert!(
        toolbox
            .call("ship", json!({"order": "before"}), &ctx)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(ledger.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_fails_closed_and_passes() {
    an_outage_fails_closed_and_passes("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_fails_closed_and_passes() {
    an_outage_fails_closed_and_passes("redis").await;
}
