//! The executor's behaviour, counted on fake outside systems.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use toolkey::store::{
    ManualClock, MemoryStore, Outcome, Record, RecordKey, Reservation, Store, StoreError, Token,
};
use toolkey::{
    tool, BuildError, ErrorCode, Fingerprint, State, Tool, ToolContext, ToolError, Toolbox,
};
use toolkey_tests::billing;

use billing::{Billing, SendInvoiceScaled};

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

fn invoice(customer: &str, period: &str, amount: f64, memo: &str) -> Value {
    json!({"customer": customer, "period": period, "amount": amount, "memo": memo})
}

/// The seed's five ways, against any store.
async fn five_ways(store: Arc<dyn Store>) {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_store(store)
        .shared_state(billing.clone())
        .tool(SendInvoiceScaled)
        .build()
        .unwrap();
    let ctx = ctx();

    // 1. The billing call outlasts the timeout: TIMEOUT, retryable, naming the status tool.
    let first = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await;
    let err = first.unwrap_err();
    assert!(err.is(ErrorCode::Timeout), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.suggestion().unwrap().contains("invoice_status"));

    // 2. The model retries at once: the first call still runs.
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.suggestion().unwrap().contains("invoice_status"));

    // 3. After it finished, a retry with a reworded memo replays the first invoice.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let replay = toolbox
        .call(
            "send_invoice",
            invoice("ACME ", "2026-10", 100.0, "Invoice for October"),
            &ctx,
        )
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.value["memo"], "October");
    assert_eq!(replay.value["id"], "inv-1");

    // 4. Same key, other amount: CONFLICT, not a silent replay.
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 120.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert!(!err.is_retryable());

    // 5. Two simultaneous calls for another period: one TIMEOUT, one IN_PROGRESS.
    let (a, b) = tokio::join!(
        toolbox.call(
            "send_invoice",
            invoice("acme", "2026-11", 100.0, "November"),
            &ctx
        ),
        toolbox.call(
            "send_invoice",
            invoice("acme", "2026-11", 100.0, "November"),
            &ctx
        ),
    );
    let mut codes = vec![
        a.unwrap_err().code().to_string(),
        b.unwrap_err().code().to_string(),
    ];
    codes.sort();
    assert_eq!(codes, ["IN_PROGRESS", "TIMEOUT"]);

    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(billing.count(), 2, "exactly two invoices on the ledger");
    let stats = toolbox.stats();
    assert_eq!(
        (
            stats.executed,
            stats.replayed,
            stats.conflicts,
            stats.timeouts,
            stats.in_progress
        ),
        (2, 1, 1, 2, 2)
    );
}

