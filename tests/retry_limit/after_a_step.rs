//! A retry limit reached after a step acted: the answer says what was done.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;
use toolkey::store::{MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

use super::{code, ctx, open_store, server_store, tenant, Gateway};

/// A shop whose card payments go through and whose carrier is down until told otherwise.
#[derive(Default)]
struct Shop {
    charges: AtomicUsize,
    bookings: AtomicUsize,
    carrier_up: AtomicBool,
    /// The stock check before the charge fails (retryably) while set.
    stock_down: AtomicBool,
}

/// Check an order out: charge the card, then book the shipment.
#[tool(
    idempotent(key = "checkout:<order>", status = "checkout_status"),
    retry_limit = "3/10m"
)]
async fn checkout(
    shop: State<Shop>,
    ctx: &ToolContext,
    /// The order.
    order: String,
    /// The amount, in cents.
    cents: i64,
) -> Result<String, ToolError> {
    if shop.stock_down.load(Ordering::SeqCst) {
        let busy = ToolError::new("STOCK_BUSY", "the stock check does not answer");
        return Err(busy.with_retryable(true));
    }
    let charge = ctx
        .once("charge", async {
            shop.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(format!("ch-{order}-{cents}"))
        })
        .await?;
    ctx.once("ship", async {
        shop.bookings.fetch_add(1, Ordering::SeqCst);
        if !shop.carrier_up.load(Ordering::SeqCst) {
            let busy = ToolError::new("CARRIER_BUSY", "the carrier does not answer");
            return Err(busy.with_retryable(true));
        }
        Ok(format!("sh-{order}"))
    })
    .await?;
    Ok(charge)
}

fn shop_toolbox(shop: &Arc<Shop>, store: &Arc<dyn Store>) -> Toolbox {
    Toolbox::builder()
        .shared_state(shop.clone())
        .shared_store(store.clone())
        .tool(Checkout)
        .build()
        .unwrap()
}

/// Asserts that `err` stops the model and tells it that part of the action was done and must
/// not be done again by other means, never only that the call keeps failing.
fn says_part_was_done(err: &ToolError, steps: &str) {
    assert!(
        err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(
        err.message().contains("part of the action was done"),
        "{err:?}"
    );
    assert!(err.message().contains(steps), "{err:?}");
    assert!(err.message().contains("is kept"), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(!suggestion.contains("keeps failing"), "{suggestion}");
    assert!(
        suggestion.contains("must not redo the action by other means"),
        "{suggestion}"
    );
}

/// The card is charged, then the carrier keeps failing: the third failure reaches the limit.
/// Its answer, every later refusal (made before the body runs, in this process or another
/// sharing the store) and the status companion say that the charge was done and is kept. They
/// once said only "it keeps failing, let the user decide", and a user who then paid by hand
/// paid twice.
async fn a_retry_limit_after_a_step_says_the_step_was_done(store: Arc<dyn Store>) {
    let shop = Arc::new(Shop::default());
    let (here, there) = (shop_toolbox(&shop, &store), shop_toolbox(&shop, &store));
    let ctx = ctx(&tenant());
    let args = json!({"order": "o-1", "cents": 4200});
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(here.call("checkout", args.clone(), &ctx).await);
    }
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 3);
    let codes: Vec<String> = answers.iter().map(code).collect();
    assert_eq!(codes, ["CARRIER_BUSY", "CARRIER_BUSY", "RETRY_LIMIT"]);
    let reached = answers.pop().unwrap().unwrap_err();
    says_part_was_done(&reached, "step `charge`");
    assert!(!reached.message().contains("`ship`"), "{reached:?}");
    // Refused before running, here and in the other process: the store remembers the step.
    for toolbox in [&here, &there] {
        let refused = toolbox
            .call("checkout", args.clone(), &ctx)
            .await
            .unwrap_err();
        says_part_was_done(&refused, "a step of an earlier attempt");
    }
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 3);
    let status = there.call("checkout_status", args.clone(), &ctx).await;
    let status = status.unwrap().value;
    assert_eq!(status["status"], "not_found", "{status}");
    let detail = status["detail"].as_str().unwrap();
    assert!(detail.contains("part of the action was done"), "{detail}");
    // Another order has no step done: its status says nothing was kept.
    let other = json!({"order": "o-2", "cents": 4200});
    let status = there
        .call("checkout_status", other, &ctx)
        .await
        .unwrap()
        .value;
    let detail = status["detail"].as_str().unwrap();
    assert!(!detail.contains("part of the action was done"), "{detail}");
    assert!(here.shutdown().await.is_clean());
    assert!(there.shutdown().await.is_clean());
}

