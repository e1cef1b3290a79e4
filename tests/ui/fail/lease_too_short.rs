// A lease shorter than three renewal periods (renewals come at most every 10 ms) would lapse
// while its body runs, and another call could take the key over from under it.
use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<customer>"), lease = "20ms")]
async fn send_invoice(customer: String) -> Result<(), ToolError> {
    let _ = customer;
    Ok(())
}

#[tool(idempotent(key = "refund:<order>"), lease = "30ms")]
async fn refund(order: String) -> Result<(), ToolError> {
    let _ = order;
    Ok(())
}

fn main() {}
