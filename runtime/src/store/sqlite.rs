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

/// The schema version this build writes, kept in `PRAGMA user_version`. Version 1 had no
/// `tool` column; [`migrate`] adds it.
const SCHEMA_VERSION: i64 = 2;

/// How long a statement waits for another process's write lock before the store answers
/// [`StoreError::Unavailable`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
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

/// A statement's text, formatted from the module's constants once per process rather than on
/// every call: its cached statement is found by the text.
macro_rules! sql {
    ($($text:tt)*) => {{
        static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!($($text)*));
        TEXT.as_str()
    }};
}

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

/// The failure counters of retry limits: a table of their own beside the records, created by
/// every open (a file written before it existed gets it too), never joined with the records.
const FAILURES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS toolkey_failures (
    tenant        TEXT NOT NULL,
    key           TEXT NOT NULL,
    failures      INTEGER NOT NULL,
    ends_at_ms    INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS toolkey_failures_ends ON toolkey_failures (ends_at_ms);
";

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

/// The writes waiting for a commit, and whether a writer is running them.
///
/// Group commit: a write joins the queue, and the first write to find no writer running
/// starts one on the blocking pool. The writer takes every write queued, runs them in one
/// transaction (`BEGIN IMMEDIATE`), each under a savepoint so that one that fails is rolled
/// back alone, commits once, and only then answers each: no write is answered before its commit
/// is durable, and writes that arrive while a commit is being flushed share the next one. With
/// one caller at a time this is one write per commit, as before; with many, the cost of a
/// commit (the `fsync` of `synchronous = FULL`) is shared by every write in it.
///
/// A writer whose queue runs dry lingers for [`LINGER`] before it ends, so the next write (a
/// call's outcome after its reservation, the next batch of many callers) is taken on without
/// waking a thread.
struct Writes {
    queue: Mutex<Vec<Box<dyn Pending>>>,
    running: AtomicBool,
    /// Callers waiting for their write's answer.
    waiting: AtomicUsize,
    /// How long a lone caller's answers have taken lately, in nanoseconds (zero: none yet).
    typical_answer_ns: AtomicU64,
    /// Lone callers' waits begun, for the looks taken whatever the typical time.
    lone_waits: AtomicU64,
    /// The longest a lone caller looks for its answer before it waits to be woken.
    answer_spin: Duration,
    /// How long a writer waits for more writes before it ends.
    linger: Duration,
    /// Transactions committed, for tests of the sharing.
    commits: AtomicU64,
    /// Writers started, for tests of the lingering.
    writers: AtomicU64,
}

impl Default for Writes {
    fn default() -> Self {
        Writes {
            queue: Mutex::default(),
            running: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            typical_answer_ns: AtomicU64::new(0),
            lone_waits: AtomicU64::new(0),
            answer_spin: ANSWER_SPIN,
            linger: LINGER,
            commits: AtomicU64::new(0),
            writers: AtomicU64::new(0),
        }
    }
}

/// The most writes one commit carries: a bound on how long the write lock is held at once.
const MAX_BATCH: usize = 256;

/// How long a writer whose queue ran dry waits for another write before it ends. A write that
/// arrives meanwhile is taken on by the running writer, without waking a thread of the blocking
/// pool: a call's outcome write usually follows its reservation's answer by a few microseconds,
/// less than the wake costs. The writer yields its CPU between looks.
const LINGER: Duration = Duration::from_micros(50);

/// The longest a writer lingers, whatever it is told: past a few microseconds a longer wait
/// gains nothing, and a wait too long to add to the time would end the writer.
const MAX_LINGER: Duration = Duration::from_secs(1);

impl Writes {
    /// How long a lone caller's answers have taken lately.
    fn typical_answer(&self) -> Duration {
        Duration::from_nanos(self.typical_answer_ns.load(Ordering::Relaxed))
    }

    /// How long a lone caller beginning to wait now looks for its answer: as [`spin_for`]
    /// says, except that one wait in [`PROBE_EVERY`] looks for the longest whatever answers
    /// have taken. A wait that parks measures the commit and the wake together, and where a
    /// wake costs about as much as the longest look, a store whose answers once grew slow (a
    /// burst of checkpoints) would not see them fast again without such looks.
    fn spin(&self) -> Duration {
        if self
            .lone_waits
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(PROBE_EVERY)
        {
            self.answer_spin
        } else {
            spin_for(self.typical_answer(), self.answer_spin)
        }
    }

    /// Adds a lone caller's wait for its answer to the typical time: a moving average that
    /// gives the newest a quarter of the weight. One long wait (a checkpoint, a disk that
    /// stalled) counts as twice the longest look at most, so that it does not stop the looks
    /// for long. Callers that add at once may lose one's wait: the figure is a guide.
    fn answer_took(&self, took: Duration) {
        let cap = u64::try_from((self.answer_spin * 2).as_nanos()).unwrap_or(u64::MAX);
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).min(cap);
        let before = self.typical_answer_ns.load(Ordering::Relaxed);
        let now = if before == 0 {
            took
        } else {
            before - before / 4 + took / 4
        };
        self.typical_answer_ns.store(now.max(1), Ordering::Relaxed);
    }

    /// Queues `job`; true when the caller must start a writer (none is running).
    fn submit(&self, job: Box<dyn Pending>) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(job);
        !self.running.swap(true, Ordering::AcqRel)
    }

    /// Runs queued writes in batches until the queue stays empty for the linger.
    fn combine(&self, conn: &Mutex<Connection>, clock: &dyn Clock) {
        self.writers.fetch_add(1, Ordering::Relaxed);
        loop {
            let mut batch: Vec<Box<dyn Pending>> = {
                let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                if self.linger() {
                    continue;
                }
                self.running.store(false, Ordering::Release);
                // A write queued after the queue was found empty, before `running` was cleared,
                // found a writer running and started none: take it on, unless a writer started
                // since.
                let queued = !self
                    .queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty();
                if queued && !self.running.swap(true, Ordering::AcqRel) {
                    continue;
                }
                return;
            }
            // The writes are answered once the connection is let go (and a failed transaction
            // rolled back): a caller that has its answer finds the connection free for its next
            // read, and the file's write lock free for another process.
            let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                commit_batch(&lock(conn), clock, &mut batch, &self.commits)
            }));
            match committed {
                Ok(committed) => {
                    for job in batch {
                        job.answer(committed.clone());
                    }
                }
                // A panic inside the commit (a clock that panics) fails this batch alone. Taking
                // the connection rolls the transaction back now: left open, it would hold the
                // file's write lock against every other process until the next write. Then the
                // writes are dropped unanswered, which answers each that nothing was applied.
                // The writer goes on; ended by the panic, it would leave `running` set, and no
                // write would start another.
                Err(_) => {
                    drop(lock(conn));
                    drop(batch);
                }
            }
        }
    }

    /// Waits up to the linger for a write to be queued, yielding between looks; true when one
    /// was.
    fn linger(&self) -> bool {
        if self.linger.is_zero() {
            return false;
        }
        let until = Instant::now() + self.linger;
        loop {
            std::thread::yield_now();
            let queued = !self
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty();
            if queued {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
        }
    }
}

