use toolkey::{tool, ToolError};

#[tool(read_only)]
async fn lookup<T: Into<String>>(customer: T) -> Result<String, ToolError> {
    Ok(customer.into())
}

fn main() {}
