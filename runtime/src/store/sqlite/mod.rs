//! The embedded store: one SQLite file, shared safely by every process on the machine.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, TransactionBehavior};

use super::row::{span_ms, StoredRecord, COMPLETED, IN_PROGRESS, NOT_DONE, UNKNOWN};
use super::{
    from_millis, to_millis, Clock, Cursor, EntryState, FailureCounters, Filter, OperatorCommands,
    Outcome, Page, Record, RecordKey, Reservation, Reservations, Resolution, StoreError,
    SystemClock, Token,
};
use crate::Fingerprint;

/// How long a statement waits for another process's write lock before the store answers
/// [`StoreError::Unavailable`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A statement's text, formatted from the module's constants once per process rather than on
/// every call: its cached statement is found by the text.
macro_rules! sql {
    ($($text:tt)*) => {{
        static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!($($text)*));
        TEXT.as_str()
    }};
}

// Declared after `sql!`, which they use.
mod approvals;
mod counters;
mod operator;
mod reservations;
mod schema;
#[cfg(test)]
mod tests;
mod transaction;
mod writer;

use counters::failures_at;
use schema::migrate;
pub(crate) use transaction::{SqliteWork, TxHandle};
use writer::{answered, lock, try_lock, Job, Writer, Writes, MAX_LINGER};

const COLUMNS: &str = "state, token, fingerprint, since_ms, lease_until_ms, outcome, \
                       completed_at_ms, expires_at_ms, tool";

/// The records a listing looks at: after the cursor, narrowed by every filter the table can
/// judge (the rest, completed against failed, is judged on the rows read).
const LIST: &str = "
SELECT tenant, key, state, token, fingerprint, since_ms, lease_until_ms, outcome,
       completed_at_ms, expires_at_ms, tool
FROM toolkey_records
WHERE (?1 IS NULL OR (tenant, key) > (?1, ?2))
  AND (?3 IS NULL OR tenant = ?3)
  AND (?4 IS NULL OR tool = ?4)
  AND (?5 IS NULL OR key = ?5)
  AND (?6 IS NULL OR since_ms <= ?6)
  AND (?7 IS NULL
       OR (?7 = 'in_progress' AND state = 'in_progress' AND lease_until_ms > ?8)
       OR (?7 = 'unknown' AND (state = 'unknown' OR (state = 'in_progress' AND lease_until_ms <= ?8)))
       OR (?7 IN ('completed', 'failed') AND state = 'completed' AND expires_at_ms > ?8))
ORDER BY tenant, key
LIMIT ?9";

/// The states in which a fenced write of the record's token applies: in progress, or resolved
/// as not done while that token held it (its holder, alive after all, still records what it did).
const HELD: &str = "'in_progress', 'not_done'";

/// A record nobody knows the outcome of, under the revision an operator saw.
const RESOLVABLE: &str = "tenant = ?1 AND key = ?2 AND token = ?3
    AND (state = 'unknown' OR (state = 'in_progress' AND lease_until_ms <= ?4))";

/// How many ended counters one count sweeps at most.
const FAILURE_SWEEP: i64 = 64;

