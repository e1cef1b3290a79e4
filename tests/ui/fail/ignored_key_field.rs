use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>:<period>"))]
async fn send_invoice(
    customer: String,
    #[arg(ignore)]
    period: String,
) -> Result<(), ToolError> {
    let _ = (customer, period);
    Ok(())
}

fn main() {}
