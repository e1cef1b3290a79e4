//! Transactional calls: a key's record and the body's own writes committed together, in one
//! transaction of the store's database, or not at all.
//!
//! ```text
//! BEGIN (READ COMMITTED) ─ reserve the key (the store's own reserve, inside the transaction)
//!   ├─ a live record is there ──▶ ROLLBACK: the record is the answer (replay, CONFLICT, ...)
//!   └─ reserved ─ the body writes through the same transaction
//!        ├─ a result, or a final error ─ the record completed with it ─ COMMIT
//!        └─ a retryable error, a panic, a crash ──▶ ROLLBACK: nothing was done
//! COMMIT's answer lost ──▶ the record read on a new connection, once the old transaction ended
//! ```
//!
//! The record is never seen in progress: it is written in progress and completed in the one
//! transaction, so every other reader finds it absent or completed, and a status answer is never
//! `unknown`. A final error is recorded after the body's writes are rolled back: the error is
//! replayed like every keyed call's, and nothing the body wrote is kept with it.
// Without a database feature no transactional tool can be declared (a `TxBody` has no value),
// and what runs one is never reached.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

use std::any::Any;
use std::time::Duration;

#[cfg(feature = "postgres")]
pub(crate) use super::postgres::PgWork;
#[cfg(feature = "sqlite")]
pub(crate) use super::sqlite::SqliteWork;
use super::{Outcome, Record, RecordKey, StoreError};
use crate::{ErrorCode, Fingerprint, ToolError};

/// The database a transactional tool writes to, through the store that keeps its records there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// PostgreSQL: the body gets a `tokio_postgres::Transaction`.
    Postgres,
    /// SQLite: the body gets a `rusqlite::Transaction`, on a thread where blocking is allowed.
    Sqlite,
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Database::Postgres => "PostgreSQL",
            Database::Sqlite => "SQLite",
        })
    }
}

/// A store whose database runs transactional calls: a handle on the store a toolbox was given.
#[derive(Clone)]
pub(crate) enum Transactions {
    #[cfg(feature = "postgres")]
    Postgres(super::PostgresStore),
    #[cfg(feature = "sqlite")]
    Sqlite(super::sqlite::TxHandle),
}

impl Transactions {
    /// The transactions of `store`, when it is a store of a database (a `PostgresStore` or a
    /// `SqliteStore`, as given to the toolbox).
    pub(crate) fn of(store: &dyn Any) -> Option<Transactions> {
        #[cfg(feature = "postgres")]
        if let Some(store) = store.downcast_ref::<super::PostgresStore>() {
            return Some(Transactions::Postgres(store.clone()));
        }
        #[cfg(feature = "sqlite")]
        if let Some(store) = store.downcast_ref::<super::SqliteStore>() {
            return Some(Transactions::Sqlite(store.tx_handle()));
        }
        let _ = store;
        None
    }

    /// The database they run on.
    pub(crate) fn database(&self) -> Database {
        match *self {
            #[cfg(feature = "postgres")]
            Transactions::Postgres(_) => Database::Postgres,
            #[cfg(feature = "sqlite")]
            Transactions::Sqlite(_) => Database::Sqlite,
        }
    }
}

/// A transactional body as a store runs it: its invocation bound, its result as JSON. The
/// store takes it out only when the body runs.
pub(crate) enum TxWork {
    #[cfg(feature = "postgres")]
    Postgres(Option<PgWork>),
    #[cfg(feature = "sqlite")]
    Sqlite(Option<SqliteWork>),
}

impl TxWork {
    /// The database the body writes in.
    pub(crate) fn database(&self) -> Database {
        match *self {
            #[cfg(feature = "postgres")]
            TxWork::Postgres(_) => Database::Postgres,
            #[cfg(feature = "sqlite")]
            TxWork::Sqlite(_) => Database::Sqlite,
        }
    }
}

impl Transactions {
    /// Runs one transactional call, or step, in this database; `None` when `work` writes in
    /// another one (the toolbox refuses such a tool when it is built).
    pub(crate) async fn transact(&self, call: &TxCall<'_>, work: &mut TxWork) -> Option<TxEnded> {
        match (self, work) {
            #[cfg(feature = "postgres")]
            (Transactions::Postgres(store), TxWork::Postgres(work)) => {
                Some(store.transact(call, work).await)
            }
            #[cfg(feature = "sqlite")]
            (Transactions::Sqlite(store), TxWork::Sqlite(work)) => {
                Some(store.transact(call, work).await)
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// One transactional call's record: which, made by what, kept how long.
pub(crate) struct TxCall<'a> {
    pub(crate) rkey: &'a RecordKey,
    /// The tool's name, for operators' listings.
    pub(crate) label: &'a str,
    pub(crate) fingerprint: &'a Fingerprint,
    /// The lease the record is written in progress with: never seen by another transaction
    /// unless the body commits the transaction itself, which it must not do. (SQLite writes
    /// it completed at once: the write lock is held throughout.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) lease: Duration,
    pub(crate) retain: Duration,
    /// How long a duplicate waits for a transaction that holds the key before it is answered
    /// that the call is in progress. (SQLite's duplicates wait for the write lock instead.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) wait: Duration,
}

/// How a transactional call ended in the database.
#[derive(Debug)]
pub(crate) enum TxEnded {
    /// The body ran and its outcome committed with its writes (a final error: without them).
    Committed(Outcome),
    /// A live record of the key was there: the answer. The body did not run.
    Found(Record),
    /// Another transaction held the key past the wait. The body did not run.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Busy,
    /// The body ran and ended in an error that keeps nothing; the transaction was rolled back.
    RolledBack(ToolError),
    /// The body ran, and its transaction failed before its commit was sent (`problem`): rolled
    /// back by the database, nothing was done.
    Aborted(String),
    /// Nothing ran: the database could not be reached, or refused the transaction.
    Refused(StoreError),
    /// The commit was sent and its answer lost, and the record could not be read since.
    Unsettled(String),
}

/// Judges what a transactional body ended in: a result or a final error is recorded, anything
/// else (a retryable error, an unknown outcome, a panic already turned into one) rolled back.
pub(crate) fn kept(ran: Result<serde_json::Value, ToolError>) -> Result<Outcome, ToolError> {
    match ran {
        Ok(value) => Ok(Outcome::Ok(value)),
        Err(err) if err.is_retryable() || err.is(ErrorCode::OutcomeUnknown) => Err(err),
        Err(err) => Ok(Outcome::Err(err)),
    }
}
