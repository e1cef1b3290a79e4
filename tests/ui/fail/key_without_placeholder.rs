use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice"))]
async fn send_invoice(customer: String, period: String) -> Result<(), ToolError> {
    let _ = (customer, period);
    Ok(())
}

fn main() {}
