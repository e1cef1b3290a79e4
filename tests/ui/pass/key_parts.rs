// Every kind of key part: strings (case kept, or case-insensitive), integers, bool, char, uuid, unit enums.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolkey::{tool, KeyPart, Tool, ToolContext, ToolError};

#[derive(Serialize, Deserialize, JsonSchema, KeyPart)]
#[serde(rename_all = "snake_case")]
enum Plan {
    Basic,
    ProPlus,
}

/// Books a seat.
#[tool(idempotent(key = "seat:<flight>:<row>:<letter>:<window>:<plan>:<passenger>:<code>"))]
async fn book_seat(
    flight: u32,
    row: i64,
    letter: char,
    window: bool,
    plan: Plan,
    passenger: uuid::Uuid,
    #[arg(key = "case_insensitive")]
    code: String,
    small: u8,
) -> Result<(), ToolError> {
    let _ = (flight, row, letter, window, plan, passenger, code, small);
    Ok(())
}

fn main() {
    let ctx = ToolContext::new("run-1");
    let args = serde_json::json!({
        "flight": 4711,
        "row": -3,
        "letter": "C",
        "window": true,
        "plan": "pro_plus",
        "passenger": "67E55044-10B1-426F-9247-BB680E5FE0C8",
        "code": " AbC ",
        "small": 1,
    });
    let call = BookSeat.prepare(&args, &ctx).unwrap();
    assert_eq!(
        call.key().unwrap().as_str(),
        "seat:4711:-3:C:true:pro_plus:67e55044-10b1-426f-9247-bb680e5fe0c8:abc"
    );
}
