//! `toolkey::testing::RetryCheck` against tools keyed well and badly, counting charges on a fake
//! payment provider: a good tool passes every row, each bad one fails exactly the rows its
//! mistake breaks, on the memory and the SQLite store.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolkey::testing::{Backend, Report, RetryCheck, Scenario, Verdict};
use toolkey::{tool, State, ToolContext, ToolError};

/// The outside system: the charges it made, each for an order and an amount.
#[derive(Default)]
struct Payments {
    charges: Mutex<Vec<(String, i64, String)>>,
}

impl Payments {
    fn charge(&self, order: &str, cents: i64, note: &str) -> String {
        let mut charges = self.charges.lock().unwrap();
        charges.push((order.to_string(), cents, note.to_string()));
        format!("ch_{}", charges.len())
    }

    fn find(&self, order: &str) -> Option<String> {
        let charges = self.charges.lock().unwrap();
        let at = charges.iter().position(|(o, _, _)| o == order)?;
        Some(format!("ch_{}", at + 1))
    }

    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// Charge an order; a retry after a crash looks the charge up by order first.
#[tool(idempotent(key = "charge:<order>", recover = find_charge))]
async fn charge(
    payments: State<Payments>,
    /// The order, for example "o-1".
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

async fn find_charge(
    payments: State<Payments>,
    order: String,
    cents: i64,
    note: String,
) -> Result<Option<String>, ToolError> {
    let _ = (cents, note);
    Ok(payments.find(&order))
}

/// Charge an order; its lookup asks the provider by the note, which the provider never indexes.
#[tool(idempotent(key = "charge:<order>", recover = find_nothing))]
async fn charge_looking_elsewhere(
    payments: State<Payments>,
    /// The order, for example "o-1".
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

async fn find_nothing(
    payments: State<Payments>,
    order: String,
    cents: i64,
    note: String,
) -> Result<Option<String>, ToolError> {
    let _ = (payments, order, cents, note);
    Ok(None)
}

/// Charge an order; its lookup never asks the provider and always says the charge was made.
#[tool(idempotent(key = "charge:<order>", recover = assume_charged))]
async fn charge_assuming(
    payments: State<Payments>,
    /// The order, for example "o-1".
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

async fn assume_charged(
    payments: State<Payments>,
    order: String,
    cents: i64,
    note: String,
) -> Result<Option<String>, ToolError> {
    let _ = (payments, order, cents, note);
    Ok(Some("ch_1".to_string()))
}

/// Charge a customer for a month: the key leaves the month out.
#[tool(idempotent(key = "charge:<customer>"))]
async fn charge_monthly(
    payments: State<Payments>,
    /// The customer.
    customer: String,
    /// The month billed, as YYYY-MM.
    month: String,
    /// The amount in cents.
    cents: i64,
) -> Result<String, ToolError> {
    Ok(payments.charge(&format!("{customer}/{month}"), cents, ""))
}

/// Charge an order: the key holds the note, free text the model rewords.
#[tool(idempotent(key = "charge-noted:<order>:<note>"))]
async fn charge_keyed_on_note(
    payments: State<Payments>,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

/// Charge an order, which the arguments name `order_id`.
#[tool(idempotent(key = "charge-renamed:<order>"))]
async fn charge_renamed(
    payments: State<Payments>,
    /// The order, for example "o-1".
    #[serde(rename = "order_id")]
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

fn args() -> Value {
    json!({"order": "o-1", "cents": 500, "note": "Thanks for your order"})
}

fn check(tool: &'static str, args: Value, backend: Backend) -> RetryCheck<Arc<Payments>> {
    RetryCheck::new(tool, args, || Arc::new(Payments::default()))
        .toolbox(|builder, payments| {
            builder
                .shared_state(payments.clone())
                .tool(Charge)
                .tool(ChargeLookingElsewhere)
                .tool(ChargeAssuming)
                .tool(ChargeMonthly)
                .tool(ChargeKeyedOnNote)
                .tool(ChargeRenamed)
                .build()
        })
        .effects(|payments| payments.count())
        .store(backend)
}

/// Each row as (scenario, expected, observed, verdict).
fn table(report: &Report) -> Vec<(Scenario, usize, usize, Verdict)> {
    report
        .rows
        .iter()
        .map(|r| (r.scenario, r.expected, r.observed, r.verdict))
        .collect()
}

fn reason(report: &Report, scenario: Scenario) -> String {
    report
        .row(scenario)
        .and_then(|r| r.reason.clone())
        .unwrap_or_default()
}

fn backends() -> [Backend; 2] {
    [Backend::memory(), Backend::sqlite()]
}

use Scenario::*;
use Verdict::{Fail, NotRun, Pass};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_tool_with_a_recover_hook_passes_every_row() {
    for backend in backends() {
        let report = check("charge", args(), backend)
            .reworded(json!({"order": "o-1", "cents": 500, "note": "Thank you!"}))
            .other_action(json!({"order": "o-2", "cents": 500, "note": "Thanks"}))
            .run()
            .await;
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
                (CrashBeforeEffect, 1, 1, Pass),
                (LeaseLapse, 1, 1, Pass),
                (OtherAction, 2, 2, Pass),
            ],
            "{report}"
        );
        let answer = |s| report.row(s).unwrap().answer.clone();
        assert_eq!(answer(Replay), "ok, then replayed");
        assert_eq!(
            answer(Timeout),
            "TIMEOUT, retry IN_PROGRESS, status in_progress; after the body: status completed, retry replayed"
        );
        // `note` reworded, `order` respelled with spaces, both at once, and the given rewording.
        assert_eq!(answer(Reworded), "ok, then 4 retries: replayed");
        assert_eq!(answer(OtherArguments), "ok, then CONFLICT");
        assert_eq!(answer(Concurrent), "7 IN_PROGRESS, 1 ok");
        assert_eq!(answer(LostReply), "ok, retry replayed, status completed");
        assert_eq!(
            answer(Crash),
            "worker died; retry replayed (found by the recover hook), status completed"
        );
        assert_eq!(
            answer(CrashBeforeEffect),
            "worker died before acting; retry ok (the recover hook found nothing)"
        );
        assert_eq!(
            answer(LeaseLapse),
            "lease lapsed; retry replayed (found by the recover hook), first call LEASE_LOST"
        );
    }
}

/// A key field the arguments spell otherwise is respelled under its JSON name, and never taken
/// for the field a retry changes to make another call under the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_field_renamed_in_the_arguments_is_respelled_by_its_json_name() {
    for backend in backends() {
        let renamed = json!({"order_id": "o-1", "cents": 500, "note": "Thanks"});
        let report = check("charge_renamed", renamed, backend).run().await;
        report.assert_retry_safe();
        // `note` reworded, `order_id` respelled with spaces, and both at once.
        let row = report.row(Reworded).unwrap();
        assert_eq!(row.answer, "ok, then 3 retries: replayed", "{report}");
        assert_eq!((row.expected, row.observed), (1, 1), "{report}");
        assert_eq!(
            report.row(OtherArguments).unwrap().answer,
            "ok, then CONFLICT"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_hook_that_finds_nothing_charges_twice_after_a_crash() {
    for backend in backends() {
        let report = check("charge_looking_elsewhere", args(), backend)
            .run()
            .await;
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
                (Crash, 1, 2, Fail),
                (CrashAtStep, 0, 0, NotRun),
                (CrashBeforeEffect, 1, 1, Pass),
                (LeaseLapse, 1, 2, Fail),
                (OtherAction, 0, 0, NotRun),
            ],
            "{report}"
        );
        assert!(reason(&report, Crash).starts_with(
            "did the work twice: after the worker died at the tool's record, the retry ran again; the recover hook found nothing, though the dead worker had acted"
        ), "{report}");
        assert!(reason(&report, LeaseLapse).starts_with(
            "did the work twice: while the slow body's lease had lapsed, the retry ran again; the recover hook found nothing"
        ), "{report}");
        let panic = std::panic::catch_unwind(|| report.assert_retry_safe()).unwrap_err();
        let text = panic.downcast_ref::<String>().unwrap();
        assert!(text.contains("2 scenarios FAILED"), "{text}");
        assert!(
            text.contains("FAIL: did the work twice: after the worker died"),
            "{text}"
        );
    }
}

/// A recover hook that says "found" without looking passes every row where the effect happened,
/// and fails the one where the worker died before acting: the retry is told the charge was
/// made, and none was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_hook_that_assumes_the_charge_skips_it_after_a_crash_before_acting() {
    for backend in backends() {
        let report = check("charge_assuming", args(), backend).run().await;
        let row = report.row(CrashBeforeEffect).unwrap();
        assert_eq!(
            (row.expected, row.observed, row.verdict),
            (1, 0, Fail),
            "{report}"
        );
        assert_eq!(
            row.answer,
            "worker died before acting; retry replayed (found by the recover hook)"
        );
        assert!(
            reason(&report, CrashBeforeEffect).starts_with(
                "skipped work: the recover hook answered an effect that never happened"
            ),
            "{report}"
        );
        let failed: Vec<Scenario> = report
            .rows
            .iter()
            .filter(|r| r.verdict == Fail)
            .map(|r| r.scenario)
            .collect();
        assert_eq!(failed, [CrashBeforeEffect], "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_leaves_out_the_month_refuses_the_next_month() {
    for backend in backends() {
        let monthly = json!({"customer": "acme", "month": "2026-10", "cents": 500});
        let report = check("charge_monthly", monthly, backend)
            .other_action(json!({"customer": "acme", "month": "2026-11", "cents": 500}))
            .run()
            .await;
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
                (OtherAction, 2, 1, Fail),
            ],
            "{report}"
        );
        assert_eq!(
            reason(&report, OtherAction),
            "skipped work: the other action was refused as a CONFLICT: the key `charge:<customer>` does not tell it from the first (they differ in `month`); put what tells actions apart in the key"
        );
        assert_eq!(report.row(OtherAction).unwrap().answer, "ok, then CONFLICT");
        // The only text key field is respelled; the month is what a retry may not change.
        assert_eq!(
            report.row(Reworded).unwrap().answer,
            "ok, then 1 retry: replayed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_holds_free_text_charges_again_when_the_model_rewords_it() {
    for backend in backends() {
        let report = check("charge_keyed_on_note", args(), backend)
            .reworded(json!({"order": "o-1", "cents": 500, "note": "Thank you for ordering"}))
            .run()
            .await;
        assert_eq!(
            table(&report),
            [
                (Replay, 1, 1, Pass),
                (Timeout, 1, 1, Pass),
                (ModelRetry, 1, 1, Pass),
                (Reworded, 1, 2, Fail),
                (OtherArguments, 1, 1, Pass),
                (Concurrent, 1, 1, Pass),
                (LostReply, 1, 1, Pass),
                (StoreFails, 1, 1, Pass),
                (Crash, 1, 1, Pass),
                (CrashAtStep, 0, 0, NotRun),
                (CrashBeforeEffect, 0, 0, Pass),
                (LeaseLapse, 1, 1, Pass),
                (OtherAction, 0, 0, NotRun),
            ],
            "{report}"
        );
        assert_eq!(
            reason(&report, Reworded),
            "did the work twice: the retry with your rewording (`note`) ran again; the key `charge-noted:<order>:<note>` holds `note`, which the retry wrote otherwise, so it got a new key; keep free text out of the key and mark it `#[arg(ignore)]`"
        );
        // Without a recover hook a crash leaves one charge and an honest "unknown".
        let crash = report.row(Crash).unwrap();
        assert_eq!(
            crash.answer,
            "worker died; retry OUTCOME_UNKNOWN, status unknown"
        );
        assert!(crash
            .reason
            .as_deref()
            .unwrap()
            .starts_with("no recover hook"));
    }
}

/// Tags an order's charge: every field beside `order` is a tag.
#[tool(idempotent(key = "tag:<order>", recover = find_tag))]
async fn tag_charge(
    payments: State<Payments>,
    order: String,
    #[serde(flatten)] tags: std::collections::BTreeMap<String, String>,
) -> Result<String, ToolError> {
    let tags: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(payments.charge(&order, 0, &tags.join(",")))
}

async fn find_tag(
    payments: State<Payments>,
    order: String,
    tags: std::collections::BTreeMap<String, String>,
) -> Result<Option<String>, ToolError> {
    let _ = tags;
    Ok(payments.find(&order))
}

/// Asserts that the report held, and that the kit changed a field outside the key and got
/// `CONFLICT`, with 1 effect.
fn assert_other_arguments_conflict(report: &Report) {
    report.assert_retry_safe();
    let row = report.row(OtherArguments).unwrap();
    assert_eq!(
        (row.verdict, row.expected, row.observed),
        (Pass, 1, 1),
        "{report}"
    );
    assert_eq!(row.answer, "ok, then CONFLICT", "{report}");
}

/// A flattened map's entries are fields a retry may not change: the kit changes one and expects
/// `CONFLICT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flattened_maps_entries_are_fields_the_kit_changes() {
    for backend in backends() {
        let args = json!({"order": "o-1", "gift": "yes"});
        let report = RetryCheck::new("tag_charge", args, || Arc::new(Payments::default()))
            .toolbox(|builder, payments| {
                builder
                    .shared_state(payments.clone())
                    .tool(TagCharge)
                    .build()
            })
            .effects(|payments| payments.count())
            .store(backend)
            .run()
            .await;
        assert_other_arguments_conflict(&report);
    }
}

/// Where a payout goes.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum PayTo {
    Card { last4: String },
    Bank { iban: String },
}

/// How fast a payout goes.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(tag = "speed", rename_all = "snake_case")]
enum Speed {
    Instant { fee: u32 },
    Standard,
}

/// Pays an order out: every field beside `order` is one of two flattened enums'.
#[tool(idempotent(key = "payout:<order>", recover = find_payout))]
async fn pay_out(
    payments: State<Payments>,
    order: String,
    #[serde(flatten)] to: PayTo,
    #[serde(flatten)] speed: Speed,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, 0, &format!("{to:?} {speed:?}")))
}

async fn find_payout(
    payments: State<Payments>,
    order: String,
    to: PayTo,
    speed: Speed,
) -> Result<Option<String>, ToolError> {
    let _ = (to, speed);
    Ok(payments.find(&order))
}

/// The fields of two flattened enums (an `allOf` of two `oneOf`s) are fields the kit changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_flattened_enums_fields_are_fields_the_kit_changes() {
    for backend in backends() {
        let args = json!({"order": "o-1", "method": "card", "last4": "4242", "speed": "standard"});
        let report = RetryCheck::new("pay_out", args, || Arc::new(Payments::default()))
            .toolbox(|builder, payments| {
                builder.shared_state(payments.clone()).tool(PayOut).build()
            })
            .effects(|payments| payments.count())
            .store(backend)
            .run()
            .await;
        assert_other_arguments_conflict(&report);
    }
}

/// Prepares an order in a step, then charges it outside any step; its lookup never asks the
/// provider (issue 48, bug 1).
#[tool(idempotent(key = "charge-prepared:<order>", recover = never_looks))]
async fn charge_after_a_step(
    payments: State<Payments>,
    ctx: &ToolContext,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    ctx.once("prepare", async { Ok::<_, ToolError>(()) })
        .await?;
    Ok(payments.charge(&order, cents, &note))
}

async fn never_looks(
    payments: State<Payments>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
    note: String,
) -> Result<Option<String>, ToolError> {
    let _ = (payments, ctx, order, cents, note);
    Ok(None)
}

/// Charges an order outside any step, then ships it in a step (issue 48, bug 3).
#[tool(idempotent(key = "charge-then-ship:<order>"))]
async fn charge_then_ship(
    payments: State<Payments>,
    ctx: &ToolContext,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    let charge = payments.charge(&order, cents, &note);
    ctx.once("ship", async { Ok::<_, ToolError>(()) }).await?;
    Ok(charge)
}

/// Refunds an order, keyed on the call's place in the run (issue 48, bug 2).
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund_by_step(
    payments: State<Payments>,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
    /// A note for the customer.
    #[arg(ignore)]
    note: String,
) -> Result<String, ToolError> {
    Ok(payments.charge(&order, cents, &note))
}

fn check_one<T: toolkey::Tool>(
    tool: &'static str,
    make: fn() -> T,
    backend: Backend,
) -> RetryCheck<Arc<Payments>> {
    RetryCheck::new(tool, args(), || Arc::new(Payments::default()))
        .toolbox(move |builder, payments| {
            builder.shared_state(payments.clone()).tool(make()).build()
        })
        .effects(|payments| payments.count())
        .store(backend)
}

/// The row a scenario of this name produced.
fn named<'a>(report: &'a Report, name: &str) -> &'a toolkey::testing::Row {
    report
        .rows
        .iter()
        .find(|r| r.scenario.name() == name)
        .unwrap_or_else(|| panic!("no row `{name}`\n{report}"))
}

