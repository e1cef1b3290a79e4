//! What a store's history costs a call: on every store, a table holding a million expired
//! records that no purge has removed, against the same store empty, all measured through
//! `Toolbox::call`.
//!
//! Each store is set up twice: one holding the history (filled in bulk, as the store writes a
//! completed record whose retention has passed: PostgreSQL by one `INSERT ... SELECT` on a table
//! with autovacuum off and never analysed, SQLite in one transaction, Redis by a script in
//! batches, the memory store through its own reserve and complete), one empty. A whole run (no
//! filter; or any run with `TOOLKEY_BENCH_RATIOS=1`) prints, side by side in rounds:
//!
//! - a replay on the history against a raw primary-key read of the same outcome on the same
//!   table, with the client crate alone (not for the memory store, which has no table to read
//!   apart from itself);
//! - a replay on the history against a replay on the empty store;
//! - a first call on the history against a first call on the empty store.
//!
//! Needs the servers of the store tests (`bash .ci/services.sh`):
//! `cargo bench -p toolkey-tests --features sqlite,postgres,redis --bench history`.
//! `TOOLKEY_HISTORY_RECORDS` sets the history's size (a million unless set);
//! `TOOLKEY_HISTORY_STORES` names the stores to run, comma-separated (all four unless set).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use serde_json::{json, Value};
use toolkey::store::{
    MemoryStore, Outcome, PostgresStore, RecordKey, RedisStore, SqliteStore, Store,
};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::direct::*;
use toolkey_tests::rounds::*;

#[derive(Default)]
struct Ledger {
    charged: AtomicU64,
}

/// Charge an order.
#[tool(idempotent(key = "charge:<order>"))]
async fn charge(ledger: State<Ledger>, order: String, amount: u64) -> Result<u64, ToolError> {
    let _ = order;
    Ok(ledger.charged.fetch_add(amount, Ordering::Relaxed))
}

/// The history's tenant: every expired record is under it.
const HISTORY: &str = "history";
/// The calls' tenant: the live record and the first calls.
const CALLS: &str = "calls";
/// A day, in milliseconds: how long ago the history's records expired.
const DAY_MS: i64 = 86_400_000;

fn records() -> u64 {
    std::env::var("TOOLKEY_HISTORY_RECORDS")
        .ok()
        .map(|n| n.parse().expect("TOOLKEY_HISTORY_RECORDS is a number"))
        .unwrap_or(1_000_000)
}

fn runs_store(name: &str) -> bool {
    std::env::var("TOOLKEY_HISTORY_STORES")
        .map(|stores| stores.split(',').any(|s| s.trim() == name))
        .unwrap_or(true)
}

/// The outcome every record of the history holds, as the store keeps it.
fn outcome_text() -> String {
    Outcome::Ok(json!(7)).to_stored()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn toolbox(store: Arc<dyn Store>) -> Toolbox {
    Toolbox::builder()
        .shared_state(Arc::new(Ledger::default()))
        .tool(Charge)
        .shared_store(store)
        .build()
        .unwrap()
}

/// The arguments of the replayed call.
fn live() -> Value {
    json!({"order": "live", "amount": 7})
}

/// One store's two sides: its history and its empty twin, each behind a toolbox whose live call
/// has been made once.
struct Pair<'a> {
    name: &'static str,
    rt: &'a tokio::runtime::Runtime,
    ctx: ToolContext,
    history: Toolbox,
    empty: Toolbox,
    fresh: AtomicU64,
}

