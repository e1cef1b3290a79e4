use toolkey::{tool, ToolError};

/// Key parts keep their case by default: `key = "exact"` says nothing.
#[tool(idempotent(key = "refund:<charge_id>"))]
async fn refund(#[arg(key = "exact")] charge_id: String) -> Result<(), ToolError> {
    let _ = charge_id;
    Ok(())
}

fn main() {}
