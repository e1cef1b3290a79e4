use toolkey::{tool, ToolError};

#[tool(read_only)]
async fn lookup(customer: String) -> String {
    customer
}

fn main() {
    let _: Option<ToolError> = None;
}
