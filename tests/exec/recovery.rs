//! A stale reservation after a crash: unknown without a recover hook, run once when the hook
//! finds nothing, nothing run when it finds the effect; a multi-step tool resumes step by step,
//! and a step outside a keyed tool is an error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolkey::store::{ManualClock, MemoryStore, Record, RecordKey, Reservation, Reservations};
use toolkey::{tool, ErrorCode, State, Tool, ToolContext, ToolError, Toolbox};

use super::ctx;

/// The outside system a crashed worker may or may not have reached.
#[derive(Default)]
pub(super) struct Ledger {
    pub(super) refunds: Mutex<Vec<String>>,
    /// What the recover hook finds.
    found: Mutex<Option<String>>,
    lookups: AtomicUsize,
}

/// Refund one order.
#[tool(idempotent(key = "refund:<order>", recover = find_refund), lease = "30s")]
async fn refund(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.refunds.lock().unwrap().push(order.clone());
    Ok(format!("refund-of-{order}"))
}

/// Looks the refund up by order before acting again.
async fn find_refund(ledger: State<Ledger>, order: String) -> Result<Option<String>, ToolError> {
    let _ = order;
    ledger.lookups.fetch_add(1, Ordering::SeqCst);
    Ok(ledger.found.lock().unwrap().clone())
}

/// The same refund without a hook.
#[tool(idempotent(key = "refund:<order>"), name = "refund_blind")]
pub(super) async fn refund_without_hook(
    ledger: State<Ledger>,
    order: String,
) -> Result<String, ToolError> {
    ledger.refunds.lock().unwrap().push(order.clone());
    Ok(format!("refund-of-{order}"))
}

/// A worker that reserved the refund's key and died: its reservation is left in the shared store.
async fn crashed_worker(store: &MemoryStore, tool: &dyn Tool, order: &str) {
    let call = tool.prepare(&json!({"order": order}), &ctx()).unwrap();
    let key = RecordKey::new("acme-corp", call.key().unwrap().as_str());
    let reserved = store
        .reserve(
            &key,
            "tool",
            call.fingerprint().unwrap(),
            &toolkey::store::Token::generate(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(reserved, Reservation::Reserved { .. }));
}

async fn after_a_crash(
    found: Option<&str>,
    with_hook: bool,
) -> (Result<toolkey::ToolOutput, ToolError>, Arc<Ledger>, Toolbox) {
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let ledger = Arc::new(Ledger::default());
    *ledger.found.lock().unwrap() = found.map(str::to_string);
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(ledger.clone())
        .tool(Refund)
        .tool(RefundWithoutHook)
        .build()
        .unwrap();
    let (name, tool): (&str, &dyn Tool) = if with_hook {
        ("refund", &Refund)
    } else {
        ("refund_blind", &RefundWithoutHook)
    };
    crashed_worker(&store, tool, "o-9").await;
    let err = toolbox
        .call(name, json!({"order": "o-9"}), &ctx())
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::InProgress),
        "until the lease lapses: {err:?}"
    );
    clock.advance(Duration::from_secs(31));
    let result = toolbox.call(name, json!({"order": "o-9"}), &ctx()).await;
    (result, ledger, toolbox)
}

