//! What names a call for the status companion: key fields with defaults, renamed, aliased or
//! flattened fields, raw identifiers, each read by the name the arguments give it.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::{ctx, Outside};

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
