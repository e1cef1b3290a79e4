//! Objects nested in a tool's arguments carry only the fields their schema names: a field the
//! schema does not take there is refused before anything is done, where serde alone would have
//! ignored it and done something else than the model asked. Every scenario counts shipments on
//! a fake carrier.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

/// The outside system: every shipment sent, as the carrier saw it.
#[derive(Default)]
struct Carrier {
    shipments: Mutex<Vec<String>>,
}

impl Carrier {
    fn count(&self) -> usize {
        self.shipments.lock().unwrap().len()
    }
}

/// How an order ships: a struct without `deny_unknown_fields`, as most are.
#[derive(Deserialize, Serialize, JsonSchema, Debug)]
struct Shipping {
    express: Option<bool>,
    insured: Option<bool>,
}

/// Who hears of the shipment: an untagged enum, read by serde as its first branch that parses.
#[derive(Deserialize, Serialize, JsonSchema, Debug)]
#[serde(untagged)]
enum Contact {
    Email { email: String },
    Phone { phone: String, cc: Option<String> },
}

/// A line of the order.
#[derive(Deserialize, Serialize, JsonSchema, Debug)]
struct Line {
    sku: String,
    gift_wrap: Option<bool>,
}

/// Ship an order.
#[tool(idempotent(key = "ship:<order>"))]
async fn ship(
    carrier: State<Carrier>,
    order: String,
    shipping: Shipping,
    contact: Option<Contact>,
    lines: Vec<Line>,
    notes: BTreeMap<String, Shipping>,
) -> Result<String, ToolError> {
    let sent = format!("{order} {shipping:?} {contact:?} {lines:?} {notes:?}");
    carrier.shipments.lock().unwrap().push(sent.clone());
    Ok(sent)
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

fn toolbox(carrier: &Arc<Carrier>) -> Toolbox {
    Toolbox::builder()
        .shared_state(carrier.clone())
        .tool(Ship)
        .build()
        .unwrap()
}

/// A call whose arguments differ from `{"order": "o-1", ...}` in the fields given.
fn call_with(fields: serde_json::Value) -> serde_json::Value {
    let mut args = json!({"order": "o-1", "shipping": {}, "lines": [], "notes": {}});
    for (name, value) in fields.as_object().unwrap() {
        args[name] = value.clone();
    }
    args
}

/// Each misspelled or misplaced field is refused where it is, before the key is reserved: no
/// shipment, and the key still free. The call as the schema says ships once, and its retry
/// replays it.
#[tokio::test]
async fn a_field_the_schema_does_not_take_below_the_top_is_refused_before_anything_is_done() {
    let carrier = Arc::new(Carrier::default());
    let toolbox = toolbox(&carrier);
    let refused = [
        (
            json!({"shipping": {"expres": true}}),
            "`shipping`: unknown field `expres`, expected one of `express`, `insured`",
            "shipping.expres",
        ),
        (
            json!({"contact": {"email": "a@b.c", "phone": "555", "cc": "44"}}),
            "`contact`: field `email` does not go with the other fields given: with them, expected only `cc`, `phone`",
            "contact.email",
        ),
        (
            json!({"lines": [{"sku": "a"}, {"sku": "b", "giftwrap": true}]}),
            "`lines[1]`: unknown field `giftwrap`, expected one of `gift_wrap`, `sku`",
            "lines[1].giftwrap",
        ),
        (
            json!({"notes": {"fragile": {"insurd": true}}}),
            "`notes.fragile`: unknown field `insurd`, expected one of `express`, `insured`",
            "notes.fragile.insurd",
        ),
    ];
    for (fields, problem, field) in refused {
        let err = toolbox
            .call("ship", call_with(fields.clone()), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::InvalidArguments), "{fields}: {err:?}");
        assert!(err.is_retryable(), "{fields}: nothing was done");
        assert!(
            err.message().ends_with(problem),
            "{fields}: {}",
            err.message()
        );
        let fix = format!("fix `{field}` as the tool's schema describes, then call again");
        assert_eq!(err.suggestion(), Some(fix.as_str()));
        let status = toolbox
            .call("ship_status", json!({"order": "o-1"}), &ctx())
            .await
            .unwrap();
        assert_eq!(
            status.value["status"], "not_found",
            "{fields}: {}",
            status.value
        );
    }
    assert_eq!(carrier.count(), 0, "nothing shipped");
    let asked = call_with(json!({
        "shipping": {"express": true},
        "contact": {"phone": "555", "cc": "44"},
        "lines": [{"sku": "a"}, {"sku": "b", "gift_wrap": true}],
        "notes": {"fragile": {"insured": true}}
    }));
    let first = toolbox.call("ship", asked.clone(), &ctx()).await.unwrap();
    assert!(!first.replayed);
    let sent = first.value.as_str().unwrap();
    assert!(sent.contains("express: Some(true)"), "{sent}");
    assert!(
        sent.contains("Phone { phone: \"555\", cc: Some(\"44\") }"),
        "{sent}"
    );
    assert!(sent.contains("gift_wrap: Some(true)"), "{sent}");
    assert!(sent.contains("insured: Some(true)"), "{sent}");
    let again = toolbox.call("ship", asked.clone(), &ctx()).await.unwrap();
    assert_eq!((again.value, again.replayed), (first.value, true));
    // The status companion, given the call's arguments, reads them as the tool does: the call
    // made is completed; the same with a field the tool would refuse is no call made.
    let status = toolbox.call("ship_status", asked.clone(), &ctx()).await;
    assert_eq!(status.unwrap().value["status"], "completed");
    let mut other = asked;
    other["shipping"]["expres"] = json!(false);
    let err = toolbox
        .call("ship_status", other, &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidArguments), "{err:?}");
    assert!(
        err.message()
            .ends_with("`shipping`: unknown field `expres`, expected one of `express`, `insured`"),
        "{}",
        err.message()
    );
    assert_eq!(carrier.count(), 1, "one shipment");
}

/// Every form the schema gives is taken: each branch of the union, `null` for an option (as
/// OpenAI's strict mode sends it, inside objects too), empty objects and arrays.
#[tokio::test]
async fn every_form_the_schema_gives_is_taken() {
    let carrier = Arc::new(Carrier::default());
    let toolbox = toolbox(&carrier);
    let calls = [
        json!({"order": "o-1", "shipping": {}, "contact": null, "lines": [], "notes": {}}),
        json!({"order": "o-2", "shipping": {"express": null, "insured": null},
               "contact": {"email": "a@b.c"}, "lines": [{"sku": "a", "gift_wrap": null}],
               "notes": {}}),
        json!({"order": "o-3", "shipping": {"express": false},
               "contact": {"phone": "555", "cc": null}, "lines": [],
               "notes": {"a": {}, "b": {"express": true}}}),
    ];
    for args in calls {
        let out = toolbox.call("ship", args.clone(), &ctx()).await;
        assert!(out.is_ok(), "{args}: {out:?}");
    }
    assert_eq!(carrier.count(), 3);
}
