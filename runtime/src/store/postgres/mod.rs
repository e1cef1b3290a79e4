//! The PostgreSQL store: one table keyed by (tenant, key), every decision taken by the server.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool_postgres::{
    ClientWrapper, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;

use super::row::{span_ms, StoredRecord, COMPLETED, IN_PROGRESS, NOT_DONE, UNKNOWN};
use super::{
    from_millis, Cursor, EntryState, FailureCounters, Filter, OperatorCommands, Outcome, Page,
    Record, RecordKey, Reservation, Reservations, Resolution, StoreError, Token,
};
use crate::Fingerprint;

mod approvals;
mod builder;
mod counters;
mod operator;
mod reservations;
mod sql;
#[cfg(test)]
mod tests;
mod transaction;

use sql::{Ident, Sql};
pub(crate) use transaction::PgWork;

/// The schema version this build writes, kept per table in `toolkey_schema_version`. Version 1
/// had no `tool` column; [`PostgresStore::migrate`] adds it.
const SCHEMA_VERSION: i32 = 2;

/// The server's clock, cut to whole milliseconds as every store keeps time. Every stored time and
/// every comparison uses it, so SQL and the Rust side never disagree inside a millisecond.
const NOW: &str = "date_trunc('milliseconds', now())";

/// Sets every session of the store's own pool to READ COMMITTED.
const ISOLATION_OPTION: &str = "-c default_transaction_isolation=read\\ committed";

/// How often `reserve` retries when the record it conflicted with is gone (released or expired)
/// by the time it is read. Each retry needs another worker to win a race in between.
const RESERVE_ATTEMPTS: usize = 8;

/// Keeps records in one PostgreSQL table; leases and retention are judged by the server's `now()`,
/// so workers on machines with skewed clocks agree.
///
/// Each operation is one statement in its own READ COMMITTED transaction; no transaction is held
/// while a tool body runs. `reserve` is one statement: an `UPDATE` of the key's row when it is
/// completed and expired, or resolved as not done; else an `INSERT ... ON CONFLICT DO NOTHING`;
/// else a read of the record that is there. Every lookup goes through the primary key alone, so
/// its cost does not grow with the expired records a purge has not yet removed. `complete`,
/// `release`, `renew` and `mark_unknown` are single statements fenced by `WHERE token = $n AND
/// state IN ('in_progress', 'not_done')`; `take_over` is one conditional `UPDATE`, so of several
/// workers naming a stale token exactly one wins the row lock and the others find the token
/// changed.
///
/// Connections come from a [deadpool-postgres](deadpool_postgres) pool: a single
/// `tokio_postgres::Client` would queue every call behind the slowest and die with its socket;
/// the pool bounds the connections, drops closed ones when they are checked out (so a server
/// restart or a killed backend costs at most the calls in flight), gives the wait, connect and
/// recycle timeouts that make an unreachable server answer [`StoreError::Unavailable`] promptly
/// (fail closed), and caches each connection's prepared statements. A connection whose call failed
/// or timed out is dropped instead of returned to the pool.
///
/// Connections are made without TLS. To use TLS, or to share a pool, build the pool yourself and
/// pass it to [`PostgresStore::with_pool`].
///
/// Outcomes are kept as `text`, not `jsonb`: `jsonb` refuses `\u0000` inside strings, and the
/// store reads back the exact text the runtime wrote (a cell that does not parse is
/// [`StoreError::Corrupt`]). Tenants and keys are `text`, which cannot hold a NUL character.
///
/// ```no_run
/// use std::time::Duration;
/// use toolkey::store::PostgresStore;
///
/// # async fn run() -> Result<(), toolkey::store::StoreError> {
/// // The default: table `toolkey_records` on the search path, migrated on connect.
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
///
/// // A table of your choosing, migrated by your deployment instead.
/// let store = PostgresStore::builder("postgres://app@db.internal/app")
///     .schema("agents")
///     .table("tool_calls")
///     .pool_size(8)
///     .timeout(Duration::from_secs(2))
///     .run_migrations(false)
///     .connect()
///     .await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
// Gated here too: the facade shows the store module from this crate, and rustdoc reads only
// an item's own cfg across crates.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    timeout: Duration,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.table)
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

/// Configures a [`PostgresStore`]: where it connects, which table, how long it waits.
#[derive(Debug)]
// Gated here too: the facade shows the store module from this crate, and rustdoc reads only
// an item's own cfg across crates.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStoreBuilder {
    source: Source,
    schema: Option<String>,
    table: String,
    pool_size: usize,
    timeout: Duration,
    run_migrations: bool,
}

