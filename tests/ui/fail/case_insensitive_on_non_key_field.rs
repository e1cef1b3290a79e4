use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>"))]
async fn send_invoice(
    customer: String,
    #[arg(key = "case_insensitive")]
    memo: String,
) -> Result<(), ToolError> {
    let _ = (customer, memo);
    Ok(())
}

fn main() {}
