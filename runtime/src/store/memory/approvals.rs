//! Approval requests, beside the records: every revision of every key, in key order.

use std::collections::BTreeMap;

use super::*;
use crate::store::{listed_after, Approval, ApprovalKey, ApprovalState, Approvals};

/// Each key's requests, oldest revision first (revision n at index n - 1).
pub(super) type Requests = BTreeMap<ApprovalKey, Vec<Approval>>;

impl MemoryStore {
    fn approvals(&self) -> std::sync::MutexGuard<'_, Requests> {
        self.approvals.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Approvals for MemoryStore {
    async fn latest_approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        Ok(self.approvals().get(id).and_then(|all| all.last().cloned()))
    }

    async fn open_approval(&self, request: &Approval) -> Result<bool, StoreError> {
        let mut approvals = self.approvals();
        let all = approvals.entry(request.id.clone()).or_default();
        if all.len() as u64 + 1 != request.revision {
            return Ok(false);
        }
        all.push(request.clone());
        Ok(true)
    }

    async fn update_approval(
        &self,
        request: &Approval,
        seen: ApprovalState,
    ) -> Result<bool, StoreError> {
        let mut approvals = self.approvals();
        let held = approvals.get_mut(&request.id).and_then(|all| {
            let at = usize::try_from(request.revision).ok()?.checked_sub(1)?;
            all.get_mut(at)
        });
        match held {
            Some(held) if held.state == seen => {
                *held = request.clone();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        after: Option<(&ApprovalKey, u64)>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let approvals = self.approvals();
        Ok(approvals
            .iter()
            .filter(|(id, _)| id.tenant == tenant)
            .flat_map(|(_, all)| all.iter())
            .filter(|request| state.is_none_or(|state| request.state == state))
            .filter(|request| listed_after(request, after))
            .take(limit)
            .cloned()
            .collect())
    }
}