enum Source {
    Url(String),
    Pool(Pool),
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A URL may carry a password.
            Source::Url(_) => f.write_str("Url(..)"),
            Source::Pool(pool) => f.debug_tuple("Pool").field(&pool.status()).finish(),
        }
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (a `postgres://` URL or a `key=value` string), with the
    /// defaults: table `toolkey_records` on the search path, migrated now, 16 connections, 5 s
    /// timeouts. The server must answer: an unreachable one is [`StoreError::Unavailable`].
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(url).connect().await
    }

    /// A builder for a store connecting to `url`.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Url(url.into()))
    }

    /// A builder for a store on a [deadpool-postgres](deadpool_postgres) 0.14 pool you made (for
    /// TLS, or to share connections with the rest of the application). `pool_size` does not
    /// apply. Give the pool a runtime and timeouts, or an unreachable server makes calls wait for
    /// a connection forever; and leave its sessions at READ COMMITTED (the server's default),
    /// which the store's statements are written for.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use deadpool_postgres::{Manager, Pool, Runtime};
    /// use toolkey::store::PostgresStore;
    ///
    /// # async fn run(tls: tokio_postgres::NoTls) -> Result<(), Box<dyn std::error::Error>> {
    /// let config: tokio_postgres::Config = "postgres://app@db.internal/app".parse()?;
    /// let pool = Pool::builder(Manager::new(config, tls)) // your TLS connector here
    ///     .runtime(Runtime::Tokio1)
    ///     .wait_timeout(Some(Duration::from_secs(5)))
    ///     .create_timeout(Some(Duration::from_secs(5)))
    ///     .build()?;
    /// let store = PostgresStore::with_pool(pool).connect().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_pool(pool: Pool) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Pool(pool))
    }

    /// Creates the schema, table and index if they are missing and records the schema version;
    /// refuses a table of a newer version. Also creates `<table>_failures` and
    /// `<table>_approvals` if they are missing: the failure counters of retry limits and the
    /// approval requests, beside the records. Safe to run from many processes at once (it holds an
    /// advisory lock on the table's name). [`PostgresStoreBuilder::connect`] runs it unless told
    /// not to.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let sql = self.sql.clone();
        self.run(async move |client: &mut ClientWrapper| {
            let tx = client.transaction().await.map_err(Failure::Db)?;
            // One lock for every toolkey migration in the database: concurrent
            // `CREATE ... IF NOT EXISTS` of one object can still fail on a unique index.
            let lock = i64::from_be_bytes(
                Sha256::digest(b"toolkey-migrate")[..8]
                    .try_into()
                    .expect("eight bytes"),
            );
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
                .await
                .map_err(Failure::Db)?;
            if let Some(schema) = &sql.schema {
                // CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when the schema
                // exists, so look first.
                let exists = tx
                    .query_opt(
                        "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                        &[&schema.name],
                    )
                    .await
                    .map_err(Failure::Db)?
                    .is_some();
                if !exists {
                    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", schema.quoted))
                        .await
                        .map_err(Failure::Db)?;
                }
            }
            tx.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {} (
                     table_name text PRIMARY KEY,
                     version    integer NOT NULL
                 )",
                sql.versions
            ))
            .await
            .map_err(Failure::Db)?;
            let version: Option<i32> = tx
                .query_opt(
                    &format!("SELECT version FROM {} WHERE table_name = $1", sql.versions),
                    &[&sql.table_name],
                )
                .await
                .map_err(Failure::Db)?
                .map(|row| row.get(0));
            match version {
                None => {
                    tx.batch_execute(&sql.create).await.map_err(Failure::Db)?;
                    tx.execute(
                        &format!(
                            "INSERT INTO {} (table_name, version) VALUES ($1, $2)",
                            sql.versions
                        ),
                        &[&sql.table_name, &SCHEMA_VERSION],
                    )
                    .await
                    .map_err(Failure::Db)?;
                }
                // Records of version 1 read as they are; their tool is unknown (NULL).
                Some(1) => {
                    tx.batch_execute(&sql.add_tool).await.map_err(Failure::Db)?;
                    tx.execute(
                        &format!(
                            "UPDATE {} SET version = $2 WHERE table_name = $1",
                            sql.versions
                        ),
                        &[&sql.table_name, &SCHEMA_VERSION],
                    )
                    .await
                    .map_err(Failure::Db)?;
                }
                Some(SCHEMA_VERSION) => {}
                Some(other) => {
                    return Err(Failure::Refused(format!(
                        "postgres: table {} has schema version {other}, this toolkey knows version \
                         {SCHEMA_VERSION}: it was migrated by a newer toolkey",
                        sql.table
                    )))
                }
            }
            // The retry limits' counters: a table beside the records, added to a database
            // migrated before it existed too.
            tx.batch_execute(&sql.failures_create)
                .await
                .map_err(Failure::Db)?;
            // Approval requests: likewise beside the records.
            tx.batch_execute(&sql.approvals.create)
                .await
                .map_err(Failure::Db)?;
            tx.commit().await.map_err(Failure::Db)
        })
        .await
    }

    /// Runs `op` on a pooled connection within the store's timeout. A connection whose call
    /// failed or timed out is dropped rather than returned to the pool: its socket may be dead
    /// in a way the pool's checks would not see.
    async fn run<T>(
        &self,
        op: impl AsyncFnOnce(&mut ClientWrapper) -> Result<T, Failure>,
    ) -> Result<T, StoreError> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(with_causes(&e)))?;
        match tokio::time::timeout(self.timeout, op(&mut client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Failure::Refused(why))) => Err(StoreError::Config(why)),
            Ok(Err(Failure::Db(e))) => {
                drop(Object::take(client));
                Err(StoreError::Unavailable(describe(&e)))
            }
            Err(_) => {
                drop(Object::take(client));
                Err(StoreError::Unavailable(format!(
                    "postgres: no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    /// Runs one prepared statement that reports the rows it changed.
    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        self.run(async |client: &mut ClientWrapper| {
            let statement = client.prepare_cached(sql).await.map_err(Failure::Db)?;
            client
                .execute(&statement, params)
                .await
                .map_err(Failure::Db)
        })
        .await
    }

    /// Reads the record of `key` and the server's clock in one statement.
    async fn read(&self, key: &RecordKey) -> Result<Option<(StoredRecord, i64)>, StoreError> {
        let row = self
            .run(async |client: &mut ClientWrapper| {
                let statement = client
                    .prepare_cached(&self.sql.read)
                    .await
                    .map_err(Failure::Db)?;
                client
                    .query_opt(&statement, &[&key.tenant, &key.key])
                    .await
                    .map_err(Failure::Db)
            })
            .await?;
        row.map(|row| stored_at(&row, 0, key)).transpose()
    }

    /// Runs one statement on the failure counters' table, and returns its row if it gave one.
    /// A missing table (a database migrated before retry limits, by a deployment that runs
    /// migrations itself) is a configuration error that names the fix, not an outage.
    async fn failures_query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        self.run(async |client: &mut ClientWrapper| {
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| self.failures_missing(e))?;
            client
                .query_opt(&statement, params)
                .await
                .map_err(|e| self.failures_missing(e))
        })
        .await
    }

    /// A statement's error, where a missing failure counters' table (a database migrated
    /// before retry limits, by a deployment that runs migrations itself) is a configuration
    /// error that names the fix, not an outage.
    fn failures_missing(&self, e: tokio_postgres::Error) -> Failure {
        if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
            Failure::Refused(format!(
                "postgres: table {} is missing: run PostgresStore::migrate (it holds the failure \
                 counters of retry limits)",
                self.sql.failures_table
            ))
        } else {
            Failure::Db(e)
        }
    }

    /// Overwrites a record's stored outcome with text that is not an outcome, as disk or a
    /// careless migration might. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn __corrupt(&self, key: &RecordKey) {
        let sql = format!(
            "UPDATE {} SET outcome = '{{not json' WHERE tenant = $1 AND key = $2",
            self.sql.table
        );
        self.execute(&sql, &[&key.tenant, &key.key])
            .await
            .expect("corrupt a record");
    }
}

