//! A step's record lives under its parent's whole key and is bound to its fingerprint: a
//! step name is one record per call, never a result of another call or another tool.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

use super::{ctx, toolbox, Outside};

// ---------------------------------------------------------------------------------------------
// A step's record lives under its parent's whole key.

/// Sends the invoice, then emails it.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = false))]
pub(super) async fn bill(
    out: State<Outside>,
    ctx: &ToolContext,
    customer: String,
    period: String,
) -> Result<String, ToolError> {
    ctx.once("email", async {
        Ok::<_, ToolError>(format!(
            "email-{}-invoice-{customer}-{period}",
            out.act("email:invoice")
        ))
    })
    .await
}

/// Sends a reminder for the same customer and period, by email too.
#[tool(idempotent(key = "reminder:<customer>:<period>", status = false))]
pub(super) async fn remind(
    out: State<Outside>,
    ctx: &ToolContext,
    customer: String,
    period: String,
) -> Result<String, ToolError> {
    ctx.once("email", async {
        Ok::<_, ToolError>(format!(
            "email-{}-reminder-{customer}-{period}",
            out.act("email:reminder")
        ))
    })
    .await
}

/// Charges an order: its one step is named like the tool's own namespace.
#[tool(idempotent(key = "charge:<order>", status = false))]
pub(super) async fn charge(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<usize, ToolError> {
    ctx.once("charge", async {
        Ok::<_, ToolError>(out.act(format!("charge:{order}")))
    })
    .await
}

#[tokio::test]
async fn steps_of_two_tools_with_one_name_are_two_records() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let args = json!({"customer": "acme", "period": "2026-10"});
    let invoice = tb.call("bill", args.clone(), &ctx()).await.unwrap();
    let reminder = tb.call("remind", args.clone(), &ctx()).await.unwrap();
    assert_eq!(invoice.value, json!("email-1-invoice-acme-2026-10"));
    assert_eq!(reminder.value, json!("email-2-reminder-acme-2026-10"));
    assert!(!reminder.replayed);
    // Retries replay each tool's own result.
    let again = tb.call("remind", args, &ctx()).await.unwrap();
    assert_eq!((again.value, again.replayed), (reminder.value, true));
    assert_eq!(out.count("email:invoice"), 1);
    assert_eq!(out.count("email:reminder"), 1);
}

