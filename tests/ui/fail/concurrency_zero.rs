// `concurrency = 0` would let no call run.
use toolkey::{tool, ToolError};

#[tool(read_only, concurrency = 0)]
async fn lookup(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {}
