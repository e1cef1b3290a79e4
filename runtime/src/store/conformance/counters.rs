//! Checks of the failure counters of retry limits.

use super::*;

pub(super) async fn failures_are_counted_per_key_and_tenant(cx: Ctx) -> Result<(), String> {
    let key = cx.key("failures");
    let window = cx.long();
    ensure(cx.store.failures(&key).await.map_err(err)? == 0, || {
        "a key that never failed has failures".into()
    })?;
    let mut counts = Vec::new();
    for _ in 0..3 {
        counts.push(cx.store.count_failure(&key, window).await.map_err(err)?);
    }
    ensure(counts == [1, 2, 3], || {
        format!("three counts of one key answered {counts:?}, expected [1, 2, 3]")
    })?;
    let read = cx.store.failures(&key).await.map_err(err)?;
    ensure(read == 3, || {
        format!("failures read {read} after three counts")
    })?;
    let other_key = cx.key("failures-other");
    let other_tenant = RecordKey::new(format!("{}-other", cx.tenant), key.key.clone());
    for other in [&other_key, &other_tenant] {
        let read = cx.store.failures(other).await.map_err(err)?;
        ensure(read == 0, || {
            format!("{other:?} read {read} failures counted for another key or tenant")
        })?;
    }
    let first = cx
        .store
        .count_failure(&other_tenant, window)
        .await
        .map_err(err)?;
    ensure(first == 1, || {
        format!("another tenant's first failure counted {first}, expected 1")
    })
}

pub(super) async fn concurrent_failures_each_get_their_own_count(cx: Ctx) -> Result<(), String> {
    let key = cx.key("failures-race");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (store, key) = (cx.store.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            store.count_failure(&key, Duration::from_secs(300)).await
        }));
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(task.await.map_err(|e| e.to_string())?.map_err(err)?);
    }
    counts.sort_unstable();
    ensure(counts == (1..=32).collect::<Vec<u64>>(), || {
        format!("32 concurrent counts answered {counts:?}, expected each of 1 to 32 once")
    })?;
    let read = cx.store.failures(&key).await.map_err(err)?;
    ensure(read == 32, || {
        format!("failures read {read} after 32 counts")
    })
}

pub(super) async fn a_failure_window_ends_by_itself(cx: Ctx) -> Result<(), String> {
    let key = cx.key("failures-window");
    let window = cx.lease;
    cx.store.count_failure(&key, window).await.map_err(err)?;
    cx.pass(window / 2).await;
    let second = cx.store.count_failure(&key, window).await.map_err(err)?;
    ensure(second == 2, || {
        format!("a second failure within the window counted {second}, expected 2")
    })?;
    // The window runs from the first failure: the second did not move its end.
    cx.pass(window * 3 / 4).await;
    let read = cx.store.failures(&key).await.map_err(err)?;
    ensure(read == 0, || {
        format!("{read} failures read after the window of the first ended")
    })?;
    let again = cx.store.count_failure(&key, window).await.map_err(err)?;
    ensure(again == 1, || {
        format!("the first failure of a new window counted {again}, expected 1")
    })
}

pub(super) async fn clearing_failures_starts_the_count_again(cx: Ctx) -> Result<(), String> {
    let key = cx.key("failures-clear");
    for _ in 0..2 {
        cx.store.count_failure(&key, cx.long()).await.map_err(err)?;
    }
    cx.store.clear_failures(&key).await.map_err(err)?;
    let read = cx.store.failures(&key).await.map_err(err)?;
    ensure(read == 0, || format!("{read} failures read after clearing"))?;
    cx.store.clear_failures(&key).await.map_err(err)?;
    let first = cx.store.count_failure(&key, cx.long()).await.map_err(err)?;
    ensure(first == 1, || {
        format!("the first failure after clearing counted {first}, expected 1")
    })
}

pub(super) async fn failure_counters_never_touch_a_record(cx: Ctx) -> Result<(), String> {
    // Counting a key that has no record makes none.
    let bare = cx.key("failures-bare");
    cx.store
        .count_failure(&bare, cx.long())
        .await
        .map_err(err)?;
    ensure(cx.store.get(&bare).await.map_err(err)?.is_none(), || {
        "counting a failure made a record".into()
    })?;
    cx.reserve(&bare, &fp(1), cx.long()).await?;
    // Counting, reading and clearing a key whose record is held or completed changes neither.
    let key = cx.key("failures-record");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    cx.store.count_failure(&key, cx.long()).await.map_err(err)?;
    cx.store.clear_failures(&key).await.map_err(err)?;
    ensure(
        cx.store
            .complete(&key, &token, &Outcome::Ok(json!("kept")), cx.long())
            .await
            .map_err(err)?,
        || "complete refused after the key's failures were counted and cleared".into(),
    )?;
    cx.store.count_failure(&key, cx.lease).await.map_err(err)?;
    cx.store.failures(&key).await.map_err(err)?;
    cx.lapse().await;
    cx.store.clear_failures(&key).await.map_err(err)?;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(&record, Some(Record::Completed { outcome: Outcome::Ok(v), fingerprint, .. }) if *v == json!("kept") && *fingerprint == fp(1)),
        || format!("the record changed under its failure counter: {record:?}"),
    )?;
    // A purge of expired records leaves an open window's counter alone.
    let counted = cx.key("failures-purge");
    cx.store
        .count_failure(&counted, cx.long())
        .await
        .map_err(err)?;
    cx.store.purge_expired(1000).await.map_err(err)?;
    let read = cx.store.failures(&counted).await.map_err(err)?;
    ensure(read == 1, || format!("a purge changed a counter to {read}"))
}

/// A reservation answers the key's failure count as `failures` reads it: the count of its own
/// key and tenant, 0 once the window ended or was cleared.
pub(super) async fn a_reservation_carries_the_keys_failures(cx: Ctx) -> Result<(), String> {
    let reserved = async |key: &RecordKey| -> Result<u64, String> {
        let token = Token::generate();
        match cx
            .store
            .reserve(key, "tool", &fp(1), &token, cx.long())
            .await
            .map_err(err)?
        {
            Reservation::Reserved { failures, .. } => Ok(failures),
            other => Err(format!("expected Reserved for {key:?}, got {other:?}")),
        }
    };
    let key = cx.key("failures-reserve");
    for _ in 0..3 {
        cx.store.count_failure(&key, cx.long()).await.map_err(err)?;
    }
    let other_tenant = RecordKey::new(format!("{}-other", cx.tenant), key.key.clone());
    cx.store
        .count_failure(&other_tenant, cx.long())
        .await
        .map_err(err)?;
    let got = reserved(&key).await?;
    ensure(got == 3, || {
        format!("a reservation after 3 failures carried {got}")
    })?;
    let fresh = reserved(&cx.key("failures-reserve-none")).await?;
    ensure(fresh == 0, || {
        format!("a reservation of a key never failed carried {fresh}")
    })?;
    let cleared = cx.key("failures-reserve-cleared");
    cx.store
        .count_failure(&cleared, cx.long())
        .await
        .map_err(err)?;
    cx.store.clear_failures(&cleared).await.map_err(err)?;
    let got = reserved(&cleared).await?;
    ensure(got == 0, || {
        format!("a reservation after the count was cleared carried {got}")
    })?;
    let ended = cx.key("failures-reserve-ended");
    cx.store
        .count_failure(&ended, cx.lease)
        .await
        .map_err(err)?;
    cx.lapse().await;
    let got = reserved(&ended).await?;
    ensure(got == 0, || {
        format!("a reservation after the window ended carried {got}")
    })
}
