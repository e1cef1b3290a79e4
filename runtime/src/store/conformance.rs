//! The store conformance suite: one set of checks, run against every [`Store`].
//!
//! A store written outside this crate (DynamoDB, MySQL, ...) proves itself with the same checks:
//!
//! ```no_run
//! use std::sync::Arc;
//! use toolkey::store::{conformance::Suite, ManualClock, MemoryStore};
//!
//! # async fn run() {
//! let clock = Arc::new(ManualClock::new());
//! let store = Arc::new(MemoryStore::with_clock(clock.clone()));
//! Suite::new(store).manual_clock(clock).run().await; // panics naming every failed check
//! # }
//! ```
//!
//! Each check works under a fresh random tenant, so one store serves the whole suite and a
//! shared database needs no cleaning between runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    Cursor, Entry, EntryState, Filter, ManualClock, Outcome, Record, RecordKey, Reservation,
    Resolution, Store, StoreError, Token,
};
use crate::{Fingerprint, ToolError};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Corrupter = Arc<dyn Fn(RecordKey) -> BoxFuture<()> + Send + Sync>;

/// How the suite lets time pass.
#[derive(Clone)]
enum Time {
    /// The store runs on this clock: time passes by advancing it.
    Manual(Arc<ManualClock>),
    /// The store runs on a real clock (a server's): time passes by sleeping.
    Real,
}

/// The conformance suite for one store.
pub struct Suite<S: Store> {
    store: Arc<S>,
    time: Time,
    lease: Duration,
    corrupt: Option<Corrupter>,
}

impl<S: Store> Suite<S> {
    /// The suite for `store`, which runs on a real clock unless [`Suite::manual_clock`] says so.
    pub fn new(store: Arc<S>) -> Self {
        Suite {
            store,
            time: Time::Real,
            lease: Duration::from_millis(600),
            corrupt: None,
        }
    }

    /// The store runs on `clock`; the suite advances it instead of sleeping.
    pub fn manual_clock(mut self, clock: Arc<ManualClock>) -> Self {
        self.time = Time::Manual(clock);
        self
    }

    /// The lease the suite's short-lease checks use with a real clock (default 600 ms). Longer
    /// makes the suite slower and more tolerant of a slow server.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How to damage a completed record's stored outcome, so the suite can check that a corrupt
    /// record is reported and never taken as absent.
    pub fn corrupt_with<F, Fut>(mut self, corrupt: F) -> Self
    where
        F: Fn(RecordKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.corrupt = Some(Arc::new(move |key| Box::pin(corrupt(key))));
        self
    }

    /// Runs every check; panics with the names and reasons of all that failed.
    pub async fn run(self) {
        let checks: Vec<(&str, BoxFuture<Result<(), String>>)> = vec![
            (
                "reserve_then_in_progress",
                Box::pin(reserve_then_in_progress(self.ctx())),
            ),
            (
                "concurrent_reserve_gives_one_token",
                Box::pin(concurrent_reserve_gives_one_token(self.ctx())),
            ),
            (
                "stale_tokens_are_refused",
                Box::pin(stale_tokens_are_refused(self.ctx())),
            ),
            (
                "completed_is_returned_with_outcome",
                Box::pin(completed_is_returned_with_outcome(self.ctx())),
            ),
            (
                "release_frees_the_key",
                Box::pin(release_frees_the_key(self.ctx())),
            ),
            (
                "late_complete_after_takeover_is_refused",
                Box::pin(late_complete_after_takeover_is_refused(self.ctx())),
            ),
            (
                "a_complete_sent_again_answers_as_the_first",
                Box::pin(a_complete_sent_again_answers_as_the_first(self.ctx())),
            ),
            (
                "two_takeovers_one_wins",
                Box::pin(two_takeovers_one_wins(self.ctx())),
            ),
            (
                "renew_keeps_the_lease",
                Box::pin(renew_keeps_the_lease(self.ctx())),
            ),
            (
                "unknown_is_stale_and_can_be_taken_over",
                Box::pin(unknown_is_stale_and_can_be_taken_over(self.ctx())),
            ),
            (
                "expiry_is_checked_at_read_time",
                Box::pin(expiry_is_checked_at_read_time(self.ctx())),
            ),
            (
                "tenants_are_isolated",
                Box::pin(tenants_are_isolated(self.ctx())),
            ),
            (
                "every_outcome_round_trips",
                Box::pin(every_outcome_round_trips(self.ctx())),
            ),
            (
                "corrupt_record_is_an_error",
                Box::pin(corrupt_record_is_an_error(self.ctx())),
            ),
            (
                "listing_shows_each_record_once_with_its_state",
                Box::pin(listing_shows_each_record_once_with_its_state(self.ctx())),
            ),
            (
                "a_tenant_filter_admits_no_lookalike_tenant",
                Box::pin(a_tenant_filter_admits_no_lookalike_tenant(self.ctx())),
            ),
            (
                "resolve_applies_only_to_the_unknown_record_seen",
                Box::pin(resolve_applies_only_to_the_unknown_record_seen(self.ctx())),
            ),
            (
                "a_holder_resolved_not_done_records_until_another_call_reserves",
                Box::pin(
                    a_holder_resolved_not_done_records_until_another_call_reserves(self.ctx()),
                ),
            ),
            (
                "purge_deletes_in_batches",
                Box::pin(purge_deletes_in_batches(self.ctx())),
            ),
            // Retry limits: failure counters.
            (
                "failures_are_counted_per_key_and_tenant",
                Box::pin(failures_are_counted_per_key_and_tenant(self.ctx())),
            ),
            (
                "concurrent_failures_each_get_their_own_count",
                Box::pin(concurrent_failures_each_get_their_own_count(self.ctx())),
            ),
            (
                "a_failure_window_ends_by_itself",
                Box::pin(a_failure_window_ends_by_itself(self.ctx())),
            ),
            (
                "clearing_failures_starts_the_count_again",
                Box::pin(clearing_failures_starts_the_count_again(self.ctx())),
            ),
            (
                "failure_counters_never_touch_a_record",
                Box::pin(failure_counters_never_touch_a_record(self.ctx())),
            ),
            (
                "a_reservation_carries_the_keys_failures",
                Box::pin(a_reservation_carries_the_keys_failures(self.ctx())),
            ),
        ];
        let mut failed = Vec::new();
        let total = checks.len();
        for (name, check) in checks {
            if let Err(why) = check.await {
                failed.push(format!("{name}: {why}"));
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {total} store conformance checks failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            store: self.store.clone(),
            time: self.time.clone(),
            lease: self.lease,
            corrupt: self.corrupt.clone(),
            tenant: format!("conformance-{}", Token::generate()),
        }
    }
}

struct Ctx {
    store: Arc<dyn Store>,
    time: Time,
    lease: Duration,
    corrupt: Option<Corrupter>,
    tenant: String,
}

impl Ctx {
    fn key(&self, name: &str) -> RecordKey {
        RecordKey::new(self.tenant.clone(), format!("conformance:{name}"))
    }

