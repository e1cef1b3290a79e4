//! The local cache of completed records: the conformance suite through it, expiry honoured by
//! the cache's own clock, and its memory bounded by its byte budget.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{
    CachedStore, ManualClock, MemoryStore, Outcome, Record, RecordKey, Reservation, Reservations,
    Store, Token,
};
use toolkey::Fingerprint;
use toolkey_tests::conformance;

fn cached(clock: &Arc<ManualClock>, budget: u64) -> Arc<CachedStore<Arc<MemoryStore>>> {
    let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
    Arc::new(CachedStore::new(inner, budget).with_clock(clock.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_memory_store_conforms() {
    let clock = Arc::new(ManualClock::new());
    conformance::run(cached(&clock, 1 << 20), Some(clock)).await;
}

fn fp(n: u64) -> Fingerprint {
    Fingerprint::of(&json!({ "n": n })).unwrap()
}

/// Reserves and completes `key` through `store` with `outcome`, kept for `retain`.
async fn finish(store: &impl Store, key: &RecordKey, outcome: Outcome, retain: Duration) {
    let Reservation::Reserved { token, .. } = store
        .reserve(
            key,
            "tool",
            &fp(1),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    assert!(store.complete(key, &token, &outcome, retain).await.unwrap());
}

#[tokio::test]
async fn a_completed_record_is_answered_from_the_cache_until_its_expiry() {
    let clock = Arc::new(ManualClock::new());
    let store = cached(&clock, 1 << 20);
    let key = RecordKey::new("t", "invoice:acme");
    finish(
        &*store,
        &key,
        Outcome::Ok(json!(42)),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        store.len(),
        1,
        "the outcome written through the cache is kept"
    );

    // Another action's call with the same key meets the cached record: CONFLICT follows.
    clock.advance(Duration::from_secs(8));
    let answer = store
        .reserve(
            &key,
            "tool",
            &fp(2),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        matches!(&answer, Reservation::Existing(Record::Completed { outcome: Outcome::Ok(v), fingerprint, .. })
            if *v == json!(42) && *fingerprint == fp(1)),
        "{answer:?}"
    );

    // Within the allowed skew of the expiry, the cache no longer answers: the store does.
    clock.advance(Duration::from_millis(1_500));
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "the store still has it"
    );
    assert_eq!(
        store.len(),
        0,
        "a record this close to expiry is not cached again"
    );
    clock.advance(Duration::from_secs(1));
    let again = store
        .reserve(
            &key,
            "tool",
            &fp(2),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        matches!(again, Reservation::Reserved { .. }),
        "an expired record is a new action: {again:?}"
    );
}

#[tokio::test]
async fn records_in_progress_or_unknown_are_never_cached() {
    let clock = Arc::new(ManualClock::new());
    let store = cached(&clock, 1 << 20);
    let key = RecordKey::new("t", "refund:o-1");
    let Reservation::Reserved { token, .. } = store
        .reserve(
            &key,
            "tool",
            &fp(1),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    for _ in 0..3 {
        let answer = store
            .reserve(
                &key,
                "tool",
                &fp(1),
                &Token::generate(),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        assert!(matches!(
            answer,
            Reservation::Existing(Record::InProgress { .. })
        ));
    }
    assert!(store.mark_unknown(&key, &token).await.unwrap());
    assert!(matches!(
        store.get(&key).await.unwrap(),
        Some(Record::Stale { reported: true, .. })
    ));
    assert_eq!(store.len(), 0);
}

#[tokio::test]
async fn the_cache_stays_within_its_byte_budget() {
    let clock = Arc::new(ManualClock::new());
    let budget = 64 * 1024;
    let store = cached(&clock, budget);
    let big = "x".repeat(1_000);
    for i in 0..1_000 {
        let key = RecordKey::new("t", format!("k:{i}"));
        finish(
            &*store,
            &key,
            Outcome::Ok(json!(big)),
            Duration::from_secs(3600),
        )
        .await;
        assert!(store.bytes() <= budget, "{} bytes after {i}", store.bytes());
    }
    assert!(
        store.len() < 100,
        "{} records of 1 kB in 64 kB",
        store.len()
    );
    // Every record still reads back whole, from the cache or from the store.
    for i in 0..1_000 {
        let key = RecordKey::new("t", format!("k:{i}"));
        assert!(matches!(
            store.get(&key).await.unwrap(),
            Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if v == json!(big)
        ));
    }
}

#[tokio::test]
async fn an_outcome_whose_reply_was_lost_is_read_from_the_store_not_guessed() {
    use toolkey::store::faults::{FaultyStore, Op, Plan};
    let clock = Arc::new(ManualClock::new());
    let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
    // The store applies the complete and the reply is lost on the way back.
    let faulty = FaultyStore::new(
        inner.clone(),
        Plan::random(7).lose_reply(1.0).only([Op::Complete]),
    );
    let store = CachedStore::new(faulty, 1 << 20).with_clock(clock.clone());
    let key = RecordKey::new("t", "invoice:lost");
    let Reservation::Reserved { token, .. } = store
        .reserve(
            &key,
            "tool",
            &fp(1),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    let lost = store
        .complete(
            &key,
            &token,
            &Outcome::Ok(json!("sent")),
            Duration::from_secs(60),
        )
        .await;
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(
        store.len(),
        0,
        "an answer the store never gave is not cached"
    );
    // The next caller reads what the store holds, and only then is it cached.
    let answer = store
        .reserve(
            &key,
            "tool",
            &fp(1),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(
        answer,
        Reservation::Existing(Record::Completed { outcome: Outcome::Ok(v), .. }) if v == json!("sent")
    ));
    assert_eq!(store.len(), 1);
    assert_eq!(
        store.inner().calls(Op::Reserve),
        2,
        "the second reserve asked the store"
    );
    // From then on the cache answers.
    store
        .reserve(
            &key,
            "tool",
            &fp(1),
            &Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(store.inner().calls(Op::Reserve), 2);
}

/// A replay asks the cache with the call's tenant and key borrowed: it finds the entry kept
/// under the owned key, and only that one, with nothing behind the cache that could answer.
#[tokio::test]
async fn a_borrowed_key_finds_its_cached_record_and_no_other() {
    use toolkey::store::faults::{FaultyStore, Plan};
    use toolkey::store::RecordKeyRef;
    // The fault store answers no `completed_here` of its own: every answer is the cache's.
    let store = CachedStore::new(
        FaultyStore::new(MemoryStore::new(), Plan::script([])),
        1 << 20,
    );
    let key = RecordKey::new("ab", "c");
    finish(
        &store,
        &key,
        Outcome::Ok(json!("ab's")),
        Duration::from_secs(60),
    )
    .await;
    match store.completed_here(key.borrowed()) {
        Some(Record::Completed { outcome, .. }) => assert_eq!(outcome, Outcome::Ok(json!("ab's"))),
        other => panic!("not answered from the cache: {other:?}"),
    }
    // The same text split otherwise is another tenant's key.
    assert!(store.completed_here(RecordKeyRef::new("a", "bc")).is_none());
    assert!(store.completed_here(RecordKeyRef::new("ab", "")).is_none());
}
