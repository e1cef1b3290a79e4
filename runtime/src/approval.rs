//! Approvals: which calls wait for a person, and the request a call opens, finds or uses up
//! before it may run.
//!
//! A call needs approval when its tool says so (`#[tool(..., approval)]`) or a rule of the
//! toolbox says so for its arguments ([`ToolboxBuilder::require_approval`]). Its first call
//! records a request bound to the tenant, the tool, the key and the fingerprint of its
//! arguments, runs nothing, and is answered `AWAITING_APPROVAL`; the toolbox's hooks
//! ([`ToolboxBuilder::on_approval_request`]) hear of it once. A person decides through
//! [`Admin`](crate::admin::Admin) or the `toolkey` command. The model's next call with the same
//! arguments then runs, if it was approved, or is answered `APPROVAL_DENIED`.
//!
//! The toolbox does not run a call on approval: its body needs the calling process's state
//! and context, and its result must reach the model. The model's call after the decision runs
//! it, and the key makes that once: later calls replay it.
//!
//! - A keyed call's request is bound to its idempotency key. A call with other arguments under
//!   that key is never covered: it is answered `CONFLICT`, naming the request. An approval
//!   admits one run of its key: once that run's record has gone (the key's retention after the
//!   decision), the same arguments are new work and need a new request.
//! - A call without a key (`unkeyed`, `natural`) is bound to the fingerprint of its whole
//!   arguments. An approved request admits one call and is then used up: the next call with
//!   the same arguments opens a new request.
//! - A request nobody decided before its expiry never runs: the next call opens a new one,
//!   under the next revision.
//!
//! [`ToolboxBuilder::require_approval`]: crate::ToolboxBuilder::require_approval
//! [`ToolboxBuilder::on_approval_request`]: crate::ToolboxBuilder::on_approval_request

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::store::{
    Approval, ApprovalKey, ApprovalState, ApprovalStatus, RecordKey, Requester, Store, StoreError,
};
use crate::texts;
use crate::tool::ToolDefinition;
use crate::{ToolContext, ToolError};

/// How long a request waits for a decision when the toolbox sets nothing: a day, since the
/// person who decides is often not at their desk when the model asks.
pub const DEFAULT_APPROVAL_EXPIRY: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request is kept after its expiry, decided or not, when the toolbox sets nothing:
/// 30 days, for audit.
pub const DEFAULT_APPROVAL_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A toolbox rule: true when a call of the tool named with these arguments needs approval.
pub(crate) type Rule = Arc<dyn Fn(&str, &Value) -> bool + Send + Sync>;

/// A toolbox hook: told once of every request a call records.
pub(crate) type Hook = Arc<dyn Fn(&Approval) + Send + Sync>;

/// What a toolbox's calls need to meet their approvals.
#[derive(Clone)]
pub(crate) struct Gate {
    pub(crate) rules: Vec<Rule>,
    pub(crate) hooks: Vec<Hook>,
    pub(crate) expiry: Duration,
    pub(crate) retention: Duration,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            rules: Vec::new(),
            hooks: Vec::new(),
            expiry: DEFAULT_APPROVAL_EXPIRY,
            retention: DEFAULT_APPROVAL_RETENTION,
        }
    }
}

/// What a call's request is bound to.
pub(crate) struct Bound<'a> {
    /// The idempotency key, or for a call without one the fingerprint of its whole arguments.
    pub(crate) key: &'a str,
    /// The fingerprint, in hex.
    pub(crate) fingerprint: String,
    /// True for a call without a key: an approval admits one call, then is used up.
    pub(crate) once: bool,
}

/// How many times a call reads and writes its request before it gives up on a store where
/// others keep writing the same key first (each loss is another call's progress).
const ATTEMPTS: usize = 4;

impl Gate {
    /// True when a call of `def` with `args` (as the model sent them, known valid) needs
    /// approval.
    pub(crate) fn needs(&self, def: &ToolDefinition, args: &Value) -> bool {
        def.settings.approval || self.rules.iter().any(|rule| rule(&def.name, args))
    }

