//! The invoice tools served over MCP's streamable HTTP transport, behind bearer tokens.
//!
//! ```text
//! cargo run --example mcp_http --features mcp-http
//! ```
//!
//! Point an MCP client at `http://127.0.0.1:8080/mcp` with `Authorization: Bearer acme-secret`
//! (or `globex-secret`). Each token is a principal of its own customer account: the two never
//! see each other's invoices, even for the same customer and period, and a request without a
//! valid token is answered `401 Unauthorized` before anything runs. `send_invoice` reports its
//! progress to a client that asks for it. Ctrl-C stops the server.
//!
//! The billing system is a fake that keeps invoices in memory, so every run starts empty.

use std::sync::Mutex;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolkey::providers::mcp::http::{bearer_token, McpHttp, Parts, Principal, Refusal};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};

/// A fake outside billing system: the ledger of every invoice it sent, for every account.
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
}

/// Create and send the invoice for one customer and billing period.
///
/// Safe to retry: a second call for the same customer and period never sends a second invoice.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"))]
async fn send_invoice(
    billing: State<Billing>,
    ctx: &ToolContext,
    /// Customer ID, for example "acme".
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
) -> Result<Invoice, ToolError> {
    ctx.progress(1.0, Some(2.0), "rendering the invoice").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ctx.progress(2.0, Some(2.0), "sending the invoice").await;
    let mut invoices = billing.invoices.lock().unwrap();
    let invoice = Invoice {
        id: format!("inv-{}", invoices.len() + 1),
        customer,
        period,
        amount,
    };
    invoices.push(invoice.clone());
    Ok(invoice)
}

/// Who a request's bearer token says it is. A real server checks the token against its
/// identity provider; the principal's tenant keeps its records apart from every other account's.
fn authenticate(request: &Parts) -> Result<Principal, Refusal> {
    match bearer_token(request) {
        Some("acme-secret") => Ok(Principal::new("acme-agent").with_tenant("acme")),
        Some("globex-secret") => Ok(Principal::new("globex-agent").with_tenant("globex")),
        _ => Err(Refusal::unauthenticated("a valid bearer token is required")),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(SendInvoice)
        .build()
        .map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    eprintln!("MCP over HTTP on http://127.0.0.1:8080/mcp");
    McpHttp::new(toolbox, authenticate)
        .with_server_info("toolkey-invoices", env!("CARGO_PKG_VERSION"))
        .serve(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
