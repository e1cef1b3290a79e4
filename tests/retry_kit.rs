//! The retry kit proves itself by mutation: `toolkey::testing::RetryCheck` against tools that are
//! unsafe on purpose, each of which must fail (or be left unjudged) on the row that names its
//! mistake, and against safe tools — the examples' keyed tools and the test catalog's among them —
//! each of which must pass every row. Effects are counted in fake outside systems.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolkey::testing::{Backend, Report, RetryCheck, Scenario, Verdict};
use toolkey::{tool, State, Tool, ToolContext, ToolDefinition, ToolError};
use toolkey_tests::{billing, catalog, invoice, refund};

/// The outside system of the kit's own tools: every charge, by order and amount; charges sent
/// with a provider key are made once per key, as a payment API does.
#[derive(Default)]
struct Ledger {
    charges: Mutex<Vec<(String, i64)>>,
    by_provider_key: Mutex<HashMap<String, usize>>,
    /// What recover hooks that look in the wrong place read: never written.
    receipts: Mutex<Vec<String>>,
    /// Counts calls of a body that names its steps by it.
    runs: Mutex<u32>,
}

impl Ledger {
    fn charge(&self, order: &str, cents: i64) -> String {
        let mut charges = self.charges.lock().unwrap();
        charges.push((order.to_string(), cents));
        format!("ch_{}", charges.len())
    }

    /// A charge the provider deduplicates by `key`.
    fn charge_once(&self, key: &str, order: &str, cents: i64) -> String {
        let mut seen = self.by_provider_key.lock().unwrap();
        if let Some(n) = seen.get(key) {
            return format!("ch_{n}");
        }
        let id = self.charge(order, cents);
        seen.insert(key.to_string(), self.count());
        id
    }

    fn find(&self, order: &str) -> Option<String> {
        let charges = self.charges.lock().unwrap();
        let at = charges.iter().position(|(o, _)| o == order)?;
        Some(format!("ch_{}", at + 1))
    }

    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

// ---------------------------------------------------------------------------------------------
// Unsafe on purpose

/// Prepares an order in a step, then charges it; the hook never looks (issue 48, bug 1).
#[tool(idempotent(key = "prepared:<order>", recover = never_looks))]
async fn charge_after_a_step(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    ctx.once("prepare", async { Ok::<_, ToolError>(()) })
        .await?;
    Ok(ledger.charge(&order, cents))
}

async fn never_looks(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<Option<String>, ToolError> {
    let _ = (ledger, ctx, order, cents);
    Ok(None)
}

/// Refunds keyed on the call's place in the run (issue 48, bug 2).
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund_by_step(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&order, cents))
}

/// Charges outside any step, then ships in a step (issue 48, bug 3).
#[tool(idempotent(key = "charge-ship:<order>"))]
async fn charge_then_ship(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    let charge = ledger.charge(&order, cents);
    ctx.once("ship", async { Ok::<_, ToolError>(()) }).await?;
    Ok(charge)
}

/// Charges a customer for a month; the key leaves the month out.
#[tool(idempotent(key = "monthly:<customer>"))]
async fn charge_monthly(
    ledger: State<Ledger>,
    customer: String,
    month: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&format!("{customer}/{month}"), cents))
}

/// Charges an order; the amount is ignored, though it is what is charged.
#[tool(idempotent(key = "amount-ignored:<order>"))]
async fn charge_ignoring_amount(
    ledger: State<Ledger>,
    order: String,
    #[arg(ignore)] cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&order, cents))
}

/// Charges an order; the hook asks by the receipt, which nothing writes.
#[tool(idempotent(key = "elsewhere:<order>", recover = find_receipt))]
async fn charge_looking_elsewhere(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&order, cents))
}

async fn find_receipt(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<Option<String>, ToolError> {
    let _ = cents;
    let receipts = ledger.receipts.lock().unwrap();
    Ok(receipts.iter().find(|r| **r == order).cloned())
}

/// Charges, then fails a confirmation read with an error that invites a retry: the charge is
/// never recorded.
#[tool(idempotent(key = "unconfirmed:<order>"))]
async fn charge_then_fail_retryably(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    ledger.charge(&order, cents);
    Err(
        ToolError::new("CONFIRMATION_UNAVAILABLE", "the confirmation did not load")
            .with_retryable(true),
    )
}

/// Charges a customer for a month, sending the provider a key of its own that leaves the month
/// out: two months share the provider's step.
#[tool(idempotent(key = "provider:<customer>:<month>"))]
async fn charge_with_a_shared_provider_key(
    ledger: State<Ledger>,
    customer: String,
    month: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge_once(
        &format!("charge-{customer}"),
        &format!("{customer}/{month}"),
        cents,
    ))
}

