//! A local cache of completed records in front of any store, so a replay, or a `CONFLICT` on a
//! finished action, costs no round trip.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    forward, Clock, FailureCounters, OperatorCommands, Outcome, Record, RecordKey, RecordKeyRef,
    Reservation, Reservations, Store, StoreError, SystemClock, Token,
};
use crate::Fingerprint;

/// A completed record as the cache keeps it, with the local time past which it is not served.
#[derive(Clone)]
struct Cached {
    fingerprint: Fingerprint,
    outcome: Arc<Outcome>,
    completed_at: SystemTime,
    expires_at: SystemTime,
    /// `expires_at` less the clock skew allowed, by this process's clock.
    serve_until: SystemTime,
    /// What the entry costs, counted once when it is cached.
    weight: u64,
}

/// A borrowed key, to find the entry of the [`RecordKey`] it names: it hashes as that key
/// does (`RecordKeyRef` derives `Hash` over the same two strings in the same order).
#[derive(Hash)]
struct Lookup<'a>(RecordKeyRef<'a>);

impl quick_cache::Equivalent<RecordKey> for Lookup<'_> {
    fn equivalent(&self, key: &RecordKey) -> bool {
        self.0.tenant == key.tenant && self.0.key == key.key
    }
}

/// How many reservations in flight the cache remembers the fingerprints of.
const RESERVATIONS: usize = 16 * 1024;

#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<RecordKey, Cached> for ByBytes {
    fn weight(&self, _: &RecordKey, cached: &Cached) -> u64 {
        cached.weight
    }
}

/// Keeps the completed records it reads or writes in this process's memory, up to a budget of
/// bytes, and answers `reserve` and `get` for them without asking the store behind it.
///
/// # Why serving a cached record is safe
///
/// Only completed records are cached, and a completed record never changes until it expires:
/// every fenced write (`complete`, `release`, `renew`, `mark_unknown`) needs an in-progress
/// record, `take_over` and an operator's [`OperatorCommands::resolve`] need an unknown one, and
/// `purge_expired` deletes only expired ones. The one event that ends a completed record is its
/// expiry, after which a call with the same key is a new action; the cache stops serving an entry
/// `max_skew` before the expiry the store reported, judged by this process's clock, so a clock
/// up to `max_skew` behind the store's never replays a record the store already counts as
/// expired. In-progress and unknown records are never cached: their answer (`IN_PROGRESS`, a
/// takeover) must come from the store.
///
/// The cache is per process and per store handle: two processes each keep their own, and need
/// none of each other's, since a completed record is the same record everywhere.
///
/// ```
/// use toolkey::store::{CachedStore, MemoryStore};
///
/// let store = CachedStore::new(MemoryStore::new(), 64 * 1024 * 1024); // up to 64 MiB
/// # drop(store);
/// ```
pub struct CachedStore<S> {
    inner: S,
    cache: quick_cache::sync::Cache<RecordKey, Cached, ByBytes>,
    /// The fingerprint each reservation made through this cache holds, so its outcome can be
    /// kept when it completes without reading the record back. Bounded: a reservation that
    /// never completes here is forgotten in time, and its record is then read once.
    reserved: quick_cache::sync::Cache<Token, Fingerprint>,
    max_skew: Duration,
    clock: Arc<dyn Clock>,
}

impl<S> std::fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedStore")
            .field("entries", &self.cache.len())
            .field("bytes", &self.cache.weight())
            .field("max_skew", &self.max_skew)
            .finish_non_exhaustive()
    }
}

impl<S: Store> CachedStore<S> {
    /// A cache of at most about `max_bytes` of completed records (keys and outcomes as JSON)
    /// in front of `inner`, allowing 1 s of clock skew between this process and the store.
    pub fn new(inner: S, max_bytes: u64) -> CachedStore<S> {
        let estimated = usize::try_from(max_bytes / 512)
            .unwrap_or(usize::MAX)
            .max(16);
        CachedStore {
            inner,
            cache: quick_cache::sync::Cache::with_weighter(estimated, max_bytes, ByBytes),
            reserved: quick_cache::sync::Cache::new(RESERVATIONS),
            max_skew: Duration::from_secs(1),
            clock: Arc::new(SystemClock),
        }
    }

    /// Judges expiry by `clock` instead of the system clock: the same clock as a store that runs
    /// on one (tests).
    pub fn with_clock(mut self, clock: impl Clock) -> CachedStore<S> {
        self.clock = Arc::new(clock);
        self
    }

