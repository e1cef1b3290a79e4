//! A keyed call's retries are counted in the store: fifty calls of a failing charge make as many
//! attempts as its limit allows, on every store, and the answer tells the model to stop.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
use toolkey::store::{FailureCounters, ManualClock, MemoryStore, Reservations};
use toolkey::{tool, ErrorCode, RetryLimit, State, Tool, ToolError, ToolboxBuilder};

use super::{builder, charge_args, ctx, server_store, storm, Gateway, ScriptedModel};

#[tokio::test]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_memory() {
    storm(MemoryStore::new()).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    storm(toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_postgres() {
    if let Some(store) = server_store("postgres").await {
        storm(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_a_failing_call_fifty_times_makes_five_attempts_redis() {
    if let Some(store) = server_store("redis").await {
        storm(store).await;
    }
}

#[tokio::test]
async fn a_model_that_heeds_retryable_stops_at_the_limit() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let mut calls = 0;
    let last = loop {
        calls += 1;
        match toolbox.call("charge", charge_args("o-1"), &ctx).await {
            Err(err) if err.is_retryable() && calls < 50 => continue,
            other => break other,
        }
    };
    assert_eq!(calls, 5);
    assert!(last.unwrap_err().is(ErrorCode::RetryLimit));
    assert_eq!(gateway.attempts("charge:o-1"), 5);
}

#[tokio::test]
async fn a_success_clears_the_count_and_a_later_storm_gets_a_fresh_allowance() {
    let clock = Arc::new(ManualClock::new());
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    // Four failures, one short of the limit; then the gateway is back and the charge succeeds.
    let before = ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 4).await;
    assert_eq!(before.count("GATEWAY_BUSY"), 4);
    gateway.set_up(true);
    assert!(
        !toolbox
            .call("charge", args.clone(), &ctx)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Its record expires after a minute (`retain = "1m"`), well inside the first failure's
    // ten-minute window: had the success not cleared the four failures, one more would stop it.
    clock.advance(Duration::from_secs(120));
    gateway.set_up(false);
    let after = ScriptedModel::repeat(&toolbox, "charge", args, &ctx, 20).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10, "{:?}", after.answers);
    assert_eq!(after.first("RETRY_LIMIT"), Some(4), "{:?}", after.answers);
}

#[tokio::test]
async fn when_the_window_ends_the_call_runs_again() {
    let clock = Arc::new(ManualClock::new());
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Nine minutes on, the window (from the first failure) still holds.
    clock.advance(Duration::from_secs(9 * 60));
    let err = toolbox
        .call("charge", args.clone(), &ctx)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::RetryLimit), "{err:?}");
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // Past ten minutes the count starts again: five more attempts, then the limit again.
    clock.advance(Duration::from_secs(61));
    let again = ScriptedModel::repeat(&toolbox, "charge", args, &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10, "{:?}", again.answers);
    assert_eq!(again.first("RETRY_LIMIT"), Some(4), "{:?}", again.answers);
}

#[tokio::test]
async fn an_operator_clears_the_count_and_the_call_runs_again() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let args = charge_args("o-1");
    ScriptedModel::repeat(&toolbox, "charge", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // The gateway is back: the operator finds the call's record key from its arguments and
    // clears its count, without waiting for the window.
    gateway.set_up(true);
    let key = toolbox.record_key("charge", args.clone(), &ctx).unwrap();
    toolbox.store().clear_failures(&key).await.unwrap();
    let out = toolbox.call("charge", args, &ctx).await.unwrap();
    assert_eq!(out.value, json!("ch-o-1-4200"));
    assert_eq!(gateway.attempts("charge:o-1"), 6);
}

#[tokio::test]
async fn each_tenant_has_its_own_count() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("acme"), 10).await;
    let other =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("globex"), 10).await;
    assert_eq!(gateway.attempts("charge:o-1"), 10);
    assert_eq!(other.first("RETRY_LIMIT"), Some(4), "{:?}", other.answers);
}

#[tokio::test]
async fn the_toolbox_default_is_ten_in_ten_minutes_and_can_be_changed_or_turned_off() {
    let run = |builder: ToolboxBuilder, gateway: Arc<Gateway>| async move {
        let toolbox = builder.build().unwrap();
        ScriptedModel::repeat(
            &toolbox,
            "lookup",
            json!({"customer": "acme"}),
            &ctx("shop"),
            50,
        )
        .await;
        gateway.attempts("lookup:acme")
    };
    let gateway = Gateway::down();
    assert_eq!(run(builder(&gateway), gateway.clone()).await, 10);
    let gateway = Gateway::down();
    let b = builder(&gateway).default_retry_limit(RetryLimit::after(3, Duration::from_secs(60)));
    assert_eq!(run(b, gateway.clone()).await, 3);
    let gateway = Gateway::down();
    let b = builder(&gateway).default_retry_limit(RetryLimit::off());
    assert_eq!(run(b, gateway.clone()).await, 50);
    // A tool's own limit wins over the toolbox's; an override by name wins over both.
    let gateway = Gateway::down();
    let toolbox = builder(&gateway)
        .default_retry_limit(RetryLimit::off())
        .retry_limit("lookup", RetryLimit::after(2, Duration::from_secs(60)))
        .build()
        .unwrap();
    assert_eq!(
        toolbox.definition("charge").unwrap().settings().retry_limit,
        RetryLimit::after(5, Duration::from_secs(600))
    );
    assert_eq!(
        toolbox.definition("lookup").unwrap().settings().retry_limit,
        RetryLimit::after(2, Duration::from_secs(60))
    );
    ScriptedModel::repeat(
        &toolbox,
        "lookup",
        json!({"customer": "acme"}),
        &ctx("shop"),
        50,
    )
    .await;
    ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("shop"), 50).await;
    assert_eq!(gateway.attempts("lookup:acme"), 2);
    assert_eq!(gateway.attempts("charge:o-1"), 5);
    // A name that is no tool is refused at build.
    let err = builder(&gateway)
        .retry_limit("lookpu", RetryLimit::off())
        .build()
        .err()
        .unwrap();
    assert_eq!(err, toolkey::BuildError::UnknownTool("lookpu".into()));
}

