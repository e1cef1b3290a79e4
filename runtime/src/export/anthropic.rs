//! Anthropic tools: `{"name", "description", "input_schema"}`.
//!
//! The Messages API takes JSON Schema as it is, `$defs` and `$ref` included, but its
//! `input_schema` must be an object schema without a top-level `oneOf`, `anyOf` or `allOf`.

use serde_json::{json, Value};

use super::{merge_all_of, resolve, Object};
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
    let mut schema = canonical.clone();
    let defs = schema.clone();
    let Value::Object(root) = &mut schema else {
        return json!({"type": "object"});
    };
    root.shift_remove("$schema");
    if !merge_all_of(root) {
        flatten(root, "allOf", &defs);
    }
    flatten(root, "anyOf", &defs);
    flatten(root, "oneOf", &defs);
    root.entry("type").or_insert_with(|| json!("object"));
    schema
}

/// Lifts the branches of a top-level union into one object schema: their properties united,
/// required only what every branch requires (everything, for `allOf`). The model is told less
/// than the union says; the tool's own argument parsing still refuses what no branch allows.
fn flatten(root: &mut Object, keyword: &str, whole: &Value) {
    let Some(Value::Array(branches)) = root.shift_remove(keyword) else {
        return;
    };
    let mut properties = match root.shift_remove("properties") {
        Some(Value::Object(properties)) => properties,
        _ => Object::new(),
    };
    let mut required: Option<Vec<Value>> = None;
    for branch in &branches {
        let Some(branch) = resolve(branch, whole) else {
            continue;
        };
        if let Some(Value::Object(more)) = branch.get("properties") {
            for (name, schema) in more {
                properties
                    .entry(name.clone())
                    .or_insert_with(|| schema.clone());
            }
        }
        let names: Vec<Value> = branch
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        required = Some(match (required, keyword) {
            (None, _) => names,
            (Some(mut all), "allOf") => {
                for name in names {
                    if !all.contains(&name) {
                        all.push(name);
                    }
                }
                all
            }
            (Some(common), _) => common.into_iter().filter(|n| names.contains(n)).collect(),
        });
    }
    let mut all_required: Vec<Value> = root
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for name in required.unwrap_or_default() {
        if !all_required.contains(&name) {
            all_required.push(name);
        }
    }
    root.insert("properties".into(), Value::Object(properties));
    if !all_required.is_empty() {
        root.insert("required".into(), Value::Array(all_required));
    }
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
