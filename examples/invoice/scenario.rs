//! The invoicing agent, naive and keyed: the code behind `cargo run --example invoice`, shared
//! with the integration tests (which run it with shorter delays).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolkey::store::SqliteStore;
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};

/// How slow the billing provider is, against how long the agent waits.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// The tool's timeout: how long the agent waits for an answer.
    pub timeout: Duration,
    /// How long the billing provider takes to create an invoice.
    pub billing: Duration,
    /// How long the model pauses before checking on work it could not see finish.
    pub pause: Duration,
}

impl Timings {
    /// The demo's timings: billing takes 750 ms, the agent waits 500 ms (short enough that the
    /// whole demo runs in under three seconds).
    pub fn demo() -> Self {
        Timings {
            timeout: Duration::from_millis(500),
            billing: Duration::from_millis(750),
            pause: Duration::from_millis(350),
        }
    }

    /// The tests' timings, the same shape ten times faster.
    #[allow(dead_code)] // used by the integration tests, which include this file
    pub fn fast() -> Self {
        Timings {
            timeout: Duration::from_millis(100),
            billing: Duration::from_millis(150),
            pause: Duration::from_millis(70),
        }
    }
}

/// What the scenario ended with.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub naive_calls: usize,
    pub naive_timeouts: usize,
    pub naive_invoices: usize,
    pub keyed_calls: usize,
    pub keyed_timeouts: usize,
    pub status_calls: usize,
    pub status_found_invoice: bool,
    pub keyed_invoices: usize,
    pub ledger_calls: usize,
    pub ledger_timeouts: usize,
    pub ledger_status_calls: usize,
    /// Status answers `unknown` in part three: none, ever.
    pub ledger_status_unknown: usize,
    pub ledger_invoices: usize,
}

/// An invoice as the billing provider returns it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Invoice {
    /// The provider's invoice number.
    pub number: i64,
    pub customer: String,
    pub period: String,
    pub amount: f64,
    pub memo: String,
}

/// A stand-in billing provider: a SQLite ledger behind a slow call, with optional idempotency
/// keys the way Stripe's `Idempotency-Key` header works.
pub struct BillingProvider {
    ledger: Mutex<Connection>,
    delay: Duration,
}

impl BillingProvider {
    pub fn open(path: &Path, delay: Duration) -> rusqlite::Result<Self> {
        let ledger = Connection::open(path)?;
        ledger.execute_batch(
            "CREATE TABLE IF NOT EXISTS invoices (
                number INTEGER PRIMARY KEY AUTOINCREMENT,
                customer TEXT NOT NULL, period TEXT NOT NULL, amount REAL NOT NULL, memo TEXT NOT NULL,
                idempotency_key TEXT UNIQUE
            )",
        )?;
        Ok(BillingProvider {
            ledger: Mutex::new(ledger),
            delay,
        })
    }

    /// Creates an invoice; slow. With a key it has seen, returns that invoice instead.
    pub async fn create_invoice(
        &self,
        customer: &str,
        period: &str,
        amount: f64,
        memo: &str,
        key: Option<&str>,
    ) -> rusqlite::Result<Invoice> {
        tokio::time::sleep(self.delay).await;
        let ledger = self.ledger.lock().unwrap();
        if let Some(key) = key {
            let seen = ledger
                .query_row("SELECT number, customer, period, amount, memo FROM invoices WHERE idempotency_key = ?1", [key], row_to_invoice)
                .optional()?;
            if let Some(invoice) = seen {
                return Ok(invoice);
            }
        }
        ledger.execute(
            "INSERT INTO invoices (customer, period, amount, memo, idempotency_key) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![customer, period, amount, memo, key],
        )?;
        Ok(Invoice {
            number: ledger.last_insert_rowid(),
            customer: customer.into(),
            period: period.into(),
            amount,
            memo: memo.into(),
        })
    }

    /// Every invoice on the ledger.
    pub fn invoices(&self) -> rusqlite::Result<Vec<Invoice>> {
        let ledger = self.ledger.lock().unwrap();
        let mut stmt = ledger.prepare(
            "SELECT number, customer, period, amount, memo FROM invoices ORDER BY number",
        )?;
        let rows = stmt.query_map([], row_to_invoice)?;
        rows.collect()
    }
}

