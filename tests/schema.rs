//! The schema `#[tool]` derives for the design's `send_invoice`, and its status companion's.

use serde_json::{json, Value};
use toolkey::{Story, Tool, Toolbox};
use toolkey_tests::billing;

use billing::{Billing, SendInvoice};

fn properties(schema: &Value) -> Vec<String> {
    let mut names: Vec<String> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

#[test]
fn send_invoice_schema_has_the_four_model_visible_fields() {
    let def = SendInvoice.definition();
    assert_eq!(def.name(), "send_invoice");
    assert_eq!(
        def.description(),
        "Create and send the invoice for one customer and billing period.\n\nSafe to retry: a second call for the same customer and period never sends a second invoice."
    );
    let schema = def.input_schema();
    assert_eq!(properties(schema), ["amount", "customer", "memo", "period"]);
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(schema["type"], "object");
    assert_eq!(
        schema["properties"]["customer"]["description"],
        "Customer ID, for example \"acme\"."
    );
    assert_eq!(
        schema["properties"]["period"]["description"],
        "Billing period as YYYY-MM, for example \"2026-10\"."
    );
    assert_eq!(
        schema["properties"]["amount"]["description"],
        "Amount in EUR."
    );
    assert_eq!(
        schema["properties"]["memo"]["description"],
        "What the invoice is for."
    );
    assert_eq!(schema["properties"]["amount"]["type"], "number");
    let text = schema.to_string();
    for absent in ["billing", "ctx", "idempotency", "key"] {
        assert!(
            !text.contains(&format!("\"{absent}\"")),
            "schema mentions {absent}: {text}"
        );
    }
    assert_eq!(def.story(), Story::Idempotent);
    assert_eq!(def.status_tool(), Some("invoice_status"));
    assert_eq!(
        def.settings().timeout,
        Some(std::time::Duration::from_secs(2))
    );
    let annotations = def.annotations();
    assert!(annotations.idempotent && annotations.destructive && !annotations.read_only);
    let output = def.output_schema().unwrap();
    assert_eq!(
        properties(output),
        ["amount", "customer", "id", "memo", "period"]
    );
}

#[test]
fn status_companion_requires_the_key_fields_and_accepts_the_rest() {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(SendInvoice)
        .build()
        .unwrap();
    let names: Vec<String> = toolbox
        .definitions()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, ["invoice_status", "send_invoice"]);
    let status = toolbox.definition("invoice_status").unwrap();
    // The target's whole argument set, so "call it with the same arguments" works as written;
    // only the key fields are required.
    assert_eq!(
        properties(status.input_schema()),
        ["amount", "customer", "memo", "period"]
    );
    assert_eq!(
        status.input_schema()["required"],
        json!(["customer", "period"])
    );
    let amount = status.input_schema()["properties"]["amount"]["description"]
        .as_str()
        .unwrap();
    assert!(
        amount.starts_with("Amount in EUR.")
            && amount.contains("Not part of `invoice_status`'s key"),
        "{amount}"
    );
    assert_eq!(status.input_schema()["additionalProperties"], json!(false));
    assert_eq!(
        status.input_schema()["properties"]["customer"]["description"],
        "Customer ID, for example \"acme\"."
    );
    assert_eq!(status.story(), Story::ReadOnly);
    assert!(status.annotations().read_only);
}

/// Two tools alike in every field, type and doc: `plain_order`, whose status companion is built
/// from its target's schema and reads its key field by field (its only serde attributes are
/// defaults, on fields outside the key), and `derived_order`, whose one more serde attribute (a
/// rename to the field's own name, which changes nothing) makes the macro derive the
/// companion's arguments struct instead. Their companions must not differ in
/// anything a model or a caller sees.
mod alike {
    use std::collections::{BTreeSet, HashMap};

    use serde::{Deserialize, Serialize};
    use toolkey::{tool, ToolError};

    /// A line of an order.
    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Line {
        pub sku: String,
        pub quantity: u32,
    }

    /// A line of a return: a type of the same name as [`Line`], which schemars names apart.
    pub mod returns {
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        pub struct Line {
            pub reason: String,
        }
    }

