//! The server stores next to the same server work written directly with the client crates, so the
//! stores' own overhead reads as a ratio.
//!
//! For each of PostgreSQL and Redis: the reserve and complete of a fresh key, the get of a
//! completed key, and a replay (a reserve that meets the completed key); once through the store,
//! once as the same statements (PostgreSQL: the prepared reserve statement and `UPDATE`, each on
//! a client from a deadpool pool) or the same `EVALSHA` calls (Redis, on a `ConnectionManager`).
//! The direct statements and scripts mirror those in `runtime/src/store/{postgres,redis}.rs`; a
//! replay is compared with the direct get, the least a replay can cost. For SQLite: the store
//! against raw rusqlite on the same file at the same durability (WAL, `synchronous = FULL`), the
//! raw side called inline, without the blocking-pool hop the store makes: the floor.
//!
//! Needs the servers of the store tests (`bash .ci/services.sh`):
//! `cargo bench -p toolkey-tests --features postgres,redis --bench stores`.
//!
//! One run on 2026-11-30 on the 2-core development machine (PostgreSQL 15 and Redis 7.0 on loopback; median of
//! 20 samples; each group's rows side by side in one run; differences within a few percent are
//! noise there):
//!
//! | operation                          | store    | direct   | store / direct |
//! |------------------------------------|----------|----------|----------------|
//! | postgres reserve+complete          | 568 µs   | 531 µs   | 1.07           |
//! | postgres get                       | 109 µs   | 102 µs   | 1.07           |
//! | postgres replay (direct: get)      | 151 µs   | 102 µs   | 1.48           |
//! | redis reserve+complete             | 200 µs   | 195 µs   | 1.03           |
//! | redis get                          | 90 µs    | 89 µs    | 1.01           |
//! | redis replay (direct: get)         | 113 µs   | 89 µs    | 1.27           |
//! | sqlite reserve+complete            | 391 µs   | 273 µs   | 1.43           |
//! | sqlite replay (direct: the SELECT) | 28.6 µs  | 2.6 µs   | 11             |
//!
//! The SQLite rows again on 2026-12-01, idle machine, once a reserve that meets a live record
//! reads it on the caller's thread when the inline connection is free (no blocking-pool hop):
//! replay 3.90 µs against the raw SELECT's 2.48 µs (1.57×); reserve+complete 401 µs against
//! 299 µs (1.34×: the store's two hops to the blocking pool, its second read under the write
//! lock, the retry limit's count and a savepoint per write, beside the raw side's inline
//! statements).
//!
//! On 2026-12-01 on a slower machine, once the writer lingers for the next write (the old and
//! new binaries side by side, A B A B): reserve+complete 735 µs and 652 µs before, 578 µs and
//! 540 µs after, against the raw side's 438–570 µs (this disk's flushes vary from run to run);
//! with the file on tmpfs, where a flush costs almost nothing, 128 µs before and 107 µs after,
//! against the raw side's 54 µs.
//!
//! A whole run (no filter; or any run with `TOOLKEY_BENCH_RATIOS=1`) also sets the SQLite store
//! beside raw rusqlite side by side: 21 rounds in which each side makes its runs in turn, the
//! side going first alternating, and the median of the rounds' ratios, so that a disk whose
//! flushes vary from minute to minute slows both sides alike. Five runs on 2026-12-02 on a 2-core
//! machine: a first run (reserve + complete) 1.07×, 1.10×, 1.12×, 1.08× and 1.05× raw
//! rusqlite's (280–325 µs against 262–302 µs), a replay 1.78×, 1.77×, 1.78×, 1.75× and 1.66×
//! the raw `SELECT` (2.1–2.2 µs against 1.2–1.3 µs). With the file on tmpfs, where a flush costs
//! almost nothing, a first run took 30.6 µs against 17.2 µs in one run and 92.9 µs against
//! 18.8 µs in the next: what the store adds is its own reads and the hand-offs to and from the
//! writer's thread.
//!
//! `replay/cached` is a replay through a [`CachedStore`] that holds the record: no round trip.
//! A second run the same day, while other builds loaded both cores (so the server rows are
//! noisier): postgres replay 93.9 µs through the store, 384 ns through the cache (0.0041×);
//! redis replay 78.3 µs, cached 384 ns (0.0049×); direct gets 60.3 µs and 58.6 µs.

