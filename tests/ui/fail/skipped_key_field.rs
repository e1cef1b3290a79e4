use toolkey::{tool, ToolError};

/// serde never reads `customer`: every refund would have the same key.
#[tool(idempotent(key = "refund:<customer>"))]
async fn refund(
    #[serde(skip)]
    customer: String,
    cents: i64,
) -> Result<(), ToolError> {
    let _ = (customer, cents);
    Ok(())
}

/// The same with `skip_deserializing`.
#[tool(idempotent(key = "refund-read:<customer>"))]
async fn refund_read(
    #[serde(skip_deserializing, default)]
    customer: String,
    cents: i64,
) -> Result<(), ToolError> {
    let _ = (customer, cents);
    Ok(())
}

fn main() {}
