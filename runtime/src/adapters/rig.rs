//! Toolbox tools as [rig](https://crates.io/crates/rig-core)'s native tools (feature `rig`).
//!
//! [`tools`] gives each tool of a toolbox, status companions included, as a rig
//! [`DynamicTool`], for `AgentBuilder::dynamic_tools` (rig-agent) or any other rig registry.
//! A rig agent that calls one runs it through [`Toolbox::call`]: the key is enforced, a retry
//! is answered from the record, and the model reads the same text as through
//! [`providers::openai`](crate::providers::openai): the result as JSON, a replay wrapped with a
//! note that it was not done again. An error comes back as rig's tool error — its kind, code
//! and `retryable` set from the [`ToolError`] — whose text for the model is toolkey's
//! `{"error": {"code", "message", "retryable", "suggestion"}}`.
//!
//! # The run
//!
//! The run a call belongs to comes from the program, never from the model: hand each agent
//! run toolkey's [`ToolContext`] as rig's tool context, made by [`tool_context`] (rig-agent:
//! `agent.prompt(..).tool_context(toolkey::adapters::rig::tool_context(&ctx))`). Its run id,
//! tenant and event id reach the tools; a call made without one is answered with
//! `MISSING_CONTEXT` and runs nothing.
//!
//! rig gives a tool neither its call's id nor its position in the run, so the step of a call
//! is not known: a key that uses `<ctx.step>` answers `MISSING_CONTEXT` here. Name the action
//! by its business identity instead (`"invoice:<customer>:<period>"`), which is what makes the
//! model's own retry a replay anyway: a retry is a new call, with a new id and a new position.
//!
//! ```
//! use rig_core::tool::ToolOutput;
//! use toolkey::{tool, Toolbox, ToolContext, ToolError};
//!
//! /// Today's exchange rate from one currency to another.
//! #[tool(read_only)]
//! async fn rate(from: String, to: String) -> Result<f64, ToolError> {
//!     Ok(if from == to { 1.0 } else { 1.08 })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let toolbox = Toolbox::builder().tool(Rate).build().unwrap();
//! // For rig-agent: `AgentBuilder::new(model).dynamic_tools(tools).build()`.
//! let tools = toolkey::adapters::rig::tools(&toolbox);
//! assert_eq!(tools[0].name().as_str(), "rate");
//!
//! // Each run carries its toolkey context in rig's.
//! let mut context = toolkey::adapters::rig::tool_context(&ToolContext::new("run-7"));
//! let arguments = serde_json::json!({"from": "EUR", "to": "USD"});
//! let output = tools[0].execute_with(&mut context, arguments).await.unwrap();
//! assert_eq!(output, ToolOutput::text("1.08"));
//! # }
//! ```

