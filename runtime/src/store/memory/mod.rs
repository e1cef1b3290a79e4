//! The in-process store: the default, and the reference the other stores are checked against.

mod table;

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use table::{Entry, Table};

use super::record::nesting;
use super::row::{span_ms, Fields, State};
use super::{
    from_millis, millis, to_millis, Cursor, FailureCounters, Filter, OperatorCommands, Outcome,
    Page, Record, RecordKey, RecordKeyRef, Reservation, Reservations, Resolution, StoreError,
    Token,
};
use crate::Fingerprint;

/// A source of the current time, injectable so lease and retention tests need no sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use std::time::Duration;
/// use toolkey::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(clock.now().duration_since(t0).unwrap(), Duration::from_secs(31));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now_ms: Mutex<i64>,
}

impl ManualClock {
    /// A clock standing at the current system time.
    pub fn new() -> Self {
        ManualClock {
            now_ms: Mutex::new(to_millis(SystemTime::now())),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.now_ms.lock().expect("clock lock") += millis(by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        from_millis(*self.now_ms.lock().expect("clock lock"))
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

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
}

/// The records, each boxed so a slot of the table is its hash and a pointer, found by their
/// tenant and key without building a [`RecordKey`].
#[derive(Default)]
struct Records {
    table: Table<Node>,
    /// foldhash with a seed of this table's own (hashbrown's default): a key is hashed on each
    /// reserve, completion and replay, and SipHash, the standard library's, took 341
    /// instructions for the call bench's key where foldhash takes 64. Keys hold text from the
    /// model's arguments: foldhash is not a cryptographic hash, and resists a flood of keys
    /// chosen to collide only while its seed, random per table and shown by nothing here, stays
    /// unknown.
    hasher: hashbrown::DefaultHashBuilder,
    tools: ToolNames,
}

/// Each tool's name once, shared by its records.
#[derive(Default)]
struct ToolNames {
    held: HashSet<Arc<str>>,
    /// The name asked for last.
    last: Option<Arc<str>>,
}

impl ToolNames {
    /// The shared copy of a tool's name.
    fn shared(&mut self, name: &str) -> Arc<str> {
        // Calls of one tool often come in a row: its name is compared before it is hashed.
        if let Some(last) = self.last.as_ref().filter(|last| ***last == *name) {
            return last.clone();
        }
        let held = match self.held.get(name) {
            Some(held) => held.clone(),
            None => {
                let name: Arc<str> = name.into();
                self.held.insert(name.clone());
                name
            }
        };
        self.last = Some(held.clone());
        held
    }
}

impl Records {
    fn hash(&self, tenant: &str, key: &str) -> u64 {
        self.hasher.hash_one((tenant, key))
    }

    /// The record under `key`, to change.
    fn get_mut(&mut self, key: RecordKeyRef<'_>) -> Option<&mut Node> {
        let hash = self.hash(key.tenant, key.key);
        self.table.find_mut(hash, |node| node.is(key))
    }

    /// Removes the record under `key` if `judge` says so; true when it did.
    fn remove_if(&mut self, key: &RecordKey, judge: impl FnOnce(&Node) -> bool) -> bool {
        let hash = self.hash(&key.tenant, &key.key);
        self.table
            .remove_if(hash, |node| node.is(key.borrowed()), judge)
    }

    /// Completes the record under `key`, if `judge` says so, with the outcome whose stored text
    /// is `text` (written before the lock is taken); true when it did.
    fn complete(
        &mut self,
        key: &RecordKey,
        judge: impl FnOnce(&Node) -> bool,
        text: &str,
        now_ms: i64,
        retain: Duration,
    ) -> bool {
        let hash = self.hash(&key.tenant, &key.key);
        let node = self.table.find_mut(hash, |node| node.is(key.borrowed()));
        let Some(node) = node.filter(|node| judge(node)) else {
            return false;
        };
        node.state = State::Completed;
        node.completed_at_ms = now_ms;
        node.expires_at_ms = now_ms.saturating_add(span_ms(retain));
        node.hold_text(text);
        true
    }
}

/// One record. Times are milliseconds; `completed_at_ms` and `expires_at_ms` mean something only
/// in a completed record.
struct Node {
    /// The tenant, the key, the holder's token and, in a completed record, the outcome's stored
    /// text, one after another.
    text: Box<str>,
    tenant_len: u32,
    key_len: u32,
    token_len: u32,
    state: State,
    tool: Option<Arc<str>>,
    fingerprint: Fingerprint,
    since_ms: i64,
    lease_until_ms: i64,
    completed_at_ms: i64,
    expires_at_ms: i64,
    /// A completed record's outcome as a read found it, kept so that the reads after it (a
    /// retry's replay, above all) copy it rather than read the text again: copying the call
    /// bench's result took 1,500 instructions where reading its text took 4,100. Kept only for
    /// text up to [`KEEP_READ`] bytes that nests no deeper than serde_json reads unaided;
    /// dropped whenever the text changes.
    read: Option<Box<Outcome>>,
}

/// The longest outcome text whose reading a record keeps (see [`Node::record`]): what a record
/// can hold beyond its text stays bounded, and a longer text costs more to read or copy than a
/// replay's other work, whichever is done.
const KEEP_READ: usize = 4 * 1024;

/// The deepest nesting of an outcome whose reading a record keeps: copying it recurses once
/// per level, as serde_json's own bounded reading does.
const KEEP_READ_DEPTH: usize = 128;

impl Node {
    /// A record reserved under `token` at `now_ms`, its tool's name not yet set.
    fn reserved(
        key: &RecordKey,
        fingerprint: &Fingerprint,
        token: &Token,
        now_ms: i64,
        lease: Duration,
    ) -> Result<Node, StoreError> {
        let too_long = |_| StoreError::Config("a tenant or key longer than 4 GiB".into());
        Ok(Node {
            text: [key.tenant.as_str(), &key.key, token.as_str()]
                .concat()
                .into(),
            tenant_len: u32::try_from(key.tenant.len()).map_err(too_long)?,
            key_len: u32::try_from(key.key.len()).map_err(too_long)?,
            token_len: u32::try_from(token.as_str().len()).map_err(too_long)?,
            state: State::InProgress,
            tool: None,
            fingerprint: *fingerprint,
            since_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(span_ms(lease)),
            completed_at_ms: 0,
            expires_at_ms: 0,
            read: None,
        })
    }

    fn tenant(&self) -> &str {
        &self.text[..self.tenant_len as usize]
    }

    fn key(&self) -> &str {
        let start = self.tenant_len as usize;
        &self.text[start..start + self.key_len as usize]
    }

    fn token(&self) -> &str {
        let start = self.token_start();
        &self.text[start..start + self.token_len as usize]
    }

    /// Where the token starts in `text`. (The lengths are added as `usize`: each fits in a
    /// `u32`, their sum need not.)
    fn token_start(&self) -> usize {
        self.tenant_len as usize + self.key_len as usize
    }

    /// Where the outcome's text starts in `text`.
    fn outcome_start(&self) -> usize {
        self.token_start() + self.token_len as usize
    }

    /// The outcome's stored text, after the token (none in a record not completed).
    fn outcome(&self) -> Option<&str> {
        (self.state == State::Completed).then(|| &self.text[self.outcome_start()..])
    }

    /// Holds `stored` as the outcome's text, in place of any outcome held before.
    fn hold_text(&mut self, stored: &str) {
        let start = self.outcome_start();
        self.text = [&self.text[..start], stored].concat().into();
        self.read = None;
    }

    fn is(&self, key: RecordKeyRef<'_>) -> bool {
        self.tenant() == key.tenant && self.key() == key.key
    }

    fn record_key(&self) -> RecordKey {
        RecordKey::new(self.tenant(), self.key())
    }

    /// Hands the record to a new holder.
    fn set_token(&mut self, token: &Token) -> Result<(), StoreError> {
        let held = self.token_start();
        let rest = &self.text[self.outcome_start()..];
        let token_len = u32::try_from(token.as_str().len())
            .map_err(|_| StoreError::Config("a token longer than 4 GiB".into()))?;
        self.text = [&self.text[..held], token.as_str(), rest].concat().into();
        self.token_len = token_len;
        Ok(())
    }

    /// A completed record past its retention: purged.
    fn expired(&self, now_ms: i64) -> bool {
        self.state == State::Completed && self.expires_at_ms <= now_ms
    }

    /// Expired, or resolved as not done by an operator: absent to `reserve`, `get` and listings.
    fn absent(&self, now_ms: i64) -> bool {
        self.state == State::NotDone || self.expired(now_ms)
    }

    /// In progress with a lapsed lease, or marked unknown: nobody knows the outcome.
    fn stale(&self, now_ms: i64) -> bool {
        self.state == State::Unknown
            || (self.state == State::InProgress && self.lease_until_ms <= now_ms)
    }

    /// In progress under `token`, or resolved as not done while `token` held it: the states in
    /// which a fenced write applies. A holder an operator judged dead that was alive after all
    /// records what it did, until another call reserves the key.
    fn held_by(&self, token: &Token) -> bool {
        matches!(self.state, State::InProgress | State::NotDone) && self.token() == token.as_str()
    }

    /// Completed under `token` with the outcome stored as `text`: what a `complete` sent again
    /// finds when the first one landed.
    fn completed_by(&self, token: &Token, text: &str) -> bool {
        self.token() == token.as_str() && self.outcome() == Some(text)
    }

    /// The record as the trait describes it, at `now_ms`. A completed record's outcome is
    /// copied from the reading kept by an earlier call, if there is one; else read from its
    /// text, and that reading kept when the text is short and shallow enough.
    fn record(&mut self, key: &RecordKey, now_ms: i64) -> Result<Record, StoreError> {
        if let Some(record) = self.kept_record() {
            return Ok(record);
        }
        let record = self.fields().to_record(key, now_ms)?;
        if let Record::Completed { outcome, .. } = &record {
            let text = &self.text[self.outcome_start()..];
            if text.len() <= KEEP_READ && nesting(text) <= KEEP_READ_DEPTH {
                self.read = Some(Box::new(outcome.clone()));
            }
        }
        Ok(record)
    }

    /// The completed record, its outcome copied from the reading kept by an earlier read; none
    /// when no reading is kept.
    fn kept_record(&self) -> Option<Record> {
        let read = self
            .read
            .as_ref()
            .filter(|_| self.state == State::Completed)?;
        Some(Record::Completed {
            fingerprint: self.fingerprint,
            outcome: Outcome::clone(read),
            completed_at: from_millis(self.completed_at_ms),
            expires_at: from_millis(self.expires_at_ms),
        })
    }

    fn fields(&self) -> Fields<'_> {
        let completed = self.state == State::Completed;
        Fields {
            tool: self.tool.as_deref(),
            state: self.state,
            token: self.token(),
            fingerprint: self.fingerprint,
            since_ms: self.since_ms,
            lease_until_ms: self.lease_until_ms,
            outcome: self.outcome(),
            completed_at_ms: completed.then_some(self.completed_at_ms),
            expires_at_ms: completed.then_some(self.expires_at_ms),
        }
    }
}

/// Failure counters for retry limits, beside the records: each key's count and when its window
/// ends (ms). Ended windows are swept when the map has doubled since the last sweep, so the map
/// holds about twice the counters of windows still open.
#[derive(Default)]
struct FailureCounts {
    counts: HashMap<RecordKey, (u64, i64)>,
    sweep_at: usize,
}

/// The fewest counters a sweep waits for.
const FIRST_SWEEP: usize = 64;

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

#[async_trait]
impl Reservations for MemoryStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.with(|records, now| {
            let hash = records.hash(&key.tenant, &key.key);
            // The record is built while the probe's cache line is on its way (in a large
            // table, a miss), and dropped again in the rare case the key is taken: a replay
            // in memory is answered before a reserve (`completed_here`).
            records.table.prefetch(hash);
            let mut node = Node::reserved(key, fingerprint, token, now, lease)?;
            let Records { table, tools, .. } = records;
            let place = match table.entry(hash, |held| held.is(key.borrowed())) {
                Entry::Held(held) if !held.absent(now) => {
                    return Ok(Reservation::Existing(held.record(key, now)?));
                }
                place => place,
            };
            // Only a record kept shares its tool's name: a reserve that stores nothing adds no
            // name to the store's set of them.
            node.tool = Some(tools.shared(tool));
            match place {
                Entry::Held(absent) => *absent = node,
                Entry::Free(free) => free.insert(node),
            }
            Ok(Reservation::Reserved {
                token: token.clone(),
                failures: self.failures_at(key, now),
            })
        })
    }