//!
//! `redis-cluster` runs the Redis store on the six-node cluster of `.ci/services.sh` (three
//! primaries, one replica each, on loopback), without and with `wait_for_replicas(1, 1s)`. One run
//! on 2026-11-30 on the same machine, while other builds loaded both cores (median of 20 samples):
//!
//! | reserve+complete             | without WAIT | with WAIT 1 | with / without |
//! |------------------------------|--------------|-------------|----------------|
//! | one at a time                | 679 µs       | 985 µs      | 1.45           |
//! | 32 at once                   | 3.12 ms      | 10.4 ms     | 3.33           |
//!
//! One at a time, `WAIT` adds a replication round trip to each transition. Many at once, it costs
//! more: a `WAIT` blocks the node's connection, which the store shares among its calls, so the
//! calls behind it queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use redis::Script;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;
use toolkey::store::{
    CachedStore, Outcome, RecordKey, RedisStore, Reservation, Reservations, SqliteStore, Store,
    Token,
};
use toolkey::{tool, Fingerprint, ToolContext, ToolError, Toolbox};
use toolkey_tests::direct::*;
use toolkey_tests::rounds::*;

const REDIS_CLUSTER_URLS: [&str; 3] = [
    "redis://127.0.0.1:7000",
    "redis://127.0.0.1:7001",
    "redis://127.0.0.1:7002",
];

fn fresh(n: &AtomicU64) -> String {
    format!("k{}", n.fetch_add(1, Ordering::Relaxed))
}

