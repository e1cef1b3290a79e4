//! Transactional calls on SQLite (see [`transaction`](crate::store::transaction)).
//!
//! The call's transaction runs on the store's writer connection, taken from the writer under
//! its lock, in `BEGIN IMMEDIATE`: SQLite has one writer per file whatever the connections, so
//! a second connection would only trade this wait for lock polling (`busy_timeout` sleeps
//! between tries, milliseconds at a time), and would leave the group commit's writes failing
//! behind a long body. Other writes of the store wait for the body: keep such bodies short.
//! The commit is as durable as every other write of the store (`synchronous = FULL`).

use rusqlite::Transaction;
use serde_json::Value;

use super::writer::roll_back_open;
use super::*;
use crate::store::transaction::{kept, TxCall, TxEnded};
use crate::ToolError;

/// A transactional body on SQLite, its invocation bound: it writes through the transaction.
pub(crate) type SqliteWork = Box<dyn FnOnce(&Transaction<'_>) -> Result<Value, ToolError> + Send>;

/// What a toolbox keeps of a [`SqliteStore`] to run transactional calls on it.
#[derive(Clone)]
pub(crate) struct TxHandle {
    conn: Arc<Mutex<Connection>>,
    clock: Arc<dyn Clock>,
}

impl SqliteStore {
    /// The handle transactional calls run through.
    pub(crate) fn tx_handle(&self) -> TxHandle {
        TxHandle {
            conn: self.conn.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// One transactional call's record, owned for the blocking pool.
struct Owned {
    rkey: RecordKey,
    label: String,
    fingerprint: String,
    retain: i64,
}

impl TxHandle {
    /// Runs one transactional call on the blocking pool: BEGIN IMMEDIATE, the key's record
    /// read, `work` run with the transaction when it is free, the record written completed,
    /// COMMIT. `work` is taken only when the body runs.
    pub(crate) async fn transact(
        &self,
        call: &TxCall<'_>,
        work: &mut Option<SqliteWork>,
    ) -> TxEnded {
        let owned = Owned {
            rkey: call.rkey.clone(),
            label: call.label.to_owned(),
            fingerprint: call.fingerprint.to_hex(),
            retain: span_ms(call.retain),
        };
        let (conn, clock) = (self.conn.clone(), self.clock.clone());
        // The record is read before the body is handed over: a replay takes no body.
        let taken = work.take();
        let ran = tokio::task::spawn_blocking(move || {
            let mut conn = lock(&conn);
            let ended = transact_on(&mut conn, &*clock, &owned, taken);
            (ended, owned)
        })
        .await;
        match ran {
            Ok(((ended, back), _)) => {
                if back.is_some() {
                    *work = back;
                }
                ended
            }
            Err(e) => TxEnded::Refused(StoreError::Unavailable(format!(
                "sqlite: the transaction's task failed: {e}"
            ))),
        }
    }
}

/// The call on `conn`; hands `work` back when the body did not run.
fn transact_on(
    conn: &mut Connection,
    clock: &dyn Clock,
    call: &Owned,
    work: Option<SqliteWork>,
) -> (TxEnded, Option<SqliteWork>) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return (TxEnded::Refused(unavailable(e)), work),
    };
    // Read once the write lock is held, as every write of the store reads its clock.
    let now = to_millis(clock.now());
    match read_row(&tx, &call.rkey) {
        Ok(Some(stored)) if !stored.absent(now) => {
            let found = match stored.to_record(&call.rkey, now) {
                Ok(record) => TxEnded::Found(record),
                Err(e) => TxEnded::Refused(e),
            };
            return (found, work);
        }
        Ok(_) => {}
        Err(e) => return (TxEnded::Refused(e), work),
    }
    let Some(work) = work else {
        return (
            TxEnded::Refused(StoreError::Config(
                "a transactional call ran its body twice".into(),
            )),
            None,
        );
    };
    let outcome = match kept(work(&tx)) {
        Ok(outcome) => outcome,
        Err(err) => return (TxEnded::RolledBack(err), None),
    };
    let token = Token::generate();
    if let Outcome::Err(_) = &outcome {
        // A final error keeps none of the body's writes: rolled back, then recorded alone.
        if let Err(e) = tx.rollback() {
            return (TxEnded::Aborted(format!("sqlite: {e}")), None);
        }
        let recorded = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(unavailable)
            .and_then(|tx| {
                let now = to_millis(clock.now());
                record(&tx, call, &token, &outcome, now)?;
                tx.commit().map_err(unavailable)
            });
        return match (recorded, outcome) {
            (Ok(()), outcome) => (TxEnded::Committed(outcome), None),
            // Nothing of the call was kept, and a retry runs once.
            (Err(_), Outcome::Err(err)) => (TxEnded::RolledBack(err), None),
            (Err(_), Outcome::Ok(_)) => unreachable!("only final errors are recorded alone"),
        };
    }
    if let Err(e) = record(&tx, call, &token, &outcome, now) {
        return (TxEnded::Aborted(e.to_string()), None);
    }
    match tx.commit() {
        Ok(()) => (TxEnded::Committed(outcome), None),
        // A commit SQLite refused (busy, I/O) is rolled back as the transaction drops; the
        // record read again says whether it landed.
        Err(e) => (
            settle(conn, clock, call, &token, outcome, format!("sqlite: {e}")),
            None,
        ),
    }
}

/// Writes the key's record completed with `outcome` under `token`, in place of an expired one.
fn record(
    tx: &Connection,
    call: &Owned,
    token: &Token,
    outcome: &Outcome,
    now: i64,
) -> Result<(), StoreError> {
    let mut stmt = tx
        .prepare_cached(sql!(
            "INSERT OR REPLACE INTO toolkey_records ({COLUMNS}, tenant, key)
             VALUES ('{COMPLETED}', ?3, ?4, ?5, ?5, ?6, ?5, ?7, ?8, ?1, ?2)"
        ))
        .map_err(unavailable)?;
    stmt.execute(params![
        call.rkey.tenant,
        call.rkey.key,
        token.as_str(),
        call.fingerprint,
        now,
        outcome.to_stored(),
        now.saturating_add(call.retain),
        call.label,
    ])
    .map_err(unavailable)?;
    Ok(())
}

/// A commit that failed: the record read again on the same connection, now outside any
/// transaction, says whether it landed.
fn settle(
    conn: &Connection,
    clock: &dyn Clock,
    call: &Owned,
    token: &Token,
    outcome: Outcome,
    problem: String,
) -> TxEnded {
    roll_back_open(conn);
    let now = to_millis(clock.now());
    match read_row(conn, &call.rkey) {
        Ok(Some(stored)) if stored.token == token.as_str() && stored.state == COMPLETED => {
            TxEnded::Committed(outcome)
        }
        Ok(Some(stored)) if !stored.absent(now) => match stored.to_record(&call.rkey, now) {
            Ok(record) => TxEnded::Found(record),
            Err(e) => TxEnded::Refused(e),
        },
        Ok(_) => TxEnded::Aborted(format!("{problem}; the commit did not land")),
        Err(e) => TxEnded::Unsettled(format!("{problem}; then: {e}")),
    }
}
