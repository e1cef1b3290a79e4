//! The store conformance suite against a real PostgreSQL server, on the server's clock; and the
//! store failing closed when the server goes away, and recovering when it is back.
//!
//! The server is `TOOLKEY_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! An unreachable server fails these tests, naming `scripts/test.sh`, which starts it.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{
    Outcome, PostgresStore, Record, RecordKey, Reservation, Reservations, StoreError, Token,
};
use toolkey::Fingerprint;
use toolkey_tests::{conformance, servers};

const VAR: &str = "TOOLKEY_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The server's URL; an unreachable server fails the test.
async fn server() -> Option<String> {
    let url = servers::url(VAR, DEFAULT_URL);
    let probe = PostgresStore::builder(&url)
        .timeout(Duration::from_secs(3))
        .pool_size(1)
        .connect();
    match probe.await {
        Ok(_) => Some(url),
        Err(e) => {
            servers::unreachable("PostgreSQL", VAR, &url, e);
            None
        }
    }
}

/// `url` with one more connection parameter.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// A plain client beside the store, to do what an operator or a crash would.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn fp() -> Fingerprint {
    Fingerprint::of(&json!({"n": 1})).unwrap()
}

fn key(name: &str) -> RecordKey {
    RecordKey::new(format!("pg-test-{}", Token::generate()), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_conforms() {
    let Some(url) = server().await else { return };
    let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
    conformance::run(store, None).await;
}

/// A schema and table of the user's choosing are created by the migration, versioned, and used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_schema_and_table_are_migrated_once() {
    let Some(url) = server().await else { return };
    let build = || {
        PostgresStore::builder(&url)
            .schema("toolkey_test")
            .table("Tool_calls")
    };
    // Two stores migrating at once, and a third later: one schema, one version row.
    let (a, b) = tokio::join!(build().connect(), build().connect());
    let (a, _b) = (a.unwrap(), b.unwrap());
    build().connect().await.unwrap();
    let k = key("own-table");
    let Reservation::Reserved { token, .. } = a
        .reserve(
            &k,
            "tool",
            &fp(),
            &toolkey::store::Token::generate(),
            Duration::from_secs(60),
        )
        .await
        .unwrap()
    else {
        panic!("fresh key not reserved")
    };
    assert!(a
        .complete(&k, &token, &Outcome::Ok(json!(7)), Duration::from_secs(60))
        .await
        .unwrap());

    let admin = admin(&url).await;
    let row = admin
        .query_one(
            "SELECT version, (SELECT count(*) FROM toolkey_test.\"Tool_calls\" WHERE tenant = $1)
             FROM toolkey_test.toolkey_schema_version WHERE table_name = 'Tool_calls'",
            &[&k.tenant],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (2, 1));

    // A table migrated by a newer toolkey is refused, not misread.
    admin
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS toolkey_test.toolkey_schema_version (table_name text PRIMARY KEY, version integer NOT NULL);
             INSERT INTO toolkey_test.toolkey_schema_version VALUES ('from_the_future', 99)
             ON CONFLICT (table_name) DO UPDATE SET version = 99",
        )
        .await
        .unwrap();
    let err = PostgresStore::builder(&url)
        .schema("toolkey_test")
        .table("from_the_future")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("schema version 99")),
        "{err}"
    );

    let err = PostgresStore::builder(&url)
        .table("bad-name")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("invalid table name")),
        "{err}"
    );
}

/// Nothing listening, or a server gone away under a running store: fails closed, promptly; when
/// the server is back, the same store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable() {
    let Some(url) = server().await else { return };
    servers::fails_closed(&url, |url| {
        PostgresStore::builder(url)
            .timeout(Duration::from_secs(2))
            .connect()
    })
    .await;
}

/// Every backend of the store's pool is terminated mid-run, as a server restart would: the calls
/// in flight may fail (closed), after which the same store works without being rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_are_replaced() {
    let Some(url) = server().await else { return };
    // Only this store's connections are terminated, so tests running beside it are untouched.
    let app = format!("toolkey-terminate-{}", Token::generate());
    let store = Arc::new(
        PostgresStore::builder(with_param(&url, &format!("application_name={app}")))
            .pool_size(4)
            .connect()
            .await
            .unwrap(),
    );
    // Open several pooled connections.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .reserve(
                        &key(&format!("warm-{i}")),
                        "tool",
                        &fp(),
                        &toolkey::store::Token::generate(),
                        Duration::from_secs(60),
                    )
                    .await
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }

    // Calls in flight while the backends are terminated.
    let in_flight: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .reserve(
                        &key(&format!("flight-{i}")),
                        "tool",
                        &fp(),
                        &toolkey::store::Token::generate(),
                        Duration::from_secs(60),
                    )
                    .await
            })
        })
        .collect();
    let killed: i64 = admin(&url)
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        killed >= 1,
        "no backend of the store was found to terminate"
    );
    for call in in_flight {
        let answer = call.await.unwrap();
        assert!(
            matches!(answer, Ok(_) | Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
    }

    // The next calls may still meet a terminated connection (at most one failure for each),
    // after that every call succeeds on the same store.
    servers::recovers(&store, 8, 4).await;
}

/// A replay reads without locking, and an expired record is taken over by an `UPDATE` beside the
/// insert: callers racing for one expired record (or for a free key) still get one reservation
/// between them, and every other caller the record that won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_reserves_of_an_expired_record_give_one_token() {
    let Some(url) = server().await else { return };
    let store = Arc::new(
        PostgresStore::builder(&url)
            .pool_size(16)
            .connect()
            .await
            .unwrap(),
    );
    for round in 0..5 {
        let k = key(&format!("expired-{round}"));
        let Reservation::Reserved { token, .. } = store
            .reserve(
                &k,
                "tool",
                &fp(),
                &Token::generate(),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
        else {
            panic!("a fresh key is free")
        };
        let outcome = Outcome::Ok(json!("first"));
        assert!(store
            .complete(&k, &token, &outcome, Duration::from_millis(1))
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let racers: Vec<_> = (0..16)
            .map(|_| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move {
                    store
                        .reserve(
                            &k,
                            "tool",
                            &fp(),
                            &Token::generate(),
                            Duration::from_secs(30),
                        )
                        .await
                })
            })
            .collect();
        let mut reserved = 0;
        for racer in racers {
            match racer.await.unwrap().unwrap() {
                Reservation::Reserved { .. } => reserved += 1,
                Reservation::Existing(Record::InProgress { .. }) => {}
                other => panic!("round {round}: a racer saw {other:?}"),
            }
        }
        assert_eq!(
            reserved, 1,
            "round {round}: one reservation of the expired record"
        );
    }
}
