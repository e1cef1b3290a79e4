//! Keys and steps that cannot collide, and answers a model can follow: every scenario is
//! counted on a fake outside system (payments, emails, refunds), and ends with an exact count.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{json, Value};
use toolkey::store::faults::{FaultyStore, Plan};
use toolkey::store::MemoryStore;
use toolkey::{tool, ErrorCode, Fingerprint, State, Tool, ToolContext, ToolError, Toolbox};

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

/// The outside world: every effect, named.
#[derive(Default)]
struct Outside {
    effects: Mutex<Vec<String>>,
    fail_receipt_once: AtomicBool,
    ship_reply_lost_once: AtomicBool,
}

impl Outside {
    fn act(&self, what: impl Into<String>) -> usize {
        let mut effects = self.effects.lock().unwrap();
        effects.push(what.into());
        effects.len()
    }
    fn count(&self, prefix: &str) -> usize {
        let effects = self.effects.lock().unwrap();
        effects.iter().filter(|e| e.starts_with(prefix)).count()
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A step's record lives under its parent's whole key.

/// Sends the invoice, then emails it.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = false))]
async fn bill(
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
async fn remind(
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
async fn charge(out: State<Outside>, ctx: &ToolContext, order: String) -> Result<usize, ToolError> {
    ctx.once("charge", async {
        Ok::<_, ToolError>(out.act(format!("charge:{order}")))
    })
    .await
}

fn toolbox(out: &Arc<Outside>) -> Toolbox {
    Toolbox::builder()
        .shared_state(out.clone())
        .tool(Bill)
        .tool(Remind)
        .tool(Charge)
        .tool(Pay)
        .tool(Ship)
        .tool(ShipNoHook)
        .tool(Refund)
        .tool(Pair)
        .tool(Tag)
        .tool(Statement)
        .tool(Layout)
        .tool(Void)
        .build()
        .unwrap()
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
// 2. Steps are bound to their parent's fingerprint.

/// Charges the order's amount, then sends a receipt (whose first attempt fails retryably).
#[tool(idempotent(key = "pay:<order>", status = false))]
async fn pay(
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

/// Sends a notice; its memo is renamed in the arguments and ignored, and its region, part of
/// the key, has a default.
#[tool(idempotent(
    key = "notice-region:<order>:<region>",
    status = "notice_region_status"
))]
async fn notice_region(
    out: State<Outside>,
    order: String,
    #[serde(default)] region: String,
    urgent: Option<bool>,
    #[arg(ignore)]
    #[serde(rename = "note")]
    memo: Option<String>,
) -> Result<String, ToolError> {
    let _ = memo;
    let n = out.act(format!("notice:{order}"));
    Ok(format!("n-{n}-{region}-{}", urgent.unwrap_or_default()))
}

#[tokio::test]
async fn key_fields_with_defaults_and_renamed_ignored_fields_are_not_a_whole_call() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(NoticeRegion)
        .build()
        .unwrap();
    tb.call(
        "notice_region",
        json!({"order": "o-1", "region": "eu", "urgent": true, "note": "x"}),
        &ctx(),
    )
    .await
    .unwrap();
    for args in [
        json!({"order": "o-1", "region": "eu"}),
        json!({"order": "o-1", "region": "eu", "note": "reworded"}),
    ] {
        let answer = tb
            .call("notice_region_status", args, &ctx())
            .await
            .unwrap()
            .value;
        assert_eq!(answer["status"], "completed", "{answer}");
        assert!(
            answer.get("note").is_some(),
            "checked by key alone: {answer}"
        );
    }
    let own = tb
        .call(
            "notice_region_status",
            json!({"order": "o-1", "region": "eu", "urgent": true}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    assert_eq!(own["status"], "completed", "{own}");
    assert!(own.get("note").is_none(), "{own}");
    let definition = tb.definition("notice_region").unwrap();
    assert_eq!(definition.ignored_arguments(), ["note"]);
    assert_eq!(out.count("notice:"), 1);
}

/// Sends a notice; its region, part of the key, is `zone` in the arguments and has a default.
#[tool(idempotent(key = "notice-zone:<order>:<region>", status = "notice_zone_status"))]
async fn notice_zone(
    out: State<Outside>,
    order: String,
    #[serde(rename = "zone", default)] region: String,
    urgent: Option<bool>,
) -> Result<String, ToolError> {
    let n = out.act(format!("notice:{order}:{region}"));
    Ok(format!("n-{n}-{}", urgent.unwrap_or_default()))
}

/// A key field renamed in the arguments is a key field by its JSON name: a status call naming
/// the key alone is answered by key, not checked as a call with the other fields' defaults.
#[tokio::test]
async fn a_renamed_key_field_with_a_default_is_part_of_the_key_for_the_status_check() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(NoticeZone)
        .build()
        .unwrap();
    let sent = json!({"order": "o-1", "zone": "eu", "urgent": true});
    tb.call("notice_zone", sent.clone(), &ctx()).await.unwrap();
    let by_key = tb
        .call(
            "notice_zone_status",
            json!({"order": "o-1", "zone": "eu"}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert!(
        by_key.get("note").is_some(),
        "checked by key alone: {by_key}"
    );
    let own = tb
        .call("notice_zone_status", sent, &ctx())
        .await
        .unwrap()
        .value;
    assert_eq!(own["status"], "completed", "{own}");
    assert!(own.get("note").is_none(), "{own}");
    let other = tb
        .call(
            "notice_zone_status",
            json!({"order": "o-1", "zone": "eu", "urgent": false}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    assert_eq!(other["status"], "conflict", "{other}");
    let definition = tb.definition("notice_zone").unwrap();
    assert_eq!(definition.key_arguments(), ["order", "zone"]);
    assert_eq!(out.count("notice:o-1:eu"), 1);
}

/// Charges part of an order, in a currency; the order is `order_id` in the arguments.
#[tool(idempotent(key = "charge-part:<order>", status = "charge_part_status"))]
async fn charge_part(
    out: State<Outside>,
    #[serde(rename = "order_id")] order: String,
    cents: i64,
    currency: String,
) -> Result<String, ToolError> {
    let n = out.act(format!("charge:{order}:{cents}"));
    Ok(format!("c-{n}-{currency}"))
}

/// A status call that gives a field beside the key but not a whole call is answered by key with
/// a note that its fields were not checked, naming what is missing: its note said no other
/// argument was given, and the model read `completed` for an amount that never ran.
#[tokio::test]
async fn a_status_call_that_gives_some_fields_beside_the_key_says_they_were_not_checked() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ChargePart)
        .build()
        .unwrap();
    let charged = json!({"order_id": "o-1", "cents": 5, "currency": "eur"});
    tb.call("charge_part", charged.clone(), &ctx())
        .await
        .unwrap();
    let partial = tb
        .call(
            "charge_part_status",
            json!({"order_id": "o-1", "cents": 6}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    assert_eq!(partial["status"], "completed", "{partial}");
    let note = partial["note"].as_str().unwrap();
    assert!(note.contains("not a whole `charge_part` call"), "{note}");
    assert!(note.contains("missing field `currency`"), "{note}");
    assert!(
        note.contains("give every argument of the `charge_part` call"),
        "{note}"
    );
    // A `null` the target refuses is a field not given, as the companion's schema has it:
    // beside another field, a partial call; alone beside the key, the key alone.
    let nulls = tb
        .call(
            "charge_part_status",
            json!({"order_id": "o-1", "cents": null, "currency": "usd"}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    let note = nulls["note"].as_str().unwrap();
    assert!(note.contains("missing field `cents`"), "{nulls}");
    let nulls = tb
        .call(
            "charge_part_status",
            json!({"order_id": "o-1", "cents": null}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    let note = nulls["note"].as_str().unwrap();
    assert!(
        note.starts_with("only the key was checked, since"),
        "{nulls}"
    );
    // A value the target refuses is its refusal, naming the field and what it expects; sent
    // as it says, the answer is true.
    let err = tb
        .call(
            "charge_part_status",
            json!({"order_id": "o-1", "cents": "five", "currency": "eur"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(err.message().contains("`cents`"), "{err:?}");
    assert!(!err.message().contains("whole call"), "{err:?}");
    assert!(
        err.suggestion().unwrap().contains("send `cents` as"),
        "{err:?}"
    );
    // Either way the suggestion reads, the answer is true.
    let by_key = tb
        .call("charge_part_status", json!({"order_id": "o-1"}), &ctx())
        .await
        .unwrap()
        .value;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert!(by_key.get("note").is_some(), "{by_key}");
    let whole = json!({"order_id": "o-1", "cents": 6, "currency": "eur"});
    let other = tb
        .call("charge_part_status", whole, &ctx())
        .await
        .unwrap()
        .value;
    assert_eq!(other["status"], "conflict", "{other}");
    let own = tb
        .call("charge_part_status", charged, &ctx())
        .await
        .unwrap()
        .value;
    assert_eq!(
        (&own["status"], own.get("note")),
        (&json!("completed"), None)
    );
    assert_eq!(out.count("charge:"), 1);
}

/// Sends a notice; its urgency may be given as `priority`, and its zone, part of the key, is
/// `zone` in the arguments.
#[tool(idempotent(key = "notice-alias:<order>:<region>", status = "notice_alias_status"))]
async fn notice_alias(
    out: State<Outside>,
    order: String,
    #[serde(rename = "zone", default)] region: String,
    #[serde(alias = "priority")] urgent: Option<bool>,
    #[serde(rename = "lang", default)] language: String,
) -> Result<String, ToolError> {
    let n = out.act(format!("notice:{order}:{region}"));
    Ok(format!("n-{n}-{}-{language}", urgent.unwrap_or_default()))
}

/// A field given by its alias names it: a status call with another urgency by its alias is
/// checked, and answered `conflict`, not `completed` by key. A field beside the key that is
/// renamed and has a default compiles, and is read by its JSON name.
#[tokio::test]
async fn a_field_given_by_its_alias_is_checked_by_the_status_companion() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(NoticeAlias)
        .build()
        .unwrap();
    let sent = json!({"order": "o-1", "zone": "eu", "priority": true});
    tb.call("notice_alias", sent.clone(), &ctx()).await.unwrap();
    let status = |args: Value| {
        let tb = tb.clone();
        async move {
            tb.call("notice_alias_status", args, &ctx())
                .await
                .unwrap()
                .value
        }
    };
    let other = status(json!({"order": "o-1", "zone": "eu", "priority": false})).await;
    assert_eq!(other["status"], "conflict", "{other}");
    let other = status(json!({"order": "o-1", "zone": "eu", "urgent": true, "lang": "en"})).await;
    assert_eq!(other["status"], "conflict", "{other}");
    for own in [
        sent,
        json!({"order": "o-1", "zone": "eu", "urgent": true}),
        json!({"order": "o-1", "zone": "eu", "priority": true, "lang": ""}),
    ] {
        let own = status(own).await;
        assert_eq!(
            (&own["status"], own.get("note")),
            (&json!("completed"), None),
            "{own}"
        );
    }
    let by_key = status(json!({"order": "o-1", "zone": "eu"})).await;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert!(by_key.get("note").is_some(), "{by_key}");
    assert_eq!(out.count("notice:"), 1);
}

/// Where a parcel goes: a flattened part of the arguments, its zip also read as `zip_code`.
#[derive(serde::Deserialize, Serialize, schemars::JsonSchema)]
struct DropAddress {
    #[serde(alias = "zip_code")]
    zip: String,
    city: String,
}

/// Ships an order to an address.
#[tool(idempotent(key = "drop:<order>", status = "ship_drop_status"))]
async fn ship_drop(
    out: State<Outside>,
    order: String,
    cents: i64,
    #[serde(flatten)] to: DropAddress,
    #[arg(ignore)] memo: Option<String>,
) -> Result<String, ToolError> {
    let _ = memo;
    let n = out.act(format!("ship:{order}:{cents}:{}:{}", to.zip, to.city));
    Ok(format!("s-{n}"))
}

/// A field of a flattened part, given by an alias the macro cannot see, still names a call:
/// a status call that gives it without a whole call is told its fields were not checked. An
/// ignored field given with the key leaves the answer by key, whose note says what it checked.
#[tokio::test]
async fn any_field_beside_the_key_names_a_call_even_one_the_macro_cannot_see() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ShipDrop)
        .build()
        .unwrap();
    let shipped = json!({"order": "o-1", "cents": 5, "zip": "10115", "city": "Berlin"});
    tb.call("ship_drop", shipped, &ctx()).await.unwrap();
    for partial in [
        json!({"order": "o-1", "zip_code": "99999"}),
        json!({"order": "o-1", "zip": "99999"}),
    ] {
        let answer = tb
            .call("ship_drop_status", partial, &ctx())
            .await
            .unwrap()
            .value;
        let note = answer["note"].as_str().unwrap_or_default();
        assert!(note.contains("not a whole `ship_drop` call"), "{answer}");
    }
    let status = |args: Value| {
        let tb = tb.clone();
        async move {
            tb.call("ship_drop_status", args, &ctx())
                .await
                .unwrap()
                .value
        }
    };
    let other = json!({"order": "o-1", "cents": 5, "zip_code": "99999", "city": "Berlin"});
    assert_eq!(status(other).await["status"], "conflict");
    let own = json!({"order": "o-1", "cents": 5, "zip_code": "10115", "city": "Berlin"});
    let own = status(own).await;
    assert_eq!(
        (&own["status"], own.get("note")),
        (&json!("completed"), None),
        "{own}"
    );
    let by_key = status(json!({"order": "o-1", "memo": "reworded"})).await;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    let note = by_key["note"].as_str().unwrap();
    assert!(
        note.contains("no argument of `ship_drop` that tells calls under one key apart"),
        "{note}"
    );
    // The call itself takes the flattened struct's alias too: the same shipment, replayed.
    let again = json!({"order": "o-1", "cents": 5, "zip_code": "10115", "city": "Berlin"});
    assert!(tb.call("ship_drop", again, &ctx()).await.unwrap().replayed);
    assert_eq!(out.count("ship:"), 1);
}

/// Where a letter goes: both fields required.
#[derive(serde::Deserialize, Serialize, schemars::JsonSchema)]
struct LetterAddress {
    zip: String,
    city: String,
}

/// Posts a letter.
#[tool(idempotent(key = "letter:<order>", status = "post_letter_status"))]
async fn post_letter(
    out: State<Outside>,
    order: String,
    to: LetterAddress,
    note: Option<String>,
) -> Result<String, ToolError> {
    let _ = note;
    let n = out.act(format!("letter:{order}:{}:{}", to.zip, to.city));
    Ok(format!("l-{n}"))
}

/// A field missing inside a value given is that value refused, as the target refuses it, not a
/// call left partial: sending the same arguments again would never get past it.
#[tokio::test]
async fn a_field_missing_inside_a_value_is_the_targets_refusal_not_a_partial_call() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(PostLetter)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "to": {"zip": "10115", "city": "Berlin"}, "note": null});
    tb.call("post_letter", args.clone(), &ctx()).await.unwrap();
    let own = tb
        .call("post_letter_status", args, &ctx())
        .await
        .unwrap()
        .value;
    assert_eq!(
        (&own["status"], own.get("note")),
        (&json!("completed"), None),
        "{own}"
    );
    let bad = json!({"order": "o-2", "to": {"zip": "10115"}});
    let refused = tb
        .call("post_letter", bad.clone(), &ctx())
        .await
        .unwrap_err();
    let err = tb
        .call("post_letter_status", bad, &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(!err.message().contains("whole call"), "{err:?}");
    assert_eq!(err.message(), refused.message());
    let missing = json!({"order": "o-1", "note": "hello"});
    let answer = tb
        .call("post_letter_status", missing, &ctx())
        .await
        .unwrap()
        .value;
    let note = answer["note"].as_str().unwrap_or_default();
    assert!(note.contains("missing field `to`"), "{answer}");
    assert_eq!(out.count("letter:"), 1);
}

/// Books a room by its type, a raw identifier, which the key names as serde does: `<type>`.
#[tool(idempotent(key = "room:<type>:<night>", status = "book_room_status"))]
async fn book_room(
    out: State<Outside>,
    r#type: String,
    night: String,
    guests: u32,
) -> Result<String, ToolError> {
    let n = out.act(format!("room:{type}:{night}", type = r#type));
    Ok(format!("r-{n}-{guests}"))
}

/// A raw identifier is a key field by the name serde gives it, and a key error names each
/// field as the arguments spell it.
#[tokio::test]
async fn a_raw_identifier_is_a_key_field_and_key_errors_name_the_json_field() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(BookRoom)
        .tool(NoticeZone)
        .build()
        .unwrap();
    assert_eq!(
        tb.definition("book_room").unwrap().key_arguments(),
        ["type", "night"]
    );
    let booked = json!({"type": "double", "night": "2026-12-24", "guests": 2});
    let first = tb.call("book_room", booked.clone(), &ctx()).await.unwrap();
    let again = tb
        .call(
            "book_room",
            json!({"type": " double ", "night": "2026-12-24", "guests": 2}),
            &ctx(),
        )
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(first.value, again.value);
    let err = tb
        .call(
            "book_room",
            json!({"type": "double", "night": "2026-12-24", "guests": 3}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    let by_key = tb
        .call(
            "book_room_status",
            json!({"type": "double", "night": "2026-12-24"}),
            &ctx(),
        )
        .await
        .unwrap()
        .value;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert_eq!(out.count("room:"), 1);

    let err = tb
        .call(
            "notice_zone",
            json!({"order": "o-1", "zone": "e\u{0}u"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(err.message().contains("`zone`"), "{err:?}");
    assert!(!err.message().contains("`region`"), "{err:?}");
    assert_eq!(out.count("notice:"), 0);
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

/// Applies a configuration patch to a service: the patch is any JSON.
#[tool(idempotent(key = "patch:<service>", status = false))]
async fn apply_patch(
    out: State<Outside>,
    service: String,
    patch: Value,
) -> Result<usize, ToolError> {
    let _ = patch;
    Ok(out.act(format!("patch:{service}")))
}

#[tokio::test]
async fn a_number_is_one_value_however_large_and_however_spelled() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ApplyPatch)
        .build()
        .unwrap();
    // The same value spelled as an integer and as a float, within 2^53 and past it.
    for (service, integer, float) in [
        ("s1", json!(100), json!(1e2)),
        ("s2", json!(10_000_000_000_000_000u64), json!(1e16)),
        (
            "s3",
            json!(9_223_372_036_854_775_808u64),
            json!(2f64.powi(63)),
        ),
    ] {
        let first = tb
            .call(
                "apply_patch",
                json!({"service": service, "patch": {"n": integer}}),
                &ctx(),
            )
            .await
            .unwrap();
        let again = tb
            .call(
                "apply_patch",
                json!({"service": service, "patch": {"n": float}}),
                &ctx(),
            )
            .await
            .unwrap();
        assert!(again.replayed, "{service}");
        assert_eq!(again.value, first.value);
    }
    // Values a float cannot tell apart are still two values when sent as integers.
    tb.call(
        "apply_patch",
        json!({"service": "s4", "patch": {"n": 9_007_199_254_740_993u64}}),
        &ctx(),
    )
    .await
    .unwrap();
    let other = tb
        .call(
            "apply_patch",
            json!({"service": "s4", "patch": {"n": 9_007_199_254_740_992u64}}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(other.is(ErrorCode::Conflict), "{other:?}");
    assert_eq!(out.count("patch:"), 4);
}

// ---------------------------------------------------------------------------------------------
// 3. Different argument tuples never share a key.

/// Pairs two values around a letter of literal text.
#[tool(idempotent(key = "pair:<a>x<b>", status = false))]
async fn pair(out: State<Outside>, a: String, b: String) -> Result<String, ToolError> {
    out.act(format!("pair:{a}|{b}"));
    Ok(format!("{a}|{b}"))
}

#[tokio::test]
async fn a_value_cannot_forge_literal_text_even_a_letter() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let one = tb
        .call("pair", json!({"a": "1x2", "b": "3"}), &ctx())
        .await
        .unwrap();
    let two = tb
        .call("pair", json!({"a": "1", "b": "2x3"}), &ctx())
        .await
        .unwrap();
    assert_eq!(one.value, json!("1x2|3"));
    assert_eq!(two.value, json!("1|2x3"));
    assert!(!two.replayed);
    assert_eq!(out.count("pair:"), 2);
}

// ---------------------------------------------------------------------------------------------
// 4. Identifiers keep their case unless the author says otherwise.

/// Refunds a charge.
#[tool(idempotent(key = "refund:<charge_id>", status = "refund_status"))]
async fn refund(out: State<Outside>, charge_id: String, cents: i64) -> Result<String, ToolError> {
    Ok(format!(
        "re-{}-{charge_id}-{cents}",
        out.act(format!("refund:{charge_id}"))
    ))
}

#[tokio::test]
async fn charge_ids_differing_only_in_case_are_two_refunds() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let a = tb
        .call(
            "refund",
            json!({"charge_id": "ch_3MtwBw", "cents": 100}),
            &ctx(),
        )
        .await
        .unwrap();
    let b = tb
        .call(
            "refund",
            json!({"charge_id": "ch_3mtwbw", "cents": 100}),
            &ctx(),
        )
        .await
        .unwrap();
    assert!(!b.replayed);
    assert_ne!(a.value, b.value);
    // Surrounding white space is still not a new charge.
    let c = tb
        .call(
            "refund",
            json!({"charge_id": " ch_3MtwBw ", "cents": 100}),
            &ctx(),
        )
        .await
        .unwrap();
    assert!(c.replayed);
    assert_eq!(out.count("refund:"), 2);
}

// ---------------------------------------------------------------------------------------------
// 5. An effect that happened is never recorded as failed.

/// A layout whose map is keyed by pairs: the type does not show it, so only running finds out.
#[derive(Serialize, schemars::JsonSchema)]
struct SeatLayout {
    seats: HashMap<Seat, String>,
}

#[derive(Serialize, schemars::JsonSchema, PartialEq, Eq, Hash)]
struct Seat {
    row: u32,
    letter: char,
}

/// Assigns seats on a flight and returns the layout.
#[tool(idempotent(key = "layout:<flight>", status = "layout_status"))]
async fn layout(out: State<Outside>, flight: u32) -> Result<SeatLayout, ToolError> {
    out.act(format!("layout:{flight}"));
    let mut seats = HashMap::new();
    seats.insert(
        Seat {
            row: 1,
            letter: 'A',
        },
        "taken".to_string(),
    );
    Ok(SeatLayout { seats })
}

#[tokio::test]
async fn a_result_that_cannot_be_recorded_is_unknown_not_failed() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let err = tb
        .call("layout", json!({"flight": 7}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(err.message().contains("acted"), "{err}");
    assert!(!err.is_retryable());
    let status = tb
        .call("layout_status", json!({"flight": 7}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown");
    let again = tb
        .call("layout", json!({"flight": 7}), &ctx())
        .await
        .unwrap_err();
    assert!(again.is(ErrorCode::OutcomeUnknown));
    assert_eq!(out.count("layout:"), 1, "the retry did not act again");
}

// ---------------------------------------------------------------------------------------------
// 6. An unknown step has a way out, and "retryable" is only said when a retry can succeed.

/// Ships an order in one step whose first reply is lost; the recover hook looks the shipment up.
#[tool(idempotent(key = "ship:<order>", status = false, recover = find_shipment))]
async fn ship(out: State<Outside>, ctx: &ToolContext, order: String) -> Result<String, ToolError> {
    ship_once(&out, ctx, &order).await
}

async fn ship_once(out: &Outside, ctx: &ToolContext, order: &str) -> Result<String, ToolError> {
    ctx.once("label", async {
        if out.ship_reply_lost_once.swap(false, Ordering::SeqCst) {
            // The request never reached the carrier, but the client cannot tell.
            return Err(ToolError::outcome_unknown("the carrier did not answer"));
        }
        Ok::<_, ToolError>(format!(
            "label-{}-{order}",
            out.act(format!("ship:{order}"))
        ))
    })
    .await
}

/// Looks for a shipment of the order at the carrier.
async fn find_shipment(
    out: State<Outside>,
    _ctx: &ToolContext,
    order: String,
) -> Result<Option<String>, ToolError> {
    out.act("lookup");
    Ok(out
        .effects
        .lock()
        .unwrap()
        .iter()
        .position(|e| *e == format!("ship:{order}"))
        .map(|i| format!("label-{}-{order}", i + 1)))
}

/// The same shipping tool, without a recover hook.
#[tool(idempotent(key = "ship-plain:<order>", status = false))]
async fn ship_no_hook(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    ship_once(&out, ctx, &order).await
}

#[tokio::test]
async fn an_unknown_step_is_run_again_once_the_recover_hook_finds_nothing() {
    let out = Arc::new(Outside::default());
    out.ship_reply_lost_once.store(true, Ordering::SeqCst);
    let tb = toolbox(&out);
    let err = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown));
    assert!(err.is_retryable(), "the retry looks before it acts");
    // The retry the answer invites succeeds: the hook finds nothing, the step runs again.
    let out2 = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out2.value, json!("label-2-o-3"));
    let again = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(out.count("ship:"), 1);
    assert_eq!(out.count("lookup"), 1);
}

#[tokio::test]
async fn without_a_hook_an_unknown_step_is_never_called_retryable() {
    let out = Arc::new(Outside::default());
    out.ship_reply_lost_once.store(true, Ordering::SeqCst);
    let tb = toolbox(&out);
    for _ in 0..3 {
        let err = tb
            .call("ship_no_hook", json!({"order": "o-4"}), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown));
        assert!(!err.is_retryable(), "nothing a retry does can change it");
    }
    assert_eq!(out.count("ship:"), 0);
}

// ---------------------------------------------------------------------------------------------
// 7. Equal arguments have equal fingerprints, whatever their representation.

/// Tags a document with a set of labels and per-label weights.
#[tool(idempotent(key = "tag:<doc>", status = false))]
async fn tag(
    out: State<Outside>,
    doc: String,
    labels: HashSet<String>,
    weights: HashMap<u32, HashSet<i64>>,
) -> Result<usize, ToolError> {
    let _ = (labels, weights);
    Ok(out.act(format!("tag:{doc}")))
}

#[tokio::test]
async fn the_same_set_retried_is_a_replay_in_any_order() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let labels: Vec<String> = (0..40).map(|i| format!("label-{i}")).collect();
    let args = json!({"doc": "d-1", "labels": labels, "weights": {"1": [3, 1, 2], "7": []}});
    tb.call("tag", args.clone(), &ctx()).await.unwrap();
    for _ in 0..20 {
        let again = tb.call("tag", args.clone(), &ctx()).await.unwrap();
        assert!(again.replayed);
    }
    let mut reversed = labels.clone();
    reversed.reverse();
    let reordered = json!({"doc": "d-1", "labels": reversed, "weights": {"7": [], "1": [2, 3, 1]}});
    assert!(tb.call("tag", reordered, &ctx()).await.unwrap().replayed);
    let other = json!({"doc": "d-1", "labels": ["label-0"], "weights": {}});
    let err = tb.call("tag", other, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict));
    assert_eq!(out.count("tag:"), 1);
}

/// Whom an announcement goes to: everyone, a set of groups, or people in the order given. serde
/// reads an array of names as the first branch that takes it: the set.
#[derive(Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Audience {
    Everyone(bool),
    Groups(HashSet<String>),
    Ordered(Vec<String>),
}

/// The same branches the other way round: an array of names is read as the list.
#[derive(Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Queue {
    Ordered(Vec<String>),
    Groups(HashSet<String>),
}

/// Announces a topic to an audience.
#[tool(idempotent(key = "announce:<topic>"))]
async fn announce(
    out: State<Outside>,
    topic: String,
    audience: Audience,
) -> Result<usize, ToolError> {
    let _ = audience;
    Ok(out.act(format!("announce:{topic}")))
}

/// Calls people in turn, in the order given.
#[tool(idempotent(key = "call-round:<topic>", status = false))]
async fn call_round(out: State<Outside>, topic: String, queue: Queue) -> Result<usize, ToolError> {
    let _ = queue;
    Ok(out.act(format!("call-round:{topic}")))
}

#[tokio::test]
async fn a_set_beside_a_list_in_an_untagged_enum_is_the_branch_serde_reads() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(Announce)
        .tool(CallRound)
        .build()
        .unwrap();
    // Enough names that a hash set's order is never the order given by luck.
    let names: Vec<String> = (0..12).map(|i| format!("g{i}")).collect();
    let mut reversed = names.clone();
    reversed.reverse();
    // Read as a set: sent again, in any order, it is the same action.
    let args = json!({"topic": "t", "audience": names});
    tb.call("announce", args.clone(), &ctx()).await.unwrap();
    for _ in 0..10 {
        assert!(
            tb.call("announce", args.clone(), &ctx())
                .await
                .unwrap()
                .replayed
        );
        let status = tb
            .call("announce_status", args.clone(), &ctx())
            .await
            .unwrap();
        assert_eq!(status.value["status"], "completed", "{}", status.value);
    }
    let reordered = json!({"topic": "t", "audience": reversed});
    assert!(
        tb.call("announce", reordered, &ctx())
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(out.count("announce:"), 1);

    // Read as a list: the same order is the same action, another order another one.
    let args = json!({"topic": "t", "queue": names});
    tb.call("call_round", args.clone(), &ctx()).await.unwrap();
    for _ in 0..10 {
        assert!(
            tb.call("call_round", args.clone(), &ctx())
                .await
                .unwrap()
                .replayed
        );
    }
    let reordered = json!({"topic": "t", "queue": reversed});
    let err = tb.call("call_round", reordered, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!(out.count("call-round:"), 1);
}

/// Voids an invoice: same template as `bill`, another action.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = false))]
async fn void(out: State<Outside>, customer: String, period: String) -> Result<String, ToolError> {
    out.act("void");
    Ok(format!("void-{customer}-{period}"))
}

#[tokio::test]
async fn two_tools_sharing_a_template_conflict_instead_of_replaying_each_other() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let args = json!({"customer": "acme", "period": "2026-10"});
    tb.call("bill", args.clone(), &ctx()).await.unwrap();
    let err = tb.call("void", args, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!((out.count("email:"), out.count("void")), (1, 0));
}

#[test]
fn fingerprints_ignore_set_order_through_prepare() {
    let ctx = ctx();
    let fp = |args: Value| *Tag.prepare(&args, &ctx).unwrap().fingerprint().unwrap();
    // Enough items that a HashSet's iteration order is never its insertion order by luck.
    let labels: Vec<String> = (0..40).map(|i| format!("l{i}")).collect();
    let mut reversed = labels.clone();
    reversed.reverse();
    let a = fp(json!({"doc": "d", "labels": labels, "weights": {"2": [1, 2]}}));
    let b = fp(json!({"doc": "d", "labels": reversed, "weights": {"2": [2, 1]}}));
    for _ in 0..10 {
        assert_eq!(
            fp(json!({"doc": "d", "labels": labels, "weights": {"2": [1, 2]}})),
            a
        );
    }
    let c = fp(json!({"doc": "d", "labels": ["l0", "l1"], "weights": {"2": [1, 2]}}));
    assert_eq!(a, b);
    assert_ne!(a, c);
    let _: Fingerprint = a;
}

// ---------------------------------------------------------------------------------------------
// 9. Bad key values never reach a store.

#[tokio::test]
async fn control_characters_in_key_values_are_invalid_arguments_before_any_store() {
    let out = Arc::new(Outside::default());
    // A fault store with no faults: it counts every operation that reaches the store.
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), Plan::script([])));
    let tb = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(out.clone())
        .tool(Refund)
        .build()
        .unwrap();
    for bad in ["ch_\u{0}1", "ch_\u{1b}[2J", "ch\u{7f}"] {
        for name in ["refund", "refund_status"] {
            let err = tb
                .call(name, json!({"charge_id": bad, "cents": 1}), &ctx())
                .await
                .unwrap_err();
            assert!(err.is(ErrorCode::InvalidArguments), "{name}: {err:?}");
            assert!(!err.is_retryable(), "the same value is refused again");
            assert!(!err.to_json().to_string().contains(bad));
        }
    }
    assert_eq!(store.all_calls(), 0, "no store saw them");
    assert_eq!(out.count("refund:"), 0);
}

// ---------------------------------------------------------------------------------------------
// 10. A step's panic names the step and the key's hash, never its values.

/// Sends a customer's statement; its email step panics.
#[tool(idempotent(key = "statement:<email>", status = false))]
async fn statement(ctx: &ToolContext, email: String) -> Result<(), ToolError> {
    ctx.once("send", async {
        if !email.is_empty() {
            panic!("smtp refused");
        }
        Ok::<_, ToolError>(())
    })
    .await
}

#[tokio::test]
async fn a_panicking_step_names_itself_and_a_hash_not_the_key() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let err = tb
        .call(
            "statement",
            json!({"email": "jane.doe@example.com"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    let text = err.to_json().to_string();
    assert!(err.is(ErrorCode::OutcomeUnknown));
    assert!(text.contains("step `send`"), "{text}");
    assert!(text.contains("key hash"), "{text}");
    assert!(!text.contains("jane"), "{text}");
    assert!(!text.contains("example.com"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// 11. The timeout's suggestion can be followed literally.

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
// 12. A status answer is the record of the call its arguments describe, or says it is not.

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

// ---------------------------------------------------------------------------------------------
// 13. Two templates that could build one key do not share a toolbox.

/// Cancels a whole order.
#[tool(idempotent(key = "order:<id>", status = false))]
async fn cancel_order(out: State<Outside>, id: String) -> Result<String, ToolError> {
    Ok(format!("co-{}", out.act(format!("cancel-order:{id}"))))
}

/// Cancels one line of an order, under the order's namespace.
#[tool(idempotent(key = "order:<id>:line:<line>", status = false))]
async fn cancel_line(out: State<Outside>, id: String, line: u32) -> Result<String, ToolError> {
    Ok(format!(
        "cl-{}",
        out.act(format!("cancel-line:{id}:{line}"))
    ))
}

/// Cancels one line of an order, under a namespace of its own.
#[tool(idempotent(key = "order-line:<id>:<line>", status = false))]
async fn cancel_order_line(
    out: State<Outside>,
    id: String,
    line: u32,
) -> Result<String, ToolError> {
    Ok(format!(
        "cl-{}",
        out.act(format!("cancel-line:{id}:{line}"))
    ))
}

#[tokio::test]
async fn templates_that_can_build_one_key_are_refused_at_build() {
    // `order:<id>` builds `order:o-1:line:2` for the id `o-1:line:2`, as the line's template
    // does for `o-1` and 2: the line's cancel would be refused as the order's CONFLICT.
    let out = Arc::new(Outside::default());
    let err = Toolbox::builder()
        .shared_state(out.clone())
        .tool(CancelOrder)
        .tool(CancelLine)
        .build()
        .err()
        .expect("the toolbox was built");
    assert_eq!(
        err,
        toolkey::BuildError::KeysMayCollide {
            first: "cancel_order".into(),
            first_template: "order:<id>".into(),
            second: "cancel_line".into(),
            second_template: "order:<id>:line:<line>".into(),
            renamed: "cancel_line:<id>:line:<line>".into(),
        }
    );
    let text = err.to_string();
    assert!(text.contains("namespace of its own"), "{text}");
    // With a namespace of its own, each call is its own action.
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(CancelOrder)
        .tool(CancelOrderLine)
        .build()
        .unwrap();
    tb.call("cancel_order", json!({"id": "o-1:line:2"}), &ctx())
        .await
        .unwrap();
    let line = tb
        .call("cancel_order_line", json!({"id": "o-1", "line": 2}), &ctx())
        .await
        .unwrap();
    assert!(!line.replayed);
    assert_eq!(
        (out.count("cancel-order:"), out.count("cancel-line:")),
        (1, 1)
    );
}

// ---------------------------------------------------------------------------------------------
// 14. A flattened enum or map is part of the arguments: called, checked and fingerprinted.

/// Where a refund goes: `method` names the branch, its fields sit beside it.
#[derive(serde::Deserialize, Serialize, schemars::JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum RefundTarget {
    Card {
        last4: String,
    },
    Bank {
        /// Read also as `account`, which no schema shows.
        #[serde(alias = "account")]
        iban: String,
    },
}

/// Refunds an order to a card or a bank account.
#[tool(idempotent(key = "payback:<order>", status = "pay_back_status"))]
async fn pay_back(
    out: State<Outside>,
    order: String,
    cents: i64,
    #[serde(flatten)] to: RefundTarget,
) -> Result<String, ToolError> {
    let to = match to {
        RefundTarget::Card { last4 } => format!("card-{last4}"),
        RefundTarget::Bank { iban } => format!("bank-{iban}"),
    };
    Ok(format!(
        "pb-{}",
        out.act(format!("payback:{order}:{cents}:{to}"))
    ))
}

async fn refused(tb: &Toolbox, tool: &str, args: Value) -> ToolError {
    tb.call(tool, args.clone(), &ctx())
        .await
        .expect_err(&format!("`{tool}` takes {args}"))
}

/// A toolbox with `pay_back`, and the outside system it pays back on.
fn pay_back_toolbox() -> (Arc<Outside>, Toolbox) {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(PayBack)
        .build()
        .unwrap();
    (out, tb)
}

/// Before, a flattened enum's tag was refused as an unknown field and the tool could not be
/// called at all. Now each branch's fields are taken, a name no branch takes is refused, and so
/// is a mix of two branches' fields, which serde alone would drop in silence.
#[tokio::test]
async fn a_flattened_enum_is_taken_branch_by_branch_and_a_mix_is_refused() {
    let (out, tb) = pay_back_toolbox();
    let card = json!({"order": "o-1", "cents": 500, "method": "card", "last4": "4242"});
    let first = tb.call("pay_back", card.clone(), &ctx()).await.unwrap();
    let again = tb.call("pay_back", card.clone(), &ctx()).await.unwrap();
    assert_eq!(first.value, again.value);
    assert!(again.replayed);
    // The other branch under the same key is another action.
    let bank = json!({"order": "o-1", "cents": 500, "method": "bank", "iban": "DE02"});
    let err = refused(&tb, "pay_back", bank.clone()).await;
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    // A name no branch takes, a mix of branches, a field of the branch not named by `method`.
    let unknown = json!({"order": "o-2", "cents": 5, "method": "card", "last4": "1", "bogus": 1});
    let err = refused(&tb, "pay_back", unknown).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(err.message().contains("unknown field `bogus`"), "{err:?}");
    let mixed = json!({"order": "o-2", "cents": 5, "method": "card", "last4": "1", "iban": "DE02"});
    let err = refused(&tb, "pay_back", mixed).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        err.message().contains("field `iban` does not go with"),
        "{err:?}"
    );
    let other = json!({"order": "o-2", "cents": 5, "method": "bank", "last4": "1"});
    let err = refused(&tb, "pay_back", other).await;
    assert!(
        err.message().contains("field `last4` does not go with")
            && err.message().contains("`iban`, `method`"),
        "{err:?}"
    );
    // A tag no branch has: the suggestion names no value as if it were a field.
    let wire = json!({"order": "o-2", "cents": 5, "method": "wire", "iban": "DE02"});
    let err = refused(&tb, "pay_back", wire).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        !err.suggestion().unwrap_or_default().contains("`wire`"),
        "{err:?}"
    );
    // Found by fuzzing: serde takes a variant's index for its tag, so `1` (or `1.0`) paid
    // back to a bank account, which the schema does not offer.
    for method in [json!(1), json!(1.0)] {
        let args = json!({"order": "o-4", "cents": 9, "method": method, "iban": "DE02"});
        let err = refused(&tb, "pay_back", args).await;
        assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
        assert!(err.message().contains("field `method` holds 1"), "{err:?}");
        assert!(err.suggestion().unwrap().contains("`method`"), "{err:?}");
    }
    // An alias inside a branch is not seen: refused by name, not dropped.
    let by_alias = json!({"order": "o-3", "cents": 7, "method": "bank", "account": "DE02"});
    let err = refused(&tb, "pay_back", by_alias).await;
    assert!(err.message().contains("unknown field `account`"), "{err:?}");
    assert_eq!(out.count("payback:"), 1);
    assert_eq!(out.count("payback:o-1:500:card-4242"), 1);
}

#[tokio::test]
async fn a_status_call_reads_a_flattened_enums_fields_as_the_target_does() {
    let (out, tb) = pay_back_toolbox();
    let card = json!({"order": "o-1", "cents": 500, "method": "card", "last4": "4242"});
    let paid = tb.call("pay_back", card.clone(), &ctx()).await.unwrap();
    let status = |args: Value| {
        let tb = tb.clone();
        async move { tb.call("pay_back_status", args, &ctx()).await }
    };
    let same = status(card).await.unwrap().value;
    assert_eq!(same["status"], "completed", "{same}");
    assert_eq!(same["result"], paid.value);
    assert!(same.get("note").is_none(), "{same}");
    let bank = json!({"order": "o-1", "cents": 500, "method": "bank", "iban": "DE02"});
    let other = status(bank).await.unwrap().value;
    assert_eq!(other["status"], "conflict", "{other}");
    let by_key = status(json!({"order": "o-1"})).await.unwrap().value;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert!(
        by_key["note"].as_str().unwrap().contains("only the key"),
        "{by_key}"
    );
    let partial = json!({"order": "o-1", "cents": 500, "method": "card"});
    let partial = status(partial).await.unwrap().value;
    assert_eq!(partial["status"], "completed", "{partial}");
    assert!(
        partial["note"]
            .as_str()
            .unwrap()
            .contains("missing field `last4`"),
        "{partial}"
    );
    // Found by fuzzing: fields of both branches, each taken by the companion's schema, were
    // refused. They are no whole call, as a call missing a field is none: answered by key.
    let both = json!({"order": "o-1", "method": "card", "last4": "4242", "iban": "DE02"});
    let both = status(both).await.unwrap().value;
    assert_eq!(both["status"], "completed", "{both}");
    let note = both["note"].as_str().unwrap();
    assert!(note.contains("not a whole `pay_back` call"), "{both}");
    assert!(note.contains("does not go with"), "{both}");
    let err = status(json!({"order": "o-1", "bogus": 1}))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(err.message().contains("unknown field `bogus`"), "{err:?}");
    // The companion's schema is one object: every branch's field, each optional, and closed.
    let schema = tb
        .definition("pay_back_status")
        .unwrap()
        .input_schema()
        .clone();
    assert!(
        schema.get("oneOf").is_none() && schema.get("anyOf").is_none(),
        "{schema:#}"
    );
    assert_eq!(schema["additionalProperties"], false, "{schema:#}");
    assert_eq!(schema["required"], json!(["order"]), "{schema:#}");
    for name in ["cents", "method", "last4", "iban"] {
        assert!(
            schema["properties"].get(name).is_some(),
            "{name}: {schema:#}"
        );
    }
    assert_eq!(out.count("payback:"), 1);
}

/// Labels an order: every field beside `order` is a label.
#[tool(idempotent(key = "label:<order>", status = "label_status"))]
async fn label(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] labels: std::collections::BTreeMap<String, String>,
) -> Result<String, ToolError> {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(format!(
        "l-{}",
        out.act(format!("label:{order}:{}", labels.join(",")))
    ))
}

/// Before, a flattened map's keys were refused as unknown fields. Now they are the map's, part
/// of the fingerprint, and the status companion does not take the key alone for a call with no
/// labels.
#[tokio::test]
async fn a_flattened_maps_fields_are_its_entries_and_tell_calls_apart() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(Label)
        .build()
        .unwrap();
    let gift = json!({"order": "o-1", "gift": "yes", "wrap": "blue"});
    let first = tb.call("label", gift, &ctx()).await.unwrap();
    assert_eq!(first.value, "l-1");
    let reordered = json!({"wrap": "blue", "order": "o-1", "gift": "yes"});
    assert!(tb.call("label", reordered, &ctx()).await.unwrap().replayed);
    let red = json!({"order": "o-1", "gift": "yes", "wrap": "red"});
    let err = refused(&tb, "label", red.clone()).await;
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    let err = refused(&tb, "label", json!({"order": "o-2", "gift": 5})).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        !err.suggestion().unwrap_or_default().contains("`5`"),
        "{err:?}"
    );

    let status = |args: Value| {
        let tb = tb.clone();
        async move { tb.call("label_status", args, &ctx()).await.unwrap().value }
    };
    let by_key = status(json!({"order": "o-1"})).await;
    assert_eq!(by_key["status"], "completed", "{by_key}");
    assert!(
        by_key["note"].as_str().unwrap().contains("only the key"),
        "{by_key}"
    );
    let same = status(json!({"order": "o-1", "gift": "yes", "wrap": "blue"})).await;
    assert_eq!(same["status"], "completed", "{same}");
    assert!(same.get("note").is_none(), "{same}");
    assert_eq!(status(red).await["status"], "conflict");
    assert_eq!(out.count("label:"), 1);
}

/// How a parcel is handed over: picked up, or delivered to an address.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Handover {
    Pickup,
    Deliver { address: String },
}

/// A cut of a sheet: serde reads an untagged enum's first branch that parses.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Size {
    Square { w: u32 },
    Rect { w: u32, h: u32 },
}

#[tool(idempotent(key = "handover:<order>"))]
async fn hand_over(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] how: Handover,
) -> Result<String, ToolError> {
    Ok(format!(
        "h-{}",
        out.act(format!("handover:{order}:{how:?}"))
    ))
}

#[tool(idempotent(key = "cut:<order>"))]
async fn cut(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] size: Size,
) -> Result<String, ToolError> {
    Ok(format!("c-{}", out.act(format!("cut:{order}:{size:?}"))))
}

/// Found in review: the names were checked against any branch, so a tag naming one branch
/// beside another branch's field ran as the tag's branch, the field dropped in silence.
#[tokio::test]
async fn the_branch_serde_reads_must_take_every_field_given() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(HandOver)
        .build()
        .unwrap();
    let pickup = json!({"order": "o-1", "kind": "pickup", "address": "Main St 1"});
    let err = refused(&tb, "hand_over", pickup).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        err.message().contains("field `address` does not go with"),
        "{err:?}"
    );
    let deliver = json!({"order": "o-1", "kind": "deliver", "address": "Main St 1"});
    tb.call("hand_over", deliver, &ctx()).await.unwrap();
    let pickup = json!({"order": "o-2", "kind": "pickup"});
    tb.call("hand_over", pickup, &ctx()).await.unwrap();
    assert_eq!(out.count("handover:o-1:Deliver"), 1);
    assert_eq!(out.count("handover:o-2:Pickup"), 1);
    assert_eq!(out.count("handover:"), 2);
}

