use toolkey::{tool, ToolError};

#[tool(idempotent(status = "invoice_status"))]
async fn send_invoice(customer: String) -> Result<(), ToolError> {
    let _ = customer;
    Ok(())
}

fn main() {}
