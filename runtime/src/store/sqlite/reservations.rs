//! The call path: reserve, the fenced writes, take-over and reads.

use super::*;

#[async_trait]
impl Reservations for SqliteStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        // A replay, IN_PROGRESS or CONFLICT answer writes nothing: a live record in the way is
        // answered from a plain read (WAL readers never wait for the write lock), on this thread
        // when the inline connection is free, on the pool otherwise. Only a free or expired key
        // goes to the writer's queue, and is read again under the lock: of two processes
        // reserving one key, the second reads the first's committed row.
        let read_first = match self.read_inline(key) {
            Inline::Live(existing) => return existing.map(Reservation::Existing),
            Inline::Free => false,
            Inline::Unread => true,
        };
        if read_first {
            let key = key.clone();
            let live = self
                .read(move |conn, now| match read_row(conn, &key)? {
                    Some(stored) if !stored.absent(now) => stored.to_record(&key, now).map(Some),
                    _ => Ok(None),
                })
                .await?;
            if let Some(existing) = live {
                return Ok(Reservation::Existing(existing));
            }
        }
        let (key, fp, token) = (key.clone(), fingerprint.to_hex(), token.clone());
        let tool = tool.to_owned();
        self.write(move |tx: &Connection, now: i64| {
            let lease_until = now.saturating_add(span_ms(lease));
            let inserted = fenced(
                tx,
                sql!(
                    "INSERT INTO toolkey_records ({COLUMNS}, tenant, key)
                     VALUES ('{IN_PROGRESS}', ?3, ?4, ?5, ?6, NULL, NULL, NULL, ?7, ?1, ?2)
                     ON CONFLICT (tenant, key) DO UPDATE SET
                         state = excluded.state, token = excluded.token, tool = excluded.tool,
                         fingerprint = excluded.fingerprint, since_ms = excluded.since_ms,
                         lease_until_ms = excluded.lease_until_ms, outcome = NULL,
                         completed_at_ms = NULL, expires_at_ms = NULL
                     WHERE (state = '{COMPLETED}' AND expires_at_ms <= ?5) OR state = '{NOT_DONE}'"
                ),
                params![
                    key.tenant,
                    key.key,
                    token.as_str(),
                    fp,
                    now,
                    lease_until,
                    tool
                ],
            )?;
            if inserted {
                let failures = failures_at(tx, &key, now)?;
                return Ok(Reservation::Reserved { token, failures });
            }
            let stored = read_row(tx, &key)?.ok_or_else(|| {
                StoreError::Unavailable("sqlite: a conflicting row vanished".into())
            })?;
            Ok(Reservation::Existing(stored.to_record(&key, now)?))
        })
        .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let (key, token, text) = (key.clone(), token.clone(), outcome.to_stored());
        self.write(move |tx, now| {
            let expires_at = now.saturating_add(span_ms(retain));
            let written = fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records
                     SET state = '{COMPLETED}', outcome = ?4, completed_at_ms = ?5, expires_at_ms = ?6
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str(), text, now, expires_at],
            )?;
            if written {
                return Ok(true);
            }
            // Sent again after a lost answer: the first write landed.
            tx.prepare_cached(sql!(
                "SELECT 1 FROM toolkey_records
                 WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state = '{COMPLETED}'
                   AND outcome = ?4"
            ))
            .and_then(|mut stmt| stmt.exists(params![key.tenant, key.key, token.as_str(), text]))
            .map_err(unavailable)
        })
        .await
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, _| {
            fenced(
                tx,
                sql!(
                    "DELETE FROM toolkey_records
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str()],
            )
        })
        .await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, now| {
            fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{IN_PROGRESS}', lease_until_ms = ?4
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![
                    key.tenant,
                    key.key,
                    token.as_str(),
                    now.saturating_add(span_ms(lease))
                ],
            )
        })
        .await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, _| {
            fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{UNKNOWN}'
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str()],
            )
        })
        .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let (key, stale) = (key.clone(), stale.clone());
        self.write(move |tx, now| {
            let token = Token::generate();
            let won = fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records
                     SET state = '{IN_PROGRESS}', token = ?4, since_ms = ?5, lease_until_ms = ?6
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3
                       AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until_ms <= ?5))"
                ),
                params![
                    key.tenant,
                    key.key,
                    stale.as_str(),
                    token.as_str(),
                    now,
                    now.saturating_add(span_ms(lease))
                ],
            )?;
            Ok(won.then_some(token))
        })
        .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.read_inline(key) {
            Inline::Live(live) => return live.map(Some),
            Inline::Free => return Ok(None),
            Inline::Unread => {}
        }
        let key = key.clone();
        self.read(move |conn, now| match read_row(conn, &key)? {
            Some(stored) if !stored.absent(now) => stored.to_record(&key, now).map(Some),
            _ => Ok(None),
        })
        .await
    }
}
