// A value of the wrong kind is reported at the value, and parsing goes on to the next key.
use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>", hash = "yes"), timeout = 2, name = send)]
async fn send_invoice(customer: String) -> Result<(), ToolError> {
    let _ = customer;
    Ok(())
}

fn main() {}
