//! Stores: where keys are reserved, outcomes recorded, and races settled.
//!
//! Every store implements one state machine:
//!
//! ```text
//! absent ──reserve(key, tool, fp, lease)──▶ IN_PROGRESS{token, fp, lease_until}
//! IN_PROGRESS ──complete(token, outcome)──▶ COMPLETED{outcome, fp, expires_at}   (fenced by token)
//! IN_PROGRESS ──release(token)──▶ absent                                         (fenced by token)
//! IN_PROGRESS ──renew(token)──▶ IN_PROGRESS (lease extended)
//! IN_PROGRESS ──mark_unknown(token)──▶ UNKNOWN (the body could not tell whether it acted)
//! IN_PROGRESS, lease passed, or UNKNOWN ──▶ STALE ──take_over(token)──▶ IN_PROGRESS{new token}
//! STALE ──resolve(seen token, Done(outcome))──▶ COMPLETED                        (an operator)
//! STALE ──resolve(seen token, NotDone)──▶ NOT_DONE: absent to every call, and    (an operator)
//!   until another call reserves the key, its holder's fenced writes still apply as to IN_PROGRESS
//! COMPLETED, past retention ──▶ absent (a later reserve starts a new action)
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::Fingerprint;

mod admin;
mod approvals;
mod cache;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod conformance;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod faults;
mod forward;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
#[cfg(feature = "redis")]
mod redis;
mod row;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod transaction;

#[doc(inline)]
pub use crate::__store_forward as forward;
pub use admin::{Cursor, Entry, EntryState, Filter, Page, Resolution, Unreadable};
pub(crate) use approvals::listed_after;
pub use approvals::{
    Approval, ApprovalKey, ApprovalState, ApprovalStatus, Approvals, Decision, Requester,
};
pub use cache::CachedStore;
pub use memory::{Clock, ManualClock, MemoryStore, SystemClock};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
pub(crate) use record::nests_deeper;
pub use record::{
    Outcome, Record, RecordKey, RecordKeyRef, Reservation, StoreError, Token, MAX_RESULT_DEPTH,
};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
pub use transaction::Database;

/// Where keys are reserved and outcomes recorded: a store in all three of its roles.
///
/// A store plays three roles, each a trait of its own, split by who uses it:
///
/// - [`Reservations`], the call path: every keyed call reserves, completes, releases, renews,
///   marks unknown, takes over and reads records through it.
/// - [`OperatorCommands`]: what an operator (through [`Admin`](crate::admin::Admin) and the
///   `toolkey` command) lists, resolves and purges, and the store's clock they judge by.
/// - [`FailureCounters`]: the counters retry limits keep beside the records.
/// - [`Approvals`]: the approval requests of calls that wait for a person, beside the records.
///
/// `Store` is every type that implements the three, and what a toolbox holds
/// (`Arc<dyn Store>`): implement the roles, never `Store` itself. A wrapper implements by hand
/// only the roles it changes, and hands the others on with [`forward!`](crate::store::forward):
/// [`CachedStore`] changes the call path alone.
///
/// # What an implementation must guarantee
///
/// - **Atomic reserve.** Of any number of concurrent `reserve` calls for one absent key — from
///   tasks, processes or machines — exactly one gets [`Reservation::Reserved`]; the store's own
///   primitive settles it (a unique constraint, `SET NX`, a compare-and-swap under a lock), never
///   a read followed by a write.
/// - **The caller's token.** `reserve` holds the key under the token its caller passed, so a
///   caller whose reply was lost can release what it may have reserved.
/// - **Fencing.** `complete`, `release`, `renew` and `mark_unknown` apply only while the record is
///   in progress under the given token, or was resolved as not done while that token held it
///   and no call has reserved the key since (a renewal takes it back in progress), and return
///   `false` (changing nothing) otherwise.
///   `take_over` succeeds for exactly one caller naming the stale record's token.
/// - **The store's clock.** Leases, staleness and retention are judged by one clock for all
///   workers: the server's where there is one.
/// - **Expiry at read time.** A completed record past its retention is absent to `reserve` and
///   `get`, whether or not it was purged yet.
/// - **Tenants.** A record is visible only under its own tenant.
/// - **Every outcome round-trips**, `null`, `0`, `false`, `{}` and errors included, and every
///   float to the last bit: a store that keeps [`Outcome::to_stored`]'s text as it is and reads
///   it with [`Outcome::from_stored`] does.
/// - **Corruption is loud.** A record that cannot be read is [`StoreError::Corrupt`], never
///   treated as absent.
/// - **Fail closed.** When the store cannot be reached, `reserve` returns
///   [`StoreError::Unavailable`] and the caller does not run the work.
/// - **Failure counters** (for retry limits) live beside the records and never read or change
///   one. `count_failure` is atomic: of any number of concurrent counts for one key, each gets
///   its own number. A counter's window starts at its first failure, is judged by the store's
///   clock, and ends by itself: a store removes ended counters without being asked (a TTL, or a
///   sweep when it counts), and reads an ended one as zero. `reserve` reads the key's counter
///   in the same step as it reserves, so a first run costs no extra round trip for it.
///
/// The `conformance` module (feature `testing`) checks all of this against any implementation.
pub trait Store: Reservations + OperatorCommands + FailureCounters + Approvals {}

impl<S: Reservations + OperatorCommands + FailureCounters + Approvals + ?Sized> Store for S {}

