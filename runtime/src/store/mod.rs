//! Stores: where keys are reserved, outcomes recorded, and races settled.
//!
//! Every store implements one state machine:
//!
//! ```text
//! absent ──reserve(key, tool, fp, lease)──▶ IN_PROGRESS{token, fp, lease_until}
//! IN_PROGRESS ──complete(token, outcome)──▶ COMPLETED{outcome, fp, expires_at}   (fenced by token)
//! IN_PROGRESS ──release(token)──▶ absent                                         (fenced by token)
//! IN_PROGRESS ──renew(token)──▶ IN_PROGRESS (lease extended)
//! IN_PROGRESS ──mark_unknown(token)──▶ UNKNOWN (the body could not tell whether it acted)
//! IN_PROGRESS, lease passed, or UNKNOWN ──▶ STALE ──take_over(token)──▶ IN_PROGRESS{new token}
//! STALE ──resolve(seen token, Done(outcome))──▶ COMPLETED                        (an operator)
//! STALE ──resolve(seen token, NotDone)──▶ NOT_DONE: absent to every call, and    (an operator)
//!   until another call reserves the key, its holder's fenced writes still apply as to IN_PROGRESS
//! COMPLETED, past retention ──▶ absent (a later reserve starts a new action)
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::texts::{self, StoreFailure};
use crate::{Fingerprint, ToolError};

mod admin;
mod cache;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod conformance;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod faults;
mod forward;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod row;
#[cfg(feature = "sqlite")]
mod sqlite;

#[doc(inline)]
pub use crate::__store_forward as forward;
pub use admin::{Cursor, Entry, EntryState, Filter, Page, Resolution, Unreadable};
pub use cache::CachedStore;
pub use memory::{Clock, ManualClock, MemoryStore, SystemClock};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;

/// Which record: the tenant it belongs to and the normalized key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// The tenant (`ctx.tenant`); records of one tenant are invisible to every other.
    pub tenant: String,
    /// The normalized idempotency key.
    pub key: String,
}

impl RecordKey {
    /// A record key for a tenant and a key.
    pub fn new(tenant: impl Into<String>, key: impl Into<String>) -> Self {
        RecordKey {
            tenant: tenant.into(),
            key: key.into(),
        }
    }

    /// The same key, borrowed.
    pub fn borrowed(&self) -> RecordKeyRef<'_> {
        RecordKeyRef {
            tenant: &self.tenant,
            key: &self.key,
        }
    }
}

/// A [`RecordKey`] borrowed from wherever its tenant and key are held, for a lookup that should
/// not copy them ([`Reservations::completed_here`]: a replay answered from memory builds no key).
///
/// It hashes as the [`RecordKey`] it names does.
///
/// ```
/// use toolkey::store::{RecordKey, RecordKeyRef};
///
/// let owned = RecordKey::new("acme-corp", "invoice:acme:2026-11");
/// let borrowed = RecordKeyRef::new("acme-corp", "invoice:acme:2026-11");
/// assert_eq!(owned.borrowed(), borrowed);
/// assert_eq!(RecordKey::from(borrowed), owned);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordKeyRef<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The normalized idempotency key.
    pub key: &'a str,
}

impl<'a> RecordKeyRef<'a> {
    /// A borrowed record key for a tenant and a key.
    pub fn new(tenant: &'a str, key: &'a str) -> Self {
        RecordKeyRef { tenant, key }
    }
}

impl From<RecordKeyRef<'_>> for RecordKey {
    fn from(key: RecordKeyRef<'_>) -> RecordKey {
        RecordKey::new(key.tenant, key.key)
    }
}

/// The fencing token of one reservation: only its holder may complete, release, renew or mark it.
///
/// A token is shared, not copied: a clone (a store handing back the token it was given, a
/// renewal holding it) costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(Arc<str>);

impl Token {
    /// A new token, unique across processes and machines: a random 128-bit prefix drawn once
    /// per process, then a counter (fencing needs uniqueness, and a system call per token
    /// would be the largest cost of a reservation in memory).
    pub fn generate() -> Token {
        static PREFIX: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let prefix = PREFIX.get_or_init(|| {
            let mut prefix = [0; 32];
            uuid::Uuid::new_v4().simple().encode_lower(&mut prefix);
            prefix
        });
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // `<prefix>-<n in lowercase hex>`, spelled on the stack and allocated once.
        let mut text = [0; 32 + 1 + 16];
        text[..32].copy_from_slice(prefix);
        text[32] = b'-';
        let digits = spell_hex(n, (&mut text[33..]).try_into().expect("16 places"));
        let text = std::str::from_utf8(&text[..33 + digits]).expect("a token is ASCII");
        Token(Arc::from(text))
    }