impl<'a> Pair<'a> {
    fn new(
        rt: &'a tokio::runtime::Runtime,
        name: &'static str,
        history: Arc<dyn Store>,
        empty: Arc<dyn Store>,
    ) -> Pair<'a> {
        let pair = Pair {
            name,
            rt,
            ctx: ToolContext::new("bench").with_tenant(CALLS),
            history: toolbox(history),
            empty: toolbox(empty),
            fresh: AtomicU64::new(0),
        };
        for toolbox in [&pair.history, &pair.empty] {
            let out = rt
                .block_on(toolbox.call("charge", live(), &pair.ctx))
                .unwrap();
            assert!(!out.replayed);
        }
        pair
    }

    /// `runs` replays of the live call.
    fn replays(&self, toolbox: &Toolbox, runs: usize) -> Duration {
        self.calls(toolbox, vec![live(); runs], true)
    }

    /// `runs` first calls, each of an order never seen.
    fn firsts(&self, toolbox: &Toolbox, runs: usize) -> Duration {
        let args = (0..runs)
            .map(|_| {
                let n = self.fresh.fetch_add(1, Ordering::Relaxed);
                json!({"order": format!("first-{n}"), "amount": 7})
            })
            .collect();
        self.calls(toolbox, args, false)
    }

    fn calls(&self, toolbox: &Toolbox, args: Vec<Value>, replay: bool) -> Duration {
        self.rt.block_on(async {
            let start = Instant::now();
            for args in args {
                let out = toolbox.call("charge", args, &self.ctx).await.unwrap();
                assert_eq!(out.replayed, replay);
            }
            start.elapsed()
        })
    }

    /// Criterion's rows, then (on a whole run) the side-by-side lines. `raw` reads the live
    /// record's outcome from the history's table directly, `runs` times; `replays` and `firsts`
    /// are the runs per round of each line.
    fn measure(
        &self,
        c: &mut Criterion,
        raw: Option<&dyn Fn(usize) -> Duration>,
        replays: usize,
        firsts: usize,
    ) {
        let records = records();
        let mut group = c.benchmark_group(format!("history/{}", self.name));
        group.bench_function(format!("replay, {records} expired"), |b| {
            b.iter_custom(|iters| self.replays(&self.history, iters as usize))
        });
        group.bench_function("replay, empty", |b| {
            b.iter_custom(|iters| self.replays(&self.empty, iters as usize))
        });
        if let Some(raw) = raw {
            group.bench_function(format!("raw read, {records} expired"), |b| {
                b.iter_custom(|iters| raw(iters as usize))
            });
        }
        group.bench_function(format!("first call, {records} expired"), |b| {
            b.iter_custom(|iters| self.firsts(&self.history, iters as usize))
        });
        group.bench_function("first call, empty", |b| {
            b.iter_custom(|iters| self.firsts(&self.empty, iters as usize))
        });
        group.finish();
        if !whole_run() {
            return;
        }
        let name = self.name;
        if let Some(raw) = raw {
            side_by_side(
                &format!(
                    "history/{name}: a replay through Toolbox::call, {records} expired records \
                     held, against a raw primary-key read of its outcome"
                ),
                replays,
                |runs| self.replays(&self.history, runs),
                raw,
            );
        }
        side_by_side(
            &format!(
                "history/{name}: a replay through Toolbox::call, {records} expired records held, \
                 against the same on an empty store"
            ),
            replays,
            |runs| self.replays(&self.history, runs),
            |runs| self.replays(&self.empty, runs),
        );
        side_by_side(
            &format!(
                "history/{name}: a first call through Toolbox::call, {records} expired records \
                 held, against the same on an empty store"
            ),
            firsts,
            |runs| self.firsts(&self.history, runs),
            |runs| self.firsts(&self.empty, runs),
        );
    }
}

