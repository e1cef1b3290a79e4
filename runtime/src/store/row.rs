//! A record as every store keeps it (states as text, times as milliseconds), judged against the
//! store's clock in one place, so the memory, SQLite, PostgreSQL and Redis stores read records
//! alike.

use super::{from_millis, Entry, EntryState, Outcome, Record, RecordKey, StoreError, Token};
use crate::Fingerprint;

/// The stored name of each state.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) const IN_PROGRESS: &str = "in_progress";
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) const UNKNOWN: &str = "unknown";
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) const COMPLETED: &str = "completed";
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) const NOT_DONE: &str = "not_done";

/// What a store stores: durations are clamped to this before they are added to the clock, so a
/// `Duration::MAX` retention stays a time every store (and PostgreSQL's `timestamptz`) can hold.
/// A hundred years.
pub(crate) const MAX_SPAN_MS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `d` in whole milliseconds, clamped to [`MAX_SPAN_MS`].
pub(crate) fn span_ms(d: std::time::Duration) -> i64 {
    super::millis(d).min(MAX_SPAN_MS)
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
/// One stored row, read as it is: nothing is parsed until [`StoredRecord::to_record`].
#[derive(Debug, Clone)]
pub(crate) struct StoredRecord {
    /// The tool (or `tool/step`) that reserved it; `None` in records written before stores
    /// kept it (schema version 1).
    pub tool: Option<String>,
    pub state: String,
    pub token: String,
    pub fingerprint: String,
    pub since_ms: i64,
    pub lease_until_ms: i64,
    pub outcome: Option<String>,
    pub completed_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
impl StoredRecord {
    /// A completed record past its retention, or one an operator resolved as not done: absent
    /// to `reserve`, `get` and listings.
    pub fn absent(&self, now_ms: i64) -> bool {
        self.state == NOT_DONE
            || (self.state == COMPLETED && self.expires_at_ms.is_some_and(|at| at <= now_ms))
    }

    /// The row's fields, its state and fingerprint read back: [`StoreError::Corrupt`] when
    /// either does not.
    fn fields(&self, key: &RecordKey) -> Result<Fields<'_>, StoreError> {
        let state = match self.state.as_str() {
            IN_PROGRESS => State::InProgress,
            UNKNOWN => State::Unknown,
            COMPLETED => State::Completed,
            NOT_DONE => State::NotDone,
            other => return Err(StoreError::corrupt(key, format!("unknown state {other:?}"))),
        };
        Ok(Fields {
            tool: self.tool.as_deref(),
            state,
            token: &self.token,
            fingerprint: record_fingerprint(&self.fingerprint, key)?,
            since_ms: self.since_ms,
            lease_until_ms: self.lease_until_ms,
            outcome: self.outcome.as_deref(),
            completed_at_ms: self.completed_at_ms,
            expires_at_ms: self.expires_at_ms,
        })
    }

    /// The record as an operator lists it, at `now_ms` by the store's clock; `None` when it
    /// is [absent](Self::absent) to every call. Anything that does not read back is
    /// [`StoreError::Corrupt`].
    pub fn to_entry(&self, key: &RecordKey, now_ms: i64) -> Result<Option<Entry>, StoreError> {
        if self.absent(now_ms) {
            return Ok(None);
        }
        self.fields(key)?.to_entry(key, now_ms).map(Some)
    }

    /// The record as the trait describes it, at `now_ms` by the store's clock. Anything that does
    /// not read back is [`StoreError::Corrupt`].
    pub fn to_record(&self, key: &RecordKey, now_ms: i64) -> Result<Record, StoreError> {
        self.fields(key)?.to_record(key, now_ms)
    }
}

/// A record's state, as the stores' texts name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    InProgress,
    Unknown,
    Completed,
    /// An operator resolved the stale record as not done: absent to every call, and kept under
    /// its holder's token only so that the holder, if it was alive after all, still records
    /// what it did (a fenced write finds it as it would find its reservation).
    NotDone,
}

/// A record's fields, borrowed from whatever holds them (a row read from a server, or the
/// memory store's own compact record), judged in one place.
pub(crate) struct Fields<'a> {
    pub tool: Option<&'a str>,
    pub state: State,
    pub token: &'a str,
    pub fingerprint: Fingerprint,
    pub since_ms: i64,
    pub lease_until_ms: i64,
    pub outcome: Option<&'a str>,
    pub completed_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
}

