//! Approval requests, in a table beside the records (`<table>_approvals`): one row per revision.

use super::*;
use crate::store::{Approval, ApprovalKey, ApprovalState, Approvals};

/// The approvals table's statements.
#[derive(Debug, Clone)]
pub(super) struct ApprovalSql {
    /// Created by every migration: a database migrated before approvals existed gets it too.
    pub(super) create: String,
    latest: String,
    open: String,
    update: String,
    list: String,
}

impl ApprovalSql {
    /// The statements over table `a` (qualified and quoted), whose index is named after `table`.
    pub(super) fn new(a: &str, table: &str) -> ApprovalSql {
        let index = format!("\"{table}_approvals_state\"");
        ApprovalSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {a} (
                     tenant   text NOT NULL,
                     tool     text NOT NULL,
                     key      text NOT NULL,
                     revision int8 NOT NULL,
                     state    text NOT NULL,
                     request  text NOT NULL,
                     PRIMARY KEY (tenant, tool, key, revision)
                 );
                 CREATE INDEX IF NOT EXISTS {index} ON {a} (tenant, state);"
            ),
            latest: format!(
                "SELECT request FROM {a} WHERE tenant = $1 AND tool = $2 AND key = $3
                 ORDER BY revision DESC LIMIT 1"
            ),
            // Written only while the key's latest revision is the one before it; two writers of
            // one revision meet at the primary key.
            open: format!(
                "INSERT INTO {a} (tenant, tool, key, revision, state, request)
                 SELECT $1, $2, $3, $4, $5, $6
                 WHERE COALESCE((SELECT max(revision) FROM {a}
                                 WHERE tenant = $1 AND tool = $2 AND key = $3), 0) + 1 = $4
                 ON CONFLICT DO NOTHING"
            ),
            update: format!(
                "UPDATE {a} SET state = $5, request = $6
                 WHERE tenant = $1 AND tool = $2 AND key = $3 AND revision = $4 AND state = $7"
            ),
            // Ordered by bytes, as every store lists.
            list: format!(
                "SELECT request FROM {a}
                 WHERE tenant = $1 AND ($2::text IS NULL OR state = $2)
                   AND (tool COLLATE \"C\", key COLLATE \"C\", revision) > ($3, $4, $5)
                 ORDER BY tool COLLATE \"C\", key COLLATE \"C\", revision LIMIT $6"
            ),
        }
    }
}

impl PostgresStore {
    async fn approvals_query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        self.run(async |client: &mut ClientWrapper| {
            let statement = client.prepare_cached(sql).await.map_err(Failure::Db)?;
            client.query(&statement, params).await.map_err(Failure::Db)
        })
        .await
    }
}

fn revision(request: &Approval) -> i64 {
    i64::try_from(request.revision).unwrap_or(i64::MAX)
}

fn requests(rows: Vec<tokio_postgres::Row>) -> Result<Vec<Approval>, StoreError> {
    rows.iter()
        .map(|row| {
            let text: String = row
                .try_get(0)
                .map_err(|e| StoreError::Unavailable(describe(&e)))?;
            Approval::from_stored(&text)
        })
        .collect()
}

#[async_trait]
impl Approvals for PostgresStore {
    async fn latest_approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        let rows = self
            .approvals_query(&self.sql.approvals.latest, &[&id.tenant, &id.tool, &id.key])
            .await?;
        Ok(requests(rows)?.pop())
    }

    async fn open_approval(&self, request: &Approval) -> Result<bool, StoreError> {
        let id = &request.id;
        let changed = self
            .execute(
                &self.sql.approvals.open,
                &[
                    &id.tenant,
                    &id.tool,
                    &id.key,
                    &revision(request),
                    &request.state.as_str(),
                    &request.to_stored(),
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn update_approval(
        &self,
        request: &Approval,
        seen: ApprovalState,
    ) -> Result<bool, StoreError> {
        let id = &request.id;
        let changed = self
            .execute(
                &self.sql.approvals.update,
                &[
                    &id.tenant,
                    &id.tool,
                    &id.key,
                    &revision(request),
                    &request.state.as_str(),
                    &request.to_stored(),
                    &seen.as_str(),
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        after: Option<(&ApprovalKey, u64)>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let (tool, key, revision) = match after {
            Some((id, revision)) => (id.tool.as_str(), id.key.as_str(), revision),
            None => ("", "", 0),
        };
        let revision = i64::try_from(revision).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let state = state.map(ApprovalState::as_str);
        let rows = self
            .approvals_query(
                &self.sql.approvals.list,
                &[&tenant, &state, &tool, &key, &revision, &limit],
            )
            .await?;
        requests(rows)
    }
}
