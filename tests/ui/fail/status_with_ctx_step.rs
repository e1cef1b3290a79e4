use toolkey::{tool, ToolError};

#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>"))]
async fn refund(order: String) -> Result<(), ToolError> {
    let _ = order;
    Ok(())
}

fn main() {}
