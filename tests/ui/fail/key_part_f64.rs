use toolkey::{tool, ToolError};

#[tool(idempotent(key = "refund:<order>:<amount>"))]
async fn refund(order: String, amount: f64) -> Result<(), ToolError> {
    let _ = (order, amount);
    Ok(())
}

fn main() {}