/// Keeps records in one SQLite file (the bundled SQLite, in WAL mode).
///
/// Several processes may open the same file: every reserve is settled inside the database, under
/// SQLite's write lock (`BEGIN IMMEDIATE`), and every fenced write is one conditional statement,
/// so no in-process lock is trusted to exclude another process. A statement waits up to 5 s for
/// another process's lock before the store answers [`StoreError::Unavailable`]. Commits are
/// durable (`synchronous = FULL`): a reservation that was answered survives a power cut, and
/// concurrent writes share a commit (each is answered once the commit is flushed), so many
/// callers pay for one `fsync` between them. Keep
/// the file on a local disk: SQLite's WAL mode does not work over network file systems.
///
/// Writes are made by one writer at a time, on a thread of tokio's blocking pool. A writer whose
/// queue runs dry waits 50 µs for another write before it ends, yielding its CPU between looks:
/// a call's outcome write, which follows its reservation's answer by a few microseconds, is then
/// taken on without waking a thread. That costs up to 50 µs of a CPU, given up to any other
/// thread that wants it, after each commit that no write follows at once
/// ([`SqliteStore::with_writer_linger`] changes it). On the other side, a caller that is alone
/// in waiting for a write looks for its answer, yielding between looks, for twice as long as
/// such answers have taken lately (at most 1 ms; [`SqliteStore::with_answer_spin`] changes it),
/// before it waits to be woken: a commit on a fast disk is then answered without waking a
/// parked thread, and on a disk slower than that one wait in sixteen looks (to see the disk
/// fast again) and the others not at all.
/// Callers that wait together never look, so they leave the CPU to the writer.
///
/// Leases and retention are judged by this process's clock ([`SystemClock`] unless
/// [`SqliteStore::with_clock`] says otherwise); the processes that share a file share the machine's
/// clock. Writes and most reads run on tokio's blocking pool, so the store needs a tokio runtime.
/// One read does not: a reserve or a status read that meets a live record (a replay, an
/// `IN_PROGRESS` or a `CONFLICT` answer) reads it on the caller's thread when a connection is
/// free (the writer's, whose pages are current, or one kept for that), since a point read of a
/// WAL file costs less than the hop to the pool; such a read never waits for a lock, and a read
/// that would wait goes to the pool.
///
/// ```no_run
/// use toolkey::store::SqliteStore;
///
/// # fn main() -> Result<(), toolkey::store::StoreError> {
/// let store = SqliteStore::open("toolkey.db")?; // created with its schema if new
/// # drop(store);
/// # Ok(())
/// # }
/// ```
// Gated here too: the facade shows the store module from this crate, and rustdoc reads only
// an item's own cfg across crates.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct SqliteStore {
    /// Writes, and reads of an in-memory database.
    conn: Arc<Mutex<Connection>>,
    /// Reads of a file: a connection of their own, so that a read never waits behind a commit
    /// being flushed (WAL readers see the last commit without the write lock).
    reader: Arc<Mutex<Connection>>,
    /// Reads made on the caller's thread when this connection is free: a reserve that meets a
    /// live record (a replay, IN_PROGRESS or CONFLICT) is answered without the hop to the
    /// blocking pool, which costs several times the read. It has no busy timeout, so a read
    /// that would wait fails at once and the blocking pool reads instead.
    inline: Arc<Mutex<Connection>>,
    writes: Arc<Writes>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the store in the file at `path`, creating its schema if the file has
    /// none. A file written by a newer toolkey (an unknown schema version) is refused with
    /// [`StoreError::Unavailable`] naming both versions, rather than read wrongly.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref();
        let open = || {
            Connection::open(path).map_err(|e| {
                StoreError::Unavailable(format!("sqlite: cannot open {}: {e}", path.display()))
            })
        };
        let mut store = SqliteStore::setup(open()?)?;
        let reader = open()?;
        reader.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
        store.reader = Arc::new(Mutex::new(reader));
        let inline = open()?;
        inline.busy_timeout(Duration::ZERO).map_err(unavailable)?;
        store.inline = Arc::new(Mutex::new(inline));
        Ok(store)
    }

    /// A store in memory: private to this store, gone when it is dropped. For tests.
    ///
    /// ```
    /// use toolkey::store::SqliteStore;
    ///
    /// let store = SqliteStore::open_in_memory().unwrap();
    /// # drop(store);
    /// ```
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(unavailable)?;
        SqliteStore::setup(conn)
    }

    /// Judges leases and retention by `clock` instead of the system clock, so tests can move
    /// time without sleeping.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use toolkey::store::{ManualClock, SqliteStore};
    ///
    /// let clock = Arc::new(ManualClock::new());
    /// let store = SqliteStore::open_in_memory().unwrap().with_clock(clock.clone());
    /// # drop(store);
    /// ```
    pub fn with_clock(mut self, clock: impl Clock) -> SqliteStore {
        self.clock = Arc::new(clock);
        self
    }

    /// How long the writer waits for another write, once its queue runs dry, before it ends
    /// (50 µs unless set): a write that arrives meanwhile is taken on without waking a thread.
    /// The writer yields its CPU between looks, and gives the wait up as soon as a write comes.
    /// `Duration::ZERO` ends the writer as soon as its queue is empty, which spends no CPU on
    /// waiting (for a process held to a tight CPU quota) and wakes a thread for nearly every
    /// write. A wait longer than one second is taken as one second.
    ///
    /// ```
    /// use std::time::Duration;
    /// use toolkey::store::SqliteStore;
    ///
    /// let store = SqliteStore::open_in_memory()
    ///     .unwrap()
    ///     .with_writer_linger(Duration::ZERO);
    /// # drop(store);
    /// ```
    pub fn with_writer_linger(mut self, linger: Duration) -> SqliteStore {
        self.set_writes(|writes| writes.linger = linger.min(MAX_LINGER));
        self
    }

    /// The longest a caller that no other waits beside looks for its write's answer before it
    /// waits to be woken (1 ms unless set). It looks for twice the time answers have taken
    /// lately, yielding its task and its thread between looks, and while they take longer than
    /// this only one wait in sixteen looks: an answer found so spares waking a parked thread,
    /// which can cost more than a commit on a fast disk. `Duration::ZERO` never looks, which spends no CPU on waiting (for a process
    /// held to a tight CPU quota). A look longer than one second is taken as one second.
    ///
    /// ```
    /// use std::time::Duration;
    /// use toolkey::store::SqliteStore;
    ///
    /// let store = SqliteStore::open_in_memory()
    ///     .unwrap()
    ///     .with_answer_spin(Duration::ZERO);
    /// # drop(store);
    /// ```
    pub fn with_answer_spin(mut self, most: Duration) -> SqliteStore {
        self.set_writes(|writes| writes.answer_spin = most.min(MAX_LINGER));
        self
    }

    /// Starts the store's writes afresh, with its settings as `set` leaves them.
    fn set_writes(&mut self, set: impl FnOnce(&mut Writes)) {
        let mut writes = Writes {
            linger: self.writes.linger,
            answer_spin: self.writes.answer_spin,
            ..Writes::default()
        };
        set(&mut writes);
        self.writes = Arc::new(writes);
    }

    fn setup(mut conn: Connection) -> Result<SqliteStore, StoreError> {
        conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
        // An in-memory database answers "memory": it has no other process to share with.
        // Switching a new file to WAL takes a lock SQLite does not wait for: processes opening
        // the same new file at once see SQLITE_BUSY here, so wait as the busy timeout would.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
            {
                Ok(_) => break,
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(unavailable)?;
        migrate(&mut conn)?;
        let conn = Arc::new(Mutex::new(conn));
        Ok(SqliteStore {
            reader: conn.clone(),
            inline: conn.clone(),
            conn,
            writes: Arc::new(Writes::default()),
            clock: Arc::new(SystemClock),
        })
    }

    /// Runs `f` on tokio's blocking pool, in a transaction that holds the database's write lock
    /// (`BEGIN IMMEDIATE`), with the clock read once the lock is held: a lease or a retention
    /// is measured from when the write applies, not from before a wait for another process's
    /// lock (or this store's own connection). Concurrent writes share a commit (see
    /// [`Writes`]); each is answered once its commit is durable.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, answer) = Job::queued(f);
        if self.writes.submit(job) {
            let writer = Writer {
                conn: self.conn.clone(),
                writes: self.writes.clone(),
                clock: self.clock.clone(),
                done: false,
            };
            tokio::task::spawn_blocking(move || writer.run());
        }
        answered(answer, &self.writes).await
    }

    /// Runs `f` on tokio's blocking pool with the connection and the clock read once the
    /// connection is this call's.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    {
        let (conn, clock) = (self.reader.clone(), self.clock.clone());
        tokio::task::spawn_blocking(move || {
            let conn = lock(&conn);
            f(&conn, to_millis(clock.now()))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite: the store's task failed: {e}")))?
    }

    /// `key`'s record read on the caller's thread, if that can be done at once: the writer's
    /// connection or the inline one free, and the read not waiting for anything.
    ///
    /// The writer's connection is asked first. It made this process's last commit, so the
    /// pages it keeps are current and the read finds them in memory; the inline connection's
    /// pages are stale after every commit of another connection, and a point read on it reads
    /// them again from the WAL (four reads of the file, a fifth of a first run's overhead).
    /// While the writer commits, its connection is busy and the inline one reads.
    fn read_inline(&self, key: &RecordKey) -> Inline {
        let read = match try_lock(&self.conn) {
            // Its busy timeout is the writer's: for this read, none, so that a read that would
            // wait fails at once.
            Some(conn) => free_read(&conn, key, Some(BUSY_TIMEOUT)),
            None => match try_lock(&self.inline) {
                Some(conn) => free_read(&conn, key, None),
                None => None,
            },
        };
        let Some(stored) = read else {
            return Inline::Unread;
        };
        let now = to_millis(self.clock.now());
        match stored {
            Some(stored) if !stored.absent(now) => Inline::Live(stored.to_record(key, now)),
            _ => Inline::Free,
        }
    }

    /// Overwrites a record's stored outcome with text that is not an outcome, as disk or a
    /// careless migration might. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn __corrupt(&self, key: &RecordKey) {
        lock(&self.conn)
            .execute(
                "UPDATE toolkey_records SET outcome = '{not json' WHERE tenant = ?1 AND key = ?2",
                params![key.tenant, key.key],
            )
            .expect("corrupt a record");
    }
}

