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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
use toolkey::store::{ManualClock, MemoryStore, Store};
use toolkey::{
    tool, ErrorCode, RetryLimit, State, Tool, ToolContext, ToolError, ToolOutput, Toolbox,
    ToolboxBuilder,
};
use toolkey_tests::{child, servers};

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

// ---------------------------------------------------------------------------------------------
// A keyed call: counted in the store.

#[tokio::test]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_memory() {
    storm(MemoryStore::new()).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    storm(toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_postgres() {
    if let Some(store) = server_store("postgres").await {
        storm(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_redis() {
    if let Some(store) = server_store("redis").await {
        storm(store).await;
    }
}

#[tokio::test]
async fn a_model_that_heeds_retryable_stops_at_the_limit() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let mut calls = 0;
    let last = loop {
        calls += 1;
        match toolbox.call("charge", charge_args("o-1"), &ctx).await {
            Err(err) if err.is_retryable() && calls < 50 => continue,
            other => break other,
        }
    };
    assert_eq!(calls, 5);
    assert!(last.unwrap_err().is(ErrorCode::RetryLimit));
    assert_eq!(gateway.attempts("charge:o-1"), 5);
}

#[tokio::test]
async fn a_success_clears_the_count_and_a_later_storm_gets_a_fresh_allowance() {
    let clock = Arc::new(ManualClock::new());
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    // Four failures, one short of the limit; then the gateway is back and the charge succeeds.
    let before = ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 4).await;
    assert_eq!(before.count("GATEWAY_BUSY"), 4);
    gateway.set_up(true);
    assert!(
        !toolbox
            .call("charge", args.clone(), &ctx)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Its record expires after a minute (`retain = "1m"`), well inside the first failure's
    // ten-minute window: had the success not cleared the four failures, one more would stop it.
    clock.advance(Duration::from_secs(120));
    gateway.set_up(false);
    let after = ScriptedModel::repeat(&toolbox, "charge", args, &ctx, 20).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10, "{:?}", after.answers);
    assert_eq!(after.first("RETRY_LIMIT"), Some(4), "{:?}", after.answers);
}

#[tokio::test]
async fn when_the_window_ends_the_call_runs_again() {
    let clock = Arc::new(ManualClock::new());
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Nine minutes on, the window (from the first failure) still holds.
    clock.advance(Duration::from_secs(9 * 60));
    let err = toolbox
        .call("charge", args.clone(), &ctx)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::RetryLimit), "{err:?}");
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Past ten minutes the count starts again: five more attempts, then the limit again.
    clock.advance(Duration::from_secs(61));
    let again = ScriptedModel::repeat(&toolbox, "charge", args, &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10, "{:?}", again.answers);
    assert_eq!(again.first("RETRY_LIMIT"), Some(4), "{:?}", again.answers);
}

#[tokio::test]
async fn an_operator_clears_the_count_and_the_call_runs_again() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // The gateway is back: the operator finds the call's record key from its arguments and
    // clears its count, without waiting for the window.
    gateway.set_up(true);
    let key = toolbox.record_key("charge", args.clone(), &ctx).unwrap();
    toolbox.store().clear_failures(&key).await.unwrap();
    let out = toolbox.call("charge", args, &ctx).await.unwrap();
    assert_eq!(out.value, json!("ch-o-1-4200"));
    assert_eq!(gateway.attempts("charge:o-1"), 6);
}

#[tokio::test]
async fn each_tenant_has_its_own_count() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("acme"), 10).await;
    let other =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("globex"), 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10);
    assert_eq!(other.first("RETRY_LIMIT"), Some(4), "{:?}", other.answers);
}

#[tokio::test]
async fn the_toolbox_default_is_ten_in_ten_minutes_and_can_be_changed_or_turned_off() {
    let run = |builder: ToolboxBuilder, gateway: Arc<Gateway>| async move {
        let toolbox = builder.build().unwrap();
        ScriptedModel::repeat(
            &toolbox,
            "lookup",
            json!({"customer": "acme"}),
            &ctx("shop"),
            50,
        )
        .await;
        gateway.attempts("lookup:acme")
    };
    let gateway = Gateway::down();
    assert_eq!(run(builder(&gateway), gateway.clone()).await, 10);
    let gateway = Gateway::down();
    let b = builder(&gateway).default_retry_limit(RetryLimit::after(3, Duration::from_secs(60)));
    assert_eq!(run(b, gateway.clone()).await, 3);
    let gateway = Gateway::down();
    let b = builder(&gateway).default_retry_limit(RetryLimit::off());
    assert_eq!(run(b, gateway.clone()).await, 50);
    // A tool's own limit wins over the toolbox's; an override by name wins over both.
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .default_retry_limit(RetryLimit::off())
        .retry_limit("lookup", RetryLimit::after(2, Duration::from_secs(60)))
        .build()
        .unwrap();
    assert_eq!(
        toolbox.definition("charge").unwrap().settings().retry_limit,
        RetryLimit::after(5, Duration::from_secs(600))
    );
    assert_eq!(
        toolbox.definition("lookup").unwrap().settings().retry_limit,
        RetryLimit::after(2, Duration::from_secs(60))
    );
    ScriptedModel::repeat(
        &toolbox,
        "lookup",
        json!({"customer": "acme"}),
        &ctx("shop"),
        50,
    )
    .await;
    ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("shop"), 50).await;
    assert_eq!(gateway.attempts("lookup:acme"), 2);
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // A name that is no tool is refused at build.
    let err = builder(&gateway)
        .retry_limit("lookpu", RetryLimit::off())
        .build()
        .err()
        .unwrap();
    assert_eq!(err, toolkey::BuildError::UnknownTool("lookpu".into()));
}

