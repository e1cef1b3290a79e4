//! What a store costs as it grows: the memory store's bytes per record at a million records, and
//! a reserve's cost with a thousand records held against the same with a million, on every store.
//!
//! Bytes per record are read two ways after a million first runs (reserve, then complete with a
//! small integer result): the bytes the program asked the allocator for, counted by this
//! binary's global allocator, and the growth of the process's resident memory (which adds the
//! allocator's own rounding and bookkeeping). Each is printed beside the stored result's length.
//!
//! A reserve's cost is measured on a fresh key, released again so the store keeps its size: a
//! thousand records held, then a million (the store is filled between the two, the records the
//! stores would write for completed calls), side by side in one run. The server stores use a
//! table (PostgreSQL) or a key prefix (Redis) of their own, removed at the end.
//!
//! A whole run (no filter; or any run with `TOOLKEY_BENCH_RATIOS=1`) also sets the memory store's
//! two sizes side by side: a second store holds a thousand records, and rounds of reserves
//! alternate between the two. Three runs on 2026-12-02 on a 2-core machine: 1.73×, 1.79× and
//! 1.86× (559–609 ns against 304–346 ns), where criterion's rows of the same runs gave 1.64×,
//! 1.83× and 1.66×.
//!
//! Needs the servers of the store tests (`bash .ci/services.sh`):
//! `cargo bench -p toolkey-tests --all-features --bench scale`; `TOOLKEY_SCALE_STORES=memory`
//! runs the memory store's part alone. `TOOLKEY_SCALE_RECORDS` sets the
//! larger size (a million unless set); the figures of a run are in README.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use criterion::Criterion;
use serde_json::json;
use toolkey::store::{
    MemoryStore, Outcome, PostgresStore, RecordKey, RedisStore, Reservation, SqliteStore, Store,
    Token,
};
use toolkey::Fingerprint;
use toolkey_tests::direct::*;
use toolkey_tests::rounds::*;

/// Counts the bytes the program holds from the allocator (asked for, not rounded).
struct Counting;

static HELD: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The process's resident memory in bytes, from `/proc/self/statm` (0 where there is none).
fn resident() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// How many records the larger store holds.
fn large() -> u64 {
    std::env::var("TOOLKEY_SCALE_RECORDS")
        .ok()
        .map(|n| n.parse().expect("TOOLKEY_SCALE_RECORDS is a number"))
        .unwrap_or(1_000_000)
}

const SMALL: u64 = 1_000;
const TENANT: &str = "scale";

fn fingerprint() -> Fingerprint {
    Fingerprint::of(&json!({"customer": "acme", "period": "2026-10"})).unwrap()
}

/// The result every record holds: a small integer.
fn outcome() -> Outcome {
    Outcome::Ok(json!(7))
}

/// Fills `store` with first runs of keys `seed-<from>` to `seed-<to - 1>`, each kept an hour.
async fn fill(store: &dyn Store, from: u64, to: u64) {
    let (fp, outcome) = (fingerprint(), outcome());
    for n in from..to {
        let key = RecordKey::new(TENANT, format!("seed-{n:07}"));
        store_first_run_kept(store, &key, &fp, &outcome, Duration::from_secs(3600)).await;
    }
}

