//! Checks of approval requests: revisions opened one at a time, decisions compare-and-set,
//! every revision kept and listed in order, tenants apart, records untouched.

use std::time::SystemTime;

use super::*;
use crate::store::{Approval, ApprovalKey, ApprovalState, Decision, Requester};

fn request(id: &ApprovalKey, revision: u64, fingerprint: &Fingerprint) -> Approval {
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
    Approval {
        id: id.clone(),
        revision,
        fingerprint: fingerprint.to_hex(),
        arguments: json!({"order": "o-1", "amount": "150.00", "note": "ünïcode \"quoted\""}),
        requested_by: Requester {
            run_id: "run-1".into(),
            principal: Some("agent@example.com".into()),
        },
        requested_at: now,
        expires_at: now + Duration::from_secs(3600),
        // In the future (a store may drop a request past it), and to the millisecond, as
        // stores keep time.
        retain_until: crate::store::from_millis(crate::store::to_millis(
            SystemTime::now() + Duration::from_secs(3600),
        )),
        state: ApprovalState::Pending,
        decision: None,
        used_at: None,
    }
}

fn decided(request: &Approval, approved: bool) -> Approval {
    let mut decided = request.clone();
    decided.state = match approved {
        true => ApprovalState::Approved,
        false => ApprovalState::Denied,
    };
    decided.decision = Some(Decision {
        approved,
        by: "ops@example.com".into(),
        at: request.requested_at + Duration::from_secs(60),
        reason: Some("checked with the customer".into()),
    });
    decided
}

impl Ctx {
    fn approval_key(&self, name: &str) -> ApprovalKey {
        ApprovalKey::new(self.tenant.clone(), "refund", format!("conformance:{name}"))
    }
}

pub(super) async fn approvals_open_one_revision_at_a_time(cx: Ctx) -> Result<(), String> {
    let id = cx.approval_key("open");
    let store = &cx.store;
    ensure(
        store.latest_approval(&id).await.map_err(err)?.is_none(),
        || "a key without requests has a latest one".into(),
    )?;
    let first = request(&id, 1, &fp(1));
    ensure(store.open_approval(&first).await.map_err(err)?, || {
        "the first revision of a new key was not written".into()
    })?;
    ensure(!store.open_approval(&first).await.map_err(err)?, || {
        "revision 1 was written twice".into()
    })?;
    ensure(
        !store
            .open_approval(&request(&id, 3, &fp(3)))
            .await
            .map_err(err)?,
        || "revision 3 was written while revision 1 was the latest".into(),
    )?;
    let latest = store.latest_approval(&id).await.map_err(err)?;
    ensure(latest.as_ref() == Some(&first), || {
        format!("the latest request read {latest:?}, not the one written: {first:?}")
    })?;
    let second = request(&id, 2, &fp(2));
    ensure(store.open_approval(&second).await.map_err(err)?, || {
        "revision 2 was not written after revision 1".into()
    })?;
    let latest = store.latest_approval(&id).await.map_err(err)?;
    ensure(latest.as_ref() == Some(&second), || {
        format!("the latest request read {latest:?}, not revision 2")
    })?;
    let all = store
        .list_approvals(&cx.tenant, None, None, 10)
        .await
        .map_err(err)?;
    ensure(all == [first, second], || {
        format!("the tenant's requests listed {all:?}, expected revisions 1 and 2 as written")
    })
}

pub(super) async fn concurrent_opens_of_one_revision_write_once(cx: Ctx) -> Result<(), String> {
    let id = cx.approval_key("open-race");
    let mut tasks = Vec::new();
    for n in 0..16 {
        let (store, request) = (cx.store.clone(), request(&id, 1, &fp(n)));
        tasks.push(tokio::spawn(
            async move { store.open_approval(&request).await },
        ));
    }
    let mut written = 0;
    for task in tasks {
        written += usize::from(task.await.map_err(|e| e.to_string())?.map_err(err)?);
    }
    ensure(written == 1, || {
        format!("16 concurrent opens of revision 1 wrote {written} times, expected once")
    })
}

pub(super) async fn a_decision_applies_only_from_the_state_read(cx: Ctx) -> Result<(), String> {
    let id = cx.approval_key("decide");
    let store = &cx.store;
    let pending = request(&id, 1, &fp(1));
    ensure(store.open_approval(&pending).await.map_err(err)?, || {
        "revision 1 was not written".into()
    })?;
    // Two people decide at once: exactly one decision lands.
    let (store_a, approve) = (store.clone(), decided(&pending, true));
    let (store_b, deny) = (store.clone(), decided(&pending, false));
    let (a, b) = tokio::join!(
        tokio::spawn(async move {
            store_a
                .update_approval(&approve, ApprovalState::Pending)
                .await
        }),
        tokio::spawn(async move { store_b.update_approval(&deny, ApprovalState::Pending).await }),
    );
    let a = a.map_err(|e| e.to_string())?.map_err(err)?;
    let b = b.map_err(|e| e.to_string())?.map_err(err)?;
    ensure(a != b, || {
        format!("two decisions on one pending request: approve landed {a}, deny landed {b}")
    })?;
    let held = store.latest_approval(&id).await.map_err(err)?;
    let expected = decided(&pending, a);
    ensure(held.as_ref() == Some(&expected), || {
        format!("the request read {held:?}, not the decision that landed: {expected:?}")
    })?;
    // A write from a state the request is no longer in changes nothing.
    let again = decided(&pending, !a);
    ensure(
        !store
            .update_approval(&again, ApprovalState::Pending)
            .await
            .map_err(err)?,
        || "a decided request was decided again".into(),
    )?;
    let mut used = expected.clone();
    used.state = ApprovalState::Used;
    used.used_at = Some(expected.requested_at + Duration::from_secs(120));
    let from = expected.state;
    ensure(
        store.update_approval(&used, from).await.map_err(err)?,
        || format!("a request in state {from:?} was not updated from it"),
    )?;
    let missing = request(&id, 7, &fp(1));
    ensure(
        !store
            .update_approval(&missing, ApprovalState::Pending)
            .await
            .map_err(err)?,
        || "a revision that was never opened was updated".into(),
    )?;
    let held = store.latest_approval(&id).await.map_err(err)?;
    ensure(held.as_ref() == Some(&used), || {
        format!("the request read {held:?}, not {used:?}")
    })
}