fn row_to_invoice(row: &rusqlite::Row<'_>) -> rusqlite::Result<Invoice> {
    Ok(Invoice {
        number: row.get(0)?,
        customer: row.get(1)?,
        period: row.get(2)?,
        amount: row.get(3)?,
        memo: row.get(4)?,
    })
}

fn provider_error(err: rusqlite::Error) -> ToolError {
    ToolError::new("BILLING_ERROR", err.to_string())
        .with_retryable(true)
        .with_suggestion("retry in a moment")
}

/// Create and send the invoice for one customer and billing period.
#[tool(unkeyed, timeout = "1s", name = "send_invoice")]
pub async fn send_invoice_naive(
    billing: State<BillingProvider>,
    /// Customer ID, for example "acme".
    customer: String,
    /// Billing period as YYYY-MM, for example "2026-10".
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// What the invoice is for.
    memo: String,
) -> Result<Invoice, ToolError> {
    billing
        .create_invoice(&customer, &period, amount, &memo, None)
        .await
        .map_err(provider_error)
}

/// Create and send the invoice for one customer and billing period.
///
/// Safe to retry: a second call for the same customer and period never sends a second invoice.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    timeout = "1s"
)]
pub async fn send_invoice(
    billing: State<BillingProvider>,
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
    // The provider enforces the same key too, as Stripe does with `Idempotency-Key`.
    let key = ctx.idempotency_key().map(|k| k.as_str());
    billing
        .create_invoice(&customer, &period, amount, &memo, key)
        .await
        .map_err(provider_error)
}

/// The ledger of part three: the invoices table in the store's own SQLite file, written by a
/// transactional tool.
pub struct Ledger {
    /// How long creating an invoice takes.
    pub delay: Duration,
}

impl Ledger {
    /// Creates the invoices table in the store's file at `path`.
    pub fn create(path: &Path, delay: Duration) -> rusqlite::Result<Ledger> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS invoices (
                number INTEGER PRIMARY KEY AUTOINCREMENT,
                customer TEXT NOT NULL, period TEXT NOT NULL, amount REAL NOT NULL, memo TEXT NOT NULL
            )",
        )?;
        Ok(Ledger { delay })
    }

    /// Every invoice on the ledger in the store's file at `path`.
    pub fn invoices(path: &Path) -> rusqlite::Result<Vec<Invoice>> {
        let conn = Connection::open(path)?;
        let mut stmt = conn.prepare(
            "SELECT number, customer, period, amount, memo FROM invoices ORDER BY number",
        )?;
        let rows = stmt.query_map([], row_to_invoice)?;
        rows.collect()
    }
}

/// Create and send the invoice for one customer and billing period.
///
/// Safe to retry: a second call for the same customer and period never sends a second invoice.
#[tool(
    idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"),
    timeout = "1s",
    name = "send_invoice"
)]
pub async fn send_invoice_in_ledger(
    ledger: State<Ledger>,
    // The invoice row and the key's record commit together in this transaction, or neither.
    tx: &rusqlite::Transaction<'_>,
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
    tokio::time::sleep(ledger.delay).await;
    tx.execute(
        "INSERT INTO invoices (customer, period, amount, memo) VALUES (?1, ?2, ?3, ?4)",
        params![customer, period, amount, memo],
    )
    .map_err(provider_error)?;
    Ok(Invoice {
        number: tx.last_insert_rowid(),
        customer,
        period,
        amount,
        memo,
    })
}

/// A scripted model with no network: it behaves as a real model does with a tool that times
/// out. It asks for the invoice, retries after a TIMEOUT (rewording the memo, as models do), and
/// when an error's suggestion names a status tool, asks that tool instead of repeating itself.
pub struct ScriptedModel<'a> {
    pub toolbox: &'a Toolbox,
    pub ctx: ToolContext,
    pub pause: Duration,
    pub out: &'a mut dyn Write,
}

