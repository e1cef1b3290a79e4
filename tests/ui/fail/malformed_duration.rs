use toolkey::{tool, ToolError};

#[tool(read_only, timeout = "2 fortnights")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