#[tokio::test]
async fn an_unreachable_store_is_not_counted_and_a_lost_count_is_not_a_refusal() {
    let gateway = Gateway::down();
    // Twenty reserves fail before the store applies them, then one count is lost.
    let mut faults: Vec<(Op, Fault)> = (0..20).map(|_| (Op::Reserve, Fault::FailBefore)).collect();
    faults.push((Op::CountFailure, Fault::FailBefore));
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), Plan::script(faults)));
    let toolbox = builder(&gateway)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let model =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("shop"), 50).await;
    assert_eq!(model.count("STORE_UNAVAILABLE"), 20, "{:?}", model.answers);
    // Nothing ran in those twenty; of the six failures that did, the store took five counts.
    assert_eq!(gateway.attempts("charge:o-1"), 6, "{:?}", model.answers);
    assert_eq!(model.first("RETRY_LIMIT"), Some(25), "{:?}", model.answers);
    assert_eq!(store.injected().failed_before, 21);
}

/// A first run reads the key's count with its reservation: when the store cannot answer,
/// nothing ran, and the key is free for the retry.
#[tokio::test]
async fn a_reservation_that_cannot_be_read_fails_closed_and_frees_the_key() {
    let gateway = Gateway::down();
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        Plan::script([(Op::Reserve, Fault::LoseReply)]),
    ));
    let toolbox = builder(&gateway)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let err = toolbox
        .call("charge", charge_args("o-1"), &ctx)
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::StoreUnavailable) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(gateway.attempts("charge:o-1"), 0);
    gateway.set_up(true);
    let out = toolbox
        .call("charge", charge_args("o-1"), &ctx)
        .await
        .unwrap();
    assert!(!out.replayed);
    assert_eq!(gateway.attempts("charge:o-1"), 1);
    assert_eq!(
        store.calls(Op::Failures),
        0,
        "a first run reads no count apart"
    );
}

/// Settle an order through the gateway; a worker that died mid-call is looked up first.
#[tool(
    idempotent(key = "settle:<order>", recover = find_settlement),
    retry_limit = "5/10m",
    lease = "30s"
)]
async fn settle(gateway: State<Gateway>, order: String) -> Result<String, ToolError> {
    gateway.attempt(format!("settle:{order}"))?;
    Ok(format!("st-{order}"))
}

/// Looks the settlement up: never found (the dead worker never reached the gateway).
async fn find_settlement(
    gateway: State<Gateway>,
    order: String,
) -> Result<Option<String>, ToolError> {
    gateway.attempt(format!("lookup:{order}"))?;
    Ok(None)
}

/// Before a stale reservation is taken over, the key's count is read apart: when the store
/// cannot answer, the record is left as it was (nothing looked up, nothing run), and the retry
/// takes it over, looks, and runs once.
#[tokio::test]
async fn a_count_that_cannot_be_read_before_a_take_over_leaves_the_record() {
    let gateway = Gateway::down();
    gateway.set_up(true);
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(FaultyStore::new(
        MemoryStore::with_clock(clock.clone()),
        Plan::script([(Op::Failures, Fault::FailBefore)]),
    ));
    let toolbox = builder(&gateway)
        .tool(Settle)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = json!({"order": "o-7"});
    // A worker reserved the key and died.
    let rkey = toolbox.record_key("settle", args.clone(), &ctx).unwrap();
    let call = Settle.prepare(&args, &ctx).unwrap();
    let dead = toolkey::store::Token::generate();
    let reserved = store
        .reserve(
            &rkey,
            "settle",
            call.fingerprint().unwrap(),
            &dead,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(
        reserved,
        toolkey::store::Reservation::Reserved { .. }
    ));
    clock.advance(Duration::from_secs(31));

    let err = toolbox
        .call("settle", args.clone(), &ctx)
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::StoreUnavailable) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(gateway.attempts("lookup:o-7"), 0);
    assert_eq!(gateway.attempts("settle:o-7"), 0);
    assert!(
        matches!(store.get(&rkey).await.unwrap(), Some(toolkey::store::Record::Stale { token, .. }) if token == dead),
        "the stale record stays under the dead worker's token"
    );

    let out = toolbox.call("settle", args.clone(), &ctx).await.unwrap();
    assert_eq!(out.value, json!("st-o-7"));
    assert!(!out.replayed);
    let again = toolbox.call("settle", args, &ctx).await.unwrap();
    assert!(again.replayed);
    assert_eq!(gateway.attempts("lookup:o-7"), 1);
    assert_eq!(gateway.attempts("settle:o-7"), 1);
}

// ---------------------------------------------------------------------------------------------
// Calls without a key: counted in memory, by their arguments.