/// `key`'s row read on `conn` if the read waits for nothing: the connection outside a
/// transaction (one a panic left open is the writer's to roll back), and no lock in the way.
/// `restore`: the busy timeout `conn` has, set to none for the read and back after it.
fn free_read(
    conn: &Connection,
    key: &RecordKey,
    restore: Option<Duration>,
) -> Option<Option<StoredRecord>> {
    if !conn.is_autocommit() {
        return None;
    }
    let Some(timeout) = restore else {
        return read_row(conn, key).ok();
    };
    conn.busy_timeout(Duration::ZERO).ok()?;
    let read = read_row(conn, key).ok();
    // Left at zero, the writer's next commit would fail at once on another process's lock.
    conn.busy_timeout(timeout)
        .expect("setting a busy timeout fails only on a closed connection");
    read
}

/// SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock for now.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn unavailable(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {e}"))
}

/// Reads the record of `key`, if there is one.
fn read_row(conn: &Connection, key: &RecordKey) -> Result<Option<StoredRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(sql!(
            "SELECT {COLUMNS} FROM toolkey_records WHERE tenant = ?1 AND key = ?2"
        ))
        .map_err(unavailable)?;
    let mut rows = stmt
        .query(params![key.tenant, key.key])
        .map_err(unavailable)?;
    match rows.next().map_err(unavailable)? {
        Some(row) => stored_at(row, key, 0).map(Some),
        None => Ok(None),
    }
}

