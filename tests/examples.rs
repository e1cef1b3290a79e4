//! The examples' scenarios, the same code with shorter delays, and every count they print.

#[allow(dead_code)] // the example's main uses the parts the test does not
#[path = "../examples/invoice/scenario.rs"]
mod invoice;
#[path = "../examples/refund/scenario.rs"]
mod refund;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoice_naive_ends_with_three_invoices_and_keyed_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut transcript = Vec::new();
    let report = invoice::run(
        &dir.path().join("run"),
        invoice::Timings::fast(),
        &mut transcript,
    )
    .await
    .unwrap();
    let text = String::from_utf8(transcript).unwrap();
    assert_eq!(
        report,
        invoice::Report {
            naive_calls: 3,
            naive_timeouts: 3,
            naive_invoices: 3,
            keyed_calls: 1,
            keyed_timeouts: 1,
            status_calls: report.status_calls,
            status_found_invoice: true,
            keyed_invoices: 1,
        },
        "{text}"
    );
    assert!(report.status_calls >= 1);
    assert!(
        text.contains("The ledger after the naive tool: 3 invoice(s)"),
        "{text}"
    );
    assert!(
        text.contains("The ledger after the keyed tool: 1 invoice(s)"),
        "{text}"
    );
    assert!(
        text.contains("→ invoice_status {\"customer\":\"acme\",\"period\":\"2026-10\",\"amount\":1200.0,\"memo\":\"Consulting, October 2026\"}"),
        "{text}"
    );

    // Running it again starts from a clean ledger.
    let again = invoice::run(
        &dir.path().join("run"),
        invoice::Timings::fast(),
        &mut Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!((again.naive_invoices, again.keyed_invoices), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_scenarios_count_as_printed() {
    let mut transcript = Vec::new();
    let outcomes = refund::run(Duration::from_millis(10), &mut transcript)
        .await
        .unwrap();
    let counts: Vec<(&str, usize)> = outcomes.iter().map(|o| (o.scenario, o.refunds)).collect();
    assert_eq!(
        counts,
        [
            ("no key", 2),
            ("a fresh random key per attempt", 2),
            ("key from run id + step (refund:<ctx.run_id>:<ctx.step>)", 1),
            ("same key, another amount", 1),
            ("two concurrent duplicates", 1),
            ("no key support, recover hook looks up by order", 1),
            ("two turns through providers::openai, then a restart", 2),
        ]
    );
    assert!(outcomes[3].detail.starts_with("CONFLICT"));
    assert_eq!(outcomes[4].detail, "both callers got \"re_1\" and \"re_1\"");
    assert!(outcomes[5]
        .detail
        .starts_with("first call OUTCOME_UNKNOWN, the retry found \"re_1\""));
    assert_eq!(
        outcomes[6].detail,
        "turn one got \"re_1\", turn two \"re_2\", after the restart \"re_2\" (a replay)"
    );
}
