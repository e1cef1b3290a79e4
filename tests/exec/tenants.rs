//! Status and replays per tenant: tenants neither replay nor read each other, and a replay read
//! from memory keeps retention and tenants.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{ManualClock, MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::billing;

use billing::{Billing, SendInvoiceScaled};

use super::recovery::{Ledger, RefundWithoutHook};
use super::{ctx, invoice};

#[tokio::test]
async fn status_moves_from_not_found_to_in_progress_to_completed_per_tenant() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoiceScaled)
        .build()
        .unwrap();
    let ctx = ctx();
    let key = json!({"customer": "acme", "period": "2026-10"});
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "in_progress");
    assert!(status.value["since"].is_string());
    assert!(toolbox.shutdown().await.is_clean());
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    let replay = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(status.value["result"], replay.value);
    assert!(status.value["completed_at"].is_string());
    let other = ToolContext::new("run-1").with_tenant("globex");
    let status = toolbox.call("invoice_status", key, &other).await.unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    assert_eq!(billing.count(), 1);
}

#[tokio::test]
async fn tenants_neither_replay_nor_read_each_other() {
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .build()
        .unwrap();
    let a = ToolContext::new("run").with_tenant("a");
    let b = ToolContext::new("run").with_tenant("b");
    let args = invoice("acme", "2026-10", 100.0, "October");
    assert!(
        !toolbox
            .call("send_invoice", args.clone(), &a)
            .await
            .unwrap()
            .replayed
    );
    assert!(
        !toolbox
            .call("send_invoice", args.clone(), &b)
            .await
            .unwrap()
            .replayed
    );
    assert!(
        toolbox
            .call("send_invoice", args, &a)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(billing.count(), 2);
}

/// Refund one order; its record is kept for an hour.
#[tool(
    idempotent(key = "refund:<order>"),
    name = "refund_kept",
    retain = "1h"
)]
async fn refund_kept(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.refunds.lock().unwrap().push(order.clone());
    Ok(format!("refund-of-{order}"))
}

/// A replay read from memory in the caller's task (the memory store's record, or the local
/// cache's) is the store's answer: within retention and the caller's tenant only, a `CONFLICT`
/// for other arguments, and a new run once the record has expired.
#[tokio::test]
async fn a_replay_from_memory_keeps_retention_and_tenants() {
    let clock = Arc::new(ManualClock::new());
    let memory = Arc::new(MemoryStore::with_clock(clock.clone()));
    let stores: Vec<(&str, Arc<dyn Store>)> = vec![
        ("memory", memory.clone()),
        (
            "cached",
            Arc::new(
                toolkey::store::CachedStore::new(MemoryStore::with_clock(clock.clone()), 1 << 20)
                    .with_clock(clock.clone()),
            ),
        ),
    ];
    for (name, store) in stores {
        let ledger = Arc::new(Ledger::default());
        let toolbox = Toolbox::builder()
            .shared_store(store)
            .shared_state(ledger.clone())
            .tool(RefundKept)
            .tool(RefundWithoutHook)
            .build()
            .unwrap();
        let refunds = || ledger.refunds.lock().unwrap().len();
        let call = |tenant: &str| {
            let ctx = ToolContext::new("run-1").with_tenant(tenant);
            let toolbox = &toolbox;
            async move {
                toolbox
                    .call("refund_kept", json!({"order": "o-1"}), &ctx)
                    .await
            }
        };
        assert!(!call("acme").await.unwrap().replayed, "{name}");
        for _ in 0..3 {
            let out = call("acme").await.unwrap();
            assert!(out.replayed, "{name}");
            assert_eq!(out.value, json!("refund-of-o-1"), "{name}");
        }
        assert_eq!(refunds(), 1, "{name}");
        // Another tenant's key is another record.
        assert!(!call("globex").await.unwrap().replayed, "{name}");
        assert_eq!(refunds(), 2, "{name}");
        // Another tool under the same key text is a CONFLICT, answered from memory as well.
        let err = toolbox
            .call(
                "refund_blind",
                json!({"order": "o-1"}),
                &ToolContext::new("run-1").with_tenant("acme"),
            )
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Conflict), "{name}: {err:?}");
        assert_eq!(refunds(), 2, "{name}");
        // Past its retention the record is gone: the call runs again, once.
        clock.advance(Duration::from_secs(3601));
        assert!(!call("acme").await.unwrap().replayed, "{name}");
        assert!(call("acme").await.unwrap().replayed, "{name}");
        assert_eq!(refunds(), 3, "{name}");
        let stats = toolbox.stats();
        assert_eq!(
            (stats.executed, stats.replayed, stats.conflicts),
            (3, 4, 1),
            "{name}"
        );
    }
}
