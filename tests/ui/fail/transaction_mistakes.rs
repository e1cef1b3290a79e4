use rusqlite::Transaction;
use toolkey::{tool, ToolError};

/// A transaction whose crate the path does not say.
#[tool(idempotent(key = "seat:<seat>"))]
async fn bare(tx: &Transaction<'_>, seat: String) -> Result<(), ToolError> {
    let _ = (tx, seat);
    Ok(())
}

/// A transaction in a tool without a key: nothing to commit it with.
#[tool(natural)]
async fn without_key(tx: &rusqlite::Transaction<'_>, seat: String) -> Result<(), ToolError> {
    let _ = (tx, seat);
    Ok(())
}

/// A recover hook beside a transaction.
#[tool(idempotent(key = "seat:<seat>", recover = find_seat))]
async fn with_hook(tx: &rusqlite::Transaction<'_>, seat: String) -> Result<(), ToolError> {
    let _ = (tx, seat);
    Ok(())
}

async fn find_seat(seat: String) -> Result<Option<()>, ToolError> {
    let _ = seat;
    Ok(None)
}

/// Two transactions.
#[tool(idempotent(key = "seat:<seat>"))]
async fn twice(
    tx: &rusqlite::Transaction<'_>,
    again: &rusqlite::Transaction<'_>,
    seat: String,
) -> Result<(), ToolError> {
    let _ = (tx, again, seat);
    Ok(())
}

fn main() {}
