//! Approval requests: what a store keeps of a call that waits for a person, and the role a
//! store plays to keep it.
//!
//! ```text
//! absent, EXPIRED or USED ──open(revision n+1)──▶ PENDING{fingerprint, expires_at}
//! PENDING, before expires_at ──decide(revision)──▶ APPROVED | DENIED        (fenced by state)
//! PENDING, past expires_at ──▶ EXPIRED (judged at read time; never runs, never decided)
//! APPROVED ──use(revision)──▶ USED                  (a call without a key: one run per request)
//! ```
//!
//! Every request of one (tenant, tool, key) is kept under its own revision, so a decided,
//! expired or used request stays readable after a newer one opens. Writes are compare-and-set:
//! `open` writes revision n+1 only while n is the latest, `update` changes a request only while
//! it is in the state its writer read. The judgement (expired or not, who may decide) is made
//! once, above the stores, by the store's clock.

use std::fmt;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{from_millis, to_millis, StoreError};

/// Which approval requests: the tenant they belong to, the tool, and the key they are bound
/// to (a keyed tool's idempotency key; for a tool without a key, the fingerprint of the whole
/// arguments).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ApprovalKey {
    /// The tenant (`ctx.tenant`); requests of one tenant are invisible to every other.
    pub tenant: String,
    /// The tool's name.
    pub tool: String,
    /// The key the request is bound to.
    pub key: String,
}

impl ApprovalKey {
    /// An approval key for a tenant, a tool and a key.
    pub fn new(tenant: impl Into<String>, tool: impl Into<String>, key: impl Into<String>) -> Self {
        ApprovalKey {
            tenant: tenant.into(),
            tool: tool.into(),
            key: key.into(),
        }
    }
}

/// Where a request is, as stored. Expiry is not a stored state: a pending request past its
/// expiry is [expired](ApprovalStatus::Expired) when it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Nobody has decided yet.
    Pending,
    /// A person approved it.
    Approved,
    /// A person denied it.
    Denied,
    /// Approved, and its one call (of a tool without a key) has run.
    Used,
}

impl ApprovalState {
    /// The state as stores keep it: `pending`, `approved`, `denied`, `used`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Used => "used",
        }
    }

    /// The state a store's text names.
    pub fn parse(text: &str) -> Option<ApprovalState> {
        [
            ApprovalState::Pending,
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::Used,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
    }
}

/// Where a request is at a given time: its stored state, with a pending request past its
/// expiry read as expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Waiting for a person, before its expiry.
    Pending,
    /// Approved: its call may run.
    Approved,
    /// Denied: its call never runs.
    Denied,
    /// Nobody decided before its expiry: its call never runs.
    Expired,
    /// Approved, and its one call has run.
    Used,
}

impl fmt::Display for ApprovalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Used => "used",
        })
    }
}

/// Who asked: the call's run and, when the caller was authenticated, its principal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requester {
    /// The run id of the call (`ctx.run_id`).
    pub run_id: String,
    /// The authenticated principal the call came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// A person's decision on a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// True for approved, false for denied.
    pub approved: bool,
    /// Who decided, as the application or the operator named them.
    pub by: String,
    /// When, by the store's clock.
    #[serde(with = "millis")]
    pub at: SystemTime,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One approval request, as the store keeps it: bound to its tenant, tool, key and the
/// fingerprint of the call's arguments, with who asked, when it expires, and its decision.
/// Its times are kept to the millisecond.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Which requests this one is among.
    #[serde(flatten)]
    pub id: ApprovalKey,
    /// Its number among the requests of its key, from 1: a decision names it, so a decision
    /// made on what a person saw of an older request never applies to a newer one.
    pub revision: u64,
    /// The fingerprint of the arguments it covers, in hex: another fingerprint is never covered.
    pub fingerprint: String,
    /// The arguments as the model sent them, for the person who decides.
    pub arguments: Value,
    /// Who asked.
    pub requested_by: Requester,
    /// When, by the store's clock.
    #[serde(with = "millis")]
    pub requested_at: SystemTime,
    /// Until when a person may decide; past it, a pending request is expired.
    #[serde(with = "millis")]
    pub expires_at: SystemTime,
    /// Until when the store keeps it, decided or not.
    #[serde(with = "millis")]
    pub retain_until: SystemTime,
    /// Its stored state.
    pub state: ApprovalState,
    /// The decision, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// When its call ran, for a request that is used up.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "maybe_millis"
    )]
    pub used_at: Option<SystemTime>,
}