/// A quantity: serde reads an untagged enum's first branch that parses, types included.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Quantity {
    Count { n: u32, unit: String },
    Measure { n: f64 },
}

#[tool(idempotent(key = "weigh:<order>"))]
async fn weigh(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] quantity: Quantity,
) -> Result<String, ToolError> {
    Ok(format!(
        "w-{}",
        out.act(format!("weigh:{order}:{quantity:?}"))
    ))
}

/// Found in review: serde reads an untagged enum's first branch that *parses*. `{"n": 2.0,
/// "unit": "kg"}`, a count of 2 kg by the schema (JSON Schema's integers take `2.0`), ran as a
/// measure of 2, the unit dropped in silence; `{"w": 3, "h": 5}` would have been refused, though
/// the schema offers it. The names given cannot tell which branch serde reads: such a toolbox
/// does not build, and says to give the enum a tag. A flattened `Option`'s branch (`{}`) and an
/// externally tagged enum (one field of its own per branch) are no untagged enums.
#[test]
fn a_flattened_untagged_enum_does_not_build() {
    for (tool, fields) in [
        (Toolbox::builder().tool(Weigh), vec!["n", "unit"]),
        (Toolbox::builder().tool(Cut), vec!["w", "h"]),
    ] {
        let err = tool.state(Outside::default()).build().err().unwrap();
        let toolkey::BuildError::UntaggedFlattenedEnum { fields: found, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(found, &fields, "{err}");
        assert!(err.to_string().contains("give the enum a tag"), "{err}");
    }
    Toolbox::builder()
        .state(Outside::default())
        .tool(HandOver)
        .tool(PayOutMaybe)
        .build()
        .expect("tagged enums and an option inside a flattened struct build");
}

/// A payee whose bank branch has a field named like a parameter of `wire`.
#[derive(Debug, serde::Deserialize, Serialize, schemars::JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum Payee {
    Card {
        last4: String,
    },
    Bank {
        iban: String,
        holder: Option<String>,
    },
}

