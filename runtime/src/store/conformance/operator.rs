//! Checks of operator commands: listing, resolving and purging.

use super::*;

/// Every page of a listing, followed to its end.
pub(super) async fn list_all(cx: &Ctx, filter: &Filter, page: usize) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..10_000 {
        let found = cx
            .store
            .list(filter, cursor.as_ref(), page)
            .await
            .map_err(err)?;
        entries.extend(found.entries);
        match found.next {
            Some(next) => cursor = Some(next),
            None => return Ok(entries),
        }
    }
    Err("a listing did not end within 10,000 pages".into())
}

pub(super) async fn listing_shows_each_record_once_with_its_state(cx: Ctx) -> Result<(), String> {
    let running = cx.key("list-running");
    cx.reserve(&running, &fp(1), cx.long()).await?;
    let done = cx.key("list-done");
    let token = cx.reserve(&done, &fp(2), cx.long()).await?;
    cx.store
        .complete(&done, &token, &Outcome::Ok(json!({"n": 1})), cx.long())
        .await
        .map_err(err)?;
    let failed = cx.key("list-failed");
    let token = cx.reserve(&failed, &fp(3), cx.long()).await?;
    let declined = ToolError::new("DECLINED", "card declined").with_retryable(false);
    cx.store
        .complete(&failed, &token, &Outcome::Err(declined), cx.long())
        .await
        .map_err(err)?;
    let unknown = cx.key("list-unknown");
    let token = cx.reserve(&unknown, &fp(4), cx.long()).await?;
    cx.store.mark_unknown(&unknown, &token).await.map_err(err)?;
    let lapsed = cx.key("list-lapsed");
    cx.reserve(&lapsed, &fp(5), cx.lease).await?;
    let expired = cx.key("list-expired");
    let token = cx.reserve(&expired, &fp(6), cx.long()).await?;
    cx.store
        .complete(&expired, &token, &Outcome::Ok(json!(6)), cx.lease)
        .await
        .map_err(err)?;
    cx.lapse().await;

    let mine = Filter {
        tenant: Some(cx.tenant.clone()),
        ..Filter::default()
    };
    for page in [1, 2, 100] {
        let mut entries = list_all(&cx, &mine, page).await?;
        entries.sort_by(|a, b| a.key.key.cmp(&b.key.key));
        let seen: Vec<(&str, EntryState, bool)> = entries
            .iter()
            .map(|e| (e.key.key.as_str(), e.state, e.reported))
            .collect();
        let expected = vec![
            ("conformance:list-done", EntryState::Completed, false),
            ("conformance:list-failed", EntryState::Failed, false),
            ("conformance:list-lapsed", EntryState::Unknown, false),
            ("conformance:list-running", EntryState::InProgress, false),
            ("conformance:list-unknown", EntryState::Unknown, true),
        ];
        ensure(seen == expected, || {
            format!("pages of {page} listed {seen:?}, expected {expected:?}")
        })?;
        ensure(
            entries.iter().all(|e| e.tool.as_deref() == Some("tool")),
            || "a listed record lost its tool's name".into(),
        )?;
    }
    let by_state = |state| Filter {
        state: Some(state),
        ..mine.clone()
    };
    let unknown_keys: Vec<String> = list_all(&cx, &by_state(EntryState::Unknown), 1)
        .await?
        .into_iter()
        .map(|e| e.key.key)
        .collect();
    ensure(unknown_keys.len() == 2, || {
        format!("the unknown filter listed {unknown_keys:?}")
    })?;
    let failed_entries = list_all(&cx, &by_state(EntryState::Failed), 100).await?;
    ensure(
        failed_entries.len() == 1
            && matches!(&failed_entries[0].outcome, Some(Outcome::Err(e)) if e.code() == "DECLINED"),
        || format!("the failed filter listed {failed_entries:?}"),
    )?;
    let exact = Filter {
        key: Some("conformance:list-done".into()),
        ..mine.clone()
    };
    let one = list_all(&cx, &exact, 100).await?;
    ensure(
        one.len() == 1 && one[0].outcome == Some(Outcome::Ok(json!({"n": 1}))),
        || format!("the key filter listed {one:?}"),
    )?;
    let other_tool = Filter {
        tool: Some("another-tool".into()),
        ..mine.clone()
    };
    ensure(list_all(&cx, &other_tool, 100).await?.is_empty(), || {
        "the tool filter admitted another tool's records".into()
    })?;
    let young = Filter {
        older_than: Some(Duration::from_secs(3600)),
        ..mine
    };
    ensure(list_all(&cx, &young, 100).await?.is_empty(), || {
        "the age filter admitted records reserved moments ago".into()
    })
}

