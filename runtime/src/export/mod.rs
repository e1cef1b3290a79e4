//! Schema profiles: the one canonical JSON Schema (2020-12) of a tool, rewritten into the dialect
//! each LLM API accepts.
//!
//! | method | shape | schema rules |
//! |---|---|---|
//! | [`ToolDefinition::to_openai`] | Chat Completions `{"type": "function", "function": {..}}` | strict mode |
//! | [`ToolDefinition::to_openai_responses`] | Responses `{"type": "function", "name", ..}` | strict mode |
//! | [`ToolDefinition::to_anthropic`] | `{"name", "description", "input_schema"}` | no top-level `oneOf`/`anyOf`/`allOf` |
//! | [`ToolDefinition::to_gemini`] | a function declaration | OpenAPI 3.0 subset, no `$ref` |
//! | [`ToolDefinition::to_mcp`] | an MCP `Tool` | optional fields without `null` |
//!
//! Every profile is a pure function over [`serde_json::Value`]: it knows nothing of stores or the
//! executor. The exports only ever loosen what the model is told in ways the tool's own argument
//! parsing still enforces (a dropped `maxLength`, say); they never describe a call the tool
//! would refuse as valid in the other direction.
//!
//! [`ToolDefinition::to_openai`]: crate::ToolDefinition::to_openai
//! [`ToolDefinition::to_openai_responses`]: crate::ToolDefinition::to_openai_responses
//! [`ToolDefinition::to_anthropic`]: crate::ToolDefinition::to_anthropic
//! [`ToolDefinition::to_gemini`]: crate::ToolDefinition::to_gemini
//! [`ToolDefinition::to_mcp`]: crate::ToolDefinition::to_mcp

mod anthropic;
mod gemini;
mod mcp;
pub(crate) mod openai;

/// What the profiles share with argument parsing: the schema walkers.
use crate::schema::walk::{
    accepts_null, for_each_child_mut, inline_refs, is_null_schema, is_object, lift, merge_all_of,
    prune_defs, required, resolve, strip_null, without_top_level_unions, Inline, Object,
};
