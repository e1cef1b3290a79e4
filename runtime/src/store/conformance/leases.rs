//! Checks of leases and take-over: a lapsed or unknown record is taken over by exactly one
//! caller, and its old holder's writes are refused.

use super::*;

/// Lets the lease of the reservation `first` of `key` lapse and takes the key over: the new
/// holder's token.
pub(super) async fn lapse_and_take_over(
    cx: &Ctx,
    key: &RecordKey,
    first: &Token,
) -> Result<Token, String> {
    cx.lapse().await;
    let stale = match cx
        .store
        .reserve(key, "tool", &fp(1), &Token::generate(), cx.lease)
        .await
        .map_err(err)?
    {
        Reservation::Existing(Record::Stale {
            token,
            reported: false,
            ..
        }) => token,
        other => {
            return Err(format!(
                "a lapsed lease should read as stale, got {other:?}"
            ))
        }
    };
    let second = cx
        .store
        .take_over(key, &stale, cx.long())
        .await
        .map_err(err)?
        .ok_or("take_over of a stale record was refused")?;
    ensure(second != *first, || {
        "take_over returned the old token".into()
    })?;
    Ok(second)
}

pub(super) async fn late_complete_after_takeover_is_refused(cx: Ctx) -> Result<(), String> {
    let key = cx.key("lapsed");
    let first = cx.reserve(&key, &fp(1), cx.lease).await?;
    let second = lapse_and_take_over(&cx, &key, &first).await?;
    ensure(
        !cx.store
            .complete(&key, &first, &Outcome::Ok(json!("late")), cx.long())
            .await
            .map_err(err)?,
        || "the first owner's late complete applied".into(),
    )?;
    ensure(
        !cx.store.renew(&key, &first, cx.long()).await.map_err(err)?,
        || "the first owner's late renew applied".into(),
    )?;
    ensure(
        cx.store
            .complete(&key, &second, &Outcome::Ok(json!("new")), cx.long())
            .await
            .map_err(err)?,
        || "the new owner's complete was refused".into(),
    )?;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(&record, Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if *v == json!("new")),
        || format!("the store should keep the new owner's outcome, got {record:?}"),
    )
}

/// A `complete` sent again after its answer was lost answers true, as the first did, and changes
/// nothing. The same outcome under the token the key was taken from (a call whose lease lapsed,
/// whose result is the same as the new holder's) answers false: the caller must not take
/// another holder's write for its own.
pub(super) async fn a_complete_sent_again_answers_as_the_first(cx: Ctx) -> Result<(), String> {
    let key = cx.key("resent");
    let first = cx.reserve(&key, &fp(1), cx.lease).await?;
    let second = lapse_and_take_over(&cx, &key, &first).await?;
    let sent = Outcome::Ok(json!("sent"));
    let complete = async |token: &Token, outcome: &Outcome| {
        let complete = cx.store.complete(&key, token, outcome, cx.long());
        complete.await.map_err(err)
    };
    ensure(complete(&second, &sent).await?, || {
        "the holder's complete was refused".into()
    })?;
    let before = cx.store.get(&key).await.map_err(err)?;
    ensure(complete(&second, &sent).await?, || {
        "a complete sent again under its token, with its outcome, was refused".into()
    })?;
    ensure(!complete(&first, &sent).await?, || {
        "a complete under the token the key was taken from applied, its outcome being the same"
            .into()
    })?;
    ensure(
        !complete(&second, &Outcome::Ok(json!("other"))).await?,
        || "a complete sent again with another outcome applied".into(),
    )?;
    let after = cx.store.get(&key).await.map_err(err)?;
    ensure(after == before, || {
        format!("a complete sent again changed the record: {before:?}, then {after:?}")
    })
}

pub(super) async fn two_takeovers_one_wins(cx: Ctx) -> Result<(), String> {
    let key = cx.key("takeover");
    cx.reserve(&key, &fp(1), cx.lease).await?;
    cx.lapse().await;
    let stale = match cx.store.get(&key).await.map_err(err)? {
        Some(Record::Stale { token, .. }) => token,
        other => return Err(format!("expected a stale record, got {other:?}")),
    };
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, key, stale) = (cx.store.clone(), key.clone(), stale.clone());
        tasks.push(tokio::spawn(async move {
            store
                .take_over(&key, &stale, Duration::from_secs(300))
                .await
        }));
    }
    let mut won = 0;
    for task in tasks {
        if task
            .await
            .map_err(|e| e.to_string())?
            .map_err(err)?
            .is_some()
        {
            won += 1;
        }
    }
    ensure(won == 1, || {
        format!("8 concurrent takeovers: {won} won, expected 1")
    })
}

pub(super) async fn renew_keeps_the_lease(cx: Ctx) -> Result<(), String> {
    let key = cx.key("renew");
    let token = cx.reserve(&key, &fp(1), cx.lease).await?;
    cx.pass(cx.lease / 2).await;
    ensure(
        cx.store.renew(&key, &token, cx.lease).await.map_err(err)?,
        || "renew refused".into(),
    )?;
    cx.pass(cx.lease * 3 / 4).await;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(matches!(record, Some(Record::InProgress { .. })), || {
        format!("a renewed lease lapsed early: {record:?}")
    })?;
    cx.lapse().await;
    let record = cx.store.get(&key).await.map_err(err)?;
    ensure(
        matches!(
            record,
            Some(Record::Stale {
                reported: false,
                ..
            })
        ),
        || format!("an unrenewed lease should lapse: {record:?}"),
    )
}

pub(super) async fn unknown_is_stale_and_can_be_taken_over(cx: Ctx) -> Result<(), String> {
    let key = cx.key("unknown");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    ensure(
        cx.store.mark_unknown(&key, &token).await.map_err(err)?,
        || "mark_unknown refused".into(),
    )?;
    ensure(
        !cx.store
            .complete(&key, &token, &Outcome::Ok(json!(1)), cx.long())
            .await
            .map_err(err)?,
        || "complete after mark_unknown applied".into(),
    )?;
    let stale = match cx
        .store
        .reserve(&key, "tool", &fp(1), &Token::generate(), cx.long())
        .await
        .map_err(err)?
    {
        Reservation::Existing(Record::Stale {
            token,
            reported: true,
            fingerprint,
            ..
        }) if fingerprint == fp(1) => token,
        other => {
            return Err(format!(
                "an unknown record should read as reported stale, got {other:?}"
            ))
        }
    };
    let new = cx
        .store
        .take_over(&key, &stale, cx.long())
        .await
        .map_err(err)?
        .ok_or("take_over of an unknown record was refused")?;
    ensure(
        cx.store
            .complete(&key, &new, &Outcome::Ok(json!(2)), cx.long())
            .await
            .map_err(err)?,
        || "complete after takeover refused".into(),
    )
}