#[tokio::test]
async fn a_read_only_call_is_counted_by_its_arguments() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    // The same destination, its free-text note reworded every time: one call.
    let mut answers = Vec::new();
    for i in 0..50 {
        let args = json!({"destination": "Lyon", "note": format!("attempt {i}")});
        answers.push(code(&toolbox.call("quote", args, &ctx).await));
    }
    assert_eq!(gateway.attempts("quote:Lyon"), 5, "{answers:?}");
    assert_eq!(answers.iter().position(|a| a == "RETRY_LIMIT"), Some(4));
    // Another destination is another call; so is the same one in another tenant.
    let other = json!({"destination": "Lille", "note": ""});
    assert_eq!(
        code(&toolbox.call("quote", other, &ctx).await),
        "GATEWAY_BUSY"
    );
    let lyon = json!({"destination": "Lyon", "note": ""});
    assert_eq!(
        code(
            &toolbox
                .call("quote", lyon.clone(), &self::ctx("globex"))
                .await
        ),
        "GATEWAY_BUSY"
    );
    assert_eq!(gateway.attempts("quote:Lille"), 1);
    assert_eq!(gateway.attempts("quote:Lyon"), 6);
    // A success clears the count: once the gateway is back, Lille's one failure is forgotten.
    gateway.set_up(true);
    let lille = json!({"destination": "Lille", "note": ""});
    assert!(toolbox.call("quote", lille.clone(), &ctx).await.is_ok());
    gateway.set_up(false);
    let again = ScriptedModel::repeat(&toolbox, "quote", lille, &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lille"), 7, "{:?}", again.answers);
    assert_eq!(again.first("RETRY_LIMIT"), Some(4), "{:?}", again.answers);
}

#[tokio::test(start_paused = true)]
async fn a_read_only_calls_window_ends_in_process_time() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let args = json!({"destination": "Lyon", "note": ""});
    ScriptedModel::repeat(&toolbox, "quote", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 5);
    tokio::time::advance(Duration::from_secs(9 * 60)).await;
    ScriptedModel::repeat(&toolbox, "quote", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let again = ScriptedModel::repeat(&toolbox, "quote", args, &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 10, "{:?}", again.answers);
}

#[tokio::test]
async fn retryable_timeouts_count_once_per_call() {
    // The gateway answers (up) after 2 s; the caller waits 50 ms: three timeouts, then the limit.
    let gateway = Gateway::down();
    gateway.set_up(true);
    let toolbox = builder(&gateway).build().unwrap();
    let model = ScriptedModel::repeat(
        &toolbox,
        "job_status",
        json!({"job": "j-1"}),
        &ctx("shop"),
        20,
    )
    .await;
    assert_eq!(model.count("TIMEOUT"), 2, "{:?}", model.answers);
    assert_eq!(model.first("RETRY_LIMIT"), Some(2), "{:?}", model.answers);
    assert_eq!(gateway.attempts("job:j-1"), 3);
    let stats = toolbox.stats();
    assert_eq!((stats.timeouts, stats.retry_limited), (3, 18));
}

// ---------------------------------------------------------------------------------------------
// Two processes share one count.

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

/// This process fails the charge three times; a second process then repeats it fifty times and
/// gets two attempts before `RETRY_LIMIT`; back here, the next call is refused without one.
async fn two_processes_share_the_count(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(store) = open_store(kind, dir.path()).await else {
        return;
    };
    let tenant = tenant();
    let gateway = Gateway::with_ledger(dir.path());
    let toolbox = builder(&gateway).shared_store(store).build().unwrap();
    let here =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx(&tenant), 3).await;
    assert_eq!(here.count("GATEWAY_BUSY"), 3);

    let mut child = child::spawn_self(&[
        ("TOOLKEY_CHILD", kind.as_ref()),
        ("TOOLKEY_CHILD_DIR", dir.path().as_os_str()),
        ("TOOLKEY_CHILD_TENANT", tenant.as_ref()),
        ("TOOLKEY_CHILD_CALLS", "50".as_ref()),
    ]);
    let status = child::finish(
        &mut child,
        Duration::from_secs(60),
        "the child's fifty calls",
    );
    assert!(status.success());
    let answers = std::fs::read_to_string(dir.path().join("answers")).unwrap();
    let answers: Vec<&str> = answers.lines().collect();
    assert_eq!(answers.len(), 50);
    assert_eq!(
        &answers[..2],
        ["GATEWAY_BUSY", "RETRY_LIMIT"],
        "{answers:?}"
    );
    assert!(
        answers[1..].iter().all(|a| *a == "RETRY_LIMIT"),
        "{answers:?}"
    );

    let err = toolbox
        .call("charge", charge_args("o-1"), &ctx(&tenant))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::RetryLimit), "{err:?}");
    assert_eq!(gateway.attempts("charge:o-1"), 3, "this process's attempts");
    assert_eq!(
        gateway.ledger_attempts("charge:o-1"),
        5,
        "both processes' attempts"
    );
}

#[cfg(all(feature = "sqlite", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_sqlite() {
    two_processes_share_the_count("sqlite").await;
}

#[cfg(all(feature = "postgres", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_postgres() {
    two_processes_share_the_count("postgres").await;
}

#[cfg(all(feature = "redis", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_redis() {
    two_processes_share_the_count("redis").await;
}

