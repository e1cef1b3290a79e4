use toolkey::{tool, ToolError};

#[tool(read_only, concurrency = "4")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