    /// How fast it goes.
    #[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Speed {
        Standard,
        Express,
    }

    fn one() -> u32 {
        1
    }

    macro_rules! order_tool {
        ($name:ident, $prefix:literal $(, #[$attr:meta])?) => {
            #[tool(idempotent(key = $prefix))]
            /// Places an order.
            #[allow(clippy::too_many_arguments)]
            pub async fn $name(
                /// The customer.
                customer: String,
                /// The order's number.
                number: u64,
                /// The branch, when there is one.
                branch: Option<String>,
                /// Amount in EUR.
                amount: f64,
                /// What goes in the parcel.
                ///
                /// One line per product.
                lines: Vec<Line>,
                returned: Option<returns::Line>,
                tags: BTreeSet<String>,
                /// # Speed
                /// How fast it travels.
                speed: Speed,
                /// Anything else.
                extra: serde_json::Value,
                #[doc = " Trailing spaces stay inside.   "]
                gift: Option<bool>,
                $(#[$attr])?
                counts: HashMap<String, u32>,
                /// Left out, it is empty; the status companion takes it as any other.
                #[serde(default)]
                memo: String,
                /// Left out, it is one.
                #[serde(default = "one")]
                copies: u32,
            ) -> Result<String, ToolError> {
                let _ = (&branch, amount, &lines, &returned, &tags, speed, &extra, gift, &counts);
                let _ = (&memo, copies);
                Ok(format!("{customer}-{number}"))
            }
        };
    }

    macro_rules! step_tool {
        ($name:ident, $prefix:literal $(, #[$attr:meta])?) => {
            /// A step of a run, keyed by the run alone.
            #[tool(idempotent(key = $prefix))]
            pub async fn $name(
                /// Why.
                $(#[$attr])?
                note: String,
            ) -> Result<String, ToolError> {
                Ok(note)
            }
        };
    }

    /// A step with no arguments at all, keyed by its run.
    #[tool(idempotent(key = "bare-step:<ctx.run_id>"))]
    pub async fn bare_step() -> Result<String, ToolError> {
        Ok("done".into())
    }

    step_tool!(plain_step, "plain-step:<ctx.run_id>");
    step_tool!(
        derived_step,
        "derived-step:<ctx.run_id>",
        #[serde(rename = "note")]
    );

    order_tool!(plain_order, "plain-order:<customer>:<number>");
    order_tool!(
        derived_order,
        "derived-order:<customer>:<number>",
        #[serde(rename = "counts")]
    );
}

/// `derived_order`'s text as `plain_order`'s: the names and the key's prefix are the one
/// difference.
fn as_plain(value: &Value) -> String {
    value
        .to_string()
        .replace("derived_order", "plain_order")
        .replace("derived-order", "plain-order")
        .replace("derived_step", "plain_step")
        .replace("derived-step", "plain-step")
}

/// The four tools of [`alike`] in one toolbox.
fn alike_toolbox() -> Toolbox {
    Toolbox::builder()
        .tool(alike::PlainOrder)
        .tool(alike::DerivedOrder)
        .tool(alike::PlainStep)
        .tool(alike::DerivedStep)
        .tool(alike::BareStep)
        .build()
        .unwrap()
}

#[test]
fn a_status_companion_built_from_its_target_is_the_one_its_derived_struct_gives() {
    let toolbox = alike_toolbox();
    let plain = toolbox.definition("plain_order_status").unwrap();
    let derived = toolbox.definition("derived_order_status").unwrap();
    assert_eq!(
        as_plain(derived.input_schema()),
        plain.input_schema().to_string()
    );
    // A key of the context alone: every field is ignored, and none is required.
    let plain_step = toolbox.definition("plain_step_status").unwrap();
    let derived_step = toolbox.definition("derived_step_status").unwrap();
    assert_eq!(
        as_plain(derived_step.input_schema()),
        plain_step.input_schema().to_string()
    );
    assert!(plain_step.input_schema().get("required").is_none());
    // No arguments at all: an empty object, closed, and nothing else to send.
    let bare = toolbox
        .definition("bare_step_status")
        .unwrap()
        .input_schema();
    assert_eq!(
        bare,
        &json!({
            "type": "object",
            "additionalProperties": false,
            "$schema": "https://json-schema.org/draft/2020-12/schema",
        }),
    );
    // And what that schema says, so the two cannot agree on something wrong.
    let schema = plain.input_schema();
    assert_eq!(schema["required"], json!(["customer", "number"]));
    assert_eq!(
        schema["properties"]["amount"]["type"],
        json!(["number", "null"])
    );
    assert_eq!(schema["properties"]["speed"]["title"], "Speed");
    assert_eq!(
        schema["properties"]["speed"]["description"],
        "How fast it travels.\n\nNot part of `plain_order_status`'s key: accepted so that the arguments of a `plain_order` call can be passed as they are; given all of them, `plain_order_status` checks that the key's record is that call's."
    );
    assert_eq!(
        schema["properties"]["tags"]["description"],
        "Not part of `plain_order_status`'s key: accepted so that the arguments of a `plain_order` call can be passed as they are; given all of them, `plain_order_status` checks that the key's record is that call's."
    );
    assert!(schema["properties"]["gift"]["description"]
        .as_str()
        .unwrap()
        .starts_with("Trailing spaces stay inside.   \n\nNot part of"));
    assert_eq!(
        schema["properties"]["lines"]["items"]["$ref"],
        "#/$defs/Line"
    );
    assert_eq!(schema["additionalProperties"], json!(false));
    // The target's own schema is untouched.
    let target = toolbox.definition("plain_order").unwrap().input_schema();
    assert_eq!(target["properties"]["amount"]["type"], "number");
    assert_eq!(target["required"].as_array().unwrap().len(), 8);
    assert_eq!(target["properties"]["copies"]["default"], 1);
    assert!(schema["properties"]["copies"].get("default").is_none());
}

#[tokio::test]
async fn a_status_companion_read_field_by_field_answers_as_its_derived_struct_does() {
    let toolbox = alike_toolbox();
    let ctx = toolkey::ToolContext::new("run-1");
    let full = json!({
        "customer": "acme", "number": 7, "branch": "north", "amount": 12.5,
        "lines": [{"sku": "a", "quantity": 1}], "tags": ["x"], "speed": "express",
        "extra": {"any": 1}, "gift": true, "counts": {"a": 1},
    });
    for name in ["plain_order", "derived_order"] {
        toolbox.call(name, full.clone(), &ctx).await.unwrap();
    }
    let cases = [
        full.clone(),
        // The key alone, and another key than the call's.
        json!({"customer": "acme", "number": 7}),
        json!({"customer": "acme", "number": 8}),
        json!({"customer": "acme", "number": 7, "branch": null}),
        // Ignored fields take anything, of any type, or null.
        json!({"customer": "acme", "number": 7, "branch": "north", "amount": "lots",
               "lines": 3, "speed": null, "tags": {"no": "set"}}),
        // An integral float is an integer, as for the target.
        json!({"customer": "acme", "number": 7.0}),
        // What is refused, and how it is told.
        json!({"customer": "acme", "number": 7.5}),
        json!({"customer": "acme", "number": -1}),
        json!({"customer": "acme", "number": "7"}),
        json!({"customer": 5, "number": 7}),
        json!({"number": 7}),
        json!({"customer": "acme"}),
        json!({"customer": "acme", "number": 7, "nubmer": 7}),
        // Unknown before faulty, as the derived struct reads them in order.
        json!({"custmer": "acme", "number": "x"}),
        json!({"customer": "acme", "number": 7, "branch": 5}),
        json!({}),
        Value::Null,
        json!([]),
        json!(["acme", 7]),
        json!("acme"),
    ];
    let steps = [
        json!({}),
        json!({"note": "why"}),
        json!({"note": 5}),
        json!({"note": "why", "why": 1}),
        Value::Null,
    ];
    toolbox
        .call("plain_step", json!({"note": "a"}), &ctx)
        .await
        .unwrap();
    toolbox
        .call("derived_step", json!({"note": "a"}), &ctx)
        .await
        .unwrap();
    // The bare step's companion takes nothing, and says so of anything else.
    toolbox.call("bare_step", json!({}), &ctx).await.unwrap();
    let status = toolbox
        .call("bare_step_status", json!({}), &ctx)
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    let err = toolbox
        .call("bare_step_status", json!({"why": 1}), &ctx)
        .await
        .unwrap_err();
    assert!(err.message().contains("unknown field `why`"), "{err:?}");
    let cases = cases.into_iter().map(|args| (args, "order"));
    for (args, tool) in cases.chain(steps.into_iter().map(|args| (args, "step"))) {
        let mut answers = Vec::new();
        for name in [
            format!("plain_{tool}_status"),
            format!("derived_{tool}_status"),
        ] {
            let answer = match toolbox.call(&name, args.clone(), &ctx).await {
                // Each call completed at its own instant.
                Ok(mut output) => {
                    if let Some(answer) = output.value.as_object_mut() {
                        answer.remove("completed_at");
                    }
                    json!({"ok": output.value})
                }
                Err(err) => json!({"err": err.to_json()}),
            };
            answers.push(answer);
        }
        assert_eq!(answers[0].to_string(), as_plain(&answers[1]), "{args}");
        println!("{args} -> {}", answers[0]);
    }
}