/// Charges twice in one call: a retry loop around a provider without keys.
#[tool(idempotent(key = "twice:<order>"))]
async fn charge_twice(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    ledger.charge(&order, cents);
    Ok(ledger.charge(&order, cents))
}

/// Declared natural, though each call adds a charge.
#[tool(natural)]
async fn charge_declared_natural(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&order, cents))
}

/// Charges in a step; the hook looks for a receipt no step writes, so it never finds the step's
/// effect.
#[tool(idempotent(key = "stepped:<order>", recover = find_receipt_stepped))]
async fn charge_in_a_step_hook_blind(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    ctx.once("charge", async {
        Ok::<_, ToolError>(ledger.charge(&order, cents))
    })
    .await
}

async fn find_receipt_stepped(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<Option<String>, ToolError> {
    let _ = ctx;
    find_receipt(ledger, order, cents).await
}

/// Charges in a step named anew on every run of the body, then ships in a step.
#[tool(idempotent(key = "renamed-step:<order>"))]
async fn charge_in_a_step_named_per_run(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    let run = {
        let mut runs = ledger.runs.lock().unwrap();
        *runs += 1;
        *runs
    };
    let charge = ctx
        .once(&format!("charge-{run}"), async {
            Ok::<_, ToolError>(ledger.charge(&order, cents))
        })
        .await?;
    ctx.once("ship", async { Ok::<_, ToolError>(()) }).await?;
    Ok(charge)
}

/// Charges an order, with a status companion.
#[tool(idempotent(key = "statused:<order>", status = "charge_statused_status"))]
async fn charge_statused(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(ledger.charge(&order, cents))
}

/// `charge_statused`, whose status companion derives another key than the tool's.
struct ChargeWithAStrayStatus;

impl Tool for ChargeWithAStrayStatus {
    fn definition(&self) -> ToolDefinition {
        ChargeStatused.definition()
    }

    fn prepare(
        &self,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<toolkey::__private::Call, ToolError> {
        ChargeStatused.prepare(args, ctx)
    }

    fn status_companion(&self) -> Option<toolkey::__private::StatusCompanion> {
        let def = ChargeStatused.definition();
        let key: toolkey::__private::KeyFn = Box::new(|args: Value, _: &ToolContext| {
            let mut key = toolkey::__private::KeyBuilder::new("statused-old:", "");
            key.part(args["order"].as_str().unwrap_or_default(), "order");
            key.finish()
        });
        Some(toolkey::__private::status_companion(
            def.name(),
            def.status_tool()?,
            def.input_schema().clone(),
            key,
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Safe

/// Charges an order; a retry after a crash looks the charge up by order first.
#[tool(idempotent(key = "charge:<order>", recover = find_charge))]
async fn charge(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
    #[arg(ignore)] note: String,
) -> Result<String, ToolError> {
    let _ = note;
    Ok(ledger.charge(&order, cents))
}

async fn find_charge(
    ledger: State<Ledger>,
    order: String,
    cents: i64,
    note: String,
) -> Result<Option<String>, ToolError> {
    let _ = (cents, note);
    Ok(ledger.find(&order))
}

/// Charges, then ships, each in a step of its own; no hook: a crash leaves an honest unknown.
#[tool(idempotent(key = "steps:<order>"))]
async fn charge_and_ship_in_steps(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    let charge = ctx
        .once("charge", async {
            Ok::<_, ToolError>(ledger.charge(&order, cents))
        })
        .await?;
    ctx.once("ship", async { Ok::<_, ToolError>(()) }).await?;
    Ok(charge)
}

// ---------------------------------------------------------------------------------------------
// The catalogue

/// A report, made on demand.
type Run = Pin<Box<dyn Future<Output = Report> + Send>>;

/// One tool of the catalogue: what the kit must say about it.
struct Entry {
    name: &'static str,
    /// `None` for a safe tool; otherwise the row and verdict that must name the mistake, and a
    /// part of that row's reason.
    caught: Option<(Scenario, Verdict, &'static str)>,
    run: Box<dyn Fn(Backend) -> Run + Send + Sync>,
}

fn ledger_check<T: Tool>(
    tool: &'static str,
    make: fn() -> T,
    args: Value,
) -> RetryCheck<Arc<Ledger>> {
    RetryCheck::new(tool, args, || Arc::new(Ledger::default()))
        .toolbox(move |builder, ledger| builder.shared_state(ledger.clone()).tool(make()).build())
        .effects(|ledger| ledger.count())
}

fn order() -> Value {
    json!({"order": "o-1", "cents": 500})
}

/// A catalogue entry over the ledger; `other`: the other action, when the mistake needs one.
fn on_ledger<T: Tool>(
    name: &'static str,
    make: fn() -> T,
    args: Value,
    other: Option<Value>,
    caught: Option<(Scenario, Verdict, &'static str)>,
) -> Entry {
    Entry {
        name,
        caught,
        run: Box::new(move |backend| {
            let mut check = ledger_check(name, make, args.clone()).store(backend);
            if let Some(other) = &other {
                check = check.other_action(other.clone());
            }
            Box::pin(async move { check.run().await })
        }),
    }
}

use Scenario::*;
use Verdict::{CannotJudge, Fail};

fn unsafe_tools() -> Vec<Entry> {
    let month = |m: &str| json!({"customer": "acme", "month": m, "cents": 500});
    vec![
        on_ledger(
            "charge_after_a_step",
            || ChargeAfterAStep,
            order(),
            None,
            Some((Crash, Fail, "after the worker died at the tool's record, the retry ran again; the recover hook found nothing")),
        ),
        on_ledger(
            "refund_by_step",
            || RefundByStep,
            order(),
            None,
            Some((ModelRetry, CannotJudge, "holds `<ctx.step>`, so toolkey took each new call for a new action")),
        ),
        on_ledger(
            "charge_then_ship",
            || ChargeThenShip,
            order(),
            None,
            Some((StoreFails, Fail, "what it did outside its steps was done again")),
        ),
        on_ledger(
            "charge_monthly",
            || ChargeMonthly,
            month("2026-10"),
            Some(month("2026-11")),
            Some((OtherAction, Fail, "does not tell it from the first (they differ in `month`)")),
        ),
        on_ledger(
            "charge_ignoring_amount",
            || ChargeIgnoringAmount,
            order(),
            Some(json!({"order": "o-1", "cents": 700})),
            Some((OtherAction, Fail, "`cents` is `#[arg(ignore)]`: an argument that changes the effect must reach the fingerprint")),
        ),
        on_ledger(
            "charge_looking_elsewhere",
            || ChargeLookingElsewhere,
            order(),
            None,
            Some((Crash, Fail, "the recover hook found nothing, though the dead worker had acted")),
        ),
        on_ledger(
            "charge_then_fail_retryably",
            || ChargeThenFailRetryably,
            order(),
            None,
            Some((Replay, Fail, "the first call acted and answered CONFIRMATION_UNAVAILABLE (the confirmation did not load), which invites a retry")),
        ),
        on_ledger(
            "charge_with_a_shared_provider_key",
            || ChargeWithASharedProviderKey,
            month("2026-10"),
            Some(month("2026-11")),
            Some((OtherAction, Fail, "the other action answered ok and made no effect")),
        ),
        on_ledger(
            "charge_twice",
            || ChargeTwice,
            order(),
            None,
            Some((Replay, Fail, "the first call alone made 2 effects")),
        ),
        on_ledger(
            "charge_declared_natural",
            || ChargeDeclaredNatural,
            order(),
            None,
            Some((Replay, Fail, "`charge_declared_natural` is `natural`: no key ties a retry to the first call")),
        ),
        on_ledger(
            "charge_in_a_step_hook_blind",
            || ChargeInAStepHookBlind,
            order(),
            None,
            Some((CrashAtStep, Fail, "after the worker died at step `charge`'s record, the retry ran again; the recover hook found nothing")),
        ),
        on_ledger(
            "charge_in_a_step_named_per_run",
            || ChargeInAStepNamedPerRun,
            order(),
            None,
            Some((StoreFails, Fail, "the store failed step `ship`'s reservation once (not applied)")),
        ),
        on_ledger(
            "charge_statused",
            || ChargeWithAStrayStatus,
            order(),
            None,
            Some((Timeout, Fail, "the status tool, asked with the key's fields alone (`order`), answered `not_found` after the body ended")),
        ),
        // The refund example's tool keyed on the run and the step: a model's retry is a new
        // refund to it, so the kit cannot call it safe.
        Entry {
            name: "refund_order (examples/refund)",
            caught: Some((ModelRetry, CannotJudge, "holds `<ctx.step>`")),
            run: Box::new(|backend| {
                let check = RetryCheck::new("refund_order", json!({"order": "order-1", "cents": 5000}), || {
                    let api = Arc::new(refund::RefundApi::new(true, Duration::ZERO));
                    // The API drops its first reply; a retrying client sends the same key again.
                    Arc::new(refund::RetryingClient { api, attempts: 2 })
                })
                .toolbox(|builder, client| builder.shared_state(client.clone()).tool(refund::RefundOrder).build())
                .effects(|client| client.api.count())
                .store(backend);
                Box::pin(async move { check.run().await })
            }),
        },
    ]
}

fn safe_tools() -> Vec<Entry> {
    vec![
        on_ledger(
            "charge",
            || Charge,
            json!({"order": "o-1", "cents": 500, "note": "Thanks"}),
            Some(json!({"order": "o-2", "cents": 500, "note": "Thanks"})),
            None,
        ),
        on_ledger(
            "charge_and_ship_in_steps",
            || ChargeAndShipInSteps,
            order(),
            Some(json!({"order": "o-2", "cents": 500})),
            None,
        ),
        Entry {
            name: "send_invoice (examples/invoice)",
            caught: None,
            run: Box::new(|backend| {
                let check = RetryCheck::new(
                    "send_invoice",
                    json!({"customer": "acme", "period": "2026-10", "amount": 1200.0, "memo": "Consulting, October 2026"}),
                    || Arc::new(invoice::BillingProvider::open(std::path::Path::new(":memory:"), Duration::ZERO).unwrap()),
                )
                .toolbox(|builder, billing| builder.shared_state(billing.clone()).tool(invoice::SendInvoice).build())
                .effects(|billing| billing.invoices().unwrap().len())
                .other_action(json!({"customer": "acme", "period": "2026-11", "amount": 1200.0, "memo": "November"}))
                .store(backend);
                Box::pin(async move { check.run().await })
            }),
        },
        Entry {
            name: "refund_unkeyed_api (examples/refund)",
            caught: None,
            run: Box::new(|backend| {
                let check = RetryCheck::new(
                    "refund_unkeyed_api",
                    json!({"order": "order-3", "cents": 1200}),
                    || {
                        let api = Arc::new(refund::RefundApi::new(false, Duration::ZERO));
                        // The API drops its first reply: spend that on a refund of another order
                        // before the check counts, so the check's calls get their replies.
                        let spent = api.clone();
                        std::thread::spawn(move || {
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .enable_time()
                                .build()
                                .unwrap();
                            let _ = runtime.block_on(spent.refund("order-0", 1, None));
                        })
                        .join()
                        .unwrap();
                        api
                    },
                )
                .toolbox(|builder, api| {
                    builder
                        .shared_state(api.clone())
                        .tool(refund::RefundUnkeyedApi)
                        .build()
                })
                .effects(|api| api.count())
                .other_action(json!({"order": "order-4", "cents": 1200}))
                .store(backend);
                Box::pin(async move { check.run().await })
            }),
        },
        catalog_entry(
            "create_shipment",
            || catalog::CreateShipment,
            |f| f.carrier.shipments.lock().unwrap().len(),
        ),
        catalog_entry(
            "refund",
            || catalog::Refund,
            |f| f.payments.refunds.lock().unwrap().len(),
        ),
        catalog_entry(
            "pay_out",
            || catalog::PayOut,
            |f| f.payments.refunds.lock().unwrap().len(),
        ),
        catalog_entry(
            "send_invoice",
            || billing::SendInvoice,
            |f| f.billing.count(),
        ),
    ]
}

/// The test catalog's outside systems.
struct Systems {
    billing: Arc<billing::Billing>,
    carrier: Arc<catalog::Carrier>,
    payments: Arc<catalog::Payments>,
}

/// A keyed tool of `tests/catalog` with its sample arguments.
fn catalog_entry<T: Tool>(
    name: &'static str,
    tool: fn() -> T,
    count: fn(&Systems) -> usize,
) -> Entry {
    Entry {
        name,
        caught: None,
        run: Box::new(move |backend| {
            let check = RetryCheck::new(name, catalog::arguments(name), || Systems {
                billing: Arc::default(),
                carrier: Arc::default(),
                payments: Arc::default(),
            })
            .toolbox(move |builder, s| {
                builder
                    .shared_state(s.billing.clone())
                    .shared_state(s.carrier.clone())
                    .shared_state(s.payments.clone())
                    .tool(tool())
                    .build()
            })
            .effects(count)
            .store(backend);
            Box::pin(async move { check.run().await })
        }),
    }
}

/// Whether the kit said about `entry` what it must: the expected row fails (or is left
/// unjudged) for a reason naming the mistake, and the tool is not passed; a safe tool passes.
fn verdict_of(entry: &Entry, report: &Report) -> Result<(), String> {
    match entry.caught {
        None if report.passed() => Ok(()),
        None => Err(format!(
            "the safe tool `{}` did not pass\n{report}",
            entry.name
        )),
        Some((scenario, verdict, why)) => {
            let row = report.row(scenario).expect("every scenario has a row");
            let reason = row.reason.clone().unwrap_or_default();
            if report.passed() {
                Err(format!("the unsafe tool `{}` passed\n{report}", entry.name))
            } else if row.verdict != verdict || !reason.contains(why) {
                Err(format!(
                    "`{}`: expected {verdict} on `{scenario}` naming \"{why}\", got {} ({reason})\n{report}",
                    entry.name, row.verdict
                ))
            } else {
                Ok(())
            }
        }
    }
}

async fn judge(entries: Vec<Entry>, backend: Backend) -> Vec<Result<(), String>> {
    let mut verdicts = Vec::new();
    for entry in &entries {
        let report = (entry.run)(backend.clone()).await;
        verdicts.push(verdict_of(entry, &report));
    }
    verdicts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unsafe_tool_fails_on_the_row_that_names_its_mistake() {
    let failures: Vec<String> = judge(unsafe_tools(), Backend::memory())
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_safe_tool_passes() {
    let failures: Vec<String> = judge(safe_tools(), Backend::memory())
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The catalogue on SQLite too, for the three tools of issue 48 and a safe tool with steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issues_tools_fail_and_a_stepped_tool_passes_on_sqlite() {
    let keep = [
        "charge_after_a_step",
        "refund_by_step",
        "charge_then_ship",
        "charge_and_ship_in_steps",
    ];
    let entries: Vec<Entry> = unsafe_tools()
        .into_iter()
        .chain(safe_tools())
        .filter(|e| keep.contains(&e.name))
        .collect();
    assert_eq!(entries.len(), keep.len());
    let failures: Vec<String> = judge(entries, Backend::sqlite())
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The line CI prints: every unsafe tool caught and every safe one passed, or the test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_kit_summary() {
    let unsafe_verdicts = judge(unsafe_tools(), Backend::memory()).await;
    let safe_verdicts = judge(safe_tools(), Backend::memory()).await;
    let caught = unsafe_verdicts.iter().filter(|v| v.is_ok()).count();
    let passed = safe_verdicts.iter().filter(|v| v.is_ok()).count();
    println!(
        "retry kit: {caught} unsafe tools caught of {}, {passed} safe tools passed of {}",
        unsafe_verdicts.len(),
        safe_verdicts.len()
    );
    assert!(
        unsafe_verdicts.len() >= 12,
        "the catalogue holds at least 12 unsafe tools"
    );
    let failures: Vec<&String> = unsafe_verdicts
        .iter()
        .chain(&safe_verdicts)
        .filter_map(|v| v.as_ref().err())
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}
