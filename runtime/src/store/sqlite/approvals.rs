//! Approval requests, in a table beside the records: one row per revision.

use super::*;
use crate::store::{Approval, ApprovalKey, ApprovalState, Approvals};

/// Created by every open (a file written before approvals existed gets it too), never joined
/// with the records.
pub(super) const APPROVALS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS toolkey_approvals (
    tenant    TEXT NOT NULL,
    tool      TEXT NOT NULL,
    key       TEXT NOT NULL,
    revision  INTEGER NOT NULL,
    state     TEXT NOT NULL,
    request   TEXT NOT NULL,
    PRIMARY KEY (tenant, tool, key, revision)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS toolkey_approvals_state ON toolkey_approvals (tenant, state);
";

fn revision(request: &Approval) -> i64 {
    i64::try_from(request.revision).unwrap_or(i64::MAX)
}

fn requests(rows: rusqlite::Rows<'_>) -> Result<Vec<Approval>, StoreError> {
    rows.mapped(|row| row.get::<_, String>(0))
        .map(|text| Approval::from_stored(&text.map_err(unavailable)?))
        .collect()
}

#[async_trait]
impl Approvals for SqliteStore {
    async fn latest_approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        let id = id.clone();
        self.read(move |conn, _| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT request FROM toolkey_approvals
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3
                     ORDER BY revision DESC LIMIT 1",
                )
                .map_err(unavailable)?;
            let rows = stmt
                .query(params![id.tenant, id.tool, id.key])
                .map_err(unavailable)?;
            Ok(requests(rows)?.pop())
        })
        .await
    }

    /// One statement: the row is written only while the key's latest revision is the one
    /// before it; two writers of one revision meet at the primary key.
    async fn open_approval(&self, request: &Approval) -> Result<bool, StoreError> {
        let request = request.clone();
        self.write(move |tx, _| {
            let id = &request.id;
            tx.prepare_cached(
                "INSERT INTO toolkey_approvals (tenant, tool, key, revision, state, request)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6
                 WHERE COALESCE((SELECT MAX(revision) FROM toolkey_approvals
                                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3), 0) + 1 = ?4
                 ON CONFLICT DO NOTHING",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    id.tenant,
                    id.tool,
                    id.key,
                    revision(&request),
                    request.state.as_str(),
                    request.to_stored(),
                ])
            })
            .map(|changed| changed == 1)
            .map_err(unavailable)
        })
        .await
    }

    async fn update_approval(
        &self,
        request: &Approval,
        seen: ApprovalState,
    ) -> Result<bool, StoreError> {
        let request = request.clone();
        self.write(move |tx, _| {
            let id = &request.id;
            tx.prepare_cached(
                "UPDATE toolkey_approvals SET state = ?5, request = ?6
                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND revision = ?4 AND state = ?7",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    id.tenant,
                    id.tool,
                    id.key,
                    revision(&request),
                    request.state.as_str(),
                    request.to_stored(),
                    seen.as_str(),
                ])
            })
            .map(|changed| changed == 1)
            .map_err(unavailable)
        })
        .await
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        after: Option<(&ApprovalKey, u64)>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let tenant = tenant.to_owned();
        let (tool, key, revision) = match after {
            Some((id, revision)) => (id.tool.clone(), id.key.clone(), revision),
            None => (String::new(), String::new(), 0),
        };
        let revision = i64::try_from(revision).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn, _| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT request FROM toolkey_approvals
                     WHERE tenant = ?1 AND (?2 IS NULL OR state = ?2)
                       AND (tool, key, revision) > (?3, ?4, ?5)
                     ORDER BY tool, key, revision LIMIT ?6",
                )
                .map_err(unavailable)?;
            let rows = stmt
                .query(params![
                    tenant,
                    state.map(ApprovalState::as_str),
                    tool,
                    key,
                    revision,
                    limit
                ])
                .map_err(unavailable)?;
            requests(rows)
        })
        .await
    }
}
