//! Calls without a key are counted in the process's memory, by their arguments.

use std::time::Duration;

use serde_json::json;

use super::{builder, code, ctx, Gateway, ScriptedModel};

#[tokio::test]
async fn a_read_only_call_is_counted_by_its_arguments() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    // The same destination, its free-text note reworded every time: one call.
    let mut answers = Vec::new();
    for i in 0..50 {
        let args = json!({"destination": "Lyon", "note": format!("attempt {i}")});
        answers.push(code(&toolbox.call("quote", args, &ctx).await));
    }
    assert_eq!(gateway.attempts("quote:Lyon"), 5, "{answers:?}");
    assert_eq!(answers.iter().position(|a| a == "RETRY_LIMIT"), Some(4));
    // Another destination is another call; so is the same one in another tenant.
    let other = json!({"destination": "Lille", "note": ""});
    assert_eq!(
        code(&toolbox.call("quote", other, &ctx).await),
        "GATEWAY_BUSY"
    );
    let lyon = json!({"destination": "Lyon", "note": ""});
    assert_eq!(
        code(
            &toolbox
                .call("quote", lyon.clone(), &self::ctx("globex"))
                .await
        ),
        "GATEWAY_BUSY"
    );
    assert_eq!(gateway.attempts("quote:Lille"), 1);
    assert_eq!(gateway.attempts("quote:Lyon"), 6);
    // A success clears the count: once the gateway is back, Lille's one failure is forgotten.
    gateway.set_up(true);
    let lille = json!({"destination": "Lille", "note": ""});
    assert!(toolbox.call("quote", lille.clone(), &ctx).await.is_ok());
    gateway.set_up(false);
    let again = ScriptedModel::repeat(&toolbox, "quote", lille, &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lille"), 7, "{:?}", again.answers);
    assert_eq!(again.first("RETRY_LIMIT"), Some(4), "{:?}", again.answers);
}

#[tokio::test(start_paused = true)]
async fn a_read_only_calls_window_ends_in_process_time() {
    let gateway = Gateway::down();
    let toolbox = builder(&gateway).build().unwrap();
    let ctx = ctx("shop");
    let args = json!({"destination": "Lyon", "note": ""});
    ScriptedModel::repeat(&toolbox, "quote", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 5);
    tokio::time::advance(Duration::from_secs(9 * 60)).await;
    ScriptedModel::repeat(&toolbox, "quote", args.clone(), &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let again = ScriptedModel::repeat(&toolbox, "quote", args, &ctx, 10).await;
    assert_eq!(gateway.attempts("quote:Lyon"), 10, "{:?}", again.answers);
}

#[tokio::test]
async fn retryable_timeouts_count_once_per_call() {
    // The gateway answers (up) after 2 s; the caller waits 50 ms: three timeouts, then the limit.
    let gateway = Gateway::down();
    gateway.set_up(true);
    let toolbox = builder(&gateway).build().unwrap();
    let model = ScriptedModel::repeat(
        &toolbox,
        "job_status",
        json!({"job": "j-1"}),
        &ctx("shop"),
        20,
    )
    .await;
    assert_eq!(model.count("TIMEOUT"), 2, "{:?}", model.answers);
    assert_eq!(model.first("RETRY_LIMIT"), Some(2), "{:?}", model.answers);
    assert_eq!(gateway.attempts("job:j-1"), 3);
    let stats = toolbox.stats();
    assert_eq!((stats.timeouts, stats.retry_limited), (3, 18));
}
