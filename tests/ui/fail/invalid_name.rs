use toolkey::{tool, ToolError};

#[tool(read_only, name = "look up customer")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