use rig_core::message::ToolName;
use rig_core::tool::{
    ContextValue, DynamicTool, ToolContext as RigContext, ToolErrorKind, ToolExecutionError,
    ToolOutput as RigOutput,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::providers::{content, run};
use crate::{ErrorCode, ToolContext, ToolError, Toolbox};

/// The toolbox's tools, status companions included, as rig tools: each with the tool's name,
/// description and canonical argument schema, running through [`Toolbox::call`] with the run
/// that rig's tool context carries (see [The run](self#the-run)).
///
/// ```
/// use toolkey::{tool, Toolbox, ToolError};
///
/// /// Create and send the invoice for one customer and billing period.
/// #[tool(idempotent(key = "invoice:<customer>:<period>"))]
/// async fn send_invoice(customer: String, period: String) -> Result<String, ToolError> {
///     Ok(format!("inv-{customer}-{period}"))
/// }
///
/// let toolbox = Toolbox::builder().tool(SendInvoice).build().unwrap();
/// let tools = toolkey::adapters::rig::tools(&toolbox);
/// let names: Vec<&str> = tools.iter().map(|tool| tool.name().as_str()).collect();
/// assert_eq!(names, ["send_invoice_status", "send_invoice"]);
/// assert_eq!(tools[1].definition().parameters["required"], serde_json::json!(["customer", "period"]));
/// ```
pub fn tools(toolbox: &Toolbox) -> Vec<DynamicTool> {
    toolbox
        .definitions()
        .iter()
        .filter_map(|definition| {
            // Never fails: toolkey's tool names are never empty.
            let name = ToolName::new(definition.name()).ok()?;
            let mut parameters = definition.input_schema().clone();
            if let Value::Object(schema) = &mut parameters {
                schema.shift_remove("$schema");
            }
            let toolbox = toolbox.clone();
            let tool = definition.name().to_string();
            Some(DynamicTool::new_with_context(
                name,
                definition.description(),
                parameters,
                move |context: &mut RigContext, arguments: Value| {
                    let toolbox = toolbox.clone();
                    let tool = tool.clone();
                    let run_context = run_of(context);
                    Box::pin(async move {
                        let result = match run_context {
                            Ok(ctx) => run(&toolbox, Some(&tool), Some(&arguments), &ctx).await,
                            Err(err) => Err(err),
                        };
                        let (text, _) = content(&result);
                        match result {
                            Ok(_) => Ok(RigOutput::text(text)),
                            Err(err) => Err(execution_error(&err, text)),
                        }
                    })
                },
            ))
        })
        .collect()
}

/// Rig's tool context for one agent run: carries the run id, tenant and event id of `ctx` to
/// the tools [`tools`] makes. Its step is not carried (see [The run](self#the-run)).
///
/// Values of the program's own can be inserted beside it.
///
/// ```
/// use toolkey::ToolContext;
///
/// let ctx = ToolContext::new("run-7").with_tenant("acme-corp");
/// let context = toolkey::adapters::rig::tool_context(&ctx);
/// assert!(!context.is_empty());
/// ```
pub fn tool_context(ctx: &ToolContext) -> RigContext {
    let mut context = RigContext::new();
    let run = Run {
        run_id: ctx.run_id().to_string(),
        tenant: ctx.tenant().map(str::to_string),
        event_id: ctx.event_id().map(str::to_string),
    };
    // Strings and options of strings always encode.
    let _ = context.insert(run);
    context
}

/// toolkey's run, as rig's tool context holds it.
#[derive(Serialize, Deserialize)]
struct Run {
    run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event_id: Option<String>,
}

impl ContextValue for Run {
    const KEY: &'static str = "toolkey.run";
}

/// The run a call belongs to, or the error the model reads when the program gave none.
fn run_of(context: &RigContext) -> Result<ToolContext, ToolError> {
    match context.get::<Run>() {
        Ok(Some(run)) => {
            let mut ctx = ToolContext::new(run.run_id);
            if let Some(tenant) = run.tenant {
                ctx = ctx.with_tenant(tenant);
            }
            if let Some(event_id) = run.event_id {
                ctx = ctx.with_event(event_id);
            }
            Ok(ctx)
        }
        Ok(None) | Err(_) => Err(crate::texts::no_run_context()),
    }
}

/// Rig's form of a toolkey error: the kind rig's hooks and telemetry sort by, the code and
/// `retryable` as toolkey set them, and toolkey's error JSON as the text the model reads.
fn execution_error(err: &ToolError, text: String) -> ToolExecutionError {
    let kind = match err.error_code() {
        Some(ErrorCode::InvalidArguments) => ToolErrorKind::InvalidArgs,
        Some(ErrorCode::UnknownTool) => ToolErrorKind::NotFound,
        Some(ErrorCode::Timeout) => ToolErrorKind::Timeout,
        Some(ErrorCode::ApprovalRequired) => ToolErrorKind::PermissionDenied,
        _ => ToolErrorKind::Other,
    };
    ToolExecutionError::new(kind, err.message())
        .with_code(err.code())
        .with_retryable(err.is_retryable())
        .with_model_output(RigOutput::text(text))
}
