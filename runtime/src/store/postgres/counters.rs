//! The failure counters of retry limits, in a table beside the records.

use super::*;

#[async_trait]
impl FailureCounters for PostgresStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let window = span_ms(window);
        let row = self
            .failures_query(&self.sql.count_failure, &[&key.tenant, &key.key, &window])
            .await?;
        let failures: i64 = match row {
            Some(row) => row
                .try_get(0)
                .map_err(|e| StoreError::Unavailable(describe(&e)))?,
            None => {
                return Err(StoreError::Unavailable(
                    "postgres: counting a failure returned no row".into(),
                ))
            }
        };
        Ok(failures.max(0) as u64)
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        let row = self
            .failures_query(&self.sql.failures, &[&key.tenant, &key.key])
            .await?;
        // No row, or a counter whose window ended (NULL): no failures.
        let failures: Option<i64> = match row {
            Some(row) => row
                .try_get(0)
                .map_err(|e| StoreError::Unavailable(describe(&e)))?,
            None => None,
        };
        Ok(failures.unwrap_or(0).max(0) as u64)
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.failures_query(&self.sql.clear_failures, &[&key.tenant, &key.key])
            .await
            .map(drop)
    }
}
