//! The one writer at a time, and group commit: writes share a transaction and its `fsync`.

use super::*;

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
pub(super) struct Writes {
    pub(super) queue: Mutex<Vec<Box<dyn Pending>>>,
    pub(super) running: AtomicBool,
    /// Callers waiting for their write's answer.
    pub(super) waiting: AtomicUsize,
    /// How long a lone caller's answers have taken lately, in nanoseconds (zero: none yet).
    pub(super) typical_answer_ns: AtomicU64,
    /// Lone callers' waits begun, for the looks taken whatever the typical time.
    pub(super) lone_waits: AtomicU64,
    /// The longest a lone caller looks for its answer before it waits to be woken.
    pub(super) answer_spin: Duration,
    /// How long a writer waits for more writes before it ends.
    pub(super) linger: Duration,
    /// Transactions committed, for tests of the sharing.
    pub(super) commits: AtomicU64,
    /// Writers started, for tests of the lingering.
    pub(super) writers: AtomicU64,
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
pub(super) const MAX_BATCH: usize = 256;

/// How long a writer whose queue ran dry waits for another write before it ends. A write that
/// arrives meanwhile is taken on by the running writer, without waking a thread of the blocking
/// pool: a call's outcome write usually follows its reservation's answer by a few microseconds,
/// less than the wake costs. The writer yields its CPU between looks.
pub(super) const LINGER: Duration = Duration::from_micros(50);

/// The longest a writer lingers, whatever it is told: past a few microseconds a longer wait
/// gains nothing, and a wait too long to add to the time would end the writer.
pub(super) const MAX_LINGER: Duration = Duration::from_secs(1);

impl Writes {
    /// How long a lone caller's answers have taken lately.
    pub(super) fn typical_answer(&self) -> Duration {
        Duration::from_nanos(self.typical_answer_ns.load(Ordering::Relaxed))
    }

    /// How long a lone caller beginning to wait now looks for its answer: as [`spin_for`]
    /// says, except that one wait in [`PROBE_EVERY`] looks for the longest whatever answers
    /// have taken. A wait that parks measures the commit and the wake together, and where a
    /// wake costs about as much as the longest look, a store whose answers once grew slow (a
    /// burst of checkpoints) would not see them fast again without such looks.
    pub(super) fn spin(&self) -> Duration {
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
    pub(super) fn answer_took(&self, took: Duration) {
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
    pub(super) fn submit(&self, job: Box<dyn Pending>) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(job);
        !self.running.swap(true, Ordering::AcqRel)
    }

    /// Runs queued writes in batches until the queue stays empty for the linger.
    pub(super) fn combine(&self, conn: &Mutex<Connection>, clock: &dyn Clock) {
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
pub(super) struct Writer {
    pub(super) conn: Arc<Mutex<Connection>>,
    pub(super) writes: Arc<Writes>,
    pub(super) clock: Arc<dyn Clock>,
    /// Set once the run has returned, or been handed on.
    pub(super) done: bool,
}

impl Writer {
    pub(super) fn run(mut self) {
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
pub(super) fn commit_batch(
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
pub(super) fn apply_batch(
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
pub(super) trait Pending: Send {
    /// Applies the write in the batch's transaction at `now` (ms); false when it failed (its
    /// changes are then rolled back).
    fn apply(&mut self, conn: &Connection, now: i64) -> bool;
    /// Answers the caller: its write's own answer if the batch committed (or if the write had
    /// failed), the commit's error otherwise.
    fn answer(self: Box<Self>, committed: Result<(), String>);
}

/// One caller's write: its closure, then its answer until the commit.
pub(super) struct Job<T, F> {
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
    pub(super) fn queued(
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
pub(super) const ANSWER_SPIN: Duration = Duration::from_millis(1);

/// One lone wait in this many looks for its answer for the longest, whatever answers have
/// taken (see [`Writes::spin`]): on a disk slower than the looks, a sixteenth of the longest
/// look in CPU per write.
pub(super) const PROBE_EVERY: u64 = 16;

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
pub(super) fn spin_for(typical: Duration, most: Duration) -> Duration {
    if typical.is_zero() {
        most
    } else if typical > most {
        Duration::ZERO
    } else {
        (typical * 2).min(most)
    }
}

/// Counts a caller among those waiting for a write's answer while it lives.
pub(super) struct Waiting<'a> {
    waiting: &'a AtomicUsize,
    /// No other caller was waiting when this one began to.
    pub(super) alone: bool,
}

impl<'a> Waiting<'a> {
    pub(super) fn start(waiting: &'a AtomicUsize) -> Waiting<'a> {
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
pub(super) async fn answered<T>(
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

pub(super) fn writer_stopped() -> StoreError {
    StoreError::Unavailable("sqlite: the write failed inside the store; nothing was applied".into())
}

/// The connection, even after a panic while it was held; a transaction the panic left open is
/// rolled back so the next call starts clean.
pub(super) fn lock(conn: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    let conn = conn.lock().unwrap_or_else(|e| e.into_inner());
    roll_back_open(&conn);
    conn
}

/// Rolls back the transaction `conn` has open, if any: left open, it would hold the file's
/// write lock against every other process.
pub(super) fn roll_back_open(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
}

/// The connection, if no one holds it. A connection whose holder panicked is taken as [`lock`]
/// takes it: the mark stays on the mutex for good, and left alone it would send every later read
/// to the pool. The caller must not trust a transaction it finds open ([`free_read`] does not).
pub(super) fn try_lock(conn: &Mutex<Connection>) -> Option<std::sync::MutexGuard<'_, Connection>> {
    match conn.try_lock() {
        Ok(conn) => Some(conn),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}