    fn completed_here(&self, key: RecordKeyRef<'_>) -> Option<Record> {
        let mut records = self.records();
        let node = records.get_mut(key)?;
        if node.state != State::Completed {
            return None;
        }
        // The clock is read only for a completed record, whose expiry it decides: a first call
        // (no record yet) asks before every reserve, and reads the clock there.
        let now = self.now_ms();
        if node.expired(now) {
            return None;
        }
        // Read once, then copied: only the first read needs a key of its own. A record that
        // cannot be read is left to `reserve`, which reports it.
        node.kept_record()
            .or_else(|| node.record(&RecordKey::from(key), now).ok())
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let text = outcome.to_stored();
        self.with(|records, now| {
            if records.complete(key, |node| node.held_by(token), &text, now, retain) {
                return Ok(true);
            }
            Ok(records
                .get_mut(key.borrowed())
                .is_some_and(|node| node.completed_by(token, &text)))
        })
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        Ok(self.records().remove_if(key, |node| node.held_by(token)))
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if node.held_by(token) => {
                node.state = State::InProgress;
                node.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        match self.records().get_mut(key.borrowed()) {
            Some(node) if node.held_by(token) => {
                node.state = State::Unknown;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if node.token() == stale.as_str() && node.stale(now) => {
                let token = Token::generate();
                node.set_token(&token)?;
                node.state = State::InProgress;
                node.since_ms = now;
                node.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(Some(token))
            }
            _ => Ok(None),
        })
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if !node.absent(now) => node.record(key, now).map(Some),
            _ => Ok(None),
        })
    }
}

