use std::collections::HashMap;

use toolkey::{tool, ToolError};

#[tool(idempotent(key = "tag:<order>:<labels>"))]
async fn tag(order: String, labels: HashMap<String, String>) -> Result<(), ToolError> {
    let _ = (order, labels);
    Ok(())
}

fn main() {}
