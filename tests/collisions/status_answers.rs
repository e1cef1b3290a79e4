//! A status answer is the record of the call its arguments describe, or says it is not; the
//! timeout's suggestion to ask can be followed literally.

use std::sync::Arc;

use serde_json::{json, Value};
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::{ctx, toolbox, Outside};

// ---------------------------------------------------------------------------------------------
// The timeout's suggestion can be followed literally.

#[tokio::test]
async fn the_status_tool_takes_the_same_arguments_as_its_tool() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let args = json!({"charge_id": "ch_1", "cents": 250});
    tb.call("refund", args.clone(), &ctx()).await.unwrap();
    let status = tb.call("refund_status", args, &ctx()).await.unwrap();
    assert_eq!(status.value["status"], "completed");
    assert_eq!(status.value["result"], json!("re-1-ch_1-250"));
    // Key fields are still required, and other fields accept whatever the tool's call held.
    let err = tb
        .call("refund_status", json!({"cents": 250}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments));
    let schema = tb
        .definition("refund_status")
        .unwrap()
        .input_schema()
        .clone();
    assert_eq!(schema["required"], json!(["charge_id"]));
    let cents = &schema["properties"]["cents"];
    assert!(
        cents["description"]
            .as_str()
            .unwrap()
            .contains("Not part of `refund_status`'s key"),
        "{schema}"
    );
}

// ---------------------------------------------------------------------------------------------
// A status answer is the record of the call its arguments describe, or says it is not.

/// Charges an order's payment.
#[tool(idempotent(key = "payment:<order>", status = "take_payment_status"))]
async fn take_payment(out: State<Outside>, order: String, cents: i64) -> Result<String, ToolError> {
    Ok(format!("pay-{}-{order}-{cents}", out.act("payment:take")))
}

/// Refunds an order's payment: the same key template, another action.
#[tool(idempotent(key = "payment:<order>", status = "return_payment_status"))]
async fn return_payment(
    out: State<Outside>,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    Ok(format!("ret-{}-{order}-{cents}", out.act("payment:return")))
}

