use super::counters::FIRST_SWEEP;
use super::records::KEEP_READ;
use super::*;

/// A record's tenant, key and token share one allocation, one after another: a tenant and
/// key that spell the same text together ("ab" + "c", "a" + "bc") are still two records,
/// found, completed and listed apart.
#[tokio::test]
async fn tenant_and_key_spelling_the_same_text_are_two_records() {
    let store = MemoryStore::new();
    let (a, b) = (RecordKey::new("ab", "c"), RecordKey::new("a", "bc"));
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    let lease = Duration::from_secs(30);
    let mut tokens = Vec::new();
    for key in [&a, &b] {
        match store
            .reserve(key, "tool", &fp, &Token::generate(), lease)
            .await
        {
            Ok(Reservation::Reserved { token, .. }) => tokens.push(token),
            other => panic!("{key:?} was not free: {other:?}"),
        }
    }
    let done = Outcome::Ok(serde_json::json!("a's"));
    let retain = Duration::from_secs(60);
    assert!(store.complete(&a, &tokens[0], &done, retain).await.unwrap());
    assert!(matches!(
        store.get(&b).await.unwrap(),
        Some(Record::InProgress { .. })
    ));
    assert!(!store.complete(&b, &tokens[0], &done, retain).await.unwrap());
    let page = store.list(&Filter::default(), None, 10).await.unwrap();
    let keys: Vec<&RecordKey> = page.entries.iter().map(|e| &e.key).collect();
    assert_eq!(keys, [&b, &a]);
}

const LEASE: Duration = Duration::from_secs(30);
const RETAIN: Duration = Duration::from_secs(60);

/// A [`ManualClock`] that counts how often it is read.
#[derive(Default)]
struct CountedClock {
    clock: ManualClock,
    reads: std::sync::atomic::AtomicUsize,
}

