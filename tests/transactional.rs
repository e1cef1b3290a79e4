//! Transactional tools: the key's record and the body's business row commit in one transaction
//! of the store's own database, on SQLite and PostgreSQL. Every scenario ends with an exact count
//! of business rows, and no answer is ever `OUTCOME_UNKNOWN`.
//!
//! The PostgreSQL server is `TOOLKEY_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); an unreachable one fails these tests. The process
//! tests run this binary as their child: `child_process_entry` does the child's part when
//! `TOOLKEY_CHILD` is set, and nothing otherwise.
#![cfg(all(feature = "sqlite", feature = "postgres", unix))]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolkey::store::{Database, PostgresStore, RecordKey, Reservations, SqliteStore};
use toolkey::{
    tool, BuildError, ErrorCode, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, Toolbox,
    TxBody,
};
use toolkey_tests::{child, servers};

/// Records an order; its calls run in a transaction, with the order row written by `Orders`.
#[tool(idempotent(
    key = "order:<order>",
    on_in_progress = "wait(10s)",
    status = "create_order_status"
))]
async fn create_order(order: String, cents: i64) -> Result<Value, ToolError> {
    let _ = (order, cents);
    Err(ToolError::new(
        "INTERNAL",
        "create_order runs only as a transactional tool",
    ))
}

/// What the body does after it inserted the order row.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Then {
    /// Answers the row's order and the transaction's isolation level.
    Answer,
    /// Fails with a retryable error.
    Retryable,
    /// Fails with a final error.
    Final,
    /// Panics.
    Panic,
    /// Touches the marker and hangs (a worker to be killed before its commit).
    Hang,
    /// Sleeps a while, then answers (a caller that stops waiting first).
    Slow,
}

/// The transactional `create_order`: `Orders` says where the rows go and what the body does.
struct Orders {
    database: Database,
    /// The business table's name.
    table: String,
    then: Mutex<Then>,
    /// Bodies started.
    runs: AtomicUsize,
    marker: Option<PathBuf>,
}

impl Orders {
    fn new(database: Database, table: &str) -> Arc<Orders> {
        Arc::new(Orders {
            database,
            table: table.into(),
            then: Mutex::new(Then::Answer),
            runs: AtomicUsize::new(0),
            marker: None,
        })
    }

    fn then(&self, then: Then) {
        *self.then.lock().unwrap() = then;
    }

