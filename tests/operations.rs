//! Operators settle what a dead worker left, with the `toolkey` command, on SQLite, PostgreSQL
//! and Redis: a worker killed mid-call leaves its record unknown; the command lists it;
//! `resolve --done` makes the model's retry replay the result given, `resolve --not-done` makes
//! it run exactly once; a record that changed since it was shown is refused. Purging 100,000
//! expired records runs in batches while calls keep being answered.
//!
//! The worker is this test binary run again as a child process (`child_process_entry`), killed
//! with SIGKILL inside its tool's body. The outside system is a ledger file every process
//! appends to.
#![cfg(all(feature = "sqlite", feature = "postgres", feature = "redis", unix))]

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use toolkey::admin::{Admin, Resolved};
use toolkey::store::{
    EntryState, Filter, ManualClock, MemoryStore, Outcome, PostgresStore, RecordKey, RedisStore,
    Resolution, SqliteStore, Store, Token,
};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};
use toolkey_cli::Exit;
use toolkey_tests::{child, servers};

const POSTGRES: (&str, &str) = (
    "TOOLKEY_POSTGRES_URL",
    "postgres://postgres@127.0.0.1:5432/test",
);
const REDIS: (&str, &str) = ("TOOLKEY_REDIS_URL", "redis://127.0.0.1:6379");

/// The outside system: one line per invoice sent, in a file every process appends to.
struct Outside {
    dir: PathBuf,
    /// In a child: `act-then-hang` (sends, then hangs before answering) or `hang-before` (hangs
    /// before sending). Either way it writes `marker` first, and is killed while it hangs.
    /// `act-then-unknown`: sends, then says it cannot tell whether it did.
    mode: Option<String>,
}

impl Outside {
    fn sent(&self, customer: &str) -> usize {
        std::fs::read_to_string(self.dir.join("ledger"))
            .unwrap_or_default()
            .lines()
            .filter(|line| *line == customer)
            .count()
    }

    fn send(&self, customer: &str) {
        let mut ledger = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("ledger"))
            .unwrap();
        writeln!(ledger, "{customer}").unwrap();
        ledger.sync_all().unwrap();
    }
}

#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = false),
    lease = "1s"
)]
/// Sends an invoice.
async fn send_invoice(
    outside: State<Outside>,
    customer: String,
    period: String,
) -> Result<Value, ToolError> {
    match outside.mode.as_deref() {
        Some("act-then-hang") => outside.send(&customer),
        Some("act-then-unknown") => {
            outside.send(&customer);
            return Err(ToolError::outcome_unknown("the gateway's reply was lost"));
        }
        Some(_) => {}
        None => {
            outside.send(&customer);
            return Ok(json!({ "invoice": format!("inv-{customer}-{period}") }));
        }
    }
    std::fs::write(outside.dir.join("marker"), b"in the body").unwrap();
    std::future::pending::<()>().await;
    unreachable!()
}

/// The store at `url`, as the command opens it.
async fn open(url: &str, prefix_or_table: Option<&str>) -> Arc<dyn Store> {
    if url.starts_with("postgres://") {
        let mut builder = PostgresStore::builder(url);
        if let Some(table) = prefix_or_table {
            builder = builder.table(table);
        }
        Arc::new(builder.connect().await.unwrap())
    } else if url.starts_with("redis://") {
        let mut builder = RedisStore::builder(url);
        if let Some(prefix) = prefix_or_table {
            builder = builder.prefix(prefix);
        }
        Arc::new(builder.connect().await.unwrap())
    } else {
        Arc::new(SqliteStore::open(url.trim_start_matches("sqlite:")).unwrap())
    }
}

fn toolbox(store: Arc<dyn Store>, dir: &Path, mode: Option<String>) -> Toolbox {
    Toolbox::builder()
        .shared_store(store)
        .state(Outside {
            dir: dir.to_path_buf(),
            mode,
        })
        .tool(SendInvoice)
        .build()
        .unwrap()
}

fn args(customer: &str) -> Value {
    json!({"customer": customer, "period": "2026-10"})
}

