//! The failure counters of retry limits, beside the records.

use super::*;

/// Failure counters for retry limits, beside the records: each key's count and when its window
/// ends (ms). Ended windows are swept when the map has doubled since the last sweep, so the map
/// holds about twice the counters of windows still open.
#[derive(Default)]
pub(super) struct FailureCounts {
    pub(super) counts: HashMap<RecordKey, (u64, i64)>,
    pub(super) sweep_at: usize,
}

/// The fewest counters a sweep waits for.
pub(super) const FIRST_SWEEP: usize = 64;

#[async_trait]
impl FailureCounters for MemoryStore {
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
