//! `cargo run --example quickstart`: a read-only tool, a keyed tool, and a retry that is
//! answered from the record instead of sending a second invoice.

use std::sync::atomic::{AtomicU32, Ordering};

use toolkey::{json, tool, State, ToolContext, ToolError, Toolbox};

/// The outside system: it counts the invoices it sends.
#[derive(Default)]
struct Billing {
    sent: AtomicU32,
}

/// An invoice, as the billing system returns it.
#[toolkey::data]
struct Invoice {
    number: u32,
    customer: String,
    cents: i64,
}

/// How many invoices were sent so far.
#[tool(read_only)]
async fn invoice_count(billing: State<Billing>) -> Result<u32, ToolError> {
    Ok(billing.sent.load(Ordering::SeqCst))
}

/// Send the invoice for one customer and month. Safe to retry.
#[tool(idempotent(key = "invoice:<customer>:<month>"))]
async fn send_invoice(
    billing: State<Billing>,
    /// The customer's name; its case does not matter.
    #[arg(key = "case_insensitive")]
    customer: String,
    /// The month billed, as YYYY-MM.
    month: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Invoice, ToolError> {
    let number = billing.sent.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = month;
    Ok(Invoice {
        number,
        customer,
        cents,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(InvoiceCount)
        .tool(SendInvoice)
        .build()?;
    let ctx = ToolContext::new("run-1");
    let args = json!({"customer": "acme", "month": "2026-10", "cents": 12000});
    let first = toolbox.call("send_invoice", args.clone(), &ctx).await?;
    println!("first call: {} (replayed: {})", first.value, first.replayed);
    // The model retries after a timeout, the customer written otherwise: no second invoice.
    let retry = json!({"customer": " ACME ", "month": "2026-10", "cents": 12000});
    let again = toolbox.call("send_invoice", retry, &ctx).await?;
    println!("retry:      {} (replayed: {})", again.value, again.replayed);
    let count = toolbox.call("invoice_count", json!({}), &ctx).await?;
    println!("invoices sent: {}", count.value);
    Ok(())
}