/// The record in `row`'s columns from `at` on, in [`COLUMNS`]' order.
fn stored_at(
    row: &rusqlite::Row<'_>,
    key: &RecordKey,
    at: usize,
) -> Result<StoredRecord, StoreError> {
    let text = |i: usize| -> Result<Option<String>, StoreError> {
        match row.get_ref(at + i).map_err(unavailable)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(t) => String::from_utf8(t.to_vec())
                .map(Some)
                .map_err(|_| StoreError::corrupt(key, format!("column {i} is not UTF-8"))),
            other => Err(StoreError::corrupt(
                key,
                format!("column {i} holds {}, expected text", other.data_type()),
            )),
        }
    };
    let int = |i: usize| -> Result<Option<i64>, StoreError> {
        match row.get_ref(at + i).map_err(unavailable)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(n) => Ok(Some(n)),
            other => Err(StoreError::corrupt(
                key,
                format!(
                    "column {i} holds {}, expected an integer",
                    other.data_type()
                ),
            )),
        }
    };
    let missing = |what: &str| StoreError::corrupt(key, format!("{what} is missing"));
    Ok(StoredRecord {
        state: text(0)?.ok_or_else(|| missing("state"))?,
        token: text(1)?.ok_or_else(|| missing("token"))?,
        fingerprint: text(2)?.ok_or_else(|| missing("fingerprint"))?,
        since_ms: int(3)?.ok_or_else(|| missing("since"))?,
        lease_until_ms: int(4)?.ok_or_else(|| missing("lease"))?,
        outcome: text(5)?,
        completed_at_ms: int(6)?,
        expires_at_ms: int(7)?,
        tool: text(8)?,
    })
}

/// Runs one fenced statement; true when it changed a row.
/// What a read on the caller's thread found.
enum Inline {
    /// A live record: the answer.
    Live(Result<Record, StoreError>),
    /// No record, or an expired one, as of the read.
    Free,
    /// The read could not be made at once: the blocking pool must read.
    Unread,
}

fn fenced(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(unavailable)?;
    Ok(stmt.execute(params).map_err(unavailable)? > 0)
}
