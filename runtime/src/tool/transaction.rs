//! The body of a transactional call: it writes through the transaction that also holds its
//! key's record, in the database library's own type.
// Without a database feature no transactional tool can be declared (a `TxBody` has no value),
// and what runs one is never reached.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

use serde_json::Value;

#[cfg(feature = "postgres")]
use super::BoxFuture;
use super::Invocation;
use crate::store::Database;
use crate::ToolError;

/// A PostgreSQL body: it gets the call's `tokio_postgres::Transaction`.
#[cfg(feature = "postgres")]
type PostgresBody = Box<
    dyn for<'t> FnOnce(
            Invocation,
            &'t tokio_postgres::Transaction<'t>,
        ) -> BoxFuture<'t, Result<Value, ToolError>>
        + Send,
>;

/// A SQLite body: it gets the call's `rusqlite::Transaction`, on a thread where blocking is
/// allowed.
#[cfg(feature = "sqlite")]
type SqliteBody =
    Box<dyn FnOnce(Invocation, &rusqlite::Transaction<'_>) -> Result<Value, ToolError> + Send>;

/// The body of a transactional call (see [`Call::transactional`](super::Call::transactional)).
///
/// Its writes, the key's record and the outcome commit together in one transaction of the
/// store's database, or none of them does. A result, or a final (not retryable) error, is
/// recorded and replayed like every keyed call's; a final error keeps none of the body's
/// writes. A retryable error, a panic or a crash rolls everything back: nothing was done, and
/// the retry runs once.
pub struct TxBody(pub(crate) Inner);

pub(crate) enum Inner {
    #[cfg(feature = "postgres")]
    Postgres(PostgresBody),
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteBody),
}

impl TxBody {
    /// A body on PostgreSQL, in READ COMMITTED: write with `tx` as with any
    /// `tokio_postgres::Transaction`, and leave committing to the call. `#[tool]` writes it for
    /// a keyed tool that takes `tx: &tokio_postgres::Transaction<'_>`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres<F>(body: F) -> TxBody
    where
        F: for<'t> FnOnce(
                Invocation,
                &'t tokio_postgres::Transaction<'t>,
            ) -> BoxFuture<'t, Result<Value, ToolError>>
            + Send
            + 'static,
    {
        TxBody(Inner::Postgres(Box::new(body)))
    }

    /// A body on SQLite: write with `tx` as with any `rusqlite::Transaction`, and leave
    /// committing to the call. It runs on tokio's blocking pool, holding the store's write
    /// lock: keep it short. `#[tool]` writes it for a keyed tool that takes
    /// `tx: &rusqlite::Transaction<'_>`.
    ///
    /// ```
    /// use toolkey::{json, ToolError, TxBody};
    ///
    /// let body = TxBody::sqlite(|_invocation, tx| {
    ///     tx.execute("INSERT INTO invoices (customer) VALUES (?1)", ["acme"])
    ///         .map_err(|e| ToolError::new("LEDGER", e.to_string()).with_retryable(true))?;
    ///     Ok(json!({"invoice": tx.last_insert_rowid()}))
    /// });
    /// assert_eq!(body.database(), toolkey::store::Database::Sqlite);
    /// ```
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite<F>(body: F) -> TxBody
    where
        F: FnOnce(Invocation, &rusqlite::Transaction<'_>) -> Result<Value, ToolError>
            + Send
            + 'static,
    {
        TxBody(Inner::Sqlite(Box::new(body)))
    }

    /// The database the body writes to.
    pub fn database(&self) -> Database {
        match self.0 {
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => Database::Postgres,
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(_) => Database::Sqlite,
        }
    }
}