/// What the model's turn ended with.
#[derive(Debug, Default)]
pub struct Turn {
    pub calls: usize,
    pub timeouts: usize,
    pub status_calls: usize,
    pub status_found_invoice: bool,
    /// Status answers that said `unknown`.
    pub status_unknown: usize,
}

const MEMOS: [&str; 3] = [
    "Consulting, October 2026",
    "Invoice for October consulting",
    "October 2026 consulting services",
];

impl ScriptedModel<'_> {
    pub async fn invoice(
        &mut self,
        customer: &str,
        period: &str,
        amount: f64,
    ) -> std::io::Result<Turn> {
        let mut turn = Turn::default();
        writeln!(
            self.out,
            "  user   Please invoice {customer} for {period}: {amount:.2} EUR."
        )?;
        for memo in MEMOS {
            let args =
                json!({"customer": customer, "period": period, "amount": amount, "memo": memo});
            let result = self.call("send_invoice", args.clone()).await?;
            turn.calls += 1;
            let Err(err) = result else {
                writeln!(self.out, "  model  The invoice is sent.")?;
                return Ok(turn);
            };
            if err.code() == "TIMEOUT" {
                turn.timeouts += 1;
            }
            let status_tool = err
                .suggestion()
                .and_then(named_tool)
                .filter(|t| self.toolbox.definition(t).is_some());
            match status_tool {
                Some(status) => {
                    writeln!(self.out, "  model  The call timed out, and the error says to check `{status}` rather than repeat it.")?;
                    loop {
                        tokio::time::sleep(self.pause).await;
                        // "with the same arguments", as the suggestion says.
                        let answer = self.call(&status, args.clone()).await?;
                        turn.status_calls += 1;
                        match answer
                            .as_ref()
                            .ok()
                            .and_then(|v| v["status"].as_str().map(str::to_string))
                            .as_deref()
                        {
                            Some("completed") => {
                                turn.status_found_invoice = true;
                                writeln!(self.out, "  model  The invoice was sent after all; I will not send it again.")?;
                                return Ok(turn);
                            }
                            Some("in_progress") => {
                                writeln!(self.out, "  model  Still running; I will check again.")?
                            }
                            Some("not_found") => break,
                            answer => {
                                if answer == Some("unknown") {
                                    turn.status_unknown += 1;
                                }
                                writeln!(
                                    self.out,
                                    "  model  I cannot tell what happened; I will ask a person."
                                )?;
                                return Ok(turn);
                            }
                        }
                    }
                }
                None if err.code() == "TIMEOUT" => {
                    writeln!(self.out, "  model  The call timed out and I have no way to check what happened; I will try again.")?;
                }
                None => {
                    writeln!(
                        self.out,
                        "  model  The tool failed ({}); I will stop here.",
                        err.code()
                    )?;
                    return Ok(turn);
                }
            }
        }
        writeln!(
            self.out,
            "  model  I tried three times and never got an answer."
        )?;
        Ok(turn)
    }

    async fn call(&mut self, tool: &str, args: Value) -> std::io::Result<Result<Value, ToolError>> {
        writeln!(self.out, "  model  → {tool} {args}")?;
        let result = self.toolbox.call(tool, args, &self.ctx).await;
        let (shown, result) = match result {
            Ok(out) => (out.value.clone(), Ok(out.value)),
            Err(err) => (err.to_json(), Err(err)),
        };
        writeln!(self.out, "  tool   ← {shown}")?;
        Ok(result)
    }
}

/// The first `` `name` `` in a suggestion.
fn named_tool(suggestion: &str) -> Option<String> {
    let start = suggestion.find('`')? + 1;
    let len = suggestion[start..].find('`')?;
    Some(suggestion[start..start + len].to_string())
}

fn print_ledger(out: &mut dyn Write, title: &str, invoices: &[Invoice]) -> std::io::Result<()> {
    writeln!(out, "\n  {title}: {} invoice(s)", invoices.len())?;
    writeln!(
        out,
        "    {:<4} {:<8} {:<8} {:>9}  memo",
        "no.", "customer", "period", "EUR"
    )?;
    for i in invoices {
        writeln!(
            out,
            "    {:<4} {:<8} {:<8} {:>9.2}  {}",
            i.number, i.customer, i.period, i.amount, i.memo
        )?;
    }
    Ok(())
}