#[async_trait]
impl OperatorCommands for MemoryStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.with(|records, now| {
            let mut purged = 0;
            records.table.retain(|node| {
                let purge = purged < limit && node.expired(now);
                purged += usize::from(purge);
                !purge
            });
            Ok(purged as u64)
        })
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
        self.with(|records, now| {
            let mut nodes: Vec<&Node> = records
                .table
                .iter()
                .filter(|node| {
                    after
                        .as_ref()
                        .is_none_or(|a| (node.tenant(), node.key()) > (&a.tenant, &a.key))
                        && filter.tenant.as_ref().is_none_or(|t| t == node.tenant())
                        && filter.key.as_ref().is_none_or(|k| k == node.key())
                })
                .collect();
            nodes.sort_by(|a, b| (a.tenant(), a.key()).cmp(&(b.tenant(), b.key())));
            let limit = limit.max(1);
            let next = (nodes.len() > limit).then(|| Cursor::after(&nodes[limit - 1].record_key()));
            let mut page = Page {
                next,
                ..Page::default()
            };
            for node in nodes.into_iter().take(limit) {
                if node.absent(now) {
                    continue;
                }
                let read = node.fields().to_entry(&node.record_key(), now);
                page.take(read.map(|e| Some(e).filter(|e| filter.admits(e, from_millis(now)))))?;
            }
            Ok(page)
        })
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let done = match resolution {
            Resolution::Done { outcome, retain } => Some((outcome.to_stored(), *retain)),
            Resolution::NotDone => None,
        };
        self.with(|records, now| {
            let seen = |node: &Node| node.token() == seen.as_str() && node.stale(now);
            Ok(match done {
                Some((text, retain)) => records.complete(key, seen, &text, now, retain),
                None => match records.get_mut(key.borrowed()) {
                    Some(node) if seen(node) => {
                        node.state = State::NotDone;
                        true
                    }
                    _ => false,
                },
            })
        })
    }
}

