//! A caller that is dropped or stops polling neither cancels the body nor releases its key;
//! shutdown waits for the work it left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::store::MemoryStore;
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};
use toolkey_tests::billing;

use billing::Billing;

use super::{ctx, invoice};

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
