// `#[toolkey::data]` derives what argument and result types need, through toolkey's own serde and
// schemars; `toolkey::json!` builds arguments.
use toolkey::{json, tool, Tool, ToolContext, ToolError};

/// Where a parcel goes.
#[toolkey::data]
struct Address {
    /// Street and number.
    street: String,
    city: String,
}

/// How fast.
#[toolkey::data]
#[derive(toolkey::KeyPart)]
#[serde(rename_all = "snake_case")]
enum Speed {
    Standard,
    Express,
}

/// A shipment label.
#[toolkey::data]
struct Label {
    id: String,
}

/// Ships an order.
#[tool(idempotent(key = "ship:<order>:<speed>"))]
async fn ship(order: String, speed: Speed, address: Address) -> Result<Label, ToolError> {
    let _ = (speed, address.street, address.city);
    Ok(Label { id: format!("label-{order}") })
}

fn main() {
    let ctx = ToolContext::new("run-1");
    let args = json!({"order": "o-1", "speed": "express", "address": {"street": "Main 1", "city": "Berlin"}});
    let call = Ship.prepare(&args, &ctx).unwrap();
    assert_eq!(call.key().unwrap().as_str(), "ship:o-1:express");
    let schema = Ship.definition().input_schema().clone();
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["address", "order", "speed"]);
    assert_eq!(
        schema["$defs"]["Address"]["properties"]["street"]["description"],
        "Street and number."
    );
}
