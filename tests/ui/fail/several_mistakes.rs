// Every mistake in one fn is reported in one compile, each at its own token.
use toolkey::{tool, ToolError};

#[tool(idempotent(key = "invoice:<custmer>:<amount>"), timeout = "soon", colour = "red")]
fn send_invoice<T>(
    customer: String,
    amount: f64,
    idempotency_key: String,
    extra: T,
) -> Result<(), ToolError> {
    let _ = (customer, amount, idempotency_key, extra);
    Ok(())
}

fn main() {}
