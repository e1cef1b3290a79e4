//! The in-process store: the default, and the reference the other stores are checked against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::row::{span_ms, StoredRecord, COMPLETED, IN_PROGRESS, UNKNOWN};
use super::{
    from_millis, millis, to_millis, Cursor, Filter, Outcome, Page, Record, RecordKey, Reservation,
    Resolution, Store, StoreError, Token,
};
use crate::Fingerprint;

/// A source of the current time, injectable so lease and retention tests need no sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use std::time::Duration;
/// use toolkey::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(clock.now().duration_since(t0).unwrap(), Duration::from_secs(31));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now_ms: Mutex<i64>,
}

impl ManualClock {
    /// A clock standing at the current system time.
    pub fn new() -> Self {
        ManualClock {
            now_ms: Mutex::new(to_millis(SystemTime::now())),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.now_ms.lock().expect("clock lock") += millis(by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        from_millis(*self.now_ms.lock().expect("clock lock"))
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

/// Keeps records in this process's memory: for tests, single-process agents, and as the default
/// when a toolbox is given no store. Its records do not survive a restart.
///
/// ```
/// use std::sync::Arc;
/// use toolkey::store::{ManualClock, MemoryStore};
///
/// let clock = Arc::new(ManualClock::new());
/// let store = MemoryStore::with_clock(clock.clone());
/// # let _ = store;
/// ```
pub struct MemoryStore {
    records: Mutex<HashMap<RecordKey, StoredRecord>>,
    clock: Box<dyn Clock>,
    failures: Mutex<FailureCounts>,
}

/// Failure counters for retry limits, beside the records: each key's count and when its window
/// ends (ms). Ended windows are swept when the map has doubled since the last sweep, so the map
/// holds about twice the counters of windows still open.
#[derive(Default)]
struct FailureCounts {
    counts: HashMap<RecordKey, (u64, i64)>,
    sweep_at: usize,
}

/// The fewest counters a sweep waits for.
const FIRST_SWEEP: usize = 64;

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(SystemClock)
    }

    /// An empty store on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        MemoryStore {
            records: Mutex::new(HashMap::new()),
            clock: Box::new(clock),
            failures: Mutex::default(),
        }
    }

    fn now_ms(&self) -> i64 {
        to_millis(self.clock.now())
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<RecordKey, StoredRecord>, i64) -> T) -> T {
        let now = self.now_ms();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut records, now)
    }

    /// The failures counted for `key` in a window still open at `now` (ms).
    fn failures_at(&self, key: &RecordKey, now: i64) -> u64 {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.counts.is_empty() {
            return 0;
        }
        match failures.counts.get(key) {
            Some((count, until)) if *until > now => *count,
            _ => 0,
        }
    }

    /// Overwrites a record's stored outcome with text that is not an outcome, as disk or a
    /// careless migration might. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn __corrupt(&self, key: &RecordKey) {
        self.with(|records, _| {
            if let Some(entry) = records.get_mut(key) {
                entry.outcome = Some("{not json".into());
            }
        })
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.with(|records, now| {
            if let Some(entry) = records.get(key) {
                if !entry.expired(now) {
                    return Ok(Reservation::Existing(entry.to_record(key, now)?));
                }
            }
            let token = token.clone();
            records.insert(
                key.clone(),
                StoredRecord {
                    tool: Some(tool.into()),
                    state: IN_PROGRESS.into(),
                    token: token.as_str().into(),
                    fingerprint: fingerprint.to_hex(),
                    since_ms: now,
                    lease_until_ms: now.saturating_add(span_ms(lease)),
                    outcome: None,
                    completed_at_ms: None,
                    expires_at_ms: None,
                },
            );
            Ok(Reservation::Reserved {
                token,
                failures: self.failures_at(key, now),
            })
        })
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let text = outcome.to_stored();
        self.with(|records, now| match records.get_mut(key) {
            Some(entry) if entry.held_by(token) => {
                entry.state = COMPLETED.into();
                entry.outcome = Some(text);
                entry.completed_at_ms = Some(now);
                entry.expires_at_ms = Some(now.saturating_add(span_ms(retain)));
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.with(|records, _| match records.get(key) {
            Some(entry) if entry.held_by(token) => {
                records.remove(key);
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.with(|records, now| match records.get_mut(key) {
            Some(entry) if entry.held_by(token) => {
                entry.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.with(|records, _| match records.get_mut(key) {
            Some(entry) if entry.held_by(token) => {
                entry.state = UNKNOWN.into();
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.with(|records, now| match records.get_mut(key) {
            Some(entry) if entry.token == stale.as_str() && entry.stale(now) => {
                let token = Token::generate();
                entry.state = IN_PROGRESS.into();
                entry.token = token.as_str().into();
                entry.since_ms = now;
                entry.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(Some(token))
            }
            _ => Ok(None),
        })
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with(|records, now| match records.get(key) {
            Some(entry) if !entry.expired(now) => entry.to_record(key, now).map(Some),
            _ => Ok(None),
        })
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.with(|records, now| {
            let expired: Vec<RecordKey> = records
                .iter()
                .filter(|(_, entry)| entry.expired(now))
                .map(|(key, _)| key.clone())
                .take(limit)
                .collect();
            for key in &expired {
                records.remove(key);
            }
            Ok(expired.len() as u64)
        })
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        Ok(self.clock.now())
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = cursor.map(Cursor::key).transpose()?;
        self.with(|records, now| {
            let mut keys: Vec<&RecordKey> = records
                .keys()
                .filter(|key| {
                    after
                        .as_ref()
                        .is_none_or(|a| (&key.tenant, &key.key) > (&a.tenant, &a.key))
                        && filter.tenant.as_ref().is_none_or(|t| *t == key.tenant)
                        && filter.key.as_ref().is_none_or(|k| *k == key.key)
                })
                .collect();
            keys.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
            let limit = limit.max(1);
            let next = (keys.len() > limit).then(|| Cursor::after(keys[limit - 1]));
            let mut entries = Vec::new();
            for key in keys.into_iter().take(limit) {
                if let Some(entry) = records[key].to_entry(key, now)? {
                    if filter.admits(&entry, from_millis(now)) {
                        entries.push(entry);
                    }
                }
            }
            Ok(Page { entries, next })
        })
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        self.with(|records, now| match records.get_mut(key) {
            Some(entry) if entry.resolvable(seen, now) => {
                match resolution {
                    Resolution::Done { outcome, retain } => {
                        entry.state = COMPLETED.into();
                        entry.outcome = Some(outcome.to_stored());
                        entry.completed_at_ms = Some(now);
                        entry.expires_at_ms = Some(now.saturating_add(span_ms(*retain)));
                    }
                    Resolution::NotDone => {
                        records.remove(key);
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    // Retry limits.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let FailureCounts { counts, sweep_at } = &mut *failures;
        if counts.len() >= (*sweep_at).max(FIRST_SWEEP) {
            counts.retain(|_, (_, until)| *until > now);
            *sweep_at = counts.len() * 2;
        }
        let entry = counts.entry(key.clone()).or_insert((0, now));
        if entry.1 <= now {
            *entry = (0, now.saturating_add(span_ms(window)));
        }
        entry.0 += 1;
        Ok(entry.0)
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        Ok(self.failures_at(key, self.now_ms()))
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.counts.remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
