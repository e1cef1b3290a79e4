// Every key the attribute accepts, inside `idempotent(...)` and beside it.
use std::time::Duration;

use toolkey::{tool, RetryLimit, Story, Tool, ToolError};

/// Refunds an order.
#[tool(
    idempotent(
        key = "refund:<order>",
        status = "refund_state",
        hash = true,
        recover = find_refund,
        on_in_progress = "wait(2s)",
        destructive = false,
    ),
    timeout = "200ms",
    lease = "5m",
    retain = "7d",
    retry_limit = "3/15m",
    concurrency = 2,
    name = "refund_order",
    description = "Refunds one order, once."
)]
async fn refund(order: String, amount_cents: i64) -> Result<String, ToolError> {
    Ok(format!("refund of {amount_cents} for {order}"))
}

/// Looks in the payment provider for a refund of the order.
async fn find_refund(order: String, amount_cents: i64) -> Result<Option<String>, ToolError> {
    let _ = (order, amount_cents);
    Ok(None)
}

/// Cancels a subscription.
#[tool(idempotent(key = "cancel:<subscription>", status = false, on_in_progress = "reject"), timeout = "1s")]
async fn cancel(subscription: String) -> Result<(), ToolError> {
    let _ = subscription;
    Ok(())
}

/// Tells whether an export is ready; a retryable `NOT_READY` is how it says "not yet".
#[tool(read_only, retry_limit = "off")]
async fn export_ready(export: String) -> Result<bool, ToolError> {
    let _ = export;
    Ok(true)
}

fn main() {
    let def = Refund.definition();
    assert_eq!(def.name(), "refund_order");
    assert_eq!(def.description(), "Refunds one order, once.");
    assert_eq!(def.story(), Story::Idempotent);
    assert!(!def.annotations().destructive);
    assert_eq!(def.status_tool(), Some("refund_state"));
    let settings = def.settings();
    assert_eq!(settings.timeout, Some(Duration::from_millis(200)));
    assert_eq!(settings.lease, Duration::from_secs(5 * 60));
    assert_eq!(settings.retain, Duration::from_secs(7 * 24 * 60 * 60));
    assert_eq!(settings.wait_in_progress, Some(Duration::from_secs(2)));
    assert_eq!(
        settings.retry_limit,
        RetryLimit::after(3, Duration::from_secs(15 * 60))
    );
    assert_eq!(settings.concurrency.map(|n| n.get()), Some(2));
    assert_eq!(Refund.status_companion().map(|_| ()), Some(()));

    let def = Cancel.definition();
    assert_eq!(def.status_tool(), None);
    assert!(Cancel.status_companion().is_none());
    assert_eq!(def.settings().wait_in_progress, None);
    assert!(def.annotations().destructive);
    // Without the keys: the toolbox's retry limit, no concurrency limit.
    assert_eq!(def.settings().retry_limit, RetryLimit::toolbox());
    assert_eq!(def.settings().concurrency, None);

    assert_eq!(ExportReady.definition().settings().retry_limit, RetryLimit::off());
}
