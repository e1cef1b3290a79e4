// Parameter attributes: doc comments, forwarded `#[serde]`/`#[schemars]`, `#[arg(ignore)]`.
use toolkey::{tool, Tool, ToolError};

/// Sends a note.
#[tool(idempotent(key = "note:<customer>"))]
async fn send_note(
    /// Customer ID.
    customer: String,
    /// How loud, 1 to 3.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3))]
    level: u8,
    /// The note's text, as the model words it.
    #[arg(ignore)]
    text: String,
) -> Result<(), ToolError> {
    let _ = (customer, level, text);
    Ok(())
}

fn main() {
    let def = SendNote.definition();
    let schema = def.input_schema();
    assert_eq!(schema["properties"]["customer"]["description"], "Customer ID.");
    assert_eq!(schema["properties"]["level"]["maximum"], 3);
    let required = schema["required"].as_array().unwrap();
    assert!(!required.contains(&serde_json::json!("level")));
}
