//! Checks of reservations: one holder, fencing, completion, expiry, tenants, outcomes and
//! corruption.

use super::*;

pub(super) async fn reserve_then_in_progress(cx: Ctx) -> Result<(), String> {
    let key = cx.key("a");
    cx.reserve(&key, &fp(1), cx.long()).await?;
    let again = cx
        .store
        .reserve(&key, "tool", &fp(2), &Token::generate(), cx.long())
        .await
        .map_err(err)?;
    ensure(
        matches!(&again, Reservation::Existing(Record::InProgress { fingerprint, .. }) if *fingerprint == fp(1)),
        || {
            format!("second reserve should see the first in progress with its fingerprint, got {again:?}")
        },
    )
}

pub(super) async fn concurrent_reserve_gives_one_token(cx: Ctx) -> Result<(), String> {
    let key = cx.key("race");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = cx.store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            store
                .reserve(
                    &key,
                    "tool",
                    &fp(1),
                    &Token::generate(),
                    Duration::from_secs(300),
                )
                .await
        }));
    }
    let mut reserved = 0;
    for task in tasks {
        match task.await.map_err(|e| e.to_string())?.map_err(err)? {
            Reservation::Reserved { .. } => reserved += 1,
            Reservation::Existing(Record::InProgress { .. }) => {}
            other => return Err(format!("unexpected answer in race: {other:?}")),
        }
    }
    ensure(reserved == 1, || {
        format!("32 concurrent reserves gave {reserved} tokens, expected 1")
    })
}

pub(super) async fn stale_tokens_are_refused(cx: Ctx) -> Result<(), String> {
    let key = cx.key("fenced");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    let wrong = Token::generate();
    let s = &cx.store;
    ensure(
        !s.complete(&key, &wrong, &Outcome::Ok(json!(1)), cx.long())
            .await
            .map_err(err)?,
        || "complete with a wrong token applied".into(),
    )?;
    ensure(!s.release(&key, &wrong).await.map_err(err)?, || {
        "release with a wrong token applied".into()
    })?;
    ensure(
        !s.renew(&key, &wrong, cx.long()).await.map_err(err)?,
        || "renew with a wrong token applied".into(),
    )?;
    ensure(!s.mark_unknown(&key, &wrong).await.map_err(err)?, || {
        "mark_unknown with a wrong token applied".into()
    })?;
    ensure(
        s.take_over(&key, &wrong, cx.long())
            .await
            .map_err(err)?
            .is_none(),
        || "take_over of a live record applied".into(),
    )?;
    ensure(
        s.take_over(&key, &token, cx.long())
            .await
            .map_err(err)?
            .is_none(),
        || "take_over of a record with a current lease applied".into(),
    )?;
    let record = s.get(&key).await.map_err(err)?;
    ensure(matches!(record, Some(Record::InProgress { .. })), || {
        format!("refused writes changed the record: {record:?}")
    })?;
    ensure(
        s.complete(&key, &token, &Outcome::Ok(json!(1)), cx.long())
            .await
            .map_err(err)?,
        || "complete with the right token was refused".into(),
    )?;
    ensure(!s.release(&key, &token).await.map_err(err)?, || {
        "release after complete applied".into()
    })?;
    ensure(
        !s.complete(&key, &token, &Outcome::Ok(json!(2)), cx.long())
            .await
            .map_err(err)?,
        || "a second complete applied".into(),
    )?;
    let record = s.get(&key).await.map_err(err)?;
    ensure(
        matches!(&record, Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if *v == json!(1)),
        || format!("the first outcome should stay, got {record:?}"),
    )
}

pub(super) async fn completed_is_returned_with_outcome(cx: Ctx) -> Result<(), String> {
    let key = cx.key("done");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    let outcome = Outcome::Ok(json!({"invoice": "inv-1", "amount": 100.5}));
    ensure(
        cx.store
            .complete(&key, &token, &outcome, cx.long())
            .await
            .map_err(err)?,
        || "complete refused".into(),
    )?;
    let again = cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await
        .map_err(err)?;
    ensure(
        matches!(&again, Reservation::Existing(Record::Completed { fingerprint, outcome: o, .. }) if *fingerprint == fp(1) && *o == outcome),
        || format!("reserve after complete should return the outcome, got {again:?}"),
    )
}

pub(super) async fn release_frees_the_key(cx: Ctx) -> Result<(), String> {
    let key = cx.key("free");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    ensure(cx.store.release(&key, &token).await.map_err(err)?, || {
        "release refused".into()
    })?;
    ensure(cx.store.get(&key).await.map_err(err)?.is_none(), || {
        "released record still readable".into()
    })?;
    cx.reserve(&key, &fp(2), cx.long()).await.map(drop)
}

