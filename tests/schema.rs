//! The schema `#[tool]` derives for the design's `send_invoice`, and its status companion's.

mod billing;

use serde_json::{json, Value};
use toolkey::{Story, Tool, Toolbox};

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
        amount.starts_with("Amount in EUR.") && amount.contains("Ignored by `invoice_status`"),
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
