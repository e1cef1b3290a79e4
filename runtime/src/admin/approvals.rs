//! Operators' and approvers' work on approval requests: list what waits, show one, decide.

use super::*;
use crate::store::{Approval, ApprovalKey, ApprovalState, ApprovalStatus, Decision};

/// How many times a decision reads and writes a request before it gives up on a store where
/// others keep deciding the same request first.
const ATTEMPTS: usize = 4;

/// Why a decision was refused: nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionRefused {
    /// No request of that tenant, tool and key has that revision.
    #[error("there is no approval request {revision} of this tool and key")]
    NotFound {
        /// The revision named.
        revision: u64,
    },
    /// The revision named is not the latest request of its key: what the person saw was
    /// replaced (it expired, or was used up, and a newer call opened another).
    #[error(
        "approval request {seen} is not the latest of its key: request {latest} is ({status}); \
         look at it before deciding"
    )]
    Stale {
        /// The revision named.
        seen: u64,
        /// The latest revision.
        latest: u64,
        /// Where the latest is.
        status: ApprovalStatus,
    },
    /// The request was decided already (or approved and used).
    #[error("approval request {revision} was already decided: it is {status}")]
    Decided {
        /// The revision named.
        revision: u64,
        /// Where it is.
        status: ApprovalStatus,
        /// The decision it has.
        decision: Option<Decision>,
    },
    /// Nobody decided the request before its expiry: it never runs, and can no longer be
    /// decided. The next call with the same arguments opens a new one.
    #[error("approval request {revision} expired before it was decided; the next call with the same arguments opens a new one")]
    Expired {
        /// The revision named.
        revision: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Admin {
    /// The latest approval request of `id`, decided or not.
    pub async fn approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        self.store.latest_approval(id).await
    }

    /// Up to `max` approval requests of `tenant`, every revision, ordered by tool, key and
    /// revision: those in the stored state `state`, or all when `None`. A pending request past
    /// its expiry is listed too ([`Approval::status`] says `expired`); [`pending`](Self::pending)
    /// leaves it out.
    pub async fn approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        max: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let mut found: Vec<Approval> = Vec::new();
        while found.len() < max {
            let after = found.last().map(|last| (&last.id, last.revision));
            let page = self
                .store
                .list_approvals(tenant, state, after, (max - found.len()).min(PAGE))
                .await?;
            if page.is_empty() {
                break;
            }
            found.extend(page);
        }
        Ok(found)
    }

    /// Up to `max` requests of `tenant` that wait for a decision now (pending, not expired).
    pub async fn pending(&self, tenant: &str, max: usize) -> Result<Vec<Approval>, StoreError> {
        let now = self.store.now().await?;
        let mut pending = self
            .approvals(tenant, Some(ApprovalState::Pending), usize::MAX)
            .await?;
        pending.retain(|request| request.status(now) == ApprovalStatus::Pending);
        pending.truncate(max);
        Ok(pending)
    }

    /// Approves request `revision` of `id`, as `by` (who decides, as the application names
    /// them), with an optional reason. The model's next call with the same arguments runs.
    ///
    /// Fenced on the revision, as [`resolve`](Self::resolve) is: refused, changing nothing,
    /// unless it is the latest request of its key, pending, and not expired by the store's
    /// clock. Of two decisions on one request, the first wins and the second is refused with
    /// the first's decision.
    pub async fn approve(
        &self,
        id: &ApprovalKey,
        revision: u64,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Approval, DecisionRefused> {
        self.decide(id, revision, true, by, reason).await
    }

    /// Denies request `revision` of `id`, as [`approve`](Self::approve) approves it. A denial
    /// is final: the call with those arguments is answered `APPROVAL_DENIED` from then on.
    pub async fn deny(
        &self,
        id: &ApprovalKey,
        revision: u64,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Approval, DecisionRefused> {
        self.decide(id, revision, false, by, reason).await
    }

    async fn decide(
        &self,
        id: &ApprovalKey,
        revision: u64,
        approved: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Approval, DecisionRefused> {
        for _ in 0..ATTEMPTS {
            let latest = self.store.latest_approval(id).await?;
            let now = self.store.now().await?;
            let held = match latest {
                Some(held) if held.revision == revision => held,
                Some(held) if held.revision > revision => {
                    return Err(DecisionRefused::Stale {
                        seen: revision,
                        latest: held.revision,
                        status: held.status(now),
                    })
                }
                _ => return Err(DecisionRefused::NotFound { revision }),
            };
            match held.status(now) {
                ApprovalStatus::Pending => {}
                ApprovalStatus::Expired => return Err(DecisionRefused::Expired { revision }),
                status => {
                    return Err(DecisionRefused::Decided {
                        revision,
                        status,
                        decision: held.decision,
                    })
                }
            }
            let mut decided = held;
            decided.state = match approved {
                true => ApprovalState::Approved,
                false => ApprovalState::Denied,
            };
            decided.decision = Some(Decision {
                approved,
                by: by.to_owned(),
                at: now,
                reason: reason.map(str::to_owned),
            });
            if self
                .store
                .update_approval(&decided, ApprovalState::Pending)
                .await?
            {
                tracing::info!(
                    tool = %id.tool,
                    key_hash = %crate::key::log_hash(&id.key),
                    revision,
                    approved,
                    "approval decided"
                );
                return Ok(decided);
            }
            // Another decision landed first: read it, and say so.
        }
        Err(StoreError::Unavailable(
            "the approval request kept changing while it was being decided".into(),
        )
        .into())
    }
}