/// A writer handed to the blocking pool. A runtime shutting down drops the tasks handed to its
/// pool that have not started, and those handed to it since: a writer dropped before its run
/// returned (never started, or unwound) is run on, on a thread of its own. Left so, it would
/// leave `running` set, and no later write, from this runtime or another sharing the store,
/// would start a writer: each would wait forever.
struct Writer {
    conn: Arc<Mutex<Connection>>,
    writes: Arc<Writes>,
    clock: Arc<dyn Clock>,
    /// Set once the run has returned, or been handed on.
    done: bool,
}

impl Writer {
    fn run(mut self) {
        self.writes.combine(&self.conn, &*self.clock);
        self.done = true;
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let (conn, writes, clock) = (self.conn.clone(), self.writes.clone(), self.clock.clone());
        let spawned = std::thread::Builder::new()
            .name("toolkey-sqlite-writer".into())
            .spawn(move || writes.combine(&conn, &*clock));
        if spawned.is_err() {
            // No thread to be had: the writes still run, on this one.
            self.writes.combine(&self.conn, &*self.clock);
        }
    }
}

/// Runs `batch` in one transaction and says how the commit ended, for the writer to answer
/// each write with once it has let the connection go. Whatever failed, no transaction is left
/// open. A commit that keeps a change is counted in `commits` before any write is answered, so
/// a caller that has its answer also sees the count.
fn commit_batch(
    conn: &Connection,
    clock: &dyn Clock,
    batch: &mut [Box<dyn Pending>],
    commits: &AtomicU64,
) -> Result<(), String> {
    let ended = apply_batch(conn, clock, batch).and_then(|applied| {
        // A batch that changed nothing has nothing to flush.
        conn.execute_batch(if applied == 0 { "ROLLBACK" } else { "COMMIT" })?;
        Ok(applied)
    });
    roll_back_open(conn);
    let applied = ended.map_err(|e| format!("sqlite: {e}"))?;
    if applied > 0 {
        commits.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Begins a transaction and applies each write of `batch` in it, a failed write's changes
/// rolled back alone; how many applied. An error leaves the transaction open.
fn apply_batch(
    conn: &Connection,
    clock: &dyn Clock,
    batch: &mut [Box<dyn Pending>],
) -> rusqlite::Result<usize> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    // One write alone needs no savepoint: when it fails, the transaction is rolled back.
    let alone = batch.len() == 1;
    let step = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    let mut applied = 0;
    for job in batch {
        if !alone {
            step("SAVEPOINT toolkey_write")?;
        }
        let now = to_millis(clock.now());
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.apply(conn, now)))
            .unwrap_or(false);
        if !alone {
            if !ok {
                step("ROLLBACK TO toolkey_write")?;
            }
            step("RELEASE toolkey_write")?;
        }
        applied += usize::from(ok);
    }
    Ok(applied)
}

/// A write waiting in [`Writes`]' queue.
trait Pending: Send {
    /// Applies the write in the batch's transaction at `now` (ms); false when it failed (its
    /// changes are then rolled back).
    fn apply(&mut self, conn: &Connection, now: i64) -> bool;
    /// Answers the caller: its write's own answer if the batch committed (or if the write had
    /// failed), the commit's error otherwise.
    fn answer(self: Box<Self>, committed: Result<(), String>);
}

/// One caller's write: its closure, then its answer until the commit.
struct Job<T, F> {
    f: Option<F>,
    answer: Option<Result<T, StoreError>>,
    reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
{
    /// The write `f`, to queue, and where its answer will arrive.
    fn queued(
        f: F,
    ) -> (
        Box<dyn Pending>,
        tokio::sync::oneshot::Receiver<Result<T, StoreError>>,
    ) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            f: Some(f),
            answer: None,
            reply,
        };
        (Box::new(job), answer)
    }
}

impl<T, F> Pending for Job<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
{
    fn apply(&mut self, conn: &Connection, now: i64) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        let answer = f(conn, now);
        let ok = answer.is_ok();
        self.answer = Some(answer);
        ok
    }

    fn answer(self: Box<Self>, committed: Result<(), String>) {
        let answer = match (self.answer, committed) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)), Err(why)) => Err(StoreError::Unavailable(why)),
            (None, Err(why)) => Err(StoreError::Unavailable(why)),
            // The write panicked: nothing of it was kept.
            (None, Ok(())) => Err(writer_stopped()),
        };
        let _ = self.reply.send(answer);
    }
}

/// The longest a caller alone in waiting for a write looks for its answer (unless
/// [`SqliteStore::with_answer_spin`] says otherwise).
const ANSWER_SPIN: Duration = Duration::from_millis(1);

/// One lone wait in this many looks for its answer for the longest, whatever answers have
/// taken (see [`Writes::spin`]): on a disk slower than the looks, a sixteenth of the longest
/// look in CPU per write.
const PROBE_EVERY: u64 = 16;

/// How long a caller alone in waiting for its write looks for the answer, yielding its task
/// between looks, before it waits to be woken; `typical` is how long such answers have taken
/// lately (zero: none seen yet), `most` the longest it may look.
///
/// An answer taken while looking spares the wake of a parked thread, which on a virtual
/// machine whose cores went idle costs more than a commit on a fast disk (a first run on SQLite
/// took twice its time, whole rounds at a time, when the commits grew past a fixed 200 µs of
/// looking). So a caller looks for twice the typical time, at most `most`, and not at all when
/// answers take longer than that: on a disk whose flush takes milliseconds the wake is a small
/// part of the wait, and the looks would spend a CPU for nothing. Callers that wait together
/// never look: their looks would take the CPU the writer needs, and the wake they save is
/// shared by a commit's writes anyway.
fn spin_for(typical: Duration, most: Duration) -> Duration {
    if typical.is_zero() {
        most
    } else if typical > most {
        Duration::ZERO
    } else {
        (typical * 2).min(most)
    }
}

/// Counts a caller among those waiting for a write's answer while it lives.
struct Waiting<'a> {
    waiting: &'a AtomicUsize,
    /// No other caller was waiting when this one began to.
    alone: bool,
}

