//! The in-process store: the default, and the reference the other stores are checked against.

mod approvals;
mod clock;
mod counters;
mod operator;
mod records;
mod reservations;
mod table;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use table::{Entry, Table};

pub use clock::{Clock, ManualClock, SystemClock};
use counters::FailureCounts;
use records::{Node, Records};

use super::record::nesting;
use super::row::{span_ms, Fields, State};
use super::{
    from_millis, millis, to_millis, Cursor, FailureCounters, Filter, OperatorCommands, Outcome,
    Page, Record, RecordKey, RecordKeyRef, Reservation, Reservations, Resolution, StoreError,
    Token,
};
use crate::Fingerprint;

/// Keeps records in this process's memory: for tests, single-process agents, and as the default
/// when a toolbox is given no store. Its records do not survive a restart.
///
/// A record takes about 216 bytes from the allocator with a small stored result, about 245 of
/// resident memory (at a million records: `cargo bench -p toolkey-tests --all-features --bench
/// scale`): each slot of the table holds a record's key hash (so the table grows without hashing
/// every key again, and a probe reads a record only when its hash matches) beside a pointer to
/// it, and each record is one allocation for its fields and one for its tenant, key, token and
/// outcome text together; tool names are shared between the records of a tool. The table is at
/// most half full (its 16-byte slots cost 32 to 64 bytes a record, the most just after it
/// doubles), and a large one asks Linux for huge pages: a reserve's cost stays nearly flat
/// as the store grows (1.19× to 1.30× with a million records against a thousand). A completed record
/// that has been read (replayed, or asked for by a status call) also keeps its outcome as read,
/// if its text is at most 4 KiB, so that each replay after the first
/// copies the result instead of reading its text again: such a record holds its result twice.
///
/// ```
/// use std::sync::Arc;
/// use toolkey::store::{ManualClock, MemoryStore};
///
/// let clock = Arc::new(ManualClock::new());
/// let store = MemoryStore::with_clock(clock.clone());
/// # let _ = store;
/// ```
pub struct MemoryStore {
    records: Mutex<Records>,
    clock: Box<dyn Clock>,
    failures: Mutex<FailureCounts>,
    approvals: Mutex<approvals::Requests>,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(SystemClock)
    }

    /// An empty store on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        MemoryStore {
            records: Mutex::default(),
            clock: Box::new(clock),
            failures: Mutex::default(),
            approvals: Mutex::default(),
        }
    }

    fn now_ms(&self) -> i64 {
        to_millis(self.clock.now())
    }

    /// The records, locked. An operation that does not depend on the time takes them this way,
    /// and reads no clock.
    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` over the records, locked, and the time (ms), read before the lock is taken.
    fn with<T>(&self, f: impl FnOnce(&mut Records, i64) -> T) -> T {
        let now = self.now_ms();
        f(&mut self.records(), now)
    }

    /// The failures counted for `key` in a window still open at `now` (ms).
    fn failures_at(&self, key: &RecordKey, now: i64) -> u64 {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.counts.is_empty() {
            return 0;
        }
        match failures.counts.get(key) {
            Some((count, until)) if *until > now => *count,
            _ => 0,
        }
    }

    /// Overwrites a record's stored outcome with text that is not an outcome, as disk or a
    /// careless migration might. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn __corrupt(&self, key: &RecordKey) {
        if let Some(node) = self.records().get_mut(key.borrowed()) {
            node.hold_text("{not json");
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}