/// Wires money: `holder` is both its own parameter and a field of the bank branch.
#[tool(idempotent(key = "wire:<order>"))]
async fn wire(
    out: State<Outside>,
    order: String,
    holder: String,
    #[serde(flatten)] to: Payee,
) -> Result<String, ToolError> {
    let to = match to {
        Payee::Card { last4 } => format!("card-{last4}"),
        Payee::Bank { iban, holder } => format!("bank-{iban}-{holder:?}"),
    };
    Ok(format!("w-{}", out.act(format!("{order}:{holder}:{to}"))))
}

/// Picks a payee: its parameter `how` is read also as `method`, the enum's tag.
#[tool(idempotent(key = "pick:<order>"))]
async fn pick_payee(
    out: State<Outside>,
    order: String,
    #[serde(alias = "method")] how: String,
    #[serde(flatten)] to: Payee,
) -> Result<String, ToolError> {
    let _ = to;
    Ok(format!("p-{}", out.act(format!("{order}:{how}"))))
}

/// serde gives a field a parameter and a flattened enum's branch both name to the parameter:
/// the branch's `holder` would be `None` on every call, lost in silence, and a tag taken by an
/// alias would leave every call without its branch. Neither toolbox builds.
#[test]
fn a_flattened_field_named_like_a_parameter_does_not_build() {
    let err = Toolbox::builder()
        .state(Outside::default())
        .tool(Wire)
        .build()
        .err()
        .expect("`wire` does not build");
    assert_eq!(
        err,
        toolkey::BuildError::ShadowedField {
            tool: "wire".into(),
            field: "holder".into(),
            parameter: "holder".into()
        }
    );
    assert!(err.to_string().contains("rename one of them"), "{err}");
    let err = Toolbox::builder()
        .state(Outside::default())
        .tool(PickPayee)
        .build()
        .err()
        .expect("`pick_payee` does not build");
    assert_eq!(
        err,
        toolkey::BuildError::ShadowedField {
            tool: "pick_payee".into(),
            field: "method".into(),
            parameter: "how".into()
        }
    );
}

