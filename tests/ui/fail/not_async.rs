use toolkey::{tool, ToolError};

#[tool(read_only)]
fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
