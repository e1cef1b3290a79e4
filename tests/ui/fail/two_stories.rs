use toolkey::{tool, ToolError};

#[tool(read_only, natural)]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
