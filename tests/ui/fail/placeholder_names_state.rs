use toolkey::{tool, State, ToolError};

struct Billing;

#[tool(idempotent(key = "invoice:<billing>:<customer>"))]
async fn send_invoice(billing: State<Billing>, customer: String) -> Result<(), ToolError> {
    let _ = (billing, customer);
    Ok(())
}

fn main() {}