impl<'a> Waiting<'a> {
    fn start(waiting: &'a AtomicUsize) -> Waiting<'a> {
        let alone = waiting.fetch_add(1, Ordering::AcqRel) == 0;
        Waiting { waiting, alone }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The answer that arrives on `answer`, the caller counted among those waiting meanwhile.
/// A caller that no other waits beside looks for it as [`Writes::spin`] says, then awaits it, and
/// the time it took joins the typical time of `writes`' answers.
async fn answered<T>(
    mut answer: tokio::sync::oneshot::Receiver<Result<T, StoreError>>,
    writes: &Writes,
) -> Result<T, StoreError> {
    use tokio::sync::oneshot::error::TryRecvError;
    let waiting = Waiting::start(&writes.waiting);
    let start = Instant::now();
    let spin = if waiting.alone {
        writes.spin()
    } else {
        Duration::ZERO
    };
    let until = start + spin;
    let answered = loop {
        match answer.try_recv() {
            Ok(answer) => break answer,
            Err(TryRecvError::Closed) => return Err(writer_stopped()),
            Err(TryRecvError::Empty) if Instant::now() < until => {
                // The thread's CPU too: a writer the scheduler put on this CPU would otherwise
                // wait for its next tick (a millisecond) to run the write.
                std::thread::yield_now();
                tokio::task::yield_now().await
            }
            Err(TryRecvError::Empty) => match answer.await {
                Ok(answer) => break answer,
                Err(_) => return Err(writer_stopped()),
            },
        }
    };
    if waiting.alone {
        writes.answer_took(start.elapsed());
    }
    answered
}

fn writer_stopped() -> StoreError {
    StoreError::Unavailable("sqlite: the write failed inside the store; nothing was applied".into())
}

/// The connection, even after a panic while it was held; a transaction the panic left open is
/// rolled back so the next call starts clean.
fn lock(conn: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    let conn = conn.lock().unwrap_or_else(|e| e.into_inner());
    roll_back_open(&conn);
    conn
}

/// Rolls back the transaction `conn` has open, if any: left open, it would hold the file's
/// write lock against every other process.
fn roll_back_open(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
}

/// The connection, if no one holds it. A connection whose holder panicked is taken as [`lock`]
/// takes it: the mark stays on the mutex for good, and left alone it would send every later read
/// to the pool. The caller must not trust a transaction it finds open ([`free_read`] does not).
fn try_lock(conn: &Mutex<Connection>) -> Option<std::sync::MutexGuard<'_, Connection>> {
    match conn.try_lock() {
        Ok(conn) => Some(conn),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Creates the schema in a new file, accepts the current one, refuses any other. Runs under the
/// write lock, so processes opening a new file together create it once.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
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
    tx.commit().map_err(unavailable)
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

/// The failures counted for `key` in a window still open at `now` (ms).
fn failures_at(conn: &Connection, key: &RecordKey, now: i64) -> Result<u64, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT failures FROM toolkey_failures
             WHERE tenant = ?1 AND key = ?2 AND ends_at_ms > ?3",
        )
        .map_err(unavailable)?;
    let mut rows = stmt
        .query(params![key.tenant, key.key, now])
        .map_err(unavailable)?;
    match rows.next().map_err(unavailable)? {
        Some(row) => Ok(row.get::<_, i64>(0).map_err(unavailable)?.max(0) as u64),
        None => Ok(0),
    }
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

#[async_trait]
impl Reservations for SqliteStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        // A replay, IN_PROGRESS or CONFLICT answer writes nothing: a live record in the way is
        // answered from a plain read (WAL readers never wait for the write lock), on this thread
        // when the inline connection is free, on the pool otherwise. Only a free or expired key
        // goes to the writer's queue, and is read again under the lock: of two processes
        // reserving one key, the second reads the first's committed row.
        let read_first = match self.read_inline(key) {
            Inline::Live(existing) => return existing.map(Reservation::Existing),
            Inline::Free => false,
            Inline::Unread => true,
        };
        if read_first {
            let key = key.clone();
            let live = self
                .read(move |conn, now| match read_row(conn, &key)? {
                    Some(stored) if !stored.absent(now) => stored.to_record(&key, now).map(Some),
                    _ => Ok(None),
                })
                .await?;
            if let Some(existing) = live {
                return Ok(Reservation::Existing(existing));
            }
        }
        let (key, fp, token) = (key.clone(), fingerprint.to_hex(), token.clone());
        let tool = tool.to_owned();
        self.write(move |tx: &Connection, now: i64| {
            let lease_until = now.saturating_add(span_ms(lease));
            let inserted = fenced(
                tx,
                sql!(
                    "INSERT INTO toolkey_records ({COLUMNS}, tenant, key)
                     VALUES ('{IN_PROGRESS}', ?3, ?4, ?5, ?6, NULL, NULL, NULL, ?7, ?1, ?2)
                     ON CONFLICT (tenant, key) DO UPDATE SET
                         state = excluded.state, token = excluded.token, tool = excluded.tool,
                         fingerprint = excluded.fingerprint, since_ms = excluded.since_ms,
                         lease_until_ms = excluded.lease_until_ms, outcome = NULL,
                         completed_at_ms = NULL, expires_at_ms = NULL
                     WHERE (state = '{COMPLETED}' AND expires_at_ms <= ?5) OR state = '{NOT_DONE}'"
                ),
                params![
                    key.tenant,
                    key.key,
                    token.as_str(),
                    fp,
                    now,
                    lease_until,
                    tool
                ],
            )?;
            if inserted {
                let failures = failures_at(tx, &key, now)?;
                return Ok(Reservation::Reserved { token, failures });
            }
            let stored = read_row(tx, &key)?.ok_or_else(|| {
                StoreError::Unavailable("sqlite: a conflicting row vanished".into())
            })?;
            Ok(Reservation::Existing(stored.to_record(&key, now)?))
        })
        .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let (key, token, text) = (key.clone(), token.clone(), outcome.to_stored());
        self.write(move |tx, now| {
            let expires_at = now.saturating_add(span_ms(retain));
            let written = fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records
                     SET state = '{COMPLETED}', outcome = ?4, completed_at_ms = ?5, expires_at_ms = ?6
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str(), text, now, expires_at],
            )?;
            if written {
                return Ok(true);
            }
            // Sent again after a lost answer: the first write landed.
            tx.prepare_cached(sql!(
                "SELECT 1 FROM toolkey_records
                 WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state = '{COMPLETED}'
                   AND outcome = ?4"
            ))
            .and_then(|mut stmt| stmt.exists(params![key.tenant, key.key, token.as_str(), text]))
            .map_err(unavailable)
        })
        .await
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, _| {
            fenced(
                tx,
                sql!(
                    "DELETE FROM toolkey_records
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str()],
            )
        })
        .await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, now| {
            fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{IN_PROGRESS}', lease_until_ms = ?4
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![
                    key.tenant,
                    key.key,
                    token.as_str(),
                    now.saturating_add(span_ms(lease))
                ],
            )
        })
        .await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        let (key, token) = (key.clone(), token.clone());
        self.write(move |tx, _| {
            fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{UNKNOWN}'
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND state IN ({HELD})"
                ),
                params![key.tenant, key.key, token.as_str()],
            )
        })
        .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let (key, stale) = (key.clone(), stale.clone());
        self.write(move |tx, now| {
            let token = Token::generate();
            let won = fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records
                     SET state = '{IN_PROGRESS}', token = ?4, since_ms = ?5, lease_until_ms = ?6
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3
                       AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until_ms <= ?5))"
                ),
                params![
                    key.tenant,
                    key.key,
                    stale.as_str(),
                    token.as_str(),
                    now,
                    now.saturating_add(span_ms(lease))
                ],
            )?;
            Ok(won.then_some(token))
        })
        .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.read_inline(key) {
            Inline::Live(live) => return live.map(Some),
            Inline::Free => return Ok(None),
            Inline::Unread => {}
        }
        let key = key.clone();
        self.read(move |conn, now| match read_row(conn, &key)? {
            Some(stored) if !stored.absent(now) => stored.to_record(&key, now).map(Some),
            _ => Ok(None),
        })
        .await
    }
}

