//! The invoice tools served over MCP on stdio.
//!
//! ```text
//! cargo run --example mcp_server --features mcp
//! ```
//!
//! Point an MCP client at that command (Claude Desktop's `mcpServers`, the MCP Inspector, ...).
//! It lists `send_invoice`, its read-only companion `invoice_status`, and `list_invoices`; a
//! second `send_invoice` for the same customer and period replays the first invoice instead of
//! sending another, and one with another amount is refused with CONFLICT.
//!
//! The billing system is a fake that keeps invoices in memory, so every run starts empty. Stdout
//! carries the protocol; the program writes nothing else there.

use std::sync::Mutex;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolkey::providers::mcp::McpServer;
use toolkey::{tool, State, ToolError, Toolbox};

/// A fake outside billing system: the ledger of every invoice it sent.
#[derive(Default)]
struct Billing {
    invoices: Mutex<Vec<Invoice>>,
}

/// An invoice as the billing system sent it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Invoice {
    /// The billing system's invoice number.
    id: String,
    /// The customer billed.
    customer: String,
    /// The billing period, YYYY-MM.
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    memo: String,
}

/// Every invoice sent so far.
#[derive(Debug, Serialize, JsonSchema)]
struct Ledger {
    /// The invoices, oldest first.
    invoices: Vec<Invoice>,
}

/// Create and send the invoice for one customer and billing period.
///
/// Safe to retry: a second call for the same customer and period never sends a second invoice.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    timeout = "2s"
)]
async fn send_invoice(
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
    let mut invoices = billing.invoices.lock().unwrap();
    let invoice = Invoice {
        id: format!("inv-{}", invoices.len() + 1),
        customer,
        period,
        amount,
        memo,
    };
    invoices.push(invoice.clone());
    Ok(invoice)
}

/// List every invoice the billing system has sent.
#[tool(read_only)]
async fn list_invoices(billing: State<Billing>) -> Result<Ledger, ToolError> {
    Ok(Ledger {
        invoices: billing.invoices.lock().unwrap().clone(),
    })
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(SendInvoice)
        .tool(ListInvoices)
        .build()
        .map_err(std::io::Error::other)?;
    McpServer::new(toolbox)
        .with_server_info("toolkey-invoices", env!("CARGO_PKG_VERSION"))
        .with_instructions("Send invoices with send_invoice; when a call's outcome is unclear, ask invoice_status before calling again.")
        .serve_stdio()
        .await
}
