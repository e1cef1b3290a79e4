//! What a store keeps and answers: record keys, fencing tokens, outcomes, records, and the
//! errors of store operations.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::texts::{self, StoreFailure};
use crate::{Fingerprint, ToolError};

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
/// not copy them ([`Reservations::completed_here`](super::Reservations::completed_here): a
/// replay answered from memory builds no key).
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
pub(super) fn nesting(text: &str) -> usize {
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
        /// The token to name in [`Reservations::take_over`](super::Reservations::take_over).
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

/// The answer to [`Reservations::reserve`](super::Reservations::reserve).
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// The key was free (or its record had expired): the caller holds it, under the token it
    /// passed, and must run the work.
    Reserved {
        /// The token the caller passed, under which it now holds the key.
        token: Token,
        /// The failures counted for this key in a retry limit's window that has not ended (as
        /// [`FailureCounters::failures`](super::FailureCounters::failures) answers), read in the
        /// same step as the reservation: a call under a retry limit learns whether it may run
        /// without another round trip.
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