/// Issue 48, bug 1: the worker must die at the tool's own record, after the charge, not at the
/// step's record before it; a recover hook that never looks then charges twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_before_the_effect_does_not_hide_a_recover_hook_that_never_looks() {
    for backend in backends() {
        let report = check_one("charge_after_a_step", || ChargeAfterAStep, backend)
            .run()
            .await;
        assert!(!report.passed(), "{report}");
        let crash = report.row(Crash).unwrap();
        assert_eq!(
            (crash.expected, crash.observed, crash.verdict),
            (1, 2, Fail),
            "{report}"
        );
        assert!(
            reason(&report, Crash).starts_with(
                "did the work twice: after the worker died at the tool's record, the retry ran again; the recover hook found nothing, though the dead worker had acted"
            ),
            "{report}"
        );
    }
}

/// Issue 48, bug 3: one failed reservation of the step after the charge answers a retryable
/// `STORE_UNAVAILABLE` and frees the key; the retry charges twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_outside_any_step_is_done_twice_after_a_store_blip_at_the_step() {
    for backend in backends() {
        let report = check_one("charge_then_ship", || ChargeThenShip, backend)
            .run()
            .await;
        assert!(!report.passed(), "{report}");
        let row = named(&report, "store fails at a write");
        assert_eq!(
            (row.expected, row.observed, row.verdict),
            (1, 2, Fail),
            "{report}"
        );
        let why = row.reason.clone().unwrap_or_default();
        assert!(
            why.starts_with("did the work twice: the store failed step `ship`'s reservation once (not applied); the call answered STORE_UNAVAILABLE, which invites a retry, and its key was freed; the retry ran the body again, and what it did outside its steps was done again: a tool with steps must do each of its effects inside a `ctx.once` step"),
            "{report}"
        );
    }
}

/// Issue 48, bug 2: a model that times out asks again as a new tool call, at a new step, which
/// a key on `<ctx.step>` takes for a new action: the kit never calls such a tool safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_on_the_step_is_never_certified_against_the_models_retry() {
    for backend in backends() {
        let report = check_one("refund_by_step", || RefundByStep, backend)
            .run()
            .await;
        assert!(!report.passed(), "{report}");
        let panic = std::panic::catch_unwind(|| report.assert_retry_safe());
        assert!(panic.is_err(), "{report}");
        let row = named(&report, "model asks again");
        assert_ne!(row.verdict, Pass, "{report}");
        assert_eq!((row.expected, row.observed), (1, 3), "{report}");
        let why = row.reason.clone().unwrap_or_default();
        assert!(
            why.contains("the key `refund:<ctx.run_id>:<ctx.step>` holds `<ctx.step>`"),
            "{report}"
        );
    }
}
