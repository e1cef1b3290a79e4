// Keys built from the run context, alone or beside the call's own fields.
use toolkey::{tool, Tool, ToolContext, ToolError};

/// Refunds whatever this step of the run was about: the run context is the only identity.
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund(order: String) -> Result<(), ToolError> {
    let _ = order;
    Ok(())
}

/// Handles one webhook event for a tenant.
#[tool(idempotent(key = "event:<ctx.tenant>:<ctx.event_id>:<kind>"))]
async fn handle_event(kind: String) -> Result<(), ToolError> {
    let _ = kind;
    Ok(())
}

fn main() {
    let ctx = ToolContext::new("run-7").with_step(4).with_tenant("acme-corp").with_event("evt-1");
    let call = Refund.prepare(&serde_json::json!({"order": "o-1"}), &ctx).unwrap();
    assert_eq!(call.key().unwrap().as_str(), "refund:run-7:4");
    let call = HandleEvent.prepare(&serde_json::json!({"kind": "Paid"}), &ctx).unwrap();
    assert_eq!(call.key().unwrap().as_str(), "event:acme-corp:evt-1:Paid");
    assert_eq!(HandleEvent.definition().status_tool(), Some("handle_event_status"));
}
