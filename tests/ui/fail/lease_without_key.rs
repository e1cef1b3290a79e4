// `lease` and `retain` describe a key's record: a tool without a key has none.
use toolkey::{tool, ToolError};

#[tool(natural, lease = "1m")]
async fn set_email(customer: String, email: String) -> Result<(), ToolError> {
    let _ = (customer, email);
    Ok(())
}

fn main() {}
