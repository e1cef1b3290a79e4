//! What operators read and change: records listed with what they need to decide (the tool, the
//! state, the times, the outcome), and the fenced resolution of a record nobody can finish.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use super::{Outcome, RecordKey, StoreError, Token};
use crate::Fingerprint;

/// A record's state as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryState {
    /// A call holds the key and its lease is current: its body is running.
    InProgress,
    /// Nobody knows whether the work was done: its worker died (the lease lapsed) or its body
    /// said it could not tell. A model calling again is told to ask a person; an operator
    /// resolves it.
    Unknown,
    /// Finished with a result; a retry replays it.
    Completed,
    /// Finished with a terminal error; a retry replays the error.
    Failed,
}

impl EntryState {
    /// Every state, in the order listings show them.
    pub const ALL: [EntryState; 4] = [
        EntryState::InProgress,
        EntryState::Unknown,
        EntryState::Completed,
        EntryState::Failed,
    ];

    /// The state's name: `in_progress`, `unknown`, `completed` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::InProgress => "in_progress",
            EntryState::Unknown => "unknown",
            EntryState::Completed => "completed",
            EntryState::Failed => "failed",
        }
    }
}

impl fmt::Display for EntryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EntryState {
    type Err = String;

    /// ```
    /// use toolkey::store::EntryState;
    ///
    /// assert_eq!("unknown".parse::<EntryState>(), Ok(EntryState::Unknown));
    /// assert!("stuck".parse::<EntryState>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EntryState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown state `{s}`: expected one of: `in_progress`, `unknown`, \
                     `completed`, `failed`"
                )
            })
    }
}

/// One record, as [`OperatorCommands::list`](super::OperatorCommands::list) reads it for an
/// operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The record's tenant and key.
    pub key: RecordKey,
    /// The tool that reserved it (`send_invoice`), or a step of it (`send_invoice/email`);
    /// `None` for a record written before stores kept the tool's name.
    pub tool: Option<String>,
    /// What the record says, judged by the store's clock.
    pub state: EntryState,
    /// For an unknown record: true when the body reported that it could not tell whether it
    /// acted, false when its worker stopped renewing the lease (it died or hangs).
    pub reported: bool,
    /// The fingerprint of the call behind the record.
    pub fingerprint: Fingerprint,
    /// When the key was reserved (or last taken over).
    pub since: SystemTime,
    /// When the lease lapses (lapsed) unless renewed; `None` once the call finished.
    pub lease_until: Option<SystemTime>,
    /// When the call finished.
    pub completed_at: Option<SystemTime>,
    /// When a finished record expires.
    pub expires_at: Option<SystemTime>,
    /// The stored result or terminal error of a finished call.
    pub outcome: Option<Outcome>,
    /// The record's revision: the token of the reservation that wrote it last. It changes when
    /// anyone takes the record over, so
    /// [`OperatorCommands::resolve`](super::OperatorCommands::resolve) names it to refuse a
    /// record that changed since it was read.
    pub revision: Token,
}

/// Which records [`OperatorCommands::list`](super::OperatorCommands::list) returns. Every field
/// left `None` admits every record; expired records are never listed (they are absent to every
/// call).
///
/// ```
/// use std::time::Duration;
/// use toolkey::store::{EntryState, Filter};
///
/// let stuck = Filter {
///     tool: Some("send_invoice".into()),
///     state: Some(EntryState::Unknown),
///     older_than: Some(Duration::from_secs(600)),
///     ..Filter::default()
/// };
/// # let _ = stuck;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this tenant's records.
    pub tenant: Option<String>,
    /// Only records of this tool (or step: `send_invoice/email`).
    pub tool: Option<String>,
    /// Only records in this state.
    pub state: Option<EntryState>,
    /// Only records reserved at least this long ago.
    pub older_than: Option<Duration>,
    /// Only the record with exactly this key (within `tenant`, if given).
    pub key: Option<String>,
}

