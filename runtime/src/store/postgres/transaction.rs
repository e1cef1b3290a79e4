//! Transactional calls on PostgreSQL (see [`transaction`](crate::store::transaction)): the
//! store's own reserve statement and completion, inside the body's transaction.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::IsolationLevel;

use super::*;
use crate::store::transaction::{kept, TxCall, TxEnded};
use crate::ToolError;

/// A transactional body on PostgreSQL, its invocation bound: it writes through the transaction.
pub(crate) type PgWork = Box<
    dyn for<'t> FnOnce(
            &'t tokio_postgres::Transaction<'t>,
        )
            -> Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 't>>
        + Send,
>;

/// What a transaction found when it reserved the key.
enum Reserved {
    Yes,
    Found(StoredRecord, i64),
}

impl PostgresStore {
    /// Runs one transactional call: BEGIN, the key reserved, `work` run with the transaction,
    /// the record completed, COMMIT. `work` is taken only when the body runs. A commit whose
    /// answer is lost is settled by reading the record on another connection.
    pub(crate) async fn transact(&self, call: &TxCall<'_>, work: &mut Option<PgWork>) -> TxEnded {
        let mut client = match self.pool.get().await {
            Ok(client) => client,
            Err(e) => return TxEnded::Refused(StoreError::Unavailable(with_causes(&e))),
        };
        let token = Token::generate();
        let ended = self.transact_on(&mut client, call, &token, work).await;
        match &ended {
            TxEnded::Committed(_) | TxEnded::Found(_) | TxEnded::Busy | TxEnded::RolledBack(_) => {}
            // The connection may be dead in a way the pool would not see.
            _ => drop(Object::take(client)),
        }
        match ended {
            TxEnded::Unsettled(problem) => self.settle(call, &token, problem).await,
            ended => ended,
        }
    }

