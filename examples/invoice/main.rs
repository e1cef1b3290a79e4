//! `cargo run --example invoice`: an agent retries a slow side effect. Without a key the ledger
//! ends with three invoices; with toolkey's key and status companion, with one; with the ledger
//! in the store's own file and the tool transactional, with one, and no answer is ever unknown.

mod scenario;

use std::path::Path;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new("target/invoice-example");
    let mut out = std::io::stdout();
    let report = scenario::run(dir, scenario::Timings::demo(), &mut out).await?;
    println!(
        "\nNaive: {} calls, {} timeouts, {} invoices. Keyed: {} call, {} timeout, {} status check(s), {} invoice.",
        report.naive_calls, report.naive_timeouts, report.naive_invoices, report.keyed_calls, report.keyed_timeouts, report.status_calls, report.keyed_invoices
    );
    println!(
        "Transactional: {} call(s), {} timeout(s), {} status check(s), {} answered unknown, {} invoice.",
        report.ledger_calls, report.ledger_timeouts, report.ledger_status_calls, report.ledger_status_unknown, report.ledger_invoices
    );
    println!(
        "(files: {}/toolkey.db is the toolbox's store; ledger.db is part three's store and ledger; billing-*.db are the provider's ledgers)",
        dir.display()
    );
    Ok(())
}