    /// A token as a store keeps it.
    pub fn from_stored(text: impl Into<String>) -> Token {
        Token(text.into().into())
    }

    /// The token's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Writes `n` in lowercase hex, without leading zeros, at the start of `buf`, and says how many
/// digits it took: by hand, since `format!` cost more than the rest of a token.
fn spell_hex(n: u64, buf: &mut [u8; 16]) -> usize {
    let digits = ((64 - n.leading_zeros()).div_ceil(4).max(1)) as usize;
    for (i, place) in buf[..digits].iter_mut().enumerate() {
        let digit = ((n >> ((digits - 1 - i) * 4)) & 0xf) as u8;
        *place = if digit < 10 {
            b'0' + digit
        } else {
            b'a' + digit - 10
        };
    }
    digits
}

/// What a finished call ended in: a result of any shape, or a terminal error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool's result, `null`, `0`, `false` and `{}` included.
    Ok(Value),
    /// A terminal (non-retryable) error, replayed like a result.
    Err(ToolError),
}

impl Outcome {
    /// The outcome as stored text.
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("an outcome always serializes")
    }

    /// Reads stored text back; text that is not an outcome is [`StoreError::Corrupt`].
    pub fn from_stored(key: &RecordKey, text: &str) -> Result<Outcome, StoreError> {
        // A result as `to_stored` writes it, `{"ok":<result>}`, is read as its result alone:
        // reading the enum around it cost every replay about 250 instructions. The text is that
        // object exactly when what lies between is one value, so anything else (an error, text
        // another writer spaced or got wrong) is read in full.
        if let Some(result) = text
            .strip_prefix(r#"{"ok":"#)
            .and_then(|rest| rest.strip_suffix('}'))
        {
            if let Ok(result) = serde_json::from_str(result) {
                return Ok(Outcome::Ok(result));
            }
        }
        if let Ok(outcome) = serde_json::from_str(text) {
            return Ok(outcome);
        }
        // serde_json reads 128 levels at most, which a result the first call answered may pass:
        // it must replay, not read as corrupt.
        let read = if nesting(text) > MAX_RESULT_DEPTH + 1 {
            Err(format!(
                "outcome: nested deeper than a result may be ({MAX_RESULT_DEPTH} levels)"
            ))
        } else {
            Outcome::read_deep(text).map_err(|e| format!("outcome: {e}"))
        };
        read.map_err(|problem| StoreError::corrupt(key, problem))
    }

    /// Reads stored text past serde_json's 128 levels. serde_json stops there to keep its
    /// recursion from running off the end of the stack; this reading grows the stack as it
    /// goes instead (serde_stacker), so it never overflows it, however small the thread's. It
    /// reads what the bounded reading reads, and deeper text too.
    fn read_deep(text: &str) -> Result<Outcome, serde_json::Error> {
        let mut reader = serde_json::Deserializer::from_str(text);
        reader.disable_recursion_limit();
        let outcome = Outcome::deserialize(serde_stacker::Deserializer::new(&mut reader))?;
        reader.end()?;
        Ok(outcome)
    }
}

/// How many levels of arrays and objects a tool's (or a step's, or a recover hook's) result may
/// nest. A result nested deeper is never recorded: the work was done, so its outcome is kept as
/// unknown, as that of a result that cannot be serialized is, and answered `OUTCOME_UNKNOWN`
/// (never repeat it; with a recover hook, a retry asks the hook first). A stored outcome nested
/// deeper is read as corrupt. Far deeper than a result means to be; shallow enough that reading one
/// back, and dropping it, stays well inside a thread's stack.
pub const MAX_RESULT_DEPTH: usize = 4_096;