    async fn transact_on(
        &self,
        client: &mut ClientWrapper,
        call: &TxCall<'_>,
        token: &Token,
        work: &mut Option<PgWork>,
    ) -> TxEnded {
        let prepared = async {
            let reserve = client.prepare_cached(&self.sql.reserve).await?;
            let read = client.prepare_cached(&self.sql.read).await?;
            let complete = client.prepare_cached(&self.sql.complete).await?;
            Ok::<_, tokio_postgres::Error>((reserve, read, complete))
        };
        let (reserve, read, complete) = match self.within(prepared).await {
            Ok(statements) => statements,
            Err(e) => return TxEnded::Refused(StoreError::Unavailable(e)),
        };
        // READ COMMITTED, stated rather than inherited: a duplicate's reserve waits on this
        // transaction's uncommitted row and then reads what it committed, which a snapshot
        // taken earlier (REPEATABLE READ) would not show.
        let begin = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start();
        let tx = match self.within(begin).await {
            Ok(tx) => tx,
            Err(e) => return TxEnded::Refused(StoreError::Unavailable(e)),
        };
        let reserved = match self.reserve_in(&tx, call, token, &reserve, &read).await {
            Ok(reserved) => reserved,
            Err(Waited::Busy) => return TxEnded::Busy,
            Err(Waited::Failed(e)) => return TxEnded::Refused(e),
        };
        if let Reserved::Found(stored, now) = reserved {
            // Nothing was written: the transaction is rolled back as it is dropped.
            return match stored.to_record(call.rkey, now) {
                Ok(record) => TxEnded::Found(record),
                Err(e) => TxEnded::Refused(e),
            };
        }
        let Some(work) = work.take() else {
            return TxEnded::Refused(StoreError::Config(
                "a transactional call ran its body twice".into(),
            ));
        };
        let outcome = match kept(work(&tx).await) {
            Ok(outcome) => outcome,
            Err(err) => {
                drop(tx);
                return TxEnded::RolledBack(err);
            }
        };
        if let Outcome::Err(_) = &outcome {
            // A final error keeps none of the body's writes: rolled back, then recorded alone.
            if let Err(e) = self.within(tx.rollback()).await {
                return TxEnded::Aborted(e);
            }
            return self.record_error(call, outcome).await;
        }
        let (text, retain) = (outcome.to_stored(), span_ms(call.retain));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &call.rkey.tenant,
            &call.rkey.key,
            &token.as_str(),
            &text,
            &retain,
        ];
        match self.within(tx.execute(&complete, &params)).await {
            Ok(1) => {}
            Ok(n) => {
                return TxEnded::Aborted(format!(
                    "postgres: the record's completion changed {n} rows"
                ))
            }
            Err(e) => return TxEnded::Aborted(e),
        }
        match self.within(tx.commit()).await {
            Ok(()) => TxEnded::Committed(outcome),
            Err(e) => TxEnded::Unsettled(e),
        }
    }

    /// The store's reserve statement, inside the call's transaction: it waits for a transaction
    /// that holds the key (up to the call's wait), then finds what that one committed.
    async fn reserve_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        call: &TxCall<'_>,
        token: &Token,
        reserve: &tokio_postgres::Statement,
        read: &tokio_postgres::Statement,
    ) -> Result<Reserved, Waited> {
        let key = call.rkey;
        let (fp, lease) = (call.fingerprint.to_hex(), span_ms(call.lease));
        // PostgreSQL reads zero as no limit: a call that may not wait waits a millisecond. The
        // limit is the reserve's alone: the body's statements wait as the session says.
        let wait = format!("SET LOCAL lock_timeout = {}", span_ms(call.wait).max(1));
        let unset = "SET LOCAL lock_timeout = DEFAULT";
        for _ in 0..RESERVE_ATTEMPTS {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                &key.tenant,
                &key.key,
                &token.as_str(),
                &fp,
                &lease,
                &call.label,
            ];
            // Sent together: one round trip. A reserve that waited too long fails the
            // transaction, and the reset with it.
            let (set, row, reset) = tokio::join!(
                tx.batch_execute(&wait),
                tx.query_opt(reserve, &params),
                tx.batch_execute(unset)
            );
            set.map_err(Waited::from)?;
            if let (Ok(_), Err(e)) = (&row, reset) {
                return Err(Waited::from(e));
            }
            let found = match row.map_err(Waited::from)? {
                Some(row) => {
                    let reserved: bool = row
                        .try_get(0)
                        .map_err(|e| StoreError::corrupt(key, format!("unreadable column: {e}")))?;
                    if reserved {
                        return Ok(Reserved::Yes);
                    }
                    Some(stored_at(&row, 1, key)?)
                }
                // Committed by another transaction after the statement began: read it now.
                None => tx
                    .query_opt(read, &[&key.tenant, &key.key])
                    .await
                    .map_err(Waited::from)?
                    .map(|row| stored_at(&row, 0, key))
                    .transpose()?,
            };
            if let Some((stored, now)) = found {
                if !stored.absent(now) {
                    return Ok(Reserved::Found(stored, now));
                }
            }
        }
        Err(Waited::Failed(StoreError::Unavailable(format!(
            "postgres: the record (key hash {}) changed under {RESERVE_ATTEMPTS} reserve attempts",
            crate::key::log_hash(&key.key)
        ))))
    }

    /// Records a final error as the key's outcome, the body's writes rolled back, in a
    /// transaction of its own. A duplicate that reserved the key meanwhile (nothing of this
    /// call was kept) leaves the error unrecorded: answered, and that call's outcome recorded.
    async fn record_error(&self, call: &TxCall<'_>, outcome: Outcome) -> TxEnded {
        let sql = format!(
            "INSERT INTO {} (tenant, key, state, token, fingerprint, since, lease_until, outcome,
                             completed_at, expires_at, tool)
             VALUES ($1, $2, '{COMPLETED}', $3, $4, {NOW}, {NOW}, $5, {NOW},
                     {NOW} + $6::int8 * interval '1 millisecond', $7)
             ON CONFLICT (tenant, key) DO UPDATE SET
                 state = '{COMPLETED}', token = $3, fingerprint = $4, since = {NOW},
                 lease_until = {NOW}, outcome = $5, completed_at = {NOW},
                 expires_at = {NOW} + $6::int8 * interval '1 millisecond', tool = $7
             WHERE ({t}.state = '{COMPLETED}' AND {t}.expires_at <= {NOW})
                OR {t}.state = '{NOT_DONE}'",
            self.sql.table,
            t = self.sql.table,
        );
        let (token, text) = (Token::generate(), outcome.to_stored());
        let (fp, retain) = (call.fingerprint.to_hex(), span_ms(call.retain));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
            &call.rkey.tenant,
            &call.rkey.key,
            &token.as_str(),
            &fp,
            &text,
            &retain,
            &call.label,
        ];
        match self.execute(&sql, &params).await {
            Ok(_) => TxEnded::Committed(outcome),
            // The error stands, unrecorded: nothing of the call was kept, and a retry runs once.
            Err(_) => match outcome {
                Outcome::Err(err) => TxEnded::RolledBack(err),
                Outcome::Ok(_) => unreachable!("only final errors are recorded alone"),
            },
        }
    }

    /// A commit whose answer was lost: the record read on another connection, once the
    /// transaction that sent it has ended. A reserve in a transaction that is then rolled back
    /// waits on the row the call's transaction wrote (if it still holds it) until that one
    /// commits or is rolled back by the server: the record then read is the truth. Tried until
    /// the store's timeout has passed twice.
    async fn settle(&self, call: &TxCall<'_>, token: &Token, problem: String) -> TxEnded {
        let probe = TxCall {
            wait: self.timeout,
            ..*call
        };
        let mut pause = Duration::from_millis(20);
        let until = tokio::time::Instant::now() + self.timeout * 2;
        loop {
            let looked = self
                .run(async |client: &mut ClientWrapper| {
                    let reserve = client
                        .prepare_cached(&self.sql.reserve)
                        .await
                        .map_err(Failure::Db)?;
                    let read = client
                        .prepare_cached(&self.sql.read)
                        .await
                        .map_err(Failure::Db)?;
                    let tx = client.transaction().await.map_err(Failure::Db)?;
                    let found = self
                        .reserve_in(&tx, &probe, &Token::generate(), &reserve, &read)
                        .await;
                    // The probe's reservation is never kept.
                    tx.rollback().await.map_err(Failure::Db)?;
                    Ok(found)
                })
                .await;
            match looked {
                // Free: the commit did not land, and nothing of the call is kept.
                Ok(Ok(Reserved::Yes)) => {
                    return TxEnded::Aborted(format!("{problem}; the commit did not land"))
                }
                Ok(Ok(Reserved::Found(stored, now))) => {
                    if stored.token == token.as_str() && stored.state == COMPLETED {
                        return match stored.to_record(call.rkey, now) {
                            Ok(Record::Completed { outcome, .. }) => TxEnded::Committed(outcome),
                            Ok(record) => TxEnded::Found(record),
                            Err(e) => TxEnded::Refused(e),
                        };
                    }
                    // Another call's record: this call's commit did not land, and that one is
                    // the answer.
                    return match stored.to_record(call.rkey, now) {
                        Ok(record) => TxEnded::Found(record),
                        Err(e) => TxEnded::Refused(e),
                    };
                }
                Ok(Err(_)) | Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Ok(Err(Waited::Failed(e))) | Err(e) => {
                    return TxEnded::Unsettled(format!("{problem}; then: {e}"))
                }
                Ok(Err(Waited::Busy)) => {
                    return TxEnded::Unsettled(format!(
                        "{problem}; then: the transaction still held the key"
                    ))
                }
            }
        }
    }

    /// `work` within the store's timeout, its error described.
    async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!("postgres: no answer within {:?}", self.timeout)),
        }
    }
}

/// Why a reserve inside a transaction did not find the key's record.
enum Waited {
    /// Another transaction held the key past the call's wait.
    Busy,
    Failed(StoreError),
}

impl From<tokio_postgres::Error> for Waited {
    fn from(e: tokio_postgres::Error) -> Waited {
        if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
            Waited::Busy
        } else {
            Waited::Failed(StoreError::Unavailable(describe(&e)))
        }
    }
}

impl From<StoreError> for Waited {
    fn from(e: StoreError) -> Waited {
        Waited::Failed(e)
    }
}