    /// A lease long enough never to lapse during a check.
    fn long(&self) -> Duration {
        Duration::from_secs(300)
    }

    async fn pass(&self, d: Duration) {
        match &self.time {
            Time::Manual(clock) => clock.advance(d),
            Time::Real => tokio::time::sleep(d).await,
        }
    }

    /// Lets a lease of `self.lease` lapse.
    async fn lapse(&self) {
        self.pass(self.lease + self.lease / 2).await
    }

    async fn reserve(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        lease: Duration,
    ) -> Result<Token, String> {
        let token = Token::generate();
        match self
            .store
            .reserve(key, "tool", fp, &token, lease)
            .await
            .map_err(err)?
        {
            Reservation::Reserved { token: held, .. } if held == token => Ok(token),
            Reservation::Reserved { token: held, .. } => Err(format!(
                "reserve answered token {held:?}, not the caller's {token:?}"
            )),
            other => Err(format!("expected Reserved for {key:?}, got {other:?}")),
        }
    }
}

fn err(e: StoreError) -> String {
    format!("store error: {e}")
}

fn fp(n: u64) -> Fingerprint {
    Fingerprint::of(&json!({ "n": n })).expect("fingerprint")
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

async fn reserve_then_in_progress(cx: Ctx) -> Result<(), String> {
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

async fn concurrent_reserve_gives_one_token(cx: Ctx) -> Result<(), String> {
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

async fn stale_tokens_are_refused(cx: Ctx) -> Result<(), String> {
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

async fn completed_is_returned_with_outcome(cx: Ctx) -> Result<(), String> {
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

async fn release_frees_the_key(cx: Ctx) -> Result<(), String> {
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

/// Lets the lease of the reservation `first` of `key` lapse and takes the key over: the new
/// holder's token.
async fn lapse_and_take_over(cx: &Ctx, key: &RecordKey, first: &Token) -> Result<Token, String> {
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

async fn late_complete_after_takeover_is_refused(cx: Ctx) -> Result<(), String> {
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
async fn a_complete_sent_again_answers_as_the_first(cx: Ctx) -> Result<(), String> {
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

async fn two_takeovers_one_wins(cx: Ctx) -> Result<(), String> {
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

async fn renew_keeps_the_lease(cx: Ctx) -> Result<(), String> {
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

async fn unknown_is_stale_and_can_be_taken_over(cx: Ctx) -> Result<(), String> {
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

async fn expiry_is_checked_at_read_time(cx: Ctx) -> Result<(), String> {
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

async fn tenants_are_isolated(cx: Ctx) -> Result<(), String> {
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

async fn every_outcome_round_trips(cx: Ctx) -> Result<(), String> {
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

async fn corrupt_record_is_an_error(cx: Ctx) -> Result<(), String> {
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

/// Every page of a listing, followed to its end.
async fn list_all(cx: &Ctx, filter: &Filter, page: usize) -> Result<Vec<Entry>, String> {
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

async fn listing_shows_each_record_once_with_its_state(cx: Ctx) -> Result<(), String> {
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

async fn resolve_applies_only_to_the_unknown_record_seen(cx: Ctx) -> Result<(), String> {
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
async fn a_holder_resolved_not_done_records_until_another_call_reserves(
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

async fn purge_deletes_in_batches(cx: Ctx) -> Result<(), String> {
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

// ---------------------------------------------------------------------------------------------
// Retry limits: failure counters.

async fn failures_are_counted_per_key_and_tenant(cx: Ctx) -> Result<(), String> {
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

async fn concurrent_failures_each_get_their_own_count(cx: Ctx) -> Result<(), String> {
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

async fn a_failure_window_ends_by_itself(cx: Ctx) -> Result<(), String> {
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

async fn clearing_failures_starts_the_count_again(cx: Ctx) -> Result<(), String> {
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

async fn failure_counters_never_touch_a_record(cx: Ctx) -> Result<(), String> {
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
async fn a_reservation_carries_the_keys_failures(cx: Ctx) -> Result<(), String> {
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

/// Tenants that spell the filtered tenant followed by a separator or a pattern character, and a
/// tenant that is a pattern itself: a listing by tenant sees only that tenant's records, however
/// the store narrows its scan (a Redis `MATCH` pattern, a SQL condition).
async fn a_tenant_filter_admits_no_lookalike_tenant(cx: Ctx) -> Result<(), String> {
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
