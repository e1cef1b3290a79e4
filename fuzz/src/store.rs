//! A store that counts every write, so a target can assert that bad input caused none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use toolkey::store::{
    FailureCounters, MemoryStore, OperatorCommands, Outcome, Record, RecordKey, Reservation,
    Reservations, StoreError, Token,
};
use toolkey::Fingerprint;

/// A [`MemoryStore`] that counts writes (`reserve`, `complete`, `release`, `renew`,
/// `mark_unknown`, `take_over`, `purge_expired`, `count_failure`, `clear_failures`) and reads
/// (`get`, `failures`), and can be emptied between
/// inputs so that every input starts from the same state and a failure replays from its seed.
///
/// A `reserve` counts as a write whatever it answers: invalid input must not reach the store at
/// all, not even a reservation that finds the key taken.
pub struct CountingStore {
    inner: Mutex<Arc<MemoryStore>>,
    writes: AtomicU64,
    reads: AtomicU64,
}

impl Default for CountingStore {
    fn default() -> Self {
        CountingStore {
            inner: Mutex::new(Arc::new(MemoryStore::new())),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        }
    }
}

impl CountingStore {
    /// Writes since the store was made.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Reads since the store was made.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Forgets every record: the next input starts from an empty store.
    pub fn reset(&self) {
        *self.inner.lock().unwrap() = Arc::new(MemoryStore::new());
    }

    fn write(&self) -> Arc<MemoryStore> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.lock().unwrap().clone()
    }

    fn read(&self) -> Arc<MemoryStore> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.lock().unwrap().clone()
    }
}

#[async_trait]
impl Reservations for CountingStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.write()
            .reserve(key, tool, fingerprint, token, lease)
            .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        self.write().complete(key, token, outcome, retain).await
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.write().release(key, token).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.write().renew(key, token, lease).await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.write().mark_unknown(key, token).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.write().take_over(key, stale, lease).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.read().get(key).await
    }
}

#[async_trait]
impl OperatorCommands for CountingStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.write().purge_expired(limit).await
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        let store = self.inner.lock().unwrap().clone();
        store.now().await
    }
}

#[async_trait]
impl FailureCounters for CountingStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        self.write().count_failure(key, window).await
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        self.read().failures(key).await
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.write().clear_failures(key).await
    }
}

/// Keeps no approval requests: the targets call no tool that needs one.
impl toolkey::store::Approvals for CountingStore {}
