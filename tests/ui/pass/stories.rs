// Each of the four stories, and the annotations it gives the tool.
use toolkey::{tool, Story, Tool, ToolError};

/// Reads a customer's balance.
#[tool(read_only)]
async fn balance(customer: String) -> Result<i64, ToolError> {
    let _ = customer;
    Ok(0)
}

/// Sets a customer's e-mail address.
#[tool(natural)]
async fn set_email(customer: String, email: String) -> Result<(), ToolError> {
    let _ = (customer, email);
    Ok(())
}

/// Sends a message to a person.
#[tool(unkeyed)]
async fn send_message(to: String, text: String) -> Result<(), ToolError> {
    let _ = (to, text);
    Ok(())
}

/// Sends the invoice for one customer and period.
#[tool(idempotent(key = "invoice:<customer>:<period>"))]
async fn send_invoice(customer: String, period: String) -> Result<String, ToolError> {
    Ok(format!("{customer}/{period}"))
}

fn main() {
    let read_only = Balance.definition();
    assert_eq!(read_only.story(), Story::ReadOnly);
    assert!(read_only.annotations().read_only);
    assert!(Balance.status_companion().is_none());

    let natural = SetEmail.definition();
    assert_eq!(natural.story(), Story::Natural);
    assert!(natural.annotations().idempotent && !natural.annotations().destructive);

    let unkeyed = SendMessage.definition();
    assert_eq!(unkeyed.story(), Story::Unkeyed);
    assert!(!unkeyed.annotations().idempotent && unkeyed.annotations().destructive);

    let keyed = SendInvoice.definition();
    assert_eq!(keyed.story(), Story::Idempotent);
    assert!(keyed.annotations().idempotent && keyed.annotations().destructive);
    assert_eq!(keyed.status_tool(), Some("send_invoice_status"));
}