#[async_trait]
impl FailureCounters for MemoryStore {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let FailureCounts { counts, sweep_at } = &mut *failures;
        if counts.len() >= (*sweep_at).max(FIRST_SWEEP) {
            counts.retain(|_, (_, until)| *until > now);
            *sweep_at = counts.len() * 2;
        }
        let entry = counts.entry(key.clone()).or_insert((0, now));
        if entry.1 <= now {
            *entry = (0, now.saturating_add(span_ms(window)));
        }
        entry.0 += 1;
        Ok(entry.0)
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        Ok(self.failures_at(key, self.now_ms()))
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.counts.remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's tenant, key and token share one allocation, one after another: a tenant and
    /// key that spell the same text together ("ab" + "c", "a" + "bc") are still two records,
    /// found, completed and listed apart.
    #[tokio::test]
    async fn tenant_and_key_spelling_the_same_text_are_two_records() {
        let store = MemoryStore::new();
        let (a, b) = (RecordKey::new("ab", "c"), RecordKey::new("a", "bc"));
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let lease = Duration::from_secs(30);
        let mut tokens = Vec::new();
        for key in [&a, &b] {
            match store
                .reserve(key, "tool", &fp, &Token::generate(), lease)
                .await
            {
                Ok(Reservation::Reserved { token, .. }) => tokens.push(token),
                other => panic!("{key:?} was not free: {other:?}"),
            }
        }
        let done = Outcome::Ok(serde_json::json!("a's"));
        let retain = Duration::from_secs(60);
        assert!(store.complete(&a, &tokens[0], &done, retain).await.unwrap());
        assert!(matches!(
            store.get(&b).await.unwrap(),
            Some(Record::InProgress { .. })
        ));
        assert!(!store.complete(&b, &tokens[0], &done, retain).await.unwrap());
        let page = store.list(&Filter::default(), None, 10).await.unwrap();
        let keys: Vec<&RecordKey> = page.entries.iter().map(|e| &e.key).collect();
        assert_eq!(keys, [&b, &a]);
    }

