use toolkey::{tool, ToolError};

#[tool(read_only, timeout = "2s", timeout = "5s")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
