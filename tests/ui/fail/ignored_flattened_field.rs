use toolkey::{tool, ToolError};

/// Free text a retry may reword.
#[toolkey::data]
struct Notes {
    memo: Option<String>,
}

#[tool(idempotent(key = "invoice:<customer>"))]
async fn send_invoice(
    customer: String,
    #[arg(ignore)]
    #[serde(flatten)]
    notes: Notes,
) -> Result<(), ToolError> {
    let _ = (customer, notes);
    Ok(())
}

fn main() {}
