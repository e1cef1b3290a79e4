//! The executor's behaviour, counted on fake outside systems.
//!
//! One module per behaviour; the context and the invoice arguments they share are here.

mod answers;
mod dropped_callers;
mod failures;
mod place_in_run;
mod recovery;
mod replays;
mod retries;
mod stories;
mod tenants;
mod unknown_answers;

use serde_json::{json, Value};
use toolkey::ToolContext;

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

fn invoice(customer: &str, period: &str, amount: f64, memo: &str) -> Value {
    json!({"customer": customer, "period": period, "amount": amount, "memo": memo})
}