fn stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tenant = format!("bench-{}", Token::generate());
    let fp = Fingerprint::of(&json!({"customer": "acme", "period": "2026-10"})).unwrap();
    let outcome = Outcome::Ok(json!({"invoice": "inv-1", "amount": 100.5}));
    let lease = Duration::from_millis(LEASE_MS as u64);
    let n = AtomicU64::new(0);

    let (pg, redis_store, direct) = rt.block_on(connect());
    let (pool, mut redis_conn) = (&direct.pool, direct.redis.clone());

    // A completed record each variant reads.
    let done = RecordKey::new(tenant.clone(), "done");
    let retain_long = Duration::from_secs(600);
    rt.block_on(async {
        for store in [&pg as &dyn Store, &redis_store] {
            let Reservation::Reserved { token, .. } = store
                .reserve(
                    &done,
                    "tool",
                    &fp,
                    &toolkey::store::Token::generate(),
                    lease,
                )
                .await
                .unwrap()
            else {
                panic!("the bench's key is taken")
            };
            assert!(store
                .complete(&done, &token, &outcome, retain_long)
                .await
                .unwrap());
        }
    });

    let mut group = c.benchmark_group("postgres");
    group.bench_function("reserve+complete/store", |b| {
        b.to_async(&rt).iter(|| async {
            let key = RecordKey::new(tenant.clone(), fresh(&n));
            store_first_run(&pg, &key, &fp, &outcome).await
        })
    });
    let get = pg_get();
    let (fp_hex, outcome_text) = (fp.to_hex(), outcome.to_stored());
    group.bench_function("reserve+complete/direct", |b| {
        b.to_async(&rt).iter(|| async {
            let key = fresh(&n);
            direct
                .pg_first_run(&tenant, &key, &fp_hex, &outcome_text)
                .await
        })
    });
    group.bench_function("get/store", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(pg.get(&done).await.unwrap().is_some()) })
    });
    group.bench_function("replay/store", |b| {
        b.to_async(&rt).iter(|| async {
            let answer = pg
                .reserve(&done, "tool", &fp, &Token::generate(), lease)
                .await;
            assert!(matches!(answer, Ok(Reservation::Existing(_))));
        })
    });
    let cached = CachedStore::new(pg.clone(), 1 << 20);
    group.bench_function("replay/cached", |b| {
        b.to_async(&rt).iter(|| async {
            let answer = cached
                .reserve(&done, "tool", &fp, &Token::generate(), lease)
                .await;
            assert!(matches!(answer, Ok(Reservation::Existing(_))));
        })
    });
    group.bench_function("get/direct", |b| {
        b.to_async(&rt).iter(|| async {
            let client = pool.get().await.unwrap();
            let st = client.prepare_cached(&get).await.unwrap();
            let row = client.query_opt(&st, &[&tenant, &"done"]).await.unwrap();
            assert!(row.is_some());
        })
    });
    group.finish();

    let get = Script::new(&format!("{LUA_PRELUDE}{LUA_GET}"));
    let direct_done = format!("toolkey-bench-direct:{tenant}:done");
    rt.block_on(direct.redis_first_run(&direct_done, &fp_hex, &outcome_text, 600_000));
    let mut group = c.benchmark_group("redis");
    group.bench_function("reserve+complete/store", |b| {
        b.to_async(&rt).iter(|| async {
            let key = RecordKey::new(tenant.clone(), fresh(&n));
            store_first_run(&redis_store, &key, &fp, &outcome).await
        })
    });
    group.bench_function("reserve+complete/direct", |b| {
        b.to_async(&rt).iter(|| async {
            let key = format!("toolkey-bench-direct:{tenant}:{}", fresh(&n));
            direct
                .redis_first_run(&key, &fp_hex, &outcome_text, RETAIN_MS)
                .await
        })
    });
    group.bench_function("get/store", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(redis_store.get(&done).await.unwrap().is_some()) })
    });
    group.bench_function("replay/store", |b| {
        b.to_async(&rt).iter(|| async {
            let answer = redis_store
                .reserve(&done, "tool", &fp, &Token::generate(), lease)
                .await;
            assert!(matches!(answer, Ok(Reservation::Existing(_))));
        })
    });
    let cached = CachedStore::new(redis_store.clone(), 1 << 20);
    group.bench_function("replay/cached", |b| {
        b.to_async(&rt).iter(|| async {
            let answer = cached
                .reserve(&done, "tool", &fp, &Token::generate(), lease)
                .await;
            assert!(matches!(answer, Ok(Reservation::Existing(_))));
        })
    });
    group.bench_function("get/direct", |b| {
        b.to_async(&rt).iter(|| async {
            let reply: Vec<Option<Vec<u8>>> = get
                .key(&direct_done)
                .invoke_async(&mut redis_conn.clone())
                .await
                .unwrap();
            assert_eq!(reply[0].as_deref(), Some(&b"record"[..]));
        })
    });
    group.finish();

    // SQLite: the store against raw rusqlite on the same file, at the same durability (WAL,
    // synchronous = FULL), the raw side with no blocking-pool hop: the floor.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let lite = SqliteStore::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "journal_mode", "WAL").unwrap();
    raw.pragma_update(None, "synchronous", "FULL").unwrap();
    rt.block_on(async {
        let Reservation::Reserved { token, .. } = lite
            .reserve(&done, "tool", &fp, &Token::generate(), lease)
            .await
            .unwrap()
        else {
            panic!("the bench's key is taken")
        };
        assert!(lite
            .complete(&done, &token, &outcome, retain_long)
            .await
            .unwrap());
    });
    // The raw side of a first run: the same two statements, each in its own durable commit.
    let raw_first_run =
        || {
            let (key, token) = (fresh(&n), Token::generate());
            let now = 1_000_000_i64;
            raw.execute_batch("BEGIN IMMEDIATE").unwrap();
            let inserted = raw
            .prepare_cached(
                "INSERT INTO toolkey_records (state, token, fingerprint, since_ms, lease_until_ms,
                     outcome, completed_at_ms, expires_at_ms, tenant, key)
                 VALUES ('in_progress', ?3, ?4, ?5, ?6, NULL, NULL, NULL, ?1, ?2)
                 ON CONFLICT (tenant, key) DO NOTHING",
            )
            .unwrap()
            .execute(rusqlite::params![tenant, key, token.as_str(), fp_hex, now, now + LEASE_MS])
            .unwrap();
            raw.execute_batch("COMMIT").unwrap();
            assert_eq!(inserted, 1);
            raw.execute_batch("BEGIN IMMEDIATE").unwrap();
            let changed = raw
                .prepare_cached(
                    "UPDATE toolkey_records SET state = 'completed', outcome = ?4,
                     completed_at_ms = ?5, expires_at_ms = ?6
                 WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'",
                )
                .unwrap()
                .execute(rusqlite::params![
                    tenant,
                    key,
                    token.as_str(),
                    outcome_text,
                    now,
                    now + RETAIN_MS
                ])
                .unwrap();
            raw.execute_batch("COMMIT").unwrap();
            assert_eq!(changed, 1);
        };
    let mut group = c.benchmark_group("sqlite");
    group.bench_function("reserve+complete/store", |b| {
        b.to_async(&rt).iter(|| async {
            let key = RecordKey::new(tenant.clone(), fresh(&n));
            store_first_run(&lite, &key, &fp, &outcome).await
        })
    });
    group.bench_function("reserve+complete/direct", |b| b.iter(raw_first_run));
    // The least a replay can cost: the indexed read of the stored outcome.
    let raw_replay = || {
        let outcome: Option<String> = raw
            .prepare_cached("SELECT outcome FROM toolkey_records WHERE tenant = ?1 AND key = ?2")
            .unwrap()
            .query_row(rusqlite::params![tenant, "done"], |row| row.get(0))
            .unwrap();
        assert!(outcome.is_some());
    };
    group.bench_function("replay/store", |b| {
        b.to_async(&rt).iter(|| async {
            let answer = lite
                .reserve(&done, "tool", &fp, &Token::generate(), lease)
                .await;
            assert!(matches!(answer, Ok(Reservation::Existing(_))));
        })
    });
    group.bench_function("replay/direct", |b| b.iter(raw_replay));
    group.finish();
    if whole_run() {
        let store_first_runs = |runs: usize| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..runs {
                    let key = RecordKey::new(tenant.clone(), fresh(&n));
                    store_first_run(&lite, &key, &fp, &outcome).await;
                }
                start.elapsed()
            })
        };
        side_by_side(
            "sqlite reserve+complete, the store against raw rusqlite",
            100,
            store_first_runs,
            |runs| timed(runs, &raw_first_run),
        );
        let store_replays = |runs: usize| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..runs {
                    let answer = lite
                        .reserve(&done, "tool", &fp, &Token::generate(), lease)
                        .await;
                    assert!(matches!(answer, Ok(Reservation::Existing(_))));
                }
                start.elapsed()
            })
        };
        side_by_side(
            "sqlite replay, the store against the raw SELECT",
            2_000,
            store_replays,
            |runs| timed(runs, &raw_replay),
        );
        through_toolbox(&rt, &path, &tenant, &raw_first_run, &raw_replay);
    }

    // Leave the test database as the bench found it.
    rt.block_on(async {
        let client = pool.get().await.unwrap();
        client
            .execute("DELETE FROM toolkey_records WHERE tenant = $1", &[&tenant])
            .await
            .unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(&direct_done)
            .query_async(&mut redis_conn)
            .await
            .unwrap();
    });
}