#[tokio::test]
async fn five_ways_on_the_memory_store() {
    five_ways(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn five_ways_on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    five_ways(Arc::new(
        toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_concurrent_identical_calls_execute_once() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(50)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .build()
        .unwrap();
    let mut calls = Vec::new();
    for _ in 0..500 {
        let toolbox = toolbox.clone();
        calls.push(tokio::spawn(async move {
            toolbox
                .call(
                    "send_invoice",
                    invoice("acme", "2026-10", 100.0, "October"),
                    &ctx(),
                )
                .await
        }));
    }
    let (mut fresh, mut replays, mut in_progress) = (0, 0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(out) if out.replayed => replays += 1,
            Ok(_) => fresh += 1,
            Err(err) if err.is(ErrorCode::InProgress) => in_progress += 1,
            Err(err) => panic!("unexpected {err:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(fresh + replays + in_progress, 500);
    assert_eq!(billing.count(), 1);
    assert_eq!(toolbox.stats().executed, 1);
}

/// A payment system whose next answers can be scripted.
#[derive(Default)]
struct Payments {
    attempts: AtomicUsize,
    charges: Mutex<Vec<i64>>,
    fail_next: Mutex<Vec<ToolError>>,
}

/// Charge a card once per order.
#[tool(idempotent(key = "charge:<order>"))]
async fn charge(payments: State<Payments>, order: String, cents: i64) -> Result<Value, ToolError> {
    payments.attempts.fetch_add(1, Ordering::SeqCst);
    let scripted = payments.fail_next.lock().unwrap().pop();
    if let Some(err) = scripted {
        return Err(err);
    }
    payments.charges.lock().unwrap().push(cents);
    Ok(json!({"order": order, "charged": cents}))
}

fn payments_toolbox(payments: Arc<Payments>) -> Toolbox {
    Toolbox::builder()
        .shared_state(payments)
        .tool(Charge)
        .build()
        .unwrap()
}

/// A `CONFLICT` says what the other action's record says of it: that it ran, that it runs, or,
/// its lease lapsed, that its outcome is unknown; never that an action that stopped is running.
#[tokio::test]
async fn a_conflict_says_whether_the_other_action_ran_runs_or_is_unknown() {
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let payments = Arc::new(Payments::default());
    let toolbox = Toolbox::builder()
        .shared_state(payments.clone())
        .shared_store(store.clone())
        .tool(Charge)
        .build()
        .unwrap();
    // Another process holds order o-1's key for a charge of 500.
    let other = Charge
        .prepare(&json!({"order": "o-1", "cents": 500}), &ctx())
        .unwrap();
    let key = RecordKey::new("acme-corp", other.key().unwrap().as_str());
    let lease = Duration::from_secs(30);
    let fingerprint = other.fingerprint().unwrap();
    let held = store
        .reserve(&key, "charge", fingerprint, &Token::generate(), lease)
        .await
        .unwrap();
    assert!(matches!(held, Reservation::Reserved { .. }));
    let says = |err: &ToolError, what: &str| {
        assert!(err.is(ErrorCode::Conflict), "{err:?}");
        assert!(
            err.message()
                .starts_with(&format!("another action {what}:")),
            "{err}"
        );
    };
    let ctx = ctx();
    let charge = |order: &str, cents: i64| {
        toolbox.call("charge", json!({"order": order, "cents": cents}), &ctx)
    };
    says(
        &charge("o-1", 100).await.unwrap_err(),
        "is running under this call's key",
    );
    clock.advance(lease + Duration::from_secs(1));
    says(
        &charge("o-1", 100).await.unwrap_err(),
        "started under this call's key, and its outcome is unknown",
    );
    charge("o-2", 500).await.unwrap();
    says(
        &charge("o-2", 100).await.unwrap_err(),
        "already ran under this call's key",
    );
    assert_eq!(*payments.charges.lock().unwrap(), [500]);
    assert_eq!(payments.attempts.load(Ordering::SeqCst), 1);
}

/// Cancels an order by its number.
#[tool(idempotent(key = "cancel:<order_id>"))]
async fn cancel_order(payments: State<Payments>, order_id: u64) -> Result<u64, ToolError> {
    payments.charges.lock().unwrap().push(order_id as i64);
    Ok(order_id)
}

/// A whole float stands for an integer only below 2^53 in size: past it, the text the model wrote
/// may have been another integer (`9007199254740993.0` reads as ...992), and reading it as one
/// would cancel another order, or replay that order's answer.
#[tokio::test]
async fn a_whole_float_past_2_53_is_refused_never_read_as_another_integer() {
    let payments = Arc::new(Payments::default());
    let toolbox = Toolbox::builder()
        .shared_state(payments.clone())
        .tool(CancelOrder)
        .build()
        .unwrap();
    let ctx = ctx();
    let cancel = |text: &str| {
        let args: Value = serde_json::from_str(text).unwrap();
        toolbox.call("cancel_order", args, &ctx)
    };
    let first = cancel(r#"{"order_id": 9007199254740992}"#).await.unwrap();
    assert_eq!(first.value, json!(9_007_199_254_740_992_u64));
    for text in [
        r#"{"order_id": 9007199254740993.0}"#,
        r#"{"order_id": 9007199254740992.0}"#,
        r#"{"order_id": 1.8446744073709552e19}"#,
    ] {
        let err = cancel(text).await.unwrap_err();
        assert!(err.is(ErrorCode::InvalidArguments), "{text}: {err:?}");
    }
    // Below 2^53 a whole float is the integer it reads as, and the same action as that integer.
    let below = cancel(r#"{"order_id": 9007199254740991.0}"#).await.unwrap();
    assert_eq!(
        (below.value, below.replayed),
        (json!(9_007_199_254_740_991_u64), false)
    );
    let again = cancel(r#"{"order_id": 9007199254740991}"#).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        *payments.charges.lock().unwrap(),
        [9_007_199_254_740_992, 9_007_199_254_740_991]
    );
}

#[tokio::test]
async fn a_retryable_error_releases_the_key_and_the_retry_runs() {
    let payments = Arc::new(Payments::default());
    payments
        .fail_next
        .lock()
        .unwrap()
        .push(ToolError::new("GATEWAY_BUSY", "try later").with_retryable(true));
    let toolbox = payments_toolbox(payments.clone());
    let err = toolbox
        .call("charge", json!({"order": "o-1", "cents": 500}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "GATEWAY_BUSY");
    let ok = toolbox
        .call("charge", json!({"order": "o-1", "cents": 500}), &ctx())
        .await
        .unwrap();
    assert!(!ok.replayed);
    assert_eq!(payments.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(payments.charges.lock().unwrap().len(), 1);
    assert_eq!(toolbox.stats().released, 1);
}

#[tokio::test]
async fn a_terminal_error_is_recorded_and_replayed() {
    let payments = Arc::new(Payments::default());
    payments.fail_next.lock().unwrap().push(
        ToolError::new("PAYMENT_DECLINED", "card declined").with_suggestion("ask for another card"),
    );
    let toolbox = payments_toolbox(payments.clone());
    let first = toolbox
        .call("charge", json!({"order": "o-2", "cents": 500}), &ctx())
        .await
        .unwrap_err();
    let second = toolbox
        .call("charge", json!({"order": "o-2", "cents": 500}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(first, second);
    assert_eq!(second.code(), "PAYMENT_DECLINED");
    assert_eq!(payments.attempts.load(Ordering::SeqCst), 1);
    let status = toolbox
        .call("charge_status", json!({"order": "o-2"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "failed");
    assert_eq!(status.value["error"]["code"], "PAYMENT_DECLINED");
}

#[tokio::test]
async fn invalid_arguments_name_the_field_and_are_never_recorded() {
    let payments = Arc::new(Payments::default());
    let toolbox = payments_toolbox(payments.clone());
    let err = toolbox
        .call("charge", json!({"order": "o-3", "cents": "five"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments));
    assert!(err.is_retryable());
    assert!(err.message().contains("`cents`"), "{}", err.message());
    assert!(
        err.suggestion().unwrap().contains("`cents` as integer"),
        "{:?}",
        err.suggestion()
    );
    let err = toolbox
        .call("charge", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap_err();
    assert!(
        err.message().contains("missing field `cents`"),
        "{}",
        err.message()
    );
    let err = toolbox
        .call(
            "charge",
            json!({"order": "o-3", "cents": 1, "idempotency_key": "x"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(
        err.message().contains("unknown field `idempotency_key`"),
        "{}",
        err.message()
    );
    let status = toolbox
        .call("charge_status", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    toolbox
        .call("charge", json!({"order": "o-3", "cents": 1}), &ctx())
        .await
        .unwrap();
    assert_eq!(payments.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unknown_tools_list_the_ones_that_exist() {
    let toolbox = payments_toolbox(Arc::new(Payments::default()));
    let err = toolbox.call("refund", json!({}), &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::UnknownTool));
    assert!(!err.is_retryable());
    assert_eq!(err.suggestion(), Some("use one of: charge_status, charge"));
}

#[test]
fn two_tools_of_one_name_do_not_build() {
    let err = Toolbox::builder()
        .state(Payments::default())
        .tool(Charge)
        .tool(Charge)
        .build()
        .err()
        .unwrap();
    assert_eq!(err, BuildError::DuplicateName("charge_status".into()));
}

#[test]
fn missing_state_does_not_build() {
    let err = Toolbox::builder().tool(Charge).build().err().unwrap();
    assert!(
        matches!(err, BuildError::MissingState { ref tool, .. } if tool == "charge"),
        "{err}"
    );
}

/// Results of every shape.
#[tool(idempotent(key = "shape:<which>"))]
async fn shape(runs: State<AtomicUsize>, which: String) -> Result<Value, ToolError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(match which.as_str() {
        "unit" => serde_json::to_value(()).unwrap(),
        "zero" => json!(0),
        "false" => json!(false),
        "empty" => json!({}),
        _ => Value::Null,
    })
}

#[tokio::test]
async fn falsy_results_are_recorded_and_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let toolbox = Toolbox::builder()
        .shared_state(runs.clone())
        .tool(Shape)
        .build()
        .unwrap();
    for (which, expected) in [
        ("unit", json!(null)),
        ("zero", json!(0)),
        ("false", json!(false)),
        ("empty", json!({})),
        ("null", json!(null)),
    ] {
        let first = toolbox
            .call("shape", json!({"which": which}), &ctx())
            .await
            .unwrap();
        let again = toolbox
            .call("shape", json!({"which": which}), &ctx())
            .await
            .unwrap();
        assert_eq!((first.value, first.replayed), (expected.clone(), false));
        assert_eq!((again.value, again.replayed), (expected, true));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// A conversion whose rate comes out with all seventeen digits a float can need.
#[tool(idempotent(key = "convert:<order>", status = "convert_status"))]
async fn convert(runs: State<AtomicUsize>, order: String, amount: f64) -> Result<Value, ToolError> {
    let _ = order;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(json!({"booked": amount, "rate": 117.633_311_394_000_17}))
}

/// A replay and a status answer show the float the first call answered, to the last bit: the
/// stores keep results as text, and these floats read back one unit off in a careless reading.
/// (The workspace's test dependencies turn serde_json's exact reading on whatever the runtime
/// asks for; CI also runs the runtime's own unit test of it with a user's features.)
#[tokio::test]
async fn a_float_result_replays_to_the_last_bit() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        (
            "sqlite",
            Arc::new(toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap()),
        ),
    ];
    let amounts: [f64; 3] = [
        0.921_568_632_125_854_5,
        10_587.436_593_658_975,
        1.577_777_777_777_000_1,
    ];
    for (name, store) in stores {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .shared_store(store)
            .tool(Convert)
            .build()
            .unwrap();
        let bits = |value: &Value| {
            let number = |field: &str| value[field].as_f64().map(f64::to_bits);
            (number("booked"), number("rate"))
        };
        for (i, amount) in amounts.into_iter().enumerate() {
            let args = json!({"order": format!("o{i}"), "amount": amount});
            let first = toolbox.call("convert", args.clone(), &ctx()).await.unwrap();
            let expected = (
                Some(amount.to_bits()),
                Some(117.633_311_394_000_17_f64.to_bits()),
            );
            assert_eq!((bits(&first.value), first.replayed), (expected, false));
            // The second replay of the memory store copies what its first read kept.
            for _ in 0..2 {
                let again = toolbox.call("convert", args.clone(), &ctx()).await.unwrap();
                assert_eq!(
                    (bits(&again.value), again.replayed),
                    (expected, true),
                    "{name}"
                );
            }
            let status = toolbox.call("convert_status", args, &ctx()).await.unwrap();
            assert_eq!(status.value["status"], "completed", "{name}");
            assert_eq!(bits(&status.value["result"]), expected, "{name}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), amounts.len(), "{name}");
    }
}

/// A result `levels` deep: arrays and objects in turn around a number. (Not with `json!`, which
/// would copy the value built so far at every level.)
fn nested(levels: usize) -> Value {
    let mut value = json!(7);
    for level in 0..levels {
        value = if level % 2 == 0 {
            Value::Array(vec![value])
        } else {
            Value::Object([("in".to_string(), value)].into_iter().collect())
        };
    }
    value
}

#[tool(idempotent(key = "tree:<name>", status = "tree_status"))]
async fn tree(runs: State<AtomicUsize>, name: String, levels: usize) -> Result<Value, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(nested(levels))
}

/// Runs `test` on a runtime whose threads have room for values thousands of levels deep in a
/// debug build (serializing, comparing and dropping one recurses per level).
fn with_deep_stacks<F: std::future::Future<Output = ()>>(
    test: impl FnOnce() -> F + Send + 'static,
) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(test())
        })
        .unwrap()
        .join()
        .unwrap();
}

/// serde_json reads 128 levels at most: a result nested deeper was answered to its first call
/// and recorded, and every replay and status answer after it read the record as corrupt. A
/// result as deep as `MAX_RESULT_DEPTH` replays; one deeper is never recorded, since it could
/// not be read back: the tool acted, so it is kept as unknown and never run again.
#[test]
fn a_deep_result_replays_and_one_too_deep_to_record_is_kept_as_unknown() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .tool(Tree)
            .build()
            .unwrap();
        for (name, levels) in [("past-serde", 200), ("deepest", MAX_RESULT_DEPTH)] {
            let args = json!({"name": name, "levels": levels});
            let first = toolbox.call("tree", args.clone(), &ctx()).await.unwrap();
            let again = toolbox.call("tree", args, &ctx()).await.unwrap();
            assert_eq!((&first.value, first.replayed), (&nested(levels), false));
            assert_eq!((&again.value, again.replayed), (&nested(levels), true));
            let status = toolbox
                .call(
                    "tree_status",
                    json!({"name": name, "levels": levels}),
                    &ctx(),
                )
                .await
                .unwrap();
            assert_eq!(status.value["status"], "completed", "{name}");
            assert_eq!(status.value["result"], nested(levels));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        let args = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        for _ in 0..2 {
            let err = toolbox
                .call("tree", args.clone(), &ctx())
                .await
                .unwrap_err();
            assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
            assert!(!err.is_retryable());
        }
        let err = toolbox
            .call("tree", args.clone(), &ctx())
            .await
            .unwrap_err();
        let first = {
            // The first answer says why; later ones, that nobody knows the outcome.
            let fresh = json!({"name": "too-deep-2", "levels": MAX_RESULT_DEPTH + 1});
            toolbox.call("tree", fresh, &ctx()).await.unwrap_err()
        };
        assert!(
            first.message().contains("nests deeper than 4096 levels"),
            "{first:?}"
        );
        assert!(
            first.suggestion().unwrap().contains("do not repeat"),
            "{first:?}"
        );
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        let status = toolbox.call("tree_status", args, &ctx()).await.unwrap();
        assert_eq!(status.value["status"], "unknown");
        // Each too-deep call ran once: `too-deep` for its first call only, `too-deep-2` once.
        // Every one of the four too-deep calls ended in an unknown outcome: each first call's,
        // counted as a result that does not serialize is, and the two that met `too-deep`'s.
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        assert_eq!(toolbox.stats().unknown, 4);
    });
}

/// Builds a result `levels` deep in a step, counting the step's runs.
#[tool(idempotent(key = "deep-step:<name>"))]
async fn deep_step(
    runs: State<AtomicUsize>,
    ctx: &ToolContext,
    name: String,
    levels: usize,
) -> Result<bool, ToolError> {
    let _ = name;
    let tree: Value = ctx
        .once("build", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(nested(levels))
        })
        .await?;
    Ok(tree == nested(levels))
}

/// A step's result is bound by the same depth as a tool's: one as deep as `MAX_RESULT_DEPTH` is
/// recorded and handed back; one deeper is kept as unknown, and the answer names the step that
/// acted, not the tool.
#[test]
fn a_step_result_too_deep_to_record_is_kept_as_unknown_and_names_the_step() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .tool(DeepStep)
            .build()
            .unwrap();
        let deepest = json!({"name": "deepest", "levels": MAX_RESULT_DEPTH});
        for replayed in [false, true] {
            let out = toolbox.call("deep_step", deepest.clone(), &ctx()).await;
            let out = out.unwrap();
            assert_eq!((&out.value, out.replayed), (&json!(true), replayed));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let too_deep = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        let first = toolbox
            .call("deep_step", too_deep.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(first.is(ErrorCode::OutcomeUnknown), "{first:?}");
        assert!(!first.is_retryable());
        assert!(first.message().contains("step `build` acted"), "{first:?}");
        assert!(
            first.message().contains("nests deeper than 4096 levels"),
            "{first:?}"
        );
        let again = toolbox
            .call("deep_step", too_deep, &ctx())
            .await
            .unwrap_err();
        assert!(again.is(ErrorCode::OutcomeUnknown), "{again:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    });
}

/// Says a request went out and its reply was lost.
#[tool(idempotent(key = "lost-reply:<name>"))]
async fn lost_reply(runs: State<AtomicUsize>, name: String) -> Result<u32, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown(
        "the request went out and its reply was lost",
    ))
}

/// Crashes after acting.
#[tool(idempotent(key = "crashes:<name>"))]
async fn crashes(runs: State<AtomicUsize>, name: String) -> Result<u32, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    panic!("crashed after acting");
}

/// A call of `tool` (named `name`, with `args`) whose body ends with its outcome unknown, its
/// reservation lapsing while the store is slow to take the unknown mark, and another caller
/// taking the key over meanwhile: the call's answer, and its body's runs.
async fn kept_unknown_after_a_take_over(
    tool: impl Tool,
    name: &str,
    args: Value,
) -> (ToolError, Toolbox, usize) {
    use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
    let clock = Arc::new(ManualClock::new());
    let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
    // The call's unknown mark waits a second; the other caller acts then.
    let store = Arc::new(FaultyStore::new(
        inner.clone(),
        Plan::script([(Op::MarkUnknown, Fault::Delay(Duration::from_secs(1)))]),
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let call = tool.prepare(&args, &ctx()).unwrap();
    let key = RecordKey::new("acme-corp", call.key().unwrap().as_str());
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(runs.clone())
        .tool(tool)
        .build()
        .unwrap();
    let call = tokio::spawn({
        let (toolbox, name) = (toolbox.clone(), name.to_string());
        async move { toolbox.call(&name, args, &ctx()).await }
    });
    let marking = async {
        while store.injected().delayed == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), marking)
        .await
        .unwrap_or_else(|_| panic!("{name}: the call never marked its key unknown"));

    clock.advance(Duration::from_secs(31));
    let Some(Record::Stale { token: lapsed, .. }) = inner.get(&key).await.unwrap() else {
        panic!("{name}: the call's reservation has lapsed");
    };
    let other = inner
        .take_over(&key, &lapsed, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the other caller takes the key over");

    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(
            inner.get(&key).await.unwrap(),
            Some(Record::InProgress { .. })
        ),
        "{name}: the other caller's reservation stands, not marked unknown"
    );
    assert!(inner
        .renew(&key, &other, Duration::from_secs(30))
        .await
        .unwrap());
    assert_eq!(store.injected().delayed, 1, "{name}");
    (err, toolbox, runs.load(Ordering::SeqCst))
}

/// A call whose outcome is unknown keeps its key unknown, but only while it still holds the key:
/// when its reservation lapsed and another caller took the key over before the mark landed, the
/// answer says so (LEASE_LOST: another call may act too), not that the record is kept as
/// unknown, and the other caller's reservation stands. The same for every way a body ends
/// unknown: a result too deep to record, a reply it reports lost, a panic.
#[test]
fn an_unknown_outcome_whose_key_was_taken_over_is_answered_as_a_lost_lease() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let too_deep = json!({"name": "lost", "levels": MAX_RESULT_DEPTH + 1});
        let cases = [
            kept_unknown_after_a_take_over(Tree, "tree", too_deep).await,
            kept_unknown_after_a_take_over(LostReply, "lost_reply", json!({"name": "n"})).await,
            kept_unknown_after_a_take_over(Crashes, "crashes", json!({"name": "n"})).await,
        ];
        for (err, toolbox, runs) in cases {
            assert!(err.is(ErrorCode::LeaseLost), "{err:?}");
            assert!(!err.is_retryable());
            assert!(
                err.suggestion().unwrap().contains("do not repeat"),
                "{err:?}"
            );
            assert_eq!(runs, 1);
            assert_eq!(toolbox.stats().unknown, 0);
        }
    });
}

/// Finds a refund whose record is `levels` deep.
#[tool(idempotent(key = "deep-found:<name>", recover = find_deep))]
async fn deep_found(
    runs: State<AtomicUsize>,
    name: String,
    levels: usize,
) -> Result<Value, ToolError> {
    let _ = (name, levels);
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(json!("acted"))
}

async fn find_deep(
    runs: State<AtomicUsize>,
    name: String,
    levels: usize,
) -> Result<Option<Value>, ToolError> {
    let _ = (runs, name);
    Ok(Some(nested(levels)))
}

/// What a recover hook finds is recorded as a body's result is: as deep as `MAX_RESULT_DEPTH`,
/// replayed; deeper, kept as unknown, the hook's finding answered OUTCOME_UNKNOWN; the body never
/// runs.
#[test]
fn a_recovered_result_too_deep_to_record_is_kept_as_unknown() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let clock = Arc::new(ManualClock::new());
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_store(store.clone())
            .shared_state(runs.clone())
            .tool(DeepFound)
            .build()
            .unwrap();
        let deepest = json!({"name": "deepest", "levels": MAX_RESULT_DEPTH});
        let too_deep = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        for args in [&deepest, &too_deep] {
            // A worker reserved the key and crashed.
            let call = DeepFound.prepare(args, &ctx()).unwrap();
            let key = RecordKey::new("acme-corp", call.key().unwrap().as_str());
            let fingerprint = call.fingerprint().unwrap();
            let token = Token::generate();
            let lease = Duration::from_secs(30);
            store
                .reserve(&key, "tool", fingerprint, &token, lease)
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(31));

        for replayed in [true, true] {
            let out = toolbox
                .call("deep_found", deepest.clone(), &ctx())
                .await
                .unwrap();
            assert_eq!(
                (&out.value, out.replayed),
                (&nested(MAX_RESULT_DEPTH), replayed)
            );
        }
        let err = toolbox
            .call("deep_found", too_deep.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        assert!(
            err.message().contains("nests deeper than 4096 levels"),
            "{err:?}"
        );
        let status = toolbox
            .call("deep_found_status", too_deep, &ctx())
            .await
            .unwrap();
        assert_eq!(status.value["status"], "unknown");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    });
}

#[tokio::test]
async fn status_moves_from_not_found_to_in_progress_to_completed_per_tenant() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(300)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoiceScaled)
        .build()
        .unwrap();
    let ctx = ctx();
    let key = json!({"customer": "acme", "period": "2026-10"});
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap_err();
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "in_progress");
    assert!(status.value["since"].is_string());
    assert!(toolbox.shutdown().await.is_clean());
    let status = toolbox
        .call("invoice_status", key.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    let replay = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(status.value["result"], replay.value);
    assert!(status.value["completed_at"].is_string());
    let other = ToolContext::new("run-1").with_tenant("globex");
    let status = toolbox.call("invoice_status", key, &other).await.unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    assert_eq!(billing.count(), 1);
}

#[tokio::test]
async fn tenants_neither_replay_nor_read_each_other() {
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .build()
        .unwrap();
    let a = ToolContext::new("run").with_tenant("a");
    let b = ToolContext::new("run").with_tenant("b");
    let args = invoice("acme", "2026-10", 100.0, "October");
    assert!(
        !toolbox
            .call("send_invoice", args.clone(), &a)
            .await
            .unwrap()
            .replayed
    );
    assert!(
        !toolbox
            .call("send_invoice", args.clone(), &b)
            .await
            .unwrap()
            .replayed
    );
    assert!(
        toolbox
            .call("send_invoice", args, &a)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(billing.count(), 2);
}

#[tokio::test]
async fn a_dropped_caller_neither_cancels_the_body_nor_releases_its_key() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(200)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .build()
        .unwrap();
    let args = invoice("acme", "2026-10", 100.0, "October");
    let outer = tokio::time::timeout(
        Duration::from_millis(20),
        toolbox.call("send_invoice", args.clone(), &ctx()),
    )
    .await;
    assert!(outer.is_err(), "the outer timeout dropped the call future");
    let err = toolbox
        .call("send_invoice", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress));
    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(billing.count(), 1);
    assert!(
        toolbox
            .call("send_invoice", args, &ctx())
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(billing.count(), 1);
}

/// A fake thermostat: how often it was set.
#[derive(Default)]
struct Thermostat {
    set: AtomicUsize,
}

/// Sets the thermostat, slowly: harmless to repeat, so `natural`, and without a timeout.
#[tool(natural)]
async fn set_thermostat(thermostat: State<Thermostat>, celsius: u32) -> Result<u32, ToolError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    thermostat.set.fetch_add(1, Ordering::SeqCst);
    Ok(celsius)
}

/// A runtime of one `flavor`: `current_thread`, or `multi_thread` with two workers.
fn runtime(flavor: &str) -> tokio::runtime::Runtime {
    let mut builder = match flavor {
        "current_thread" => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if flavor != "current_thread" {
        builder.worker_threads(2);
    }
    builder.enable_all().build().unwrap()
}

/// A call without a `timeout` starts in its caller's task and moves to a task of its own at its
/// first wait; a caller that stops waiting leaves that task running. Shown for a keyed call
/// dropped mid-body by a timeout around it, and by aborting the task that made it on a
/// multi-thread runtime; for a keyed call dropped while it waits for a slot under a concurrency
/// limit; and for a `natural` call. Each body runs once, to its end, and the keyed ones replay.
#[test]
fn a_dropped_caller_of_a_call_without_a_timeout_leaves_its_work_to_a_task() {
    use billing::SendInvoiceBriefLease;
    for flavor in ["current_thread", "multi_thread"] {
        runtime(flavor).block_on(async {
            let billing = Arc::new(Billing::with_delay(Duration::from_millis(200)));
            let thermostat = Arc::new(Thermostat::default());
            let toolbox = Arc::new(
                Toolbox::builder()
                    .shared_state(billing.clone())
                    .shared_state(thermostat.clone())
                    .tool(SendInvoiceBriefLease)
                    .tool(SetThermostat)
                    .concurrency("send_invoice", std::num::NonZeroUsize::new(1))
                    .build()
                    .unwrap(),
            );
            let call = |customer: &str| {
                let (toolbox, args) = (toolbox.clone(), invoice(customer, "2026-10", 100.0, ""));
                async move { toolbox.call("send_invoice", args, &ctx()).await }
            };
            // Dropped mid-body by a timeout around the call.
            let outer = tokio::time::timeout(Duration::from_millis(20), call("acme")).await;
            assert!(
                outer.is_err(),
                "{flavor}: the outer timeout dropped the call"
            );
            // Dropped while waiting for the one slot `acme` holds.
            let outer = tokio::time::timeout(Duration::from_millis(20), call("globex")).await;
            assert!(
                outer.is_err(),
                "{flavor}: the second call waits for the slot"
            );
            // Aborted with the task that made it, once `acme` is done and `initech` runs.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let caller = tokio::spawn(call("initech"));
            tokio::time::sleep(Duration::from_millis(20)).await;
            caller.abort();
            assert!(caller.await.unwrap_err().is_cancelled(), "{flavor}");
            let err = call("initech").await.unwrap_err();
            assert!(err.is(ErrorCode::InProgress), "{flavor}: {err:?}");
            // A natural call dropped mid-body.
            let outer = tokio::time::timeout(
                Duration::from_millis(20),
                toolbox.call("set_thermostat", json!({"celsius": 21}), &ctx()),
            )
            .await;
            assert!(outer.is_err(), "{flavor}: the thermostat call was dropped");

            assert!(toolbox.shutdown().await.is_clean(), "{flavor}");
            assert_eq!(billing.count(), 3, "{flavor}");
            assert_eq!(thermostat.set.load(Ordering::SeqCst), 1, "{flavor}");
            for customer in ["acme", "globex", "initech"] {
                assert!(
                    call(customer).await.unwrap().replayed,
                    "{flavor}: {customer}"
                );
            }
            assert_eq!(billing.count(), 3, "{flavor}");
            let stats = toolbox.stats();
            assert_eq!(
                (stats.executed, stats.replayed, stats.in_progress),
                (4, 3, 1),
                "{flavor}"
            );
        });
    }
}

/// A caller that holds a call's future without polling it (a `select!` loop busy in another
/// branch) neither stalls the call nor stops `shutdown`: the work runs in a task of its own,
/// past its lease, records its outcome (a retry replays it), and `shutdown` waits for it in the
/// very task that holds the future.
#[test]
fn a_call_its_caller_stops_polling_goes_on_and_shutdown_waits_for_it() {
    use billing::SendInvoiceBriefLease;
    for flavor in ["current_thread", "multi_thread"] {
        runtime(flavor).block_on(async {
            let billing = Arc::new(Billing::with_delay(Duration::from_millis(200)));
            let toolbox = Toolbox::builder()
                .shared_state(billing.clone())
                .tool(SendInvoiceBriefLease)
                .build()
                .unwrap();
            let (args, ctx) = (invoice("acme", "2026-10", 100.0, ""), ctx());
            let call = toolbox.call("send_invoice", args.clone(), &ctx);
            tokio::pin!(call);
            tokio::select! {
                biased;
                _ = &mut call => panic!("{flavor}: billing takes 200 ms"),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            let report = tokio::time::timeout(Duration::from_secs(5), toolbox.shutdown())
                .await
                .unwrap_or_else(|_| panic!("{flavor}: shutdown waited on a call nobody polls"));
            assert!(report.is_clean(), "{flavor}");
            assert_eq!(billing.count(), 1, "{flavor}");
            // Past the 1 s lease: the outcome is recorded, not left to lapse.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let again = toolbox.call("send_invoice", args, &ctx).await.unwrap();
            assert!(again.replayed, "{flavor}");
            let first = call.await.unwrap();
            assert!(!first.replayed, "{flavor}");
            assert_eq!(first.value, again.value, "{flavor}");
            assert_eq!(billing.count(), 1, "{flavor}");
        });
    }
}

/// A call dropped after its runtime is gone (the process ending, or a runtime dropped while
/// calls were running) cannot move its work anywhere: the work is dropped with no panic, like
/// a task the runtime dropped, and its reservation lapses and reads as unknown.
#[test]
fn a_call_dropped_after_its_runtime_is_gone_drops_its_work_quietly() {
    use billing::SendInvoiceBriefLease;
    let store = Arc::new(MemoryStore::new());
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(200)));
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(billing.clone())
        .tool(SendInvoiceBriefLease)
        .build()
        .unwrap();
    let args = invoice("acme", "2026-10", 100.0, "");
    let ctx = ctx();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut call = Box::pin(toolbox.call("send_invoice", args.clone(), &ctx));
    rt.block_on(async {
        tokio::select! {
            biased;
            _ = &mut call => panic!("the body takes 200 ms"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    });
    drop(rt);
    drop(call);
    assert_eq!(billing.count(), 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let err = toolbox
            .call("send_invoice", args.clone(), &ctx)
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::InProgress), "{err:?}");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let err = toolbox.call("send_invoice", args, &ctx).await.unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    });
    assert_eq!(billing.count(), 0);
}

/// A panic outside the body (here, the store's while recording the outcome) ends a call that
/// runs in its caller's task with `OUTCOME_UNKNOWN`: the body ran, and nothing recorded it. The
/// reservation holds the key until its lease lapses, and then reads as unknown: never run twice.
#[tokio::test]
async fn a_panic_outside_the_body_is_an_unknown_outcome_never_a_second_run() {
    use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
    let billing = Arc::new(Billing::default());
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        Plan::script([(Op::Complete, Fault::Panic)]),
    ));
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(billing.clone())
        .tool(billing::SendInvoiceBriefLease)
        .build()
        .unwrap();
    let args = invoice("acme", "2026-10", 100.0, "");
    let err = toolbox
        .call("send_invoice", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(billing.count(), 1);
    let err = toolbox
        .call("send_invoice", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = toolbox
        .call("send_invoice", args, &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert_eq!(billing.count(), 1);
    assert_eq!(store.injected().failed_before, 1);
}

/// A store that cannot be reached.
struct Down;

#[async_trait]
impl Store for Down {
    async fn reserve(
        &self,
        _: &RecordKey,
        _: &str,
        _: &Fingerprint,
        _: &Token,
        _: Duration,
    ) -> Result<Reservation, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn complete(
        &self,
        _: &RecordKey,
        _: &Token,
        _: &Outcome,
        _: Duration,
    ) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn release(&self, _: &RecordKey, _: &Token) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn renew(&self, _: &RecordKey, _: &Token, _: Duration) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn mark_unknown(&self, _: &RecordKey, _: &Token) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn take_over(
        &self,
        _: &RecordKey,
        _: &Token,
        _: Duration,
    ) -> Result<Option<Token>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn purge_expired(&self, _: usize) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn now(&self) -> Result<std::time::SystemTime, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    // Retry limits.
    async fn count_failure(&self, _: &RecordKey, _: Duration) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn failures(&self, _: &RecordKey) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn clear_failures(&self, _: &RecordKey) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

#[tokio::test]
async fn an_unreachable_store_fails_closed() {
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .store(Down)
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .shutdown_grace(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::StoreUnavailable), "{err:?}");
    assert!(err.is_retryable());
    let err = toolbox
        .call(
            "invoice_status",
            json!({"customer": "acme", "period": "2026-10"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::StoreUnavailable));
    // The refused reserve may have been written with its reply lost: freeing it is retried
    // while the store stays down, and shutdown says so.
    let report = toolbox.shutdown().await;
    assert_eq!(report.unrecorded.len(), 1, "{report:?}");
    assert_eq!(report.unrecorded[0].write, "release");
    assert_eq!(billing.count(), 0);
}

/// Sends the dunning letter; a duplicate waits for the first and replays it.
#[tool(idempotent(key = "dunning:<customer>", on_in_progress = "wait(2s)"))]
async fn send_dunning(billing: State<Billing>, customer: String) -> Result<String, ToolError> {
    Ok(billing.send(&customer, "dunning", 0.0, "").await.id)
}

#[tokio::test]
async fn on_in_progress_wait_replays_the_first_call() {
    let billing = Arc::new(Billing::with_delay(Duration::from_millis(150)));
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendDunning)
        .build()
        .unwrap();
    let ctx = ctx();
    let (a, b) = tokio::join!(
        toolbox.call("send_dunning", json!({"customer": "acme"}), &ctx),
        toolbox.call("send_dunning", json!({"customer": "acme"}), &ctx),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.value, b.value);
    assert_eq!(a.replayed as u8 + b.replayed as u8, 1);
    assert_eq!(billing.count(), 1);
}

/// Forwards its key to the provider, as Stripe's Idempotency-Key.
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund_forwarding_key(ctx: &ToolContext, cents: i64) -> Result<String, ToolError> {
    let _ = cents;
    Ok(ctx
        .idempotency_key()
        .expect("keyed tools see their key")
        .to_string())
}

#[tokio::test]
async fn the_body_reads_its_key_built_from_the_context() {
    let toolbox = Toolbox::builder()
        .tool(RefundForwardingKey)
        .build()
        .unwrap();
    let out = toolbox
        .call(
            "refund_forwarding_key",
            json!({"cents": 5}),
            &ToolContext::new("Run-7").with_step(4),
        )
        .await
        .unwrap();
    assert_eq!(
        out.value,
        json!("refund:Run-7:4"),
        "context values keep their case"
    );
    assert_eq!(
        toolbox.definitions().len(),
        1,
        "status = false adds no companion"
    );
}

/// Refunds by the run and the call's place in it, slowly, with a recover hook for a lost reply.
#[tool(
    idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false, recover = no_refund_found),
    timeout = "50ms"
)]
async fn refund_by_step(refunds: State<AtomicUsize>, cents: i64) -> Result<String, ToolError> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let n = refunds.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("re-{n}-{cents}"))
}

