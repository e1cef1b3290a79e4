use toolkey::{tool, IdempotencyKey, ToolError};

#[tool(idempotent(key = "invoice:<customer>"))]
async fn send_invoice(customer: String, request: IdempotencyKey) -> Result<(), ToolError> {
    let _ = (customer, request);
    Ok(())
}

fn main() {}
