use toolkey::{tool, ToolError};

#[tool(idempotent(key = "ship:<order>:<items>"))]
async fn ship(order: String, items: Vec<String>) -> Result<(), ToolError> {
    let _ = (order, items);
    Ok(())
}

fn main() {}
