use toolkey::{tool, ToolError};

#[tool(idempotent(key = "<customer>:<period>"))]
async fn send_invoice(customer: String, period: String) -> Result<(), ToolError> {
    let _ = (customer, period);
    Ok(())
}

fn main() {}
