use toolkey::{tool, ToolError};

struct Billing;

impl Billing {
    #[tool(read_only)]
    async fn lookup(&self, customer: String) -> Result<String, ToolError> {
        Ok(customer)
    }
}

fn main() {}
