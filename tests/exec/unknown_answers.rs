//! An answer about an unknown outcome suggests only what the tool offers, and a status after a
//! step acted says the step is kept.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

use super::ctx;

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