/// How many levels of arrays and objects `text` opens at its deepest, reading strings as
/// strings: an upper bound on what a JSON reader would descend through, whether or not the text
/// is JSON.
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// True when `value` nests more than `levels` levels of arrays and objects (a scalar nests none,
/// `[]` one). It looks no deeper than that.
pub(crate) fn nests_deeper(value: &Value, levels: usize) -> bool {
    // Every first call's result comes through here, so a scalar inside is passed over without a
    // call of its own: for the call bench's three-field result that took the walk from 170
    // instructions to 100.
    let deeper = |inner: &Value| {
        matches!(inner, Value::Array(_) | Value::Object(_)) && nests_deeper(inner, levels - 1)
    };
    match value {
        Value::Array(items) => levels == 0 || items.iter().any(deeper),
        Value::Object(map) => levels == 0 || map.values().any(deeper),
        _ => false,
    }
}

/// A record as a store reads it, judged by the store's clock.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A call holds the key and its lease is current.
    InProgress {
        /// The fingerprint of the call that holds the key.
        fingerprint: Fingerprint,
        /// When it reserved the key.
        since: SystemTime,
        /// When its lease lapses unless renewed.
        lease_until: SystemTime,
    },
    /// The key's holder let its lease lapse (it crashed or hangs), or its body said it could not
    /// tell whether it acted. Nobody knows the outcome.
    Stale {
        /// The token to name in [`Reservations::take_over`].
        token: Token,
        /// The fingerprint of the call that held the key.
        fingerprint: Fingerprint,
        /// When it reserved the key.
        since: SystemTime,
        /// True when the body itself reported an unknown outcome (not a lapsed lease).
        reported: bool,
    },
    /// The call finished; its outcome is kept until `expires_at`.
    Completed {
        /// The fingerprint of the call that finished.
        fingerprint: Fingerprint,
        /// Its result or terminal error.
        outcome: Outcome,
        /// When it finished.
        completed_at: SystemTime,
        /// When the record is purged (checked at read time).
        expires_at: SystemTime,
    },
}

impl Record {
    /// The fingerprint of the call behind the record.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Record::InProgress { fingerprint, .. }
            | Record::Stale { fingerprint, .. }
            | Record::Completed { fingerprint, .. } => fingerprint,
        }
    }
}

/// The answer to [`Reservations::reserve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// The key was free (or its record had expired): the caller holds it, under the token it
    /// passed, and must run the work.
    Reserved {
        /// The token the caller passed, under which it now holds the key.
        token: Token,
        /// The failures counted for this key in a retry limit's window that has not ended (as
        /// [`FailureCounters::failures`] answers), read in the same step as the reservation: a
        /// call under a retry limit learns whether it may run without another round trip.
        failures: u64,
    },
    /// The key was taken; this is its record.
    Existing(Record),
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or did not answer. Nothing was read; a write whose answer
    /// was lost on the way back may still have been applied (a reserve may hold the key under
    /// the caller's token: releasing that token frees it).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store is configured wrongly: a bad table name or connection URL, or records written
    /// by a newer toolkey. Retrying does not help; a person must fix the configuration.
    #[error("store misconfigured: {0}")]
    Config(String),
    /// A stored record could not be read. It is left as it is: never overwritten, never re-run.
    /// Its message names the key by a short hash, since keys carry argument values.
    #[error("corrupt record (key hash {}) of tenant {tenant:?}: {detail}", crate::key::log_hash(.key))]
    Corrupt {
        /// The record's tenant.
        tenant: String,
        /// The record's key.
        key: String,
        /// What could not be read.
        detail: String,
    },
}

impl StoreError {
    /// A corrupt-record error for `key`.
    pub fn corrupt(key: &RecordKey, detail: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            tenant: key.tenant.clone(),
            key: key.key.clone(),
            detail: detail.into(),
        }
    }

    /// An unavailable-store error from any error.
    pub fn unavailable(err: impl fmt::Display) -> StoreError {
        StoreError::Unavailable(err.to_string())
    }

    /// The answer to a call this error stopped before its tool ran.
    pub(crate) fn refusal(self) -> ToolError {
        texts::store_error(self.failure(), &self.to_string())
    }

    /// The answer to a call this error stopped before its step `step` ran; `per_call`: the tool
    /// is keyed on its place in the run (a new call would not replay the steps before).
    pub(crate) fn step_refusal(self, step: &str, per_call: bool) -> ToolError {
        texts::step_store_error(step, self.failure(), &self.to_string(), per_call)
    }

    fn failure(&self) -> StoreFailure {
        match self {
            StoreError::Unavailable(_) => StoreFailure::Unreachable,
            StoreError::Config(_) => StoreFailure::Misconfigured,
            StoreError::Corrupt { .. } => StoreFailure::Corrupt,
        }
    }
}

