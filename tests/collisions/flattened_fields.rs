//! Every field given reaches the parameter serde gives it: a toolbox where a field would be lost
//! or go to another parameter does not build, and a refusal names the field it is about.

use std::sync::Arc;

use serde::Serialize;
use serde_json::json;
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::flattened_parts::pay_back_toolbox;
use super::{ctx, refused, Outside};

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
pub(super) struct Payout {
    currency: String,
    #[serde(flatten)]
    to: Option<Payee>,
}

/// Pays out an order, to a payee if one is given.
#[tool(idempotent(key = "payout:<order>"))]
pub(super) async fn pay_out_maybe(
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
