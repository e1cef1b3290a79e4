//! One worker's view of the scenario's store, with the switches the catalogue needs: hold the
//! record write (a body slow after its effect), fail the renewals (a worker cut off from the
//! store), die at the record write (a process killed after the effect, before the record), and
//! die once a key is reserved (a process killed before its body acted).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::store::{Outcome, Record, RecordKey, Reservation, Store, StoreError, Token};
use crate::Fingerprint;

/// The switches of one worker.
pub(crate) struct Control {
    held: watch::Sender<bool>,
    reached: watch::Sender<bool>,
    dead: AtomicBool,
    die_at_record: AtomicBool,
    die_after_reserve: AtomicBool,
    renewals_fail: AtomicBool,
}

impl Control {
    pub(crate) fn new() -> Arc<Control> {
        Arc::new(Control {
            held: watch::channel(false).0,
            reached: watch::channel(false).0,
            dead: AtomicBool::new(false),
            die_at_record: AtomicBool::new(false),
            die_after_reserve: AtomicBool::new(false),
            renewals_fail: AtomicBool::new(false),
        })
    }

    /// Record writes wait (true) or go through (false).
    pub(crate) fn hold_records(&self, hold: bool) {
        self.held.send_replace(hold);
    }

    /// The worker dies when its first record write arrives: that write and every later
    /// operation never reach the store and never answer.
    pub(crate) fn die_at_record(&self) {
        self.die_at_record.store(true, Ordering::SeqCst);
    }

    /// The worker dies once the store has reserved a key for it, before its body runs: its
    /// reservation is kept and never answered (and `record_reached` says it was made).
    pub(crate) fn die_after_reserve(&self) {
        self.die_after_reserve.store(true, Ordering::SeqCst);
    }

    /// Every renewal fails before it reaches the store.
    pub(crate) fn fail_renewals(&self) {
        self.renewals_fail.store(true, Ordering::SeqCst);
    }

    /// Waits until a record write arrived (the body ended), up to `limit`; true if it did.
    pub(crate) async fn record_reached(&self, limit: Duration) -> bool {
        let mut reached = self.reached.subscribe();
        tokio::time::timeout(limit, reached.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    async fn gate(&self, record_write: bool) {
        if record_write {
            self.reached.send_replace(true);
            if self.die_at_record.load(Ordering::SeqCst) {
                self.dead.store(true, Ordering::SeqCst);
            }
            let mut held = self.held.subscribe();
            let _ = held.wait_for(|h| !*h).await;
        }
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

/// A store seen through one worker's [`Control`].
pub(crate) struct WorkerStore {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) control: Arc<Control>,
}

#[async_trait]
impl Store for WorkerStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.control.gate(false).await;
        let reserved = self
            .inner
            .reserve(key, tool, fingerprint, token, lease)
            .await;
        if matches!(reserved, Ok(Reservation::Reserved { .. }))
            && self.control.die_after_reserve.load(Ordering::SeqCst)
        {
            self.control.dead.store(true, Ordering::SeqCst);
            self.control.reached.send_replace(true);
            std::future::pending::<()>().await;
        }
        reserved
    }
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        self.control.gate(true).await;
        self.inner.complete(key, token, outcome, retain).await
    }
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.control.gate(false).await;
        self.inner.release(key, token).await
    }
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.control.gate(false).await;
        if self.control.renewals_fail.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "retry check: this worker's renewals do not reach the store".into(),
            ));
        }
        self.inner.renew(key, token, lease).await
    }
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.control.gate(true).await;
        self.inner.mark_unknown(key, token).await
    }
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.control.gate(false).await;
        self.inner.take_over(key, stale, lease).await
    }
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.control.gate(false).await;
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.control.gate(false).await;
        self.inner.purge_expired(limit).await
    }
    async fn now(&self) -> Result<SystemTime, StoreError> {
        self.control.gate(false).await;
        self.inner.now().await
    }

    // Retry limits.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        self.control.gate(false).await;
        self.inner.count_failure(key, window).await
    }
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        self.control.gate(false).await;
        self.inner.failures(key).await
    }
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.control.gate(false).await;
        self.inner.clear_failures(key).await
    }
}