    /// What the cached records weigh now, in bytes as counted against the budget.
    pub fn bytes(&self) -> u64 {
        self.cache.weight()
    }

    /// How far this process's clock may lag the store's (default 1 s): an entry stops being
    /// served this long before the expiry the store reported.
    pub fn with_max_skew(mut self, max_skew: Duration) -> CachedStore<S> {
        self.max_skew = max_skew;
        self
    }

    /// How many records the cache holds now.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// True when the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Forgets the cached copy of `key`. A copy cached before the store's record was damaged is
    /// served until it expires: a corrupt record is reported by the store, and by every process
    /// that has not cached it. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn __forget(&self, key: &RecordKey) {
        self.cache.remove(key);
    }

    /// The cached record of `key` (a [`RecordKey`], or a [`Lookup`] of one), if it may still be
    /// served.
    fn cached<Q>(&self, key: &Q) -> Option<Record>
    where
        Q: std::hash::Hash + quick_cache::Equivalent<RecordKey> + ?Sized,
    {
        let cached = self.cache.get(key)?;
        if self.clock.now() >= cached.serve_until {
            self.cache.remove(key);
            return None;
        }
        Some(Record::Completed {
            fingerprint: cached.fingerprint,
            outcome: (*cached.outcome).clone(),
            completed_at: cached.completed_at,
            expires_at: cached.expires_at,
        })
    }

    /// Remembers `record` if it is completed.
    fn remember(&self, key: &RecordKey, record: &Record) {
        if let Record::Completed {
            fingerprint,
            outcome,
            completed_at,
            expires_at,
        } = record
        {
            self.keep(key, *fingerprint, outcome, *completed_at, *expires_at);
        }
    }

    fn keep(
        &self,
        key: &RecordKey,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        completed_at: SystemTime,
        expires_at: SystemTime,
    ) {
        let serve_until = expires_at
            .checked_sub(self.max_skew)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if self.clock.now() >= serve_until {
            return;
        }
        // Counted as stored: the outcome's JSON, the key, and the entry itself.
        let weight = (outcome.to_stored().len()
            + key.tenant.len()
            + key.key.len()
            + std::mem::size_of::<Cached>()) as u64;
        self.cache.insert(
            key.clone(),
            Cached {
                fingerprint,
                outcome: Arc::new(outcome.clone()),
                completed_at,
                expires_at,
                serve_until,
                weight,
            },
        );
    }
}

#[async_trait]
impl<S: Store> Reservations for CachedStore<S> {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        if let Some(record) = self.cached(key) {
            return Ok(Reservation::Existing(record));
        }
        let reservation = self
            .inner
            .reserve(key, tool, fingerprint, token, lease)
            .await?;
        match &reservation {
            Reservation::Existing(record) => self.remember(key, record),
            Reservation::Reserved { token, .. } => {
                self.reserved.insert(token.clone(), *fingerprint)
            }
        }
        Ok(reservation)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        // Retention runs from when the write applies, which is after this instant whatever the
        // store's clock reads: an expiry counted from here, by this clock, is never later than
        // the store's.
        let before = self.clock.now();
        let fingerprint = self
            .reserved
            .remove(token)
            .map(|(_, fingerprint)| fingerprint);
        let completed = self.inner.complete(key, token, outcome, retain).await?;
        if let (true, Some(fingerprint)) = (completed, fingerprint) {
            let expires_at = before.checked_add(retain).unwrap_or(before);
            self.keep(key, fingerprint, outcome, before, expires_at);
        }
        Ok(completed)
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.reserved.remove(token);
        self.inner.release(key, token).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(key, token, lease).await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.reserved.remove(token);
        self.inner.mark_unknown(key, token).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.inner.take_over(key, stale, lease).await
    }

    fn completed_here(&self, key: RecordKeyRef<'_>) -> Option<Record> {
        self.cached(&Lookup(key))
            .or_else(|| self.inner.completed_here(key))
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        if let Some(record) = self.cached(key) {
            return Ok(Some(record));
        }
        let record = self.inner.get(key).await?;
        if let Some(record) = &record {
            self.remember(key, record);
        }
        Ok(record)
    }
}

impl<S: Store> OperatorCommands for CachedStore<S> {
    forward!(OperatorCommands to inner);
}

// Retry limits: counters change with every failure, so they are never cached.
impl<S: Store> FailureCounters for CachedStore<S> {
    forward!(FailureCounters to inner);
}

impl<S: Store> super::Approvals for CachedStore<S> {
    forward!(Approvals to inner);
}