#[tokio::test]
async fn a_retry_limit_after_a_step_says_the_step_was_done_memory() {
    a_retry_limit_after_a_step_says_the_step_was_done(Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store("sqlite", dir.path()).await.unwrap();
    a_retry_limit_after_a_step_says_the_step_was_done(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_postgres() {
    if let Some(store) = server_store("postgres").await {
        a_retry_limit_after_a_step_says_the_step_was_done(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_limit_after_a_step_says_the_step_was_done_redis() {
    if let Some(store) = server_store("redis").await {
        a_retry_limit_after_a_step_says_the_step_was_done(store).await;
    }
}

/// A route the model describes: read by the tool, never written back.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Route {
    /// Where from.
    from: String,
    /// Where to.
    to: String,
}

/// Price a route. Its argument's type is not `Serialize`: calls are counted by their JSON.
#[tool(read_only, retry_limit = "2/10m")]
async fn price_route(gateway: State<Gateway>, route: Route) -> Result<u64, ToolError> {
    gateway.attempt(format!("route:{}-{}", route.from, route.to))?;
    Ok(1)
}

/// A tool whose arguments cannot be written back still has its limit, by the canonical JSON.
#[tokio::test]
async fn arguments_that_cannot_be_written_back_are_counted_by_their_json() {
    let gateway = Gateway::down();
    let toolbox = Toolbox::builder()
        .shared_state(gateway.clone())
        .tool(PriceRoute)
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let a = json!({"route": {"from": "Lyon", "to": "Lille"}});
    let b = json!({"route": {"to": "Lille", "from": "Lyon"}});
    let mut answers = Vec::new();
    for args in [&a, &b, &a, &b] {
        answers.push(code(&toolbox.call("price_route", args.clone(), &ctx).await));
    }
    assert_eq!(
        answers,
        ["GATEWAY_BUSY", "RETRY_LIMIT", "RETRY_LIMIT", "RETRY_LIMIT"]
    );
    assert_eq!(gateway.attempts("route:Lyon-Lille"), 2);
}

/// The card is charged and the carrier fails; then the stock check before the charge fails
/// twice, and the second of those reaches the limit in an attempt that never reached a step.
/// Its answer still says that part of the action was done: the store noted it with the first
/// failure.
#[tokio::test]
async fn a_retry_limit_reached_before_any_step_still_says_an_earlier_step_was_done() {
    let shop = Arc::new(Shop::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = shop_toolbox(&shop, &store);
    let ctx = ctx("shop");
    let args = json!({"order": "o-1", "cents": 4200});
    let first = toolbox.call("checkout", args.clone(), &ctx).await;
    assert_eq!(code(&first), "CARRIER_BUSY");
    shop.stock_down.store(true, Ordering::SeqCst);
    let second = toolbox.call("checkout", args.clone(), &ctx).await;
    assert_eq!(code(&second), "STOCK_BUSY");
    let reached = toolbox.call("checkout", args, &ctx).await.unwrap_err();
    says_part_was_done(&reached, "a step of an earlier attempt");
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert_eq!(shop.bookings.load(Ordering::SeqCst), 1);
}

/// A bank whose transfers fail retryably; the first transfer waits at the gate until the test
/// lets it through.
struct Bank {
    attempts: AtomicUsize,
    gate: Semaphore,
}

impl Default for Bank {
    fn default() -> Self {
        Bank {
            attempts: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        }
    }
}

/// Transfer money. Keyed on the call's place in the run.
#[tool(
    idempotent(key = "transfer:<ctx.run_id>:<ctx.step>", status = false),
    retry_limit = "3/10m"
)]
async fn transfer(bank: State<Bank>, to: String) -> Result<String, ToolError> {
    if bank.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
        bank.gate.acquire().await.unwrap().forget();
    }
    let down = ToolError::new("BANK_BUSY", "the bank does not answer");
    Err(down
        .with_retryable(true)
        .with_suggestion(format!("try {to} again")))
}

/// A call keyed on its place runs beside the model's next calls, which are keys of their own:
/// while the first one's body waits, a second process's calls reach the limit and the next is
/// refused. The first one, started under the limit, then fails: it is answered `RETRY_LIMIT`
/// too, never an invitation to retry, and no body starts after the limit was reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_reached_while_another_process_runs_the_call_stops_it_too() {
    let bank = Arc::new(Bank::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = || {
        Toolbox::builder()
            .shared_state(bank.clone())
            .shared_store(store.clone())
            .tool(Transfer)
            .build()
            .unwrap()
    };
    let (here, there) = (Arc::new(toolbox()), toolbox());
    let at = |step: u64| {
        ToolContext::new("run-1")
            .with_tenant("bank")
            .with_step(step)
    };
    let args = json!({"to": "acc-9"});
    let first = tokio::spawn({
        let (here, args, ctx) = (here.clone(), args.clone(), at(1));
        async move { here.call("transfer", args, &ctx).await }
    });
    while bank.attempts.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let mut answers = Vec::new();
    for step in 2..=5 {
        answers.push(code(&there.call("transfer", args.clone(), &at(step)).await));
    }
    assert_eq!(
        answers,
        ["BANK_BUSY", "BANK_BUSY", "RETRY_LIMIT", "RETRY_LIMIT"]
    );
    bank.gate.add_permits(1);
    let first = first.await.unwrap().unwrap_err();
    assert!(
        first.is(ErrorCode::RetryLimit) && !first.is_retryable(),
        "{first:?}"
    );
    let later = here.call("transfer", args, &at(6)).await;
    assert_eq!(code(&later), "RETRY_LIMIT");
    assert_eq!(bank.attempts.load(Ordering::SeqCst), 4);
}