impl CountedClock {
    fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clock for CountedClock {
    fn now(&self) -> SystemTime {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.clock.now()
    }
}

/// The lookup every keyed call makes before its reserve reads the clock only for a completed
/// record, whose expiry it decides: a first call (no record) and a call meeting one in
/// progress read it in their reserve alone. A completed record past its retention is still
/// not answered from memory.
#[tokio::test]
async fn the_lookup_before_a_reserve_reads_the_clock_only_for_a_completed_record() {
    let clock = Arc::new(CountedClock::default());
    let store = MemoryStore::with_clock(clock.clone());
    let key = RecordKey::new("acme", "invoice:7");
    assert!(replayed(&store, &key).is_none());
    assert_eq!(clock.reads(), 0, "no record: no clock read");

    let token = reserved(&store, &key).await;
    let after_reserve = clock.reads();
    assert!(replayed(&store, &key).is_none());
    assert_eq!(clock.reads(), after_reserve, "in progress: no clock read");

    let done = Outcome::Ok(serde_json::json!(7));
    assert!(store.complete(&key, &token, &done, RETAIN).await.unwrap());
    let completed = clock.reads();
    assert_eq!(replayed(&store, &key), Some(done));
    assert_eq!(
        clock.reads(),
        completed + 1,
        "completed: its expiry is read"
    );

    clock.clock.advance(RETAIN);
    assert!(replayed(&store, &key).is_none(), "expired: not replayed");
    assert_eq!(clock.reads(), completed + 2);
}

/// A release and a mark as unknown do not depend on the time, and read no clock: only the
/// reserves before them do.
#[tokio::test]
async fn writes_that_do_not_depend_on_the_time_read_no_clock() {
    let clock = Arc::new(CountedClock::default());
    let store = MemoryStore::with_clock(clock.clone());
    let (released, unknown) = (RecordKey::new("acme", "a"), RecordKey::new("acme", "b"));
    let token = reserved(&store, &released).await;
    let before = clock.reads();
    assert!(store.release(&released, &token).await.unwrap());
    assert_eq!(clock.reads(), before, "release");

    let token = reserved(&store, &unknown).await;
    let before = clock.reads();
    assert!(store.mark_unknown(&unknown, &token).await.unwrap());
    assert_eq!(clock.reads(), before, "mark_unknown");
    assert!(matches!(
        store.get(&unknown).await.unwrap(),
        Some(Record::Stale { .. })
    ));
    assert!(store.get(&released).await.unwrap().is_none());
}

/// The token under which `key`, free, is now reserved.
async fn reserved(store: &MemoryStore, key: &RecordKey) -> Token {
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    match store
        .reserve(key, "tool", &fp, &Token::generate(), LEASE)
        .await
    {
        Ok(Reservation::Reserved { token, .. }) => token,
        other => panic!("{key:?} was not free: {other:?}"),
    }
}

/// The outcome a replay of `key` reads from memory.
fn replayed(store: &MemoryStore, key: &RecordKey) -> Option<Outcome> {
    match store.completed_here(key.borrowed())? {
        Record::Completed { outcome, .. } => Some(outcome),
        other => panic!("not completed: {other:?}"),
    }
}

/// A replay, `get` and `reserve` of completed `key` each answer `outcome`.
async fn reads_answer(store: &MemoryStore, key: &RecordKey, outcome: &Outcome) {
    assert_eq!(replayed(store, key).as_ref(), Some(outcome));
    let Some(Record::Completed { outcome: got, .. }) = store.get(key).await.unwrap() else {
        panic!("not completed");
    };
    assert_eq!(&got, outcome);
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    match store
        .reserve(key, "tool", &fp, &Token::generate(), LEASE)
        .await
    {
        Ok(Reservation::Existing(Record::Completed { outcome: got, .. })) => {
            assert_eq!(&got, outcome)
        }
        other => panic!("not the completed record: {other:?}"),
    }
}

/// A completed record's outcome text follows its tenant, key and token in one allocation:
/// every read (a replay, `get`, `reserve`, `list`) answers the outcome recorded, whatever
/// its text holds, and the record's token is read apart from it.
#[tokio::test]
async fn every_read_answers_the_outcome_recorded_after_the_key_and_token() {
    let store = MemoryStore::new();
    let outcomes = [
        Outcome::Ok(serde_json::json!({
            "id": u64::MAX, "delta": -1, "amount": 1.5, "tiny": 1e-300,
            "name": "Zoë \"quoted\" \u{1F600}", "lines": [{"sku": "a", "n": 2}, null, []],
            "empty": {}, "yes": true
        })),
        Outcome::Ok(serde_json::Value::Null),
        Outcome::Ok(serde_json::json!("")),
        Outcome::Ok(serde_json::json!("shopk-3tok")),
        Outcome::Err(
            crate::ToolError::new("PAYMENT_DECLINED", "card declined")
                .with_suggestion("ask for another card"),
        ),
    ];
    for (n, outcome) in outcomes.iter().enumerate() {
        let key = RecordKey::new("shop", format!("k-{n}"));
        let token = reserved(&store, &key).await;
        assert!(store.complete(&key, &token, outcome, RETAIN).await.unwrap());
        for _ in 0..2 {
            reads_answer(&store, &key, outcome).await;
        }
        let filter = Filter {
            key: Some(key.key.clone()),
            ..Filter::default()
        };
        let page = store.list(&filter, None, 10).await.unwrap();
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.entries[0].outcome.as_ref(), Some(outcome));
        assert_eq!(
            page.entries[0].revision, token,
            "the token, without the outcome"
        );
        // A fenced write with the old token finds nothing to change.
        assert!(!store.release(&key, &token).await.unwrap());
    }
}

/// A key run again after its record expired answers its new outcome, when the new record
/// takes the old one's place in the table; a stale record taken over and resolved keeps its
/// key and answers the outcome it was resolved with.
#[tokio::test]
async fn a_record_put_again_or_taken_over_answers_its_own_outcome() {
    let clock = Arc::new(ManualClock::new());
    let store = MemoryStore::with_clock(clock.clone());
    let key = RecordKey::new("shop", "again");
    let (first, second) = (
        Outcome::Ok(serde_json::json!("first, and longer than the second")),
        Outcome::Ok(serde_json::json!("second")),
    );
    let token = reserved(&store, &key).await;
    assert!(store.complete(&key, &token, &first, RETAIN).await.unwrap());
    // Replayed, the record keeps its outcome's reading; the new record must not answer it.
    assert_eq!(replayed(&store, &key), Some(first.clone()));
    assert!(kept(&store, &key));
    clock.advance(RETAIN);
    assert_eq!(replayed(&store, &key), None, "expired");
    let token = reserved(&store, &key).await;
    assert!(store.complete(&key, &token, &second, RETAIN).await.unwrap());
    assert_eq!(replayed(&store, &key), Some(second.clone()));

    let other = RecordKey::new("shop", "stale");
    let token = reserved(&store, &other).await;
    clock.advance(LEASE);
    let taken = store
        .take_over(&other, &token, LEASE)
        .await
        .unwrap()
        .unwrap();
    assert!(store.mark_unknown(&other, &taken).await.unwrap());
    let done = Resolution::Done {
        outcome: first.clone(),
        retain: RETAIN,
    };
    assert!(store.resolve(&other, &taken, &done).await.unwrap());
    assert_eq!(replayed(&store, &other), Some(first));
    let page = store.list(&Filter::default(), None, 10).await.unwrap();
    let keys: Vec<&RecordKey> = page.entries.iter().map(|e| &e.key).collect();
    assert_eq!(keys, [&key, &other]);
}