/// A flattened `Option` out of the macro's sight: behind a type alias.
type MaybePayee = Option<Payee>;

/// Refunds an order, to a payee if one is given.
#[tool(idempotent(key = "maybe:<order>"))]
async fn refund_maybe(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] to: MaybePayee,
) -> Result<String, ToolError> {
    let to = match to {
        Some(Payee::Card { last4 }) => format!("card-{last4}"),
        Some(Payee::Bank { iban, .. }) => format!("bank-{iban}"),
        None => "none".to_string(),
    };
    Ok(format!("m-{}", out.act(format!("{order}:{to}"))))
}

/// A flattened `Option` out of the macro's sight: inside a flattened struct.
#[derive(serde::Deserialize, Serialize, schemars::JsonSchema)]
struct Payout {
    currency: String,
    #[serde(flatten)]
    to: Option<Payee>,
}

/// Pays out an order, to a payee if one is given.
#[tool(idempotent(key = "payout:<order>"))]
async fn pay_out_maybe(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] payout: Payout,
) -> Result<String, ToolError> {
    let to = match payout.to {
        Some(Payee::Card { last4 }) => format!("card-{last4}"),
        Some(Payee::Bank { iban, .. }) => format!("bank-{iban}"),
        None => "none".to_string(),
    };
    Ok(format!(
        "p-{}",
        out.act(format!("{order}:{}:{to}", payout.currency))
    ))
}

