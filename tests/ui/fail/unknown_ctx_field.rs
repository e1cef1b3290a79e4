use toolkey::{tool, ToolError};

#[tool(idempotent(key = "refund:<ctx.run>:<order>"))]
async fn refund(order: String) -> Result<(), ToolError> {
    let _ = order;
    Ok(())
}

fn main() {}
