//! Operator commands: purging, listing and resolving records, and the server's clock.

use super::*;

#[async_trait]
impl OperatorCommands for PostgresStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.execute(&self.sql.purge, &[&limit]).await
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = cursor.map(Cursor::key).transpose()?;
        let limit = limit.max(1);
        let (after_tenant, after_key) = (
            after.as_ref().map(|a| a.tenant.as_str()),
            after.as_ref().map(|a| a.key.as_str()),
        );
        let older_than = filter.older_than.map(crate::store::millis);
        let state = filter.state.map(EntryState::as_str);
        let count = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &after_tenant,
            &after_key,
            &filter.tenant,
            &filter.tool,
            &filter.key,
            &older_than,
            &state,
            &count,
        ];
        let rows = self
            .run(async |client: &mut ClientWrapper| {
                let statement = client
                    .prepare_cached(&self.sql.list)
                    .await
                    .map_err(Failure::Db)?;
                client.query(&statement, &params).await.map_err(Failure::Db)
            })
            .await?;
        let mut page = Page::default();
        for row in &rows {
            let key = RecordKey::new(
                row.try_get::<_, String>(0)
                    .map_err(StoreError::unavailable)?,
                row.try_get::<_, String>(1)
                    .map_err(StoreError::unavailable)?,
            );
            let read = stored_at(row, 2, &key).and_then(|(stored, now)| {
                let entry = stored.to_entry(&key, now)?;
                Ok(entry.filter(|e| filter.admits(e, from_millis(now))))
            });
            page.take(read)?;
            if rows.len() == limit {
                page.next = Some(Cursor::after(&key));
            }
        }
        Ok(page)
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let changed = match resolution {
            Resolution::Done { outcome, retain } => {
                let (text, retain) = (outcome.to_stored(), span_ms(*retain));
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&key.tenant, &key.key, &seen.as_str(), &text, &retain];
                self.execute(&self.sql.resolve_done, &params).await?
            }
            Resolution::NotDone => {
                self.execute(
                    &self.sql.resolve_not_done,
                    &[&key.tenant, &key.key, &seen.as_str()],
                )
                .await?
            }
        };
        Ok(changed > 0)
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        let ms: i64 = self
            .run(async |client: &mut ClientWrapper| {
                let statement = client
                    .prepare_cached(&self.sql.now)
                    .await
                    .map_err(Failure::Db)?;
                let row = client
                    .query_one(&statement, &[])
                    .await
                    .map_err(Failure::Db)?;
                row.try_get(0).map_err(Failure::Db)
            })
            .await?;
        Ok(from_millis(ms))
    }
}
