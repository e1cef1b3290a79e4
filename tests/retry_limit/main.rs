//! Retry limits and concurrency limits, counted on a fake payment gateway and a fake market.
//!
//! A scripted model repeats a failing call fifty times: the gateway sees exactly as many attempts
//! as the tool's retry limit allows, then the model reads `RETRY_LIMIT`. Keyed calls are counted
//! in the store, so OS processes sharing a SQLite file, a PostgreSQL database or a Redis server
//! share the count; calls without a key are counted in the process's memory, by their arguments.
//! A tool's concurrency limit bounds the bodies running at once, and a call that gets no slot in
//! time is `BUSY` and never runs.
//!
//! The test binary runs itself as the child process: `child_process_entry` does the child's
//! part when `TOOLKEY_CHILD` is set, and nothing otherwise.
//!
//! One module per behaviour; the outside systems, the helpers and the child's entry (which the
//! child runs by its exact name, so it stays at the binary's root) are here.

mod after_a_step;
mod concurrency;
mod keyed;
mod place_in_run;
mod processes;
mod same_call;
mod unkeyed;
mod unknown_outcome;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use toolkey::store::Store;
use toolkey::{
    tool, ErrorCode, State, ToolContext, ToolError, ToolOutput, Toolbox, ToolboxBuilder,
};
use toolkey_tests::servers;

// ---------------------------------------------------------------------------------------------
// The outside systems.

/// A payment gateway that is down until told otherwise: every attempt is recorded (in memory,
/// and in a SQLite ledger the processes of one test share, when it has one) and answered with a
/// retryable `GATEWAY_BUSY` while it is down.
#[derive(Default)]
struct Gateway {
    attempts: Mutex<Vec<String>>,
    ledger: Option<Mutex<Connection>>,
    up: AtomicBool,
}

impl Gateway {
    fn down() -> Arc<Gateway> {
        Arc::new(Gateway::default())
    }

    /// The gateway whose attempts go to the ledger in `dir` too.
    fn with_ledger(dir: &Path) -> Arc<Gateway> {
        let ledger = Connection::open(dir.join("ledger.db")).unwrap();
        ledger.busy_timeout(Duration::from_secs(30)).unwrap();
        ledger
            .execute_batch(
                "PRAGMA journal_mode=WAL;
                 CREATE TABLE IF NOT EXISTS attempts (id INTEGER PRIMARY KEY, action TEXT NOT NULL, pid INTEGER NOT NULL)",
            )
            .unwrap();
        Arc::new(Gateway {
            ledger: Some(Mutex::new(ledger)),
            ..Gateway::default()
        })
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    fn attempt(&self, action: String) -> Result<(), ToolError> {
        if let Some(ledger) = &self.ledger {
            ledger
                .lock()
                .unwrap()
                .execute(
                    "INSERT INTO attempts (action, pid) VALUES (?1, ?2)",
                    rusqlite::params![action, std::process::id()],
                )
                .unwrap();
        }
        self.attempts.lock().unwrap().push(action);
        if self.up.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(
                ToolError::new("GATEWAY_BUSY", "the payment gateway is overloaded")
                    .with_retryable(true),
            )
        }
    }

    /// Attempts at `action` this process saw.
    fn attempts(&self, action: &str) -> usize {
        self.attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|a| *a == action)
            .count()
    }

    /// Attempts at `action` in the shared ledger, from every process.
    fn ledger_attempts(&self, action: &str) -> usize {
        let ledger = self.ledger.as_ref().expect("a ledger").lock().unwrap();
        let n: i64 = ledger
            .query_row(
                "SELECT COUNT(*) FROM attempts WHERE action = ?1",
                [action],
                |row| row.get(0),
            )
            .unwrap();
        n as usize
    }
}

/// Charge an order through the gateway.
#[tool(
    idempotent(key = "charge:<order>"),
    retry_limit = "5/10m",
    retain = "1m"
)]
async fn charge(gateway: State<Gateway>, order: String, cents: i64) -> Result<String, ToolError> {
    gateway.attempt(format!("charge:{order}"))?;
    Ok(format!("ch-{order}-{cents}"))
}