    const LEASE: Duration = Duration::from_secs(30);
    const RETAIN: Duration = Duration::from_secs(60);

    /// A [`ManualClock`] that counts how often it is read.
    #[derive(Default)]
    struct CountedClock {
        clock: ManualClock,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl CountedClock {
        fn reads(&self) -> usize {
            self.reads.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl Clock for CountedClock {
        fn now(&self) -> SystemTime {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.clock.now()
        }
    }

    /// The lookup every keyed call makes before its reserve reads the clock only for a completed
    /// record, whose expiry it decides: a first call (no record) and a call meeting one in
    /// progress read it in their reserve alone. A completed record past its retention is still
    /// not answered from memory.
    #[tokio::test]
    async fn the_lookup_before_a_reserve_reads_the_clock_only_for_a_completed_record() {
        let clock = Arc::new(CountedClock::default());
        let store = MemoryStore::with_clock(clock.clone());
        let key = RecordKey::new("acme", "invoice:7");
        assert!(replayed(&store, &key).is_none());
        assert_eq!(clock.reads(), 0, "no record: no clock read");

        let token = reserved(&store, &key).await;
        let after_reserve = clock.reads();
        assert!(replayed(&store, &key).is_none());
        assert_eq!(clock.reads(), after_reserve, "in progress: no clock read");

        let done = Outcome::Ok(serde_json::json!(7));
        assert!(store.complete(&key, &token, &done, RETAIN).await.unwrap());
        let completed = clock.reads();
        assert_eq!(replayed(&store, &key), Some(done));
        assert_eq!(
            clock.reads(),
            completed + 1,
            "completed: its expiry is read"
        );

        clock.clock.advance(RETAIN);
        assert!(replayed(&store, &key).is_none(), "expired: not replayed");
        assert_eq!(clock.reads(), completed + 2);
    }

    /// A release and a mark as unknown do not depend on the time, and read no clock: only the
    /// reserves before them do.
    #[tokio::test]
    async fn writes_that_do_not_depend_on_the_time_read_no_clock() {
        let clock = Arc::new(CountedClock::default());
        let store = MemoryStore::with_clock(clock.clone());
        let (released, unknown) = (RecordKey::new("acme", "a"), RecordKey::new("acme", "b"));
        let token = reserved(&store, &released).await;
        let before = clock.reads();
        assert!(store.release(&released, &token).await.unwrap());
        assert_eq!(clock.reads(), before, "release");

        let token = reserved(&store, &unknown).await;
        let before = clock.reads();
        assert!(store.mark_unknown(&unknown, &token).await.unwrap());
        assert_eq!(clock.reads(), before, "mark_unknown");
        assert!(matches!(
            store.get(&unknown).await.unwrap(),
            Some(Record::Stale { .. })
        ));
        assert!(store.get(&released).await.unwrap().is_none());
    }

    /// The token under which `key`, free, is now reserved.
    async fn reserved(store: &MemoryStore, key: &RecordKey) -> Token {
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        match store
            .reserve(key, "tool", &fp, &Token::generate(), LEASE)
            .await
        {
            Ok(Reservation::Reserved { token, .. }) => token,
            other => panic!("{key:?} was not free: {other:?}"),
        }
    }

    /// The outcome a replay of `key` reads from memory.
    fn replayed(store: &MemoryStore, key: &RecordKey) -> Option<Outcome> {
        match store.completed_here(key.borrowed())? {
            Record::Completed { outcome, .. } => Some(outcome),
            other => panic!("not completed: {other:?}"),
        }
    }

    /// A replay, `get` and `reserve` of completed `key` each answer `outcome`.
    async fn reads_answer(store: &MemoryStore, key: &RecordKey, outcome: &Outcome) {
        assert_eq!(replayed(store, key).as_ref(), Some(outcome));
        let Some(Record::Completed { outcome: got, .. }) = store.get(key).await.unwrap() else {
            panic!("not completed");
        };
        assert_eq!(&got, outcome);
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        match store
            .reserve(key, "tool", &fp, &Token::generate(), LEASE)
            .await
        {
            Ok(Reservation::Existing(Record::Completed { outcome: got, .. })) => {
                assert_eq!(&got, outcome)
            }
            other => panic!("not the completed record: {other:?}"),
        }
    }

    /// A completed record's outcome text follows its tenant, key and token in one allocation:
    /// every read (a replay, `get`, `reserve`, `list`) answers the outcome recorded, whatever
    /// its text holds, and the record's token is read apart from it.
    #[tokio::test]
    async fn every_read_answers_the_outcome_recorded_after_the_key_and_token() {
        let store = MemoryStore::new();
        let outcomes = [
            Outcome::Ok(serde_json::json!({
                "id": u64::MAX, "delta": -1, "amount": 1.5, "tiny": 1e-300,
                "name": "Zoë \"quoted\" \u{1F600}", "lines": [{"sku": "a", "n": 2}, null, []],
                "empty": {}, "yes": true
            })),
            Outcome::Ok(serde_json::Value::Null),
            Outcome::Ok(serde_json::json!("")),
            Outcome::Ok(serde_json::json!("shopk-3tok")),
            Outcome::Err(
                crate::ToolError::new("PAYMENT_DECLINED", "card declined")
                    .with_suggestion("ask for another card"),
            ),
        ];
        for (n, outcome) in outcomes.iter().enumerate() {
            let key = RecordKey::new("shop", format!("k-{n}"));
            let token = reserved(&store, &key).await;
            assert!(store.complete(&key, &token, outcome, RETAIN).await.unwrap());
            for _ in 0..2 {
                reads_answer(&store, &key, outcome).await;
            }
            let filter = Filter {
                key: Some(key.key.clone()),
                ..Filter::default()
            };
            let page = store.list(&filter, None, 10).await.unwrap();
            assert_eq!(page.entries.len(), 1);
            assert_eq!(page.entries[0].outcome.as_ref(), Some(outcome));
            assert_eq!(
                page.entries[0].revision, token,
                "the token, without the outcome"
            );
            // A fenced write with the old token finds nothing to change.
            assert!(!store.release(&key, &token).await.unwrap());
        }
    }

    /// A key run again after its record expired answers its new outcome, when the new record
    /// takes the old one's place in the table; a stale record taken over and resolved keeps its
    /// key and answers the outcome it was resolved with.
    #[tokio::test]
    async fn a_record_put_again_or_taken_over_answers_its_own_outcome() {
        let clock = Arc::new(ManualClock::new());
        let store = MemoryStore::with_clock(clock.clone());
        let key = RecordKey::new("shop", "again");
        let (first, second) = (
            Outcome::Ok(serde_json::json!("first, and longer than the second")),
            Outcome::Ok(serde_json::json!("second")),
        );
        let token = reserved(&store, &key).await;
        assert!(store.complete(&key, &token, &first, RETAIN).await.unwrap());
        // Replayed, the record keeps its outcome's reading; the new record must not answer it.
        assert_eq!(replayed(&store, &key), Some(first.clone()));
        assert!(kept(&store, &key));
        clock.advance(RETAIN);
        assert_eq!(replayed(&store, &key), None, "expired");
        let token = reserved(&store, &key).await;
        assert!(store.complete(&key, &token, &second, RETAIN).await.unwrap());
        assert_eq!(replayed(&store, &key), Some(second.clone()));

        let other = RecordKey::new("shop", "stale");
        let token = reserved(&store, &other).await;
        clock.advance(LEASE);
        let taken = store
            .take_over(&other, &token, LEASE)
            .await
            .unwrap()
            .unwrap();
        assert!(store.mark_unknown(&other, &taken).await.unwrap());
        let done = Resolution::Done {
            outcome: first.clone(),
            retain: RETAIN,
        };
        assert!(store.resolve(&other, &taken, &done).await.unwrap());
        assert_eq!(replayed(&store, &other), Some(first));
        let page = store.list(&Filter::default(), None, 10).await.unwrap();
        let keys: Vec<&RecordKey> = page.entries.iter().map(|e| &e.key).collect();
        assert_eq!(keys, [&key, &other]);
    }

    /// Whether `key`'s record keeps a reading of its outcome.
    fn kept(store: &MemoryStore, key: &RecordKey) -> bool {
        store.with(|records, _| {
            records
                .get_mut(key.borrowed())
                .is_some_and(|node| node.read.is_some())
        })
    }

    /// A result `depth` levels of arrays deep.
    fn nested(depth: usize) -> serde_json::Value {
        (0..depth).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]))
    }

