use toolkey::{tool, ToolError};

/// Where a parcel goes.
#[toolkey::data]
struct Address {
    street: String,
    zip_code: String,
}

#[tool(idempotent(key = "ship:<address>"))]
async fn ship(
    #[serde(flatten)]
    address: Address,
) -> Result<(), ToolError> {
    let _ = address;
    Ok(())
}

fn main() {}
