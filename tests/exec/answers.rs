//! What a call is answered: a conflict says whether the other action ran, errors are released
//! or recorded as their kind says, bad arguments and unknown tools are named; a toolbox with two
//! tools of one name or missing state does not build.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolkey::store::{ManualClock, MemoryStore, RecordKey, Reservation, Reservations, Token};
use toolkey::{tool, BuildError, ErrorCode, State, Tool, ToolError, Toolbox};

use super::ctx;

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