    /// What the body answers after its insert, or how it fails.
    fn after_insert(&self, order: &str, isolation: &str) -> Result<Value, ToolError> {
        let then = *self.then.lock().unwrap();
        match then {
            Then::Answer | Then::Slow => Ok(json!({"order": order, "isolation": isolation})),
            Then::Retryable => {
                Err(ToolError::new("LEDGER_BUSY", "the ledger is busy").with_retryable(true))
            }
            Then::Final => Err(ToolError::new("CARD_DECLINED", "the card was declined")),
            Then::Panic => panic!("the body broke"),
            Then::Hang => {
                std::fs::write(self.marker.as_ref().unwrap(), b"in the body").unwrap();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }
}

/// The tool the toolbox holds.
struct Tx(Arc<Orders>);

impl Tool for Tx {
    fn definition(&self) -> ToolDefinition {
        CreateOrder.definition().with_transaction(self.0.database)
    }

    fn prepare(
        &self,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<toolkey::__private::Call, ToolError> {
        let call = CreateOrder.prepare(args, ctx)?;
        let order = args["order"].as_str().unwrap_or_default().to_owned();
        let cents = args["cents"].as_i64().unwrap_or_default();
        let orders = self.0.clone();
        let body = match orders.database {
            Database::Sqlite => TxBody::sqlite(move |_, tx| {
                orders.runs.fetch_add(1, Ordering::SeqCst);
                let insert = format!(
                    "INSERT INTO {} (order_id, cents) VALUES (?1, ?2)",
                    orders.table
                );
                tx.execute(&insert, rusqlite::params![order, cents])
                    .map_err(|e| ToolError::new("LEDGER", e.to_string()).with_retryable(true))?;
                orders.after_insert(&order, "serializable")
            }),
            Database::Postgres => TxBody::postgres(move |_, tx| {
                Box::pin(async move {
                    orders.runs.fetch_add(1, Ordering::SeqCst);
                    let insert = format!(
                        "INSERT INTO {} (order_id, cents) VALUES ($1, $2)",
                        orders.table
                    );
                    let ledger = |e: tokio_postgres::Error| {
                        ToolError::new("LEDGER", e.to_string()).with_retryable(true)
                    };
                    tx.execute(&insert, &[&order, &cents])
                        .await
                        .map_err(ledger)?;
                    let isolation: String = tx
                        .query_one("SHOW transaction_isolation", &[])
                        .await
                        .map_err(ledger)?
                        .get(0);
                    if *orders.then.lock().unwrap() == Then::Slow {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    orders.after_insert(&order, &isolation)
                })
            }),
        };
        Ok(call.with_transaction(body))
    }

    fn status_companion(&self) -> Option<toolkey::__private::StatusCompanion> {
        CreateOrder.status_companion()
    }
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1")
}

fn args(order: &str, cents: i64) -> Value {
    json!({"order": order, "cents": cents})
}

fn is_unknown(answer: &Result<ToolOutput, ToolError>) -> bool {
    matches!(answer, Err(err) if err.is(ErrorCode::OutcomeUnknown))
}

// ---------------------------------------------------------------------------------------------
// SQLite: the store's file holds the records and the orders.

/// A store in a new file beside an `orders` table; the rows counted by their own connection.
fn sqlite(dir: &Path) -> (SqliteStore, rusqlite::Connection) {
    let path = dir.join("app.db");
    let store = SqliteStore::open(&path).unwrap();
    let rows = rusqlite::Connection::open(&path).unwrap();
    rows.busy_timeout(Duration::from_secs(10)).unwrap();
    rows.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (order_id TEXT NOT NULL, cents INTEGER NOT NULL)",
    )
    .unwrap();
    (store, rows)
}

fn sqlite_rows(rows: &rusqlite::Connection, order: &str) -> i64 {
    rows.query_row(
        "SELECT count(*) FROM orders WHERE order_id = ?1",
        [order],
        |row| row.get(0),
    )
    .unwrap()
}

fn sqlite_toolbox(store: SqliteStore, orders: &Arc<Orders>) -> Toolbox {
    Toolbox::builder()
        .store(store)
        .tool(Tx(orders.clone()))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_first_run_then_replay_then_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rows) = sqlite(dir.path());
    let orders = Orders::new(Database::Sqlite, "orders");
    let toolbox = sqlite_toolbox(store, &orders);

    let first = toolbox
        .call("create_order", args("o-1", 500), &ctx())
        .await
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(first.value["order"], "o-1");
    let again = toolbox
        .call("create_order", args("o-1", 500), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);
    let other = toolbox
        .call("create_order", args("o-1", 900), &ctx())
        .await
        .unwrap_err();
    assert!(other.is(ErrorCode::Conflict), "{other:?}");

    assert_eq!(sqlite_rows(&rows, "o-1"), 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_errors_and_panics_leave_nothing_and_a_final_error_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rows) = sqlite(dir.path());
    let orders = Orders::new(Database::Sqlite, "orders");
    let toolbox = sqlite_toolbox(store, &orders);
    let rkey = RecordKey::new("", "order:o-2");

    for then in [Then::Retryable, Then::Panic] {
        orders.then(then);
        let failed = toolbox.call("create_order", args("o-2", 1), &ctx()).await;
        let err = failed.unwrap_err();
        assert!(
            err.is_retryable() && !err.is(ErrorCode::OutcomeUnknown),
            "{then:?}: {err:?}"
        );
        assert_eq!(sqlite_rows(&rows, "o-2"), 0, "{then:?}");
        assert_eq!(toolbox.store().get(&rkey).await.unwrap(), None, "{then:?}");
    }
    // The retry runs once, cleanly.
    orders.then(Then::Answer);
    let retry = toolbox
        .call("create_order", args("o-2", 1), &ctx())
        .await
        .unwrap();
    assert!(!retry.replayed);
    assert_eq!(sqlite_rows(&rows, "o-2"), 1);

    // A final error is recorded without the body's row, and replayed.
    orders.then(Then::Final);
    let declined = toolbox
        .call("create_order", args("o-3", 1), &ctx())
        .await
        .unwrap_err();
    assert_eq!(declined.code(), "CARD_DECLINED");
    let replayed = toolbox
        .call("create_order", args("o-3", 1), &ctx())
        .await
        .unwrap_err();
    assert_eq!(replayed, declined);
    assert_eq!(sqlite_rows(&rows, "o-3"), 0);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sixty_four_concurrent_duplicates_write_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rows) = sqlite(dir.path());
    let orders = Orders::new(Database::Sqlite, "orders");
    let toolbox = sqlite_toolbox(store, &orders);
    let calls = (0..64).map(|_| {
        let toolbox = toolbox.clone();
        tokio::spawn(async move { toolbox.call("create_order", args("o-4", 7), &ctx()).await })
    });
    let answers = futures_util::future::join_all(calls).await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    let fresh = answers
        .iter()
        .filter(|a| matches!(a, Ok(out) if !out.replayed))
        .count();
    let replays = answers
        .iter()
        .filter(|a| matches!(a, Ok(out) if out.replayed))
        .count();
    assert_eq!((fresh, replays), (1, 63), "{answers:?}");
    assert_eq!(answers.iter().filter(|a| is_unknown(a)).count(), 0);
    assert_eq!(sqlite_rows(&rows, "o-4"), 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_toolbox_refuses_a_transactional_tool_on_another_database() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rows) = sqlite(dir.path());
    let on_postgres = Orders::new(Database::Postgres, "orders");
    let refused = Toolbox::builder()
        .store(store)
        .tool(Tx(on_postgres.clone()))
        .build();
    let expected = || BuildError::TransactionStore {
        tool: "create_order".into(),
        database: Database::Postgres,
    };
    assert_eq!(refused.err(), Some(expected()));
    // No store given: the toolbox keeps records in memory, which no transaction reaches.
    let refused = Toolbox::builder().tool(Tx(on_postgres)).build();
    assert_eq!(refused.err(), Some(expected()));
    let shared: Arc<dyn toolkey::store::Store> = Arc::new(sqlite(dir.path()).0);
    let refused = Toolbox::builder()
        .shared_store(shared)
        .tool(Tx(Orders::new(Database::Sqlite, "orders")))
        .build();
    assert!(matches!(refused, Err(BuildError::TransactionStore { .. })));
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: a records table and an orders table of the test's own, side by side.

const VAR: &str = "TOOLKEY_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Names of one test's tables.
struct Tables {
    url: String,
    records: String,
    orders: String,
}

impl Tables {
    /// New tables, the orders one created.
    async fn new() -> Tables {
        let url = servers::url(VAR, DEFAULT_URL);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let tables = Tables {
            records: format!("tx_records_{}", &id[..12]),
            orders: format!("tx_orders_{}", &id[..12]),
            url,
        };
        let client = tables.client().await;
        client
            .batch_execute(&format!(
                "CREATE TABLE {} (order_id text NOT NULL, cents int8 NOT NULL)",
                tables.orders
            ))
            .await
            .unwrap();
        tables
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = match tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await {
            Ok(pair) => pair,
            Err(e) => {
                servers::unreachable("PostgreSQL", VAR, &self.url, e);
                unreachable!()
            }
        };
        tokio::spawn(conn);
        client
    }

    async fn store(&self, url: &str) -> PostgresStore {
        PostgresStore::builder(url)
            .table(&self.records)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap()
    }

    async fn rows(&self, order: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {} WHERE order_id = $1", self.orders);
        self.client()
            .await
            .query_one(&sql, &[&order])
            .await
            .unwrap()
            .get(0)
    }
}

fn pg_toolbox(store: PostgresStore, orders: &Arc<Orders>) -> Toolbox {
    Toolbox::builder()
        .store(store)
        .tool(Tx(orders.clone()))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_first_run_in_read_committed_then_replay_then_conflict() {
    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(tables.store(&tables.url).await, &orders);

    let first = toolbox
        .call("create_order", args("o-1", 500), &ctx())
        .await
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(
        first.value,
        json!({"order": "o-1", "isolation": "read committed"})
    );
    let again = toolbox
        .call("create_order", args("o-1", 500), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);
    let other = toolbox
        .call("create_order", args("o-1", 900), &ctx())
        .await
        .unwrap_err();
    assert!(other.is(ErrorCode::Conflict), "{other:?}");
    assert_eq!(tables.rows("o-1").await, 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_errors_and_panics_leave_nothing_and_a_final_error_is_replayed() {
    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(tables.store(&tables.url).await, &orders);
    let rkey = RecordKey::new("", "order:o-2");

    for then in [Then::Retryable, Then::Panic] {
        orders.then(then);
        let err = toolbox
            .call("create_order", args("o-2", 1), &ctx())
            .await
            .unwrap_err();
        assert!(
            err.is_retryable() && !err.is(ErrorCode::OutcomeUnknown),
            "{then:?}: {err:?}"
        );
        assert_eq!(tables.rows("o-2").await, 0, "{then:?}");
        assert_eq!(toolbox.store().get(&rkey).await.unwrap(), None, "{then:?}");
    }
    orders.then(Then::Answer);
    let retry = toolbox
        .call("create_order", args("o-2", 1), &ctx())
        .await
        .unwrap();
    assert!(!retry.replayed);
    assert_eq!(tables.rows("o-2").await, 1);

    orders.then(Then::Final);
    let declined = toolbox
        .call("create_order", args("o-3", 1), &ctx())
        .await
        .unwrap_err();
    assert_eq!(declined.code(), "CARD_DECLINED");
    let replayed = toolbox
        .call("create_order", args("o-3", 1), &ctx())
        .await
        .unwrap_err();
    assert_eq!(replayed, declined);
    assert_eq!(tables.rows("o-3").await, 0);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sixty_four_concurrent_duplicates_write_one_row() {
    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(tables.store(&tables.url).await, &orders);
    let calls = (0..64).map(|_| {
        let toolbox = toolbox.clone();
        tokio::spawn(async move { toolbox.call("create_order", args("o-4", 7), &ctx()).await })
    });
    let answers = futures_util::future::join_all(calls).await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    let fresh = answers
        .iter()
        .filter(|a| matches!(a, Ok(out) if !out.replayed))
        .count();
    let waited = answers
        .iter()
        .filter(|a| {
            matches!(a, Ok(out) if out.replayed)
                || matches!(a, Err(e) if e.is(ErrorCode::InProgress))
        })
        .count();
    assert_eq!((fresh, waited), (1, 63), "{answers:?}");
    assert_eq!(answers.iter().filter(|a| is_unknown(a)).count(), 0);
    assert_eq!(tables.rows("o-4").await, 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_caller_that_stops_waiting_leaves_the_transaction_to_commit() {
    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    orders.then(Then::Slow);
    let toolbox = Toolbox::builder()
        .store(tables.store(&tables.url).await)
        .tool(Tx(orders.clone()))
        .timeout("create_order", Some(Duration::from_millis(50)))
        .build()
        .unwrap();
    let timed_out = toolbox
        .call("create_order", args("o-5", 3), &ctx())
        .await
        .unwrap_err();
    assert!(timed_out.is(ErrorCode::Timeout), "{timed_out:?}");
    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(tables.rows("o-5").await, 1);
    let retry = toolbox
        .call("create_order", args("o-5", 3), &ctx())
        .await
        .unwrap();
    assert!(retry.replayed);
    assert_eq!(tables.rows("o-5").await, 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

/// A TCP proxy to the server that, once armed, cuts the connection that sends `COMMIT`: after
/// handing the `COMMIT` on (`lands`), or before (the server never gets it). The client hears
/// nothing back either way.
struct CommitCutter {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

/// `COMMIT` as tokio-postgres sends it: a simple query message.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

impl CommitCutter {
    async fn start(target: &str, lands: bool) -> CommitCutter {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (armed, cuts) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (armed2, cuts2, target) = (armed.clone(), cuts.clone(), target.to_owned());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let outbound = TcpStream::connect(&target).await.unwrap();
                let (armed, cuts) = (armed2.clone(), cuts2.clone());
                tokio::spawn(async move {
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_server, mut to_server) = outbound.into_split();
                    let back = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        let commit = chunk.windows(COMMIT.len()).any(|w| w == COMMIT);
                        if commit && armed.swap(false, Ordering::SeqCst) {
                            // The client hears nothing more from the server.
                            back.abort();
                            cuts.fetch_add(1, Ordering::SeqCst);
                            if lands {
                                let _ = to_server.write_all(chunk).await;
                                let _ = to_server.flush().await;
                                // Time for the server to read it before the socket closes.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            return;
                        }
                        if to_server.write_all(chunk).await.is_err() {
                            break;
                        }
                    }
                    back.abort();
                });
            }
        });
        CommitCutter { port, armed, cuts }
    }
}

/// The server's address, as the proxy dials it.
fn server_address(url: &str) -> String {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    format!(
        "{host}:{}",
        config.get_ports().first().copied().unwrap_or(5432)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_commit_cut_is_settled_by_the_record_and_the_retry_never_doubles() {
    for lands in [true, false] {
        let tables = Tables::new().await;
        let cutter = CommitCutter::start(&server_address(&tables.url), lands).await;
        let through = format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            cutter.port,
            tables.url.rsplit('/').next().unwrap()
        );
        let orders = Orders::new(Database::Postgres, &tables.orders);
        let toolbox = pg_toolbox(tables.store(&through).await, &orders);
        cutter.armed.store(true, Ordering::SeqCst);

        let first = toolbox.call("create_order", args("o-6", 9), &ctx()).await;
        assert_eq!(
            cutter.cuts.load(Ordering::SeqCst),
            1,
            "lands {lands}: {first:?}"
        );
        assert!(!is_unknown(&first), "lands {lands}: {first:?}");
        match (&first, lands) {
            // Settled by reading the record: this call's own commit, its first run.
            (Ok(out), true) => assert!(!out.replayed),
            // Settled: the commit did not land, nothing was done, a retry runs once.
            (Err(err), false) => assert!(err.is_retryable(), "{err:?}"),
            (other, lands) => panic!("lands {lands}: {other:?}"),
        }
        assert_eq!(
            tables.rows("o-6").await,
            i64::from(lands),
            "lands {lands}: {first:?}"
        );

        let retry = toolbox
            .call("create_order", args("o-6", 9), &ctx())
            .await
            .unwrap();
        // A replay when the first commit landed, a clean first run when it did not.
        assert_eq!(retry.replayed, lands);
        assert_eq!(tables.rows("o-6").await, 1, "lands {lands}");
        assert_eq!(
            orders.runs.load(Ordering::SeqCst),
            if lands { 1 } else { 2 }
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A worker killed (SIGKILL) inside its body, before its commit.

fn spawn_hanging(database: &str, dir: &Path, tables: Option<&Tables>) -> std::process::Child {
    let (records, orders) = tables.map_or(("", ""), |t| (t.records.as_str(), t.orders.as_str()));
    child::spawn_self(&[
        ("TOOLKEY_CHILD", database.as_ref()),
        ("TOOLKEY_CHILD_DIR", dir.as_os_str()),
        ("TOOLKEY_CHILD_RECORDS", records.as_ref()),
        ("TOOLKEY_CHILD_ORDERS", orders.as_ref()),
    ])
}

/// The child's part, when this binary runs as a child process; nothing otherwise.
#[test]
fn child_process_entry() {
    let Ok(database) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("TOOLKEY_CHILD_DIR").unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (toolbox, orders) = match database.as_str() {
            "sqlite" => {
                let orders = hanging(Database::Sqlite, "orders", dir.join("marker"));
                (sqlite_toolbox(sqlite(&dir).0, &orders), orders)
            }
            _ => {
                let tables = Tables {
                    url: servers::url(VAR, DEFAULT_URL),
                    records: std::env::var("TOOLKEY_CHILD_RECORDS").unwrap(),
                    orders: std::env::var("TOOLKEY_CHILD_ORDERS").unwrap(),
                };
                let orders = hanging(Database::Postgres, &tables.orders, dir.join("marker"));
                (pg_toolbox(tables.store(&tables.url).await, &orders), orders)
            }
        };
        // The body hangs once its row is written; the test kills this process there.
        let _ = (
            orders,
            toolbox.call("create_order", args("o-7", 11), &ctx()).await,
        );
    });
}

/// `Orders` whose body hangs after its insert, touching `marker` first.
fn hanging(database: Database, table: &str, marker: PathBuf) -> Arc<Orders> {
    Arc::new(Orders {
        database,
        table: table.into(),
        then: Mutex::new(Then::Hang),
        runs: AtomicUsize::new(0),
        marker: Some(marker),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_, rows) = sqlite(dir.path());
    let mut worker = spawn_hanging("sqlite", dir.path(), None);
    child::wait_for(
        &dir.path().join("marker"),
        "the worker never reached its body",
    );
    worker.kill().unwrap(); // SIGKILL: no destructor, no rollback of its own
    worker.wait().unwrap();
    assert_eq!(sqlite_rows(&rows, "o-7"), 0);

    let (store, _) = sqlite(dir.path());
    let orders = Orders::new(Database::Sqlite, "orders");
    let toolbox = sqlite_toolbox(store, &orders);
    let retry = toolbox
        .call("create_order", args("o-7", 11), &ctx())
        .await
        .unwrap();
    assert!(!retry.replayed);
    assert_eq!(sqlite_rows(&rows, "o-7"), 1);
    let again = toolbox
        .call("create_order", args("o-7", 11), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(sqlite_rows(&rows, "o-7"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let tables = Tables::new().await;
    // The records table exists before the worker starts.
    let store = tables.store(&tables.url).await;
    let mut worker = spawn_hanging("postgres", dir.path(), Some(&tables));
    child::wait_for(
        &dir.path().join("marker"),
        "the worker never reached its body",
    );
    worker.kill().unwrap();
    worker.wait().unwrap();

    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(store, &orders);
    // The server rolls the dead worker's transaction back; the retry waits on its row till then.
    let retry = toolbox
        .call("create_order", args("o-7", 11), &ctx())
        .await
        .unwrap();
    assert!(!retry.replayed);
    assert_eq!(tables.rows("o-7").await, 1);
    let again = toolbox
        .call("create_order", args("o-7", 11), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(tables.rows("o-7").await, 1);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------------
// What the model reads while and after a transactional call runs; the application's own pool.

/// The status companion's answer for order `order`.
async fn status(toolbox: &Toolbox, order: &str) -> String {
    let answer = toolbox
        .call("create_order_status", json!({"order": order}), &ctx())
        .await
        .unwrap();
    answer.value["status"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_companion_never_answers_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rows) = sqlite(dir.path());
    let orders = Orders::new(Database::Sqlite, "orders");
    let toolbox = sqlite_toolbox(store, &orders);
    let mut seen = Vec::new();
    for then in [Then::Retryable, Then::Panic, Then::Answer] {
        orders.then(then);
        let _ = toolbox.call("create_order", args("o-8", 1), &ctx()).await;
        seen.push(status(&toolbox, "o-8").await);
    }
    assert_eq!(seen, ["not_found", "not_found", "completed"]);

    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    orders.then(Then::Slow);
    let toolbox = pg_toolbox(tables.store(&tables.url).await, &orders);
    let running = tokio::spawn({
        let toolbox = toolbox.clone();
        async move { toolbox.call("create_order", args("o-8", 1), &ctx()).await }
    });
    // While the body runs, its record is not committed: nothing is there yet.
    while orders.runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(status(&toolbox, "o-8").await, "not_found");
    assert!(!running.await.unwrap().unwrap().replayed);
    assert_eq!(status(&toolbox, "o-8").await, "completed");
    assert_eq!(tables.rows("o-8").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_body_waits_for_its_own_locks_as_the_session_says() {
    let tables = Tables::new().await;
    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(tables.store(&tables.url).await, &orders);
    // Another session holds the orders table for a while: the body's insert waits for it (the
    // reserve's short lock timeout is not the body's).
    let mut holder = tables.client().await;
    let held = holder.transaction().await.unwrap();
    held.batch_execute(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", tables.orders))
        .await
        .unwrap();
    let call = tokio::spawn({
        let toolbox = toolbox.clone();
        async move { toolbox.call("create_order", args("o-9", 1), &ctx()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.commit().await.unwrap();
    let answer = call.await.unwrap().unwrap();
    assert!(!answer.replayed);
    assert_eq!(tables.rows("o-9").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_store_on_the_applications_pool_keeps_its_records_beside_the_orders() {
    let tables = Tables::new().await;
    let config: tokio_postgres::Config = tables.url.parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    let store = PostgresStore::with_pool(pool.clone())
        .table(&tables.records)
        .connect()
        .await
        .unwrap();
    let orders = Orders::new(Database::Postgres, &tables.orders);
    let toolbox = pg_toolbox(store, &orders);
    let first = toolbox
        .call("create_order", args("o-10", 4), &ctx())
        .await
        .unwrap();
    assert!(!first.replayed);
    // The application reads the order and its record together, with its own connection.
    let app = pool.get().await.unwrap();
    let joined: i64 = app
        .query_one(
            &format!(
                "SELECT count(*) FROM {} o JOIN {} r ON r.key = 'order:' || o.order_id
                 WHERE o.order_id = $1 AND r.state = 'completed'",
                tables.orders, tables.records
            ),
            &[&"o-10"],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(joined, 1);
    let again = toolbox
        .call("create_order", args("o-10", 4), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(tables.rows("o-10").await, 1);
}

// ---------------------------------------------------------------------------------------------
// Transactional steps: the invoice row in a step that commits with its record, then the email.

/// The outside mailer, and where the invoice rows go.
struct Billing {
    database: Database,
    table: String,
    emails: AtomicUsize,
    /// Email attempts left to fail (retryably).
    failing_emails: AtomicUsize,
}

impl Billing {
    fn new(database: Database, table: &str, failing_emails: usize) -> Billing {
        Billing {
            database,
            table: table.into(),
            emails: AtomicUsize::new(0),
            failing_emails: AtomicUsize::new(failing_emails),
        }
    }

    fn email(&self) -> Result<(), ToolError> {
        let failing = self.failing_emails.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_emails.store(failing - 1, Ordering::SeqCst);
            return Err(ToolError::new("MAILER_DOWN", "the mailer is down").with_retryable(true));
        }
        self.emails.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn ledger_error(e: impl std::fmt::Display) -> ToolError {
    ToolError::new("LEDGER", e.to_string()).with_retryable(true)
}

/// Invoices a customer: the invoice row in a transactional step, then the email in a keyed one.
#[tool(idempotent(key = "invoice:<customer>"))]
async fn invoice(
    billing: toolkey::State<Billing>,
    ctx: &ToolContext,
    customer: String,
) -> Result<Value, ToolError> {
    let insert = format!("INSERT INTO {} (order_id, cents) VALUES ", billing.table);
    let id: i64 = match billing.database {
        Database::Sqlite => {
            ctx.once_in_sqlite("invoice-row", move |tx| {
                tx.execute(&format!("{insert}(?1, 100)"), [&customer])
                    .map_err(ledger_error)?;
                Ok::<_, ToolError>(tx.last_insert_rowid())
            })
            .await?
        }
        Database::Postgres => {
            ctx.once_in_postgres("invoice-row", move |tx| {
                Box::pin(async move {
                    tx.execute(&format!("{insert}($1, 100)"), &[&customer])
                        .await
                        .map_err(ledger_error)?;
                    Ok::<_, ToolError>(7)
                })
            })
            .await?
        }
    };
    ctx.once("invoice-email", async { billing.email() }).await?;
    Ok(json!({"invoice": id}))
}

/// Two calls: the first meets a mailer that is down after its invoice row committed; the
/// retry replays the row's step and sends the email; a third replays the call.
async fn invoice_then_email(toolbox: &Toolbox, billing: &Billing) {
    let first = toolbox
        .call("invoice", json!({"customer": "acme"}), &ctx())
        .await;
    let err = first.unwrap_err();
    assert_eq!(err.code(), "MAILER_DOWN");
    let retry = toolbox
        .call("invoice", json!({"customer": "acme"}), &ctx())
        .await
        .unwrap();
    assert!(!retry.replayed);
    let again = toolbox
        .call("invoice", json!({"customer": "acme"}), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, retry.value);
    assert_eq!(billing.emails.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_transactional_step_keeps_its_row_when_a_later_step_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rows) = sqlite(dir.path());
    let billing = Arc::new(Billing::new(Database::Sqlite, "orders", 1));
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(billing.clone())
        .tool(Invoice)
        .build()
        .unwrap();
    invoice_then_email(&toolbox, &billing).await;
    assert_eq!(sqlite_rows(&rows, "acme"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_transactional_step_keeps_its_row_when_a_later_step_fails() {
    let tables = Tables::new().await;
    let billing = Arc::new(Billing::new(Database::Postgres, &tables.orders, 1));
    let toolbox = Toolbox::builder()
        .store(tables.store(&tables.url).await)
        .shared_state(billing.clone())
        .tool(Invoice)
        .build()
        .unwrap();
    invoice_then_email(&toolbox, &billing).await;
    assert_eq!(tables.rows("acme").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_step_on_a_store_of_another_database_is_refused_before_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, rows) = sqlite(dir.path());
    let billing = Arc::new(Billing::new(Database::Sqlite, "orders", 0));
    // The records in memory: no transaction holds them with the row.
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(Invoice)
        .build()
        .unwrap();
    let err = toolbox
        .call("invoice", json!({"customer": "acme"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Internal), "{err:?}");
    assert_eq!(sqlite_rows(&rows, "acme"), 0);
    assert_eq!(billing.emails.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------------------
// Declared with `#[tool]`: the transaction parameter's type picks the database.

/// Books a seat: its row and the key's record commit in one SQLite transaction.
#[tool(idempotent(key = "seat:<seat>", status = "book_seat_status"))]
async fn book_seat(tx: &rusqlite::Transaction<'_>, seat: String) -> Result<i64, ToolError> {
    tx.execute(
        "INSERT INTO orders (order_id, cents) VALUES (?1, 1)",
        [&seat],
    )
    .map_err(ledger_error)?;
    Ok(tx.last_insert_rowid())
}

/// Books a seat: its row and the key's record commit in one PostgreSQL transaction.
#[tool(idempotent(key = "seat:<seat>"))]
async fn book_pg_seat(
    billing: toolkey::State<Billing>,
    tx: &tokio_postgres::Transaction<'_>,
    seat: String,
) -> Result<String, ToolError> {
    let insert = format!(
        "INSERT INTO {} (order_id, cents) VALUES ($1, 1)",
        billing.table
    );
    tx.execute(&insert, &[&seat]).await.map_err(ledger_error)?;
    let isolation = tx.query_one("SHOW transaction_isolation", &[]).await;
    Ok(isolation.map_err(ledger_error)?.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_declared_with_a_sqlite_transaction_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rows) = sqlite(dir.path());
    assert_eq!(BookSeat.definition().transaction(), Some(Database::Sqlite));
    let toolbox = Toolbox::builder()
        .store(store)
        .tool(BookSeat)
        .build()
        .unwrap();
    let first = toolbox
        .call("book_seat", json!({"seat": "12A"}), &ctx())
        .await
        .unwrap();
    let again = toolbox
        .call("book_seat", json!({"seat": "12A"}), &ctx())
        .await
        .unwrap();
    assert_eq!((first.replayed, again.replayed), (false, true));
    assert_eq!(first.value, again.value);
    let status = toolbox
        .call("book_seat_status", json!({"seat": "12A"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    assert_eq!(sqlite_rows(&rows, "12A"), 1);
    // On another database's store, the toolbox refuses it.
    let tables = Tables::new().await;
    let refused = Toolbox::builder()
        .store(tables.store(&tables.url).await)
        .tool(BookSeat)
        .build();
    assert!(matches!(refused, Err(BuildError::TransactionStore { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_declared_with_a_postgres_transaction_runs_once_in_read_committed() {
    let tables = Tables::new().await;
    assert_eq!(
        BookPgSeat.definition().transaction(),
        Some(Database::Postgres)
    );
    let toolbox = Toolbox::builder()
        .store(tables.store(&tables.url).await)
        .state(Billing::new(Database::Postgres, &tables.orders, 0))
        .tool(BookPgSeat)
        .build()
        .unwrap();
    let first = toolbox
        .call("book_pg_seat", json!({"seat": "12A"}), &ctx())
        .await
        .unwrap();
    let again = toolbox
        .call("book_pg_seat", json!({"seat": "12A"}), &ctx())
        .await
        .unwrap();
    assert_eq!((first.replayed, again.replayed), (false, true));
    assert_eq!(first.value, "read committed");
    assert_eq!(tables.rows("12A").await, 1);
}