pub(super) async fn expiry_is_checked_at_read_time(cx: Ctx) -> Result<(), String> {
    let key = cx.key("expiry");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    ensure(
        cx.store
            .complete(&key, &token, &Outcome::Ok(json!(1)), cx.lease)
            .await
            .map_err(err)?,
        || "complete refused".into(),
    )?;
    ensure(cx.store.get(&key).await.map_err(err)?.is_some(), || {
        "a fresh record is missing".into()
    })?;
    cx.lapse().await;
    ensure(cx.store.get(&key).await.map_err(err)?.is_none(), || {
        "an expired record is still readable before any purge".into()
    })?;
    cx.reserve(&key, &fp(2), cx.long()).await?;
    let other = cx.key("expiry-purge");
    let token = cx.reserve(&other, &fp(1), cx.long()).await?;
    cx.store
        .complete(&other, &token, &Outcome::Ok(json!(1)), cx.lease)
        .await
        .map_err(err)?;
    cx.lapse().await;
    let purged = cx.store.purge_expired(usize::MAX).await.map_err(err)?;
    ensure(purged >= 1, || {
        format!("purge_expired removed {purged} records, expected at least 1")
    })?;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(matches!(record, Some(Record::InProgress { .. })), || {
        format!("purge touched a live record: {record:?}")
    })
}

pub(super) async fn tenants_are_isolated(cx: Ctx) -> Result<(), String> {
    let key = cx.key("tenant");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    cx.store
        .complete(&key, &token, &Outcome::Ok(json!("mine")), cx.long())
        .await
        .map_err(err)?;
    let other = RecordKey::new(format!("{}-other", cx.tenant), key.key.clone());
    ensure(cx.store.get(&other).await.map_err(err)?.is_none(), || {
        "another tenant read the record".into()
    })?;
    let other_token = cx.reserve(&other, &fp(2), cx.long()).await?;
    ensure(
        !cx.store.release(&key, &other_token).await.map_err(err)?,
        || "another tenant's token released the record".into(),
    )?;
    let mine = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(&mine, Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if *v == json!("mine")),
        || format!("the tenant's record changed: {mine:?}"),
    )
}

pub(super) async fn every_outcome_round_trips(cx: Ctx) -> Result<(), String> {
    let outcomes: Vec<Outcome> = [
        json!(null),
        json!(0),
        json!(false),
        json!({}),
        json!([]),
        json!(""),
        json!({"nested": {"ü": [1.5, null]}}),
        // Floats a careless reading of their text gets one unit in the last place wrong.
        json!(117.633_311_394_000_17),
        json!({"amount": 0.921_568_632_125_854_5, "rates": [10_587.436_593_658_975, 5e-324]}),
        // Deeper than serde_json reads at once (128 levels): it must read back all the same.
        (0..300).fold(json!("leaf"), |inner, _| Value::Array(vec![inner])),
    ]
    .into_iter()
    .map(Outcome::Ok)
    .chain([Outcome::Err(
        ToolError::new("PAYMENT_DECLINED", "card declined").with_suggestion("ask for another card"),
    )])
    .collect();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = cx.key(&format!("shape-{i}"));
        let token = cx.reserve(&key, &fp(1), cx.long()).await?;
        cx.store
            .complete(&key, &token, &outcome, cx.long())
            .await
            .map_err(err)?;
        // Read twice: a store may keep what its first read found.
        for _ in 0..2 {
            let back = cx.store.get(&key).await.map_err(err)?;
            ensure(
                matches!(&back, Some(Record::Completed { outcome: o, .. }) if *o == outcome),
                || format!("{outcome:?} came back as {back:?}"),
            )?;
        }
    }
    Ok(())
}

pub(super) async fn corrupt_record_is_an_error(cx: Ctx) -> Result<(), String> {
    let Some(corrupt) = cx.corrupt.clone() else {
        return Err(
            "no corrupt_with hook given: the suite cannot check that corruption is loud".into(),
        );
    };
    let key = cx.key("corrupt");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    cx.store
        .complete(&key, &token, &Outcome::Ok(json!(Value::Null)), cx.long())
        .await
        .map_err(err)?;
    corrupt(key.clone()).await;
    let read = cx.store.get(&key).await;
    ensure(matches!(read, Err(StoreError::Corrupt { .. })), || {
        format!("get of a corrupt record gave {read:?}")
    })?;
    let reserve = cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await;
    ensure(matches!(reserve, Err(StoreError::Corrupt { .. })), || {
        format!("reserve of a corrupt record gave {reserve:?}")
    })?;
    // A listing in its tenant lists every other record and sets the corrupt one aside, once,
    // even under a filter on state (which cannot be read from it).
    let neighbour = cx.key("corrupt-neighbour");
    let token = cx.reserve(&neighbour, &fp(2), cx.long()).await?;
    cx.store
        .complete(&neighbour, &token, &Outcome::Ok(json!(1)), cx.long())
        .await
        .map_err(err)?;
    let filter = Filter {
        tenant: Some(key.tenant.clone()),
        state: Some(EntryState::Completed),
        ..Filter::default()
    };
    let (mut entries, mut unreadable) = (Vec::new(), Vec::new());
    let mut cursor: Option<Cursor> = None;
    for _ in 0..10_000 {
        let page = cx
            .store
            .list(&filter, cursor.as_ref(), 2)
            .await
            .map_err(err)?;
        entries.extend(page.entries);
        unreadable.extend(page.unreadable);
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    ensure(entries.iter().any(|e| e.key == neighbour), || {
        format!("a corrupt record hid its neighbour from a listing: {entries:?}")
    })?;
    ensure(entries.iter().all(|e| e.key != key), || {
        "a corrupt record was listed as if it were readable".to_string()
    })?;
    let set_aside = unreadable.iter().filter(|u| u.key == key).count();
    ensure(set_aside == 1, || {
        format!("the corrupt record was set aside {set_aside} times: {unreadable:?}")
    })
}
