//! A flattened enum or map is part of the arguments: called, checked and fingerprinted; an
//! untagged one whose branch the names given cannot tell does not build.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::flattened_fields::PayOutMaybe;
use super::{ctx, refused, Outside};

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

/// A toolbox with `pay_back`, and the outside system it pays back on.
pub(super) fn pay_back_toolbox() -> (Arc<Outside>, Toolbox) {
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
