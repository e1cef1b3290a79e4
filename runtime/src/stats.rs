//! What the executor counts: one counter per way a call can end, read as [`Stats`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of what the toolbox did, since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Bodies started.
    pub executed: u64,
    /// Calls answered with a recorded outcome.
    pub replayed: u64,
    /// Calls refused because the same key was running.
    pub in_progress: u64,
    /// Calls refused because the same key was used with other arguments.
    pub conflicts: u64,
    /// Calls whose caller stopped waiting.
    pub timeouts: u64,
    /// Reservations released after a retryable error.
    pub released: u64,
    /// Stale reservations taken over and handed to a recover hook.
    pub recovered: u64,
    /// Calls that ended in an unknown outcome.
    pub unknown: u64,
    /// Calls answered `RETRY_LIMIT`: refused without running, or stopped at the failure that
    /// reached the limit.
    pub retry_limited: u64,
    /// Calls answered `BUSY`: no slot under the tool's concurrency limit freed in time.
    pub busy: u64,
}

#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters behind [`Stats`], shared by every call of one executor.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) executed: Counter,
    pub(crate) replayed: Counter,
    pub(crate) in_progress: Counter,
    pub(crate) conflicts: Counter,
    pub(crate) timeouts: Counter,
    pub(crate) released: Counter,
    pub(crate) recovered: Counter,
    pub(crate) unknown: Counter,
    pub(crate) retry_limited: Counter,
    pub(crate) busy: Counter,
}

impl Counters {
    /// The counts as they are now.
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            executed: self.executed.get(),
            replayed: self.replayed.get(),
            in_progress: self.in_progress.get(),
            conflicts: self.conflicts.get(),
            timeouts: self.timeouts.get(),
            released: self.released.get(),
            recovered: self.recovered.get(),
            unknown: self.unknown.get(),
            retry_limited: self.retry_limited.get(),
            busy: self.busy.get(),
        }
    }
}
