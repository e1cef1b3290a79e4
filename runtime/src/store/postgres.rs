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
/// while a tool body runs. `reserve` is `INSERT ... ON CONFLICT DO UPDATE ... WHERE <the old
/// record is completed and expired, or resolved as not done> RETURNING`, and only when that
/// inserted nothing, a read of the record that is there. `complete`, `release`, `renew` and
/// `mark_unknown` are single statements fenced by `WHERE token = $n AND state IN ('in_progress',
/// 'not_done')`; `take_over` is one conditional `UPDATE`,
/// so of several workers naming a stale token exactly one wins the row lock and the others find
/// the token changed.
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
    /// refuses a table of a newer version. Also creates `<table>_failures` if it is missing: the
    /// failure counters of retry limits, beside the records. Safe to run from many processes at once (it holds an
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

impl PostgresStoreBuilder {
    fn new(source: Source) -> Self {
        PostgresStoreBuilder {
            source,
            schema: None,
            table: "toolkey_records".into(),
            pool_size: 16,
            timeout: Duration::from_secs(5),
            run_migrations: true,
        }
    }

    /// The schema that holds the table (created by the migration if missing). Default: none, the
    /// connection's search path decides. A letter or `_`, then letters, digits or `_`; at most
    /// 63 bytes; kept in the case given (it is quoted).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The table's name. Default `toolkey_records`. A letter or `_`, then letters, digits or `_`;
    /// at most 48 bytes (its index is named after it); kept in the case given (it is quoted).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the store opens. Default 16.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a call waits for a connection, and then for the server's answer, before it is
    /// [`StoreError::Unavailable`]. Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether [`connect`](PostgresStoreBuilder::connect) runs [`PostgresStore::migrate`].
    /// Default true; turn it off where the application's role may not create tables and the
    /// deployment migrates instead.
    pub fn run_migrations(mut self, run: bool) -> Self {
        self.run_migrations = run;
        self
    }

    /// Builds the store and checks that the server answers (migrating if so configured).
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let schema = self
            .schema
            .as_deref()
            .map(|s| Ident::new("schema", s, 63))
            .transpose()?;
        let table = Ident::new("table", &self.table, 48)?;
        let pool = match self.source {
            Source::Pool(pool) => pool,
            Source::Url(url) => {
                let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
                    StoreError::Config(format!("postgres: bad connection string: {e}"))
                })?;
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(self.timeout);
                }
                if config.get_application_name().is_none() {
                    config.application_name("toolkey");
                }
                // The statements are written for READ COMMITTED (the server's default), whatever
                // the server or role was configured with.
                let options = match config.get_options() {
                    Some(theirs) => format!("{theirs} {ISOLATION_OPTION}"),
                    None => ISOLATION_OPTION.to_string(),
                };
                config.options(options);
                let manager = Manager::from_config(
                    config,
                    NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                Pool::builder(manager)
                    .max_size(self.pool_size)
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(self.timeout))
                    .create_timeout(Some(self.timeout))
                    .recycle_timeout(Some(self.timeout))
                    .build()
                    .map_err(|e| {
                        StoreError::Unavailable(format!("postgres: cannot build the pool: {e}"))
                    })?
            }
        };
        let store = PostgresStore {
            pool,
            sql: Arc::new(Sql::new(schema, table)),
            timeout: self.timeout,
        };
        if self.run_migrations {
            store.migrate().await?;
        } else {
            store.now().await?;
        }
        Ok(store)
    }
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

/// A validated SQL identifier and its quoted form.
#[derive(Debug)]
struct Ident {
    name: String,
    quoted: String,
}

impl Ident {
    fn new(what: &str, name: &str, max: usize) -> Result<Ident, StoreError> {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.len() <= max;
        if !valid {
            return Err(StoreError::Config(format!(
                "postgres: invalid {what} name {name:?}: expected a letter or `_`, then letters, \
                 digits or `_`, at most {max} bytes"
            )));
        }
        Ok(Ident {
            name: name.to_string(),
            quoted: format!("\"{name}\""),
        })
    }
}