/// Where keys are reserved and outcomes recorded: a store in all three of its roles.
///
/// A store plays three roles, each a trait of its own, split by who uses it:
///
/// - [`Reservations`], the call path: every keyed call reserves, completes, releases, renews,
///   marks unknown, takes over and reads records through it.
/// - [`OperatorCommands`]: what an operator (through [`Admin`](crate::admin::Admin) and the
///   `toolkey` command) lists, resolves and purges, and the store's clock they judge by.
/// - [`FailureCounters`]: the counters retry limits keep beside the records.
///
/// `Store` is every type that implements the three, and what a toolbox holds
/// (`Arc<dyn Store>`): implement the roles, never `Store` itself. A wrapper implements by hand
/// only the roles it changes, and hands the others on with [`forward!`](crate::store::forward):
/// [`CachedStore`] changes the call path alone.
///
/// # What an implementation must guarantee
///
/// - **Atomic reserve.** Of any number of concurrent `reserve` calls for one absent key — from
///   tasks, processes or machines — exactly one gets [`Reservation::Reserved`]; the store's own
///   primitive settles it (a unique constraint, `SET NX`, a compare-and-swap under a lock), never
///   a read followed by a write.
/// - **The caller's token.** `reserve` holds the key under the token its caller passed, so a
///   caller whose reply was lost can release what it may have reserved.
/// - **Fencing.** `complete`, `release`, `renew` and `mark_unknown` apply only while the record is
///   in progress under the given token, or was resolved as not done while that token held it
///   and no call has reserved the key since (a renewal takes it back in progress), and return
///   `false` (changing nothing) otherwise.
///   `take_over` succeeds for exactly one caller naming the stale record's token.
/// - **The store's clock.** Leases, staleness and retention are judged by one clock for all
///   workers: the server's where there is one.
/// - **Expiry at read time.** A completed record past its retention is absent to `reserve` and
///   `get`, whether or not it was purged yet.
/// - **Tenants.** A record is visible only under its own tenant.
/// - **Every outcome round-trips**, `null`, `0`, `false`, `{}` and errors included, and every
///   float to the last bit: a store that keeps [`Outcome::to_stored`]'s text as it is and reads
///   it with [`Outcome::from_stored`] does.
/// - **Corruption is loud.** A record that cannot be read is [`StoreError::Corrupt`], never
///   treated as absent.
/// - **Fail closed.** When the store cannot be reached, `reserve` returns
///   [`StoreError::Unavailable`] and the caller does not run the work.
/// - **Failure counters** (for retry limits) live beside the records and never read or change
///   one. `count_failure` is atomic: of any number of concurrent counts for one key, each gets
///   its own number. A counter's window starts at its first failure, is judged by the store's
///   clock, and ends by itself: a store removes ended counters without being asked (a TTL, or a
///   sweep when it counts), and reads an ended one as zero. `reserve` reads the key's counter
///   in the same step as it reserves, so a first run costs no extra round trip for it.
///
/// The `conformance` module (feature `testing`) checks all of this against any implementation.
pub trait Store: Reservations + OperatorCommands + FailureCounters {}

impl<S: Reservations + OperatorCommands + FailureCounters + ?Sized> Store for S {}

