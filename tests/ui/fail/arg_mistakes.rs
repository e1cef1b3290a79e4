use toolkey::{tool, ToolError};

/// Every mistake inside `#[arg(..)]` is reported in one compile.
#[tool(idempotent(key = "order:<order>"))]
async fn ship(
    #[arg(skip, key = 5, ignore)] order: String,
    #[arg(key = "lower")] note: String,
) -> Result<(), ToolError> {
    let _ = (order, note);
    Ok(())
}

fn main() {}
