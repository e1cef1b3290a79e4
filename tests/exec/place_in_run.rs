//! A tool keyed on its place in the run (`<ctx.run_id>:<ctx.step>`): its body reads the key,
//! and no answer tells the model to call again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

/// Forwards its key to the provider, as Stripe's Idempotency-Key.
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund_forwarding_key(ctx: &ToolContext, cents: i64) -> Result<String, ToolError> {
    let _ = cents;
    Ok(ctx
        .idempotency_key()
        .expect("keyed tools see their key")
        .to_string())
}

#[tokio::test]
async fn the_body_reads_its_key_built_from_the_context() {
    let toolbox = Toolbox::builder()
        .tool(RefundForwardingKey)
        .build()
        .unwrap();
    let out = toolbox
        .call(
            "refund_forwarding_key",
            json!({"cents": 5}),
            &ToolContext::new("Run-7").with_step(4),
        )
        .await
        .unwrap();
    assert_eq!(
        out.value,
        json!("refund:Run-7:4"),
        "context values keep their case"
    );
    assert_eq!(
        toolbox.definitions().len(),
        1,
        "status = false adds no companion"
    );
}

/// Refunds by the run and the call's place in it, slowly, with a recover hook for a lost reply.
#[tool(
    idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false, recover = no_refund_found),
    timeout = "50ms"
)]
async fn refund_by_step(refunds: State<AtomicUsize>, cents: i64) -> Result<String, ToolError> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let n = refunds.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("re-{n}-{cents}"))
}

/// Refunds by the run and the call's place in it; the provider's reply is lost.
#[tool(idempotent(key = "refund-now:<ctx.run_id>:<ctx.step>", status = false, recover = no_refund_found))]
async fn refund_by_step_now(refunds: State<AtomicUsize>, cents: i64) -> Result<String, ToolError> {
    let _ = cents;
    refunds.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown(
        "the refund went out; its reply was lost",
    ))
}

async fn no_refund_found(
    refunds: State<AtomicUsize>,
    cents: i64,
) -> Result<Option<String>, ToolError> {
    let _ = (refunds, cents);
    Ok(None)
}

#[tokio::test]
async fn a_tool_keyed_on_its_place_in_the_run_never_tells_the_model_to_call_again() {
    // The model's own retry is a new call, at a new place in the run, with a key of its own: it
    // would refund again. Only the same call handed over again replays.
    let refunds = Arc::new(AtomicUsize::new(0));
    let toolbox = Toolbox::builder()
        .shared_state(refunds.clone())
        .tool(RefundByStep)
        .tool(RefundByStepNow)
        .build()
        .unwrap();
    let definition = toolbox.definition("refund_by_step").unwrap();
    assert!(
        !definition.annotations().idempotent,
        "a new call acts again"
    );
    assert_eq!(definition.to_mcp()["annotations"]["idempotentHint"], false);
    let at = |step| ToolContext::new("run-9").with_step(step);
    let args = json!({"cents": 100});
    let err = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(
        suggestion.contains("do not call `refund_by_step` again"),
        "{suggestion}"
    );
    // The same call handed over again while it runs: still running, and not to be called again.
    let err = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    assert!(err.suggestion().unwrap().contains("do not call"), "{err:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let replay = toolbox
        .call("refund_by_step", args.clone(), &at(1))
        .await
        .unwrap();
    assert!(replay.replayed);
    // A lost reply, answered at once: with a recover hook, a retry of the same call looks
    // before it acts, but the model's retry is not that call, so the answer does not invite it.
    let unknown = toolbox
        .call("refund_by_step_now", json!({"cents": 7}), &at(2))
        .await
        .unwrap_err();
    assert!(unknown.is(ErrorCode::OutcomeUnknown), "{unknown:?}");
    assert!(!unknown.is_retryable(), "{unknown:?}");
    assert!(unknown.suggestion().unwrap().starts_with("do not repeat"));
    assert!(toolbox.shutdown().await.is_clean());
    assert_eq!(refunds.load(Ordering::SeqCst), 2);
}

/// Pays out by the run and the call's place in it: a transfer step, then a receipt step whose
/// mail server is down at first.
#[tool(idempotent(key = "payout:<ctx.run_id>:<ctx.step>", status = false))]
async fn payout_by_step(
    effects: State<Mutex<Vec<String>>>,
    ctx: &ToolContext,
    cents: i64,
) -> Result<String, ToolError> {
    let count = |prefix: &str| {
        let effects = effects.lock().unwrap();
        effects.iter().filter(|e| e.starts_with(prefix)).count()
    };
    let act = |what: String| effects.lock().unwrap().push(what);
    ctx.once("transfer", async {
        act(format!("transfer:{cents}"));
        Ok::<_, ToolError>(())
    })
    .await?;
    ctx.once("receipt", async {
        if count("outage") == 0 {
            act("outage".into());
            return Err(ToolError::new("MAIL_DOWN", "the mail server is down").with_retryable(true));
        }
        act("receipt".into());
        Ok(())
    })
    .await?;
    Ok("paid".into())
}

#[tokio::test]
async fn a_failure_after_steps_of_a_call_keyed_on_its_place_is_not_retryable() {
    // The model's retry would be a new call, a new key: it would transfer again.
    let effects = Arc::new(Mutex::new(Vec::<String>::new()));
    let toolbox = Toolbox::builder()
        .shared_state(effects.clone())
        .tool(PayoutByStep)
        .build()
        .unwrap();
    let at = |step| ToolContext::new("run-3").with_step(step);
    let err = toolbox
        .call("payout_by_step", json!({"cents": 500}), &at(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "MAIL_DOWN");
    assert!(!err.is_retryable(), "{err:?}");
    let suggestion = err.suggestion().unwrap();
    assert!(suggestion.contains("do not call again"), "{suggestion}");
    // The same call handed over again finishes it, the transfer replayed.
    let paid = toolbox
        .call("payout_by_step", json!({"cents": 500}), &at(1))
        .await
        .unwrap();
    assert_eq!(paid.value, json!("paid"));
    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects, ["transfer:500", "outage", "receipt"]);
}

#[test]
fn a_definition_keyed_on_its_place_stays_not_idempotent_whatever_the_order() {
    use toolkey::{Annotations, Story, ToolDefinition};
    let schema = json!({"type": "object"});
    let key_first = ToolDefinition::new("refund", "Refund.", schema.clone(), Story::Idempotent)
        .with_key_template("refund:<ctx.run_id>:< ctx.step >")
        .with_annotations(Annotations::for_story(Story::Idempotent));
    let key_last = ToolDefinition::new("refund", "Refund.", schema.clone(), Story::Idempotent)
        .with_annotations(Annotations::for_story(Story::Idempotent))
        .with_key_template("refund:<ctx.run_id>:<ctx.step>");
    for definition in [key_first, key_last] {
        assert!(!definition.annotations().idempotent);
        assert_eq!(definition.to_mcp()["annotations"]["idempotentHint"], false);
    }
    let by_order = ToolDefinition::new("refund", "Refund.", schema, Story::Idempotent)
        .with_key_template("refund:<order>");
    assert!(by_order.annotations().idempotent);
}
