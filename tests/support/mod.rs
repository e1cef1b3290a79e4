//! Helpers shared by the server stores' tests: finding the server, and a TCP proxy that can play
//! a server going away and coming back.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The URL in `var`, or `default`.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// Called when the server at `url` did not answer: under `CI=true` the test fails, elsewhere it
/// says loudly that it was skipped.
pub fn unreachable(what: &str, var: &str, url: &str, why: impl std::fmt::Display) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{what} at {url} is unreachable under CI=true ({why}); start it with .ci/services.sh"
        );
    }
    // Straight to stderr: the test harness hides what eprintln! says in a passing test.
    let _ = writeln!(
        std::io::stderr(),
        "\n==================== SKIPPED ====================\n\
         {what} at {url} is unreachable: {why}\n\
         This test did NOT run. Start the server (bash .ci/services.sh) or set {var}.\n\
         ================================================="
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

/// After connections were killed: of `probes` reserves at most `max_failures` fail (each on a
/// dead connection, as `Unavailable`), and then 20 more all succeed on the same store.
pub async fn recovers(store: &dyn toolkey::store::Store, probes: usize, max_failures: usize) {
    use std::time::Duration;
    use toolkey::store::{RecordKey, Reservation, StoreError};

    let fp = toolkey::Fingerprint::of(&serde_json::json!({"probe": true})).unwrap();
    let tenant = format!("recovers-{}", toolkey::store::Token::generate());
    let key = |name: String| RecordKey::new(tenant.clone(), name);
    let mut failures = 0;
    for i in 0..probes {
        match store
            .reserve(
                &key(format!("next-{i}")),
                &fp,
                &toolkey::store::Token::generate(),
                Duration::from_secs(60),
            )
            .await
        {
            Ok(Reservation::Reserved(_)) => {}
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
                &fp,
                &toolkey::store::Token::generate(),
                Duration::from_secs(60),
            )
            .await;
        assert!(
            matches!(answer, Ok(Reservation::Reserved(_))),
            "call {i} after recovery: {answer:?}"
        );
    }
}
