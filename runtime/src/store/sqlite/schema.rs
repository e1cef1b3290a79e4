//! The table, its schema version, and the migration every open runs.

use super::*;

/// The schema version this build writes, kept in `PRAGMA user_version`. Version 1 had no
/// `tool` column; [`migrate`] adds it.
pub(super) const SCHEMA_VERSION: i64 = 2;

pub(super) const SCHEMA: &str = "
CREATE TABLE toolkey_records (
    tenant          TEXT NOT NULL,
    key             TEXT NOT NULL,
    state           TEXT NOT NULL,
    token           TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    since_ms        INTEGER NOT NULL,
    lease_until_ms  INTEGER NOT NULL,
    outcome         TEXT,
    completed_at_ms INTEGER,
    expires_at_ms   INTEGER,
    tool            TEXT,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX toolkey_records_expiry ON toolkey_records (expires_at_ms) WHERE state = 'completed';
";

/// The failure counters of retry limits: a table of their own beside the records, created by
/// every open (a file written before it existed gets it too), never joined with the records.
pub(super) const FAILURES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS toolkey_failures (
    tenant        TEXT NOT NULL,
    key           TEXT NOT NULL,
    failures      INTEGER NOT NULL,
    ends_at_ms    INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS toolkey_failures_ends ON toolkey_failures (ends_at_ms);
";

/// Creates the schema in a new file, accepts the current one, refuses any other. Runs under the
/// write lock, so processes opening a new file together create it once.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let tx = loop {
        match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => break tx,
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(unavailable(e)),
        }
    };
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(unavailable)?;
    match version {
        0 => {
            tx.execute_batch(SCHEMA).map_err(unavailable)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(unavailable)?;
        }
        // Records of version 1 read as they are; their tool is unknown (NULL).
        1 => {
            tx.execute_batch("ALTER TABLE toolkey_records ADD COLUMN tool TEXT")
                .map_err(unavailable)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(unavailable)?;
        }
        SCHEMA_VERSION => {}
        other => {
            return Err(StoreError::Config(format!(
                "sqlite: the database has schema version {other}, this toolkey knows version \
                 {SCHEMA_VERSION}: it was written by another program or a newer toolkey"
            )))
        }
    }
    tx.execute_batch(FAILURES_SCHEMA).map_err(unavailable)?;
    tx.execute_batch(super::approvals::APPROVALS_SCHEMA)
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)
}