/// serde reads a flattened `Option` whose fields do not parse as `None`: before, a card without
/// its digits ran as a payout to no payee at all, the fields given dropped in silence. Inside a
/// flattened struct, out of the macro's sight, a branch whose fields are given must be given
/// whole; no payee at all is still `None`.
#[tokio::test]
async fn fields_of_a_flattened_option_are_read_whole_or_refused() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(PayOutMaybe)
        .build()
        .unwrap();
    for (args, missing) in [
        (json!({"method": "card"}), "last4"),
        (json!({"last4": "4242"}), "method"),
        (json!({"method": "bank", "holder": "Ada"}), "iban"),
    ] {
        let mut args = args;
        args["order"] = json!("o-1");
        args["currency"] = json!("EUR");
        let err = refused(&tb, "pay_out_maybe", args).await;
        assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
        assert!(
            err.message()
                .contains(&format!("missing field `{missing}`")),
            "{err:?}"
        );
    }
    assert!(out.effects.lock().unwrap().is_empty());
    let card = json!({"order": "o-1", "currency": "EUR", "method": "card", "last4": "4242"});
    tb.call("pay_out_maybe", card, &ctx()).await.unwrap();
    let none = json!({"order": "o-2", "currency": "EUR"});
    tb.call("pay_out_maybe", none, &ctx()).await.unwrap();
    assert_eq!(
        *out.effects.lock().unwrap(),
        ["o-1:EUR:card-4242", "o-2:EUR:none"]
    );
}

