//! The failure counters of retry limits: one key per record key, with a TTL of its window.

use super::*;

// One counter key per record key, with a TTL of its window.
#[async_trait]
impl FailureCounters for RedisStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let failures: i64 = COUNT_FAILURE
            .key(self.failures_key(key))
            .arg(span_ms(window).max(1))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(failures.max(0) as u64)
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        let failures: Option<i64> = redis::cmd("GET")
            .arg(self.failures_key(key))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(failures.unwrap_or(0).max(0) as u64)
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        redis::cmd("DEL")
            .arg(self.failures_key(key))
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }
}