/// An invoice, as the raw side's outcome holds it.
#[derive(Serialize, JsonSchema)]
struct Invoice {
    invoice: String,
    amount: f64,
}

/// Send an invoice.
#[tool(idempotent(key = "invoice:<customer>:<period>"))]
async fn send_invoice(customer: String, period: String) -> Result<Invoice, ToolError> {
    let _ = (customer, period);
    Ok(Invoice {
        invoice: "inv-1".into(),
        amount: 100.5,
    })
}

/// The SQLite rows as an application meets them: a keyed tool's first call and replay through
/// `Toolbox::call`, on a store over the same file, beside raw rusqlite's reserve + complete and
/// its indexed `SELECT` of the outcome (the same sides as the store-level lines above). The
/// caller is the runtime's `block_on`, as for the store-level lines.
fn through_toolbox(
    rt: &tokio::runtime::Runtime,
    path: &std::path::Path,
    tenant: &str,
    raw_first_run: &dyn Fn(),
    raw_replay: &dyn Fn(),
) {
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(path).unwrap())
        .tool(SendInvoice)
        .build()
        .unwrap();
    let ctx = ToolContext::new("bench").with_tenant(tenant);
    // `runs` calls of `send_invoice`, their arguments made before the clock starts.
    let calls = |args: Vec<serde_json::Value>, replay: bool| {
        rt.block_on(async {
            let start = Instant::now();
            for args in args {
                let out = toolbox.call("send_invoice", args, &ctx).await.unwrap();
                assert_eq!(out.replayed, replay);
            }
            start.elapsed()
        })
    };
    let mut fresh = 0u64;
    side_by_side(
        "sqlite first call through Toolbox::call, against raw rusqlite's reserve+complete",
        100,
        |runs| {
            let args = (0..runs)
                .map(|_| {
                    fresh += 1;
                    json!({"customer": format!("t{fresh}"), "period": "2026-10"})
                })
                .collect();
            calls(args, false)
        },
        |runs| timed(runs, raw_first_run),
    );
    // The same first calls made from a task on the runtime's workers, as a server's request
    // handlers make them: a call whose work waits moves it to a task of its own, which starts on
    // the caller's worker, where `block_on`'s caller, outside the runtime, wakes a worker for it
    // and is woken back.
    let shared = std::sync::Arc::new(toolbox);
    let on_a_worker = |args: Vec<serde_json::Value>| {
        let (toolbox, ctx) = (shared.clone(), ctx.clone());
        rt.block_on(rt.spawn(async move {
            let start = Instant::now();
            for args in args {
                let out = toolbox.call("send_invoice", args, &ctx).await.unwrap();
                assert!(!out.replayed);
            }
            start.elapsed()
        }))
        .unwrap()
    };
    side_by_side(
        "sqlite first call through Toolbox::call from a task on a worker, against raw rusqlite's reserve+complete",
        100,
        |runs| {
            let args = (0..runs)
                .map(|_| {
                    fresh += 1;
                    json!({"customer": format!("t{fresh}"), "period": "2026-10"})
                })
                .collect();
            on_a_worker(args)
        },
        |runs| timed(runs, raw_first_run),
    );
    let toolbox = &*shared;
    let calls = |args: Vec<serde_json::Value>, replay: bool| {
        rt.block_on(async {
            let start = Instant::now();
            for args in args {
                let out = toolbox.call("send_invoice", args, &ctx).await.unwrap();
                assert_eq!(out.replayed, replay);
            }
            start.elapsed()
        })
    };
    let replayed = json!({"customer": "acme", "period": "2026-10"});
    rt.block_on(toolbox.call("send_invoice", replayed.clone(), &ctx))
        .unwrap();
    side_by_side(
        "sqlite replay through Toolbox::call, against the raw SELECT",
        2_000,
        |runs| calls(vec![replayed.clone(); runs], true),
        |runs| timed(runs, raw_replay),
    );
}

