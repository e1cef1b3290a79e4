use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>"))]
async fn send_invoice(
    #[arg(key = "case_insensitive", skip)]
    customer: String,
) -> Result<(), ToolError> {
    let _ = customer;
    Ok(())
}

fn main() {}
