// A retry limit is failures and a window: "5/10m", or "off".
use toolkey::{tool, ToolError};

#[tool(read_only, retry_limit = "5 per 10m")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
