//! Anthropic tools: `{"name", "description", "input_schema"}`.
//!
//! The Messages API takes JSON Schema as it is, `$defs` and `$ref` included, but its
//! `input_schema` must be an object schema without a top-level `oneOf`, `anyOf` or `allOf`.

use serde_json::{json, Value};

use super::without_top_level_unions;
use crate::ToolDefinition;

impl ToolDefinition {
    /// The tool for Anthropic's Messages API, for the request's `tools` list:
    /// `{"name", "description", "input_schema"}`.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{Story, ToolDefinition};
    ///
    /// let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    /// let def = ToolDefinition::new("forecast", "The weather ahead.", schema.clone(), Story::ReadOnly);
    /// assert_eq!(def.to_anthropic(), json!({"name": "forecast", "description": "The weather ahead.", "input_schema": schema}));
    /// ```
    pub fn to_anthropic(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "input_schema": input_schema(&self.input_schema),
        })
    }
}

/// The canonical schema without `$schema`, its top level an object schema.
fn input_schema(canonical: &Value) -> Value {
    without_top_level_unions(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_unions_become_one_object() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "oneOf": [
                {"$ref": "#/$defs/ByName"},
                {"type": "object", "properties": {"id": {"type": "integer"}, "kind": {"type": "string"}}, "required": ["id", "kind"]}
            ],
            "$defs": {"ByName": {"type": "object", "properties": {"name": {"type": "string"}, "kind": {"type": "string"}}, "required": ["name", "kind"]}}
        });
        let out = input_schema(&schema);
        assert!(out.get("oneOf").is_none() && out.get("$schema").is_none());
        assert_eq!(out["type"], "object");
        let mut names: Vec<&String> = out["properties"].as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(names, ["id", "kind", "name"]);
        assert_eq!(out["required"], json!(["kind"]));
    }
}
