use toolkey::tool;

#[derive(Debug)]
struct LedgerClosed;

#[tool(read_only)]
async fn lookup(customer: String) -> Result<String, LedgerClosed> {
    Ok(customer)
}

fn main() {}