/// Whether `key`'s record keeps a reading of its outcome.
fn kept(store: &MemoryStore, key: &RecordKey) -> bool {
    store.with(|records, _| {
        records
            .get_mut(key.borrowed())
            .is_some_and(|node| node.read.is_some())
    })
}

/// A result `depth` levels of arrays deep.
fn nested(depth: usize) -> serde_json::Value {
    (0..depth).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]))
}

/// The first read of a completed record keeps what it read, and the reads after it answer
/// the same outcome from it, through every read; the reading goes when the text changes (so
/// a record whose text no longer reads is reported, not answered from memory), and is not
/// kept for a long or deep text, which every read reads again.
#[tokio::test]
async fn a_records_reading_is_kept_only_while_its_text_holds_and_when_small() {
    let store = MemoryStore::new();
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    let long = "x".repeat(KEEP_READ);
    let cases = [
        (
            Outcome::Ok(serde_json::json!({"id": 7, "to": "acme"})),
            true,
        ),
        (
            Outcome::Err(crate::ToolError::new("DECLINED", "card declined")),
            true,
        ),
        (Outcome::Ok(nested(100)), true),
        (Outcome::Ok(serde_json::json!(long)), false),
        (Outcome::Ok(nested(200)), false),
    ];
    for (n, (outcome, keeps)) in cases.iter().enumerate() {
        let key = RecordKey::new("shop", format!("k-{n}"));
        let token = reserved(&store, &key).await;
        assert!(store.complete(&key, &token, outcome, RETAIN).await.unwrap());
        assert!(!kept(&store, &key), "kept before any read");
        for _ in 0..3 {
            reads_answer(&store, &key, outcome).await;
            assert_eq!(kept(&store, &key), *keeps, "case {n}");
        }
        // The text changes under the kept reading (as disk damage would): every read
        // reads the text again and reports it.
        store.with(|records, _| {
            records
                .get_mut(key.borrowed())
                .unwrap()
                .hold_text("{not json")
        });
        assert_eq!(
            replayed(&store, &key),
            None,
            "left to reserve, which reports it"
        );
        assert!(matches!(
            store.get(&key).await,
            Err(StoreError::Corrupt { .. })
        ));
        let reserve = store
            .reserve(&key, "tool", &fp, &Token::generate(), LEASE)
            .await;
        assert!(
            matches!(reserve, Err(StoreError::Corrupt { .. })),
            "{reserve:?}"
        );
        assert!(!kept(&store, &key));
    }
}

/// A reserve that meets a live record stores nothing, the name of the tool it was made for
/// included: the store's set of names grows only with the records it keeps.
#[tokio::test]
async fn a_reserve_that_stores_nothing_keeps_no_tool_name() {
    let store = MemoryStore::new();
    let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
    let key = RecordKey::new("shop", "k");
    reserved(&store, &key).await;
    for n in 0..100 {
        let answer = store
            .reserve(&key, &format!("other-{n}"), &fp, &Token::generate(), LEASE)
            .await
            .unwrap();
        assert!(matches!(answer, Reservation::Existing(_)), "{answer:?}");
    }
    let records = store.records.lock().unwrap();
    assert_eq!(records.tools.held.len(), 1);
    let held = records.table.iter().next().unwrap();
    assert_eq!(held.tool.as_deref(), Some("tool"));
}

/// Ended counters leave the map once it has doubled since the last sweep.
#[tokio::test]
async fn ended_counters_are_swept() {
    let clock = Arc::new(ManualClock::new());
    let store = MemoryStore::with_clock(clock.clone());
    let window = Duration::from_secs(60);
    let key = |n: usize| RecordKey::new("shop", format!("k-{n}"));
    for n in 0..FIRST_SWEEP {
        store.count_failure(&key(n), window).await.unwrap();
    }
    let held = || store.failures.lock().unwrap().counts.len();
    assert_eq!(held(), FIRST_SWEEP);
    clock.advance(window);
    // The next count sweeps every ended one before it counts.
    assert_eq!(
        store
            .count_failure(&key(FIRST_SWEEP), window)
            .await
            .unwrap(),
        1
    );
    assert_eq!(held(), 1);
    assert_eq!(store.failures(&key(0)).await.unwrap(), 0);
}