/// The Redis store on the cluster `.ci/services.sh` starts, without and with waiting for a
/// replica: one reserve+complete at a time, and 32 at once (the store shares one connection per
/// node, which a `WAIT` blocks until the replica answers).
fn cluster(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tenant = format!("bench-{}", Token::generate());
    let fp = Fingerprint::of(&json!({"customer": "acme", "period": "2026-10"})).unwrap();
    let outcome = Outcome::Ok(json!({"invoice": "inv-1", "amount": 100.5}));
    let (lease, retain) = (
        Duration::from_millis(LEASE_MS as u64),
        Duration::from_millis(RETAIN_MS as u64),
    );
    let n = AtomicU64::new(0);
    let (plain, waiting) = rt.block_on(async {
        let connect = |wait: bool| {
            let mut builder = RedisStore::cluster_builder(REDIS_CLUSTER_URLS);
            if wait {
                builder = builder.wait_for_replicas(1, Duration::from_secs(1));
            }
            builder.connect()
        };
        (
            connect(false)
                .await
                .expect("the Redis Cluster for the bench (bash .ci/services.sh)"),
            connect(true).await.unwrap(),
        )
    });
    let once = |store: &RedisStore| {
        let key = RecordKey::new(tenant.clone(), fresh(&n));
        let (store, fp, outcome) = (store.clone(), fp, outcome.clone());
        async move {
            let Reservation::Reserved { token, .. } = store
                .reserve(&key, "tool", &fp, &Token::generate(), lease)
                .await
                .unwrap()
            else {
                panic!("fresh key taken")
            };
            assert!(store
                .complete(&key, &token, &outcome, retain)
                .await
                .unwrap());
        }
    };
    let mut group = c.benchmark_group("redis-cluster");
    for (name, store) in [("store", &plain), ("wait", &waiting)] {
        group.bench_function(format!("reserve+complete/{name}"), |b| {
            b.to_async(&rt).iter(|| once(store))
        });
        group.bench_function(format!("32 concurrent reserve+complete/{name}"), |b| {
            b.to_async(&rt).iter(|| async {
                let calls: Vec<_> = (0..32).map(|_| tokio::spawn(once(store))).collect();
                for call in calls {
                    call.await.unwrap();
                }
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = stores, cluster
}
criterion_main!(benches);
