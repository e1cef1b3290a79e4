use toolkey::{tool, ToolError};

/// `#` marks hashed keys and `\` escapes inside values: neither may be literal key text.
#[tool(idempotent(key = "ticket:<project>#<number>"))]
async fn open_ticket(project: String, number: u32) -> Result<(), ToolError> {
    let _ = (project, number);
    Ok(())
}

#[tool(idempotent(key = "path:<a>\\<b>"))]
async fn join(a: String, b: String) -> Result<(), ToolError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