    /// The first read of a completed record keeps what it read, and the reads after it answer
    /// the same outcome from it, through every read; the reading goes when the text changes (so
    /// a record whose text no longer reads is reported, not answered from memory), and is not
    /// kept for a long or deep text, which every read reads again.
    #[tokio::test]
    async fn a_records_reading_is_kept_only_while_its_text_holds_and_when_small() {
        let store = MemoryStore::new();
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let long = "x".repeat(KEEP_READ);
        let cases = [
            (
                Outcome::Ok(serde_json::json!({"id": 7, "to": "acme"})),
                true,
            ),
            (
                Outcome::Err(crate::ToolError::new("DECLINED", "card declined")),
                true,
            ),
            (Outcome::Ok(nested(100)), true),
            (Outcome::Ok(serde_json::json!(long)), false),
            (Outcome::Ok(nested(200)), false),
        ];
        for (n, (outcome, keeps)) in cases.iter().enumerate() {
            let key = RecordKey::new("shop", format!("k-{n}"));
            let token = reserved(&store, &key).await;
            assert!(store.complete(&key, &token, outcome, RETAIN).await.unwrap());
            assert!(!kept(&store, &key), "kept before any read");
            for _ in 0..3 {
                reads_answer(&store, &key, outcome).await;
                assert_eq!(kept(&store, &key), *keeps, "case {n}");
            }
            // The text changes under the kept reading (as disk damage would): every read
            // reads the text again and reports it.
            store.with(|records, _| {
                records
                    .get_mut(key.borrowed())
                    .unwrap()
                    .hold_text("{not json")
            });
            assert_eq!(
                replayed(&store, &key),
                None,
                "left to reserve, which reports it"
            );
            assert!(matches!(
                store.get(&key).await,
                Err(StoreError::Corrupt { .. })
            ));
            let reserve = store
                .reserve(&key, "tool", &fp, &Token::generate(), LEASE)
                .await;
            assert!(
                matches!(reserve, Err(StoreError::Corrupt { .. })),
                "{reserve:?}"
            );
            assert!(!kept(&store, &key));
        }
    }