pub(super) async fn resolve_applies_only_to_the_unknown_record_seen(cx: Ctx) -> Result<(), String> {
    let done = Resolution::Done {
        outcome: Outcome::Ok(json!({"invoice": "inv-7"})),
        retain: cx.long(),
    };
    // A live reservation is not resolved: its body is running.
    let live = cx.key("resolve-live");
    let token = cx.reserve(&live, &fp(1), cx.long()).await?;
    ensure(
        !cx.store.resolve(&live, &token, &done).await.map_err(err)?,
        || "resolve changed a live reservation".into(),
    )?;
    // An unknown record, under the revision seen: done, and then replayed.
    let key = cx.key("resolve-done");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    cx.store.mark_unknown(&key, &token).await.map_err(err)?;
    ensure(
        !cx.store
            .resolve(&key, &Token::generate(), &done)
            .await
            .map_err(err)?,
        || "resolve applied under a revision nobody saw".into(),
    )?;
    ensure(
        cx.store.resolve(&key, &token, &done).await.map_err(err)?,
        || "resolve refused an unknown record under its revision".into(),
    )?;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(&record, Some(Record::Completed { outcome: Outcome::Ok(v), fingerprint, .. })
            if *v == json!({"invoice": "inv-7"}) && *fingerprint == fp(1)),
        || format!("a record resolved as done reads {record:?}"),
    )?;
    ensure(
        !cx.store
            .resolve(&key, &token, &Resolution::NotDone)
            .await
            .map_err(err)?,
        || "a finished record was resolved again".into(),
    )?;
    // A lapsed lease, not done: the key is free again.
    let key = cx.key("resolve-not-done");
    let token = cx.reserve(&key, &fp(1), cx.lease).await?;
    cx.lapse().await;
    ensure(
        cx.store
            .resolve(&key, &token, &Resolution::NotDone)
            .await
            .map_err(err)?,
        || "resolve refused a lapsed reservation under its revision".into(),
    )?;
    let again = cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await
        .map_err(err)?;
    ensure(matches!(again, Reservation::Reserved { .. }), || {
        format!("a record resolved as not done still holds the key: {again:?}")
    })?;
    // Taken over since it was seen: the old revision is refused.
    let key = cx.key("resolve-taken");
    let seen = cx.reserve(&key, &fp(1), cx.lease).await?;
    cx.lapse().await;
    cx.store
        .take_over(&key, &seen, cx.long())
        .await
        .map_err(err)?
        .ok_or("take_over of a lapsed reservation refused")?;
    ensure(
        !cx.store
            .resolve(&key, &seen, &Resolution::NotDone)
            .await
            .map_err(err)?,
        || "resolve applied to a record taken over since it was seen".into(),
    )?;
    // Another tenant's record is out of reach.
    let token = cx
        .reserve(&cx.key("resolve-tenant"), &fp(1), cx.long())
        .await?;
    cx.store
        .mark_unknown(&cx.key("resolve-tenant"), &token)
        .await
        .map_err(err)?;
    let elsewhere = RecordKey::new(format!("{}-other", cx.tenant), "conformance:resolve-tenant");
    ensure(
        !cx.store
            .resolve(&elsewhere, &token, &Resolution::NotDone)
            .await
            .map_err(err)?,
        || "resolve reached another tenant's record".into(),
    )
}