// ---------------------------------------------------------------------------------------------
// Concurrency limits.

fn market_toolbox(market: &Arc<Market>) -> Toolbox {
    Toolbox::builder()
        .shared_state(market.clone())
        .tool(Rate)
        .tool(Place)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_limit_of_two_five_calls_run_at_most_two_at_once() {
    let market = Arc::new(Market::default());
    let toolbox = market_toolbox(&market);
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let toolbox = toolbox.clone();
            tokio::spawn(async move {
                toolbox
                    .call("rate", json!({"pair": format!("EUR/{i}")}), &ctx("shop"))
                    .await
            })
        })
        .collect();
    market.wait_running(2).await;
    // The other three wait for a slot: none of them reaches the market meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(market.running.load(Ordering::SeqCst), 2);
    assert_eq!(market.total(), 2);
    market.gate.add_permits(5);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(market.peak.load(Ordering::SeqCst), 2);
    assert_eq!(market.total(), 5);
    assert_eq!(toolbox.stats().busy, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_that_gets_no_slot_in_time_is_busy_and_never_runs() {
    let market = Arc::new(Market::default());
    let toolbox = market_toolbox(&market);
    let ctx = ctx("shop");
    // The first order holds the one slot; its caller stops waiting after 100 ms (TIMEOUT: its
    // body runs on), while the second waited those 100 ms for a slot and did not run.
    let first = tokio::spawn({
        let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
        async move { toolbox.call("place", json!({"order": "o-1"}), &ctx).await }
    });
    market.wait_running(1).await;
    let err = toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Busy) && err.is_retryable(), "{err:?}");
    assert!(err.message().contains("1 of its calls"), "{err:?}");
    let first = first.await.unwrap().unwrap_err();
    assert!(first.is(ErrorCode::Timeout), "{first:?}");
    assert_eq!((market.made("place:o-1"), market.made("place:o-2")), (1, 0));
    // Nothing of the busy call was kept: its key is free.
    let status = toolbox
        .call("place_status", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found");
    // Once the first order ends, the second runs on its retry, once.
    market.gate.add_permits(2);
    for _ in 0..100 {
        if market.running.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let placed = toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(placed.value, json!("placed-o-2"));
    assert!(
        toolbox
            .call("place", json!({"order": "o-1"}), &ctx)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!((market.made("place:o-1"), market.made("place:o-2")), (1, 1));
    let stats = toolbox.stats();
    assert_eq!((stats.busy, stats.executed), (1, 2));
    assert!(toolbox.shutdown().await.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_answers_are_not_retry_failures() {
    let market = Arc::new(Market::default());
    let toolbox = Toolbox::builder()
        .shared_state(market.clone())
        .tool(Place)
        .retry_limit("place", RetryLimit::after(1, Duration::from_secs(600)))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let holder = tokio::spawn({
        let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
        async move { toolbox.call("place", json!({"order": "o-1"}), &ctx).await }
    });
    market.wait_running(1).await;
    // With a limit of one failure, any counted BUSY would make the next answer RETRY_LIMIT.
    for _ in 0..3 {
        let err = toolbox
            .call("place", json!({"order": "o-2"}), &ctx)
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Busy), "{err:?}");
    }
    market.gate.add_permits(2);
    holder.await.unwrap().unwrap_err();
    while market.running.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(market.made("place:o-2"), 1);
    assert_eq!(toolbox.stats().busy, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrency_override_names_a_tool_and_is_per_toolbox() {
    let market = Arc::new(Market::default());
    let toolbox = Toolbox::builder()
        .shared_state(market.clone())
        .tool(Rate)
        .concurrency("rate", None)
        .build()
        .unwrap();
    assert_eq!(
        toolbox.definition("rate").unwrap().settings().concurrency,
        None
    );
    // Without its limit, three calls run at once.
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let toolbox = toolbox.clone();
            tokio::spawn(async move {
                toolbox
                    .call("rate", json!({"pair": format!("EUR/{i}")}), &ctx("shop"))
                    .await
            })
        })
        .collect();
    market.wait_running(3).await;
    market.gate.add_permits(3);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let err = Toolbox::builder()
        .shared_state(market)
        .tool(Rate)
        .concurrency("rates", std::num::NonZeroUsize::new(1))
        .build()
        .err()
        .unwrap();
    assert_eq!(err, toolkey::BuildError::UnknownTool("rates".into()));
}

// ---------------------------------------------------------------------------------------------
// A retry limit reached while the outcome is unknown.

/// A refund provider whose reply is lost after the refund is made, and whose lookup can be down.
#[derive(Default)]
struct Provider {
    refunds: AtomicUsize,
    lookup_down: AtomicBool,
}

/// Refund an order. The provider's reply is lost after the refund is made.
#[tool(
    idempotent(key = "refund:<order>", recover = find_refund),
    retry_limit = "2/10m"
)]
async fn refund(provider: State<Provider>, order: String) -> Result<String, ToolError> {
    let _ = order;
    provider.refunds.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown("the provider's reply was lost"))
}