/// The child's part, when this binary runs as a child process; nothing otherwise.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let dir = PathBuf::from(var("TOOLKEY_OPS_DIR"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = open(&var("TOOLKEY_OPS_STORE"), None).await;
        let toolbox = toolbox(store, &dir, Some(mode));
        let ctx = ToolContext::new("run-1").with_tenant(var("TOOLKEY_OPS_TENANT"));
        let answer = toolbox
            .call("send_invoice", args(&var("TOOLKEY_OPS_CUSTOMER")), &ctx)
            .await;
        panic!("the child's call was meant to hang until killed, and answered {answer:?}");
    });
}

/// Runs the `toolkey` command with `args` after `--store url`.
async fn toolkey(url: &str, args: &[&str]) -> (Exit, String, String) {
    let mut line = vec!["toolkey", "--store", url];
    line.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = toolkey_cli::run(line, &mut out, &mut err).await;
    (
        exit,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Runs `toolkey resolve` on `key` of `tenant`, naming `revision`, with `finding` (`--done
/// --result ...` or `--not-done`).
async fn resolve(
    url: &str,
    tenant: &str,
    key: &str,
    revision: &str,
    finding: &[&str],
) -> (Exit, String, String) {
    let mut line = vec![
        "resolve",
        "--tenant",
        tenant,
        "--key",
        key,
        "--revision",
        revision,
    ];
    line.extend_from_slice(finding);
    toolkey(url, &line).await
}

/// Starts a child that calls `send_invoice` for `customer` in `mode`, waits until it is inside
/// the body, and kills it.
fn kill_a_worker_mid_call(url: &str, dir: &Path, tenant: &str, customer: &str, mode: &str) {
    let marker = dir.join("marker");
    let _ = std::fs::remove_file(&marker);
    let mut worker = child::spawn_self(&[
        ("TOOLKEY_CHILD", OsStr::new(mode)),
        ("TOOLKEY_OPS_STORE", OsStr::new(url)),
        ("TOOLKEY_OPS_DIR", dir.as_os_str()),
        ("TOOLKEY_OPS_TENANT", OsStr::new(tenant)),
        ("TOOLKEY_OPS_CUSTOMER", OsStr::new(customer)),
    ]);
    child::wait_for(&marker, "the worker never reached its body");
    worker.kill().unwrap(); // SIGKILL: no destructor, no release, no outcome
    worker.wait().unwrap();
}

/// Waits until `toolkey list --state unknown` lists `key` in `tenant` (the killed worker's lease
/// lapses within a second), and returns its listing.
async fn listed_unknown(url: &str, tenant: &str, key: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (exit, out, err) = toolkey(
            url,
            &["--json", "list", "--tenant", tenant, "--state", "unknown"],
        )
        .await;
        assert_eq!(exit, Exit::Done, "{err}");
        let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
        if let Some(entry) = listed.into_iter().find(|e| e["key"] == key) {
            return entry;
        }
        assert!(
            Instant::now() < deadline,
            "the killed worker's record was never listed as unknown"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The whole story on the store at `url`.
async fn operator_settles_what_a_dead_worker_left(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = format!("ops-{}", uuid::Uuid::new_v4().simple());
    let ctx = ToolContext::new("run-2").with_tenant(tenant.clone());
    let toolbox = toolbox(open(url, None).await, dir.path(), None);
    let outside = Outside {
        dir: dir.path().to_path_buf(),
        mode: None,
    };

    // Done: the worker sent the invoice and died before recording it.
    kill_a_worker_mid_call(url, dir.path(), &tenant, "acme", "act-then-hang");
    // The operator finds the record from the call's arguments, without knowing the key format.
    let found = toolbox
        .record_key("send_invoice", args("acme"), &ctx)
        .unwrap();
    assert_eq!(
        (found.tenant.as_str(), found.key.as_str()),
        (tenant.as_str(), "invoice:acme:2026-10")
    );
    let key = found.key.as_str();
    let entry = listed_unknown(url, &tenant, key).await;
    assert_eq!(entry["tool"], "send_invoice");
    assert_eq!(entry["reported"], false, "{entry}");
    let revision = entry["revision"].as_str().unwrap().to_string();
    let retry = toolbox.call("send_invoice", args("acme"), &ctx).await;
    assert!(
        matches!(&retry, Err(e) if e.is(ErrorCode::OutcomeUnknown)),
        "{retry:?}"
    );
    assert_eq!(outside.sent("acme"), 1);
    // Resolving a record that is not there under another tenant, or with a revision nobody saw,
    // is refused.
    let (exit, out, _) = resolve(url, &tenant, key, "made-up", &["--not-done"]).await;
    assert_eq!(exit, Exit::Refused, "{out}");
    assert!(out.contains("unknown under revision"), "{out}");
    let (exit, out, err) = resolve(
        url,
        &tenant,
        key,
        &revision,
        &[
            "--done",
            "--result",
            r#"{"invoice": "inv-acme-found-by-hand"}"#,
        ],
    )
    .await;
    assert_eq!(exit, Exit::Done, "{out}{err}");
    let replay = toolbox
        .call("send_invoice", args("acme"), &ctx)
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.value, json!({"invoice": "inv-acme-found-by-hand"}));
    assert_eq!(outside.sent("acme"), 1, "the retry sent the invoice again");
    // A second operator who saw the same revision is refused: the record changed.
    let (exit, out, _) = resolve(url, &tenant, key, &revision, &["--not-done"]).await;
    assert_eq!(exit, Exit::Refused);
    assert!(out.contains("it is completed now"), "{out}");
    assert_eq!(
        toolbox
            .call("send_invoice", args("acme"), &ctx)
            .await
            .unwrap()
            .value,
        json!({"invoice": "inv-acme-found-by-hand"})
    );

    // Not done: the worker died before sending.
    kill_a_worker_mid_call(url, dir.path(), &tenant, "globex", "hang-before");
    let key = "invoice:globex:2026-10";
    let entry = listed_unknown(url, &tenant, key).await;
    let revision = entry["revision"].as_str().unwrap().to_string();
    let (exit, out, _) = toolkey(url, &["show", "--tenant", &tenant, "--key", key]).await;
    assert_eq!(exit, Exit::Done);
    assert!(
        out.contains("state:       unknown (its worker stopped renewing"),
        "{out}"
    );
    assert!(out.contains(&format!("revision:    {revision}")), "{out}");
    let (exit, out, err) = resolve(url, &tenant, key, &revision, &["--not-done"]).await;
    assert_eq!(exit, Exit::Done, "{out}{err}");
    assert_eq!(outside.sent("globex"), 0);
    let first = toolbox
        .call("send_invoice", args("globex"), &ctx)
        .await
        .unwrap();
    assert!(!first.replayed);
    let again = toolbox
        .call("send_invoice", args("globex"), &ctx)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(outside.sent("globex"), 1, "not done must run exactly once");

    // A live call is never resolved from under its body.
    let admin = toolbox.admin();
    let running = {
        let store = open(url, None).await;
        let hanging = Arc::new(toolbox_hanging(store, dir.path()));
        let ctx = ctx.clone();
        let call = hanging.clone();
        let marker = dir.path().join("marker");
        let _ = std::fs::remove_file(&marker);
        let task =
            tokio::spawn(async move { call.call("send_invoice", args("initech"), &ctx).await });
        while !marker.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (hanging, task)
    };
    let key = "invoice:initech:2026-10";
    let (_, out, _) = toolkey(url, &["--json", "show", "--tenant", &tenant, "--key", key]).await;
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["state"], "in_progress", "{shown}");
    let (exit, out, _) = resolve(
        url,
        &tenant,
        key,
        shown["revision"].as_str().unwrap(),
        &["--not-done"],
    )
    .await;
    assert_eq!(exit, Exit::Refused);
    assert!(
        out.contains("it is in_progress now (its body is running)"),
        "{out}"
    );
    let counts = admin
        .counts(&toolkey::store::Filter {
            tenant: Some(tenant.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let count = |state| {
        counts
            .get(&(Some("send_invoice".to_string()), state))
            .copied()
    };
    use toolkey::store::EntryState::{Completed, InProgress};
    assert_eq!((count(Completed), count(InProgress)), (Some(2), Some(1)));
    running.1.abort();

    // A call stopped by its retry limit is let run again by clearing its failures.
    let stopped = toolbox
        .record_key("send_invoice", args("umbrella"), &ctx)
        .unwrap();
    let store = toolbox.store();
    for _ in 0..3 {
        store
            .count_failure(&stopped, Duration::from_secs(600))
            .await
            .unwrap();
    }
    let (exit, out, _) = toolkey(url, &["show", "--tenant", &tenant, "--key", &stopped.key]).await;
    assert_eq!(exit, Exit::NotFound);
    assert!(out.contains("3 failures counted"), "{out}");
    let (exit, out, err) = toolkey(
        url,
        &["clear-failures", "--tenant", &tenant, "--key", &stopped.key],
    )
    .await;
    assert_eq!(exit, Exit::Done, "{err}");
    assert!(out.contains("cleared 3 counted failures"), "{out}");
    assert_eq!(store.failures(&stopped).await.unwrap(), 0);
}

/// A toolbox whose calls hang in the body (after writing the marker) until aborted.
fn toolbox_hanging(store: Arc<dyn Store>, dir: &Path) -> Toolbox {
    toolbox(store, dir, Some("hang-before".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_operator_settles_what_a_dead_worker_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolkey.db");
    drop(SqliteStore::open(&path).unwrap());
    operator_settles_what_a_dead_worker_left(&format!("sqlite:{}", path.display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_operator_settles_what_a_dead_worker_left() {
    let url = servers::url(POSTGRES.0, POSTGRES.1);
    if let Err(e) = PostgresStore::connect(&url).await {
        return servers::unreachable("PostgreSQL", POSTGRES.0, &url, e);
    }
    operator_settles_what_a_dead_worker_left(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_operator_settles_what_a_dead_worker_left() {
    let url = servers::url(REDIS.0, REDIS.1);
    if let Err(e) = RedisStore::connect(&url).await {
        return servers::unreachable("Redis", REDIS.0, &url, e);
    }
    operator_settles_what_a_dead_worker_left(&url).await;
}

/// How many expired records each purge test starts with.
const EXPIRED: u64 = 100_000;
/// How many a purge deletes per batch.
const BATCH: usize = 1_000;

/// Deletes `EXPIRED` expired records from the store at `url` through `Admin::purge` while a
/// model keeps calling, then checks the command finds nothing left.
async fn purge_runs_in_batches_while_calls_are_answered(url: &str, isolate: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(url, isolate).await;
    let toolbox = toolbox(store.clone(), dir.path(), None);
    let outside = Outside {
        dir: dir.path().to_path_buf(),
        mode: None,
    };
    let purging = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let caller = {
        let (toolbox, purging) = (toolbox.clone(), purging.clone());
        tokio::spawn(async move {
            let ctx = ToolContext::new("run-3").with_tenant("live");
            let (mut during, mut customers) = (0u64, 0usize);
            while purging.load(std::sync::atomic::Ordering::SeqCst) {
                let customer = format!("c{customers}");
                let first = toolbox.call("send_invoice", args(&customer), &ctx).await;
                let replay = toolbox.call("send_invoice", args(&customer), &ctx).await;
                assert!(!first.unwrap().replayed);
                assert!(replay.unwrap().replayed);
                customers += 1;
                if purging.load(std::sync::atomic::Ordering::SeqCst) {
                    during += 2;
                }
            }
            (during, customers)
        })
    };
    let mut batches = 0;
    let purged = Admin::new(store)
        .purge(BATCH, |_| batches += 1)
        .await
        .unwrap();
    purging.store(false, std::sync::atomic::Ordering::SeqCst);
    let (during, customers) = caller.await.unwrap();
    assert_eq!(purged, EXPIRED);
    assert_eq!(
        batches,
        EXPIRED as usize / BATCH + 1,
        "a last, short batch ends it"
    );
    assert!(during > 0, "no call was answered while the purge ran");
    for i in 0..customers {
        assert_eq!(outside.sent(&format!("c{i}")), 1);
    }
    let mut line = vec!["--json"];
    match (url.split("://").next(), isolate) {
        (Some("postgres"), Some(table)) => line.extend(["--table", table]),
        (Some("redis"), Some(prefix)) => line.extend(["--prefix", prefix]),
        _ => {}
    }
    line.push("purge");
    let (exit, out, err) = toolkey(url, &line).await;
    assert_eq!(exit, Exit::Done, "{err}");
    assert_eq!(out.trim(), r#"{"purged":0}"#);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn fingerprint() -> String {
    toolkey::Fingerprint::of(&json!({"expired": true}))
        .unwrap()
        .to_hex()
}

/// A record that cannot be read neither stops `list` nor hides the others: every readable
/// record is listed, the corrupt one is named on the error stream by its key's hash (never its
/// key), and the command fails so a script notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_named_and_hides_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolkey.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let (fp, now) = (fingerprint(), now_ms());
    for (key, outcome) in [
        ("invoice:acme:2026-09", "{\"ok\":1}"),
        ("invoice:acme:2026-10", "{not json"),
        ("invoice:acme:2026-11", "{\"ok\":3}"),
    ] {
        conn.execute(
            "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint, since_ms,
                 lease_until_ms, outcome, completed_at_ms, expires_at_ms, tool)
             VALUES ('shop', ?1, 'completed', ?1, ?2, ?3, ?3, ?4, ?3, ?5, 'send_invoice')",
            rusqlite::params![key, fp, now, outcome, now + 3_600_000],
        )
        .unwrap();
    }
    drop(conn);
    let url = format!("sqlite:{}", path.display());
    let (exit, out, err) = toolkey(&url, &["list", "--tenant", "shop"]).await;
    assert_eq!(exit, Exit::Failed, "{out}{err}");
    assert!(out.contains("invoice:acme:2026-09") && out.contains("invoice:acme:2026-11"));
    assert!(!out.contains("invoice:acme:2026-10"), "{out}");
    assert!(err.contains("corrupt record (key hash"), "{err}");
    assert!(err.contains("1 record(s) above could not be read"), "{err}");
    assert!(
        !err.contains("2026-10"),
        "the key's text reached the error: {err}"
    );
    let (exit, out, _) = toolkey(&url, &["--json", "list", "--state", "completed"]).await;
    assert_eq!(exit, Exit::Failed);
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = listed.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["invoice:acme:2026-09", "invoice:acme:2026-11"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_runs_in_batches_while_calls_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolkey.db");
    drop(SqliteStore::open(&path).unwrap());
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint, since_ms,
                     lease_until_ms, outcome, completed_at_ms, expires_at_ms, tool)
                 VALUES ('old', ?1, 'completed', ?1, ?2, ?3, ?3, '{\"ok\":1}', ?3, ?4,
                     'send_invoice')",
            )
            .unwrap();
        let (fp, now) = (fingerprint(), now_ms());
        for i in 0..EXPIRED {
            insert
                .execute(rusqlite::params![
                    format!("old:{i}"),
                    fp,
                    now - 60_000,
                    now - 1_000
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    drop(conn);
    purge_runs_in_batches_while_calls_are_answered(&format!("sqlite:{}", path.display()), None)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_purge_runs_in_batches_while_calls_are_answered() {
    let url = servers::url(POSTGRES.0, POSTGRES.1);
    if let Err(e) = PostgresStore::connect(&url).await {
        return servers::unreachable("PostgreSQL", POSTGRES.0, &url, e);
    }
    let table = format!("purge_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    drop(open(&url, Some(&table)).await);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .execute(
            &format!(
                "INSERT INTO \"{table}\" (tenant, key, state, token, fingerprint, since,
                     lease_until, outcome, completed_at, expires_at, tool)
                 SELECT 'old', 'old:' || g, 'completed', 't' || g, $1, now() - interval '1 hour',
                     now() - interval '1 hour', '{{\"ok\":1}}', now() - interval '1 hour',
                     now() - interval '1 second', 'send_invoice'
                 FROM generate_series(1, $2::int8) g"
            ),
            &[&fingerprint(), &(EXPIRED as i64)],
        )
        .await
        .unwrap();
    purge_runs_in_batches_while_calls_are_answered(&url, Some(&table)).await;
    client
        .batch_execute(&format!(
            "DROP TABLE \"{table}\"; DELETE FROM toolkey_schema_version WHERE table_name = '{table}'"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_purge_runs_in_batches_while_calls_are_answered() {
    let url = servers::url(REDIS.0, REDIS.1);
    if let Err(e) = RedisStore::connect(&url).await {
        return servers::unreachable("Redis", REDIS.0, &url, e);
    }
    let prefix = format!("purge-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (fp, now) = (fingerprint(), now_ms());
    let (old, expired) = ((now - 60_000).to_string(), (now - 1_000).to_string());
    for chunk in 0..EXPIRED / 10_000 {
        let mut pipe = redis::pipe();
        for i in chunk * 10_000..(chunk + 1) * 10_000 {
            pipe.cmd("HSET")
                .arg(format!("{prefix}:old:old{i}"))
                .arg(&[
                    ("state", "completed"),
                    ("token", "t"),
                    ("fp", fp.as_str()),
                    ("since", old.as_str()),
                    ("lease_until", old.as_str()),
                    ("outcome", "{\"ok\":1}"),
                    ("completed_at", old.as_str()),
                    ("expires_at", expired.as_str()),
                    ("tool", "send_invoice"),
                ])
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    purge_runs_in_batches_while_calls_are_answered(&url, Some(&prefix)).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}.version"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The outside system of a reminder held at a gate while the test orders what meets it: emails
/// sent.
#[derive(Default)]
struct Mailer {
    sent: std::sync::atomic::AtomicUsize,
    /// While set, a send waits until the test opens it.
    gate: std::sync::Mutex<Option<Arc<tokio::sync::Notify>>>,
}

impl Mailer {
    fn sent(&self) -> usize {
        self.sent.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tool(idempotent(key = "remind:<customer>", status = false))]
/// Sends a customer their reminder.
async fn remind(mailer: State<Mailer>, customer: String) -> Result<String, ToolError> {
    let _ = customer;
    let gate = mailer.gate.lock().unwrap().clone();
    if let Some(gate) = gate {
        gate.notified().await;
    }
    mailer
        .sent
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok("sent".to_string())
}

/// A purge deletes only completed records past their retention, also a row that a call's
/// reserve took over while the purge waited for it: an expired record, replaced by the
/// reservation of a new call whose body runs. PostgreSQL re-checks such a row against the
/// outer condition of the purge's `DELETE` alone, which once named only the key; the retry of
/// the running call then found no record and sent a second email.
///
/// A plain transaction holding the row's lock orders the three statements as they can meet
/// in a running system (a purge of a large table while calls come in); it changes no data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_purge_never_deletes_a_reservation_that_replaced_an_expired_record() {
    use toolkey::store::{Outcome, RecordKey, Reservation, Token};

    let url = servers::url(POSTGRES.0, POSTGRES.1);
    if let Err(e) = PostgresStore::connect(&url).await {
        return servers::unreachable("PostgreSQL", POSTGRES.0, &url, e);
    }
    let table = format!(
        "purge_race_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let store: Arc<dyn Store> = open(&url, Some(&table)).await;
    let mailer = Arc::new(Mailer::default());
    let gate = Arc::new(tokio::sync::Notify::new());
    *mailer.gate.lock().unwrap() = Some(gate.clone());
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(mailer.clone())
        .tool(Remind)
        .build()
        .unwrap();
    let ctx = ToolContext::new("run-4").with_tenant("acme");
    let args = json!({"customer": "c-1"});
    let key: RecordKey = toolbox.record_key("remind", args.clone(), &ctx).unwrap();

    // An earlier action under the key whose retention has ended: absent to every call, and
    // what a purge is for.
    let token = Token::generate();
    let fingerprint = toolkey::Fingerprint::of(&json!({"earlier": true})).unwrap();
    let reserved = store.reserve(
        &key,
        "remind",
        &fingerprint,
        &token,
        Duration::from_secs(30),
    );
    assert!(matches!(
        reserved.await.unwrap(),
        Reservation::Reserved { .. }
    ));
    let done = Outcome::Ok(json!("sent"));
    let completed = store.complete(&key, &token, &done, Duration::from_millis(1));
    assert!(completed.await.unwrap());
    tokio::time::sleep(Duration::from_millis(50)).await;

    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let holder = client.transaction().await.unwrap();
    let lock = format!("SELECT 1 FROM \"{table}\" WHERE tenant = $1 AND key = $2 FOR UPDATE");
    holder
        .execute(&lock, &[&key.tenant, &key.key])
        .await
        .unwrap();

    // The new call: its reserve waits for the row, then replaces the expired record, and its
    // body runs (held at the gate, as a body that takes a while).
    let first = {
        let (toolbox, args, ctx) = (toolbox.clone(), args.clone(), ctx.clone());
        tokio::spawn(async move { toolbox.call("remind", args, &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The operator's purge, queued behind it.
    let purge = {
        let admin = Admin::new(store.clone());
        tokio::spawn(async move { admin.purge(BATCH, |_| {}).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.unwrap();
    let purged = purge.await.unwrap().unwrap();

    // The model's retry of the running call.
    *mailer.gate.lock().unwrap() = None;
    let retry = toolbox.call("remind", args.clone(), &ctx).await;
    gate.notify_one();
    let first = first.await.unwrap();
    client
        .batch_execute(&format!(
            "DROP TABLE \"{table}\"; DROP TABLE IF EXISTS \"{table}_failures\";
             DELETE FROM toolkey_schema_version WHERE table_name = '{table}'"
        ))
        .await
        .unwrap();
    assert_eq!(
        purged, 0,
        "the purge deleted the running call's reservation"
    );
    assert!(
        matches!(&retry, Err(e) if e.is(ErrorCode::InProgress)),
        "{retry:?}"
    );
    let first = first.unwrap();
    assert_eq!((first.value, first.replayed), (json!("sent"), false));
    assert_eq!(mailer.sent(), 1);
}

/// `resolve --done` promises that a retry replays the result given: a retention too short for
/// that retry to find the record is refused, loudly and changing nothing; one long enough is
/// kept, and the retry replays (one invoice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_done_refuses_a_retention_the_retry_would_outlive() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    std::fs::File::create(dir.path().join("store.db")).unwrap();
    let store = open(&url, None).await;
    let (tenant, key) = ("acme-corp", "invoice:acme:2026-10");
    let ctx = ToolContext::new("run-5").with_tenant(tenant);
    let outside = Outside {
        dir: dir.path().to_path_buf(),
        mode: None,
    };
    let acting = toolbox(store.clone(), dir.path(), Some("act-then-unknown".into()));
    let first = acting.call("send_invoice", args("acme"), &ctx).await;
    assert!(
        matches!(&first, Err(e) if e.is(ErrorCode::OutcomeUnknown)),
        "{first:?}"
    );
    assert_eq!(outside.sent("acme"), 1);
    let revision = listed_unknown(&url, tenant, key).await["revision"]
        .as_str()
        .unwrap()
        .to_string();

    let found = ["--done", "--result", r#"{"invoice": "inv-by-hand"}"#];
    for retain in ["0s", "1s", "59m"] {
        let finding = [&found[..], &["--retain", retain]].concat();
        let (exit, out, err) = resolve(&url, tenant, key, &revision, &finding).await;
        assert_eq!(exit, Exit::Usage, "--retain {retain}: {out}{err}");
        assert!(
            err.contains("nothing was changed") && err.contains("`--retain 1h`"),
            "{err}"
        );
        let entry = listed_unknown(&url, tenant, key).await;
        assert_eq!(entry["revision"], revision.as_str(), "--retain {retain}");
    }
    let admin = Admin::new(store.clone());
    let too_short = Resolution::Done {
        outcome: Outcome::Ok(json!({"invoice": "inv-by-hand"})),
        retain: Duration::from_secs(59),
    };
    let record = RecordKey::new(tenant, key);
    let seen = Token::from_stored(revision.clone());
    assert_eq!(
        admin.resolve(&record, &seen, &too_short).await.unwrap(),
        Resolved::RetainTooShort {
            retain: Duration::from_secs(59)
        }
    );
    assert_eq!(
        listed_unknown(&url, tenant, key).await["revision"],
        revision.as_str()
    );

    let finding = [&found[..], &["--retain", "1h"]].concat();
    let (exit, out, err) = resolve(&url, tenant, key, &revision, &finding).await;
    assert_eq!(exit, Exit::Done, "{out}{err}");
    assert!(
        out.contains("a retry within 1h replays the result given"),
        "{out}"
    );
    let retry = toolbox(store, dir.path(), None)
        .call("send_invoice", args("acme"), &ctx)
        .await
        .unwrap();
    assert!(retry.replayed);
    assert_eq!(retry.value, json!({"invoice": "inv-by-hand"}));
    assert_eq!(outside.sent("acme"), 1, "the retry sent the invoice again");
}

/// Statements sent, counted; a body stalls at the gate when one is set.
#[derive(Default)]
struct Statements {
    sent: std::sync::atomic::AtomicUsize,
    gate: std::sync::Mutex<Option<Gate>>,
}

/// Where a stalled body waits: it says it started, then waits to be let go.
struct Gate {
    started: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
}

#[tool(idempotent(key = "statement:<customer>", status = false), lease = "1h")]
/// Sends a customer's statement.
async fn send_statement(
    statements: State<Statements>,
    customer: String,
) -> Result<Value, ToolError> {
    let gate = statements.gate.lock().unwrap().take();
    if let Some(gate) = gate {
        let _ = gate.started.send(());
        let _ = gate.go.await;
    }
    let n = statements
        .sent
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(json!({ "statement": format!("st-{customer}-{n}") }))
}

/// A worker stalls past its lease (the store's clock moves an hour on; its renewals, due in real
/// time, never come), an operator resolves its record as not done, and the worker then
/// finishes. The operator's command must make nothing worse than doing nothing: with no other
/// call since, the worker's outcome is recorded and the next call replays it (one statement);
/// with another call since (the operator's finding was wrong, and that call sent a second
/// statement), the late worker's answer names what may have happened, not a plain success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_alive_after_resolve_not_done_still_records_its_outcome() {
    let clock = Arc::new(ManualClock::new());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let statements = Arc::new(Statements::default());
    let toolbox = Arc::new(
        Toolbox::builder()
            .shared_store(store.clone())
            .shared_state(statements.clone())
            .tool(SendStatement)
            .build()
            .unwrap(),
    );
    let admin = Admin::new(store.clone());
    let ctx = ToolContext::new("run-6").with_tenant("acme-corp");
    let sent = || statements.sent.load(std::sync::atomic::Ordering::SeqCst);

    // Starts a call whose body stalls, lets its lease lapse, and resolves it as not done; the
    // call's task and the sender that lets its body go on.
    let stall_and_resolve = |customer: &'static str| {
        let (toolbox, statements, admin, clock, ctx) = (
            toolbox.clone(),
            statements.clone(),
            admin.clone(),
            clock.clone(),
            ctx.clone(),
        );
        async move {
            let (started, started_rx) = tokio::sync::oneshot::channel();
            let (go, go_rx) = tokio::sync::oneshot::channel();
            *statements.gate.lock().unwrap() = Some(Gate { started, go: go_rx });
            let call = tokio::spawn(async move {
                toolbox
                    .call("send_statement", json!({ "customer": customer }), &ctx)
                    .await
            });
            started_rx.await.unwrap();
            clock.advance(Duration::from_secs(2 * 60 * 60));
            let key = RecordKey::new("acme-corp", format!("statement:{customer}"));
            let unknown = Filter {
                state: Some(EntryState::Unknown),
                ..Filter::default()
            };
            let listed = admin.list(&unknown, 10).await.unwrap();
            let entry = listed
                .iter()
                .find(|e| e.key == key)
                .expect("the stalled call's record is listed as unknown");
            let resolved = admin
                .resolve(&key, &entry.revision, &Resolution::NotDone)
                .await
                .unwrap();
            assert_eq!(resolved, Resolved::Applied);
            (call, go)
        }
    };

    // No other call since the resolution: the worker's statement is recorded, and replayed.
    let (late, go) = stall_and_resolve("acme").await;
    go.send(()).unwrap();
    let answer = late.await.unwrap();
    let late_value = answer
        .as_ref()
        .map(|out| out.value.clone())
        .unwrap_or_else(|e| panic!("the late worker was answered {e:?}"));
    assert_eq!(sent(), 1);
    let next = toolbox
        .call("send_statement", json!({"customer": "acme"}), &ctx)
        .await
        .unwrap();
    assert!(next.replayed, "the next call ran again: {next:?}");
    assert_eq!(next.value, late_value);
    assert_eq!(sent(), 1, "the next call sent a second statement");

    // Another call ran after the resolution: it sent the statement the operator declared not
    // sent (the second, counted apart: the finding was wrong), and the late worker's own
    // outcome cannot be recorded. Its answer says a person may have resolved its record.
    let (late, go) = stall_and_resolve("globex").await;
    let other = toolbox
        .call("send_statement", json!({"customer": "globex"}), &ctx)
        .await
        .unwrap();
    assert!(!other.replayed);
    assert_eq!(sent(), 2);
    go.send(()).unwrap();
    let answer = late.await.unwrap();
    let err = answer.expect_err("the late worker's outcome was recorded over another call's");
    assert!(err.is(ErrorCode::LeaseLost), "{err:?}");
    assert!(
        err.message()
            .contains("a person judged this call dead and resolved its record"),
        "{err:?}"
    );
    assert_eq!(sent(), 3, "the late worker's body ran once");
    let next = toolbox
        .call("send_statement", json!({"customer": "globex"}), &ctx)
        .await
        .unwrap();
    assert!(next.replayed);
    assert_eq!(next.value, other.value);
    assert_eq!(sent(), 3);
}
