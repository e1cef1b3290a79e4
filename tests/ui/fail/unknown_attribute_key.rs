use toolkey::{tool, ToolError};

#[tool(read_only, timeuot = "2s")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