#[tokio::test]
async fn a_step_named_like_its_tool_is_not_the_tool_itself() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let first = tb
        .call("charge", json!({"order": "o-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!(first.value, json!(1));
    let again = tb
        .call("charge", json!({"order": "o-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!((again.value, again.replayed), (json!(1), true));
    assert_eq!(out.count("charge:o-1"), 1);
}

// ---------------------------------------------------------------------------------------------
// Steps are bound to their parent's fingerprint.

/// Charges the order's amount, then sends a receipt (whose first attempt fails retryably).
#[tool(idempotent(key = "pay:<order>", status = false))]
pub(super) async fn pay(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    let charge: String = ctx
        .once("charge", async {
            out.act(format!("charge:{cents}"));
            Ok::<_, ToolError>(format!("ch-{order}-{cents}"))
        })
        .await?;
    ctx.once("receipt", async {
        if out.fail_receipt_once.swap(false, Ordering::SeqCst) {
            return Err(ToolError::new("MAIL_DOWN", "mail server down").with_retryable(true));
        }
        out.act("receipt");
        Ok(())
    })
    .await?;
    Ok(charge)
}

#[tokio::test]
async fn a_finished_step_is_never_replayed_into_a_call_with_other_arguments() {
    let out = Arc::new(Outside::default());
    out.fail_receipt_once.store(true, Ordering::SeqCst);
    let tb = toolbox(&out);
    let err = tb
        .call("pay", json!({"order": "o-7", "cents": 500}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "MAIL_DOWN");
    assert!(err.is_retryable());

    // Same key, other amount: the 500-cent charge must not answer a 900-cent payment.
    let err = tb
        .call("pay", json!({"order": "o-7", "cents": 900}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(out.count("charge:"), 1);

    // The conflicting call left the key free for the action it belongs to: its retry finishes.
    let done = tb
        .call("pay", json!({"order": "o-7", "cents": 500}), &ctx())
        .await
        .unwrap();
    assert_eq!(done.value, json!("ch-o-7-500"));
    assert_eq!((out.count("charge:500"), out.count("charge:900")), (1, 0));
    assert_eq!(out.count("receipt"), 1);
}

/// Notifies the customer as a best-effort step (an error there is let go), then charges directly;
/// the provider's first answer is an outage, its second a lost reply.
#[tool(idempotent(key = "settle:<order>"))]
async fn settle_order(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
    cents: i64,
) -> Result<String, ToolError> {
    let _ = ctx
        .once("notify", async {
            out.act("notify");
            Ok::<_, ToolError>(())
        })
        .await;
    if out.count("outage") == 0 {
        out.act("outage");
        return Err(
            ToolError::new("DOWN", "the provider is down; nothing was sent").with_retryable(true),
        );
    }
    out.act(format!("settle:{order}:{cents}"));
    Err(ToolError::outcome_unknown(
        "the charge went out; its reply was lost",
    ))
}

#[tokio::test]
async fn an_unknown_outcome_after_a_steps_conflict_is_kept_not_released() {
    // A step met another action's record (the notice of a call with another amount), and the
    // body went on past it and acted: its unknown outcome is the key's record, so the retry
    // does not charge again and the status says unknown.
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(SettleOrder)
        .build()
        .unwrap();
    let err = tb
        .call(
            "settle_order",
            json!({"order": "o-1", "cents": 100}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "DOWN");
    let corrected = json!({"order": "o-1", "cents": 120});
    for _ in 0..2 {
        let err = tb
            .call("settle_order", corrected.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        assert!(!err.is_retryable(), "{err:?}");
    }
    let status = tb
        .call("settle_order_status", corrected, &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown", "{}", status.value);
    assert_eq!((out.count("notify"), out.count("settle:")), (1, 1));
}

/// Sends a reminder to each recipient of a batch, each as a step.
#[tool(idempotent(key = "remind-batch:<batch>", status = false))]
async fn remind_batch(
    out: State<Outside>,
    ctx: &ToolContext,
    batch: String,
    recipients: Vec<String>,
    numbered: bool,
) -> Result<Vec<String>, ToolError> {
    let mut sent = Vec::new();
    for (i, to) in recipients.iter().enumerate() {
        let step = match numbered {
            true => format!("send-{i}"),
            false => "send".to_string(),
        };
        let id: String = ctx
            .once(&step, async {
                Ok::<_, ToolError>(format!("{}-{}", out.act(format!("remind:{batch}")), to))
            })
            .await?;
        sent.push(id);
    }
    Ok(sent)
}

#[tokio::test]
async fn a_step_name_used_twice_in_one_call_is_refused_not_skipped() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(RemindBatch)
        .build()
        .unwrap();
    let args = json!({"batch": "b1", "recipients": ["ann", "bob", "cid"], "numbered": false});
    for _ in 0..2 {
        // The second round's step would have been answered with the first one's result.
        let err = tb
            .call("remind_batch", args.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Internal), "{err:?}");
        assert!(
            err.message()
                .contains("step `send` was already used in this call"),
            "{err}"
        );
        assert!(!err.is_retryable());
    }
    assert_eq!(out.count("remind:b1"), 1);
    // Each round named: every reminder is sent, once.
    let args = json!({"batch": "b2", "recipients": ["ann", "bob", "cid"], "numbered": true});
    let sent = tb.call("remind_batch", args.clone(), &ctx()).await.unwrap();
    assert_eq!(sent.value.as_array().unwrap().len(), 3);
    let again = tb.call("remind_batch", args, &ctx()).await.unwrap();
    assert!(again.replayed);
    assert_eq!(out.count("remind:b2"), 3);
}

/// Charges an order as a step, trying the step again within the call while the provider
/// answers that it is down.
#[tool(idempotent(key = "charge-retrying:<order>", status = false))]
async fn charge_retrying(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    let mut last = None;
    for _ in 0..3 {
        let charged: Result<String, ToolError> = ctx
            .once("charge", async {
                if out.count("outage") < 2 {
                    out.act("outage");
                    return Err(ToolError::new(
                        "DOWN",
                        "the provider is down; nothing was charged",
                    )
                    .with_retryable(true));
                }
                Ok(format!("ch-{}", out.act(format!("charge:{order}"))))
            })
            .await;
        match charged {
            Ok(id) => return Ok(id),
            Err(err) if err.is_retryable() => last = Some(err),
            Err(err) => return Err(err),
        }
    }
    Err(last.expect("three tries"))
}

#[tokio::test]
async fn a_step_that_failed_and_may_be_retried_runs_again_under_its_name() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ChargeRetrying)
        .build()
        .unwrap();
    let charged = tb
        .call("charge_retrying", json!({"order": "o-1"}), &ctx())
        .await
        .unwrap();
    assert_eq!(charged.value, json!("ch-3"));
    assert_eq!((out.count("outage"), out.count("charge:")), (2, 1));
}

/// Notifies as a best-effort step, then ships; the warehouse is down at first, and ships 100 at
/// most (a refusal that did nothing).
#[tool(idempotent(key = "ship-batch:<order>"))]
async fn ship_batch(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
    qty: i64,
) -> Result<String, ToolError> {
    let _ = ctx
        .once("notify", async {
            out.act(format!("notify:{qty}"));
            Ok::<_, ToolError>(())
        })
        .await;
    if out.count("outage") == 0 {
        out.act("outage");
        return Err(
            ToolError::new("DOWN", "the warehouse is down; nothing was shipped")
                .with_retryable(true),
        );
    }
    if qty > 100 {
        return Err(ToolError::new(
            "TOO_MANY",
            "the warehouse ships 100 at most; nothing was shipped",
        ));
    }
    Ok(format!("ship-{}", out.act(format!("ship:{order}:{qty}"))))
}

#[tokio::test]
async fn a_refusal_after_another_actions_step_leaves_the_key_to_that_action() {
    // A's notice ran before the outage; B, another quantity, met it, went on, and was refused
    // having done nothing: A's retry finishes A, its notice replayed.
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ShipBatch)
        .build()
        .unwrap();
    let (a, b) = (
        json!({"order": "o-1", "qty": 5}),
        json!({"order": "o-1", "qty": 500}),
    );
    let err = tb.call("ship_batch", a.clone(), &ctx()).await.unwrap_err();
    assert_eq!(err.code(), "DOWN");
    let err = tb.call("ship_batch", b, &ctx()).await.unwrap_err();
    assert_eq!(err.code(), "TOO_MANY");
    let shipped = tb.call("ship_batch", a.clone(), &ctx()).await.unwrap();
    assert!(!shipped.replayed);
    let status = tb.call("ship_batch_status", a, &ctx()).await.unwrap();
    assert_eq!(status.value["status"], "completed", "{}", status.value);
    assert_eq!((out.count("notify:"), out.count("ship:")), (1, 1));
}

/// Sends two notices at once as two steps; until its code is fixed, both have one name.
#[tool(idempotent(key = "notices:<order>", status = false))]
async fn send_notices(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<(String, String), ToolError> {
    let fixed = out.count("fixed") > 0;
    let second = if fixed { "notice-2" } else { "notice-1" };
    let send = |to: &'static str| {
        let out = out.clone();
        let order = order.clone();
        async move { Ok::<_, ToolError>(format!("{}-{to}", out.act(format!("notice:{order}:{to}")))) }
    };
    let (a, b) = tokio::join!(
        ctx.once("notice-1", send("ann")),
        ctx.once(second, send("bob"))
    );
    Ok((a?, b?))
}

#[tokio::test]
async fn two_steps_of_one_name_at_once_are_refused_and_the_fixed_code_finishes_the_call() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(SendNotices)
        .build()
        .unwrap();
    let args = json!({"order": "o-1"});
    for _ in 0..2 {
        let err = tb
            .call("send_notices", args.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Internal), "{err:?}");
        assert!(
            err.message().contains("step `notice-1` was already used"),
            "{err}"
        );
    }
    // Bob's notice was never answered with Ann's; once the code is fixed, the call finishes,
    // Ann's notice replayed.
    assert_eq!(
        (out.count("notice:o-1:ann"), out.count("notice:o-1:bob")),
        (1, 0)
    );
    out.act("fixed");
    let sent = tb.call("send_notices", args, &ctx()).await.unwrap();
    assert_eq!(sent.value, json!(["1-ann", "3-bob"]));
    assert_eq!(
        (out.count("notice:o-1:ann"), out.count("notice:o-1:bob")),
        (1, 1)
    );
}

/// Charges each card of a list as a step named alike, noting each answer's code and going on.
#[tool(idempotent(key = "cards:<order>", status = false))]
async fn charge_cards(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
    cards: Vec<String>,
) -> Result<Vec<String>, ToolError> {
    let _ = order;
    let mut codes = Vec::new();
    for card in cards {
        let charged = ctx
            .once("charge", async {
                if card == "declined" {
                    return Err(ToolError::new("CARD_DECLINED", "the card was declined"));
                }
                Ok::<_, ToolError>(out.act(format!("card:{card}")))
            })
            .await;
        codes.push(match charged {
            Ok(_) => "OK".to_string(),
            Err(err) => err.code().to_string(),
        });
    }
    Ok(codes)
}

#[tokio::test]
async fn a_name_reused_after_a_failed_step_is_refused_not_answered_with_its_error() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ChargeCards)
        .build()
        .unwrap();
    let codes = tb
        .call(
            "charge_cards",
            json!({"order": "o-1", "cards": ["declined", "visa"]}),
            &ctx(),
        )
        .await
        .unwrap();
    // The visa was not answered with the first card's decline: its step was refused.
    assert_eq!(codes.value, json!(["CARD_DECLINED", "INTERNAL"]));
    assert_eq!(out.count("card:"), 0);
}