/// `from..to` in runs of at most 10,000, as inclusive bounds: what one script call fills or
/// clears.
fn batches(from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> {
    (from..to)
        .step_by(10_000)
        .map(move |start| (start, (start + 10_000).min(to) - 1))
}

/// The memory store's bytes per record after `large()` first runs.
fn memory_per_record(rt: &tokio::runtime::Runtime) {
    let records = large();
    let store = MemoryStore::new();
    // Settle the runtime's and the store's first allocations before the count starts.
    rt.block_on(fill(&store, 0, 1));
    let (held, rss) = (HELD.load(Ordering::Relaxed), resident());
    rt.block_on(fill(&store, 1, records + 1));
    let held = (HELD.load(Ordering::Relaxed) - held) as f64 / records as f64;
    let rss = (resident() - rss) as f64 / records as f64;
    let stored = outcome().to_stored().len();
    println!(
        "memory store, {records} records of a {stored}-byte result: {held:.0} bytes asked of the \
         allocator per record, {rss:.0} bytes of resident memory per record"
    );
    drop(store);
}

/// A reserve of a fresh key, released again: the store keeps its size.
async fn reserve_and_release(store: &dyn Store, n: &AtomicU64, fp: &Fingerprint) {
    let key = RecordKey::new(
        TENANT,
        format!("fresh-{}", n.fetch_add(1, Ordering::Relaxed)),
    );
    let lease = Duration::from_millis(LEASE_MS as u64);
    let Reservation::Reserved { token, .. } = store
        .reserve(&key, "tool", fp, &Token::generate(), lease)
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    assert!(store.release(&key, &token).await.unwrap());
}

/// `reserve at 1k` and `reserve at <large>` on `store`, filled in between by `grow` (which
/// fills from `SMALL` to `large()`).
fn sizes<F: std::future::Future<Output = ()>>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: &dyn Store,
    grow: impl FnOnce() -> F,
) {
    let (fp, n) = (fingerprint(), AtomicU64::new(0));
    let mut group = c.benchmark_group(format!("scale/{name}"));
    group.bench_function("reserve at 1k", |b| {
        b.to_async(rt).iter(|| reserve_and_release(store, &n, &fp))
    });
    rt.block_on(grow());
    group.bench_function(format!("reserve at {}", large()), |b| {
        b.to_async(rt).iter(|| reserve_and_release(store, &n, &fp))
    });
    group.finish();
}

