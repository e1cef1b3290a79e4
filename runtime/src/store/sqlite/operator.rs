//! Operator commands: purging, listing and resolving records, and the clock.

use super::*;

#[async_trait]
impl OperatorCommands for SqliteStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |tx, now| {
            let mut stmt = tx
                .prepare_cached(sql!(
                    "DELETE FROM toolkey_records WHERE (tenant, key) IN (
                         SELECT tenant, key FROM toolkey_records
                         WHERE state = '{COMPLETED}' AND expires_at_ms <= ?1 LIMIT ?2)"
                ))
                .map_err(unavailable)?;
            Ok(stmt.execute(params![now, limit]).map_err(unavailable)? as u64)
        })
        .await
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
        let filter = filter.clone();
        let limit = limit.max(1);
        self.read(move |conn, now| {
            let mut stmt = conn.prepare_cached(LIST).map_err(unavailable)?;
            let since_before = filter
                .older_than
                .map(|age| now.saturating_sub(crate::store::millis(age)));
            let mut rows = stmt
                .query(params![
                    after.as_ref().map(|a| &a.tenant),
                    after.as_ref().map(|a| &a.key),
                    filter.tenant,
                    filter.tool,
                    filter.key,
                    since_before,
                    filter.state.map(EntryState::as_str),
                    now,
                    i64::try_from(limit).unwrap_or(i64::MAX),
                ])
                .map_err(unavailable)?;
            let mut page = Page::default();
            let mut seen = 0;
            let mut last = None;
            while let Some(row) = rows.next().map_err(unavailable)? {
                let key = RecordKey::new(
                    row.get::<_, String>(0).map_err(unavailable)?,
                    row.get::<_, String>(1).map_err(unavailable)?,
                );
                let read = stored_at(row, &key, 2).and_then(|stored| stored.to_entry(&key, now));
                page.take(read.map(|e| e.filter(|e| filter.admits(e, from_millis(now)))))?;
                seen += 1;
                last = Some(key);
            }
            page.next = last.filter(|_| seen == limit).map(|k| Cursor::after(&k));
            Ok(page)
        })
        .await
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let (key, seen, resolution) = (key.clone(), seen.clone(), resolution.clone());
        self.write(move |tx, now| match resolution {
            Resolution::Done { outcome, retain } => fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{COMPLETED}', outcome = ?5,
                         completed_at_ms = ?4, expires_at_ms = ?6
                     WHERE {RESOLVABLE}"
                ),
                params![
                    key.tenant,
                    key.key,
                    seen.as_str(),
                    now,
                    outcome.to_stored(),
                    now.saturating_add(span_ms(retain))
                ],
            ),
            Resolution::NotDone => fenced(
                tx,
                sql!("UPDATE toolkey_records SET state = '{NOT_DONE}' WHERE {RESOLVABLE}"),
                params![key.tenant, key.key, seen.as_str(), now],
            ),
        })
        .await
    }
}
