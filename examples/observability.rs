//! `cargo run --example observability`: the spans and metrics of a short scripted run on the
//! embedded store — a first call, its replay, a conflict and a declined card.
//!
//! The spans are printed by `tracing-subscriber`'s formatter as each closes, with every field it
//! holds; the metrics are read from `metrics-util`'s debugging recorder and printed as a table.
//! In production, install an OpenTelemetry layer and a Prometheus (or OTLP) recorder instead:
//! the names are the same.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;
use toolkey::store::SqliteStore;
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};
use tracing_subscriber::fmt::format::FmtSpan;

/// The billing system the tool sends invoices through.
#[derive(Default)]
struct Billing {
    sent: AtomicU64,
}

/// Send the invoice for one customer and month; a blocked customer's card is declined.
#[tool(idempotent(key = "invoice:<customer>:<month>"))]
async fn send_invoice(
    billing: State<Billing>,
    customer: String,
    month: String,
    cents: i64,
) -> Result<String, ToolError> {
    if customer == "blocked-co" {
        return Err(
            ToolError::new("PAYMENT_DECLINED", "the card was declined").with_retryable(false)
        );
    }
    let n = billing.sent.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("inv-{n} ({customer}, {month}, {cents} cents)"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Spans, printed when they close, with every field recorded by then.
    tracing_subscriber::fmt()
        .with_span_events(FmtSpan::CLOSE)
        .with_target(false)
        .without_time()
        .with_writer(std::io::stdout)
        .init();
    // Metrics, kept in memory to print at the end.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install()?;

    let dir = std::env::temp_dir().join(format!("toolkey-observability-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(dir.join("toolkey.db"))?)
        .shared_state(billing.clone())
        .tool(SendInvoice)
        .build()?;
    let ctx = ToolContext::new("run-1");

    let october = json!({"customer": "acme", "month": "2026-10", "cents": 120000});
    let calls = [
        ("a first call", october.clone()),
        ("the model's retry", october),
        (
            "the same invoice, another amount",
            json!({"customer": "acme", "month": "2026-10", "cents": 99}),
        ),
        (
            "a declined card",
            json!({"customer": "blocked-co", "month": "2026-10", "cents": 500}),
        ),
    ];
    for (i, (what, args)) in calls.into_iter().enumerate() {
        println!("\n--- {what}");
        // The id the model's API gave the call (the provider adapters set it themselves).
        let ctx = ctx.clone().with_tool_call_id(format!("call_{i}"));
        match toolbox.call("send_invoice", args, &ctx).await {
            Ok(out) if out.replayed => println!("replayed: {}", out.value),
            Ok(out) => println!("result: {}", out.value),
            Err(err) => println!("error: {}", err.code()),
        }
    }
    let report = toolbox.shutdown().await;
    assert!(report.is_clean());
    println!("\nInvoices sent: {}", billing.sent.load(Ordering::SeqCst));

    println!(
        "\n{:<32} {:<44} {:>6} {:>10}",
        "metric", "labels", "count", "max ms"
    );
    let mut rows: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let (count, max) = match value {
                DebugValue::Counter(n) => (n.to_string(), String::new()),
                DebugValue::Gauge(v) => (v.into_inner().to_string(), String::new()),
                DebugValue::Histogram(samples) => {
                    let max = samples.iter().map(|s| s.into_inner()).fold(0.0, f64::max);
                    (samples.len().to_string(), format!("{:.3}", max * 1000.0))
                }
            };
            (key.name().to_string(), labels.join(","), count, max)
        })
        .collect();
    rows.sort();
    for (name, labels, count, max) in rows {
        println!("{name:<32} {labels:<44} {count:>6} {max:>10}");
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
