//! MCP tools, as `tools/list` returns them.
//!
//! MCP schemas are JSON Schema 2020-12 (the default dialect when `$schema` is absent), so the
//! canonical schema mostly stands. Optional fields lose their union with `null` (they are
//! optional through `required` already; some clients refuse `["string", "null"]`), and an
//! `outputSchema` is given only for results whose schema is an object, as MCP requires.

use serde_json::{json, Map, Value};

use super::{for_each_child_mut, is_object, required, strip_null};
use crate::ToolDefinition;

impl ToolDefinition {
    /// The tool as MCP's `tools/list` returns it: `{"name", "title"?, "description",
    /// "inputSchema", "outputSchema"?, "annotations"}`, the annotations from the story.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{Story, ToolDefinition};
    ///
    /// let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    /// let def = ToolDefinition::new("forecast", "The weather ahead.", schema, Story::ReadOnly);
    /// let tool = def.to_mcp();
    /// assert_eq!(tool["annotations"]["readOnlyHint"], true);
    /// assert!(tool.get("outputSchema").is_none());
    /// ```
    pub fn to_mcp(&self) -> Value {
        let mut tool = Map::new();
        tool.insert("name".into(), json!(self.name));
        if let Some(title) = &self.title {
            tool.insert("title".into(), json!(title));
        }
        tool.insert("description".into(), json!(self.description));
        tool.insert("inputSchema".into(), schema(&self.input_schema));
        if let Some(output) = self
            .output_schema
            .as_ref()
            .filter(|s| s.get("type") == Some(&json!("object")))
        {
            tool.insert("outputSchema".into(), schema(output));
        }
        let a = self.annotations;
        tool.insert(
            "annotations".into(),
            json!({
                "readOnlyHint": a.read_only,
                "destructiveHint": a.destructive,
                "idempotentHint": a.idempotent,
                "openWorldHint": a.open_world,
            }),
        );
        Value::Object(tool)
    }
}

/// The canonical schema without `$schema`, optional properties without their `null`.
fn schema(canonical: &Value) -> Value {
    let mut schema = canonical.clone();
    if let Value::Object(map) = &mut schema {
        map.shift_remove("$schema");
    }
    optional_without_null(&mut schema);
    schema
}

fn optional_without_null(node: &mut Value) {
    let Value::Object(map) = node else { return };
    if is_object(map) {
        let required = required(map);
        if let Some(Value::Object(properties)) = map.get_mut("properties") {
            for (name, property) in properties.iter_mut() {
                if !required.contains(name) {
                    strip_null(property);
                }
            }
        }
    }
    for_each_child_mut(map, |_, child| optional_without_null(child));
}