/// Quote the price of shipping to a destination.
#[tool(read_only, retry_limit = "5/10m")]
async fn quote(
    gateway: State<Gateway>,
    /// Where to ship.
    destination: String,
    /// Why the model asks: free text it may reword.
    #[arg(ignore)]
    note: String,
) -> Result<u64, ToolError> {
    let _ = note;
    gateway.attempt(format!("quote:{destination}"))?;
    Ok(1200)
}

/// Look a customer up: no limit of its own, so the toolbox's.
#[tool(read_only)]
async fn lookup(gateway: State<Gateway>, customer: String) -> Result<String, ToolError> {
    gateway.attempt(format!("lookup:{customer}"))?;
    Ok(customer)
}

/// A job's status from a gateway that answers slower than the caller waits.
#[tool(read_only, timeout = "50ms", retry_limit = "3/10m")]
async fn job_status(gateway: State<Gateway>, job: String) -> Result<String, ToolError> {
    gateway.attempt(format!("job:{job}"))?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok("done".into())
}

/// A market whose API allows few requests at once: counts the requests running, their peak,
/// and those made; each waits at the gate until the test lets it through.
struct Market {
    running: AtomicUsize,
    peak: AtomicUsize,
    made: Mutex<Vec<String>>,
    gate: Semaphore,
}

impl Default for Market {
    fn default() -> Self {
        Market {
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            made: Mutex::default(),
            gate: Semaphore::new(0),
        }
    }
}

impl Market {
    async fn request(&self, what: String) {
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(running, Ordering::SeqCst);
        self.made.lock().unwrap().push(what);
        self.gate.acquire().await.unwrap().forget();
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    fn made(&self, what: &str) -> usize {
        self.made
            .lock()
            .unwrap()
            .iter()
            .filter(|m| *m == what)
            .count()
    }

    fn total(&self) -> usize {
        self.made.lock().unwrap().len()
    }

    /// Waits until `n` requests are running.
    async fn wait_running(&self, n: usize) {
        for _ in 0..500 {
            if self.running.load(Ordering::SeqCst) == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} requests never ran at once");
    }
}

/// An exchange rate: at most two requests at once.
#[tool(read_only, concurrency = 2)]
async fn rate(market: State<Market>, pair: String) -> Result<String, ToolError> {
    market.request(format!("rate:{pair}")).await;
    Ok(format!("{pair}=1.08"))
}

/// Place an order on the market: one at a time, and the caller waits 100 ms at most.
#[tool(idempotent(key = "order:<order>"), concurrency = 1, timeout = "100ms")]
async fn place(market: State<Market>, order: String) -> Result<String, ToolError> {
    market.request(format!("place:{order}")).await;
    Ok(format!("placed-{order}"))
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn ctx(tenant: &str) -> ToolContext {
    ToolContext::new("run-1").with_tenant(tenant)
}

/// A tenant of its own, so tests sharing a server never meet.
fn tenant() -> String {
    format!("shop-{}", uuid::Uuid::new_v4().simple())
}

fn builder(gateway: &Arc<Gateway>) -> ToolboxBuilder {
    Toolbox::builder()
        .shared_state(gateway.clone())
        .tool(Charge)
        .tool(Quote)
        .tool(Lookup)
        .tool(JobStatus)
}

/// A model that follows a script: it makes the same call `times` times whatever it is told, and
/// notes the code of every answer (`ok` for a result).
struct ScriptedModel {
    answers: Vec<String>,
}

impl ScriptedModel {
    async fn repeat(
        toolbox: &Toolbox,
        tool: &str,
        args: Value,
        ctx: &ToolContext,
        times: usize,
    ) -> Self {
        let mut answers = Vec::new();
        for _ in 0..times {
            answers.push(code(&toolbox.call(tool, args.clone(), ctx).await));
        }
        ScriptedModel { answers }
    }

    fn count(&self, code: &str) -> usize {
        self.answers.iter().filter(|a| *a == code).count()
    }

    /// The index of the first answer with `code`.
    fn first(&self, code: &str) -> Option<usize> {
        self.answers.iter().position(|a| a == code)
    }
}

fn code(answer: &Result<ToolOutput, ToolError>) -> String {
    match answer {
        Ok(_) => "ok".into(),
        Err(err) => err.code().into(),
    }
}

fn charge_args(order: &str) -> Value {
    json!({"order": order, "cents": 4200})
}

/// Fifty calls of one failing charge: five attempts at the gateway, four `GATEWAY_BUSY`, then
/// `RETRY_LIMIT` (the fifth failure's answer, and every later one without an attempt).
async fn storm(store: impl Store) {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).store(store).build().unwrap();
    let ctx = ctx(&tenant());
    let model = ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx, 50).await;
    assert_eq!(gateway.attempts("charge:o-1"), 5, "{:?}", model.answers);
    assert_eq!(model.count("GATEWAY_BUSY"), 4, "{:?}", model.answers);
    assert_eq!(model.first("RETRY_LIMIT"), Some(4), "{:?}", model.answers);
    assert_eq!(model.count("RETRY_LIMIT"), 46, "{:?}", model.answers);
    let stats = toolbox.stats();
    assert_eq!((stats.executed, stats.retry_limited), (5, 46));
    // The answer the model reads: not retryable, names what failed, and tells it to stop.
    let err = toolbox
        .call("charge", charge_args("o-1"), &ctx)
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(err.message().contains("5 times"), "{err:?}");
    assert!(
        err.suggestion().unwrap().contains("tell the user"),
        "{err:?}"
    );
    assert!(!err.to_json().to_string().contains("o-1"), "{err:?}");
    // Another order is another call: it still runs.
    let other = toolbox
        .call("charge", charge_args("o-2"), &ctx)
        .await
        .unwrap_err();
    assert_eq!(other.code(), "GATEWAY_BUSY");
    assert_eq!(gateway.attempts("charge:o-2"), 1);
    // The key was never recorded: the status would say so, and nothing is stuck.
    assert!(toolbox.shutdown().await.is_clean());
}