fn scale(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let large = large();

    let memory = MemoryStore::new();
    rt.block_on(fill(&memory, 0, SMALL));
    sizes(c, rt, "memory", &memory, || fill(&memory, SMALL, large));
    if whole_run() {
        // The two sizes side by side: a second store holds a thousand records, and rounds of
        // reserves alternate between the two, so that drift over the run touches both alike.
        let small = MemoryStore::new();
        rt.block_on(fill(&small, 0, SMALL));
        let (fp, n) = (fingerprint(), AtomicU64::new(0));
        let reserves = |store: &MemoryStore, runs: usize| {
            rt.block_on(async {
                let start = std::time::Instant::now();
                for _ in 0..runs {
                    reserve_and_release(store, &n, &fp).await;
                }
                start.elapsed()
            })
        };
        side_by_side(
            &format!("memory store, a reserve with {large} records held against a thousand"),
            20_000,
            |runs| reserves(&memory, runs),
            |runs| reserves(&small, runs),
        );
    }
    drop(memory);
    // `TOOLKEY_SCALE_STORES=memory`: the memory store alone, with no server to fill.
    if std::env::var("TOOLKEY_SCALE_STORES").is_ok_and(|stores| stores == "memory") {
        return;
    }

    // SQLite: the larger file is filled in one transaction of rows as the store writes them.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scale.db");
    let lite = SqliteStore::open(&path).unwrap();
    rt.block_on(fill(&lite, 0, SMALL));
    let fill_lite = || async {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        let tx = conn.transaction().unwrap();
        {
            let mut insert = tx
                .prepare(
                    "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint,
                         since_ms, lease_until_ms, outcome, completed_at_ms, expires_at_ms, tool)
                     VALUES (?1, ?2, 'completed', ?3, ?4, ?5, ?5, ?6, ?5, ?7, 'tool')",
                )
                .unwrap();
            let now = chrono_ms();
            let (fp, text) = (fingerprint().to_hex(), outcome().to_stored());
            for n in SMALL..large {
                insert
                    .execute(rusqlite::params![
                        TENANT,
                        format!("seed-{n:07}"),
                        Token::generate().as_str(),
                        fp,
                        now,
                        text,
                        now + 3_600_000,
                    ])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
    };
    sizes(c, rt, "sqlite", &lite, fill_lite);
    drop(lite);

    // PostgreSQL: a table of the bench's own, filled by one statement.
    const TABLE: &str = "toolkey_scale_bench";
    // Whatever an interrupted run left: the table, its counters and its schema version.
    let drop_pg = format!(
        "DROP TABLE IF EXISTS {TABLE}; DROP TABLE IF EXISTS {TABLE}_failures; \
         DELETE FROM toolkey_schema_version WHERE table_name = '{TABLE}'"
    );
    let (pg, pool) = rt.block_on(async {
        let (_, _, direct) = connect().await;
        let pool = direct.pool;
        let client = pool.get().await.unwrap();
        client.batch_execute(&drop_pg).await.unwrap();
        drop(client);
        let pg = PostgresStore::builder(PG_URL)
            .table(TABLE)
            .connect()
            .await
            .unwrap();
        fill(&pg, 0, SMALL).await;
        (pg, pool)
    });
    let fill_pg = || async {
        let client = pool.get().await.unwrap();
        client
            .execute(
                &format!(
                    "INSERT INTO {TABLE} (tenant, key, state, token, fingerprint, since,
                         lease_until, outcome, completed_at, expires_at, tool)
                     SELECT $1, 'seed-' || lpad(g::text, 7, '0'), 'completed', 't-' || g, $2,
                         now(), now(), $3, now(), now() + interval '1 hour', 'tool'
                     FROM generate_series($4::int8, $5::int8) g"
                ),
                &[
                    &TENANT,
                    &fingerprint().to_hex(),
                    &outcome().to_stored(),
                    &(SMALL as i64),
                    &(large as i64 - 1),
                ],
            )
            .await
            .unwrap();
        client
            .batch_execute(&format!("ANALYZE {TABLE}"))
            .await
            .unwrap();
    };
    sizes(c, rt, "postgres", &pg, fill_pg);
    rt.block_on(async {
        let client = pool.get().await.unwrap();
        client.batch_execute(&drop_pg).await.unwrap();
    });

    // Redis: keys under a prefix of the bench's own, filled by a script in batches, as the
    // store writes a completed record (`<prefix>:<tenant>:<key>`, a hash).
    const PREFIX: &str = "toolkey-scale-bench";
    let (redis_store, conn) = rt.block_on(async {
        let redis_store = RedisStore::builder(REDIS_URL)
            .prefix(PREFIX)
            .connect()
            .await
            .unwrap();
        let conn = connect().await.2.redis;
        fill(&redis_store, 0, SMALL).await;
        (redis_store, conn)
    });
    // The layout the script writes is the store's: a record it wrote is where the script
    // would have put it.
    rt.block_on(async {
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("{PREFIX}:{TENANT}:seed-0000000"))
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        assert!(
            exists,
            "the Redis store's key layout changed: update the bench"
        );
    });
    let script = redis::Script::new(
        r#"
        for n = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          local key = ARGV[3] .. string.format('%07d', n)
          redis.call('HSET', key, 'state', 'completed', 'token', 't-' .. n, 'fp', ARGV[4],
            'since', ARGV[5], 'lease_until', ARGV[5], 'outcome', ARGV[6],
            'completed_at', ARGV[5], 'expires_at', ARGV[5] + 3600000, 'tool', 'tool')
          redis.call('PEXPIRE', key, 3600000)
        end
        return 1
        "#,
    );
    let fill_redis = || async {
        let mut conn = conn.clone();
        let now = chrono_ms();
        for (from, to) in batches(SMALL, large) {
            let _: i64 = script
                .arg(from)
                .arg(to)
                .arg(format!("{PREFIX}:{TENANT}:seed-"))
                .arg(fingerprint().to_hex())
                .arg(now)
                .arg(outcome().to_stored())
                .invoke_async(&mut conn)
                .await
                .unwrap();
        }
    };
    sizes(c, rt, "redis", &redis_store, fill_redis);
    rt.block_on(async {
        let mut conn = conn.clone();
        let script = redis::Script::new(
            r#"
            for n = tonumber(ARGV[1]), tonumber(ARGV[2]) do
              redis.call('UNLINK', ARGV[3] .. string.format('%07d', n))
            end
            return 1
            "#,
        );
        for (from, to) in batches(0, large) {
            let _: i64 = script
                .arg(from)
                .arg(to)
                .arg(format!("{PREFIX}:{TENANT}:seed-"))
                .invoke_async(&mut conn)
                .await
                .unwrap();
        }
    });
}

/// Now, in milliseconds since the epoch.
fn chrono_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    memory_per_record(&rt);
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    scale(&mut c, &rt);
    c.final_summary();
}