/// An address: every field required.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Street {
    street: String,
    city: String,
}

/// A flattened `Option` of a struct, behind a type alias.
type MaybeStreet = Option<Street>;

#[tool(idempotent(key = "deliver-maybe:<order>"))]
async fn deliver_maybe(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] to: MaybeStreet,
) -> Result<String, ToolError> {
    Ok(format!("d-{}", out.act(format!("{order}:{to:?}"))))
}

/// Found in review: the macro refuses a flattened `Option`, but not one behind a type alias;
/// `{"street": "Main St 1"}` without `city` ran with no address at all, `street` dropped in
/// silence. The parameter's own schema takes `null`: such a toolbox does not build.
#[test]
fn a_flattened_option_behind_an_alias_does_not_build() {
    for (builder, tool) in [
        (Toolbox::builder().tool(RefundMaybe), "refund_maybe"),
        (Toolbox::builder().tool(DeliverMaybe), "deliver_maybe"),
    ] {
        let err = builder.state(Outside::default()).build().err().unwrap();
        assert_eq!(
            err,
            toolkey::BuildError::FlattenedOption {
                tool: tool.into(),
                parameter: "to".into()
            }
        );
        assert!(err.to_string().contains("take it unflattened"), "{err}");
    }
}

/// How a charge is paid: a card, or any other provider with fields of its own.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum Channel {
    Card {
        last4: String,
    },
    Other {
        #[serde(flatten)]
        fields: std::collections::BTreeMap<String, String>,
    },
}

#[tool(idempotent(key = "channel:<order>", status = "charge_via_status"))]
async fn charge_via(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] via: Channel,
) -> Result<String, ToolError> {
    Ok(format!("cv-{}", out.act(format!("{order}:{via:?}"))))
}

