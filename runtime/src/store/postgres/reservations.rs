//! The call path: reserve, the fenced writes, take-over and reads.

use super::*;

#[async_trait]
impl Reservations for PostgresStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (fp, lease) = (fingerprint.to_hex(), span_ms(lease));
        for _ in 0..RESERVE_ATTEMPTS {
            let row = self
                .run(async |client: &mut ClientWrapper| {
                    let statement = client
                        .prepare_cached(&self.sql.reserve)
                        .await
                        .map_err(|e| self.failures_missing(e))?;
                    client
                        .query_opt(
                            &statement,
                            &[&key.tenant, &key.key, &token.as_str(), &fp, &lease, &tool],
                        )
                        .await
                        .map_err(|e| self.failures_missing(e))
                })
                .await?;
            let found = match row {
                Some(row) => {
                    let reserved: bool = row
                        .try_get(0)
                        .map_err(|e| StoreError::corrupt(key, format!("unreadable column: {e}")))?;
                    if reserved {
                        let failures: Option<i64> = row.try_get(11).map_err(|e| {
                            StoreError::corrupt(key, format!("unreadable column: {e}"))
                        })?;
                        return Ok(Reservation::Reserved {
                            token: token.clone(),
                            failures: failures.unwrap_or(0).max(0) as u64,
                        });
                    }
                    Some(stored_at(&row, 1, key)?)
                }
                // The record in the way was committed after the statement began: read it now.
                None => self.read(key).await?,
            };
            // The record in the way may be gone (released) or expired by now: then try again.
            if let Some((stored, now)) = found {
                if !stored.absent(now) {
                    return stored.to_record(key, now).map(Reservation::Existing);
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "postgres: the record (key hash {}) changed under {RESERVE_ATTEMPTS} reserve attempts",
            crate::key::log_hash(&key.key)
        )))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let (text, retain) = (outcome.to_stored(), span_ms(retain));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&key.tenant, &key.key, &token.as_str(), &text, &retain];
        if self.execute(&self.sql.complete, &params).await? > 0 {
            return Ok(true);
        }
        // Sent again after a lost answer: the first write landed. (A second round trip, only
        // when the write changed nothing.)
        Ok(self.execute(&self.sql.completed_by, &params[..4]).await? > 0)
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        Ok(self
            .execute(&self.sql.release, &[&key.tenant, &key.key, &token.as_str()])
            .await?
            > 0)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let lease = span_ms(lease);
        Ok(self
            .execute(
                &self.sql.renew,
                &[&key.tenant, &key.key, &token.as_str(), &lease],
            )
            .await?
            > 0)
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        Ok(self
            .execute(
                &self.sql.mark_unknown,
                &[&key.tenant, &key.key, &token.as_str()],
            )
            .await?
            > 0)
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let (token, lease) = (Token::generate(), span_ms(lease));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &key.tenant,
            &key.key,
            &stale.as_str(),
            &token.as_str(),
            &lease,
        ];
        let won = self.execute(&self.sql.take_over, &params).await? > 0;
        Ok(won.then_some(token))
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.read(key).await? {
            Some((stored, now)) if !stored.absent(now) => stored.to_record(key, now).map(Some),
            _ => Ok(None),
        }
    }
}