/// The record and the server's clock in `row`, from column `at` on, in the order of
/// [`Sql::read`]'s columns.
fn stored_at(
    row: &tokio_postgres::Row,
    at: usize,
    key: &RecordKey,
) -> Result<(StoredRecord, i64), StoreError> {
    let corrupt =
        |e: tokio_postgres::Error| StoreError::corrupt(key, format!("unreadable column: {e}"));
    let stored = StoredRecord {
        state: row.try_get(at).map_err(corrupt)?,
        token: row.try_get(at + 1).map_err(corrupt)?,
        fingerprint: row.try_get(at + 2).map_err(corrupt)?,
        since_ms: row.try_get(at + 3).map_err(corrupt)?,
        lease_until_ms: row.try_get(at + 4).map_err(corrupt)?,
        outcome: row.try_get(at + 5).map_err(corrupt)?,
        completed_at_ms: row.try_get(at + 6).map_err(corrupt)?,
        expires_at_ms: row.try_get(at + 7).map_err(corrupt)?,
        tool: row.try_get(at + 9).map_err(corrupt)?,
    };
    let now: i64 = row.try_get(at + 8).map_err(corrupt)?;
    Ok((stored, now))
}

/// Why an operation on a connection failed.
enum Failure {
    /// The server or the connection failed: the connection is not trusted again.
    Db(tokio_postgres::Error),
    /// The operation refused to go on (a schema of another version); the connection is fine.
    Refused(String),
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
        None => with_causes(e),
    }
}

/// `e` and its causes, which tokio-postgres and deadpool keep out of their messages
/// ("error connecting to server": connection refused).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = format!("postgres: {e}");
    let mut cause = e.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.ends_with(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    text
}

impl PostgresStore {
    /// The text of the reserve statement (parameters: tenant, key, token, fingerprint, lease in
    /// ms, tool), for the test that reads its plan.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn __reserve_statement(&self) -> &str {
        &self.sql.reserve
    }
}
