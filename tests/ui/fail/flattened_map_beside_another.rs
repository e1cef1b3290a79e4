use std::collections::BTreeMap;

use toolkey::{tool, ToolError};

/// Where a refund goes.
#[toolkey::data]
#[serde(tag = "method", rename_all = "snake_case")]
enum RefundTo {
    Card { last4: String },
    Bank { iban: String },
}

#[tool(idempotent(key = "refund:<order_id>"))]
async fn refund(
    order_id: String,
    #[serde(flatten)]
    to: RefundTo,
    #[serde(flatten)]
    labels: BTreeMap<String, String>,
) -> Result<(), ToolError> {
    let _ = (order_id, to, labels);
    Ok(())
}

fn main() {}
