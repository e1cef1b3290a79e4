// `crate = "..."` for a renamed dependency: the generated code names `::tk`, not `::toolkey`
// (the macro's own tests check that no `::toolkey` path is left in such an expansion).
extern crate toolkey as tk;

use tk::{tool, Tool, ToolError};

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, tk::KeyPart)]
#[key_part(crate = "::tk")]
#[serde(rename_all = "snake_case")]
enum Plan {
    Basic,
    Pro,
}

/// Moves a customer to a plan.
#[tool(idempotent(key = "plan:<customer>:<plan>"), crate = "::tk")]
async fn change_plan(customer: String, plan: Plan) -> Result<(), ToolError> {
    let _ = (customer, plan);
    Ok(())
}

/// Reads a customer's plan.
#[tk::tool(read_only, crate = "::tk")]
async fn plan_of(customer: String) -> Result<String, ToolError> {
    Ok(customer)
}

fn main() {
    assert_eq!(ChangePlan.definition().name(), "change_plan");
    assert_eq!(PlanOf.definition().name(), "plan_of");
    let _ = Plan::Basic;
    let _ = Plan::Pro;
}
