use toolkey::{tool, ToolError};

#[tool(read_only, retry_limit = "5/10 fortnights")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
