//! The seed's five ways a model retries, on every store, and identical calls at once: each
//! executes once, and a duplicate that waits for the first is answered with its result.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};
use toolkey_tests::billing;

use billing::{Billing, SendInvoiceScaled};

use super::{ctx, invoice};

/// The seed's five ways, against any store.
async fn five_ways(store: Arc<dyn Store>) {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_store(store)
        .shared_state(billing.clone())
        .tool(SendInvoiceScaled)
        .build()
        .unwrap();
    let ctx = ctx();

    // 1. The billing call outlasts the timeout: TIMEOUT, retryable, naming the status tool.
    let first = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await;
    let err = first.unwrap_err();
    assert!(err.is(ErrorCode::Timeout), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.suggestion().unwrap().contains("invoice_status"));

    // 2. The model retries at once: the first call still runs.
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.suggestion().unwrap().contains("invoice_status"));

    // 3. After it finished, a retry with a reworded memo replays the first invoice.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let replay = toolbox
        .call(
            "send_invoice",
            invoice("ACME ", "2026-10", 100.0, "Invoice for October"),
            &ctx,
        )
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.value["memo"], "October");
    assert_eq!(replay.value["id"], "inv-1");

    // 4. Same key, other amount: CONFLICT, not a silent replay.
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 120.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert!(!err.is_retryable());

    // 5. Two simultaneous calls for another period: one TIMEOUT, one IN_PROGRESS.
    let (a, b) = tokio::join!(
        toolbox.call(
            "send_invoice",
            invoice("acme", "2026-11", 100.0, "November"),
            &ctx
        ),
        toolbox.call(
            "send_invoice",
            invoice("acme", "2026-11", 100.0, "November"),
            &ctx
        ),
    );
    let mut codes = vec![
        a.unwrap_err().code().to_string(),
        b.unwrap_err().code().to_string(),
    ];
    codes.sort();
    assert_eq!(codes, ["IN_PROGRESS", "TIMEOUT"]);

    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(billing.count(), 2, "exactly two invoices on the ledger");
    let stats = toolbox.stats();
    assert_eq!(
        (
            stats.executed,
            stats.replayed,
            stats.conflicts,
            stats.timeouts,
            stats.in_progress
        ),
        (2, 1, 1, 2, 2)
    );
}

#[tokio::test]
async fn five_ways_on_the_memory_store() {
    five_ways(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn five_ways_on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    five_ways(Arc::new(
        toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_concurrent_identical_calls_execute_once() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(50)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .build()
        .unwrap();
    let mut calls = Vec::new();
    for _ in 0..500 {
        let toolbox = toolbox.clone();
        calls.push(tokio::spawn(async move {
            toolbox
                .call(
                    "send_invoice",
                    invoice("acme", "2026-10", 100.0, "October"),
                    &ctx(),
                )
                .await
        }));
    }
    let (mut fresh, mut replays, mut in_progress) = (0, 0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(out) if out.replayed => replays += 1,
            Ok(_) => fresh += 1,
            Err(err) if err.is(ErrorCode::InProgress) => in_progress += 1,
            Err(err) => panic!("unexpected {err:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(fresh + replays + in_progress, 500);
    assert_eq!(billing.count(), 1);
    assert_eq!(toolbox.stats().executed, 1);
}

/// Sends the dunning letter; a duplicate waits for the first and replays it.
#[tool(idempotent(key = "dunning:<customer>", on_in_progress = "wait(2s)"))]
async fn send_dunning(billing: State<Billing>, customer: String) -> Result<String, ToolError> {
    Ok(billing.send(&customer, "dunning", 0.0, "").await.id)
}

#[tokio::test]
async fn on_in_progress_wait_replays_the_first_call() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(150)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendDunning)
        .build()
        .unwrap();
    let ctx = ctx();
    let (a, b) = tokio::join!(
        toolbox.call("send_dunning", json!({"customer": "acme"}), &ctx),
        toolbox.call("send_dunning", json!({"customer": "acme"}), &ctx),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.value, b.value);
    assert_eq!(a.replayed as u8 + b.replayed as u8, 1);
    assert_eq!(billing.count(), 1);
}