/// An operator resolves a lapsed reservation as not done while its worker is alive after all
/// (it stalled past its lease). The record is absent to every call, but until another call
/// reserves the key, the worker's fenced writes apply as they would have without the operator:
/// its outcome lands and is replayed, never lost; once another call holds the key, they are
/// refused.
pub(super) async fn a_holder_resolved_not_done_records_until_another_call_reserves(
    cx: Ctx,
) -> Result<(), String> {
    let outcome = Outcome::Ok(json!({"statement": "st-1"}));
    let resolved = |name: &'static str| {
        let cx = &cx;
        async move {
            let key = cx.key(name);
            let token = cx.reserve(&key, &fp(1), cx.lease).await?;
            cx.lapse().await;
            ensure(
                cx.store
                    .resolve(&key, &token, &Resolution::NotDone)
                    .await
                    .map_err(err)?,
                || "resolve refused a lapsed reservation under its revision".into(),
            )?;
            Ok::<_, String>((key, token))
        }
    };
    // Absent to reads and listings; the late worker's outcome lands, and is what a call finds.
    let (key, late) = resolved("not-done-late-complete").await?;
    let read = cx.store.get(&key).await.map_err(err)?;
    ensure(read.is_none(), || {
        format!("a record resolved as not done reads {read:?}")
    })?;
    let filter = Filter {
        tenant: Some(key.tenant.clone()),
        key: Some(key.key.clone()),
        ..Filter::default()
    };
    let listed = list_all(&cx, &filter, 10).await?;
    ensure(listed.is_empty(), || {
        format!("a record resolved as not done is listed: {listed:?}")
    })?;
    ensure(
        !cx.store
            .resolve(&key, &late, &Resolution::NotDone)
            .await
            .map_err(err)?,
        || "a record resolved as not done was resolved again".into(),
    )?;
    ensure(
        cx.store
            .complete(&key, &late, &outcome, cx.long())
            .await
            .map_err(err)?,
        || "the worker's outcome was refused though no other call reserved the key".into(),
    )?;
    let next = cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await
        .map_err(err)?;
    ensure(
        matches!(&next, Reservation::Existing(Record::Completed { outcome: o, .. }) if *o == outcome),
        || format!("the next call after the worker recorded its outcome got {next:?}"),
    )?;
    // A renewal takes the key back: the worker is running, and the next call waits for it.
    let (key, late) = resolved("not-done-late-renew").await?;
    ensure(
        cx.store.renew(&key, &late, cx.long()).await.map_err(err)?,
        || "the worker's renewal was refused though no other call reserved the key".into(),
    )?;
    let next = cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await
        .map_err(err)?;
    ensure(
        matches!(next, Reservation::Existing(Record::InProgress { .. })),
        || format!("the next call after the worker renewed got {next:?}"),
    )?;
    // A worker that cannot tell whether it acted makes the record unknown again; one that
    // failed retryably frees the key.
    let (key, late) = resolved("not-done-late-unknown").await?;
    ensure(
        cx.store.mark_unknown(&key, &late).await.map_err(err)?,
        || "the worker's unknown outcome was refused".into(),
    )?;
    let read = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(read, Some(Record::Stale { reported: true, .. })),
        || format!("a record marked unknown by its worker after resolution reads {read:?}"),
    )?;
    let (key, late) = resolved("not-done-late-release").await?;
    ensure(cx.store.release(&key, &late).await.map_err(err)?, || {
        "the worker's release was refused".into()
    })?;
    cx.reserve(&key, &fp(1), cx.long()).await?;
    // Once another call reserved the key, the worker's writes are refused, whatever they are.
    let (key, late) = resolved("not-done-then-reserved").await?;
    let next = cx.reserve(&key, &fp(1), cx.long()).await?;
    ensure(
        !cx.store
            .complete(&key, &late, &outcome, cx.long())
            .await
            .map_err(err)?
            && !cx.store.renew(&key, &late, cx.long()).await.map_err(err)?
            && !cx.store.mark_unknown(&key, &late).await.map_err(err)?
            && !cx.store.release(&key, &late).await.map_err(err)?,
        || "a worker's write applied to the reservation of the call after it".into(),
    )?;
    ensure(
        cx.store
            .complete(&key, &next, &outcome, cx.long())
            .await
            .map_err(err)?,
        || "the next call's own outcome was refused".into(),
    )
}

pub(super) async fn purge_deletes_in_batches(cx: Ctx) -> Result<(), String> {
    for i in 0..3 {
        let key = cx.key(&format!("purge-{i}"));
        let token = cx.reserve(&key, &fp(1), cx.long()).await?;
        cx.store
            .complete(&key, &token, &Outcome::Ok(json!(i)), cx.lease)
            .await
            .map_err(err)?;
    }
    let live = cx.key("purge-live");
    cx.reserve(&live, &fp(1), cx.long()).await?;
    cx.lapse().await;
    // Other checks' and other runs' expired records may share the store: count batches, not
    // records, and stop when a batch comes back short.
    let mut batches = 0;
    loop {
        let purged = cx.store.purge_expired(1).await.map_err(err)?;
        ensure(purged <= 1, || {
            format!("purge_expired(1) removed {purged} records")
        })?;
        if purged == 0 {
            break;
        }
        batches += 1;
        ensure(batches < 100_000, || "purging never ended".into())?;
    }
    ensure(batches >= 3, || {
        format!("three expired records went in {batches} batches of one")
    })?;
    let record = cx.store.get(&live).await.map_err(err)?;
    ensure(matches!(record, Some(Record::InProgress { .. })), || {
        format!("purge touched a live record: {record:?}")
    })
}

/// Tenants that spell the filtered tenant followed by a separator or a pattern character, and a
/// tenant that is a pattern itself: a listing by tenant sees only that tenant's records, however
/// the store narrows its scan (a Redis `MATCH` pattern, a SQL condition).
pub(super) async fn a_tenant_filter_admits_no_lookalike_tenant(cx: Ctx) -> Result<(), String> {
    let base = cx.tenant.clone();
    let tenants = [
        base.clone(),
        format!("{base}:x"),
        format!("{base}*"),
        format!("{base}\\"),
        format!("{base}?"),
        format!("{base}x"),
    ];
    for tenant in &tenants {
        let key = RecordKey::new(tenant.clone(), "conformance:lookalike");
        cx.reserve(&key, &fp(1), cx.long()).await?;
    }
    for tenant in &tenants {
        let filter = Filter {
            tenant: Some(tenant.clone()),
            ..Filter::default()
        };
        let listed: Vec<String> = list_all(&cx, &filter, 2)
            .await?
            .into_iter()
            .map(|e| e.key.tenant)
            .collect();
        ensure(listed == [tenant.clone()], || {
            format!("the tenant filter {tenant:?} listed the records of {listed:?}")
        })?;
    }
    Ok(())
}
