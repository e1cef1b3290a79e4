use toolkey::{tool, ToolError};

#[tool(idempotent(key = "event:<payload>"))]
async fn record_event(payload: serde_json::Value) -> Result<(), ToolError> {
    let _ = payload;
    Ok(())
}

fn main() {}