fn memory(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let history = MemoryStore::new();
    // Kept a millisecond: expired by the time the fill ends.
    rt.block_on(async {
        let fp = toolkey::Fingerprint::of(&json!({"order": "old", "amount": 7})).unwrap();
        let outcome = Outcome::Ok(json!(7));
        for n in 0..records() {
            let key = RecordKey::new(HISTORY, format!("old-{n:07}"));
            store_first_run_kept(&history, &key, &fp, &outcome, Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    });
    let pair = Pair::new(
        rt,
        "memory",
        Arc::new(history),
        Arc::new(MemoryStore::new()),
    );
    pair.measure(c, None, 4_000, 4_000);
}

fn sqlite(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let (path, empty_path) = (dir.path().join("history.db"), dir.path().join("empty.db"));
    let history = SqliteStore::open(&path).unwrap();
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    {
        let tx = conn.transaction().unwrap();
        let mut insert = tx
            .prepare(
                "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint, since_ms,
                     lease_until_ms, outcome, completed_at_ms, expires_at_ms, tool)
                 VALUES (?1, ?2, 'completed', ?3, 'fp', ?4, ?4, ?5, ?4, ?6, 'charge')",
            )
            .unwrap();
        let (at, text) = (now_ms() - 2 * DAY_MS, outcome_text());
        for n in 0..records() {
            insert
                .execute(rusqlite::params![
                    HISTORY,
                    format!("old-{n:07}"),
                    format!("t-{n}"),
                    at,
                    text,
                    at + DAY_MS,
                ])
                .unwrap();
        }
        drop(insert);
        tx.commit().unwrap();
    }
    let empty = SqliteStore::open(&empty_path).unwrap();
    let pair = Pair::new(rt, "sqlite", Arc::new(history), Arc::new(empty));
    let key: String = conn
        .query_row(
            "SELECT key FROM toolkey_records WHERE tenant = ?1",
            [CALLS],
            |row| row.get(0),
        )
        .unwrap();
    let raw = |runs: usize| {
        let start = Instant::now();
        for _ in 0..runs {
            let mut read = conn
                .prepare_cached(
                    "SELECT outcome FROM toolkey_records WHERE tenant = ?1 AND key = ?2",
                )
                .unwrap();
            let outcome: String = read
                .query_row(rusqlite::params![CALLS, key], |row| row.get(0))
                .unwrap();
            assert!(!outcome.is_empty());
        }
        start.elapsed()
    };
    pair.measure(c, Some(&raw), 2_000, 40);
}

fn postgres(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    const TABLES: [&str; 2] = ["toolkey_history_bench", "toolkey_history_empty"];
    let drop_tables = TABLES
        .iter()
        .map(|t| {
            format!(
                "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_failures; \
                 DELETE FROM toolkey_schema_version WHERE table_name = '{t}';"
            )
        })
        .collect::<String>();
    let (history, empty, pool) = rt.block_on(async {
        let pool = connect().await.2.pool;
        let client = pool.get().await.unwrap();
        client.batch_execute(&drop_tables).await.unwrap();
        let mut stores = Vec::new();
        for table in TABLES {
            let store = PostgresStore::builder(PG_URL)
                .table(table)
                .connect()
                .await
                .unwrap();
            // Autovacuum off, and never analysed: the planner knows nothing of the rows.
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} SET (autovacuum_enabled = false);
                     ALTER TABLE {table}_failures SET (autovacuum_enabled = false);"
                ))
                .await
                .unwrap();
            stores.push(store);
        }
        client
            .execute(
                &format!(
                    "INSERT INTO {} (tenant, key, state, token, fingerprint, since, lease_until,
                         outcome, completed_at, expires_at, tool)
                     SELECT $1, 'old-' || lpad(g::text, 7, '0'), 'completed', 't-' || g, 'fp',
                         now() - interval '2 days', now() - interval '2 days', $2,
                         now() - interval '2 days', now() - interval '1 day', 'charge'
                     FROM generate_series(1, $3::int8) g",
                    TABLES[0]
                ),
                &[&HISTORY, &outcome_text(), &(records() as i64)],
            )
            .await
            .unwrap();
        drop(client);
        let empty = stores.pop().unwrap();
        (stores.pop().unwrap(), empty, pool)
    });
    let pair = Pair::new(rt, "postgres", Arc::new(history), Arc::new(empty));
    let key: String = rt.block_on(async {
        let client = pool.get().await.unwrap();
        let sql = format!("SELECT key FROM {} WHERE tenant = $1", TABLES[0]);
        client.query_one(&sql, &[&CALLS]).await.unwrap().get(0)
    });
    let read = format!(
        "SELECT outcome FROM {} WHERE tenant = $1 AND key = $2",
        TABLES[0]
    );
    let raw = |runs: usize| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..runs {
                let client = pool.get().await.unwrap();
                let st = client.prepare_cached(&read).await.unwrap();
                let row = client.query_one(&st, &[&CALLS, &key]).await.unwrap();
                let outcome: String = row.get(0);
                assert!(!outcome.is_empty());
            }
            start.elapsed()
        })
    };
    pair.measure(c, Some(&raw), 100, 40);
    drop(pair);
    rt.block_on(async {
        let client = pool.get().await.unwrap();
        client.batch_execute(&drop_tables).await.unwrap();
    });
}

