// A limit of zero failures would refuse every call: "off" is the way to say "no limit".
use toolkey::{tool, ToolError};

#[tool(idempotent(key = "charge:<order>"), retry_limit = "0/10m")]
async fn charge(order: String, cents: i64) -> Result<i64, ToolError> {
    let _ = order;
    Ok(cents)
}

fn main() {}