#[tokio::test]
async fn a_status_call_for_another_actions_record_says_conflict_not_completed() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(TakePayment)
        .tool(ReturnPayment)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "cents": 500});
    let taken = tb.call("take_payment", args.clone(), &ctx()).await.unwrap();
    // The refund is refused, and its message does not claim a refund ran.
    let err = tb
        .call("return_payment", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert!(err.message().contains("another tool"), "{err}");
    // Its status, asked with the refund's own arguments, does not say it completed.
    let status = tb
        .call("return_payment_status", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "conflict", "{}", status.value);
    assert!(status.value.get("result").is_none(), "{}", status.value);
    let detail = status.value["detail"].as_str().unwrap();
    assert!(
        detail.contains("has not run with these arguments"),
        "{detail}"
    );
    // The charge's own status, and a charge of another amount.
    let own = tb
        .call("take_payment_status", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(own.value["status"], "completed");
    assert_eq!(own.value["result"], taken.value);
    assert!(
        own.value.get("note").is_none(),
        "all arguments were compared: {}",
        own.value
    );
    let other_amount = json!({"order": "o-1", "cents": 999});
    let err = tb
        .call("take_payment", other_amount.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict));
    let status = tb
        .call("take_payment_status", other_amount, &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "conflict", "{}", status.value);
    // Only the key given: the key's record is answered, and said to be checked by key alone.
    let by_key = tb
        .call("return_payment_status", json!({"order": "o-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!(by_key.value["status"], "completed");
    let note = by_key.value["note"].as_str().unwrap();
    assert!(note.contains("only the key was checked"), "{note}");
    // Nothing asked about yet: not found, with or without every argument.
    for args in [json!({"order": "o-2", "cents": 1}), json!({"order": "o-2"})] {
        let none = tb
            .call("return_payment_status", args, &ctx())
            .await
            .unwrap();
        assert_eq!(none.value["status"], "not_found", "{}", none.value);
    }
    assert_eq!(
        (out.count("payment:take"), out.count("payment:return")),
        (1, 0)
    );
}

/// Where a parcel goes.
#[toolkey::data]
struct Address {
    street: String,
    city: String,
}

/// Ships an order to an address given field by field beside the order.
#[tool(idempotent(key = "parcel:<order>"))]
async fn ship_to(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] address: Address,
) -> Result<String, ToolError> {
    let n = out.act(format!("parcel:{order}"));
    Ok(format!("parcel-{n}-{}-{}", address.street, address.city))
}

#[tokio::test]
async fn a_status_tool_takes_its_tools_flattened_arguments_as_they_are() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ShipTo)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "street": "Main 1", "city": "Bonn"});
    let shipped = tb.call("ship_to", args.clone(), &ctx()).await.unwrap();
    let status = tb.call("ship_to_status", args, &ctx()).await.unwrap();
    assert_eq!(status.value["status"], "completed", "{}", status.value);
    assert_eq!(status.value["result"], shipped.value);
    // Another address under the same order is another action, and said so.
    let elsewhere = json!({"order": "o-1", "street": "Side 2", "city": "Bonn"});
    let status = tb.call("ship_to_status", elsewhere, &ctx()).await.unwrap();
    assert_eq!(status.value["status"], "conflict", "{}", status.value);
    // The order alone is the key alone.
    let by_key = tb
        .call("ship_to_status", json!({"order": "o-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!(by_key.value["status"], "completed", "{}", by_key.value);
    assert!(by_key.value["note"].is_string(), "{}", by_key.value);
    let schema = tb
        .definition("ship_to_status")
        .unwrap()
        .input_schema()
        .clone();
    assert_eq!(schema["required"], json!(["order"]), "{schema}");
    assert_eq!(out.count("parcel:"), 1);
}

/// Sends an order's notice, copied to `cc` when given: every argument outside the key has a
/// default.
#[tool(idempotent(key = "notice:<order>", status = "notice_status"))]
async fn send_notice(
    out: State<Outside>,
    order: String,
    cc: Option<String>,
    #[serde(default)] urgent: bool,
    #[arg(ignore)] memo: Option<String>,
) -> Result<String, ToolError> {
    let _ = memo;
    let n = out.act(format!("notice:{order}"));
    Ok(format!("notice-{n}-{}-{urgent}", cc.unwrap_or_default()))
}

#[tokio::test]
async fn a_status_call_naming_only_the_key_is_not_a_call_with_the_defaults() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(SendNotice)
        .build()
        .unwrap();
    let status = |args: Value| {
        let tb = &tb;
        async move { tb.call("notice_status", args, &ctx()).await.unwrap().value }
    };
    let sent = tb
        .call("send_notice", json!({"order": "o-1", "cc": "boss"}), &ctx())
        .await
        .unwrap();
    // The key alone, or with an argument the fingerprint ignores: the key's record, checked by
    // key alone; not a call without `cc` that "has not run".
    for args in [
        json!({"order": "o-1"}),
        json!({"order": "o-1", "memo": "hi"}),
    ] {
        let answer = status(args).await;
        assert_eq!(answer["status"], "completed", "{answer}");
        assert_eq!(answer["result"], sent.value);
        let note = answer["note"].as_str().unwrap();
        assert!(note.contains("only the key was checked"), "{note}");
    }
    // Naming an argument outside the key: a whole call, checked against the record.
    let own = status(json!({"order": "o-1", "cc": "boss", "memo": "hi"})).await;
    assert_eq!(own["status"], "completed", "{own}");
    assert!(own.get("note").is_none(), "{own}");
    for other in [
        json!({"order": "o-1", "cc": "intern"}),
        json!({"order": "o-1", "cc": "boss", "urgent": true}),
        json!({"order": "o-1", "cc": null}),
    ] {
        let answer = status(other).await;
        assert_eq!(answer["status"], "conflict", "{answer}");
    }
    // A call made with the defaults: the key alone is still checked by key alone, and its
    // arguments as they were sent are that call.
    tb.call("send_notice", json!({"order": "o-2"}), &ctx())
        .await
        .unwrap();
    let by_key = status(json!({"order": "o-2"})).await;
    assert_eq!(by_key["status"], "completed");
    assert!(by_key.get("note").is_some(), "{by_key}");
    let own = status(json!({"order": "o-2", "cc": null, "urgent": false})).await;
    assert_eq!(own["status"], "completed", "{own}");
    assert!(own.get("note").is_none(), "{own}");
    assert_eq!((out.count("notice:o-1"), out.count("notice:o-2")), (1, 1));
}

/// Closes an order: its only argument is its key.
#[tool(idempotent(key = "closing:<order>", status = "close_status"))]
async fn close_order(out: State<Outside>, order: String) -> Result<String, ToolError> {
    Ok(format!("closed-{}", out.act(format!("close:{order}"))))
}

/// Reopens an order: the same key template, another action.
#[tool(idempotent(key = "closing:<order>", status = "reopen_status"))]
async fn reopen_order(out: State<Outside>, order: String) -> Result<String, ToolError> {
    Ok(format!("reopened-{}", out.act(format!("reopen:{order}"))))
}

#[tokio::test]
async fn a_tool_whose_arguments_are_its_key_is_told_apart_by_its_status() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(CloseOrder)
        .tool(ReopenOrder)
        .build()
        .unwrap();
    let args = json!({"order": "o-1"});
    tb.call("close_order", args.clone(), &ctx()).await.unwrap();
    // The key is every argument: the arguments are a whole call, and the record another's.
    let reopen = tb
        .call("reopen_status", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(reopen.value["status"], "conflict", "{}", reopen.value);
    let close = tb.call("close_status", args, &ctx()).await.unwrap();
    assert_eq!(close.value["status"], "completed", "{}", close.value);
    assert!(close.value.get("note").is_none(), "{}", close.value);
    assert_eq!((out.count("close:"), out.count("reopen:")), (1, 0));
}