/// A store's call path: what every keyed call does with its record, from reserving the key to
/// settling it. One of the three roles of a [`Store`], whose docs say what every implementation
/// must guarantee.
#[async_trait]
pub trait Reservations: Send + Sync + 'static {
    /// Reserves `key` for a call of `tool` with `fingerprint` under `token`, holding it for
    /// `lease`; or returns the existing record. A completed record past its retention counts as
    /// absent and is replaced.
    ///
    /// The caller draws the token ([`Token::generate`]) before it asks, so that when the reply is
    /// lost it still knows the token a reservation may have been written under, and can release
    /// it: "nothing was done" stays true and the key stays usable. `tool` (the tool's name, or
    /// `tool/step` for a step) is kept for operators' listings only. A reservation carries the
    /// key's failure count (see [`Reservation::Reserved`]).
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError>;

    /// Records the outcome of the reservation `token`, kept for `retain`. False if the token no
    /// longer holds the record.
    ///
    /// Sent again after its answer was lost, it finds the record completed under `token` with
    /// the same outcome and answers true, as the first did (and changes nothing). That is the one
    /// way a caller tells its own write from another holder's: a call that took the key over
    /// after the lease lapsed holds another token, even when its result is the same (the
    /// caller then answers `LEASE_LOST`, never a plain success).
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError>;

    /// Deletes the reservation `token` (a retryable failure: the next call runs again).
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError>;

    /// Extends the lease of reservation `token` to `lease` from now.
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError>;

    /// Marks reservation `token` as unknown: its body could not tell whether it acted.
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError>;

    /// Takes over a stale record whose token is `stale`, under a new token and lease. `None`
    /// when the record is not stale under that token (another worker took it, or it finished).
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError>;

    /// Reads a record, as status answers need it.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// The completed record of `key`, if this store holds it in this process's memory and can
    /// read it without waiting: a replay answered from it makes no round trip, and runs in its
    /// caller's task. `None` (what the trait does by default) when it holds none or cannot tell
    /// without asking; the call then [reserves](Self::reserve) as usual. A record past its
    /// retention is never returned.
    ///
    /// Only completed records are asked for: their outcome is final, so one read here is the
    /// record `reserve` would return.
    fn completed_here(&self, key: RecordKeyRef<'_>) -> Option<Record> {
        let _ = key;
        None
    }
}

/// A store's operator commands: listing records, resolving those nobody knows the outcome of,
/// purging expired ones, and the clock they are judged by. Calls never use them. One of the
/// three roles of a [`Store`].
#[async_trait]
pub trait OperatorCommands: Send + Sync + 'static {
    /// Deletes at most `limit` completed records past their retention; returns how many. Call
    /// it again while it returns `limit`: small batches keep every call's answer quick while it
    /// runs.
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError>;

    /// The store's clock.
    async fn now(&self) -> Result<SystemTime, StoreError>;

    /// One page of the records `filter` admits, after `cursor` (from the start when `None`),
    /// looking at about `limit` records. Operators' listings; calls never use it.
    ///
    /// The default refuses with [`StoreError::Config`], for a store that keeps no listing;
    /// every store in this crate lists.
    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let _ = (filter, cursor, limit);
        Err(StoreError::Config(
            "this store does not list records for operators".into(),
        ))
    }

    /// Resolves a record whose outcome nobody knows, as an operator found it: done with an
    /// outcome, or not done. Fenced twice: it applies only while the record is still under the
    /// revision `seen` (as [`Entry::revision`] showed it) **and** still unknown (marked unknown,
    /// or its lease lapsed) by the store's clock. False, changing nothing, otherwise: the record
    /// was taken over, finished, renewed by a worker that was alive after all, or is gone.
    ///
    /// Resolved as not done, the record is absent to every call (the next one reserves the key
    /// and runs), but is kept under its holder's token until then: a holder that was alive
    /// after all still records its outcome, renews, marks it unknown or releases it, exactly
    /// as it would have without the operator, so the next call replays what it did instead of
    /// doing it again. Purging leaves such a record alone; the next reserve replaces it.
    ///
    /// The default refuses with [`StoreError::Config`], like [`OperatorCommands::list`].
    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let _ = (key, seen, resolution);
        Err(StoreError::Config(
            "this store does not resolve records for operators".into(),
        ))
    }
}

/// A store's failure counters, for retry limits: kept beside the records, never touching one.
/// One of the three roles of a [`Store`].
#[async_trait]
pub trait FailureCounters: Send + Sync + 'static {
    /// Counts one retryable failure of the call `key` names, and returns how many were counted
    /// in the current window, this one included. The first failure opens a window of `window`;
    /// later failures within it add to the count without moving its end; once it ended, the
    /// next failure opens a new window at 1.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError>;

    /// How many failures of `key` were counted in a window that has not ended; 0 when none.
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError>;

    /// Forgets the failures counted for `key`: the call succeeded.
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError>;
}