/// Found in review: a variant that takes any other field (a flattened map inside it) ran
/// `{"method": "other", "provider": "klarna"}`, but the lifted exports were closed, so a model
/// following them could not send `provider`, and the status companion refused the call's own
/// arguments. The one object now takes other fields as the variant does.
#[tokio::test]
async fn a_branch_open_to_any_field_is_offered_and_asked_about() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ChargeVia)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "method": "other", "provider": "klarna"});
    tb.call("charge_via", args.clone(), &ctx()).await.unwrap();
    let def = tb.definition("charge_via").unwrap();
    for (what, schema) in [
        ("openai", def.to_openai()["function"]["parameters"].clone()),
        ("responses", def.to_openai_responses()["parameters"].clone()),
        ("anthropic", def.to_anthropic()["input_schema"].clone()),
    ] {
        assert_eq!(
            schema["additionalProperties"],
            json!({"type": "string"}),
            "{what}: {schema:#}"
        );
    }
    assert_eq!(def.to_openai()["function"]["strict"], false);
    let status = tb.call("charge_via_status", args, &ctx()).await.unwrap();
    assert_eq!(status.value["status"], "completed", "{status:?}");
    assert!(status.value.get("note").is_none(), "{status:?}");
    let other = json!({"order": "o-1", "method": "other", "provider": "adyen"});
    let err = refused(&tb, "charge_via", other).await;
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!(
        *out.effects.lock().unwrap(),
        [r#"o-1:Other { fields: {"provider": "klarna"} }"#]
    );
}

/// Labels beside where a refund goes, inside a flattened struct: out of the macro's sight.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Meta {
    source: String,
    #[serde(flatten)]
    labels: std::collections::BTreeMap<String, String>,
}

#[tool(idempotent(key = "labelled:<order>"))]
async fn labelled_refund(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] to: Payee,
    #[serde(flatten)] meta: Meta,
) -> Result<String, ToolError> {
    let _ = to;
    Ok(format!(
        "l-{}",
        out.act(format!("{order}:{}:{:?}", meta.source, meta.labels))
    ))
}

/// Labels behind a type alias: out of the macro's sight too.
type Labels = std::collections::BTreeMap<String, String>;

#[tool(idempotent(key = "aliased:<order>"))]
async fn aliased_labels(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] to: Payee,
    #[serde(flatten)] labels: Labels,
) -> Result<String, ToolError> {
    let _ = to;
    Ok(format!("a-{}", out.act(format!("{order}:{labels:?}"))))
}

/// Labels, behind a type alias, before a flattened struct.
#[tool(idempotent(key = "labels-street:<order>"))]
async fn labels_then_street(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] labels: Labels,
    #[serde(flatten)] to: Street,
) -> Result<String, ToolError> {
    Ok(format!(
        "s-{}",
        out.act(format!("{order}:{labels:?}:{to:?}"))
    ))
}

/// A gift flag, a flattened struct of its own.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Gift {
    gift: bool,
}

/// A channel open to any field, before a flattened struct.
#[tool(idempotent(key = "channel-gift:<order>"))]
async fn channel_then_gift(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] via: Channel,
    #[serde(flatten)] extra: Gift,
) -> Result<String, ToolError> {
    Ok(format!(
        "g-{}",
        out.act(format!("{order}:{via:?}:{extra:?}"))
    ))
}

/// An externally tagged enum: serde takes its one entry away when it reads it.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Action {
    Refund {
        cents: u32,
    },
    Replace {
        sku: String,
    },
    /// A unit variant: a string in the schema, no field of its own.
    Cancel,
}

#[tool(idempotent(key = "action-meta:<order>"))]
async fn action_then_meta(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] action: Action,
    #[serde(flatten)] meta: Meta,
) -> Result<String, ToolError> {
    Ok(format!(
        "a-{}",
        out.act(format!("{order}:{action:?}:{:?}", meta.labels))
    ))
}

/// Found in review: serde gives a parameter that takes any field (a map, or a struct or a
/// variant holding one) every field not taken away before it, and it takes none away itself.
/// A refund with no labels ran with the labels `method` and `last4`; labels before an address
/// held `street` and `city`; a provider's own fields held the gift flag. The macro refuses a map
/// beside another flattened parameter it can see; the rest is refused when the toolbox builds.
/// An externally tagged enum takes its entry away, so a map after it builds and gets only its
/// own entries.
#[tokio::test]
async fn a_map_given_another_parameters_fields_does_not_build() {
    for (builder, tool, map, field, parameter) in [
        (
            Toolbox::builder().tool(LabelledRefund),
            "labelled_refund",
            "meta",
            "method",
            "to",
        ),
        (
            Toolbox::builder().tool(AliasedLabels),
            "aliased_labels",
            "labels",
            "method",
            "to",
        ),
        (
            Toolbox::builder().tool(LabelsThenStreet),
            "labels_then_street",
            "labels",
            "street",
            "to",
        ),
        (
            Toolbox::builder().tool(ChannelThenGift),
            "channel_then_gift",
            "via",
            "gift",
            "extra",
        ),
    ] {
        let err = builder.state(Outside::default()).build().err().unwrap();
        assert_eq!(
            err,
            toolkey::BuildError::MapTakesOthersFields {
                tool: tool.into(),
                map: map.into(),
                field: field.into(),
                parameter: parameter.into()
            }
        );
        assert!(err
            .to_string()
            .contains("take the map as a field of its own"));
    }
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ActionThenMeta)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "refund": {"cents": 5}, "source": "web", "team": "ops"});
    tb.call("action_then_meta", args, &ctx()).await.unwrap();
    assert_eq!(
        *out.effects.lock().unwrap(),
        [r#"o-1:Refund { cents: 5 }:{"team": "ops"}"#]
    );
}

/// A shipment's extras, one of them named like a parameter of `ship_with_note`.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Extras {
    note: Option<String>,
    gift: bool,
}

#[tool(idempotent(key = "ship-note:<order>"))]
async fn ship_with_note(
    out: State<Outside>,
    order: String,
    note: String,
    #[serde(flatten)] extras: Extras,
) -> Result<String, ToolError> {
    Ok(format!(
        "s-{}",
        out.act(format!("{order}:{note}:{extras:?}"))
    ))
}

#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Sender {
    name: String,
    city: String,
}

#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Receiver {
    name: String,
    zip: String,
}

#[tool(idempotent(key = "send-letter:<id>"))]
async fn send_letter(
    out: State<Outside>,
    id: String,
    #[serde(flatten)] from: Sender,
    #[serde(flatten)] to: Receiver,
) -> Result<String, ToolError> {
    Ok(format!("l-{}", out.act(format!("{id}:{from:?}:{to:?}"))))
}

#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Holder {
    holder: String,
}

/// A payout whose own `holder` is also a field of the enum it flattens.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Held {
    holder: String,
    #[serde(flatten)]
    to: Payee,
}

#[tool(idempotent(key = "held:<order>"))]
async fn held_payout(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] payout: Held,
) -> Result<String, ToolError> {
    Ok(format!("p-{}", out.act(format!("{order}:{payout:?}"))))
}

/// A search read also as `query`, the name of a parameter of `search_by`.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Search {
    #[serde(alias = "query")]
    search: String,
}

#[tool(idempotent(key = "search-by:<order>"))]
async fn search_by(
    out: State<Outside>,
    order: String,
    query: String,
    #[serde(flatten)] s: Search,
) -> Result<String, ToolError> {
    Ok(format!("q-{}", out.act(format!("{order}:{query}:{s:?}"))))
}

#[tool(idempotent(key = "hold:<order>"))]
async fn hold_first(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] who: Holder,
    #[serde(flatten)] to: Payee,
) -> Result<String, ToolError> {
    Ok(format!("h-{}", out.act(format!("{order}:{who:?}:{to:?}"))))
}

#[tool(idempotent(key = "hold-after:<order>"))]
async fn hold_after(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] to: Payee,
    #[serde(flatten)] who: Holder,
) -> Result<String, ToolError> {
    Ok(format!("h-{}", out.act(format!("{order}:{who:?}:{to:?}"))))
}

/// Found in review: serde reads a tool's own parameters first, then each flattened one in
/// order, and a flattened struct takes its fields away from those after it (an enum or a map
/// takes nothing away). A field a flattened struct shares with an own parameter (lost: the
/// extras' `note` was `None`) or with a flattened parameter after it (every call refused
/// "missing field `name`", though `name` was sent) does not build; and an enum before a struct
/// that shares a field, which serde gives both, now builds, where it was refused.
#[tokio::test]
async fn which_parameter_serde_gives_a_shared_field_decides_whether_a_toolbox_builds() {
    for (builder, field, parameter) in [
        (Toolbox::builder().tool(ShipWithNote), "note", "note"),
        (Toolbox::builder().tool(SendLetter), "name", "from"),
        (Toolbox::builder().tool(HoldFirst), "holder", "who"),
        (Toolbox::builder().tool(Wire), "holder", "holder"),
        (Toolbox::builder().tool(HeldPayout), "holder", "payout"),
    ] {
        let err = builder.state(Outside::default()).build().err().unwrap();
        let toolkey::BuildError::ShadowedField {
            field: f,
            parameter: p,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((f.as_str(), p.as_str()), (field, parameter), "{err}");
    }
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(HoldAfter)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "holder": "Ada", "method": "bank", "iban": "DE02"});
    tb.call("hold_after", args, &ctx()).await.unwrap();
    // An alias of a struct's field named like a parameter: the struct reads its field by its
    // own name, which the schema gives, and nothing is lost.
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(SearchBy)
        .build()
        .unwrap();
    let args = json!({"order": "o-2", "query": "mugs", "search": "tea"});
    tb.call("search_by", args, &ctx()).await.unwrap();
    assert_eq!(
        *out.effects.lock().unwrap(),
        [
            r#"o-1:Holder { holder: "Ada" }:Bank { iban: "DE02", holder: Some("Ada") }"#,
            r#"o-2:mugs:Search { search: "tea" }"#
        ]
    );
}