/// The store of `kind` for `tenant`'s tests: a SQLite file in `dir`, or the PostgreSQL or Redis
/// server (an unreachable one fails the test).
async fn open_store(kind: &str, dir: &Path) -> Option<Arc<dyn Store>> {
    match kind {
        #[cfg(feature = "sqlite")]
        "sqlite" => Some(Arc::new(
            toolkey::store::SqliteStore::open(dir.join("toolkey.db")).unwrap(),
        )),
        _ => server_store(kind).await,
    }
}

/// The PostgreSQL or Redis store; an unreachable server fails the test.
#[allow(unused_variables)]
async fn server_store(kind: &str) -> Option<Arc<dyn Store>> {
    #[cfg(feature = "postgres")]
    if kind == "postgres" {
        let (var, default) = (
            "TOOLKEY_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let url = servers::url(var, default);
        return match toolkey::store::PostgresStore::connect(&url).await {
            Ok(store) => Some(Arc::new(store)),
            Err(err) => {
                servers::unreachable("PostgreSQL", var, &url, err);
                None
            }
        };
    }
    #[cfg(feature = "redis")]
    if kind == "redis" {
        let (var, default) = ("TOOLKEY_REDIS_URL", "redis://127.0.0.1:6379");
        let url = servers::url(var, default);
        return match toolkey::store::RedisStore::connect(&url).await {
            Ok(store) => Some(Arc::new(store)),
            Err(err) => {
                servers::unreachable("Redis", var, &url, err);
                None
            }
        };
    }
    panic!("no store {kind} in this build")
}

/// The child's part: `TOOLKEY_CHILD_CALLS` calls of the failing charge of `o-1` on the store
/// `TOOLKEY_CHILD`, in tenant `TOOLKEY_CHILD_TENANT`; its answers go to `answers` in the dir.
#[test]
fn child_process_entry() {
    let Ok(kind) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("TOOLKEY_CHILD_DIR").unwrap());
    let tenant = std::env::var("TOOLKEY_CHILD_TENANT").unwrap();
    let calls: usize = std::env::var("TOOLKEY_CHILD_CALLS")
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = open_store(&kind, &dir)
            .await
            .expect("the parent reached it");
        let gateway = Gateway::with_ledger(&dir);
        let toolbox = builder(&gateway).shared_store(store).build().unwrap();
        let model =
            ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx(&tenant), calls)
                .await;
        assert!(toolbox.shutdown().await.is_clean());
        std::fs::write(dir.join("answers"), model.answers.join("\n")).unwrap();
    });
}