impl Filter {
    /// True when `entry` passes every condition, judged at `now` by the store's clock.
    pub fn admits(&self, entry: &Entry, now: SystemTime) -> bool {
        let old_enough = self.older_than.is_none_or(|age| {
            now.duration_since(entry.since)
                .is_ok_and(|elapsed| elapsed >= age)
        });
        self.tenant.as_ref().is_none_or(|t| *t == entry.key.tenant)
            && self.key.as_ref().is_none_or(|k| *k == entry.key.key)
            && self
                .tool
                .as_ref()
                .is_none_or(|t| entry.tool.as_ref() == Some(t))
            && self.state.is_none_or(|s| s == entry.state)
            && old_enough
    }
}

/// Where a listing goes on: opaque, handed back to the store that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor from a store's own text. Only stores make cursors.
    pub fn new(text: impl Into<String>) -> Cursor {
        Cursor(text.into())
    }

    /// The cursor's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A cursor that goes on after `key`, for stores that list in key order.
    pub(crate) fn after(key: &RecordKey) -> Cursor {
        Cursor(serde_json::to_string(&[&key.tenant, &key.key]).expect("strings serialize"))
    }

    /// The key a cursor made by [`Cursor::after`] goes on after.
    pub(crate) fn key(&self) -> Result<RecordKey, super::StoreError> {
        let [tenant, key]: [String; 2] = serde_json::from_str(&self.0).map_err(|_| {
            super::StoreError::Config(format!("not a cursor of this store: {:?}", self.0))
        })?;
        Ok(RecordKey::new(tenant, key))
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    /// The records of this page that the filter admits (possibly none: a page is bounded by the
    /// records the store looked at, not by the ones it found).
    pub entries: Vec<Entry>,
    /// Where the next page starts; `None` when the listing is complete.
    pub next: Option<Cursor>,
    /// Records of this page in the filter's tenant and key that could not be read: set aside,
    /// whatever the filter's state, tool or age (none of which can be read from them), so one
    /// corrupt record neither hides the others nor goes unseen.
    pub unreadable: Vec<Unreadable>,
}

impl Page {
    /// Adds what reading one record gave: an entry the filter admitted (`None`: not admitted,
    /// or expired), or a corrupt record, set aside. Any other error is the listing's.
    pub(crate) fn take(
        &mut self,
        read: Result<Option<Entry>, StoreError>,
    ) -> Result<(), StoreError> {
        match read {
            Ok(Some(entry)) => self.entries.push(entry),
            Ok(None) => {}
            Err(StoreError::Corrupt {
                tenant,
                key,
                detail,
            }) => self.unreadable.push(Unreadable {
                key: RecordKey::new(tenant, key),
                detail,
            }),
            Err(other) => return Err(other),
        }
        Ok(())
    }
}

/// A record that could not be read (a [`StoreError::Corrupt`] one), met by a listing. It is left
/// as it is, for a person to repair or delete; its `Display` names the key by a short hash.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Unreadable {
    /// The record's tenant and key.
    pub key: RecordKey,
    /// What could not be read.
    pub detail: String,
}

impl Unreadable {
    /// The error reading the record gave.
    pub fn to_error(&self) -> StoreError {
        StoreError::corrupt(&self.key, self.detail.clone())
    }
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_error().fmt(f)
    }
}

/// What an operator found out about a record whose outcome nobody knows.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The work was done: the record completes with this outcome, kept for `retain`, and a
    /// retry replays it.
    Done {
        /// The result (or terminal error) a retry will replay.
        outcome: Outcome,
        /// How long the record is kept.
        retain: Duration,
    },
    /// The work was not done: the record is absent to every call, and the next call runs it
    /// once. Should its worker have been alive after all and record its outcome before that
    /// call, the next call replays that outcome instead: an operator's finding never makes the
    /// work happen twice where doing nothing would not have.
    NotDone,
}