#[tokio::test]
async fn an_unreachable_store_is_not_counted_and_a_lost_count_is_not_a_refusal() {
    let gateway = Gateway::down();
    // Twenty reserves fail before the store applies them, then one count is lost.
    let mut faults: Vec<(Op, Fault)> = (0..20).map(|_| (Op::Reserve, Fault::FailBefore)).collect();
    faults.push((Op::CountFailure, Fault::FailBefore));
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), Plan::script(faults)));
    let toolbox = builder(&gateway)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let model =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx("shop"), 50).await;
    assert_eq!(model.count("STORE_UNAVAILABLE"), 20, "{:?}", model.answers);
    // Nothing ran in those twenty; of the six failures that did, the store took five counts.
    assert_eq!(gateway.attempts("charge:o-1"), 6, "{:?}", model.answers);
    assert_eq!(model.first("RETRY_LIMIT"), Some(25), "{:?}", model.answers);
    assert_eq!(store.injected().failed_before, 21);
}

/// A first run reads the key's count with its reservation: when the store cannot answer,
/// nothing ran, and the key is free for the retry.
#[tokio::test]
async fn a_reservation_that_cannot_be_read_fails_closed_and_frees_the_key() {
    let gateway = Gateway::down();
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        Plan::script([(Op::Reserve, Fault::LoseReply)]),
    ));
    let toolbox = builder(&gateway)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let err = toolbox
        .call("charge", charge_args("o-1"), &ctx)
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::StoreUnavailable) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(gateway.attempts("charge:o-1"), 0);
    gateway.set_up(true);
    let out = toolbox
        .call("charge", charge_args("o-1"), &ctx)
        .await
        .unwrap();
    assert!(!out.replayed);
    assert_eq!(gateway.attempts("charge:o-1"), 1);
    assert_eq!(
        store.calls(Op::Failures),
        0,
        "a first run reads no count apart"
    );
}

/// Settle an order through the gateway; a worker that died mid-call is looked up first.
#[tool(
    idempotent(key = "settle:<order>", recover = find_settlement),
    retry_limit = "5/10m",
    lease = "30s"
)]
async fn settle(gateway: State<Gateway>, order: String) -> Result<String, ToolError> {
    gateway.attempt(format!("settle:{order}"))?;
    Ok(format!("st-{order}"))
}

/// Looks the settlement up: never found (the dead worker never reached the gateway).
async fn find_settlement(
    gateway: State<Gateway>,
    order: String,
) -> Result<Option<String>, ToolError> {
    gateway.attempt(format!("lookup:{order}"))?;
    Ok(None)
}

/// Before a stale reservation is taken over, the key's count is read apart: when the store
/// cannot answer, the record is left as it was (nothing looked up, nothing run), and the retry
/// takes it over, looks, and runs once.
#[tokio::test]
async fn a_count_that_cannot_be_read_before_a_take_over_leaves_the_record() {
    let gateway = Gateway::down();
    gateway.set_up(true);
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(FaultyStore::new(
        MemoryStore::with_clock(clock.clone()),
        Plan::script([(Op::Failures, Fault::FailBefore)]),
    ));
    let toolbox = builder(&gateway)
        .tool(Settle)
        .shared_store(store.clone())
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let args = json!({"order": "o-7"});
    // A worker reserved the key and died.
    let rkey = toolbox.record_key("settle", args.clone(), &ctx).unwrap();
    let call = Settle.prepare(&args, &ctx).unwrap();
    let dead = toolkey::store::Token::generate();
    let reserved = store
        .reserve(
            &rkey,
            "settle",
            call.fingerprint().unwrap(),
            &dead,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(
        reserved,
        toolkey::store::Reservation::Reserved { .. }
    ));
    clock.advance(Duration::from_secs(31));

    let err = toolbox
        .call("settle", args.clone(), &ctx)
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::StoreUnavailable) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(gateway.attempts("lookup:o-7"), 0);
    assert_eq!(gateway.attempts("settle:o-7"), 0);
    assert!(
        matches!(store.get(&rkey).await.unwrap(), Some(toolkey::store::Record::Stale { token, .. }) if token == dead),
        "the stale record stays under the dead worker's token"
    );

    let out = toolbox.call("settle", args.clone(), &ctx).await.unwrap();
    assert_eq!(out.value, json!("st-o-7"));
    assert!(!out.replayed);
    let again = toolbox.call("settle", args, &ctx).await.unwrap();
    assert!(again.replayed);
    assert_eq!(gateway.attempts("lookup:o-7"), 1);
    assert_eq!(gateway.attempts("settle:o-7"), 1);
}