/// A store's call path: what every keyed call does with its record, from reserving the key to
/// settling it. One of the three roles of a [`Store`], whose docs say what every implementation
/// must guarantee.
#[async_trait]
pub trait Reservations: Send + Sync + 'static {
    /// Reserves `key` for a call of `tool` with `fingerprint` under `token`, holding it for
    /// `lease`; or returns the existing record. A completed record past its retention counts as
    /// absent and is replaced.
    ///
    /// The caller draws the token ([`Token::generate`]) before it asks, so that when the reply is
    /// lost it still knows the token a reservation may have been written under, and can release
    /// it: "nothing was done" stays true and the key stays usable. `tool` (the tool's name, or
    /// `tool/step` for a step) is kept for operators' listings only. A reservation carries the
    /// key's failure count (see [`Reservation::Reserved`]).
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError>;

    /// Records the outcome of the reservation `token`, kept for `retain`. False if the token no
    /// longer holds the record.
    ///
    /// Sent again after its answer was lost, it finds the record completed under `token` with
    /// the same outcome and answers true, as the first did (and changes nothing). That is the one
    /// way a caller tells its own write from another holder's: a call that took the key over
    /// after the lease lapsed holds another token, even when its result is the same (the
    /// caller then answers `LEASE_LOST`, never a plain success).
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError>;

    /// Deletes the reservation `token` (a retryable failure: the next call runs again).
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError>;

    /// Extends the lease of reservation `token` to `lease` from now.
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError>;

    /// Marks reservation `token` as unknown: its body could not tell whether it acted.
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError>;

    /// Takes over a stale record whose token is `stale`, under a new token and lease. `None`
    /// when the record is not stale under that token (another worker took it, or it finished).
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError>;

    /// Reads a record, as status answers need it.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// The completed record of `key`, if this store holds it in this process's memory and can
    /// read it without waiting: a replay answered from it makes no round trip, and runs in its
    /// caller's task. `None` (what the trait does by default) when it holds none or cannot tell
    /// without asking; the call then [reserves](Self::reserve) as usual. A record past its
    /// retention is never returned.
    ///
    /// Only completed records are asked for: their outcome is final, so one read here is the
    /// record `reserve` would return.
    fn completed_here(&self, key: RecordKeyRef<'_>) -> Option<Record> {
        let _ = key;
        None
    }
}

/// A store's operator commands: listing records, resolving those nobody knows the outcome of,
/// purging expired ones, and the clock they are judged by. Calls never use them. One of the
/// three roles of a [`Store`].
#[async_trait]
pub trait OperatorCommands: Send + Sync + 'static {
    /// Deletes at most `limit` completed records past their retention; returns how many. Call
    /// it again while it returns `limit`: small batches keep every call's answer quick while it
    /// runs.
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError>;

    /// The store's clock.
    async fn now(&self) -> Result<SystemTime, StoreError>;

    /// One page of the records `filter` admits, after `cursor` (from the start when `None`),
    /// looking at about `limit` records. Operators' listings; calls never use it.
    ///
    /// The default refuses with [`StoreError::Config`], for a store that keeps no listing;
    /// every store in this crate lists.
    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let _ = (filter, cursor, limit);
        Err(StoreError::Config(
            "this store does not list records for operators".into(),
        ))
    }

    /// Resolves a record whose outcome nobody knows, as an operator found it: done with an
    /// outcome, or not done. Fenced twice: it applies only while the record is still under the
    /// revision `seen` (as [`Entry::revision`] showed it) **and** still unknown (marked unknown,
    /// or its lease lapsed) by the store's clock. False, changing nothing, otherwise: the record
    /// was taken over, finished, renewed by a worker that was alive after all, or is gone.
    ///
    /// Resolved as not done, the record is absent to every call (the next one reserves the key
    /// and runs), but is kept under its holder's token until then: a holder that was alive
    /// after all still records its outcome, renews, marks it unknown or releases it, exactly
    /// as it would have without the operator, so the next call replays what it did instead of
    /// doing it again. Purging leaves such a record alone; the next reserve replaces it.
    ///
    /// The default refuses with [`StoreError::Config`], like [`OperatorCommands::list`].
    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let _ = (key, seen, resolution);
        Err(StoreError::Config(
            "this store does not resolve records for operators".into(),
        ))
    }
}

/// A store's failure counters, for retry limits: kept beside the records, never touching one.
/// One of the three roles of a [`Store`].
#[async_trait]
pub trait FailureCounters: Send + Sync + 'static {
    /// Counts one retryable failure of the call `key` names, and returns how many were counted
    /// in the current window, this one included. The first failure opens a window of `window`;
    /// later failures within it add to the count without moving its end; once it ended, the
    /// next failure opens a new window at 1.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError>;

    /// How many failures of `key` were counted in a window that has not ended; 0 when none.
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError>;

    /// Forgets the failures counted for `key`: the call succeeded.
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError>;
}

/// Milliseconds since the Unix epoch, as stores keep times.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The time `ms` milliseconds after the Unix epoch.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    if ms >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A shared store is a store: the same records through every handle. Each operation hands on
/// the future of the store itself: written as `async fn`s, each would box that (already boxed)
/// future again, an allocation more per operation for every caller that holds its store in an
/// `Arc`.
impl<S: Reservations + ?Sized> Reservations for Arc<S> {
    forward!(Reservations, |shared| &**shared);
}

impl<S: OperatorCommands + ?Sized> OperatorCommands for Arc<S> {
    forward!(OperatorCommands, |shared| &**shared);
}

impl<S: FailureCounters + ?Sized> FailureCounters for Arc<S> {
    forward!(FailureCounters, |shared| &**shared);
}

impl<S: Approvals + ?Sized> Approvals for Arc<S> {
    forward!(Approvals, |shared| &**shared);
}
