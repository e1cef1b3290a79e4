//! The failure counters of retry limits, in a table beside the records.

use super::*;

/// The failures counted for `key` in a window still open at `now` (ms).
pub(super) fn failures_at(conn: &Connection, key: &RecordKey, now: i64) -> Result<u64, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT failures FROM toolkey_failures
             WHERE tenant = ?1 AND key = ?2 AND ends_at_ms > ?3",
        )
        .map_err(unavailable)?;
    let mut rows = stmt
        .query(params![key.tenant, key.key, now])
        .map_err(unavailable)?;
    match rows.next().map_err(unavailable)? {
        Some(row) => Ok(row.get::<_, i64>(0).map_err(unavailable)?.max(0) as u64),
        None => Ok(0),
    }
}

#[async_trait]
impl FailureCounters for SqliteStore {
    /// One transaction under the write lock: a few ended counters of other keys are swept, then
    /// this key's counter is inserted, restarted (its window ended) or added to, and read back.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let key = key.clone();
        self.write(move |tx, now| {
            tx.prepare_cached(
                "DELETE FROM toolkey_failures WHERE (tenant, key) IN (
                     SELECT tenant, key FROM toolkey_failures WHERE ends_at_ms <= ?1 LIMIT ?2)",
            )
            .and_then(|mut stmt| stmt.execute(params![now, FAILURE_SWEEP]))
            .map_err(unavailable)?;
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO toolkey_failures (tenant, key, failures, ends_at_ms)
                     VALUES (?1, ?2, 1, ?3 + ?4)
                     ON CONFLICT (tenant, key) DO UPDATE SET
                         failures = CASE WHEN ends_at_ms <= ?3 THEN 1 ELSE failures + 1 END,
                         ends_at_ms = CASE WHEN ends_at_ms <= ?3 THEN excluded.ends_at_ms
                                           ELSE ends_at_ms END
                     RETURNING failures",
                )
                .map_err(unavailable)?;
            let count: i64 = stmt
                .query_row(params![key.tenant, key.key, now, span_ms(window)], |row| {
                    row.get(0)
                })
                .map_err(unavailable)?;
            Ok(count.max(0) as u64)
        })
        .await
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        let key = key.clone();
        self.read(move |conn, now| failures_at(conn, &key, now))
            .await
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |tx, _| {
            tx.prepare_cached("DELETE FROM toolkey_failures WHERE tenant = ?1 AND key = ?2")
                .and_then(|mut stmt| stmt.execute(params![key.tenant, key.key]))
                .map(drop)
                .map_err(unavailable)
        })
        .await
    }
}
