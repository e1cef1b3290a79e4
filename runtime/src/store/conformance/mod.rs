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

mod approvals;
mod counters;
mod leases;
mod operator;
mod reservations;

use approvals::*;
use counters::*;
use leases::*;
use operator::*;
use reservations::*;

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
            // Approval requests.
            (
                "approvals_open_one_revision_at_a_time",
                Box::pin(approvals_open_one_revision_at_a_time(self.ctx())),
            ),
            (
                "concurrent_opens_of_one_revision_write_once",
                Box::pin(concurrent_opens_of_one_revision_write_once(self.ctx())),
            ),
            (
                "a_decision_applies_only_from_the_state_read",
                Box::pin(a_decision_applies_only_from_the_state_read(self.ctx())),
            ),
            (
                "approvals_are_listed_in_order_per_tenant",
                Box::pin(approvals_are_listed_in_order_per_tenant(self.ctx())),
            ),
            (
                "approvals_never_touch_a_record",
                Box::pin(approvals_never_touch_a_record(self.ctx())),
            ),
            (
                "a_tool_and_key_split_elsewhere_are_another_request",
                Box::pin(a_tool_and_key_split_elsewhere_are_another_request(
                    self.ctx(),
                )),
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