#[async_trait]
impl OperatorCommands for SqliteStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |tx, now| {
            let mut stmt = tx
                .prepare_cached(sql!(
                    "DELETE FROM toolkey_records WHERE (tenant, key) IN (
                         SELECT tenant, key FROM toolkey_records
                         WHERE state = '{COMPLETED}' AND expires_at_ms <= ?1 LIMIT ?2)"
                ))
                .map_err(unavailable)?;
            Ok(stmt.execute(params![now, limit]).map_err(unavailable)? as u64)
        })
        .await
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        Ok(self.clock.now())
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = cursor.map(Cursor::key).transpose()?;
        let filter = filter.clone();
        let limit = limit.max(1);
        self.read(move |conn, now| {
            let mut stmt = conn.prepare_cached(LIST).map_err(unavailable)?;
            let since_before = filter
                .older_than
                .map(|age| now.saturating_sub(super::millis(age)));
            let mut rows = stmt
                .query(params![
                    after.as_ref().map(|a| &a.tenant),
                    after.as_ref().map(|a| &a.key),
                    filter.tenant,
                    filter.tool,
                    filter.key,
                    since_before,
                    filter.state.map(EntryState::as_str),
                    now,
                    i64::try_from(limit).unwrap_or(i64::MAX),
                ])
                .map_err(unavailable)?;
            let mut page = Page::default();
            let mut seen = 0;
            let mut last = None;
            while let Some(row) = rows.next().map_err(unavailable)? {
                let key = RecordKey::new(
                    row.get::<_, String>(0).map_err(unavailable)?,
                    row.get::<_, String>(1).map_err(unavailable)?,
                );
                let read = stored_at(row, &key, 2).and_then(|stored| stored.to_entry(&key, now));
                page.take(read.map(|e| e.filter(|e| filter.admits(e, from_millis(now)))))?;
                seen += 1;
                last = Some(key);
            }
            page.next = last.filter(|_| seen == limit).map(|k| Cursor::after(&k));
            Ok(page)
        })
        .await
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let (key, seen, resolution) = (key.clone(), seen.clone(), resolution.clone());
        self.write(move |tx, now| match resolution {
            Resolution::Done { outcome, retain } => fenced(
                tx,
                sql!(
                    "UPDATE toolkey_records SET state = '{COMPLETED}', outcome = ?5,
                         completed_at_ms = ?4, expires_at_ms = ?6
                     WHERE {RESOLVABLE}"
                ),
                params![
                    key.tenant,
                    key.key,
                    seen.as_str(),
                    now,
                    outcome.to_stored(),
                    now.saturating_add(span_ms(retain))
                ],
            ),
            Resolution::NotDone => fenced(
                tx,
                sql!("UPDATE toolkey_records SET state = '{NOT_DONE}' WHERE {RESOLVABLE}"),
                params![key.tenant, key.key, seen.as_str(), now],
            ),
        })
        .await
    }
}