/// Found in review: inside a flattened field serde reports no path, so a mistyped branch field
/// was refused without its name ("invalid type: integer `4242`, expected a string"). The one
/// value the error names is looked for in the arguments, and its field is named.
#[tokio::test]
async fn a_mistyped_branch_field_is_named_in_the_refusal() {
    let (out, tb) = pay_back_toolbox();
    let args = json!({"order": "o-1", "cents": 5, "method": "card", "last4": 4242});
    let err = refused(&tb, "pay_back", args).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(err.message().contains("`last4`"), "{err:?}");
    assert!(err.suggestion().unwrap().contains("`last4`"), "{err:?}");
    // Two fields holding the value: neither is named, as before.
    let args = json!({"order": "o-2", "cents": 5, "method": "card", "last4": 5});
    let err = refused(&tb, "pay_back", args).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(!err.message().contains("`cents`"), "{err:?}");
    assert_eq!(out.count("payback:"), 0);
}

/// A payout with no payee, then a holder, a field of the payee's bank branch too.
#[tool(idempotent(key = "payout-holder:<order>"))]
async fn payout_then_holder(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] payout: Payout,
    #[serde(flatten)] who: Holder,
) -> Result<String, ToolError> {
    let to = payout.to.map(|_| "payee").unwrap_or("none");
    Ok(format!(
        "h-{}",
        out.act(format!("{order}:{}:{to}:{}", payout.currency, who.holder))
    ))
}

/// Found in review: a name another parameter takes touched a branch all the same, so a payout
/// with no payee and a holder for the struct after it was refused "missing field `iban`", which
/// would have led a model to invent a bank account.
#[tokio::test]
async fn a_field_given_for_another_parameter_touches_no_branch() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(PayoutThenHolder)
        .build()
        .unwrap();
    let args = json!({"order": "o-1", "currency": "EUR", "holder": "Ada"});
    tb.call("payout_then_holder", args, &ctx()).await.unwrap();
    assert_eq!(*out.effects.lock().unwrap(), ["o-1:EUR:none:Ada"]);
}

/// Counts by article number: a map whose keys are read as numbers.
#[derive(Debug, Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Restocking {
    counts: std::collections::BTreeMap<u32, u32>,
}

#[tool(idempotent(key = "restock:<order>"))]
async fn restock(
    out: State<Outside>,
    order: String,
    #[serde(flatten)] plan: Restocking,
) -> Result<String, ToolError> {
    Ok(format!("r-{}", out.act(format!("{order}:{plan:?}"))))
}

/// Found in review: the field a refusal names is the one holding the value serde names, and a
/// map's key is read as a value too. `"12"` is both `order` and a key of `counts`: neither is
/// named, where `order`, which is right, was.
#[tokio::test]
async fn a_refusal_names_no_field_when_a_key_holds_the_value_too() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(Restock)
        .build()
        .unwrap();
    let err = refused(&tb, "restock", json!({"order": "12", "counts": {"12": 4}})).await;
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(!err.message().contains("`order`"), "{err:?}");
    assert!(out.effects.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// A step's result must read back into its type: a replay hands back what the record holds.

/// A contact as a CRM client might declare it: its tags left out of the text when empty, and
/// required when read (no `#[serde(default)]`).
#[derive(Serialize, serde::Deserialize)]
struct Contact {
    id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
}

/// Creates a contact with `tags` as a step, and answers its id.
#[tool(idempotent(key = "contact:<email>"))]
async fn create_contact(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
    tags: Vec<String>,
) -> Result<String, ToolError> {
    let contact: Contact = ctx
        .once("create", async {
            let n = out.act(format!("contact:{email}"));
            Ok::<_, ToolError>(Contact {
                id: format!("c-{n}"),
                tags,
            })
        })
        .await?;
    Ok(contact.id)
}

/// Measures once; a broken sensor reads NaN, which JSON writes as `null`.
#[tool(idempotent(key = "measure:<probe>"))]
async fn measure(out: State<Outside>, ctx: &ToolContext, probe: String) -> Result<f64, ToolError> {
    ctx.once("read", async {
        out.act(format!("measure:{probe}"));
        Ok::<_, ToolError>(if probe == "broken" { f64::NAN } else { 21.5 })
    })
    .await
}

#[tokio::test]
async fn a_step_result_that_would_not_read_back_is_unknown_at_its_first_run() {
    // Recorded as it was, the contact without tags would read back on no replay ("missing
    // field"): the step acted, so its outcome is unknown (never a recorded failure, never a
    // second contact), and the first run says so rather than a later replay.
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(CreateContact)
        .tool(Measure)
        .build()
        .unwrap();
    let bare = json!({"email": "ann@example.com", "tags": []});
    for first in [true, false] {
        let err = tb
            .call("create_contact", bare.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        assert!(!err.is_retryable());
        // The first answer names the step and what would not read back; a retry meets the
        // call kept unknown.
        let says = match first {
            true => ["step `create` acted", "missing field `tags`"],
            false => ["could not tell whether it acted", "create_contact"],
        };
        assert!(says.iter().all(|s| err.message().contains(s)), "{err}");
    }
    let status = tb
        .call("create_contact_status", bare, &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown", "{}", status.value);
    assert_eq!(out.count("contact:ann@"), 1);

    // A contact whose text holds every field reads back: created once, then replayed.
    let tagged = json!({"email": "bob@example.com", "tags": ["vip"]});
    for replayed in [false, true] {
        let created = tb
            .call("create_contact", tagged.clone(), &ctx())
            .await
            .unwrap();
        assert_eq!((created.value, created.replayed), (json!("c-2"), replayed));
    }
    assert_eq!(out.count("contact:bob@"), 1);

    let err = tb
        .call("measure", json!({"probe": "broken"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(err.message().contains("step `read` acted"), "{err}");
    let read = tb
        .call("measure", json!({"probe": "ok"}), &ctx())
        .await
        .unwrap();
    assert_eq!(read.value, json!(21.5));
    assert_eq!(
        (out.count("measure:broken"), out.count("measure:ok")),
        (1, 1)
    );
}

/// Creates a contact as a step (its id as text), then welcomes it; the mailer is down at first.
#[tool(idempotent(key = "onboard:<email>"))]
async fn onboard(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
) -> Result<String, ToolError> {
    let id: String = ctx
        .once("create", async {
            Ok::<_, ToolError>(format!("c-{}", out.act(format!("create:{email}"))))
        })
        .await?;
    if out.count("outage") == 0 {
        out.act("outage");
        return Err(
            ToolError::new("MAIL_DOWN", "the mailer is down; no welcome was sent")
                .with_retryable(true),
        );
    }
    out.act(format!("welcome:{id}"));
    Ok(id)
}

/// The same tool after a release that changed what its step answers: a contact, not its id.
#[tool(name = "onboard", idempotent(key = "onboard:<email>"))]
async fn onboard_changed(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
) -> Result<String, ToolError> {
    out.act("changed-body");
    let contact: Contact = ctx
        .once("create", async {
            let n = out.act(format!("create:{email}"));
            Ok::<_, ToolError>(Contact {
                id: format!("c-{n}"),
                tags: vec!["new".into()],
            })
        })
        .await?;
    Ok(contact.id)
}

#[tokio::test]
async fn a_step_record_that_no_longer_fits_its_type_frees_the_key_until_the_code_reads_it() {
    // The contact was created, then the mailer failed: the key was freed, the step's record
    // kept. The changed code cannot read that record. Recording its failure as the call's outcome
    // would answer it forever: the key is freed again, so the call finishes once code that reads
    // the record runs, and the contact is never created twice.
    let out = Arc::new(Outside::default());
    let store = Arc::new(MemoryStore::new());
    let build = |tool: &dyn Fn(toolkey::ToolboxBuilder) -> toolkey::ToolboxBuilder| {
        tool(
            Toolbox::builder()
                .shared_state(out.clone())
                .shared_store(store.clone()),
        )
        .build()
        .unwrap()
    };
    let before = build(&|b| b.tool(Onboard));
    let changed = build(&|b| b.tool(OnboardChanged));
    let args = json!({"email": "ann@example.com"});
    let err = before
        .call("onboard", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "MAIL_DOWN");
    for _ in 0..2 {
        let err = changed
            .call("onboard", args.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Internal), "{err:?}");
        assert!(
            err.message()
                .contains("the recorded result of step `create` no longer fits its type"),
            "{err}"
        );
        // serde's account names the recorded value; the model is not shown it.
        assert!(!err.message().contains("c-1"), "{err}");
        assert!(!err.is_retryable() && err.suggestion().is_some(), "{err:?}");
    }
    // Each call ran the body: neither was answered from a recorded failure.
    assert_eq!(out.count("changed-body"), 2);
    let done = before.call("onboard", args.clone(), &ctx()).await.unwrap();
    assert_eq!((done.value, done.replayed), (json!("c-1"), false));
    let again = before.call("onboard", args, &ctx()).await.unwrap();
    assert!(again.replayed);
    assert_eq!((out.count("create:"), out.count("welcome:c-1")), (1, 1));
}
