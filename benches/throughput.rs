//! Throughput with many callers at once: 64 callers each reserving and completing a key of its
//! own (the store work of a first run), against one caller doing the same 64 in turn, and against
//! the same statements or scripts run directly with the client crates at the same concurrency.
//!
//! SQLite shares commits between concurrent writes (group commit), so 64 callers at once pay for
//! far fewer `fsync`s than 64 in turn, at the same durability (`synchronous = FULL`). PostgreSQL
//! and Redis are compared with their raw clients: the store's pool (16 connections) against a
//! deadpool pool of 16 running the same prepared statements; the store's multiplexed connection
//! against a `ConnectionManager` running the same scripts.
//!
//! Needs the servers of the store tests (`bash .ci/services.sh`):
//! `cargo bench -p toolkey-tests --features postgres,redis --bench throughput`. Criterion prints
//! each row's calls per second (`thrpt`); the figures of a run are in README.md.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::future::join_all;
use serde_json::json;
use toolkey::store::{Outcome, RecordKey, SqliteStore, Store, Token};
use toolkey::Fingerprint;
use toolkey_tests::direct::*;

/// How many callers run at once.
const CALLERS: usize = 64;

/// One first run's store work through `store`: reserve a fresh key, complete it.
async fn first_run(
    store: &dyn Store,
    tenant: &str,
    n: &AtomicU64,
    fp: &Fingerprint,
    outcome: &Outcome,
) {
    let key = RecordKey::new(tenant, format!("k{}", n.fetch_add(1, Ordering::Relaxed)));
    store_first_run(store, &key, fp, outcome).await
}

fn throughput(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tenant = format!("bench-{}", Token::generate());
    let fp = Fingerprint::of(&json!({"customer": "acme", "period": "2026-10"})).unwrap();
    let outcome = Outcome::Ok(json!({"invoice": "inv-1", "amount": 100.5}));
    let (fp_hex, outcome_text) = (fp.to_hex(), outcome.to_stored());
    let n = AtomicU64::new(0);

    // SQLite: 64 callers at once against one at a time, on the same file.
    let dir = tempfile::tempdir().unwrap();
    let lite = SqliteStore::open(dir.path().join("throughput.db")).unwrap();
    let mut group = c.benchmark_group("throughput/sqlite");
    group.throughput(Throughput::Elements(CALLERS as u64));
    group.bench_function("one caller", |b| {
        b.to_async(&rt).iter(|| async {
            for _ in 0..CALLERS {
                first_run(&lite, &tenant, &n, &fp, &outcome).await;
            }
        })
    });
    group.bench_function("64 callers", |b| {
        b.to_async(&rt)
            .iter(|| join_all((0..CALLERS).map(|_| first_run(&lite, &tenant, &n, &fp, &outcome))))
    });
    group.finish();

    let (pg, redis_store, direct) = rt.block_on(connect());

    let mut group = c.benchmark_group("throughput/postgres");
    group.throughput(Throughput::Elements(CALLERS as u64));
    group.bench_function("64 callers/store", |b| {
        b.to_async(&rt)
            .iter(|| join_all((0..CALLERS).map(|_| first_run(&pg, &tenant, &n, &fp, &outcome))))
    });
    let pg_direct = || async {
        let key = format!("k{}", n.fetch_add(1, Ordering::Relaxed));
        direct
            .pg_first_run(&tenant, &key, &fp_hex, &outcome_text)
            .await
    };
    group.bench_function("64 callers/direct", |b| {
        b.to_async(&rt)
            .iter(|| join_all((0..CALLERS).map(|_| pg_direct())))
    });
    group.finish();

    let mut group = c.benchmark_group("throughput/redis");
    group.throughput(Throughput::Elements(CALLERS as u64));
    group.bench_function("64 callers/store", |b| {
        b.to_async(&rt).iter(|| {
            join_all((0..CALLERS).map(|_| first_run(&redis_store, &tenant, &n, &fp, &outcome)))
        })
    });
    let redis_direct = || async {
        let key = format!(
            "toolkey-bench-direct:{tenant}:k{}",
            n.fetch_add(1, Ordering::Relaxed)
        );
        direct
            .redis_first_run(&key, &fp_hex, &outcome_text, RETAIN_MS)
            .await
    };
    group.bench_function("64 callers/direct", |b| {
        b.to_async(&rt)
            .iter(|| join_all((0..CALLERS).map(|_| redis_direct())))
    });
    group.finish();

    // Leave the test database as the bench found it (Redis records leave by their TTL).
    rt.block_on(async {
        let client = direct.pool.get().await.unwrap();
        client
            .execute("DELETE FROM toolkey_records WHERE tenant = $1", &[&tenant])
            .await
            .unwrap();
    });
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = throughput
}
criterion_main!(benches);
