//! The store conformance suite against a real Redis server, on the server's clock; and the store
//! failing closed when the server goes away, and recovering when it is back.
//!
//! The server is `TOOLKEY_REDIS_URL` (default `redis://127.0.0.1:6379`). An unreachable server
//! fails these tests, naming `scripts/test.sh`, which starts it.
//!
//! `CLIENT KILL TYPE normal` disconnects every client of the server, so the tests of this file
//! take turns (see [`turn`]).
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Mutex, MutexGuard};
use toolkey::store::{
    Cursor, Filter, OperatorCommands, Outcome, RecordKey, RedisStore, Reservation, Reservations,
    StoreError, Token,
};
use toolkey::Fingerprint;
use toolkey_tests::{conformance, servers};

const VAR: &str = "TOOLKEY_REDIS_URL";
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// One test at a time talks to the server.
async fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::const_new(());
    TURN.lock().await
}

/// The server's URL; an unreachable server fails the test.
async fn server() -> Option<String> {
    let url = servers::url(VAR, DEFAULT_URL);
    match RedisStore::builder(&url)
        .timeout(Duration::from_secs(3))
        .connect()
        .await
    {
        Ok(_) => Some(url),
        Err(e) => {
            servers::unreachable("Redis", VAR, &url, e);
            None
        }
    }
}

/// A plain connection beside the store, to do what an operator or a crash would.
async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(&json!({"n": 1})).unwrap()
}

fn key(name: &str) -> RecordKey {
    RecordKey::new(format!("redis-test-{}", Token::generate()), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_conforms() {
    let _turn = turn().await;
    let Some(url) = server().await else { return };
    let store = Arc::new(RedisStore::connect(&url).await.unwrap());
    assert_eq!(
        store.eviction_policy(),
        Some("noeviction"),
        "the test server should never evict"
    );
    conformance::run(store, None).await;
}

/// Keys are laid out as documented, with tenants and keys escaped so that none can spell
/// another's; a completed record carries its retention (plus a margin) as a TTL, a reservation
/// none; something other than a record under a record's key is corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_escape_and_expire() {
    let _turn = turn().await;
    let Some(url) = server().await else { return };
    let prefix = format!("toolkey-test-{}", Token::generate());
    let store = RedisStore::builder(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let mut admin = admin(&url).await;

    let a = RecordKey::new("acme:x", "k");
    let b = RecordKey::new("acme", "x:k");
    let lease = Duration::from_secs(60);
    let Reservation::Reserved { token, .. } = store
        .reserve(&a, "tool", &fp(), &toolkey::store::Token::generate(), lease)
        .await
        .unwrap()
    else {
        panic!("fresh key not reserved")
    };
    assert!(matches!(
        store
            .reserve(&b, "tool", &fp(), &toolkey::store::Token::generate(), lease)
            .await
            .unwrap(),
        Reservation::Reserved { .. }
    ));
    let a_key = format!("{prefix}:acme\\:x:k");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&a_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "a reservation must not expire by itself");

    let retain = Duration::from_secs(10);
    assert!(store
        .complete(&a, &token, &Outcome::Ok(json!(1)), retain)
        .await
        .unwrap());
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&a_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        (60_000..=70_000).contains(&ttl),
        "TTL after complete: {ttl} ms"
    );
    let b_key = format!("{prefix}:acme:x\\:k");
    let state: String = redis::cmd("HGET")
        .arg(&b_key)
        .arg("state")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(state, "in_progress");

    let c = RecordKey::new("acme", "not-a-hash");
    let () = redis::cmd("SET")
        .arg(format!("{prefix}:acme:not-a-hash"))
        .arg("x")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(matches!(
        store.get(&c).await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(
        store
            .reserve(&c, "tool", &fp(), &toolkey::store::Token::generate(), lease)
            .await,
        Err(StoreError::Corrupt { .. })
    ));

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let () = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut admin)
        .await
        .unwrap();

    let bad = RedisStore::builder(&url).prefix("").connect().await;
    assert!(matches!(bad, Err(StoreError::Config(_))), "{bad:?}");
}

/// Nothing listening, or a server gone away under a running store: fails closed, promptly; when
/// the server is back, the same store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable() {
    let _turn = turn().await;
    let Some(url) = server().await else { return };
    servers::fails_closed(&url, |url| {
        RedisStore::builder(url)
            .timeout(Duration::from_secs(2))
            .connect()
    })
    .await;
}

/// Every client is disconnected mid-run (`CLIENT KILL TYPE normal`), as a server restart would:
/// the calls in flight may fail, after which the same store works without being rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced() {
    let _turn = turn().await;
    let Some(url) = server().await else { return };
    let store = Arc::new(RedisStore::connect(&url).await.unwrap());
    store
        .reserve(
            &key("warm"),
            "tool",
            &fp(),
            &toolkey::store::Token::generate(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();

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
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin(&url).await)
        .await
        .unwrap();
    assert!(killed >= 1, "no client was killed");
    for call in in_flight {
        let answer = call.await.unwrap();
        assert!(
            matches!(answer, Ok(_) | Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
    }

    // The next call may still meet the dead connection; after that every call succeeds.
    servers::recovers(&store, 3, 1).await;
}

/// A listing on a server shared with many other keys: `SCAN` walks them all, but a page widens
/// its steps instead of coming back empty step after step, so a listing in pages of one ends in
/// a handful of pages, and lists each of the prefix's records once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_a_shared_server_ends_in_few_pages() {
    let _turn = turn().await;
    let Some(url) = server().await else { return };
    let prefix = format!("toolkey-test-{}", Token::generate());
    let store = RedisStore::builder(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let mut admin = admin(&url).await;
    let foreign = format!("toolkey-test-foreign-{}", Token::generate());
    const FOREIGN: usize = 50_000;
    for chunk in (0..FOREIGN).collect::<Vec<_>>().chunks(5_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("SET")
                .arg(format!("{foreign}:{i}"))
                .arg(1)
                .arg("EX")
                .arg(600)
                .ignore();
        }
        let () = pipe.query_async(&mut admin).await.unwrap();
    }

    let lease = Duration::from_secs(60);
    let tenant = "acme";
    for name in ["a", "b", "c"] {
        let reserved = store
            .reserve(
                &RecordKey::new(tenant, name),
                "send_invoice",
                &fp(),
                &Token::generate(),
                lease,
            )
            .await
            .unwrap();
        assert!(matches!(reserved, Reservation::Reserved { .. }));
    }

    for filter in [
        Filter::default(),
        Filter {
            tenant: Some(tenant.into()),
            ..Filter::default()
        },
    ] {
        let mut listed = Vec::new();
        let mut cursor: Option<Cursor> = None;
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages <= 12, "a listing in pages of one took {pages} pages");
            let page = store.list(&filter, cursor.as_ref(), 1).await.unwrap();
            listed.extend(page.entries.into_iter().map(|e| e.key.key));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        listed.sort();
        assert_eq!(listed, ["a", "b", "c"], "filter {filter:?}");
    }

    let mut doomed: Vec<String> = (0..FOREIGN).map(|i| format!("{foreign}:{i}")).collect();
    doomed.push(format!("{prefix}.version"));
    for name in ["a", "b", "c"] {
        doomed.push(format!("{prefix}:{tenant}:{name}"));
    }
    for chunk in doomed.chunks(5_000) {
        let () = redis::cmd("DEL")
            .arg(chunk)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
}