/// Looks the refund up by order before acting again.
async fn find_refund(
    provider: State<Provider>,
    order: String,
) -> Result<Option<String>, ToolError> {
    if provider.lookup_down.load(Ordering::SeqCst) {
        let down = ToolError::new("LOOKUP_DOWN", "the provider's lookup is down");
        return Err(down.with_retryable(true));
    }
    Ok((provider.refunds.load(Ordering::SeqCst) > 0).then(|| format!("re-{order}")))
}

/// A refund made once, whose reply was lost, then a retry whose lookup could not look: the
/// retry limit is reached with the outcome unknown. The answer stops the model and says the
/// refund may have been made; it once said only that the call "keeps failing", which a user
/// would take as "refund by hand". The call after it, refused before looking, says the same.
#[tokio::test]
async fn a_retry_limit_reached_while_the_outcome_is_unknown_says_the_action_may_have_happened() {
    let provider = Arc::new(Provider::default());
    let toolbox = Toolbox::builder()
        .shared_state(provider.clone())
        .tool(Refund)
        .build()
        .unwrap();
    let args = json!({"order": "o-1"});
    let first = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    let first = first.unwrap_err();
    assert!(
        first.is(ErrorCode::OutcomeUnknown) && first.is_retryable(),
        "{first:?}"
    );
    provider.lookup_down.store(true, Ordering::SeqCst);
    let second = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    let third = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    assert_eq!(provider.refunds.load(Ordering::SeqCst), 1);
    for answer in [second, third] {
        let err = answer.unwrap_err();
        assert!(
            err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
            "{err:?}"
        );
        assert!(
            err.message().contains("whether `refund` acted is unknown"),
            "{err:?}"
        );
        let suggestion = err.suggestion().unwrap();
        assert!(!suggestion.contains("keeps failing"), "{suggestion}");
        assert!(suggestion.contains("it may have been done"), "{suggestion}");
        assert!(suggestion.contains("`refund_status`"), "{suggestion}");
    }
    let status = toolbox.call("refund_status", args, &ctx("acme")).await;
    assert_eq!(status.unwrap().value["status"], "unknown");
}

// ---------------------------------------------------------------------------------------------
// What makes two calls one: the arguments as the tool receives them, not the JSON as sent.

/// Convert an amount at the market's rate. The market is down.
#[tool(read_only, retry_limit = "3/10m")]
async fn convert(
    gateway: State<Gateway>,
    /// The currency pair, for example "EURUSD".
    pair: String,
    /// The amount to convert.
    amount: f64,
    /// Skip the cached rate.
    #[serde(default)]
    fresh: bool,
    /// The oldest rate accepted, in seconds.
    max_age: Option<u32>,
    /// Why the model asks: free text it may reword.
    #[arg(ignore)]
    #[serde(default)]
    reason: String,
) -> Result<String, ToolError> {
    let _ = (amount, fresh, max_age, reason);
    gateway.attempt(format!("convert:{pair}"))?;
    Ok(format!("{pair}=1.08"))
}

/// A model that keeps asking the same conversion, spelling it another way each time: a default
/// spelled out, `5` as `5.0`, fields in another order, its free-text reason reworded, `null` for
/// an absent `Option`. All one call, as the tool receives it: three attempts under a limit of
/// three, then `RETRY_LIMIT` for every spelling. Counted by the JSON as sent, each spelling had
/// an allowance of its own.
#[tokio::test]
async fn a_call_without_a_key_is_counted_by_what_the_tool_receives() {
    let gateway = Gateway::down();
    let toolbox = Toolbox::builder()
        .shared_state(gateway.clone())
        .tool(Convert)
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let spellings = [
        json!({"pair": "EURUSD", "amount": 5}),
        json!({"pair": "EURUSD", "amount": 5, "fresh": false}),
        json!({"amount": 5.0, "pair": "EURUSD"}),
        json!({"pair": "EURUSD", "amount": 5, "reason": "the user asked"}),
        json!({"pair": "EURUSD", "amount": 5, "max_age": null}),
        json!({"reason": "asking again", "max_age": null, "fresh": false, "amount": 5.0, "pair": "EURUSD"}),
    ];
    let mut answers = Vec::new();
    for round in 0..3 {
        for args in &spellings {
            let answer = toolbox.call("convert", args.clone(), &ctx).await;
            answers.push((round, code(&answer)));
        }
    }
    assert_eq!(gateway.attempts("convert:EURUSD"), 3, "{answers:?}");
    let codes: Vec<&str> = answers.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(codes[..2], ["GATEWAY_BUSY", "GATEWAY_BUSY"], "{codes:?}");
    assert!(codes[2..].iter().all(|c| *c == "RETRY_LIMIT"), "{codes:?}");
    // What the tool receives differently is another call: it still runs.
    for other in [
        json!({"pair": "EURUSD", "amount": 5, "fresh": true}),
        json!({"pair": "EURUSD", "amount": 6}),
        json!({"pair": "EURUSD", "amount": 5, "max_age": 60}),
    ] {
        let answer = toolbox.call("convert", other.clone(), &ctx).await;
        assert_eq!(code(&answer), "GATEWAY_BUSY", "{other}");
    }
    assert_eq!(gateway.attempts("convert:EURUSD"), 6);
    // A success under one spelling clears the count of every spelling.
    gateway.set_up(true);
    let fresh = json!({"pair": "EURUSD", "amount": 5, "fresh": true});
    assert_eq!(
        code(&toolbox.call("convert", fresh.clone(), &ctx).await),
        "ok"
    );
    gateway.set_up(false);
    let respelled = json!({"fresh": true, "pair": "EURUSD", "amount": 5.0, "max_age": null});
    let again = ScriptedModel::repeat(&toolbox, "convert", respelled, &ctx, 5).await;
    assert_eq!(again.first("RETRY_LIMIT"), Some(2), "{:?}", again.answers);
    assert_eq!(gateway.attempts("convert:EURUSD"), 10);
}