    /// Admits a call bound to `bound`, or answers it: `AWAITING_APPROVAL` (a request opened
    /// now, or still open), `APPROVAL_DENIED`, or `CONFLICT` (a request of other arguments
    /// under the same key). Nothing runs before it admits.
    pub(crate) async fn admit(
        &self,
        store: &dyn Store,
        def: &ToolDefinition,
        bound: Bound<'_>,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<(), ToolError> {
        let id = ApprovalKey::new(ctx.scope(), def.name.as_str(), bound.key);
        for _ in 0..ATTEMPTS {
            let latest = store.latest_approval(&id).await.map_err(refused)?;
            // The store's clock, read only when expiry matters: an open request, or a new one.
            let now = match &latest {
                Some(held) if held.state != ApprovalState::Pending => None,
                _ => Some(store.now().await.map_err(refused)?),
            };
            let status = |held: &Approval| match now {
                Some(now) => held.status(now),
                None => held.status(SystemTime::UNIX_EPOCH),
            };
            let next = match &latest {
                Some(held) if held.fingerprint != bound.fingerprint => match status(held) {
                    status @ (ApprovalStatus::Pending
                    | ApprovalStatus::Approved
                    | ApprovalStatus::Denied) => {
                        return Err(texts::approval_conflict(
                            def.named(),
                            held.revision,
                            &status.to_string(),
                        ))
                    }
                    ApprovalStatus::Expired | ApprovalStatus::Used => held.revision + 1,
                },
                Some(held) => match status(held) {
                    ApprovalStatus::Approved if !bound.once => {
                        // An approval admits one run of its key. A run begins after the
                        // decision, so its record lives past the decision plus the key's
                        // retention: before then, a call is that run, its retry or its replay.
                        // After, only a live record of the key lets a call through (its
                        // replay); with none, the run is over and the call needs a new request.
                        let decided = held.decision.as_ref().map_or(held.requested_at, |d| d.at);
                        let now = store.now().await.map_err(refused)?;
                        if now < decided + def.settings.retain {
                            return Ok(());
                        }
                        let rkey = RecordKey::new(ctx.scope(), bound.key);
                        if store.get(&rkey).await.map_err(refused)?.is_some() {
                            return Ok(());
                        }
                        held.revision + 1
                    }
                    ApprovalStatus::Approved => {
                        // Used up before the body runs: a body that fails does not make the
                        // approval good for a second run.
                        let mut used = held.clone();
                        used.state = ApprovalState::Used;
                        used.used_at = Some(store.now().await.map_err(refused)?);
                        if store
                            .update_approval(&used, ApprovalState::Approved)
                            .await
                            .map_err(refused)?
                        {
                            return Ok(());
                        }
                        // Another call used it first: read again.
                        continue;
                    }
                    ApprovalStatus::Denied => {
                        return Err(texts::approval_denied(def.named(), held.revision))
                    }
                    ApprovalStatus::Pending => {
                        return Err(texts::awaiting_approval(
                            def.named(),
                            held.revision,
                            held.expires_at,
                        ))
                    }
                    ApprovalStatus::Expired | ApprovalStatus::Used => held.revision + 1,
                },
                None => 1,
            };
            let now = match now {
                Some(now) => now,
                None => store.now().await.map_err(refused)?,
            };
            let request = self.request(id.clone(), next, &bound, args, ctx, now);
            if !store.open_approval(&request).await.map_err(refused)? {
                // Another call opened this revision first: read it.
                continue;
            }
            tracing::info!(
                tool = %def.name,
                revision = request.revision,
                "approval requested"
            );
            for hook in &self.hooks {
                // A hook that panics must not cost the call its answer: the request is
                // recorded, and a person can still find it.
                let told =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&request)));
                if told.is_err() {
                    tracing::error!(tool = %def.name, "an approval request hook panicked");
                }
            }
            return Err(texts::awaiting_approval(
                def.named(),
                request.revision,
                request.expires_at,
            ));
        }
        Err(StoreError::Unavailable(
            "approval requests of this key kept changing while the call read them".into(),
        )
        .refusal())
    }

    /// A new request of `id` at `revision`, opened at `now` (the store's clock).
    fn request(
        &self,
        id: ApprovalKey,
        revision: u64,
        bound: &Bound<'_>,
        args: &Value,
        ctx: &ToolContext,
        now: SystemTime,
    ) -> Approval {
        let expires_at = now + self.expiry;
        Approval {
            id,
            revision,
            fingerprint: bound.fingerprint.clone(),
            arguments: args.clone(),
            requested_by: Requester {
                run_id: ctx.run_id().to_owned(),
                principal: None,
            },
            requested_at: now,
            expires_at,
            retain_until: expires_at + self.retention,
            state: ApprovalState::Pending,
            decision: None,
            used_at: None,
        }
    }
}

fn refused(err: StoreError) -> ToolError {
    err.refusal()
}
