//! Concurrency limits: a tool's bodies running at once stay within its limit, and a call that
//! gets no slot in time is `BUSY` and never runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::{ErrorCode, RetryLimit, Toolbox};

use super::{ctx, Market, Place, Rate};

fn market_toolbox(market: &Arc<Market>) -> Toolbox {
    Toolbox::builder()
        .shared_state(market.clone())
        .tool(Rate)
        .tool(Place)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_limit_of_two_five_calls_run_at_most_two_at_once() {
    let market = Arc::new(Market::default());
    let toolbox = market_toolbox(&market);
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let toolbox = toolbox.clone();
            tokio::spawn(async move {
                toolbox
                    .call("rate", json!({"pair": format!("EUR/{i}")}), &ctx("shop"))
                    .await
            })
        })
        .collect();
    market.wait_running(2).await;
    // The other three wait for a slot: none of them reaches the market meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(market.running.load(Ordering::SeqCst), 2);
    assert_eq!(market.total(), 2);
    market.gate.add_permits(5);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(market.peak.load(Ordering::SeqCst), 2);
    assert_eq!(market.total(), 5);
    assert_eq!(toolbox.stats().busy, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_that_gets_no_slot_in_time_is_busy_and_never_runs() {
    let market = Arc::new(Market::default());
    let toolbox = market_toolbox(&market);
    let ctx = ctx("shop");
    // The first order holds the one slot; its caller stops waiting after 100 ms (TIMEOUT: its
    // body runs on), while the second waited those 100 ms for a slot and did not run.
    let first = tokio::spawn({
        let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
        async move { toolbox.call("place", json!({"order": "o-1"}), &ctx).await }
    });
    market.wait_running(1).await;
    let err = toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Busy) && err.is_retryable(), "{err:?}");
    assert!(err.message().contains("1 of its calls"), "{err:?}");
    let first = first.await.unwrap().unwrap_err();
    assert!(first.is(ErrorCode::Timeout), "{first:?}");
    assert_eq!((market.made("place:o-1"), market.made("place:o-2")), (1, 0));
    // Nothing of the busy call was kept: its key is free.
    let status = toolbox
        .call("place_status", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found");
    // Once the first order ends, the second runs on its retry, once.
    market.gate.add_permits(2);
    for _ in 0..100 {
        if market.running.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let placed = toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(placed.value, json!("placed-o-2"));
    assert!(
        toolbox
            .call("place", json!({"order": "o-1"}), &ctx)
            .await
            .unwrap()
            .replayed
    );
    assert_eq!((market.made("place:o-1"), market.made("place:o-2")), (1, 1));
    let stats = toolbox.stats();
    assert_eq!((stats.busy, stats.executed), (1, 2));
    assert!(toolbox.shutdown().await.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_answers_are_not_retry_failures() {
    let market = Arc::new(Market::default());
    let toolbox = Toolbox::builder()
        .shared_state(market.clone())
        .tool(Place)
        .retry_limit("place", RetryLimit::after(1, Duration::from_secs(600)))
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let holder = tokio::spawn({
        let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
        async move { toolbox.call("place", json!({"order": "o-1"}), &ctx).await }
    });
    market.wait_running(1).await;
    // With a limit of one failure, any counted BUSY would make the next answer RETRY_LIMIT.
    for _ in 0..3 {
        let err = toolbox
            .call("place", json!({"order": "o-2"}), &ctx)
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Busy), "{err:?}");
    }
    market.gate.add_permits(2);
    holder.await.unwrap().unwrap_err();
    while market.running.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    toolbox
        .call("place", json!({"order": "o-2"}), &ctx)
        .await
        .unwrap();
    assert_eq!(market.made("place:o-2"), 1);
    assert_eq!(toolbox.stats().busy, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrency_override_names_a_tool_and_is_per_toolbox() {
    let market = Arc::new(Market::default());
    let toolbox = Toolbox::builder()
        .shared_state(market.clone())
        .tool(Rate)
        .concurrency("rate", None)
        .build()
        .unwrap();
    assert_eq!(
        toolbox.definition("rate").unwrap().settings().concurrency,
        None
    );
    // Without its limit, three calls run at once.
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let toolbox = toolbox.clone();
            tokio::spawn(async move {
                toolbox
                    .call("rate", json!({"pair": format!("EUR/{i}")}), &ctx("shop"))
                    .await
            })
        })
        .collect();
    market.wait_running(3).await;
    market.gate.add_permits(3);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let err = Toolbox::builder()
        .shared_state(market)
        .tool(Rate)
        .concurrency("rates", std::num::NonZeroUsize::new(1))
        .build()
        .err()
        .unwrap();
    assert_eq!(err, toolkey::BuildError::UnknownTool("rates".into()));
}
