use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>"))]
async fn send_invoice(customer: String, idempotency_key: String) -> Result<(), ToolError> {
    let _ = (customer, idempotency_key);
    Ok(())
}

fn main() {}