// ---------------------------------------------------------------------------------------------
// A key on the call's place in the run: counted by what the model's retry repeats.

/// Pay an account out. Keyed on the call's place in the run: each call is an action of its own.
#[tool(
    idempotent(key = "payout:<account>:<ctx.run_id>:<ctx.step>", status = false),
    retry_limit = "3/10m"
)]
async fn payout(
    gateway: State<Gateway>,
    /// The account to pay.
    account: String,
    /// The amount, in cents.
    cents: i64,
    /// Why the model pays: free text it may reword.
    #[arg(ignore)]
    #[serde(default)]
    memo: String,
) -> Result<String, ToolError> {
    let _ = (cents, memo);
    gateway.attempt(format!("payout:{account}"))?;
    Ok(format!("po-{account}"))
}

/// Ten identical failing payouts, each a new tool call at the next step of the run (a looping
/// model), made through two toolboxes over one store, as two processes would: three bodies run,
/// then `RETRY_LIMIT`; another account, another amount or another run is not blocked. Counted by
/// the key, each step had an allowance of its own and all ten ran.
async fn a_looping_model_on_a_per_step_key(store: Arc<dyn Store>) {
    let gateway = Gateway::down();
    let toolbox = |store: &Arc<dyn Store>| {
        Toolbox::builder()
            .shared_state(gateway.clone())
            .shared_store(store.clone())
            .tool(Payout)
            .build()
            .unwrap()
    };
    let (here, there) = (toolbox(&store), toolbox(&store));
    let tenant = tenant();
    let at = |run: &str, step: u64| ToolContext::new(run).with_tenant(&tenant).with_step(step);
    let mut answers = Vec::new();
    for step in 1..=10 {
        let toolbox = if step % 2 == 0 { &here } else { &there };
        // The model rewords its memo and spells the amount another way: the same call.
        let args = json!({"account": "acc-1", "cents": 500, "memo": format!("try {step}")});
        let args = if step % 3 == 0 {
            json!({"memo": "again", "cents": 500.0, "account": "acc-1"})
        } else {
            args
        };
        answers.push(code(
            &toolbox.call("payout", args, &at("run-1", step)).await,
        ));
    }
    assert_eq!(gateway.attempts("payout:acc-1"), 3, "{answers:?}");
    assert_eq!(
        answers[..2],
        ["GATEWAY_BUSY", "GATEWAY_BUSY"],
        "{answers:?}"
    );
    assert!(
        answers[2..].iter().all(|a| a == "RETRY_LIMIT"),
        "{answers:?}"
    );
    let refused = here
        .call(
            "payout",
            json!({"account": "acc-1", "cents": 500}),
            &at("run-1", 11),
        )
        .await
        .unwrap_err();
    assert!(!refused.is_retryable(), "{refused:?}");
    assert!(
        refused.message().contains("with these arguments"),
        "{refused:?}"
    );
    assert!(!refused.message().contains("for this key"), "{refused:?}");
    // Another account, another amount, another run: other calls, which run.
    let other = [
        (
            json!({"account": "acc-2", "cents": 500}),
            "run-1",
            "payout:acc-2",
        ),
        (
            json!({"account": "acc-1", "cents": 700}),
            "run-1",
            "payout:acc-1",
        ),
        (
            json!({"account": "acc-1", "cents": 500}),
            "run-2",
            "payout:acc-1",
        ),
    ];
    for (step, (args, run, _)) in (12..).zip(&other) {
        let answer = there.call("payout", args.clone(), &at(run, step)).await;
        assert_eq!(code(&answer), "GATEWAY_BUSY", "{args} in {run}");
    }
    assert_eq!(gateway.attempts("payout:acc-2"), 1);
    assert_eq!(gateway.attempts("payout:acc-1"), 5);
    // A success clears the count: the gateway back, acc-2 is paid; its next failures start at 0.
    gateway.set_up(true);
    let acc2 = json!({"account": "acc-2", "cents": 500});
    assert_eq!(
        code(&here.call("payout", acc2.clone(), &at("run-1", 20)).await),
        "ok"
    );
    gateway.set_up(false);
    let mut again = Vec::new();
    for step in 21..26 {
        again.push(code(
            &there.call("payout", acc2.clone(), &at("run-1", step)).await,
        ));
    }
    assert_eq!(
        again,
        [
            "GATEWAY_BUSY",
            "GATEWAY_BUSY",
            "RETRY_LIMIT",
            "RETRY_LIMIT",
            "RETRY_LIMIT"
        ]
    );
    assert_eq!(gateway.attempts("payout:acc-2"), 5);
    assert!(here.shutdown().await.is_clean());
    assert!(there.shutdown().await.is_clean());
}

