// A free-form struct has no canonical text form: the runtime's `KeyPart` bound says so.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolkey::{tool, ToolError};

#[derive(Serialize, Deserialize, JsonSchema)]
struct Address {
    street: String,
    city: String,
}

#[tool(idempotent(key = "ship:<order>:<address>"))]
async fn ship(order: String, address: Address) -> Result<(), ToolError> {
    let _ = (order, address);
    Ok(())
}

fn main() {}