impl Approval {
    /// Where the request is at `now` (the store's clock).
    pub fn status(&self, now: SystemTime) -> ApprovalStatus {
        match self.state {
            ApprovalState::Pending if now >= self.expires_at => ApprovalStatus::Expired,
            ApprovalState::Pending => ApprovalStatus::Pending,
            ApprovalState::Approved => ApprovalStatus::Approved,
            ApprovalState::Denied => ApprovalStatus::Denied,
            ApprovalState::Used => ApprovalStatus::Used,
        }
    }

    /// The request as a store keeps it (JSON text).
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("an approval request serializes")
    }

    /// A request from the text [`to_stored`](Self::to_stored) wrote; [`StoreError::Corrupt`]
    /// for any other text.
    pub fn from_stored(text: &str) -> Result<Approval, StoreError> {
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
            tenant: String::new(),
            key: "(an approval request)".into(),
            detail: format!("an approval request cannot be read: {e}"),
        })
    }
}

/// A store's approval requests: kept beside the records, never touching one. One of the roles
/// of a [`Store`](super::Store).
///
/// Every method has a default that refuses with [`StoreError::Config`], for a store that keeps
/// no approvals (a tool that needs one then fails closed); every store in this crate keeps
/// them. What an implementation must guarantee:
///
/// - **Compare-and-set.** Of concurrent [`open_approval`](Self::open_approval)s of one revision,
///   exactly one writes; an [`update_approval`](Self::update_approval) applies only while the
///   request is in the state its caller read.
/// - **Nothing overwritten.** A revision once written is changed only by `update_approval`,
///   and never removed before its `retain_until`.
/// - **Tenants.** A request is visible only under its own tenant.
#[async_trait]
pub trait Approvals: Send + Sync + 'static {
    /// The latest request (highest revision) of `id`, if any.
    async fn latest_approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        let _ = id;
        Err(no_approvals())
    }

    /// Writes `request`, whose revision is one more than the latest of its key (1 for the
    /// first). False, writing nothing, when that is no longer so: another request opened first.
    async fn open_approval(&self, request: &Approval) -> Result<bool, StoreError> {
        let _ = request;
        Err(no_approvals())
    }

    /// Replaces the request of `request`'s key and revision with `request`, if it is still in
    /// the state `seen`. False, changing nothing, otherwise.
    async fn update_approval(
        &self,
        request: &Approval,
        seen: ApprovalState,
    ) -> Result<bool, StoreError> {
        let _ = (request, seen);
        Err(no_approvals())
    }

    /// The requests of `tenant` in the stored state `state` (every state when `None`), every
    /// revision, ordered by tool, key and revision; at most `limit`, after `after` (a request's
    /// key and revision, as the last of the previous page had them).
    async fn list_approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        after: Option<(&ApprovalKey, u64)>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let _ = (tenant, state, after, limit);
        Err(no_approvals())
    }
}

fn no_approvals() -> StoreError {
    StoreError::Config("this store does not keep approval requests".into())
}

/// True when `request` comes after `after` in a listing's order.
pub(crate) fn listed_after(request: &Approval, after: Option<(&ApprovalKey, u64)>) -> bool {
    match after {
        Some((id, revision)) => (&request.id, request.revision) > (id, revision),
        None => true,
    }
}

/// Times as milliseconds since the Unix epoch, as stores keep them.
mod millis {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(to_millis(*t))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<SystemTime, D::Error> {
        i64::deserialize(d).map(from_millis)
    }
}

mod maybe_millis {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        t: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_some(&to_millis(*t)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<i64>::deserialize(d).map(|t| t.map(from_millis))
    }
}
