// Accepted signatures: no parameters, injected parameters in any order, a custom error type,
// pub and private fns; and the fn stays callable as written.
use std::sync::Arc;

use toolkey::{tool, State, Tool, ToolContext, ToolError};

pub struct Clock(pub u64);
pub struct Names {
    pub known: Vec<String>,
}

/// What time it is.
#[tool(read_only)]
pub async fn now() -> Result<u64, ToolError> {
    Ok(42)
}

/// The tool's own error, turned into a `ToolError` for the model.
#[derive(Debug)]
pub enum LedgerError {
    Closed,
}

impl From<LedgerError> for ToolError {
    fn from(err: LedgerError) -> ToolError {
        match err {
            LedgerError::Closed => ToolError::new("LEDGER_CLOSED", "the ledger is closed").with_retryable(false),
        }
    }
}

/// Books an entry.
#[tool(idempotent(key = "entry:<id>"))]
async fn book(ctx: &ToolContext, id: String, clock: State<Clock>) -> Result<(), LedgerError> {
    let _ = (ctx, id, clock.0);
    Err(LedgerError::Closed)
}

/// Greets someone by name, if known.
#[tool(read_only)]
pub(crate) async fn greet(names: State<Names>, who: String, ctx: &ToolContext, clock: State<Clock>) -> Result<String, ToolError> {
    let _ = (ctx.run_id(), clock.0);
    Ok(if names.known.contains(&who) { format!("hello {who}") } else { "who?".into() })
}

/// Only the context.
#[tool(natural)]
async fn touch(ctx: &ToolContext) -> Result<String, ToolError> {
    Ok(ctx.run_id().to_string())
}

fn main() {
    let schema = Now.definition().input_schema().clone();
    assert!(schema["properties"].as_object().is_none_or(|p| p.is_empty()));
    let schema = Greet.definition().input_schema().clone();
    assert_eq!(schema["properties"].as_object().unwrap().len(), 1);
    assert_eq!(Touch.definition().input_schema()["properties"].as_object().map_or(0, |p| p.len()), 0);

    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let ctx = ToolContext::new("run-1");
        assert_eq!(now().await.unwrap(), 42);
        let names = State(Arc::new(Names { known: vec!["ada".into()] }));
        let clock = State(Arc::new(Clock(0)));
        assert_eq!(greet(names, "ada".into(), &ctx, clock.clone()).await.unwrap(), "hello ada");
        assert!(matches!(book(&ctx, "e-1".into(), clock).await, Err(LedgerError::Closed)));
        assert_eq!(touch(&ctx).await.unwrap(), "run-1");
    });
}