    /// A reserve that meets a live record stores nothing, the name of the tool it was made for
    /// included: the store's set of names grows only with the records it keeps.
    #[tokio::test]
    async fn a_reserve_that_stores_nothing_keeps_no_tool_name() {
        let store = MemoryStore::new();
        let fp = Fingerprint::of(&serde_json::json!(1)).unwrap();
        let key = RecordKey::new("shop", "k");
        reserved(&store, &key).await;
        for n in 0..100 {
            let answer = store
                .reserve(&key, &format!("other-{n}"), &fp, &Token::generate(), LEASE)
                .await
                .unwrap();
            assert!(matches!(answer, Reservation::Existing(_)), "{answer:?}");
        }
        let records = store.records.lock().unwrap();
        assert_eq!(records.tools.held.len(), 1);
        let held = records.table.iter().next().unwrap();
        assert_eq!(held.tool.as_deref(), Some("tool"));
    }

    /// Ended counters leave the map once it has doubled since the last sweep.
    #[tokio::test]
    async fn ended_counters_are_swept() {
        let clock = Arc::new(ManualClock::new());
        let store = MemoryStore::with_clock(clock.clone());
        let window = Duration::from_secs(60);
        let key = |n: usize| RecordKey::new("shop", format!("k-{n}"));
        for n in 0..FIRST_SWEEP {
            store.count_failure(&key(n), window).await.unwrap();
        }
        let held = || store.failures.lock().unwrap().counts.len();
        assert_eq!(held(), FIRST_SWEEP);
        clock.advance(window);
        // The next count sweeps every ended one before it counts.
        assert_eq!(
            store
                .count_failure(&key(FIRST_SWEEP), window)
                .await
                .unwrap(),
            1
        );
        assert_eq!(held(), 1);
        assert_eq!(store.failures(&key(0)).await.unwrap(), 0);
    }
}
