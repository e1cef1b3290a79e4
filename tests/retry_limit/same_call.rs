//! What makes two calls one: the arguments as the tool receives them, not the JSON as sent.

use serde_json::json;
use toolkey::{tool, State, ToolError, Toolbox};

use super::{code, ctx, Gateway, ScriptedModel};

/// Convert an amount at the market's rate. The market is down.
#[tool(read_only, retry_limit = "3/10m")]
async fn convert(
    gateway: State<Gateway>,
    /// The currency pair, for example "EURUSD".
    pair: String,
    /// The amount to convert.
    amount: f64,
    /// Skip the cached rate.
    #[serde(default)]
    fresh: bool,
    /// The oldest rate accepted, in seconds.
    max_age: Option<u32>,
    /// Why the model asks: free text it may reword.
    #[arg(ignore)]
    #[serde(default)]
    reason: String,
) -> Result<String, ToolError> {
    let _ = (amount, fresh, max_age, reason);
    gateway.attempt(format!("convert:{pair}"))?;
    Ok(format!("{pair}=1.08"))
}

/// A model that keeps asking the same conversion, spelling it another way each time: a default
/// spelled out, `5` as `5.0`, fields in another order, its free-text reason reworded, `null` for
/// an absent `Option`. All one call, as the tool receives it: three attempts under a limit of
/// three, then `RETRY_LIMIT` for every spelling. Counted by the JSON as sent, each spelling had
/// an allowance of its own.
#[tokio::test]
async fn a_call_without_a_key_is_counted_by_what_the_tool_receives() {
    let gateway = Gateway::down();
    let toolbox = Toolbox::builder()
        .shared_state(gateway.clone())
        .tool(Convert)
        .build()
        .unwrap();
    let ctx = ctx("shop");
    let spellings = [
        json!({"pair": "EURUSD", "amount": 5}),
        json!({"pair": "EURUSD", "amount": 5, "fresh": false}),
        json!({"amount": 5.0, "pair": "EURUSD"}),
        json!({"pair": "EURUSD", "amount": 5, "reason": "the user asked"}),
        json!({"pair": "EURUSD", "amount": 5, "max_age": null}),
        json!({"reason": "asking again", "max_age": null, "fresh": false, "amount": 5.0, "pair": "EURUSD"}),
    ];
    let mut answers = Vec::new();
    for round in 0..3 {
        for args in &spellings {
            let answer = toolbox.call("convert", args.clone(), &ctx).await;
            answers.push((round, code(&answer)));
        }
    }
    assert_eq!(gateway.attempts("convert:EURUSD"), 3, "{answers:?}");
    let codes: Vec<&str> = answers.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(codes[..2], ["GATEWAY_BUSY", "GATEWAY_BUSY"], "{codes:?}");
    assert!(codes[2..].iter().all(|c| *c == "RETRY_LIMIT"), "{codes:?}");
    // What the tool receives differently is another call: it still runs.
    for other in [
        json!({"pair": "EURUSD", "amount": 5, "fresh": true}),
        json!({"pair": "EURUSD", "amount": 6}),
        json!({"pair": "EURUSD", "amount": 5, "max_age": 60}),
    ] {
        let answer = toolbox.call("convert", other.clone(), &ctx).await;
        assert_eq!(code(&answer), "GATEWAY_BUSY", "{other}");
    }
    assert_eq!(gateway.attempts("convert:EURUSD"), 6);
    // A success under one spelling clears the count of every spelling.
    gateway.set_up(true);
    let fresh = json!({"pair": "EURUSD", "amount": 5, "fresh": true});
    assert_eq!(
        code(&toolbox.call("convert", fresh.clone(), &ctx).await),
        "ok"
    );
    gateway.set_up(false);
    let respelled = json!({"fresh": true, "pair": "EURUSD", "amount": 5.0, "max_age": null});
    let again = ScriptedModel::repeat(&toolbox, "convert", respelled, &ctx, 5).await;
    assert_eq!(again.first("RETRY_LIMIT"), Some(2), "{:?}", again.answers);
    assert_eq!(gateway.attempts("convert:EURUSD"), 10);
}
