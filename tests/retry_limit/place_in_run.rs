//! A key on the call's place in the run: counted by what the model's retry repeats.

use std::sync::Arc;

use serde_json::json;
use toolkey::store::{MemoryStore, Store};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};

use super::{code, open_store, server_store, tenant, Gateway};

/// Pay an account out. Keyed on the call's place in the run: each call is an action of its own.
#[tool(
    idempotent(key = "payout:<account>:<ctx.run_id>:<ctx.step>", status = false),
    retry_limit = "3/10m"
)]
async fn payout(
    gateway: State<Gateway>,
    /// The account to pay.
    account: String,
    /// The amount, in cents.
    cents: i64,
    /// Why the model pays: free text it may reword.
    #[arg(ignore)]
    #[serde(default)]
    memo: String,
) -> Result<String, ToolError> {
    let _ = (cents, memo);
    gateway.attempt(format!("payout:{account}"))?;
    Ok(format!("po-{account}"))
}

/// Ten identical failing payouts, each a new tool call at the next step of the run (a looping
/// model), made through two toolboxes over one store, as two processes would: three bodies run,
/// then `RETRY_LIMIT`; another account, another amount or another run is not blocked. Counted by
/// the key, each step had an allowance of its own and all ten ran.
async fn a_looping_model_on_a_per_step_key(store: Arc<dyn Store>) {
    let gateway = Gateway::down();
    let toolbox = |store: &Arc<dyn Store>| {
        Toolbox::builder()
            .shared_state(gateway.clone())
            .shared_store(store.clone())
            .tool(Payout)
            .build()
            .unwrap()
    };
    let (here, there) = (toolbox(&store), toolbox(&store));
    let tenant = tenant();
    let at = |run: &str, step: u64| ToolContext::new(run).with_tenant(&tenant).with_step(step);
    let mut answers = Vec::new();
    for step in 1..=10 {
        let toolbox = if step % 2 == 0 { &here } else { &there };
        // The model rewords its memo and spells the amount another way: the same call.
        let args = json!({"account": "acc-1", "cents": 500, "memo": format!("try {step}")});
        let args = if step % 3 == 0 {
            json!({"memo": "again", "cents": 500.0, "account": "acc-1"})
        } else {
            args
        };
        answers.push(code(
            &toolbox.call("payout", args, &at("run-1", step)).await,
        ));
    }
    assert_eq!(gateway.attempts("payout:acc-1"), 3, "{answers:?}");
    assert_eq!(
        answers[..2],
        ["GATEWAY_BUSY", "GATEWAY_BUSY"],
        "{answers:?}"
    );
    assert!(
        answers[2..].iter().all(|a| a == "RETRY_LIMIT"),
        "{answers:?}"
    );
    let refused = here
        .call(
            "payout",
            json!({"account": "acc-1", "cents": 500}),
            &at("run-1", 11),
        )
        .await
        .unwrap_err();
    assert!(!refused.is_retryable(), "{refused:?}");
    assert!(
        refused.message().contains("with these arguments"),
        "{refused:?}"
    );
    assert!(!refused.message().contains("for this key"), "{refused:?}");
    // Another account, another amount, another run: other calls, which run.
    let other = [
        (
            json!({"account": "acc-2", "cents": 500}),
            "run-1",
            "payout:acc-2",
        ),
        (
            json!({"account": "acc-1", "cents": 700}),
            "run-1",
            "payout:acc-1",
        ),
        (
            json!({"account": "acc-1", "cents": 500}),
            "run-2",
            "payout:acc-1",
        ),
    ];
    for (step, (args, run, _)) in (12..).zip(&other) {
        let answer = there.call("payout", args.clone(), &at(run, step)).await;
        assert_eq!(code(&answer), "GATEWAY_BUSY", "{args} in {run}");
    }
    assert_eq!(gateway.attempts("payout:acc-2"), 1);
    assert_eq!(gateway.attempts("payout:acc-1"), 5);
    // A success clears the count: the gateway back, acc-2 is paid; its next failures start at 0.
    gateway.set_up(true);
    let acc2 = json!({"account": "acc-2", "cents": 500});
    assert_eq!(
        code(&here.call("payout", acc2.clone(), &at("run-1", 20)).await),
        "ok"
    );
    gateway.set_up(false);
    let mut again = Vec::new();
    for step in 21..26 {
        again.push(code(
            &there.call("payout", acc2.clone(), &at("run-1", step)).await,
        ));
    }
    assert_eq!(
        again,
        [
            "GATEWAY_BUSY",
            "GATEWAY_BUSY",
            "RETRY_LIMIT",
            "RETRY_LIMIT",
            "RETRY_LIMIT"
        ]
    );
    assert_eq!(gateway.attempts("payout:acc-2"), 5);
    assert!(here.shutdown().await.is_clean());
    assert!(there.shutdown().await.is_clean());
}

#[tokio::test]
async fn a_looping_model_on_a_per_step_key_is_stopped_memory() {
    a_looping_model_on_a_per_step_key(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store("sqlite", dir.path()).await.unwrap();
    a_looping_model_on_a_per_step_key(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_postgres() {
    if let Some(store) = server_store("postgres").await {
        a_looping_model_on_a_per_step_key(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_model_on_a_per_step_key_is_stopped_redis() {
    if let Some(store) = server_store("redis").await {
        a_looping_model_on_a_per_step_key(store).await;
    }
}
