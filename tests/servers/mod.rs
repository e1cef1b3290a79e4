//! The server stores' test helpers: finding the server, a TCP proxy that can play a server going
//! away and coming back, and the checks every server store passes when it does (fail closed,
//! then recover on the same store).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use toolkey::store::{Record, RecordKey, Reservation, Store, StoreError, Token};

/// The URL in `var`, or `default`.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// Called when the server at `url` did not answer: the test fails, naming the script that starts
/// the services. No test passes without having run.
pub fn unreachable(what: &str, var: &str, url: &str, why: impl std::fmt::Display) {
    panic!(
        "{what} at {url} is unreachable ({why}): this test needs it. Run the suite with \
         `bash scripts/test.sh`, which starts the services (`bash .ci/services.sh` alone starts \
         them), or set {var} to where it runs"
    );
}

/// A TCP proxy on a local port to `target`. Stopping it closes every connection through it and
/// refuses new ones, as a server that went down would; starting it again on the same port plays
/// the server's return.
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    accept: Mutex<Option<JoinHandle<()>>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            target,
            accept: Mutex::default(),
            conns: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    fn serve(&self, listener: TcpListener) {
        let (target, conns) = (self.target, self.conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(conn);
            }
        });
        *self.accept.lock().unwrap() = Some(accept);
    }

    /// Closes the port and every connection through it.
    pub async fn stop(&self) {
        let accept = self.accept.lock().unwrap().take();
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await;
        }
        let conns: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        for task in conns {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same port again.
    pub async fn restart(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

/// A proxy in front of the server at `url`, and `url` rewritten to reach the server through it.
pub async fn behind_proxy(url: &str) -> (Proxy, String) {
    let parsed = url::Url::parse(url).unwrap();
    let port = parsed.port().expect("the test URL names its port");
    let target = format!("{}:{port}", parsed.host_str().unwrap())
        .parse()
        .unwrap();
    let proxy = Proxy::start(target).await;
    let mut through = parsed;
    through.set_port(Some(proxy.port())).unwrap();
    (proxy, through.to_string())
}

/// `url` with its port replaced by one nothing listens on.
pub fn nowhere(url: &str) -> String {
    let mut parsed = url::Url::parse(url).unwrap();
    parsed.set_port(Some(1)).unwrap();
    parsed.to_string()
}

/// The fail-closed checks every server store passes. `connect` builds the store for a URL, with
/// a short timeout.
///
/// Nothing listening: connecting is `Unavailable`. A server that goes away under a running store:
/// every reserve is `Unavailable`, each within 5 s (so a caller is refused, never left hanging,
/// and never told a key is free). When the server is back, the same store reads what it holds
/// again, within 10 s, without being rebuilt.
pub async fn fails_closed<S, F, Fut>(url: &str, connect: F)
where
    S: Store,
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<S, StoreError>>,
{
    let refused = connect(nowhere(url)).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "connecting to nothing: {:?}",
        refused.err()
    );

    let (proxy, through) = behind_proxy(url).await;
    let store = connect(through).await.unwrap();
    let tenant = format!("fails-closed-{}", Token::generate());
    let key = |name: &str| RecordKey::new(tenant.clone(), name);
    let fp = toolkey::Fingerprint::of(&serde_json::json!({"n": 1})).unwrap();
    let lease = Duration::from_secs(60);
    let held = key("down");
    let before = store
        .reserve(&held, "tool", &fp, &Token::generate(), lease)
        .await;
    assert!(
        matches!(before, Ok(Reservation::Reserved { .. })),
        "{before:?}"
    );

    proxy.stop().await;
    for i in 0..3 {
        let started = Instant::now();
        let down = store
            .reserve(&key("while-down"), "tool", &fp, &Token::generate(), lease)
            .await;
        assert!(
            matches!(down, Err(StoreError::Unavailable(_))),
            "call {i}: {down:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "failing closed took {:?}",
            started.elapsed()
        );
    }

    proxy.restart().await;
    let started = Instant::now();
    loop {
        match store.get(&held).await {
            Ok(Some(Record::InProgress { .. })) => break,
            Err(StoreError::Unavailable(_)) if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("after the server came back: {other:?}"),
        }
    }
}

/// After connections were killed: of `probes` reserves at most `max_failures` fail (each on a
/// dead connection, as `Unavailable`), and then 20 more all succeed on the same store.
pub async fn recovers(store: &dyn toolkey::store::Store, probes: usize, max_failures: usize) {
    let fp = toolkey::Fingerprint::of(&serde_json::json!({"probe": true})).unwrap();
    let tenant = format!("recovers-{}", Token::generate());
    let key = |name: String| RecordKey::new(tenant.clone(), name);
    let mut failures = 0;
    for i in 0..probes {
        match store
            .reserve(
                &key(format!("next-{i}")),
                "tool",
                &fp,
                &Token::generate(),
                Duration::from_secs(60),
            )
            .await
        {
            Ok(Reservation::Reserved { .. }) => {}
            Err(StoreError::Unavailable(_)) => failures += 1,
            other => panic!("call {i} after the kill: {other:?}"),
        }
    }
    assert!(
        failures <= max_failures,
        "{failures} of {probes} calls failed, expected at most {max_failures}"
    );
    for i in 0..20 {
        let answer = store
            .reserve(
                &key(format!("after-{i}")),
                "tool",
                &fp,
                &Token::generate(),
                Duration::from_secs(60),
            )
            .await;
        assert!(
            matches!(answer, Ok(Reservation::Reserved { .. })),
            "call {i} after recovery: {answer:?}"
        );
    }
}
