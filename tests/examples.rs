//! The examples' scenarios, the same code with shorter delays, and every count they print.

use std::time::Duration;

use toolkey_tests::{invoice, refund};

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
            ledger_calls: report.ledger_calls,
            ledger_timeouts: 1,
            ledger_status_calls: report.ledger_status_calls,
            ledger_status_unknown: 0,
            ledger_invoices: 1,
        },
        "{text}"
    );
    assert!(report.status_calls >= 1);
    // After its timeout the model asked the status companion or called again: never unknown.
    assert!(
        report.ledger_calls + report.ledger_status_calls >= 2,
        "{text}"
    );
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
    assert!(
        text.contains("The ledger after the transactional tool: 1 invoice(s)"),
        "{text}"
    );
    assert_eq!(
        (
            again.naive_invoices,
            again.keyed_invoices,
            again.ledger_invoices
        ),
        (3, 1, 1)
    );
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

/// The invoice example's tools through `toolkey::testing::RetryCheck`, each scenario on a fresh
/// in-memory ledger: the keyed tool passes every row on both stores; the naive one sends a
/// second invoice in every scenario that retries.
mod retry_check {
    use serde_json::{json, Value};
    use std::path::Path;
    use std::sync::Arc;
    use toolkey::testing::{Backend, Report, RetryCheck, Scenario, Verdict};

    use super::invoice::{BillingProvider, SendInvoice, SendInvoiceNaive};

    fn args() -> Value {
        json!({"customer": "acme", "period": "2026-10", "amount": 1200.0, "memo": "Consulting, October 2026"})
    }

    /// Both tools are named `send_invoice`; `naive` picks the unkeyed one. Billing takes
    /// 150 ms, longer than the check's 100 ms timeout, as in the example's fast timings.
    fn check(naive: bool, backend: Backend) -> RetryCheck<Arc<BillingProvider>> {
        let delay = super::invoice::Timings::fast().billing;
        RetryCheck::new("send_invoice", args(), move || {
            Arc::new(BillingProvider::open(Path::new(":memory:"), delay).unwrap())
        })
        .toolbox(move |builder, billing| {
            let builder = builder.shared_state(billing.clone());
            if naive {
                builder
                    .tool(SendInvoiceNaive)
                    .approver(|_: &toolkey::ApprovalRequest<'_>| true)
                    .build()
            } else {
                builder.tool(SendInvoice).build()
            }
        })
        .effects(|billing| billing.invoices().unwrap().len())
        .reworded(json!({"customer": "acme", "period": "2026-10", "amount": 1200.0, "memo": "Invoice for October consulting"}))
        .other_action(json!({"customer": "acme", "period": "2026-11", "amount": 1200.0, "memo": "Consulting, November 2026"}))
        .store(backend)
    }

    fn table(report: &Report) -> Vec<(Scenario, usize, usize, Verdict)> {
        report
            .rows
            .iter()
            .map(|r| (r.scenario, r.expected, r.observed, r.verdict))
            .collect()
    }

    use Scenario::*;
    use Verdict::{Fail, NotRun, Pass};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_keyed_invoice_tool_is_retry_safe() {
        for backend in [Backend::memory(), Backend::sqlite()] {
            let report = check(false, backend).run().await;
            report.assert_retry_safe();
            assert_eq!(
                table(&report),
                [
                    (Replay, 1, 1, Pass),
                    (Timeout, 1, 1, Pass),
                    (ModelRetry, 1, 1, Pass),
                    (Reworded, 1, 1, Pass),
                    (OtherArguments, 1, 1, Pass),
                    (Concurrent, 1, 1, Pass),
                    (LostReply, 1, 1, Pass),
                    (StoreFails, 1, 1, Pass),
                    (Crash, 1, 1, Pass),
                    (CrashAtStep, 0, 0, NotRun),
                    (CrashBeforeEffect, 0, 0, Pass),
                    (LeaseLapse, 1, 1, Pass),
                    (OtherAction, 2, 2, Pass),
                ],
                "{report}"
            );
            // `memo` reworded, `customer` as "  ACME " (case-insensitive), `period` with spaces,
            // all three at once, and the model's own rewording: five replays.
            assert_eq!(
                report.row(Reworded).unwrap().answer,
                "ok, then 5 retries: replayed"
            );
            assert_eq!(
                report.row(OtherArguments).unwrap().answer,
                "ok, then CONFLICT"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_naive_invoice_tool_sends_a_second_invoice_in_every_retry() {
        for backend in [Backend::memory(), Backend::sqlite()] {
            let report = check(true, backend).run().await;
            assert_eq!(
                table(&report),
                [
                    (Replay, 1, 2, Fail),
                    (Timeout, 1, 3, Fail),
                    (ModelRetry, 1, 3, Fail),
                    (Reworded, 1, 2, Fail),
                    (OtherArguments, 1, 2, Fail),
                    (Concurrent, 1, 8, Fail),
                    (LostReply, 1, 2, Fail),
                    (StoreFails, 0, 0, NotRun),
                    (Crash, 1, 2, Fail),
                    (CrashAtStep, 0, 0, NotRun),
                    (CrashBeforeEffect, 0, 0, NotRun),
                    (LeaseLapse, 1, 2, Fail),
                    (OtherAction, 2, 2, Pass),
                ],
                "{report}"
            );
            let no_key = "`send_invoice` is `unkeyed`: no key ties a retry to the first call; declare `idempotent(key = \"...\")`";
            let reason = |s| report.row(s).unwrap().reason.clone().unwrap();
            assert_eq!(
                reason(Replay),
                format!("did the work twice: the same call, made again, ran again; {no_key}")
            );
            assert_eq!(
                reason(Timeout),
                format!("did the work 3 times: the retry after a TIMEOUT that said not to repeat it (models and clients repeat it anyway) ran the body again; {no_key}")
            );
            assert_eq!(
                reason(Concurrent),
                format!("did the work 8 times: 8 of 8 concurrent duplicates ran; {no_key}")
            );
            assert_eq!(report.row(Concurrent).unwrap().answer, "8 ok");
            // Three calls, three TIMEOUTs, three invoices: the example's part one.
            assert_eq!(
                report.row(Timeout).unwrap().answer,
                "TIMEOUT, retry TIMEOUT; after the body: retry TIMEOUT"
            );
            assert_eq!(
                reason(Crash),
                format!("did the work twice: after the worker died, the retry ran again; {no_key}")
            );
        }
    }
}
