//! A record as every store keeps it (states as text, times as milliseconds), judged against the
//! store's clock in one place, so the memory, SQLite, PostgreSQL and Redis stores read records
//! alike.

use super::{from_millis, Entry, EntryState, Outcome, Record, RecordKey, StoreError, Token};
use crate::Fingerprint;

/// The stored name of each state.
pub(crate) const IN_PROGRESS: &str = "in_progress";
pub(crate) const UNKNOWN: &str = "unknown";
pub(crate) const COMPLETED: &str = "completed";

/// What a store stores: durations are clamped to this before they are added to the clock, so a
/// `Duration::MAX` retention stays a time every store (and PostgreSQL's `timestamptz`) can hold.
/// A hundred years.
pub(crate) const MAX_SPAN_MS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `d` in whole milliseconds, clamped to [`MAX_SPAN_MS`].
pub(crate) fn span_ms(d: std::time::Duration) -> i64 {
    super::millis(d).min(MAX_SPAN_MS)
}

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

impl StoredRecord {
    /// A completed record past its retention: absent to `reserve` and `get`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.state == COMPLETED && self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }

    /// In progress with a lapsed lease, or marked unknown: nobody knows the outcome.
    pub fn stale(&self, now_ms: i64) -> bool {
        self.state == UNKNOWN || (self.state == IN_PROGRESS && self.lease_until_ms <= now_ms)
    }

    /// In progress under `token`: the only state in which a fenced write applies.
    pub fn held_by(&self, token: &Token) -> bool {
        self.state == IN_PROGRESS && self.token == token.as_str()
    }

    /// Unknown under `seen` at `now_ms`: the only record an operator may resolve.
    pub fn resolvable(&self, seen: &Token, now_ms: i64) -> bool {
        self.token == seen.as_str() && self.stale(now_ms)
    }

    /// The record as an operator lists it, at `now_ms` by the store's clock; `None` when it
    /// expired (absent to every call). Anything that does not read back is
    /// [`StoreError::Corrupt`].
    pub fn to_entry(&self, key: &RecordKey, now_ms: i64) -> Result<Option<Entry>, StoreError> {
        if self.expired(now_ms) {
            return Ok(None);
        }
        let record = self.to_record(key, now_ms)?;
        let (state, reported, outcome) = match record {
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
        Ok(Some(Entry {
            key: key.clone(),
            tool: self.tool.clone().filter(|t| !t.is_empty()),
            state,
            reported,
            fingerprint: record_fingerprint(&self.fingerprint, key)?,
            since: from_millis(self.since_ms),
            lease_until: (!finished).then(|| from_millis(self.lease_until_ms)),
            completed_at: self.completed_at_ms.map(from_millis),
            expires_at: self.expires_at_ms.map(from_millis),
            outcome,
            revision: Token::from_stored(self.token.clone()),
        }))
    }

    /// The record as the trait describes it, at `now_ms` by the store's clock. Anything that does
    /// not read back is [`StoreError::Corrupt`].
    pub fn to_record(&self, key: &RecordKey, now_ms: i64) -> Result<Record, StoreError> {
        let fingerprint = record_fingerprint(&self.fingerprint, key)?;
        let since = from_millis(self.since_ms);
        Ok(match self.state.as_str() {
            COMPLETED => {
                let text = self
                    .outcome
                    .as_deref()
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
            UNKNOWN => Record::Stale {
                token: Token::from_stored(self.token.clone()),
                fingerprint,
                since,
                reported: true,
            },
            IN_PROGRESS if self.lease_until_ms <= now_ms => Record::Stale {
                token: Token::from_stored(self.token.clone()),
                fingerprint,
                since,
                reported: false,
            },
            IN_PROGRESS => Record::InProgress {
                fingerprint,
                since,
                lease_until: from_millis(self.lease_until_ms),
            },
            other => return Err(StoreError::corrupt(key, format!("unknown state {other:?}"))),
        })
    }
}

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
        assert!(!row(COMPLETED).expired(29));
        assert!(row(COMPLETED).expired(30));
        assert!(!row(IN_PROGRESS).expired(30));
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