/// Refunds by the run and the call's place in it; the provider's reply is lost.
#[tool(idempotent(key = "refund-now:<ctx.run_id>:<ctx.step>", status = false, recover = no_refund_found))]
async fn refund_by_step_now(refunds: State<AtomicUsize>, cents: i64) -> Result<String, ToolError> {
    let _ = cents;
    refunds.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown(
        "the refund went out; its reply was lost",
    ))
}

async fn no_refund_found(
    refunds: State<AtomicUsize>,
    cents: i64,
) -> Result<Option<String>, ToolError> {
    let _ = (refunds, cents);
    Ok(None)
}

#[tokio::test]
async fn a_tool_keyed_on_its_place_in_the_run_never_tells_the_model_to_call_again() {
    // The model's own retry is a new call, at a new place in the run, with a key of its own: it
    // would refund again. Only the same call handed over again replays.
    let refunds = Arc::new(AtomicUsize::new(0));
    let toolbox = Toolbox::builder()
        .shared_state(refunds.clone())
        .tool(RefundByStep)
        .tool(RefundByStepNow)
        .build()
        .unwrap();
    let definition = toolbox.definition("refund_by_step").unwrap();
    assert!(
        !definition.annotations().idempotent,
        "a new call acts again"
    );
    assert_eq!(definition.to_mcp()["annotations"]["idempotentHint"], false);
    let at = |step| ToolContext::new("run-9").with_step(step);
    let args = json!({"cents": 100});
    let err = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(
        suggestion.contains("do not call `refund_by_step` again"),
        "{suggestion}"
    );
    // The same call handed over again while it runs: still running, and not to be called again.
    let err = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    assert!(err.suggestion().unwrap().contains("do not call"), "{err:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let replay = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap();
    assert!(replay.replayed);
    // A lost reply, answered at once: with a recover hook, a retry of the same call looks
    // before it acts, but the model's retry is not that call, so the answer does not invite it.
    let unknown = toolbox
        .call("refund_by_step_now", json!({"cents": 7}), &at(2))
        .await
        .unwrap_err();
    assert!(unknown.is(ErrorCode::OutcomeUnknown), "{unknown:?}");
    assert!(!unknown.is_retryable(), "{unknown:?}");
    assert!(unknown.suggestion().unwrap().starts_with("do not repeat"));
    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(refunds.load(Ordering::SeqCst), 2);
}

/// Pays out by the run and the call's place in it: a transfer step, then a receipt step whose
/// mail server is down at first.
#[tool(idempotent(key = "payout:<ctx.run_id>:<ctx.step>", status = false))]
async fn payout_by_step(
    effects: State<Mutex<Vec<String>>>,
    ctx: &ToolContext,
    cents: i64,
) -> Result<String, ToolError> {
    let count = |prefix: &str| {
        let effects = effects.lock().unwrap();
        effects.iter().filter(|e| e.starts_with(prefix)).count()
    };
    let act = |what: String| effects.lock().unwrap().push(what);
    ctx.once("transfer", async {
        act(format!("transfer:{cents}"));
        Ok::<_, ToolError>(())
    })
    .await?;
    ctx.once("receipt", async {
        if count("outage") == 0 {
            act("outage".into());
            return Err(ToolError::new("MAIL_DOWN", "the mail server is down").with_retryable(true));
        }
        act("receipt".into());
        Ok(())
    })
    .await?;
    Ok("paid".into())
}

#[tokio::test]
async fn a_failure_after_steps_of_a_call_keyed_on_its_place_is_not_retryable() {
    // The model's retry would be a new call, a new key: it would transfer again.
    let effects = Arc::new(Mutex::new(Vec::<String>::new()));
    let toolbox = Toolbox::builder()
        .shared_state(effects.clone())
        .tool(PayoutByStep)
        .build()
        .unwrap();
    let at = |step| ToolContext::new("run-3").with_step(step);
    let err = toolbox
        .call("payout_by_step", json!({"cents": 500}), &at(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "MAIL_DOWN");
    assert!(!err.is_retryable(), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(suggestion.contains("do not call again"), "{suggestion}");
    // The same call handed over again finishes it, the transfer replayed.
    let paid = toolbox
        .call("payout_by_step", json!({"cents": 500}), &at(1))
        .await
        .unwrap();
    assert_eq!(paid.value, json!("paid"));
    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects, ["transfer:500", "outage", "receipt"]);
}

#[test]
fn a_definition_keyed_on_its_place_stays_not_idempotent_whatever_the_order() {
    use toolkey::{Annotations, Story, ToolDefinition};
    let schema = json!({"type": "object"});
    let key_first = ToolDefinition::new("refund", "Refund.", schema.clone(), Story::Idempotent)
        .with_key_template("refund:<ctx.run_id>:< ctx.step >")
        .with_annotations(Annotations::for_story(Story::Idempotent));
    let key_last = ToolDefinition::new("refund", "Refund.", schema.clone(), Story::Idempotent)
        .with_annotations(Annotations::for_story(Story::Idempotent))
        .with_key_template("refund:<ctx.run_id>:<ctx.step>");
    for definition in [key_first, key_last] {
        assert!(!definition.annotations().idempotent);
        assert_eq!(definition.to_mcp()["annotations"]["idempotentHint"], false);
    }
    let by_order = ToolDefinition::new("refund", "Refund.", schema, Story::Idempotent)
        .with_key_template("refund:<order>");
    assert!(by_order.annotations().idempotent);
}

/// Posts a message to a channel (no key: every call posts).
#[tool(unkeyed, timeout = "50ms")]
async fn post_message(posted: State<AtomicUsize>, text: String) -> Result<(), ToolError> {
    let _ = text;
    tokio::time::sleep(Duration::from_millis(100)).await;
    posted.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn unkeyed_tools_need_an_approver_and_their_timeouts_are_not_retryable() {
    let posted = Arc::new(AtomicUsize::new(0));
    let err = Toolbox::builder()
        .shared_state(posted.clone())
        .tool(PostMessage)
        .build()
        .err()
        .unwrap();
    assert_eq!(err, BuildError::NoApprover(vec!["post_message".into()]));

    let refusing = Toolbox::builder()
        .shared_state(posted.clone())
        .tool(PostMessage)
        .approver(|request: &toolkey::ApprovalRequest<'_>| request.arguments["text"] != "spam")
        .build()
        .unwrap();
    let err = refusing
        .call("post_message", json!({"text": "spam"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::ApprovalRequired));
    let err = refusing
        .call("post_message", json!({"text": "hello"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout));
    assert!(!err.is_retryable());
    assert!(err.suggestion().unwrap().contains("do not repeat"));
    assert!(refusing.shutdown().await.is_clean());
    assert_eq!(posted.load(Ordering::SeqCst), 1);
}

/// Looks up the current exchange rate.
#[tool(read_only, timeout = "20ms")]
async fn exchange_rate(currency: String) -> Result<f64, ToolError> {
    let _ = currency;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(1.1)
}

#[tokio::test]
async fn read_only_timeouts_are_retryable() {
    let toolbox = Toolbox::builder().tool(ExchangeRate).build().unwrap();
    let err = toolbox
        .call("exchange_rate", json!({"currency": "USD"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout) && err.is_retryable());
}

/// The outside system a crashed worker may or may not have reached.
#[derive(Default)]
struct Ledger {
    refunds: Mutex<Vec<String>>,
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
async fn refund_without_hook(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
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

/// Refund one order; its record is kept for an hour.
#[tool(
    idempotent(key = "refund:<order>"),
    name = "refund_kept",
    retain = "1h"
)]
async fn refund_kept(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.refunds.lock().unwrap().push(order.clone());
    Ok(format!("refund-of-{order}"))
}

/// A replay read from memory in the caller's task (the memory store's record, or the local
/// cache's) is the store's answer: within retention and the caller's tenant only, a `CONFLICT`
/// for other arguments, and a new run once the record has expired.
#[tokio::test]
async fn a_replay_from_memory_keeps_retention_and_tenants() {
    let clock = Arc::new(ManualClock::new());
    let memory = Arc::new(MemoryStore::with_clock(clock.clone()));
    let stores: Vec<(&str, Arc<dyn Store>)> = vec![
        ("memory", memory.clone()),
        (
            "cached",
            Arc::new(
                toolkey::store::CachedStore::new(MemoryStore::with_clock(clock.clone()), 1 << 20)
                    .with_clock(clock.clone()),
            ),
        ),
    ];
    for (name, store) in stores {
        let ledger = Arc::new(Ledger::default());
        let toolbox = Toolbox::builder()
            .shared_store(store)
            .shared_state(ledger.clone())
            .tool(RefundKept)
            .tool(RefundWithoutHook)
            .build()
            .unwrap();
        let refunds = || ledger.refunds.lock().unwrap().len();
        let call = |tenant: &str| {
            let ctx = ToolContext::new("run-1").with_tenant(tenant);
            let toolbox = &toolbox;
            async move {
                toolbox
                    .call("refund_kept", json!({"order": "o-1"}), &ctx)
                    .await
            }
        };
        assert!(!call("acme").await.unwrap().replayed, "{name}");
        for _ in 0..3 {
            let out = call("acme").await.unwrap();
            assert!(out.replayed, "{name}");
            assert_eq!(out.value, json!("refund-of-o-1"), "{name}");
        }
        assert_eq!(refunds(), 1, "{name}");
        // Another tenant's key is another record.
        assert!(!call("globex").await.unwrap().replayed, "{name}");
        assert_eq!(refunds(), 2, "{name}");
        // Another tool under the same key text is a CONFLICT, answered from memory as well.
        let err = toolbox
            .call(
                "refund_blind",
                json!({"order": "o-1"}),
                &ToolContext::new("run-1").with_tenant("acme"),
            )
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Conflict), "{name}: {err:?}");
        assert_eq!(refunds(), 2, "{name}");
        // Past its retention the record is gone: the call runs again, once.
        clock.advance(Duration::from_secs(3601));
        assert!(!call("acme").await.unwrap().replayed, "{name}");
        assert!(call("acme").await.unwrap().replayed, "{name}");
        assert_eq!(refunds(), 3, "{name}");
        let stats = toolbox.stats();
        assert_eq!(
            (stats.executed, stats.replayed, stats.conflicts),
            (3, 4, 1),
            "{name}"
        );
    }
}

/// A warehouse whose label printer and price rows can break: shipments and price reads counted.
#[derive(Default)]
struct Dock {
    shipped: AtomicUsize,
    reads: AtomicUsize,
}

/// Ship an order, keyed on the call's place in the run (no status tool can follow it).
#[tool(idempotent(key = "ship:<ctx.run_id>:<ctx.step>", status = false))]
async fn ship_order(dock: State<Dock>, order: String) -> Result<String, ToolError> {
    dock.shipped.fetch_add(1, Ordering::SeqCst);
    panic!("the label printer broke after shipping {order}");
}

/// Ship a parcel; the carrier's reply can be lost.
#[tool(idempotent(key = "parcel:<parcel>"))]
async fn ship_parcel(dock: State<Dock>, parcel: String) -> Result<String, ToolError> {
    let _ = parcel;
    dock.shipped.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown("the carrier's reply was lost"))
}

/// Today's price of a product.
#[tool(read_only)]
async fn read_price(dock: State<Dock>, sku: String) -> Result<u64, ToolError> {
    dock.reads.fetch_add(1, Ordering::SeqCst);
    panic!("a bad price row for {sku}");
}

/// An unknown outcome's answer sends the model where the tool lets it go: its status tool when
/// it has one, a person when it has none (it once said "check its status" for every tool), and
/// for a tool that only reads, that calling again is safe.
#[tokio::test]
async fn an_unknown_outcome_suggests_only_what_the_tool_offers() {
    let dock = Arc::new(Dock::default());
    let toolbox = Toolbox::builder()
        .shared_state(dock.clone())
        .tool(ShipOrder)
        .tool(ShipParcel)
        .tool(ReadPrice)
        .build()
        .unwrap();
    let answer = |tool: &'static str, args: Value| {
        let toolbox = toolbox.clone();
        async move {
            toolbox
                .call(tool, args, &ctx().with_step(3))
                .await
                .unwrap_err()
        }
    };

    let shipped = answer("ship_order", json!({"order": "o-1"})).await;
    assert!(
        shipped.is(ErrorCode::OutcomeUnknown) && !shipped.is_retryable(),
        "{shipped:?}"
    );
    assert_eq!(
        shipped.suggestion(),
        Some("do not repeat the action; ask a person to look in the outside system")
    );
    let parcel = answer("ship_parcel", json!({"parcel": "p-1"})).await;
    assert!(
        parcel.is(ErrorCode::OutcomeUnknown) && !parcel.is_retryable(),
        "{parcel:?}"
    );
    assert_eq!(
        parcel.suggestion(),
        Some("do not repeat the action; call `ship_parcel_status` with the same arguments, or ask a person to look in the outside system")
    );
    let price = answer("read_price", json!({"sku": "s-1"})).await;
    assert!(
        price.is(ErrorCode::OutcomeUnknown) && price.is_retryable(),
        "{price:?}"
    );
    assert!(price
        .suggestion()
        .unwrap()
        .starts_with("`read_price` only reads, so calling again is safe"));
    // The status tool the parcel's answer names says what it promises.
    let status = toolbox
        .call("ship_parcel_status", json!({"parcel": "p-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown");
    assert_eq!(dock.shipped.load(Ordering::SeqCst), 2);
    assert_eq!(dock.reads.load(Ordering::SeqCst), 1);
}

/// A shop whose mail server can be down: charges and receipts counted.
#[derive(Default)]
struct Shop {
    charges: AtomicUsize,
    receipts: AtomicUsize,
    mail_down: std::sync::atomic::AtomicBool,
}

/// Charge an order, then email its receipt.
#[tool(idempotent(key = "checkout:<order>"))]
async fn checkout(
    shop: State<Shop>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    let charged = ctx
        .once("charge", async {
            shop.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(format!("ch-{order}"))
        })
        .await?;
    ctx.once("receipt", async {
        if shop.mail_down.load(Ordering::SeqCst) {
            let down = ToolError::new("MAIL_DOWN", "the mail server is down");
            return Err(down.with_retryable(true));
        }
        shop.receipts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .await?;
    Ok(charged)
}

/// After a step charged and a later step failed in a way safe to retry, the call's key is free
/// and the status tool answers `not_found`: its detail says a finished step is kept and not done
/// again (it once said nothing, and read as "has not run" though the customer was charged), and
/// calling again, as it says, charges no more.
#[tokio::test]
async fn not_found_after_a_step_acted_says_the_step_is_kept() {
    let shop = Arc::new(Shop::default());
    shop.mail_down.store(true, Ordering::SeqCst);
    let toolbox = Toolbox::builder()
        .shared_state(shop.clone())
        .tool(Checkout)
        .build()
        .unwrap();
    let args = json!({"order": "o-7"});
    let failed = toolbox
        .call("checkout", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(failed.is_retryable(), "{failed:?}");
    let status = toolbox
        .call("checkout_status", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    let detail = status.value["detail"].as_str().unwrap();
    assert!(detail.contains("any step it finished, such as a payment, is kept and not done again when `checkout` is called again"), "{detail}");
    shop.mail_down.store(false, Ordering::SeqCst);
    let done = toolbox
        .call("checkout", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!((done.value, done.replayed), (json!("ch-o-7"), false));
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.receipts.load(Ordering::SeqCst), 1);
}
