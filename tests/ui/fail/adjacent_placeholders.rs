// "<a><b>" would let "ab"+"c" and "a"+"bc" share a key.
use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer><period>"))]
async fn send_invoice(customer: String, period: String) -> Result<(), ToolError> {
    let _ = (customer, period);
    Ok(())
}

fn main() {}