#[tokio::test]
async fn a_stale_reservation_without_a_hook_is_outcome_unknown() {
    let (result, ledger, toolbox) = after_a_crash(None, false).await;
    let err = result.unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(!err.is_retryable());
    let status = toolbox
        .call("refund_blind_status", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown");
    assert_eq!(ledger.refunds.lock().unwrap().len(), 0);
    assert_eq!(toolbox.stats().unknown, 1);
}

#[tokio::test]
async fn a_stale_reservation_whose_lookup_finds_nothing_runs_once() {
    let (result, ledger, toolbox) = after_a_crash(None, true).await;
    let out = result.unwrap();
    assert_eq!(out.value, json!("refund-of-o-9"));
    assert!(!out.replayed);
    assert!(
        toolbox
            .call("refund", json!({"order": "o-9"}), &ctx())
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(ledger.refunds.lock().unwrap().len(), 1);
    assert_eq!(ledger.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stale_reservation_whose_lookup_finds_the_effect_runs_nothing() {
    let (result, ledger, toolbox) = after_a_crash(Some("refund-found-by-lookup"), true).await;
    let out = result.unwrap();
    assert_eq!(out.value, json!("refund-found-by-lookup"));
    let status = toolbox
        .call("refund_status", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    assert_eq!(status.value["result"], "refund-found-by-lookup");
    assert_eq!(ledger.refunds.lock().unwrap().len(), 0);
    assert_eq!(toolbox.stats().recovered, 1);
}

/// Two callers meet one stale reservation and the other takes it over first: the call whose
/// take-over comes second keeps its recover hook, reads the record again, and asks the hook
/// about what it finds there (the other caller died at once, unsure whether it acted).
#[tokio::test(start_paused = true)]
async fn a_take_over_lost_to_another_caller_keeps_the_recover_hook() {
    use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
    let clock = Arc::new(ManualClock::new());
    let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
    // The call's take-over waits a second before it applies; the other caller acts meanwhile.
    let store = Arc::new(FaultyStore::new(
        inner.clone(),
        Plan::script([(Op::TakeOver, Fault::Delay(Duration::from_secs(1)))]),
    ));
    let ledger = Arc::new(Ledger::default());
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(ledger.clone())
        .tool(Refund)
        .build()
        .unwrap();
    crashed_worker(&inner, &Refund, "o-9").await;
    clock.advance(Duration::from_secs(31));
    let call = tokio::spawn({
        let toolbox = toolbox.clone();
        async move {
            toolbox
                .call("refund", json!({"order": "o-9"}), &ctx())
                .await
        }
    });
    while store.injected().delayed == 0 {
        tokio::task::yield_now().await;
    }

    // The other caller takes the reservation over, then marks it unknown and is gone.
    let prepared = Refund.prepare(&json!({"order": "o-9"}), &ctx()).unwrap();
    let key = RecordKey::new("acme-corp", prepared.key().unwrap().as_str());
    let Some(Record::Stale { token: stale, .. }) = inner.get(&key).await.unwrap() else {
        panic!("the crashed worker's reservation is stale");
    };
    let other = inner
        .take_over(&key, &stale, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the other caller takes it over first");
    assert!(inner.mark_unknown(&key, &other).await.unwrap());

    let out = call.await.unwrap().unwrap();
    assert_eq!(out.value, json!("refund-of-o-9"));
    assert!(!out.replayed);
    assert_eq!(ledger.refunds.lock().unwrap().len(), 1);
    assert_eq!(ledger.lookups.load(Ordering::SeqCst), 1);
    assert_eq!(toolbox.stats().recovered, 1);
    assert_eq!(store.injected().delayed, 1);
}

/// A two-step tool's outside world: invoices created and emails sent, and a crash switch.
#[derive(Default)]
struct Mailroom {
    created: AtomicUsize,
    emailed: AtomicUsize,
    crash_between_steps: std::sync::atomic::AtomicBool,
}

/// Create the invoice, then email it: each step at most once.
#[tool(idempotent(key = "invoice:<customer>:<period>", recover = resume_steps))]
async fn invoice_and_email(
    mail: State<Mailroom>,
    ctx: &ToolContext,
    customer: String,
    period: String,
) -> Result<String, ToolError> {
    let id: String = ctx
        .once("invoice-create", async {
            let n = mail.created.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, ToolError>(format!("inv-{n}-{customer}-{period}"))
        })
        .await?;
    if mail.crash_between_steps.swap(false, Ordering::SeqCst) {
        panic!("worker crashed between the steps");
    }
    ctx.once("invoice-email", async {
        mail.emailed.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ToolError>(())
    })
    .await?;
    Ok(id)
}

/// Every effect of `invoice_and_email` is its own keyed step, so after a crash it is safe to run
/// the body again: finished steps replay, missing ones run.
async fn resume_steps(
    _mail: State<Mailroom>,
    _ctx: &ToolContext,
    _customer: String,
    _period: String,
) -> Result<Option<String>, ToolError> {
    Ok(None)
}

#[tokio::test]
async fn a_multi_step_tool_that_crashed_between_steps_runs_each_step_once() {
    let mail = Arc::new(Mailroom::default());
    mail.crash_between_steps.store(true, Ordering::SeqCst);
    let toolbox = Toolbox::builder()
        .shared_state(mail.clone())
        .tool(InvoiceAndEmail)
        .build()
        .unwrap();
    let args = json!({"customer": "acme", "period": "2026-10"});
    let err = toolbox
        .call("invoice_and_email", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(err.message().contains("panicked"), "{err}");
    assert!(
        !err.message().contains("worker crashed"),
        "a panic message may hold argument values: it stays out of the answer"
    );
    assert!(
        err.is_retryable(),
        "with a recover hook, the retry looks before it acts"
    );
    assert_eq!(
        (
            mail.created.load(Ordering::SeqCst),
            mail.emailed.load(Ordering::SeqCst)
        ),
        (1, 0)
    );

    let out = toolbox
        .call("invoice_and_email", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(out.value, json!("inv-1-acme-2026-10"));
    let again = toolbox
        .call("invoice_and_email", args, &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(
        (
            mail.created.load(Ordering::SeqCst),
            mail.emailed.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
}

#[tokio::test]
async fn once_outside_a_keyed_tool_is_an_error_not_a_silent_repeat() {
    let err = ToolContext::new("r")
        .once("step", async { Ok::<_, ToolError>(1) })
        .await
        .unwrap_err();
    assert!(err.message().contains("needs a keyed tool"));
}