/// Runs both parts in `dir` (emptied first, so every run starts from a clean ledger).
pub async fn run(
    dir: &Path,
    timings: Timings,
    out: &mut dyn Write,
) -> Result<Report, Box<dyn std::error::Error>> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let file = |name: &str| -> PathBuf { dir.join(name) };
    let ctx = ToolContext::new("run-1").with_tenant("acme-corp");
    let mut report = Report::default();

    writeln!(out, "Part one: the naive tool (`unkeyed`, approved). Billing takes {:?}; the agent waits {:?}.\n", timings.billing, timings.timeout)?;
    let billing = Arc::new(BillingProvider::open(
        &file("billing-naive.db"),
        timings.billing,
    )?);
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(file("toolkey.db"))?)
        .shared_state(billing.clone())
        .tool(SendInvoiceNaive)
        .timeout("send_invoice", Some(timings.timeout))
        .approver(|_: &toolkey::ApprovalRequest<'_>| true)
        .build()?;
    let turn = ScriptedModel {
        toolbox: &toolbox,
        ctx: ctx.clone(),
        pause: timings.pause,
        out: &mut *out,
    }
    .invoice("acme", "2026-10", 1200.0)
    .await?;
    // The calls the agent stopped waiting for finish anyway, and every outcome reaches the store.
    assert!(toolbox.shutdown().await.is_clean());
    let invoices = billing.invoices()?;
    print_ledger(out, "The ledger after the naive tool", &invoices)?;
    report.naive_calls = turn.calls;
    report.naive_timeouts = turn.timeouts;
    report.naive_invoices = invoices.len();

    writeln!(out, "\nPart two: the keyed tool `idempotent(key = \"invoice:<customer>:<period>\")` and its status companion.\n")?;
    let billing = Arc::new(BillingProvider::open(
        &file("billing-keyed.db"),
        timings.billing,
    )?);
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(file("toolkey.db"))?)
        .shared_state(billing.clone())
        .tool(SendInvoice)
        .timeout("send_invoice", Some(timings.timeout))
        .build()?;
    let turn = ScriptedModel {
        toolbox: &toolbox,
        ctx,
        pause: timings.pause,
        out: &mut *out,
    }
    .invoice("acme", "2026-10", 1200.0)
    .await?;
    assert!(toolbox.shutdown().await.is_clean());
    let invoices = billing.invoices()?;
    print_ledger(out, "The ledger after the keyed tool", &invoices)?;
    report.keyed_calls = turn.calls;
    report.keyed_timeouts = turn.timeouts;
    report.status_calls = turn.status_calls;
    report.status_found_invoice = turn.status_found_invoice;
    report.keyed_invoices = invoices.len();

    writeln!(out, "\nPart three: the ledger in the store's own file, and the tool transactional: the invoice row and the key's record commit together.\n")?;
    // A store of its own, so that part two's record of the same key is not replayed here.
    let store_file = file("ledger.db");
    let ledger = Ledger::create(&store_file, timings.billing)?;
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(&store_file)?)
        .state(ledger)
        .tool(SendInvoiceInLedger)
        .timeout("send_invoice", Some(timings.timeout))
        .build()?;
    let turn = ScriptedModel {
        toolbox: &toolbox,
        ctx: ToolContext::new("run-1").with_tenant("acme-corp"),
        pause: timings.pause,
        out: &mut *out,
    }
    .invoice("acme", "2026-10", 1200.0)
    .await?;
    assert!(toolbox.shutdown().await.is_clean());
    let invoices = Ledger::invoices(&store_file)?;
    print_ledger(out, "The ledger after the transactional tool", &invoices)?;
    report.ledger_calls = turn.calls;
    report.ledger_timeouts = turn.timeouts;
    report.ledger_status_calls = turn.status_calls;
    report.ledger_status_unknown = turn.status_unknown;
    report.ledger_invoices = invoices.len();
    Ok(report)
}