fn redis_store(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    // The history and the empty store each in a database of its own (14 and 15), under a
    // prefix of the bench's own: the empty store's keyspace holds none of the history, and a
    // `SCAN` of database 0 by other work does not walk it.
    const PREFIX: &str = "toolkey-history-bench";
    const HISTORY_URL: &str = "redis://127.0.0.1:6379/14";
    const EMPTY_URL: &str = "redis://127.0.0.1:6379/15";
    let mut conn = rt.block_on(async {
        let client = redis::Client::open(HISTORY_URL).unwrap();
        redis::aio::ConnectionManager::new(client).await.unwrap()
    });
    let script = redis::Script::new(
        r#"
        for n = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          local key = ARGV[3] .. string.format('%07d', n)
          redis.call('HSET', key, 'state', 'completed', 'token', 't-' .. n, 'fp', 'fp',
            'since', ARGV[4], 'lease_until', ARGV[4], 'outcome', ARGV[5],
            'completed_at', ARGV[4], 'expires_at', ARGV[4] + 86400000, 'tool', 'charge')
          redis.call('PEXPIRE', key, 3600000)
        end
        return 1
        "#,
    );
    rt.block_on(clear_redis(PREFIX, &[REDIS_URL, HISTORY_URL, EMPTY_URL]));
    let records = records();
    let batches = || {
        (0..records)
            .step_by(1_000)
            .map(move |start| (start, (start + 1_000).min(records) - 1))
    };
    let history_keys = format!("{PREFIX}:{HISTORY}:old-");
    rt.block_on(async {
        let at = now_ms() - 2 * DAY_MS;
        for (from, to) in batches() {
            let _: i64 = script
                .arg(from)
                .arg(to)
                .arg(&history_keys)
                .arg(at)
                .arg(outcome_text())
                .invoke_async(&mut conn)
                .await
                .unwrap();
        }
    });
    let (history, empty) = rt.block_on(async {
        let history = RedisStore::builder(HISTORY_URL).prefix(PREFIX).connect();
        let empty = RedisStore::builder(EMPTY_URL).prefix(PREFIX).connect();
        (history.await.unwrap(), empty.await.unwrap())
    });
    let pair = Pair::new(rt, "redis", Arc::new(history), Arc::new(empty));
    // The live record's key, read where it is alone with its own first calls: the empty
    // store's database (both stores write one key for one call).
    let mut keys = rt.block_on(keys_under(EMPTY_URL, &format!("{PREFIX}:{CALLS}:")));
    assert_eq!(
        keys.len(),
        1,
        "the live record's key, and no other: {keys:?}"
    );
    let key = keys.pop().unwrap();
    let raw = |runs: usize| {
        rt.block_on(async {
            let mut conn = conn.clone();
            let start = Instant::now();
            for _ in 0..runs {
                let outcome: String = redis::cmd("HGET")
                    .arg(&key)
                    .arg("outcome")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(!outcome.is_empty());
            }
            start.elapsed()
        })
    };
    pair.measure(c, Some(&raw), 200, 100);
    drop(pair);
    rt.block_on(clear_redis(PREFIX, &[REDIS_URL, HISTORY_URL, EMPTY_URL]));
}

/// Every key under `prefix` in the database at `url`, found by `SCAN` (whose steps each answer
/// quickly, where a `KEYS` over a million keys would outlast the client's timeout).
async fn keys_under(url: &str, prefix: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (mut cursor, mut keys) = (0u64, Vec::new());
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(found);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Removes every key under `prefix` (the store's version key too) from each database: what an
/// interrupted run left, or this run's.
async fn clear_redis(prefix: &str, urls: &[&str]) {
    for url in urls {
        let keys = keys_under(url, prefix).await;
        let client = redis::Client::open(*url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for chunk in keys.chunks(1_000) {
            let _: i64 = redis::cmd("UNLINK")
                .arg(chunk)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    if runs_store("memory") {
        memory(&mut c, &rt);
    }
    if runs_store("sqlite") {
        sqlite(&mut c, &rt);
    }
    if runs_store("postgres") {
        postgres(&mut c, &rt);
    }
    if runs_store("redis") {
        redis_store(&mut c, &rt);
    }
    c.final_summary();
}
