//! The fake billing system the integration tests count effects on (invoices sent, refunds made),
//! and the tools that act on it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolkey::{tool, State, ToolContext, ToolError};

/// A fake outside billing system: counts every invoice it sends.
#[derive(Default)]
pub struct Billing {
    pub invoices: Mutex<Vec<Invoice>>,
    pub delay: Mutex<Duration>,
    next: AtomicU64,
    /// A file every invoice is also appended to, one JSON line each: the ledger of a billing
    /// system that outlives the process sending the invoices.
    journal: Option<PathBuf>,
}

impl Billing {
    pub fn with_delay(delay: Duration) -> Self {
        Billing {
            delay: Mutex::new(delay),
            ..Default::default()
        }
    }

    /// A billing system whose invoices are also kept in `journal`, for tests whose server
    /// processes come and go: [`journal_count`] counts them across every process.
    pub fn journaled(journal: &Path, delay: Duration) -> Self {
        Billing {
            journal: Some(journal.to_path_buf()),
            ..Billing::with_delay(delay)
        }
    }

    pub fn count(&self) -> usize {
        self.invoices.lock().unwrap().len()
    }

    pub async fn send(&self, customer: &str, period: &str, amount: f64, memo: &str) -> Invoice {
        let delay = *self.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let invoice = Invoice {
            id: format!("inv-{id}"),
            customer: customer.to_string(),
            period: period.to_string(),
            amount,
            memo: memo.to_string(),
        };
        self.invoices.lock().unwrap().push(invoice.clone());
        if let Some(journal) = &self.journal {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(journal)
                .unwrap();
            writeln!(file, "{}", serde_json::to_string(&invoice).unwrap()).unwrap();
            file.sync_all().unwrap();
        }
        invoice
    }
}

/// How many invoices a journal holds, whatever processes sent them.
pub fn journal_count(journal: &Path) -> usize {
    match std::fs::read_to_string(journal) {
        Ok(text) => text.lines().count(),
        Err(_) => 0,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Invoice {
    pub id: String,
    pub customer: String,
    pub period: String,
    pub amount: f64,
    pub memo: String,
}

/// Create and send the invoice for one customer and billing period.
///
/// Safe to retry: a second call for the same customer and period never sends a second invoice.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    timeout = "2s"
)]
pub async fn send_invoice(
    billing: State<Billing>,
    ctx: &ToolContext,
    /// Customer ID, for example "acme".
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    let _ = ctx;
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

/// The design's tool with the seed's timings scaled down: 200 ms timeout (billing takes 300 ms).
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    timeout = "200ms",
    name = "send_invoice"
)]
pub async fn send_invoice_scaled(
    billing: State<Billing>,
    /// Customer ID, for example "acme".
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

/// The design's tool with a 1 s lease: a server killed while it runs leaves a reservation that
/// reads as unknown within a second.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    lease = "1s",
    name = "send_invoice"
)]
pub async fn send_invoice_brief_lease(
    billing: State<Billing>,
    /// Customer ID, for example "acme".
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

/// The scaled tool whose retry, while the first call still runs, waits for it (up to 2 s) and is
/// answered with its invoice: the adapters' agent turns, where a model retries after a timeout.
#[tool(
    idempotent(
        key = "invoice:<customer>:<period>",
        status = "invoice_status",
        on_in_progress = "wait(2s)"
    ),
    timeout = "200ms",
    name = "send_invoice"
)]
pub async fn send_invoice_patient(
    billing: State<Billing>,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    #[arg(ignore)]
    memo: String,
) -> Result<Invoice, ToolError> {
    Ok(billing.send(&customer, &period, amount, &memo).await)
}

/// A fake outside refund system: the ledger of every refund it made.
#[derive(Default)]
pub struct Refunds {
    pub made: Mutex<Vec<Refund>>,
}

impl Refunds {
    pub fn count(&self) -> usize {
        self.made.lock().unwrap().len()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Refund {
    /// The refund system's id.
    pub id: String,
    pub order: String,
    pub cents: i64,
}

/// Refund part of an order; with no business identity, the key is the run's step.
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
pub async fn refund_order(
    refunds: State<Refunds>,
    ctx: &ToolContext,
    /// The order to refund.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Refund, ToolError> {
    let _ = ctx;
    let mut made = refunds.made.lock().unwrap();
    let refund = Refund {
        id: format!("re_{}", made.len() + 1),
        order,
        cents,
    };
    made.push(refund.clone());
    Ok(refund)
}