#[async_trait]
impl FailureCounters for SqliteStore {
    /// One transaction under the write lock: a few ended counters of other keys are swept, then
    /// this key's counter is inserted, restarted (its window ended) or added to, and read back.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let key = key.clone();
        self.write(move |tx, now| {
            tx.prepare_cached(
                "DELETE FROM toolkey_failures WHERE (tenant, key) IN (
                     SELECT tenant, key FROM toolkey_failures WHERE ends_at_ms <= ?1 LIMIT ?2)",
            )
            .and_then(|mut stmt| stmt.execute(params![now, FAILURE_SWEEP]))
            .map_err(unavailable)?;
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO toolkey_failures (tenant, key, failures, ends_at_ms)
                     VALUES (?1, ?2, 1, ?3 + ?4)
                     ON CONFLICT (tenant, key) DO UPDATE SET
                         failures = CASE WHEN ends_at_ms <= ?3 THEN 1 ELSE failures + 1 END,
                         ends_at_ms = CASE WHEN ends_at_ms <= ?3 THEN excluded.ends_at_ms
                                           ELSE ends_at_ms END
                     RETURNING failures",
                )
                .map_err(unavailable)?;
            let count: i64 = stmt
                .query_row(params![key.tenant, key.key, now, span_ms(window)], |row| {
                    row.get(0)
                })
                .map_err(unavailable)?;
            Ok(count.max(0) as u64)
        })
        .await
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        let key = key.clone();
        self.read(move |conn, now| failures_at(conn, &key, now))
            .await
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |tx, _| {
            tx.prepare_cached("DELETE FROM toolkey_failures WHERE tenant = ?1 AND key = ?2")
                .and_then(|mut stmt| stmt.execute(params![key.tenant, key.key]))
                .map(drop)
                .map_err(unavailable)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inserts a bare record named `key` (a write as the store's own are).
    fn insert(conn: &Connection, key: &str, now: i64) -> Result<(), StoreError> {
        conn.execute(
            &format!(
                "INSERT INTO toolkey_records ({COLUMNS}, tenant, key)
                 VALUES ('{IN_PROGRESS}', 't', 'fp', ?1, ?1, NULL, NULL, NULL, 'tool', 'acme', ?2)"
            ),
            params![now, key],
        )
        .map_err(unavailable)?;
        Ok(())
    }

    fn keys(store: &SqliteStore) -> Vec<String> {
        let conn = lock(&store.conn);
        let mut stmt = conn
            .prepare("SELECT key FROM toolkey_records ORDER BY key")
            .unwrap();
        let rows = stmt.query_map([], |row| row.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// The token under which `key`, which must be free, is reserved.
    async fn reserved(
        store: &SqliteStore,
        key: &RecordKey,
        fp: &Fingerprint,
        lease: Duration,
    ) -> Token {
        match store
            .reserve(key, "tool", fp, &Token::generate(), lease)
            .await
        {
            Ok(Reservation::Reserved { token, .. }) => token,
            other => panic!("{key:?} was not free: {other:?}"),
        }
    }

    /// A replay is read on the caller's thread when the inline connection is free, and by the
    /// blocking pool when it is not, or when the database is locked so that the read would
    /// wait: the answer is the same record each way, and a write another connection holds the
    /// lock for is never read before it commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // The held guard stands for another caller using the inline connection meanwhile.
    #[allow(clippy::await_holding_lock)]
    async fn a_replay_read_inline_or_on_the_pool_answers_alike() {
        let dir = std::env::temp_dir().join(format!("toolkey-inline-{}", Token::generate()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inline.db");
        let store = SqliteStore::open(&path).unwrap();
        let (key, fp) = (
            RecordKey::new("acme", "k"),
            Fingerprint::of(&serde_json::json!(1)).unwrap(),
        );
        let lease = Duration::from_secs(30);
        let token = reserved(&store, &key, &fp, lease).await;
        let outcome = Outcome::Ok(serde_json::json!({"n": 1}));
        let retain = Duration::from_secs(60);
        assert!(store
            .complete(&key, &token, &outcome, retain)
            .await
            .unwrap());
        let replayed = |answer: Reservation| match answer {
            Reservation::Existing(Record::Completed { outcome, .. }) => outcome,
            other => panic!("not a replay: {other:?}"),
        };
        let token = Token::generate();
        let reserve = || store.reserve(&key, "tool", &fp, &token, lease);
        // Inline, on the writer's connection.
        assert!(matches!(store.read_inline(&key), Inline::Live(_)));
        assert_eq!(replayed(reserve().await.unwrap()), outcome);
        // The writer's connection in use (a commit being flushed): the inline connection reads.
        {
            let _writing = store.conn.lock().unwrap();
            assert!(matches!(store.read_inline(&key), Inline::Live(_)));
            assert_eq!(replayed(reserve().await.unwrap()), outcome);
        }
        // Both in use: the blocking pool reads.
        {
            let _writing = store.conn.lock().unwrap();
            let _held = store.inline.lock().unwrap();
            assert!(matches!(store.read_inline(&key), Inline::Unread));
            assert_eq!(replayed(reserve().await.unwrap()), outcome);
            assert!(matches!(
                store.get(&key).await.unwrap(),
                Some(Record::Completed { .. })
            ));
        }
        // Another process holds the write lock with a change not yet committed: a WAL reader
        // sees the last commit, inline or not, and never the uncommitted change.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        other
            .execute(
                "UPDATE toolkey_records SET outcome = '{not json' WHERE key = 'k'",
                [],
            )
            .unwrap();
        assert_eq!(replayed(reserve().await.unwrap()), outcome);
        other.execute_batch("ROLLBACK").unwrap();
        // An absent key is not read inline as anything: it goes to the writer's queue.
        let fresh = RecordKey::new("acme", "fresh");
        assert!(matches!(store.read_inline(&fresh), Inline::Free));
        assert!(matches!(
            store
                .reserve(&fresh, "tool", &fp, &Token::generate(), lease)
                .await
                .unwrap(),
            Reservation::Reserved { .. }
        ));
        drop((store, other));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Writes queued while the connection is busy share one commit; in a shared commit, a write
    /// that fails or panics is rolled back alone, and every other is kept and answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_share_a_commit_and_fail_alone() {
        let dir = tempfile_dir();
        let store = Arc::new(SqliteStore::open(dir.join("group.db")).unwrap());
        // Hold the connection, as a long read would, while ten writes queue up.
        let held = store.conn.clone();
        let guard = held.lock().unwrap();
        let mut writes = Vec::new();
        for i in 0..10 {
            let store = store.clone();
            writes.push(Box::pin(async move {
                store
                    .write(move |tx, now| match i {
                        3 => {
                            insert(tx, "k3", now)?;
                            Err(StoreError::Unavailable("refused".into()))
                        }
                        6 => {
                            insert(tx, "k6", now)?;
                            panic!("a write that panics")
                        }
                        _ => insert(tx, &format!("k{i}"), now).map(|()| i),
                    })
                    .await
            }));
        }
        // Polled once, each write joins the queue (the first starts the writer, which takes
        // what is queued, then waits for the connection).
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        for write in &mut writes {
            assert!(std::future::Future::poll(write.as_mut(), &mut cx).is_pending());
        }
        drop(guard);
        let answers = futures_util::future::join_all(writes).await;
        for (i, answer) in answers.iter().enumerate() {
            match i {
                3 => assert!(matches!(answer, Err(StoreError::Unavailable(m)) if m == "refused")),
                6 => assert!(
                    matches!(answer, Err(StoreError::Unavailable(_))),
                    "{answer:?}"
                ),
                _ => assert_eq!(answer.as_ref().unwrap(), &i),
            }
        }
        assert_eq!(
            keys(&store),
            ["k0", "k1", "k2", "k4", "k5", "k7", "k8", "k9"],
            "the failed and the panicked writes are rolled back alone"
        );
        let commits = store.writes.commits.load(Ordering::Relaxed);
        assert!(
            (1..=2).contains(&commits),
            "ten writes queued behind one lock took {commits} commits"
        );
        // The store goes on: a write after the batch commits on its own.
        store
            .write(|tx, now| insert(tx, "after", now))
            .await
            .unwrap();
        assert!(keys(&store).contains(&"after".to_string()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Only a caller that no other waits beside looks for its answer; callers that wait together
    /// are woken by their commit. A write's caller dropped while it looks (or waits) is counted
    /// out, so the next caller alone looks again.
    #[tokio::test]
    async fn only_a_caller_waiting_alone_looks_for_its_answer() {
        let waiting = AtomicUsize::new(0);
        let (first, second) = (Waiting::start(&waiting), Waiting::start(&waiting));
        assert!(first.alone && !second.alone);
        drop((first, second));
        assert!(Waiting::start(&waiting).alone);

        let dir = tempfile_dir();
        let store = SqliteStore::open(dir.join("alone.db")).unwrap();
        // Dropped at once, while its write is queued or being looked for.
        let write = store.write(|tx, now| insert(tx, "dropped", now));
        let dropped = tokio::time::timeout(Duration::from_nanos(1), write).await;
        assert_eq!(store.writes.waiting.load(Ordering::Acquire), 0);
        // Many at once: each answered once its commit is durable, none counted after.
        let writes = (0..8).map(|n| {
            let store = &store;
            async move {
                store
                    .write(move |tx, now| insert(tx, &format!("k{n}"), now))
                    .await
            }
        });
        for answer in futures_util::future::join_all(writes).await {
            answer.unwrap();
        }
        assert_eq!(store.writes.waiting.load(Ordering::Acquire), 0);
        let held = keys(&store);
        assert_eq!(held.iter().filter(|k| k.starts_with('k')).count(), 8);
        // A write answered before its caller gave up was applied.
        if let Ok(answer) = dropped {
            answer.unwrap();
            assert!(held.contains(&"dropped".to_string()));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A lone caller looks for its answer for twice the typical time, at most the longest
    /// look, and not at all while answers take longer than that; the typical time follows the
    /// answers, and one long wait counts as twice the longest look at most.
    #[test]
    fn a_lone_caller_looks_as_long_as_answers_have_taken() {
        let (us, ms) = (Duration::from_micros, Duration::from_millis);
        assert_eq!(spin_for(Duration::ZERO, ms(1)), ms(1), "nothing seen yet");
        assert_eq!(spin_for(us(200), ms(1)), us(400));
        assert_eq!(spin_for(us(600), ms(1)), ms(1));
        assert_eq!(spin_for(us(1_001), ms(1)), Duration::ZERO, "a slow disk");
        assert_eq!(spin_for(us(200), Duration::ZERO), Duration::ZERO);
        assert_eq!(spin_for(Duration::ZERO, Duration::ZERO), Duration::ZERO);

        let writes = Writes::default();
        assert_eq!(writes.typical_answer(), Duration::ZERO);
        writes.answer_took(us(200));
        assert_eq!(writes.typical_answer(), us(200));
        // A checkpoint's 10 ms counts as 2 ms: the looks go on.
        writes.answer_took(ms(10));
        assert_eq!(writes.typical_answer(), us(650));
        assert_eq!(spin_for(writes.typical_answer(), writes.answer_spin), ms(1));
        // A disk that takes 5 ms for every commit: the looks stop, then come back with it.
        for _ in 0..20 {
            writes.answer_took(ms(5));
        }
        assert!(writes.typical_answer() > ms(1));
        assert_eq!(
            spin_for(writes.typical_answer(), writes.answer_spin),
            Duration::ZERO
        );
        for _ in 0..20 {
            writes.answer_took(us(150));
        }
        assert!(writes.typical_answer() < us(200));
        assert!(spin_for(writes.typical_answer(), writes.answer_spin) > Duration::ZERO);
    }

    /// Looks stopped by slow answers come back once answers are fast again, even where a wake
    /// costs about as much as the longest look, so that every wait that parks measures more
    /// than it: one wait in sixteen looks whatever answers have taken.
    #[test]
    fn looks_stopped_by_slow_answers_come_back() {
        let (us, ms) = (Duration::from_micros, Duration::from_millis);
        let writes = Writes::default();
        // A lone caller's wait for a commit taking `commit`, a wake costing `wake`: found
        // while looking, or parked and woken.
        let wait = |commit: Duration, wake: Duration| {
            let spin = writes.spin();
            writes.answer_took(if commit <= spin {
                commit
            } else {
                commit + wake
            });
            spin
        };
        // A burst of slow commits: the looks stop, but for one wait in sixteen.
        let looked = (0..64)
            .filter(|_| wait(ms(5), us(950)) > Duration::ZERO)
            .count();
        assert_eq!(looked, 4);
        assert!(writes.typical_answer() > ms(1));
        // Commits fast again, a wake costing 950 µs: within 32 waits the looks are back for
        // every wait, and the typical time is the commit's.
        for _ in 0..32 {
            wait(us(150), us(950));
        }
        assert!((0..32).all(|_| wait(us(150), us(950)) > Duration::ZERO));
        assert!(writes.typical_answer() < us(200));
    }

    /// Setting the longest look keeps the writer's linger, and setting the linger keeps the
    /// longest look; a lone caller's writes teach the store how long answers take.
    #[tokio::test]
    async fn the_answer_spin_and_the_linger_are_set_apart() {
        let store = SqliteStore::open_in_memory()
            .unwrap()
            .with_writer_linger(Duration::from_micros(70))
            .with_answer_spin(Duration::ZERO);
        assert_eq!(store.writes.linger, Duration::from_micros(70));
        assert_eq!(store.writes.answer_spin, Duration::ZERO);
        let store = store
            .with_answer_spin(Duration::from_secs(5))
            .with_writer_linger(Duration::ZERO);
        assert_eq!(store.writes.answer_spin, MAX_LINGER, "taken as one second");
        assert_eq!(store.writes.linger, Duration::ZERO);
        for n in 0..3 {
            store
                .write(move |tx, now| insert(tx, &format!("k{n}"), now))
                .await
                .unwrap();
        }
        assert!(store.writes.typical_answer() > Duration::ZERO);
        assert_eq!(keys(&store).len(), 3);
    }

    /// A write not yet committed on the writer's connection (a transaction open, as a panic
    /// mid-commit leaves it) is never read on the caller's thread: a replay answered from it
    /// would stand on a write that may be rolled back. The read is left to the pool, which
    /// reads what was committed.
    #[tokio::test]
    async fn an_uncommitted_write_on_the_writers_connection_is_not_read() {
        let dir = tempfile_dir();
        let store = SqliteStore::open(dir.join("uncommitted.db")).unwrap();
        let key = RecordKey::new("acme", "k");
        {
            let conn = store.conn.lock().unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            insert(&conn, "k", 0).unwrap();
        }
        assert!(matches!(store.read_inline(&key), Inline::Unread));
        {
            let conn = store.conn.lock().unwrap();
            conn.execute_batch("ROLLBACK").unwrap();
        }
        assert!(matches!(store.read_inline(&key), Inline::Free));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A read on the writer's connection, made on the caller's thread, leaves the connection's
    /// busy timeout as it found it: the next write still waits for another process's lock
    /// rather than failing at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // The held guard keeps the read on the writer's connection.
    #[allow(clippy::await_holding_lock)]
    async fn a_read_on_the_writers_connection_keeps_its_busy_timeout() {
        let dir = tempfile_dir();
        let path = dir.join("timeout.db");
        let store = SqliteStore::open(&path).unwrap();
        store.write(|tx, now| insert(tx, "k", now)).await.unwrap();
        {
            let _inline = store.inline.lock().unwrap();
            for key in ["k", "absent"] {
                let read = store.read_inline(&RecordKey::new("acme", key));
                assert!(
                    !matches!(read, Inline::Unread),
                    "read on the writer's connection"
                );
            }
        }
        // Another process holds the write lock for 300 ms.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").unwrap();
        });
        store
            .write(|tx, now| insert(tx, "after", now))
            .await
            .expect("the write waited for the other process's lock");
        holder.join().unwrap();
        assert!(keys(&store).contains(&"after".to_string()));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A writer whose queue runs dry takes on the writes that arrive within its linger, one
    /// commit each, without another writer being started; past the linger it ends, and the next
    /// write starts a writer again.
    #[tokio::test]
    async fn a_lingering_writer_takes_the_next_writes_then_ends() {
        let dir = tempfile_dir();
        let linger = Duration::from_millis(300);
        let store = SqliteStore::open(dir.join("linger.db"))
            .unwrap()
            .with_writer_linger(linger);
        // Ten first runs (reserve, then complete), each write a pause after the answer before.
        let pause = Duration::from_millis(5);
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let lease = Duration::from_secs(30);
        let outcome = Outcome::Ok(serde_json::json!(7));
        for n in 0..10 {
            let key = RecordKey::new("acme", format!("k{n}"));
            tokio::time::sleep(pause).await;
            let token = reserved(&store, &key, &fp, lease).await;
            tokio::time::sleep(pause).await;
            assert!(store.complete(&key, &token, &outcome, lease).await.unwrap());
        }
        let writes = &store.writes;
        assert_eq!(writes.commits.load(Ordering::Relaxed), 20);
        assert_eq!(
            writes.writers.load(Ordering::Relaxed),
            1,
            "twenty writes, each {pause:?} after the one before, within its linger"
        );
        tokio::time::sleep(linger * 2).await;
        assert!(!writes.running.load(Ordering::Acquire), "the writer ended");
        store
            .write(|tx, now| insert(tx, "after", now))
            .await
            .unwrap();
        assert_eq!(writes.writers.load(Ordering::Relaxed), 2);
        assert_eq!(writes.commits.load(Ordering::Relaxed), 21);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A reserve read on the pool (the writer's and the inline connections busy) is answered
    /// once its own write commits, not once the writer ends: a writer goes on while writes keep
    /// coming, and lingers after the last.
    #[tokio::test]
    // The held guards stand for another caller using the inline connection meanwhile, and a
    // commit on the writer's connection while the reserve looks for a connection to read on.
    #[allow(clippy::await_holding_lock)]
    async fn a_reserve_read_on_the_pool_is_answered_when_its_write_commits() {
        let dir = tempfile_dir();
        let linger = Duration::from_millis(900);
        let store = SqliteStore::open(dir.join("answered.db"))
            .unwrap()
            .with_writer_linger(linger);
        let key = RecordKey::new("acme", "k");
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let held = store.inline.lock().unwrap();
        let committing = store.conn.lock().unwrap();
        assert!(matches!(store.read_inline(&key), Inline::Unread));
        let token = Token::generate();
        let answer = {
            let mut reserve = std::pin::pin!(store.reserve(&key, "tool", &fp, &token, linger));
            // Its first poll finds no connection free and hands its read to the pool.
            assert!(futures_util::poll!(&mut reserve).is_pending());
            drop(committing);
            tokio::time::timeout(linger / 3, reserve)
                .await
                .expect("the reserve waited for its writer to end")
        };
        assert!(matches!(answer, Ok(Reservation::Reserved { .. })));
        drop(held);
        assert_eq!(store.writes.commits.load(Ordering::Relaxed), 1);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A writer the blocking pool drops unstarted (its runtime shutting down) still runs: the
    /// write that started it is kept, and a write from another runtime sharing the store is
    /// answered, not left waiting for a writer that never comes.
    #[test]
    fn a_writer_its_runtime_drops_unstarted_still_runs() {
        let dir = tempfile_dir();
        let store = SqliteStore::open(dir.join("dropped.db")).unwrap();
        let ending = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = ending.handle().clone();
        ending.shutdown_background();
        // A write polled once on the runtime that is shutting down: it joins the queue, and the
        // pool drops the writer handed to it.
        {
            let _entered = handle.enter();
            let first = store.write(|tx, now| insert(tx, "first", now));
            assert!(futures_util::FutureExt::now_or_never(first).is_none());
        }
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let wrote = other.block_on(async {
            let second = store.write(|tx, now| insert(tx, "second", now));
            tokio::time::timeout(Duration::from_secs(5), second).await
        });
        assert!(matches!(wrote, Ok(Ok(()))), "{wrote:?}");
        assert_eq!(keys(&store), ["first", "second"]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A linger too long to add to the time (`Duration::MAX`) is taken as the longest the store
    /// allows: the writer answers each write, and the next write is answered too.
    #[tokio::test]
    async fn a_linger_too_long_to_add_to_the_time_is_cut_to_the_longest() {
        let dir = tempfile_dir();
        let store = SqliteStore::open(dir.join("long.db"))
            .unwrap()
            .with_writer_linger(Duration::MAX);
        assert_eq!(store.writes.linger, MAX_LINGER);
        for key in ["a", "b"] {
            let wrote = tokio::time::timeout(
                Duration::from_secs(5),
                store.write(move |tx, now| insert(tx, key, now)),
            )
            .await;
            assert!(matches!(wrote, Ok(Ok(()))), "{key}: {wrote:?}");
        }
        assert_eq!(keys(&store), ["a", "b"]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The system clock, which panics once when told to.
    struct PanicOnce(AtomicBool);

    impl Clock for PanicOnce {
        fn now(&self) -> SystemTime {
            if self.0.swap(false, Ordering::AcqRel) {
                panic!("a clock that panics");
            }
            SystemTime::now()
        }
    }

    /// A clock that panics once, as a commit reads it, fails that commit's write alone: nothing
    /// of it is kept, and the writer goes on, so the next write is answered and kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_inside_a_commit_fails_its_writes_and_not_the_writer() {
        let dir = tempfile_dir();
        let clock = Arc::new(PanicOnce(AtomicBool::new(false)));
        let store = SqliteStore::open(dir.join("panic.db"))
            .unwrap()
            .with_clock(clock.clone());
        clock.0.store(true, Ordering::Release);
        let failed = store.write(|tx, now| insert(tx, "lost", now)).await;
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        // Another process can take the write lock as soon as the write is answered: the failed
        // commit's transaction was rolled back first, not left open until the next write.
        assert_write_lock_free(&dir.join("panic.db"));
        let wrote = tokio::time::timeout(
            Duration::from_secs(5),
            store.write(|tx, now| insert(tx, "kept", now)),
        )
        .await;
        assert!(matches!(wrote, Ok(Ok(()))), "{wrote:?}");
        assert_eq!(keys(&store), ["kept"]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A batch whose transaction fails part way (here a write that ends its own savepoint, so
    /// that the writer's release of it fails) answers every write of it that nothing was
    /// applied, and only once the transaction is rolled back: the writer's connection is outside
    /// a transaction, and another process takes the write lock at once.
    #[test]
    fn a_batch_that_fails_part_way_is_rolled_back_before_its_writes_are_answered() {
        let dir = tempfile_dir();
        let store = SqliteStore::open(dir.join("failed.db")).unwrap();
        // Both writes queued before a writer runs, so that one commit carries them.
        let (first, first_answer) = Job::queued(|conn: &Connection, now| {
            insert(conn, "first", now)?;
            conn.execute_batch("RELEASE toolkey_write")
                .map_err(unavailable)
        });
        let (second, second_answer) =
            Job::queued(|conn: &Connection, now| insert(conn, "second", now));
        assert!(store.writes.submit(first), "no writer was running");
        assert!(!store.writes.submit(second));
        store.writes.combine(&store.conn, &*store.clock);
        for mut answer in [first_answer, second_answer] {
            let answer = answer.try_recv().expect("answered when the writer returns");
            assert!(
                matches!(&answer, Err(StoreError::Unavailable(_))),
                "{answer:?}"
            );
        }
        assert!(
            store.conn.lock().unwrap().is_autocommit(),
            "the writer's connection holds no transaction"
        );
        assert_write_lock_free(&dir.join("failed.db"));
        assert!(keys(&store).is_empty(), "{:?}", keys(&store));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A commit that panicked leaves the writer's connection marked poisoned, and rolled back:
    /// a replay after it still reads on that connection on the caller's thread, not on the
    /// blocking pool for the rest of the process's life.
    #[tokio::test]
    async fn a_replay_after_a_panicked_commit_still_reads_on_the_writers_connection() {
        let dir = tempfile_dir();
        let clock = Arc::new(PanicOnce(AtomicBool::new(false)));
        let store = SqliteStore::open(dir.join("poisoned.db"))
            .unwrap()
            .with_clock(clock.clone());
        store.write(|tx, now| insert(tx, "k", now)).await.unwrap();
        clock.0.store(true, Ordering::Release);
        let failed = store.write(|tx, now| insert(tx, "lost", now)).await;
        assert!(matches!(failed, Err(StoreError::Unavailable(_))));
        assert!(store.conn.is_poisoned());
        let inline = store.inline.lock().unwrap();
        let read = store.read_inline(&RecordKey::new("acme", "k"));
        assert!(
            matches!(read, Inline::Live(_)),
            "read on the writer's connection"
        );
        let read = store.read_inline(&RecordKey::new("acme", "lost"));
        assert!(
            matches!(read, Inline::Free),
            "the panicked write was rolled back"
        );
        drop(inline);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A commit that fails answers every write of its batch as unavailable, none as done.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_begin_answers_every_write_unavailable() {
        let dir = tempfile_dir();
        let path = dir.join("locked.db");
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        lock(&store.conn)
            .busy_timeout(Duration::from_millis(50))
            .unwrap();
        // Another process holds the write lock.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let answers = futures_util::future::join_all((0..4).map(|i| {
            let store = store.clone();
            async move {
                store
                    .write(move |tx, now| insert(tx, &format!("k{i}"), now))
                    .await
            }
        }))
        .await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(StoreError::Unavailable(_)))),
            "{answers:?}"
        );
        other.execute_batch("ROLLBACK").unwrap();
        assert!(keys(&store).is_empty());
        store
            .write(|tx, now| insert(tx, "after", now))
            .await
            .unwrap();
        assert_eq!(keys(&store), ["after"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile_dir();
        let path = dir.join("newer.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(conn);
        let err = SqliteStore::open(&path).unwrap_err();
        assert!(
            matches!(&err, StoreError::Config(m) if m.contains(&format!("schema version {}", SCHEMA_VERSION + 1))),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A file written before retry limits existed (schema version 1 as it was then: the records
    /// table, no counters table) opens, gains the counters' table, and keeps its records.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_from_before_retry_limits_gains_the_counters_and_keeps_its_records() {
        let dir = tempfile_dir();
        let path = dir.join("before.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE toolkey_records (
                     tenant TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL,
                     token TEXT NOT NULL, fingerprint TEXT NOT NULL, since_ms INTEGER NOT NULL,
                     lease_until_ms INTEGER NOT NULL, outcome TEXT, completed_at_ms INTEGER,
                     expires_at_ms INTEGER, PRIMARY KEY (tenant, key)
                 ) WITHOUT ROWID;
                 CREATE INDEX toolkey_records_expiry ON toolkey_records (expires_at_ms)
                     WHERE state = 'completed';
                 PRAGMA user_version = 1;",
            )
            .unwrap();
            conn.execute(
                "INSERT INTO toolkey_records (tenant, key, state, token, fingerprint, since_ms,
                     lease_until_ms, outcome, completed_at_ms, expires_at_ms)
                 VALUES ('shop', 'refund:o-1', 'completed', 't-1', ?1, 0, 0, ?2, 0, ?3)",
                params![
                    crate::Fingerprint::of(&1).unwrap().to_hex(),
                    Outcome::Ok(serde_json::json!("re-1")).to_stored(),
                    i64::MAX
                ],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let key = RecordKey::new("shop", "refund:o-1");
        assert!(matches!(
            store.get(&key).await.unwrap(),
            Some(Record::Completed { outcome: Outcome::Ok(v), .. }) if v == "re-1"
        ));
        let window = Duration::from_secs(60);
        assert_eq!(store.count_failure(&key, window).await.unwrap(), 1);
        assert_eq!(store.count_failure(&key, window).await.unwrap(), 2);
        assert_eq!(store.failures(&key).await.unwrap(), 2);
        drop(store);
        // Reopened, the counters are still there; the version is unchanged.
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.failures(&key).await.unwrap(), 2);
        let version: i64 = Connection::open(&path)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Ended counters leave the table as failures are counted, a bounded number at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ended_counters_are_swept() {
        let clock = Arc::new(crate::store::ManualClock::new());
        let store = SqliteStore::open_in_memory()
            .unwrap()
            .with_clock(clock.clone());
        let window = Duration::from_secs(60);
        for n in 0..100 {
            let key = RecordKey::new("shop", format!("k-{n}"));
            store.count_failure(&key, window).await.unwrap();
        }
        clock.advance(window);
        let rows = |store: &SqliteStore| -> i64 {
            lock(&store.conn)
                .query_row("SELECT COUNT(*) FROM toolkey_failures", [], |row| {
                    row.get(0)
                })
                .unwrap()
        };
        assert_eq!(rows(&store), 100);
        let fresh = RecordKey::new("shop", "fresh");
        store.count_failure(&fresh, window).await.unwrap();
        assert_eq!(rows(&store), 100 - FAILURE_SWEEP + 1);
        assert_eq!(store.count_failure(&fresh, window).await.unwrap(), 2);
        assert_eq!(rows(&store), 1, "the rest swept, the open window kept");
    }

    #[test]
    fn reopening_keeps_the_schema() {
        let dir = tempfile_dir();
        let path = dir.join("again.db");
        drop(SqliteStore::open(&path).unwrap());
        drop(SqliteStore::open(&path).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Another process takes the file's write lock at once: no transaction holds it.
    fn assert_write_lock_free(path: &std::path::Path) {
        let other = Connection::open(path).unwrap();
        other.busy_timeout(Duration::ZERO).unwrap();
        other
            .execute_batch("BEGIN IMMEDIATE")
            .expect("the write lock is free");
        other.execute_batch("ROLLBACK").unwrap();
    }

    /// A fresh directory under the system's temporary directory (the runtime has no tempfile
    /// dependency).
    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("toolkey-sqlite-{}", Token::generate()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
