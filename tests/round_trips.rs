//! Round trips to the server stores, counted on the wire: a first run costs two (reserve, which
//! also reads the retry limit's count of the key's failures, then the outcome), with the retry
//! limit on or off, and a replay, an IN_PROGRESS and a CONFLICT answer one each.
//!
//! The store talks to its server through a local TCP proxy that counts request turns: each time
//! a connection's client sends after it last received, that is one round trip (a pipelined burst
//! of messages, however the socket splits it, is one). Statements are prepared and scripts loaded
//! by a warm-up first, as in any process that has served a call before.
//!
//! The servers are `TOOLKEY_POSTGRES_URL` and `TOOLKEY_REDIS_URL`; an unreachable one fails these
//! tests.
#![cfg(any(feature = "postgres", feature = "redis"))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use toolkey::store::{CachedStore, Store, Token};
use toolkey::{tool, ErrorCode, RetryLimit, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::servers;

/// A proxy to `target` that counts the round trips of every connection through it.
struct CountingProxy {
    port: u16,
    trips: Arc<AtomicU64>,
}

impl CountingProxy {
    async fn start(target: SocketAddr) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let trips = Arc::new(AtomicU64::new(0));
        let counted = trips.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let trips = counted.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = inbound.into_split();
                    let (mut server_read, mut server_write) = outbound.into_split();
                    // True while the last bytes went from the client to the server.
                    let asking = Arc::new(AtomicBool::new(false));
                    let up = {
                        let asking = asking.clone();
                        async move {
                            let mut buf = vec![0u8; 64 * 1024];
                            loop {
                                let n = match client_read.read(&mut buf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => n,
                                };
                                if !asking.swap(true, Ordering::SeqCst) {
                                    trips.fetch_add(1, Ordering::SeqCst);
                                }
                                if server_write.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // Before the client can see the reply, so its next request counts.
                            asking.store(false, Ordering::SeqCst);
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        CountingProxy { port, trips }
    }

    fn trips(&self) -> u64 {
        self.trips.load(Ordering::SeqCst)
    }
}

/// The outside system: charges made, and a gate that holds the charge of order `held`.
#[derive(Default)]
struct Payments {
    charges: AtomicUsize,
    entered: Notify,
    gate: Notify,
}

/// Charge an order once.
#[tool(idempotent(key = "charge:<order>"), lease = "60s")]
async fn charge(payments: State<Payments>, order: String, cents: u64) -> Result<u64, ToolError> {
    if order.starts_with("held") {
        payments.entered.notify_one();
        payments.gate.notified().await;
    }
    payments.charges.fetch_add(1, Ordering::SeqCst);
    Ok(cents)
}

/// A toolbox on `store`, and its ledger.
fn toolbox(store: impl Store + 'static) -> (Toolbox, Arc<Payments>) {
    let payments = Arc::new(Payments::default());
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(payments.clone())
        .tool(Charge)
        .build()
        .unwrap();
    (toolbox, payments)
}

/// The round trips of a first run from a toolbox on `store` (through `proxy`) with no retry
/// limit: two, as with one.
async fn first_run_without_a_retry_limit(name: &str, proxy: &CountingProxy, store: impl Store) {
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(Arc::new(Payments::default()))
        .tool(Charge)
        .default_retry_limit(RetryLimit::off())
        .build()
        .unwrap();
    let ctx =
        ToolContext::new("run-1").with_tenant(format!("unlimited-{name}-{}", Token::generate()));
    // Warm-up, as in `count`.
    let warm = json!({"order": "warm", "cents": 7});
    toolbox.call("charge", warm, &ctx).await.unwrap();
    let before = proxy.trips();
    let args = json!({"order": "o-1", "cents": 7});
    assert_eq!(
        toolbox.call("charge", args, &ctx).await.unwrap().value,
        json!(7)
    );
    assert_eq!(
        proxy.trips() - before,
        2,
        "{name}: round trips of a first run without a retry limit"
    );
}

/// The round trips of each answer, from a toolbox whose store goes through `proxy`; `beside`
/// is a second toolbox on the same records, not counted, that holds a key while it runs.
async fn count(
    name: &str,
    proxy: &CountingProxy,
    counted: (Toolbox, Arc<Payments>),
    beside: (Toolbox, Arc<Payments>),
    expected: (u64, u64, u64, u64),
) {
    let ((counted, payments), (beside, holders)) = (counted, beside);
    let tenant = format!("trips-{name}-{}", Token::generate());
    let ctx = ToolContext::new("run-1").with_tenant(tenant);
    let call = |order: &str, cents: u64| {
        let (toolbox, ctx) = (counted.clone(), ctx.clone());
        let args = json!({"order": order, "cents": cents});
        async move { toolbox.call("charge", args, &ctx).await }
    };
    let measure = async |label: &str, order: &str, cents: u64| {
        let before = proxy.trips();
        let answer = call(order, cents).await;
        (proxy.trips() - before, answer, label.to_string())
    };

    // A body of `beside` holds `held-*` keys until released.
    let hold = |order: &'static str| {
        let (beside, ctx) = (beside.clone(), ctx.clone());
        tokio::spawn(async move {
            beside
                .call("charge", json!({"order": order, "cents": 1}), &ctx)
                .await
        })
    };

    // Warm-up: every statement prepared, every script loaded, on the one connection.
    call("warm", 1).await.unwrap();
    call("warm", 1).await.unwrap();
    call("warm", 2).await.unwrap_err();
    let warm_holder = hold("held-warm");
    holders.entered.notified().await;
    call("held-warm", 1).await.unwrap_err();
    holders.gate.notify_one();
    warm_holder.await.unwrap().unwrap();

    let (first, answer, _) = measure("first run", "o-1", 500).await;
    assert_eq!(answer.unwrap().value, json!(500));
    let (replay, answer, _) = measure("replay", "o-1", 500).await;
    assert!(answer.unwrap().replayed);
    let (conflict, answer, _) = measure("conflict", "o-1", 900).await;
    assert!(answer.unwrap_err().is(ErrorCode::Conflict));
    let holder = hold("held-1");
    holders.entered.notified().await;
    let (in_progress, answer, _) = measure("in progress", "held-1", 1).await;
    assert!(answer.unwrap_err().is(ErrorCode::InProgress));
    holders.gate.notify_one();
    holder.await.unwrap().unwrap();

    // Each order was charged once, by whichever toolbox ran it.
    assert_eq!(payments.charges.load(Ordering::SeqCst), 2, "warm, o-1");
    assert_eq!(
        holders.charges.load(Ordering::SeqCst),
        2,
        "held-warm, held-1"
    );
    assert_eq!(
        (first, replay, in_progress, conflict),
        expected,
        "{name}: round trips of (first run, replay, IN_PROGRESS, CONFLICT)"
    );
}

/// A cache in front of the counted store: a replay or a CONFLICT on a finished action makes no
/// round trip; what the cache has not seen (finished by `beside`) is read once, then cached.
async fn count_cached(
    name: &str,
    proxy: &CountingProxy,
    counted: impl Store + 'static,
    beside: impl Store + 'static,
) {
    let beside = toolbox(beside);
    let store = Arc::new(CachedStore::new(counted, 1 << 20));
    let counted = toolbox(store.clone());
    let (cold_toolbox, cold_payments) = (counted.0.clone(), counted.1.clone());
    count(
        name,
        proxy,
        counted,
        (beside.0.clone(), beside.1.clone()),
        (2, 0, 1, 0),
    )
    .await;

    let ctx = ToolContext::new("run-1").with_tenant(format!("cold-{name}-{}", Token::generate()));
    let args = json!({"order": "cold", "cents": 7});
    beside.0.call("charge", args.clone(), &ctx).await.unwrap();
    let mut trips = Vec::new();
    for _ in 0..3 {
        let before = proxy.trips();
        assert!(
            cold_toolbox
                .call("charge", args.clone(), &ctx)
                .await
                .unwrap()
                .replayed
        );
        trips.push(proxy.trips() - before);
    }
    assert_eq!(
        trips,
        [1, 0, 0],
        "{name}: a replay the cache had not seen, then twice more"
    );
    assert_eq!(
        cold_payments.charges.load(Ordering::SeqCst),
        2,
        "warm, o-1: nothing else ran here"
    );
}

/// A PostgreSQL store reached directly, a counting proxy to the server, and a store of one
/// connection through the proxy (so the warm-up prepares the statements the counted calls use);
/// `None` when the server cannot be reached.
#[cfg(feature = "postgres")]
async fn postgres_through_a_proxy() -> Option<(
    toolkey::store::PostgresStore,
    CountingProxy,
    toolkey::store::PostgresStore,
)> {
    use toolkey::store::PostgresStore;
    const VAR: &str = "TOOLKEY_POSTGRES_URL";
    let url = servers::url(VAR, "postgres://postgres@127.0.0.1:5432/test");
    let direct = match PostgresStore::builder(&url).pool_size(2).connect().await {
        Ok(store) => store,
        Err(e) => {
            servers::unreachable("PostgreSQL", VAR, &url, e);
            return None;
        }
    };
    let config: tokio_postgres::Config = url.parse().unwrap();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let proxy = CountingProxy::start(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let through = url.replacen(&format!(":{port}/"), &format!(":{}/", proxy.port), 1);
    assert_ne!(through, url, "the test URL names its port");
    let counted = PostgresStore::builder(&through)
        .pool_size(1)
        .connect()
        .await
        .unwrap();
    Some((direct, proxy, counted))
}

/// A Redis store reached directly, a counting proxy to the server, and a store through the
/// proxy; `None` when the server cannot be reached.
#[cfg(feature = "redis")]
async fn redis_through_a_proxy() -> Option<(
    toolkey::store::RedisStore,
    CountingProxy,
    toolkey::store::RedisStore,
)> {
    use toolkey::store::RedisStore;
    const VAR: &str = "TOOLKEY_REDIS_URL";
    let url = servers::url(VAR, "redis://127.0.0.1:6379");
    let direct = match RedisStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => {
            servers::unreachable("Redis", VAR, &url, e);
            return None;
        }
    };
    let info = redis::Client::open(url.as_str()).unwrap();
    let port = match &info.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(_, port) => *port,
        other => panic!("the test server should be reached over TCP, not {other:?}"),
    };
    let proxy = CountingProxy::start(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let through = url.replacen(&format!(":{port}"), &format!(":{}", proxy.port), 1);
    assert_ne!(through, url, "the test URL names its port");
    let counted = RedisStore::connect(&through).await.unwrap();
    Some((direct, proxy, counted))
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_answers_in_one_round_trip_and_runs_in_two() {
    let Some((direct, proxy, store)) = postgres_through_a_proxy().await else {
        return;
    };
    let unlimited = store.clone();
    let (counted, beside) = (toolbox(store), toolbox(direct));
    count("postgres", &proxy, counted, beside, (2, 1, 1, 1)).await;
    first_run_without_a_retry_limit("postgres", &proxy, unlimited).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_behind_a_cache_replays_without_a_round_trip() {
    let Some((direct, proxy, store)) = postgres_through_a_proxy().await else {
        return;
    };
    count_cached("postgres-cached", &proxy, store, direct).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_in_one_round_trip_and_runs_in_two() {
    let Some((direct, proxy, store)) = redis_through_a_proxy().await else {
        return;
    };
    let unlimited = store.clone();
    let (counted, beside) = (toolbox(store), toolbox(direct));
    count("redis", &proxy, counted, beside, (2, 1, 1, 1)).await;
    first_run_without_a_retry_limit("redis", &proxy, unlimited).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_behind_a_cache_replays_without_a_round_trip() {
    let Some((direct, proxy, store)) = redis_through_a_proxy().await else {
        return;
    };
    count_cached("redis-cached", &proxy, store, direct).await;
}

#[test]
fn the_proxy_counts_turns_not_reads() {
    // A request split over three writes and answered twice is still one round trip; the next
    // request after an answer is another.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 16];
            for _ in 0..2 {
                let mut got = 0;
                while got < 6 {
                    got += socket.read(&mut buf[got..]).await.unwrap();
                }
                socket.write_all(b"ok").await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                socket.write_all(b"!").await.unwrap();
            }
        });
        let proxy = CountingProxy::start(addr).await;
        let mut client = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        let mut reply = [0u8; 3];
        for _ in 0..2 {
            for part in [&b"as"[..], b"k-", b"it"] {
                client.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            client.read_exact(&mut reply).await.unwrap();
        }
        assert_eq!(proxy.trips(), 2);
    });
}
