// A tool must say what a retry does; with no story there is no token to point at but `#[tool]`.
use toolkey::{tool, ToolError};

#[tool(timeout = "2s")]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
