//! Stores written by schema version 1 (before records kept their tool's name) are migrated when
//! opened, and their records replay: on SQLite, PostgreSQL and Redis, a completed record written
//! as version 1 wrote it is replayed to the model's retry without running the tool, lists with
//! its tool "not recorded", and a new call records its tool.
//!
//! A store migrated before approval requests existed gets their table when opened again, and
//! keeps them.
//!
//! Each fixture is the exact layout version 1 wrote: its DDL and rows for the SQL stores, its
//! hash fields for Redis.
#![cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use toolkey::store::{
    EntryState, Filter, MemoryStore, PostgresStore, RedisStore, SqliteStore, Store,
};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::servers;

const POSTGRES: (&str, &str) = (
    "TOOLKEY_POSTGRES_URL",
    "postgres://postgres@127.0.0.1:5432/test",
);
const REDIS: (&str, &str) = ("TOOLKEY_REDIS_URL", "redis://127.0.0.1:6379");

/// Invoices sent, by anyone.
#[derive(Default)]
struct Ledger(AtomicUsize);

#[tool(idempotent(key = "invoice:<customer>:<period>", status = false))]
/// Sends an invoice.
async fn send_invoice(
    ledger: State<Ledger>,
    customer: String,
    period: String,
) -> Result<Value, ToolError> {
    let sent: &Ledger = &ledger;
    let n = sent.0.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(json!({"invoice": n, "customer": customer, "period": period}))
}

fn toolbox(store: Arc<dyn Store>) -> (Toolbox, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::default());
    let toolbox = Toolbox::builder()
        .shared_store(store)
        .shared_state(ledger.clone())
        .tool(SendInvoice)
        .build()
        .unwrap();
    (toolbox, ledger)
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

fn args(customer: &str) -> Value {
    json!({"customer": customer, "period": "2026-10"})
}

/// What version 1 stored for the call `args("acme")`: its key, its fingerprint and its outcome
/// text, taken from a call on a memory store.
async fn written_by_version_1() -> (String, String, String) {
    let (toolbox, _) = toolbox(Arc::new(MemoryStore::new()));
    let output = toolbox
        .call("send_invoice", args("acme"), &ctx())
        .await
        .unwrap();
    let entry = toolbox
        .admin()
        .list(&Filter::default(), 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    let outcome = json!({ "ok": output.value }).to_string();
    (entry.key.key, entry.fingerprint.to_hex(), outcome)
}

/// The migrated store replays the old record, lists it, and records a new call's tool.
async fn replays_after_migration(store: Arc<dyn Store>) {
    let (toolbox, ledger) = toolbox(store);
    let replay = toolbox
        .call("send_invoice", args("acme"), &ctx())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(
        replay.value,
        json!({"invoice": 1, "customer": "acme", "period": "2026-10"})
    );
    assert_eq!(
        ledger.0.load(Ordering::SeqCst),
        0,
        "a migrated record ran again"
    );
    let fresh = toolbox
        .call("send_invoice", args("globex"), &ctx())
        .await
        .unwrap();
    assert!(!fresh.replayed);
    assert_eq!(ledger.0.load(Ordering::SeqCst), 1);
    let mut listed: Vec<(String, Option<String>, EntryState)> = toolbox
        .admin()
        .list(
            &Filter {
                tenant: Some("acme-corp".into()),
                ..Filter::default()
            },
            10,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.key.key, e.tool, e.state))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("invoice:acme:2026-10".into(), None, EntryState::Completed),
            (
                "invoice:globex:2026-10".into(),
                Some("send_invoice".into()),
                EntryState::Completed
            ),
        ]
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn a_version_1_sqlite_file_is_migrated_and_replays() {
    let (key, fp, outcome) = written_by_version_1().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE toolkey_records (
             tenant          TEXT NOT NULL,
             key             TEXT NOT NULL,
             state           TEXT NOT NULL,
             token           TEXT NOT NULL,
             fingerprint     TEXT NOT NULL,
             since_ms        INTEGER NOT NULL,
             lease_until_ms  INTEGER NOT NULL,
             outcome         TEXT,
             completed_at_ms INTEGER,
             expires_at_ms   INTEGER,
             PRIMARY KEY (tenant, key)
         ) WITHOUT ROWID;
         CREATE INDEX toolkey_records_expiry ON toolkey_records (expires_at_ms)
             WHERE state = 'completed';
         PRAGMA user_version = 1;",
    )
    .unwrap();
    let now = now_ms();
    conn.execute(
        "INSERT INTO toolkey_records VALUES ('acme-corp', ?1, 'completed', 'v1-token', ?2, ?3, ?3,
             ?4, ?3, ?5)",
        rusqlite::params![key, fp, now - 1_000, outcome, now + 86_400_000],
    )
    .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 2);
    replays_after_migration(Arc::new(store)).await;
    // Opening it again changes nothing.
    drop(SqliteStore::open(&path).unwrap());
}