impl Fields<'_> {
    /// The record as the trait describes it, at `now_ms`.
    pub fn to_record(&self, key: &RecordKey, now_ms: i64) -> Result<Record, StoreError> {
        let (fingerprint, since) = (self.fingerprint, from_millis(self.since_ms));
        Ok(match self.state {
            State::Completed => {
                let text = self
                    .outcome
                    .ok_or_else(|| StoreError::corrupt(key, "completed record without outcome"))?;
                let (Some(completed_at), Some(expires_at)) =
                    (self.completed_at_ms, self.expires_at_ms)
                else {
                    return Err(StoreError::corrupt(
                        key,
                        "completed record without its times",
                    ));
                };
                Record::Completed {
                    fingerprint,
                    outcome: Outcome::from_stored(key, text)?,
                    completed_at: from_millis(completed_at),
                    expires_at: from_millis(expires_at),
                }
            }
            State::Unknown => Record::Stale {
                token: Token::from_stored(self.token),
                fingerprint,
                since,
                reported: true,
            },
            State::InProgress if self.lease_until_ms <= now_ms => Record::Stale {
                token: Token::from_stored(self.token),
                fingerprint,
                since,
                reported: false,
            },
            State::InProgress => Record::InProgress {
                fingerprint,
                since,
                lease_until: from_millis(self.lease_until_ms),
            },
            // Every read leaves it out first, as absent.
            State::NotDone => {
                return Err(StoreError::corrupt(
                    key,
                    "a record resolved as not done was read as present",
                ))
            }
        })
    }

    /// The record as an operator lists it, at `now_ms` (the caller has left expired ones out).
    pub fn to_entry(&self, key: &RecordKey, now_ms: i64) -> Result<Entry, StoreError> {
        let (state, reported, outcome) = match self.to_record(key, now_ms)? {
            Record::InProgress { .. } => (EntryState::InProgress, false, None),
            Record::Stale { reported, .. } => (EntryState::Unknown, reported, None),
            Record::Completed { outcome, .. } => {
                let state = match outcome {
                    Outcome::Ok(_) => EntryState::Completed,
                    Outcome::Err(_) => EntryState::Failed,
                };
                (state, false, Some(outcome))
            }
        };
        let finished = outcome.is_some();
        Ok(Entry {
            key: key.clone(),
            tool: self.tool.filter(|t| !t.is_empty()).map(str::to_owned),
            state,
            reported,
            fingerprint: self.fingerprint,
            since: from_millis(self.since_ms),
            lease_until: (!finished).then(|| from_millis(self.lease_until_ms)),
            completed_at: self.completed_at_ms.map(from_millis),
            expires_at: self.expires_at_ms.map(from_millis),
            outcome,
            revision: Token::from_stored(self.token),
        })
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
fn record_fingerprint(hex: &str, key: &RecordKey) -> Result<Fingerprint, StoreError> {
    Fingerprint::from_hex(hex).map_err(|e| StoreError::corrupt(key, format!("fingerprint: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(state: &str) -> StoredRecord {
        StoredRecord {
            tool: Some("tool".into()),
            state: state.into(),
            token: "t".into(),
            fingerprint: Fingerprint::of(&json!(1)).unwrap().to_hex(),
            since_ms: 10,
            lease_until_ms: 20,
            outcome: Some(Outcome::Ok(json!(null)).to_stored()),
            completed_at_ms: Some(15),
            expires_at_ms: Some(30),
        }
    }

    fn key() -> RecordKey {
        RecordKey::new("t", "k")
    }

    #[test]
    fn leases_and_retention_are_judged_at_now() {
        assert!(matches!(
            row(IN_PROGRESS).to_record(&key(), 19),
            Ok(Record::InProgress { .. })
        ));
        assert!(matches!(
            row(IN_PROGRESS).to_record(&key(), 20),
            Ok(Record::Stale {
                reported: false,
                ..
            })
        ));
        assert!(matches!(
            row(UNKNOWN).to_record(&key(), 0),
            Ok(Record::Stale { reported: true, .. })
        ));
        assert!(!row(COMPLETED).absent(29));
        assert!(row(COMPLETED).absent(30));
        assert!(!row(IN_PROGRESS).absent(30));
        assert!(row(NOT_DONE).absent(0));
    }

    #[test]
    fn unreadable_rows_are_corrupt() {
        let mut bad_fp = row(IN_PROGRESS);
        bad_fp.fingerprint = "zz".into();
        let mut bad_state = row(IN_PROGRESS);
        bad_state.state = "done".into();
        let mut bad_outcome = row(COMPLETED);
        bad_outcome.outcome = Some("{not json".into());
        let mut no_times = row(COMPLETED);
        no_times.expires_at_ms = None;
        for r in [bad_fp, bad_state, bad_outcome, no_times] {
            assert!(matches!(
                r.to_record(&key(), 0),
                Err(StoreError::Corrupt { .. })
            ));
        }
    }
}
