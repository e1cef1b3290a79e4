//! The store conformance suite against SQLite, and two OS processes reserving keys in one file.
//!
//! The test binary runs itself as the child process: `child_process_entry` does the child's part
//! when its environment names a database, and nothing otherwise.
#![cfg(feature = "sqlite")]

use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{ManualClock, Record, RecordKey, Reservation, Reservations, SqliteStore};
use toolkey::Fingerprint;
use toolkey_tests::{child, conformance};

/// Set in the environment of the child processes: the database file to hammer.
const CHILD_DB: &str = "TOOLKEY_SQLITE_HAMMER_DB";
/// The file whose appearance starts the children, so they race from the same moment.
const CHILD_GO: &str = "TOOLKEY_SQLITE_HAMMER_GO";
/// The file a child writes its answers to, one line a key: `reserved <key> <token>` or
/// `existing <key>`.
const CHILD_ANSWERS: &str = "TOOLKEY_SQLITE_HAMMER_ANSWERS";
const KEYS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let store = SqliteStore::open(dir.path().join("conformance.db")).unwrap();
    conformance::run(Arc::new(store.with_clock(clock.clone())), Some(clock)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_conforms() {
    let clock = Arc::new(ManualClock::new());
    let store = SqliteStore::open_in_memory().unwrap();
    conformance::run(Arc::new(store.with_clock(clock.clone())), Some(clock)).await;
}

/// Two processes reserve the same keys at the same time: each key is reserved exactly once, and
/// the other process sees the winner's reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_reserve_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let go = dir.path().join("go");
    let store = SqliteStore::open(&db).unwrap();

    let answers: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("answers-{i}")))
        .collect();
    let mut children: Vec<_> = answers
        .iter()
        .map(|answers| {
            child::spawn_self(&[
                (CHILD_DB, db.as_os_str()),
                (CHILD_GO, go.as_os_str()),
                (CHILD_ANSWERS, answers.as_os_str()),
            ])
        })
        .collect();
    std::fs::write(&go, b"go").unwrap();

    let mut reserved: HashMap<String, Vec<String>> = HashMap::new();
    let mut answered: HashMap<String, usize> = HashMap::new();
    for (child, answers) in children.iter_mut().zip(&answers) {
        let status = child::finish(child, Duration::from_secs(60), "a reserving child");
        assert!(status.success(), "child failed: {status}");
        for line in std::fs::read_to_string(answers).unwrap().lines() {
            let mut words = line.split_whitespace();
            let (what, key) = (words.next().unwrap(), words.next().unwrap().to_string());
            *answered.entry(key.clone()).or_default() += 1;
            if what == "reserved" {
                reserved
                    .entry(key)
                    .or_default()
                    .push(words.next().unwrap().to_string());
            }
        }
    }

    assert_eq!(answered.len(), KEYS, "every key was answered");
    assert!(
        answered.values().all(|&n| n == 2),
        "each process answered every key"
    );
    for i in 0..KEYS {
        let key = format!("k{i}");
        let tokens = reserved.get(&key).cloned().unwrap_or_default();
        assert_eq!(
            tokens.len(),
            1,
            "key {key} was reserved {} times: {tokens:?}",
            tokens.len()
        );
        let record = store.get(&RecordKey::new("hammer", &key)).await.unwrap();
        assert!(
            matches!(record, Some(Record::InProgress { .. })),
            "{key}: {record:?}"
        );
    }
}

/// The child side of [`two_processes_reserve_each_key_once`]; does nothing in a normal run.
#[tokio::test(flavor = "current_thread")]
async fn child_process_entry() {
    let (Ok(db), Ok(go), Ok(answers)) = (
        std::env::var(CHILD_DB),
        std::env::var(CHILD_GO),
        std::env::var(CHILD_ANSWERS),
    ) else {
        return;
    };
    child::wait_for(Path::new(&go), "no start signal");
    let store = SqliteStore::open(&db).unwrap();
    let fp = Fingerprint::of(&json!({"n": 1})).unwrap();
    let mut out = String::new();
    for i in 0..KEYS {
        let key = format!("k{i}");
        match store
            .reserve(
                &RecordKey::new("hammer", &key),
                "tool",
                &fp,
                &toolkey::store::Token::generate(),
                Duration::from_secs(300),
            )
            .await
        {
            Ok(Reservation::Reserved { token, .. }) => {
                writeln!(out, "reserved {key} {token}").unwrap()
            }
            Ok(Reservation::Existing(Record::InProgress { .. })) => {
                writeln!(out, "existing {key}").unwrap()
            }
            other => panic!("unexpected answer for {key}: {other:?}"),
        }
    }
    std::fs::write(answers, out).unwrap();
}

/// Workers started together on a new file all open it: switching the file to WAL and creating
/// the schema wait for each other instead of failing with "database is locked".
#[test]
fn many_openers_of_a_new_file_all_succeed() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolkey.db");
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let openers: Vec<_> = (0..8)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(&path).map(drop)
                })
            })
            .collect();
        for opener in openers {
            let opened = opener.join().unwrap();
            assert!(opened.is_ok(), "round {round}: {opened:?}");
        }
    }
}

/// A renewal that waits for another process's write lock is measured from when it applies: the
/// lease it grants runs from the moment the lock was released, not from before the wait. (Read
/// before the wait, a 2 s lease renewed behind a 3 s lock would have lapsed when it was written.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_behind_another_writer_is_measured_from_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("contended.db");
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    let key = RecordKey::new("contended", "renew");
    let fp = Fingerprint::of(&json!({"n": 1})).unwrap();
    let Reservation::Reserved { token, .. } = store
        .reserve(
            &key,
            "tool",
            &fp,
            &toolkey::store::Token::generate(),
            Duration::from_secs(2),
        )
        .await
        .unwrap()
    else {
        panic!("a new key is reserved");
    };

    // Another process's writer holds the lock for 3 s (within the store's 5 s busy timeout).
    let other = rusqlite::Connection::open(&db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let renewing = {
        let (store, key, token) = (store.clone(), key.clone(), token.clone());
        tokio::spawn(async move { store.renew(&key, &token, Duration::from_secs(2)).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = std::time::SystemTime::now();
    other.execute_batch("COMMIT").unwrap();

    assert!(renewing.await.unwrap().unwrap(), "the renewal applied");
    let Some(Record::InProgress { lease_until, .. }) = store.get(&key).await.unwrap() else {
        panic!("the key is still held");
    };
    assert!(
        lease_until >= released + Duration::from_secs(2),
        "the lease runs from the end of the wait: it ends {:?} before released + 2 s",
        (released + Duration::from_secs(2))
            .duration_since(lease_until)
            .unwrap_or_default()
    );
}