/// Milliseconds since the Unix epoch, as stores keep times.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The time `ms` milliseconds after the Unix epoch.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    if ms >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A shared store is a store: the same records through every handle. Each operation hands on
/// the future of the store itself: written as `async fn`s, each would box that (already boxed)
/// future again, an allocation more per operation for every caller that holds its store in an
/// `Arc`.
impl<S: Reservations + ?Sized> Reservations for Arc<S> {
    forward!(Reservations, |shared| &**shared);
}

impl<S: OperatorCommands + ?Sized> OperatorCommands for Arc<S> {
    forward!(OperatorCommands, |shared| &**shared);
}

impl<S: FailureCounters + ?Sized> FailureCounters for Arc<S> {
    forward!(FailureCounters, |shared| &**shared);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A borrowed key hashes as its owned key does under the standard hashers, and converts
    /// back to it.
    #[test]
    fn a_borrowed_record_key_hashes_as_the_owned_one() {
        use std::hash::BuildHasher;
        let pairs = [
            ("acme", "invoice:acme:2026-11"),
            ("ab", "c"),
            ("a", "bc"),
            ("", ""),
        ];
        let hashers = (
            std::collections::hash_map::RandomState::new(),
            hashbrown::DefaultHashBuilder::default(),
        );
        for (tenant, key) in pairs {
            let owned = RecordKey::new(tenant, key);
            let borrowed = owned.borrowed();
            assert_eq!(borrowed, RecordKeyRef::new(tenant, key));
            assert_eq!(RecordKey::from(borrowed), owned);
            assert_eq!(hashers.0.hash_one(&owned), hashers.0.hash_one(borrowed));
            assert_eq!(hashers.1.hash_one(&owned), hashers.1.hash_one(borrowed));
        }
    }

    /// A result's stored text is read by a shorter way than the full one: both must agree on
    /// every text, those `to_stored` writes and those it never would.
    #[test]
    fn stored_outcomes_read_as_the_full_reading_does() {
        let key = RecordKey::new("t", "k");
        let full = |text: &str| serde_json::from_str::<Outcome>(text).ok();
        let written = [
            Outcome::Ok(json!(7)),
            Outcome::Ok(json!(null)),
            Outcome::Ok(json!("}")),
            Outcome::Ok(json!("{\"ok\":1}")),
            Outcome::Ok(json!({"id": 0, "customer": "acme", "amount": 100.0, "z": [1, {}]})),
            Outcome::Ok(json!({"ok": {"ok": 1}})),
            Outcome::Err(ToolError::new("CARD_DECLINED", "declined").with_retryable(false)),
        ];
        for outcome in written {
            let text = outcome.to_stored();
            assert_eq!(
                Outcome::from_stored(&key, &text).ok(),
                Some(outcome),
                "{text}"
            );
        }
        let odd = [
            r#"{"ok": 1 }"#,
            r#"{"ok":1} "#,
            r#" {"ok":1}"#,
            r#"{"ok":1}}"#,
            r#"{"ok":1}{"ok":2}"#,
            r#"{"ok":1,"err":{"code":"X","message":"m","retryable":false}}"#,
            r#"{"ok":}"#,
            r#"{"ok":{}"#,
            r#"{"ok":"a\"}"#,
            r#"{"ok":"}"#,
            r#"{"ok":[1,2}"#,
            r#"{"ok":1]}"#,
            r#"{"ok":nul}"#,
            r#"{"ok""#,
            r#"{"ok":"#,
            "",
            "{not json",
        ];
        for text in odd {
            assert_eq!(Outcome::from_stored(&key, text).ok(), full(text), "{text}");
        }
    }

    /// A float in a result reads back as the very number written: a replay and a status answer
    /// show the result the first call answered, not a neighbour one unit in the last place
    /// away (what serde_json reads for these without its `float_roundtrip` feature).
    #[test]
    fn a_float_result_reads_back_as_the_same_number() {
        let key = RecordKey::new("t", "k");
        let floats = [
            117.633_311_394_000_17,
            0.921_568_632_125_854_5,
            10_587.436_593_658_975,
            1.577_777_777_777_000_1,
            0.1 + 0.2,
            5e-324,
            f64::MAX,
            -2.225_073_858_507_201e-308,
        ];
        for float in floats {
            for result in [
                json!(float),
                json!({"amount": float, "rates": [float, 1.5]}),
            ] {
                let text = Outcome::Ok(result.clone()).to_stored();
                let Ok(Outcome::Ok(read)) = Outcome::from_stored(&key, &text) else {
                    panic!("{text} did not read back");
                };
                let bits = |value: &Value| {
                    let number = value.get("amount").unwrap_or(value);
                    number.as_f64().map(f64::to_bits)
                };
                assert_eq!(bits(&read), Some(float.to_bits()), "{text}");
                assert_eq!(read, result, "{text}");
            }
        }
    }