#[tokio::test]
async fn a_looping_model_on_a_per_step_key_is_stopped_memory() {
    a_looping_model_on_a_per_step_key(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store("sqlite", dir.path()).await.unwrap();
    a_looping_model_on_a_per_step_key(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_postgres() {
    if let Some(store) = server_store("postgres").await {
        a_looping_model_on_a_per_step_key(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_redis() {
    if let Some(store) = server_store("redis").await {
        a_looping_model_on_a_per_step_key(store).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A retry limit reached after a step acted: the answer says what was done.

/// A shop whose card payments go through and whose carrier is down until told otherwise.
#[derive(Default)]
struct Shop {
    charges: AtomicUsize,
    bookings: AtomicUsize,
    carrier_up: AtomicBool,
    /// The stock check before the charge fails (retryably) while set.
    stock_down: AtomicBool,
}

/// Check an order out: charge the card, then book the shipment.
#[tool(
    idempotent(key = "checkout:<order>", status = "checkout_status"),
    retry_limit = "3/10m"
)]
async fn checkout(
    shop: State<Shop>,
    ctx: &ToolContext,
    /// The order.
    order: String,
    /// The amount, in cents.
    cents: i64,
) -> Result<String, ToolError> {
    if shop.stock_down.load(Ordering::SeqCst) {
        let busy = ToolError::new("STOCK_BUSY", "the stock check does not answer");
        return Err(busy.with_retryable(true));
    }
    let charge = ctx
        .once("charge", async {
            shop.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(format!("ch-{order}-{cents}"))
        })
        .await?;
    ctx.once("ship", async {
        shop.bookings.fetch_add(1, Ordering::SeqCst);
        if !shop.carrier_up.load(Ordering::SeqCst) {
            let busy = ToolError::new("CARRIER_BUSY", "the carrier does not answer");
            return Err(busy.with_retryable(true));
        }
        Ok(format!("sh-{order}"))
    })
    .await?;
    Ok(charge)
}

fn shop_toolbox(shop: &Arc<Shop>, store: &Arc<dyn Store>) -> Toolbox {
    Toolbox::builder()
        .shared_state(shop.clone())
        .shared_store(store.clone())
        .tool(Checkout)
        .build()
        .unwrap()
}

/// Asserts that `err` stops the model and tells it that part of the action was done and must
/// not be done again by other means, never only that the call keeps failing.
fn says_part_was_done(err: &ToolError, steps: &str) {
    assert!(
        err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(
        err.message().contains("part of the action was done"),
        "{err:?}"
    );
    assert!(err.message().contains(steps), "{err:?}");
    assert!(err.message().contains("is kept"), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(!suggestion.contains("keeps failing"), "{suggestion}");
    assert!(
        suggestion.contains("must not redo the action by other means"),
        "{suggestion}"
    );
}

/// The card is charged, then the carrier keeps failing: the third failure reaches the limit.
/// Its answer, every later refusal (made before the body runs, in this process or another
/// sharing the store) and the status companion say that the charge was done and is kept. They
/// once said only "it keeps failing, let the user decide", and a user who then paid by hand
/// paid twice.
async fn a_retry_limit_after_a_step_says_the_step_was_done(store: Arc<dyn Store>) {
    let shop = Arc::new(Shop::default());
    let (here, there) = (shop_toolbox(&shop, &store), shop_toolbox(&shop, &store));
    let ctx = ctx(&tenant());
    let args = json!({"order": "o-1", "cents": 4200});
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(here.call("checkout", args.clone(), &ctx).await);
    }
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 3);
    let codes: Vec<String> = answers.iter().map(code).collect();
    assert_eq!(codes, ["CARRIER_BUSY", "CARRIER_BUSY", "RETRY_LIMIT"]);
    let reached = answers.pop().unwrap().unwrap_err();
    says_part_was_done(&reached, "step `charge`");
    assert!(!reached.message().contains("`ship`"), "{reached:?}");
    // Refused before running, here and in the other process: the store remembers the step.
    for toolbox in [&here, &there] {
        let refused = toolbox
            .call("checkout", args.clone(), &ctx)
            .await
            .unwrap_err();
        says_part_was_done(&refused, "a step of an earlier attempt");
    }
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 3);
    let status = there.call("checkout_status", args.clone(), &ctx).await;
    let status = status.unwrap().value;
    assert_eq!(status["status"], "not_found", "{status}");
    let detail = status["detail"].as_str().unwrap();
    assert!(detail.contains("part of the action was done"), "{detail}");
    // Another order has no step done: its status says nothing was kept.
    let other = json!({"order": "o-2", "cents": 4200});
    let status = there
        .call("checkout_status", other, &ctx)
        .await
        .unwrap()
        .value;
    let detail = status["detail"].as_str().unwrap();
    assert!(!detail.contains("part of the action was done"), "{detail}");
    assert!(here.shutdown().await.is_clean());
    assert!(there.shutdown().await.is_clean());
}

#[tokio::test]
async fn a_retry_limit_after_a_step_says_the_step_was_done_memory() {
    a_retry_limit_after_a_step_says_the_step_was_done(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store("sqlite", dir.path()).await.unwrap();
    a_retry_limit_after_a_step_says_the_step_was_done(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_postgres() {
    if let Some(store) = server_store("postgres").await {
        a_retry_limit_after_a_step_says_the_step_was_done(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_redis() {
    if let Some(store) = server_store("redis").await {
        a_retry_limit_after_a_step_says_the_step_was_done(store).await;
    }
}

/// A route the model describes: read by the tool, never written back.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Route {
    /// Where from.
    from: String,
    /// Where to.
    to: String,
}

/// Price a route. Its argument's type is not `Serialize`: calls are counted by their JSON.
#[tool(read_only, retry_limit = "2/10m")]
async fn price_route(gateway: State<Gateway>, route: Route) -> Result<u64, ToolError> {
    gateway.attempt(format!("route:{}-{}", route.from, route.to))?;
    Ok(1)
}

/// A tool whose arguments cannot be written back still has its limit, by the canonical JSON.
#[tokio::test]
async fn arguments_that_cannot_be_written_back_are_counted_by_their_json() {
    let gateway = Gateway::down();
    let toolbox = Toolbox::builder()
        .shared_state(gateway.clone())
        .tool(PriceRoute)
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let a = json!({"route": {"from": "Lyon", "to": "Lille"}});
    let b = json!({"route": {"to": "Lille", "from": "Lyon"}});
    let mut answers = Vec::new();
    for args in [&a, &b, &a, &b] {
        answers.push(code(&toolbox.call("price_route", args.clone(), &ctx).await));
    }
    assert_eq!(
        answers,
        ["GATEWAY_BUSY", "RETRY_LIMIT", "RETRY_LIMIT", "RETRY_LIMIT"]
    );
    assert_eq!(gateway.attempts("route:Lyon-Lille"), 2);
}

/// The card is charged and the carrier fails; then the stock check before the charge fails
/// twice, and the second of those reaches the limit in an attempt that never reached a step.
/// Its answer still says that part of the action was done: the store noted it with the first
/// failure.
#[tokio::test]
async fn a_retry_limit_reached_before_any_step_still_says_an_earlier_step_was_done() {
    let shop = Arc::new(Shop::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = shop_toolbox(&shop, &store);
    let ctx = ctx("shop");
    let args = json!({"order": "o-1", "cents": 4200});
    let first = toolbox.call("checkout", args.clone(), &ctx).await;
    assert_eq!(code(&first), "CARRIER_BUSY");
    shop.stock_down.store(true, Ordering::SeqCst);
    let second = toolbox.call("checkout", args.clone(), &ctx).await;
    assert_eq!(code(&second), "STOCK_BUSY");
    let reached = toolbox.call("checkout", args, &ctx).await.unwrap_err();
    says_part_was_done(&reached, "a step of an earlier attempt");
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 1);
}

/// A bank whose transfers fail retryably; the first transfer waits at the gate until the test
/// lets it through.
struct Bank {
    attempts: AtomicUsize,
    gate: Semaphore,
}

impl Default for Bank {
    fn default() -> Self {
        Bank {
            attempts: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        }
    }
}

/// Transfer money. Keyed on the call's place in the run.
#[tool(
    idempotent(key = "transfer:<ctx.run_id>:<ctx.step>", status = false),
    retry_limit = "3/10m"
)]
async fn transfer(bank: State<Bank>, to: String) -> Result<String, ToolError> {
    if bank.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
        bank.gate.acquire().await.unwrap().forget();
    }
    let down = ToolError::new("BANK_BUSY", "the bank does not answer");
    Err(down
        .with_retryable(true)
        .with_suggestion(format!("try {to} again")))
}

/// A call keyed on its place runs beside the model's next calls, which are keys of their own:
/// while the first one's body waits, a second process's calls reach the limit and the next is
/// refused. The first one, started under the limit, then fails: it is answered `RETRY_LIMIT`
/// too, never an invitation to retry, and no body starts after the limit was reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_reached_while_another_process_runs_the_call_stops_it_too() {
    let bank = Arc::new(Bank::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = || {
        Toolbox::builder()
            .shared_state(bank.clone())
            .shared_store(store.clone())
            .tool(Transfer)
            .build()
            .unwrap()
    };
    let (here, there) = (Arc::new(toolbox()), toolbox());
    let at = |step: u64| {
        ToolContext::new("run-1")
            .with_tenant("bank")
            .with_step(step)
    };
    let args = json!({"to": "acc-9"});
    let first = tokio::spawn({
        let (here, args, ctx) = (here.clone(), args.clone(), at(1));
        async move { here.call("transfer", args, &ctx).await }
    });
    while bank.attempts.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let mut answers = Vec::new();
    for step in 2..=5 {
        answers.push(code(&there.call("transfer", args.clone(), &at(step)).await));
    }
    assert_eq!(
        answers,
        ["BANK_BUSY", "BANK_BUSY", "RETRY_LIMIT", "RETRY_LIMIT"]
    );
    bank.gate.add_permits(1);
    let first = first.await.unwrap().unwrap_err();
    assert!(
        first.is(ErrorCode::RetryLimit) && !first.is_retryable(),
        "{first:?}"
    );
    let later = here.call("transfer", args, &at(6)).await;
    assert_eq!(code(&later), "RETRY_LIMIT");
    assert_eq!(bank.attempts.load(Ordering::SeqCst), 4);
}