/// The statements of one table, written once when the store is built.
#[derive(Debug)]
struct Sql {
    schema: Option<Ident>,
    /// The table's name, as the version table keys it.
    table_name: String,
    /// The table, quoted and qualified.
    table: String,
    versions: String,
    create: String,
    /// The migration from version 1.
    add_tool: String,
    reserve: String,
    read: String,
    complete: String,
    completed_by: String,
    release: String,
    renew: String,
    mark_unknown: String,
    take_over: String,
    purge: String,
    list: String,
    resolve_done: String,
    resolve_not_done: String,
    now: String,
    // Retry limits: the failure counters' table and statements.
    failures_table: String,
    failures_create: String,
    count_failure: String,
    failures: String,
    clear_failures: String,
}

impl Sql {
    fn new(schema: Option<Ident>, table: Ident) -> Sql {
        let qualify = |name: &str| match &schema {
            Some(s) => format!("{}.{name}", s.quoted),
            None => name.to_string(),
        };
        let t = qualify(&table.quoted);
        let index = format!("\"{}_expires_at\"", table.name);
        let ms = |column: &str| format!("(extract(epoch FROM {column}) * 1000)::int8");
        // In progress, or resolved as not done while the token held it: a holder an operator
        // judged dead that was alive after all still records what it did.
        let fenced = format!(
            "tenant = $1 AND key = $2 AND token = $3 AND state IN ('{IN_PROGRESS}', '{NOT_DONE}')"
        );
        // A record's columns and the server's clock, as `stored_at` reads them.
        let columns = format!(
            "state, token, fingerprint, {}, {}, outcome, {}, {}, {}, tool",
            ms("since"),
            ms("lease_until"),
            ms("completed_at"),
            ms("expires_at"),
            ms(NOW),
        );
        let resolvable = format!(
            "tenant = $1 AND key = $2 AND token = $3
             AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW}))"
        );
        let f = qualify(&format!("\"{}_failures\"", table.name));
        let f_index = format!("\"{}_failures_ends\"", table.name);
        let after = |ms: &str| format!("{NOW} + {ms}::int8 * interval '1 millisecond'");
        Sql {
            failures_create: format!(
                "CREATE TABLE IF NOT EXISTS {f} (
                     tenant   text NOT NULL,
                     key      text NOT NULL,
                     failures int8 NOT NULL,
                     ends_at  timestamptz NOT NULL,
                     PRIMARY KEY (tenant, key)
                 );
                 CREATE INDEX IF NOT EXISTS {f_index} ON {f} (ends_at);"
            ),
            // One statement: a few ended counters of other keys swept (never this key's row, which
            // the upsert may be changing in the same statement), then this key's counter
            // inserted, restarted (its window ended) or added to. Concurrent counts of one key
            // queue on its row lock, and each reads the count the one before it left.
            count_failure: format!(
                "WITH swept AS (
                     DELETE FROM {f} WHERE (tenant, key) IN (
                         SELECT tenant, key FROM {f}
                         WHERE ends_at <= {NOW} AND NOT (tenant = $1 AND key = $2)
                         LIMIT 64 FOR UPDATE SKIP LOCKED)
                 )
                 INSERT INTO {f} AS f (tenant, key, failures, ends_at)
                 VALUES ($1, $2, 1, {window})
                 ON CONFLICT (tenant, key) DO UPDATE SET
                     failures = CASE WHEN f.ends_at <= {NOW} THEN 1 ELSE f.failures + 1 END,
                     ends_at = CASE WHEN f.ends_at <= {NOW} THEN excluded.ends_at ELSE f.ends_at END
                 RETURNING failures",
                window = after("$3"),
            ),
            failures: format!(
                "SELECT failures FROM {f} WHERE tenant = $1 AND key = $2 AND ends_at > {NOW}"
            ),
            clear_failures: format!("DELETE FROM {f} WHERE tenant = $1 AND key = $2"),
            failures_table: f.clone(),
            versions: qualify("toolkey_schema_version"),
            create: format!(
                "CREATE TABLE {t} (
                     tenant       text NOT NULL,
                     key          text NOT NULL,
                     state        text NOT NULL,
                     token        text NOT NULL,
                     fingerprint  text NOT NULL,
                     since        timestamptz NOT NULL,
                     lease_until  timestamptz NOT NULL,
                     outcome      text,
                     completed_at timestamptz,
                     expires_at   timestamptz,
                     tool         text,
                     PRIMARY KEY (tenant, key)
                 );
                 CREATE INDEX {index} ON {t} (expires_at) WHERE state = '{COMPLETED}';"
            ),
            // One round trip whatever the answer: the takeover of an expired record or the
            // insert of a new one (with the key's failure count, for retry limits), else the
            // record in the way, read in the same statement. A
            // live record is neither locked nor written (no transaction id, no WAL flush): a
            // replay costs a read. The read sees the statement's snapshot, so a record committed
            // by another call after it began is not there: no row, and the caller reads again.
            reserve: format!(
                "WITH expired AS (
                     UPDATE {t} SET
                         state = '{IN_PROGRESS}', token = $3, fingerprint = $4, since = {NOW}, tool = $6,
                         lease_until = {NOW} + $5::int8 * interval '1 millisecond',
                         outcome = NULL, completed_at = NULL, expires_at = NULL
                     WHERE tenant = $1 AND key = $2
                       AND ((state = '{COMPLETED}' AND expires_at <= {NOW}) OR state = '{NOT_DONE}')
                     RETURNING 1
                 ), inserted AS (
                     INSERT INTO {t} (tenant, key, state, token, fingerprint, since, lease_until, tool)
                     VALUES ($1, $2, '{IN_PROGRESS}', $3, $4, {NOW}, {NOW} + $5::int8 * interval '1 millisecond', $6)
                     ON CONFLICT (tenant, key) DO NOTHING
                     RETURNING 1
                 ), reserved AS (
                     SELECT 1 FROM expired UNION ALL SELECT 1 FROM inserted
                 )
                 SELECT true, NULL::text, NULL::text, NULL::text, NULL::int8, NULL::int8,
                        NULL::text, NULL::int8, NULL::int8, NULL::int8, NULL::text,
                        (SELECT failures FROM {f} WHERE tenant = $1 AND key = $2 AND ends_at > {NOW})
                 FROM reserved
                 UNION ALL
                 SELECT false, {columns}, NULL::int8
                 FROM {t} WHERE tenant = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM reserved)"
            ),
            read: format!("SELECT {columns} FROM {t} WHERE tenant = $1 AND key = $2"),
            complete: format!(
                "UPDATE {t} SET state = '{COMPLETED}', outcome = $4, completed_at = {NOW},
                     expires_at = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE {fenced}"
            ),
            completed_by: format!(
                "SELECT 1 FROM {t} WHERE tenant = $1 AND key = $2 AND token = $3
                   AND state = '{COMPLETED}' AND outcome = $4"
            ),
            release: format!("DELETE FROM {t} WHERE {fenced}"),
            renew: format!(
                "UPDATE {t} SET state = '{IN_PROGRESS}',
                     lease_until = {NOW} + $4::int8 * interval '1 millisecond'
                 WHERE {fenced}"
            ),
            mark_unknown: format!("UPDATE {t} SET state = '{UNKNOWN}' WHERE {fenced}"),
            take_over: format!(
                "UPDATE {t} SET state = '{IN_PROGRESS}', token = $4, since = {NOW},
                     lease_until = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE tenant = $1 AND key = $2 AND token = $3
                   AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW}))"
            ),
            add_tool: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS tool text"),
            // The outer condition repeats the inner one: a row a call's reserve replaced after
            // the subquery read it (an expired record, now that call's reservation) is
            // re-checked by the outer condition alone, and must not be deleted under its body.
            purge: format!(
                "DELETE FROM {t} WHERE (tenant, key) IN (
                     SELECT tenant, key FROM {t}
                     WHERE state = '{COMPLETED}' AND expires_at <= {NOW} LIMIT $1)
                   AND state = '{COMPLETED}' AND expires_at <= {NOW}"
            ),
            // After the cursor, narrowed by every filter the table can judge (the rest,
            // completed against failed, is judged on the rows read).
            list: format!(
                "SELECT tenant, key, {columns} FROM {t}
                 WHERE ($1::text IS NULL OR (tenant, key) > ($1::text, $2::text))
                   AND ($3::text IS NULL OR tenant = $3)
                   AND ($4::text IS NULL OR tool = $4)
                   AND ($5::text IS NULL OR key = $5)
                   AND ($6::int8 IS NULL OR since <= {NOW} - $6::int8 * interval '1 millisecond')
                   AND ($7::text IS NULL
                        OR ($7 = 'in_progress' AND state = '{IN_PROGRESS}' AND lease_until > {NOW})
                        OR ($7 = 'unknown' AND (state = '{UNKNOWN}'
                            OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW})))
                        OR ($7 IN ('completed', 'failed') AND state = '{COMPLETED}'
                            AND expires_at > {NOW}))
                 ORDER BY tenant, key
                 LIMIT $8"
            ),
            resolve_done: format!(
                "UPDATE {t} SET state = '{COMPLETED}', outcome = $4, completed_at = {NOW},
                     expires_at = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE {resolvable}"
            ),
            resolve_not_done: format!("UPDATE {t} SET state = '{NOT_DONE}' WHERE {resolvable}"),
            now: format!("SELECT {}", ms(NOW)),
            schema,
            table_name: table.name,
            table: t,
        }
    }
}

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
        let older_than = filter.older_than.map(super::millis);
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
        let failures: i64 = match row {
            Some(row) => row
                .try_get(0)
                .map_err(|e| StoreError::Unavailable(describe(&e)))?,
            None => 0,
        };
        Ok(failures.max(0) as u64)
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.failures_query(&self.sql.clear_failures, &[&key.tenant, &key.key])
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_validated_and_quoted() {
        assert_eq!(
            Ident::new("table", "Tool_calls2", 48).unwrap().quoted,
            "\"Tool_calls2\""
        );
        for bad in ["", "1abc", "a-b", "a\"b", "a b", "a;drop", "ä"] {
            assert!(Ident::new("table", bad, 48).is_err(), "{bad:?} accepted");
        }
        assert!(Ident::new("table", &"a".repeat(49), 48).is_err());
    }

    #[test]
    fn statements_name_the_qualified_table() {
        let sql = Sql::new(
            Some(Ident::new("schema", "agents", 63).unwrap()),
            Ident::new("table", "calls", 48).unwrap(),
        );
        assert_eq!(sql.table, "\"agents\".\"calls\"");
        assert_eq!(sql.versions, "\"agents\".toolkey_schema_version");
        assert!(sql
            .reserve
            .contains("INSERT INTO \"agents\".\"calls\" (tenant"));
        assert!(sql.reserve.contains("UPDATE \"agents\".\"calls\" SET"));
        assert!(sql.read.contains("FROM \"agents\".\"calls\" WHERE"));
        assert_eq!(sql.failures_table, "\"agents\".\"calls_failures\"");
        assert!(sql
            .failures_create
            .contains("CREATE TABLE IF NOT EXISTS \"agents\".\"calls_failures\" ("));
        assert!(sql
            .failures_create
            .contains("\"calls_failures_ends\" ON \"agents\".\"calls_failures\""));
        for statement in [&sql.count_failure, &sql.failures, &sql.clear_failures] {
            assert!(
                statement.contains("\"agents\".\"calls_failures\""),
                "{statement}"
            );
            assert!(!statement.contains("\"agents\".\"calls\" "), "{statement}");
        }
        assert!(sql
            .count_failure
            .contains("INSERT INTO \"agents\".\"calls_failures\" AS f"));
    }

    #[test]
    fn the_longest_table_name_keeps_its_counters_names_within_postgres_limit() {
        let table = "t".repeat(48);
        let sql = Sql::new(None, Ident::new("table", &table, 48).unwrap());
        // PostgreSQL cuts identifiers to 63 bytes: a cut name would not be the one created.
        for name in [
            format!("{table}_failures"),
            format!("{table}_failures_ends"),
        ] {
            assert!(name.len() <= 63, "{name}");
            assert!(sql.failures_create.contains(&format!("\"{name}\"")));
        }
    }
}
