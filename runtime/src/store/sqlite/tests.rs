use super::schema::SCHEMA_VERSION;
use super::writer::{spin_for, Waiting};
use super::*;

/// Inserts a bare record named `key` (a write as the store's own are).
fn insert(conn: &Connection, key: &str, now: i64) -> Result<(), StoreError> {
    conn.execute(
        &format!(
            "INSERT INTO toolkey_records ({COLUMNS}, tenant, key)
             VALUES ('{IN_PROGRESS}', 't', 'fp', ?1, ?1, NULL, NULL, NULL, 'tool', 'acme', ?2)"
        ),
        params![now, key],
    )
    .map_err(unavailable)?;
    Ok(())
}

fn keys(store: &SqliteStore) -> Vec<String> {
    let conn = lock(&store.conn);
    let mut stmt = conn
        .prepare("SELECT key FROM toolkey_records ORDER BY key")
        .unwrap();
    let rows = stmt.query_map([], |row| row.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// The token under which `key`, which must be free, is reserved.
async fn reserved(
    store: &SqliteStore,
    key: &RecordKey,
    fp: &Fingerprint,
    lease: Duration,
) -> Token {
    match store
        .reserve(key, "tool", fp, &Token::generate(), lease)
        .await
    {
        Ok(Reservation::Reserved { token, .. }) => token,
        other => panic!("{key:?} was not free: {other:?}"),
    }
}

/// A replay is read on the caller's thread when the inline connection is free, and by the
/// blocking pool when it is not, or when the database is locked so that the read would
/// wait: the answer is the same record each way, and a write another connection holds the
/// lock for is never read before it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The held guard stands for another caller using the inline connection meanwhile.
#[allow(clippy::await_holding_lock)]
async fn a_replay_read_inline_or_on_the_pool_answers_alike() {
    let dir = std::env::temp_dir().join(format!("toolkey-inline-{}", Token::generate()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("inline.db");
    let store = SqliteStore::open(&path).unwrap();
    let (key, fp) = (
        RecordKey::new("acme", "k"),
        Fingerprint::of(&serde_json::json!(1)).unwrap(),
    );
    let lease = Duration::from_secs(30);
    let token = reserved(&store, &key, &fp, lease).await;
    let outcome = Outcome::Ok(serde_json::json!({"n": 1}));
    let retain = Duration::from_secs(60);
    assert!(store
        .complete(&key, &token, &outcome, retain)
        .await
        .unwrap());
    let replayed = |answer: Reservation| match answer {
        Reservation::Existing(Record::Completed { outcome, .. }) => outcome,
        other => panic!("not a replay: {other:?}"),
    };
    let token = Token::generate();
    let reserve = || store.reserve(&key, "tool", &fp, &token, lease);
    // Inline, on the writer's connection.
    assert!(matches!(store.read_inline(&key), Inline::Live(_)));
    assert_eq!(replayed(reserve().await.unwrap()), outcome);
    // The writer's connection in use (a commit being flushed): the inline connection reads.
    {
        let _writing = store.conn.lock().unwrap();
        assert!(matches!(store.read_inline(&key), Inline::Live(_)));
        assert_eq!(replayed(reserve().await.unwrap()), outcome);
    }
    // Both in use: the blocking pool reads.
    {
        let _writing = store.conn.lock().unwrap();
        let _held = store.inline.lock().unwrap();
        assert!(matches!(store.read_inline(&key), Inline::Unread));
        assert_eq!(replayed(reserve().await.unwrap()), outcome);
        assert!(matches!(
            store.get(&key).await.unwrap(),
            Some(Record::Completed { .. })
        ));
    }
    // Another process holds the write lock with a change not yet committed: a WAL reader
    // sees the last commit, inline or not, and never the uncommitted change.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
        .execute(
            "UPDATE toolkey_records SET outcome = '{not json' WHERE key = 'k'",
            [],
        )
        .unwrap();
    assert_eq!(replayed(reserve().await.unwrap()), outcome);
    other.execute_batch("ROLLBACK").unwrap();
    // An absent key is not read inline as anything: it goes to the writer's queue.
    let fresh = RecordKey::new("acme", "fresh");
    assert!(matches!(store.read_inline(&fresh), Inline::Free));
    assert!(matches!(
        store
            .reserve(&fresh, "tool", &fp, &Token::generate(), lease)
            .await
            .unwrap(),
        Reservation::Reserved { .. }
    ));
    drop((store, other));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes queued while the connection is busy share one commit; in a shared commit, a write
/// that fails or panics is rolled back alone, and every other is kept and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_a_commit_and_fail_alone() {
    let dir = tempfile_dir();
    let store = Arc::new(SqliteStore::open(dir.join("group.db")).unwrap());
    // Hold the connection, as a long read would, while ten writes queue up.
    let held = store.conn.clone();
    let guard = held.lock().unwrap();
    let mut writes = Vec::new();
    for i in 0..10 {
        let store = store.clone();
        writes.push(Box::pin(async move {
            store
                .write(move |tx, now| match i {
                    3 => {
                        insert(tx, "k3", now)?;
                        Err(StoreError::Unavailable("refused".into()))
                    }
                    6 => {
                        insert(tx, "k6", now)?;
                        panic!("a write that panics")
                    }
                    _ => insert(tx, &format!("k{i}"), now).map(|()| i),
                })
                .await
        }));
    }
    // Polled once, each write joins the queue (the first starts the writer, which takes
    // what is queued, then waits for the connection).
    let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    for write in &mut writes {
        assert!(std::future::Future::poll(write.as_mut(), &mut cx).is_pending());
    }
    drop(guard);
    let answers = futures_util::future::join_all(writes).await;
    for (i, answer) in answers.iter().enumerate() {
        match i {
            3 => assert!(matches!(answer, Err(StoreError::Unavailable(m)) if m == "refused")),
            6 => assert!(
                matches!(answer, Err(StoreError::Unavailable(_))),
                "{answer:?}"
            ),
            _ => assert_eq!(answer.as_ref().unwrap(), &i),
        }
    }
    assert_eq!(
        keys(&store),
        ["k0", "k1", "k2", "k4", "k5", "k7", "k8", "k9"],
        "the failed and the panicked writes are rolled back alone"
    );
    let commits = store.writes.commits.load(Ordering::Relaxed);
    assert!(
        (1..=2).contains(&commits),
        "ten writes queued behind one lock took {commits} commits"
    );
    // The store goes on: a write after the batch commits on its own.
    store
        .write(|tx, now| insert(tx, "after", now))
        .await
        .unwrap();
    assert!(keys(&store).contains(&"after".to_string()));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Only a caller that no other waits beside looks for its answer; callers that wait together
/// are woken by their commit. A write's caller dropped while it looks (or waits) is counted
/// out, so the next caller alone looks again.
#[tokio::test]
async fn only_a_caller_waiting_alone_looks_for_its_answer() {
    let waiting = AtomicUsize::new(0);
    let (first, second) = (Waiting::start(&waiting), Waiting::start(&waiting));
    assert!(first.alone && !second.alone);
    drop((first, second));
    assert!(Waiting::start(&waiting).alone);

    let dir = tempfile_dir();
    let store = SqliteStore::open(dir.join("alone.db")).unwrap();
    // Dropped at once, while its write is queued or being looked for.
    let write = store.write(|tx, now| insert(tx, "dropped", now));
    let dropped = tokio::time::timeout(Duration::from_nanos(1), write).await;
    assert_eq!(store.writes.waiting.load(Ordering::Acquire), 0);
    // Many at once: each answered once its commit is durable, none counted after.
    let writes = (0..8).map(|n| {
        let store = &store;
        async move {
            store
                .write(move |tx, now| insert(tx, &format!("k{n}"), now))
                .await
        }
    });
    for answer in futures_util::future::join_all(writes).await {
        answer.unwrap();
    }
    assert_eq!(store.writes.waiting.load(Ordering::Acquire), 0);
    let held = keys(&store);
    assert_eq!(held.iter().filter(|k| k.starts_with('k')).count(), 8);
    // A write answered before its caller gave up was applied.
    if let Ok(answer) = dropped {
        answer.unwrap();
        assert!(held.contains(&"dropped".to_string()));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A lone caller looks for its answer for twice the typical time, at most the longest
/// look, and not at all while answers take longer than that; the typical time follows the
/// answers, and one long wait counts as twice the longest look at most.
#[test]
fn a_lone_caller_looks_as_long_as_answers_have_taken() {
    let (us, ms) = (Duration::from_micros, Duration::from_millis);
    assert_eq!(spin_for(Duration::ZERO, ms(1)), ms(1), "nothing seen yet");
    assert_eq!(spin_for(us(200), ms(1)), us(400));
    assert_eq!(spin_for(us(600), ms(1)), ms(1));
    assert_eq!(spin_for(us(1_001), ms(1)), Duration::ZERO, "a slow disk");
    assert_eq!(spin_for(us(200), Duration::ZERO), Duration::ZERO);
    assert_eq!(spin_for(Duration::ZERO, Duration::ZERO), Duration::ZERO);

    let writes = Writes::default();
    assert_eq!(writes.typical_answer(), Duration::ZERO);
    writes.answer_took(us(200));
    assert_eq!(writes.typical_answer(), us(200));
    // A checkpoint's 10 ms counts as 2 ms: the looks go on.
    writes.answer_took(ms(10));
    assert_eq!(writes.typical_answer(), us(650));
    assert_eq!(spin_for(writes.typical_answer(), writes.answer_spin), ms(1));
    // A disk that takes 5 ms for every commit: the looks stop, then come back with it.
    for _ in 0..20 {
        writes.answer_took(ms(5));
    }
    assert!(writes.typical_answer() > ms(1));
    assert_eq!(
        spin_for(writes.typical_answer(), writes.answer_spin),
        Duration::ZERO
    );
    for _ in 0..20 {
        writes.answer_took(us(150));
    }
    assert!(writes.typical_answer() < us(200));
    assert!(spin_for(writes.typical_answer(), writes.answer_spin) > Duration::ZERO);
}

/// Looks stopped by slow answers come back once answers are fast again, even where a wake
/// costs about as much as the longest look, so that every wait that parks measures more
/// than it: one wait in sixteen looks whatever answers have taken.
#[test]
fn looks_stopped_by_slow_answers_come_back() {
    let (us, ms) = (Duration::from_micros, Duration::from_millis);
    let writes = Writes::default();
    // A lone caller's wait for a commit taking `commit`, a wake costing `wake`: found
    // while looking, or parked and woken.
    let wait = |commit: Duration, wake: Duration| {
        let spin = writes.spin();
        writes.answer_took(if commit <= spin {
            commit
        } else {
            commit + wake
        });
        spin
    };
    // A burst of slow commits: the looks stop, but for one wait in sixteen.
    let looked = (0..64)
        .filter(|_| wait(ms(5), us(950)) > Duration::ZERO)
        .count();
    assert_eq!(looked, 4);
    assert!(writes.typical_answer() > ms(1));
    // Commits fast again, a wake costing 950 µs: within 32 waits the looks are back for
    // every wait, and the typical time is the commit's.
    for _ in 0..32 {
        wait(us(150), us(950));
    }
    assert!((0..32).all(|_| wait(us(150), us(950)) > Duration::ZERO));
    assert!(writes.typical_answer() < us(200));
}

/// Setting the longest look keeps the writer's linger, and setting the linger keeps the
/// longest look; a lone caller's writes teach the store how long answers take.
#[tokio::test]
async fn the_answer_spin_and_the_linger_are_set_apart() {
    let store = SqliteStore::open_in_memory()
        .unwrap()
        .with_writer_linger(Duration::from_micros(70))
        .with_answer_spin(Duration::ZERO);
    assert_eq!(store.writes.linger, Duration::from_micros(70));
    assert_eq!(store.writes.answer_spin, Duration::ZERO);
    let store = store
        .with_answer_spin(Duration::from_secs(5))
        .with_writer_linger(Duration::ZERO);
    assert_eq!(store.writes.answer_spin, MAX_LINGER, "taken as one second");
    assert_eq!(store.writes.linger, Duration::ZERO);
    for n in 0..3 {
        store
            .write(move |tx, now| insert(tx, &format!("k{n}"), now))
            .await
            .unwrap();
    }
    assert!(store.writes.typical_answer() > Duration::ZERO);
    assert_eq!(keys(&store).len(), 3);
}

/// A write not yet committed on the writer's connection (a transaction open, as a panic
/// mid-commit leaves it) is never read on the caller's thread: a replay answered from it
/// would stand on a write that may be rolled back. The read is left to the pool, which
/// reads what was committed.
#[tokio::test]
async fn an_uncommitted_write_on_the_writers_connection_is_not_read() {
    let dir = tempfile_dir();
    let store = SqliteStore::open(dir.join("uncommitted.db")).unwrap();
    let key = RecordKey::new("acme", "k");
    {
        let conn = store.conn.lock().unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        insert(&conn, "k", 0).unwrap();
    }
    assert!(matches!(store.read_inline(&key), Inline::Unread));
    {
        let conn = store.conn.lock().unwrap();
        conn.execute_batch("ROLLBACK").unwrap();
    }
    assert!(matches!(store.read_inline(&key), Inline::Free));
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A read on the writer's connection, made on the caller's thread, leaves the connection's
/// busy timeout as it found it: the next write still waits for another process's lock
/// rather than failing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The held guard keeps the read on the writer's connection.
#[allow(clippy::await_holding_lock)]
async fn a_read_on_the_writers_connection_keeps_its_busy_timeout() {
    let dir = tempfile_dir();
    let path = dir.join("timeout.db");
    let store = SqliteStore::open(&path).unwrap();
    store.write(|tx, now| insert(tx, "k", now)).await.unwrap();
    {
        let _inline = store.inline.lock().unwrap();
        for key in ["k", "absent"] {
            let read = store.read_inline(&RecordKey::new("acme", key));
            assert!(
                !matches!(read, Inline::Unread),
                "read on the writer's connection"
            );
        }
    }
    // Another process holds the write lock for 300 ms.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.execute_batch("COMMIT").unwrap();
    });
    store
        .write(|tx, now| insert(tx, "after", now))
        .await
        .expect("the write waited for the other process's lock");
    holder.join().unwrap();
    assert!(keys(&store).contains(&"after".to_string()));
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A writer whose queue runs dry takes on the writes that arrive within its linger, one
/// commit each, without another writer being started; past the linger it ends, and the next
/// write starts a writer again.
#[tokio::test]
async fn a_lingering_writer_takes_the_next_writes_then_ends() {
    let dir = tempfile_dir();
    let linger = Duration::from_millis(300);
    let store = SqliteStore::open(dir.join("linger.db"))
        .unwrap()
        .with_writer_linger(linger);
    // Ten first runs (reserve, then complete), each write a pause after the answer before.
    let pause = Duration::from_millis(5);
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    let lease = Duration::from_secs(30);
    let outcome = Outcome::Ok(serde_json::json!(7));
    for n in 0..10 {
        let key = RecordKey::new("acme", format!("k{n}"));
        tokio::time::sleep(pause).await;
        let token = reserved(&store, &key, &fp, lease).await;
        tokio::time::sleep(pause).await;
        assert!(store.complete(&key, &token, &outcome, lease).await.unwrap());
    }
    let writes = &store.writes;
    assert_eq!(writes.commits.load(Ordering::Relaxed), 20);
    assert_eq!(
        writes.writers.load(Ordering::Relaxed),
        1,
        "twenty writes, each {pause:?} after the one before, within its linger"
    );
    tokio::time::sleep(linger * 2).await;
    assert!(!writes.running.load(Ordering::Acquire), "the writer ended");
    store
        .write(|tx, now| insert(tx, "after", now))
        .await
        .unwrap();
    assert_eq!(writes.writers.load(Ordering::Relaxed), 2);
    assert_eq!(writes.commits.load(Ordering::Relaxed), 21);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A reserve read on the pool (the writer's and the inline connections busy) is answered
/// once its own write commits, not once the writer ends: a writer goes on while writes keep
/// coming, and lingers after the last.
#[tokio::test]
// The held guards stand for another caller using the inline connection meanwhile, and a
// commit on the writer's connection while the reserve looks for a connection to read on.
#[allow(clippy::await_holding_lock)]
async fn a_reserve_read_on_the_pool_is_answered_when_its_write_commits() {
    let dir = tempfile_dir();
    let linger = Duration::from_millis(900);
    let store = SqliteStore::open(dir.join("answered.db"))
        .unwrap()
        .with_writer_linger(linger);
    let key = RecordKey::new("acme", "k");
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    let held = store.inline.lock().unwrap();
    let committing = store.conn.lock().unwrap();
    assert!(matches!(store.read_inline(&key), Inline::Unread));
    let token = Token::generate();
    let answer = {
        let mut reserve = std::pin::pin!(store.reserve(&key, "tool", &fp, &token, linger));
        // Its first poll finds no connection free and hands its read to the pool.
        assert!(futures_util::poll!(&mut reserve).is_pending());
        drop(committing);
        tokio::time::timeout(linger / 3, reserve)
            .await
            .expect("the reserve waited for its writer to end")
    };
    assert!(matches!(answer, Ok(Reservation::Reserved { .. })));
    drop(held);
    assert_eq!(store.writes.commits.load(Ordering::Relaxed), 1);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A writer the blocking pool drops unstarted (its runtime shutting down) still runs: the
/// write that started it is kept, and a write from another runtime sharing the store is
/// answered, not left waiting for a writer that never comes.
#[test]
fn a_writer_its_runtime_drops_unstarted_still_runs() {
    let dir = tempfile_dir();
    let store = SqliteStore::open(dir.join("dropped.db")).unwrap();
    let ending = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = ending.handle().clone();
    ending.shutdown_background();
    // A write polled once on the runtime that is shutting down: it joins the queue, and the
    // pool drops the writer handed to it.
    {
        let _entered = handle.enter();
        let first = store.write(|tx, now| insert(tx, "first", now));
        assert!(futures_util::FutureExt::now_or_never(first).is_none());
    }
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wrote = other.block_on(async {
        let second = store.write(|tx, now| insert(tx, "second", now));
        tokio::time::timeout(Duration::from_secs(5), second).await
    });
    assert!(matches!(wrote, Ok(Ok(()))), "{wrote:?}");
    assert_eq!(keys(&store), ["first", "second"]);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A linger too long to add to the time (`Duration::MAX`) is taken as the longest the store
/// allows: the writer answers each write, and the next write is answered too.
#[tokio::test]
async fn a_linger_too_long_to_add_to_the_time_is_cut_to_the_longest() {
    let dir = tempfile_dir();
    let store = SqliteStore::open(dir.join("long.db"))
        .unwrap()
        .with_writer_linger(Duration::MAX);
    assert_eq!(store.writes.linger, MAX_LINGER);
    for key in ["a", "b"] {
        let wrote = tokio::time::timeout(
            Duration::from_secs(5),
            store.write(move |tx, now| insert(tx, key, now)),
        )
        .await;
        assert!(matches!(wrote, Ok(Ok(()))), "{key}: {wrote:?}");
    }
    assert_eq!(keys(&store), ["a", "b"]);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The system clock, which panics once when told to.
struct PanicOnce(AtomicBool);

impl Clock for PanicOnce {
    fn now(&self) -> SystemTime {
        if self.0.swap(false, Ordering::AcqRel) {
            panic!("a clock that panics");
        }
        SystemTime::now()
    }
}

/// A clock that panics once, as a commit reads it, fails that commit's write alone: nothing
/// of it is kept, and the writer goes on, so the next write is answered and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_a_commit_fails_its_writes_and_not_the_writer() {
    let dir = tempfile_dir();
    let clock = Arc::new(PanicOnce(AtomicBool::new(false)));
    let store = SqliteStore::open(dir.join("panic.db"))
        .unwrap()
        .with_clock(clock.clone());
    clock.0.store(true, Ordering::Release);
    let failed = store.write(|tx, now| insert(tx, "lost", now)).await;
    assert!(
        matches!(&failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    // Another process can take the write lock as soon as the write is answered: the failed
    // commit's transaction was rolled back first, not left open until the next write.
    assert_write_lock_free(&dir.join("panic.db"));
    let wrote = tokio::time::timeout(
        Duration::from_secs(5),
        store.write(|tx, now| insert(tx, "kept", now)),
    )
    .await;
    assert!(matches!(wrote, Ok(Ok(()))), "{wrote:?}");
    assert_eq!(keys(&store), ["kept"]);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A batch whose transaction fails part way (here a write that ends its own savepoint, so
/// that the writer's release of it fails) answers every write of it that nothing was
/// applied, and only once the transaction is rolled back: the writer's connection is outside
/// a transaction, and another process takes the write lock at once.
#[test]
fn a_batch_that_fails_part_way_is_rolled_back_before_its_writes_are_answered() {
    let dir = tempfile_dir();
    let store = SqliteStore::open(dir.join("failed.db")).unwrap();
    // Both writes queued before a writer runs, so that one commit carries them.
    let (first, first_answer) = Job::queued(|conn: &Connection, now| {
        insert(conn, "first", now)?;
        conn.execute_batch("RELEASE toolkey_write")
            .map_err(unavailable)
    });
    let (second, second_answer) = Job::queued(|conn: &Connection, now| insert(conn, "second", now));
    assert!(store.writes.submit(first), "no writer was running");
    assert!(!store.writes.submit(second));
    store.writes.combine(&store.conn, &*store.clock);
    for mut answer in [first_answer, second_answer] {
        let answer = answer.try_recv().expect("answered when the writer returns");
        assert!(
            matches!(&answer, Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
    }
    assert!(
        store.conn.lock().unwrap().is_autocommit(),
        "the writer's connection holds no transaction"
    );
    assert_write_lock_free(&dir.join("failed.db"));
    assert!(keys(&store).is_empty(), "{:?}", keys(&store));
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A commit that panicked leaves the writer's connection marked poisoned, and rolled back:
/// a replay after it still reads on that connection on the caller's thread, not on the
/// blocking pool for the rest of the process's life.
#[tokio::test]
async fn a_replay_after_a_panicked_commit_still_reads_on_the_writers_connection() {
    let dir = tempfile_dir();
    let clock = Arc::new(PanicOnce(AtomicBool::new(false)));
    let store = SqliteStore::open(dir.join("poisoned.db"))
        .unwrap()
        .with_clock(clock.clone());
    store.write(|tx, now| insert(tx, "k", now)).await.unwrap();
    clock.0.store(true, Ordering::Release);
    let failed = store.write(|tx, now| insert(tx, "lost", now)).await;
    assert!(matches!(failed, Err(StoreError::Unavailable(_))));
    assert!(store.conn.is_poisoned());
    let inline = store.inline.lock().unwrap();
    let read = store.read_inline(&RecordKey::new("acme", "k"));
    assert!(
        matches!(read, Inline::Live(_)),
        "read on the writer's connection"
    );
    let read = store.read_inline(&RecordKey::new("acme", "lost"));
    assert!(
        matches!(read, Inline::Free),
        "the panicked write was rolled back"
    );
    drop(inline);
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A commit that fails answers every write of its batch as unavailable, none as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_begin_answers_every_write_unavailable() {
    let dir = tempfile_dir();
    let path = dir.join("locked.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    lock(&store.conn)
        .busy_timeout(Duration::from_millis(50))
        .unwrap();
    // Another process holds the write lock.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let answers = futures_util::future::join_all((0..4).map(|i| {
        let store = store.clone();
        async move {
            store
                .write(move |tx, now| insert(tx, &format!("k{i}"), now))
                .await
        }
    }))
    .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(StoreError::Unavailable(_)))),
        "{answers:?}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    assert!(keys(&store).is_empty());
    store
        .write(|tx, now| insert(tx, "after", now))
        .await
        .unwrap();
    assert_eq!(keys(&store), ["after"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile_dir();
    let path = dir.join("newer.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains(&format!("schema version {}", SCHEMA_VERSION + 1))),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A file written before retry limits existed (schema version 1 as it was then: the records
/// table, no counters table) opens, gains the counters' table, and keeps its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_before_retry_limits_gains_the_counters_and_keeps_its_records() {
    let dir = tempfile_dir();
    let path = dir.join("before.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE toolkey_records (
                 tenant TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL,
                 token TEXT NOT NULL, fingerprint TEXT NOT NULL, since_ms INTEGER NOT NULL,
                 lease_until_ms INTEGER NOT NULL, outcome TEXT, completed_at_ms INTEGER,
                 expires_at_ms INTEGER, PRIMARY KEY (tenant, key)
             ) WITHOUT ROWID;
             CREATE INDEX toolkey_records_expiry ON toolkey_records (expires_at_ms)
                 WHERE state = 'completed';
             PRAGMA user_version = 1;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint, since_ms,
                 lease_until_ms, outcome, completed_at_ms, expires_at_ms)
             VALUES ('shop', 'refund:o-1', 'completed', 't-1', ?1, 0, 0, ?2, 0, ?3)",
            params![
                crate::Fingerprint::of(&1).unwrap().to_hex(),
                Outcome::Ok(serde_json::json!("re-1")).to_stored(),
                i64::MAX
            ],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let key = RecordKey::new("shop", "refund:o-1");
    assert!(matches!(
        store.get(&key).await.unwrap(),
        Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if v == "re-1"
    ));
    let window = Duration::from_secs(60);
    assert_eq!(store.count_failure(&key, window).await.unwrap(), 1);
    assert_eq!(store.count_failure(&key, window).await.unwrap(), 2);
    assert_eq!(store.failures(&key).await.unwrap(), 2);
    drop(store);
    // Reopened, the counters are still there; the version is unchanged.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.failures(&key).await.unwrap(), 2);
    let version: i64 = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Ended counters leave the table as failures are counted, a bounded number at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_counters_are_swept() {
    let clock = Arc::new(crate::store::ManualClock::new());
    let store = SqliteStore::open_in_memory()
        .unwrap()
        .with_clock(clock.clone());
    let window = Duration::from_secs(60);
    for n in 0..100 {
        let key = RecordKey::new("shop", format!("k-{n}"));
        store.count_failure(&key, window).await.unwrap();
    }
    clock.advance(window);
    let rows = |store: &SqliteStore| -> i64 {
        lock(&store.conn)
            .query_row("SELECT COUNT(*) FROM toolkey_failures", [], |row| {
                row.get(0)
            })
            .unwrap()
    };
    assert_eq!(rows(&store), 100);
    let fresh = RecordKey::new("shop", "fresh");
    store.count_failure(&fresh, window).await.unwrap();
    assert_eq!(rows(&store), 100 - FAILURE_SWEEP + 1);
    assert_eq!(store.count_failure(&fresh, window).await.unwrap(), 2);
    assert_eq!(rows(&store), 1, "the rest swept, the open window kept");
}

#[test]
fn reopening_keeps_the_schema() {
    let dir = tempfile_dir();
    let path = dir.join("again.db");
    drop(SqliteStore::open(&path).unwrap());
    drop(SqliteStore::open(&path).unwrap());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Another process takes the file's write lock at once: no transaction holds it.
fn assert_write_lock_free(path: &std::path::Path) {
    let other = Connection::open(path).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock is free");
    other.execute_batch("ROLLBACK").unwrap();
}

/// A fresh directory under the system's temporary directory (the runtime has no tempfile
/// dependency).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("toolkey-sqlite-{}", Token::generate()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