pub(super) async fn approvals_are_listed_in_order_per_tenant(cx: Ctx) -> Result<(), String> {
    let store = &cx.store;
    // Written out of order, across tools and keys; one decided.
    let ids = [
        ApprovalKey::new(cx.tenant.clone(), "wire", "conformance:b"),
        ApprovalKey::new(cx.tenant.clone(), "refund", "conformance:b"),
        ApprovalKey::new(cx.tenant.clone(), "refund", "conformance:a:x"),
    ];
    for id in &ids {
        ensure(
            store
                .open_approval(&request(id, 1, &fp(1)))
                .await
                .map_err(err)?,
            || format!("{id:?} was not opened"),
        )?;
    }
    let denied = decided(&request(&ids[0], 1, &fp(1)), false);
    ensure(
        store
            .update_approval(&denied, ApprovalState::Pending)
            .await
            .map_err(err)?,
        || "a pending request was not denied".into(),
    )?;
    let listed = |state, after: Option<(&ApprovalKey, u64)>, limit| {
        let store = store.clone();
        let tenant = cx.tenant.clone();
        let after = after.map(|(id, revision)| (id.clone(), revision));
        async move {
            let after = after.as_ref().map(|(id, revision)| (id, *revision));
            store
                .list_approvals(&tenant, state, after, limit)
                .await
                .map(|all| {
                    all.into_iter()
                        .map(|r| r.id.key.clone() + "@" + &r.id.tool)
                        .collect::<Vec<_>>()
                })
                .map_err(err)
        }
    };
    let all = listed(None, None, 10).await?;
    let order = [
        "conformance:a:x@refund",
        "conformance:b@refund",
        "conformance:b@wire",
    ];
    ensure(all == order, || {
        format!("listed {all:?}, expected by tool, then key: {order:?}")
    })?;
    let first = listed(None, None, 1).await?;
    let rest = listed(None, Some((&ids[2], 1)), 10).await?;
    ensure(first == order[..1] && rest == order[1..], || {
        format!("pages of 1 then the rest listed {first:?} and {rest:?}")
    })?;
    let pending = listed(Some(ApprovalState::Pending), None, 10).await?;
    ensure(pending == order[..2], || {
        format!(
            "pending requests listed {pending:?}, the denied one left out: {:?}",
            &order[..2]
        )
    })?;
    let lookalike = format!("{}-other", cx.tenant);
    let other = store
        .list_approvals(&lookalike, None, None, 10)
        .await
        .map_err(err)?;
    let read = store
        .latest_approval(&ApprovalKey::new(lookalike, "refund", "conformance:b"))
        .await
        .map_err(err)?;
    ensure(other.is_empty() && read.is_none(), || {
        format!("another tenant saw this tenant's requests: {other:?}, {read:?}")
    })
}

pub(super) async fn approvals_never_touch_a_record(cx: Ctx) -> Result<(), String> {
    let key = cx.key("approved-record");
    let token = cx.reserve(&key, &fp(1), cx.long()).await?;
    let before = cx.store.get(&key).await.map_err(err)?;
    let id = ApprovalKey::new(key.tenant.clone(), "tool", key.key.clone());
    let pending = request(&id, 1, &fp(1));
    ensure(cx.store.open_approval(&pending).await.map_err(err)?, || {
        "the request was not opened".into()
    })?;
    ensure(
        cx.store
            .update_approval(&decided(&pending, true), ApprovalState::Pending)
            .await
            .map_err(err)?,
        || "the request was not approved".into(),
    )?;
    let after = cx.store.get(&key).await.map_err(err)?;
    ensure(before == after, || {
        format!("an approval request changed the record of its key: {before:?} became {after:?}")
    })?;
    ensure(cx.store.release(&key, &token).await.map_err(err)?, || {
        "the record's holder could not release it after its key's approval".into()
    })
}

/// A name given to an operator's command is not checked as a tool's is: tool `a:b` with key `c`
/// and tool `a` with key `b:c` are two requests, however a store joins the parts.
pub(super) async fn a_tool_and_key_split_elsewhere_are_another_request(
    cx: Ctx,
) -> Result<(), String> {
    let store = &cx.store;
    let one = ApprovalKey::new(cx.tenant.clone(), "refund:conformance", "split");
    let other = ApprovalKey::new(cx.tenant.clone(), "refund", "conformance:split");
    ensure(
        store
            .open_approval(&request(&one, 1, &fp(1)))
            .await
            .map_err(err)?,
        || "the first request was not written".into(),
    )?;
    let found = store.latest_approval(&other).await.map_err(err)?;
    ensure(found.is_none(), || {
        format!("tool `refund` key `conformance:split` read another tool's request: {found:?}")
    })?;
    ensure(
        store
            .open_approval(&request(&other, 1, &fp(2)))
            .await
            .map_err(err)?,
        || "a request was refused because another tool's request shares its joined name".into(),
    )?;
    let read = store.latest_approval(&one).await.map_err(err)?;
    ensure(
        read.is_some_and(|r| r.id == one && r.fingerprint == fp(1).to_hex()),
        || "the first request changed when the second was written".into(),
    )
}