#[tokio::test]
async fn a_version_1_postgres_table_is_migrated_and_replays() {
    let url = servers::url(POSTGRES.0, POSTGRES.1);
    let (client, connection) = match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
        Ok(pair) => pair,
        Err(e) => return servers::unreachable("PostgreSQL", POSTGRES.0, &url, e),
    };
    tokio::spawn(connection);
    let (key, fp, outcome) = written_by_version_1().await;
    let table = format!("v1_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS toolkey_schema_version (
                 table_name text PRIMARY KEY,
                 version    integer NOT NULL
             );
             CREATE TABLE \"{table}\" (
                 tenant       text NOT NULL,
                 key          text NOT NULL,
                 state        text NOT NULL,
                 token        text NOT NULL,
                 fingerprint  text NOT NULL,
                 since        timestamptz NOT NULL,
                 lease_until  timestamptz NOT NULL,
                 outcome      text,
                 completed_at timestamptz,
                 expires_at   timestamptz,
                 PRIMARY KEY (tenant, key)
             );
             CREATE INDEX \"{table}_expires_at\" ON \"{table}\" (expires_at)
                 WHERE state = 'completed';
             INSERT INTO toolkey_schema_version (table_name, version) VALUES ('{table}', 1);"
        ))
        .await
        .unwrap();
    client
        .execute(
            &format!(
                "INSERT INTO \"{table}\" VALUES ('acme-corp', $1, 'completed', 'v1-token', $2,
                     now(), now(), $3, now(), now() + interval '1 day')"
            ),
            &[&key, &fp, &outcome],
        )
        .await
        .unwrap();

    let store = PostgresStore::builder(&url)
        .table(&table)
        .connect()
        .await
        .unwrap();
    let version: i32 = client
        .query_one(
            "SELECT version FROM toolkey_schema_version WHERE table_name = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 2);
    replays_after_migration(Arc::new(store)).await;
    drop(
        PostgresStore::builder(&url)
            .table(&table)
            .connect()
            .await
            .unwrap(),
    );
    client
        .batch_execute(&format!(
            "DROP TABLE \"{table}\"; DELETE FROM toolkey_schema_version WHERE table_name = '{table}'"
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_version_1_redis_prefix_is_migrated_and_replays() {
    let url = servers::url(REDIS.0, REDIS.1);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = match client.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(e) => return servers::unreachable("Redis", REDIS.0, &url, e),
    };
    let (key, fp, outcome) = written_by_version_1().await;
    let prefix = format!("v1-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let now = now_ms();
    let (since, expires) = ((now - 1_000).to_string(), (now + 86_400_000).to_string());
    let escaped = key.replace('\\', "\\\\").replace(':', "\\:");
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}:acme-corp:{escaped}"))
        .arg(&[
            ("state", "completed"),
            ("token", "v1-token"),
            ("fp", fp.as_str()),
            ("since", since.as_str()),
            ("lease_until", since.as_str()),
            ("outcome", outcome.as_str()),
            ("completed_at", since.as_str()),
            ("expires_at", expires.as_str()),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();

    let store = RedisStore::builder(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let version: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}.version"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(version.as_deref(), Some("2"));
    replays_after_migration(Arc::new(store)).await;

    // A prefix written by a newer toolkey is refused, not misread.
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}.version"))
        .arg(3)
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = RedisStore::builder(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("schema version 3"), "{err}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Refunds made, by anyone.
#[derive(Default)]
struct Refunds(AtomicUsize);

/// Refunds an order, once a person approved it.
#[tool(idempotent(key = "refund:<order>", status = false), approval)]
async fn refund(refunds: State<Refunds>, order: String) -> Result<Value, ToolError> {
    let made: &Refunds = &refunds;
    made.0.fetch_add(1, Ordering::SeqCst);
    Ok(json!({"refunded": order}))
}

/// A store migrated before approval requests existed, opened again: it keeps them, and an
/// approved call runs once.
async fn approvals_after_migration(store: Arc<dyn Store>) {
    let refunds = Arc::new(Refunds::default());
    let toolbox = Toolbox::builder()
        .shared_store(store)
        .shared_state(refunds.clone())
        .tool(Refund)
        .build()
        .unwrap();
    let ctx = ToolContext::new("run-1").with_tenant(format!("migrated-{}", uuid::Uuid::new_v4()));
    let args = json!({"order": "o-1"});
    let err = toolbox
        .call("refund", args.clone(), &ctx)
        .await
        .unwrap_err();
    assert!(err.is(toolkey::ErrorCode::AwaitingApproval), "{err:?}");
    let id = toolkey::store::ApprovalKey::new(ctx.tenant().unwrap(), "refund", "refund:o-1");
    toolbox.admin().approve(&id, 1, "ops", None).await.unwrap();
    toolbox.call("refund", args.clone(), &ctx).await.unwrap();
    toolbox.call("refund", args, &ctx).await.unwrap();
    assert_eq!(refunds.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_sqlite_file_from_before_approvals_gets_their_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("before-approvals.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE toolkey_approvals").unwrap();
    drop(conn);
    approvals_after_migration(Arc::new(SqliteStore::open(&path).unwrap())).await;
}

#[tokio::test]
async fn a_postgres_table_from_before_approvals_gets_theirs() {
    let url = servers::url(POSTGRES.0, POSTGRES.1);
    let (client, connection) = match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
        Ok(pair) => pair,
        Err(e) => return servers::unreachable("PostgreSQL", POSTGRES.0, &url, e),
    };
    tokio::spawn(connection);
    let table = format!("v2_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let connect = || PostgresStore::builder(&url).table(&table).connect();
    drop(connect().await.unwrap());
    client
        .batch_execute(&format!("DROP TABLE \"{table}_approvals\""))
        .await
        .unwrap();
    approvals_after_migration(Arc::new(connect().await.unwrap())).await;
    client
        .batch_execute(&format!(
            "DROP TABLE \"{table}\", \"{table}_failures\", \"{table}_approvals\";
             DELETE FROM toolkey_schema_version WHERE table_name = '{table}'"
        ))
        .await
        .unwrap();
}