    /// serde_json reads 128 levels at most; a result nested deeper is written all the same, and
    /// must read back, by every store, for its replays and status answers to tell the truth.
    #[test]
    fn a_result_past_serde_jsons_limit_reads_back() {
        let key = RecordKey::new("t", "k");
        let nested = |depth: usize| {
            let mut value = json!(1);
            for level in 0..depth {
                value = if level % 2 == 0 {
                    Value::Array(vec![value])
                } else {
                    Value::Object([("next".to_string(), value)].into_iter().collect())
                };
            }
            value
        };
        // At the limit, a level past it (the whole text refused, its result not), and far past.
        for depth in [126, 127, 128, 1_000] {
            let outcome = Outcome::Ok(nested(depth));
            let text = outcome.to_stored();
            assert_eq!(
                Outcome::from_stored(&key, &text).ok(),
                Some(outcome),
                "{depth}"
            );
        }
        assert!(serde_json::from_str::<Outcome>(&Outcome::Ok(nested(127)).to_stored()).is_err());
    }

    /// A result as deep as a result may be is read back on a thread with a test thread's
    /// stack (2 MiB), as is text that deep cut short; deeper text is refused as corrupt before
    /// it is read. Read a frame per level, as serde_json reads when its limit is lifted, the
    /// first two overflow that stack in a debug build.
    #[test]
    fn deep_text_is_read_without_overflowing_the_stack() {
        let depth = MAX_RESULT_DEPTH;
        let read = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let key = RecordKey::new("t", "k");
                let whole = format!(r#"{{"ok":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
                let Ok(Outcome::Ok(value)) = Outcome::from_stored(&key, &whole) else {
                    return Err(format!("{depth} levels did not read back"));
                };
                if nests_deeper(&value, depth - 1) && !nests_deeper(&value, depth) {
                    drop(value);
                } else {
                    return Err("the value read is not as deep as the text".into());
                }
                let cut = format!(r#"{{"ok":{}1"#, "[".repeat(depth));
                let deeper = format!(
                    r#"{{"ok":{}1{}}}"#,
                    "[".repeat(depth + 1),
                    "]".repeat(depth + 1)
                );
                let refused = |text: &str| {
                    matches!(
                        Outcome::from_stored(&key, text),
                        Err(StoreError::Corrupt { .. })
                    )
                };
                if !refused(&cut) || !refused(&deeper) {
                    return Err("text cut short or too deep was read".into());
                }
                Ok(())
            })
            .unwrap()
            .join()
            .expect("the reading overflowed its stack");
        assert_eq!(read, Ok(()));
    }

    #[test]
    fn nesting_counts_arrays_and_objects_not_what_strings_hold() {
        for (text, levels) in [
            ("1", 0),
            ("[]", 1),
            (r#"{"a":[{}],"b":[]}"#, 3),
            (r#"["[[[", "\"[[", "\\", []]"#, 2),
            (r#""{""#, 0),
            ("]]]][", 1),
        ] {
            assert_eq!(nesting(text), levels, "{text}");
        }
    }

    #[test]
    fn tokens_are_spelled_as_format_would() {
        for n in [
            0,
            1,
            9,
            10,
            15,
            16,
            255,
            4096,
            0xdead_beef,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut buf = [0; 16];
            let digits = spell_hex(n, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..digits]), Ok(&*format!("{n:x}")));
        }
        assert_ne!(Token::generate(), Token::generate());
        let token = Token::generate();
        let (prefix, n) = token
            .as_str()
            .split_once('-')
            .expect("a prefix, then a counter");
        assert_eq!(prefix.len(), 32);
        assert!(prefix
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert!(u64::from_str_radix(n, 16).is_ok());
    }
}
