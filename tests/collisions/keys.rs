//! Different calls never share a key: values cannot forge literal text, identifiers keep their
//! case, bad values never reach a store, and templates that could build one key do not share a
//! toolbox.

use std::sync::Arc;

use serde_json::json;
use toolkey::store::faults::{FaultyStore, Plan};
use toolkey::store::MemoryStore;
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::{ctx, toolbox, Outside};

// ---------------------------------------------------------------------------------------------
// Different argument tuples never share a key.

/// Pairs two values around a letter of literal text.
#[tool(idempotent(key = "pair:<a>x<b>", status = false))]
pub(super) async fn pair(out: State<Outside>, a: String, b: String) -> Result<String, ToolError> {
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
// Identifiers keep their case unless the author says otherwise.

/// Refunds a charge.
#[tool(idempotent(key = "refund:<charge_id>", status = "refund_status"))]
pub(super) async fn refund(
    out: State<Outside>,
    charge_id: String,
    cents: i64,
) -> Result<String, ToolError> {
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

/// Voids an invoice: same template as `bill`, another action.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = false))]
pub(super) async fn void(
    out: State<Outside>,
    customer: String,
    period: String,
) -> Result<String, ToolError> {
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

// ---------------------------------------------------------------------------------------------
// Bad key values never reach a store.

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
// Two templates that could build one key do not share a toolbox.

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
