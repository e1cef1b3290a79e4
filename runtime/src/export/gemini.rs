//! Gemini function declarations: `{"name", "description", "parameters"}`.
//!
//! Gemini's `parameters` is a subset of the OpenAPI 3.0 schema object: no `$ref` or `$defs`,
//! nullability as `nullable: true` instead of a union with `null`, `anyOf` but no `oneOf` or
//! `allOf`, string `enum`s, and none of `$schema`, `title`, `format`, `$comment`,
//! `additionalProperties` or `const`.

use serde_json::{json, Value};

use super::{
    for_each_child_mut, inline_refs, is_null_schema, merge_all_of, without_top_level_unions,
    Inline, Object,
};
use crate::ToolDefinition;

/// The keywords Gemini's schema object takes (from the OpenAPI 3.0 subset it supports).
pub(crate) const KEYWORDS: &[&str] = &[
    "type",
    "nullable",
    "description",
    "enum",
    "properties",
    "required",
    "items",
    "anyOf",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minProperties",
    "maxProperties",
    "default",
];

impl ToolDefinition {
    /// The tool as a Gemini function declaration, for a request's
    /// `tools: [{"functionDeclarations": [..]}]`: `{"name", "description", "parameters"}`.
    ///
    /// A tool without parameters declares none (Gemini refuses an object schema with no
    /// properties). Recursive types are cut where they recur, to `{"type": "object"}`.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{Story, ToolDefinition};
    ///
    /// let schema = json!({
    ///     "$schema": "https://json-schema.org/draft/2020-12/schema",
    ///     "type": "object",
    ///     "properties": {"days": {"type": ["integer", "null"], "format": "uint8"}},
    ///     "additionalProperties": false
    /// });
    /// let def = ToolDefinition::new("forecast", "The weather ahead.", schema, Story::ReadOnly);
    /// assert_eq!(
    ///     def.to_gemini()["parameters"],
    ///     json!({"type": "object", "properties": {"days": {"type": "integer", "nullable": true}}})
    /// );
    /// ```
    pub fn to_gemini(&self) -> Value {
        let mut declaration = json!({"name": self.name, "description": self.description});
        if let Some(parameters) = parameters(&self.input_schema) {
            declaration["parameters"] = parameters;
        }
        declaration
    }
}

/// The canonical schema in Gemini's dialect, or `None` when the tool takes no parameters.
/// A top-level union (a flattened enum's branches) is lifted into one object first, as for
/// OpenAI and Anthropic: the model fills one set of fields, and the tool refuses a mix.
fn parameters(canonical: &Value) -> Option<Value> {
    let mut schema = without_top_level_unions(canonical);
    inline_refs(&mut schema, Inline::All);
    convert(&mut schema);
    let empty = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_none_or(Object::is_empty);
    (!empty).then_some(schema)
}

fn convert(node: &mut Value) {
    // `true` accepts anything; OpenAPI 3.0 says that with an empty schema.
    let Value::Object(map) = node else {
        *node = json!({});
        return;
    };
    let mut nullable = lift_null_branches(map);
    if let Some(one_of) = map.shift_remove("oneOf") {
        map.entry("anyOf").or_insert(one_of);
    }
    merge_all_of(map);
    if let Some(value) = map.shift_remove("const") {
        map.entry("enum").or_insert_with(|| json!([value]));
    }
    if let Some(Value::Array(types)) = map.get_mut("type") {
        let before = types.len();
        types.retain(|t| t != "null");
        nullable |= types.len() < before;
        match types.len() {
            0 => {
                map.shift_remove("type");
            }
            1 => {
                let only = types.remove(0);
                map.insert("type".into(), only);
            }
            _ => {
                let branches: Vec<Value> = types.iter().map(|t| json!({"type": t})).collect();
                map.shift_remove("type");
                map.insert("anyOf".into(), Value::Array(branches));
            }
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        let before = values.len();
        values.retain(|v| !v.is_null());
        nullable |= values.len() < before;
        if values.iter().any(|v| !v.is_string()) {
            let listed: Vec<String> = values.iter().map(Value::to_string).collect();
            append_description(map, &format!("One of: {}.", listed.join(", ")));
            map.shift_remove("enum");
        }
    }
    for_each_child_mut(map, |_, child| convert(child));
    collapse_enum_branches(map);
    if nullable {
        map.insert("nullable".into(), Value::Bool(true));
    }
    map.retain(|keyword, _| KEYWORDS.contains(&keyword.as_str()));
    if map
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(Object::is_empty)
    {
        map.shift_remove("properties");
    }
    if map
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        map.shift_remove("required");
    }
}

/// Takes `{"type": "null"}` out of `anyOf`/`oneOf`, merging a single remaining branch into the
/// schema itself (whose own keywords, such as the field's description, win). True when a null
/// branch was found: the schema is then `nullable`.
fn lift_null_branches(map: &mut Object) -> bool {
    let mut nullable = false;
    loop {
        let mut merged = false;
        for keyword in ["anyOf", "oneOf"] {
            let Some(Value::Array(branches)) = map.get_mut(keyword) else {
                continue;
            };
            let before = branches.len();
            branches.retain(|b| !is_null_schema(b));
            nullable |= branches.len() < before;
            if branches.len() == 1 && before > 1 {
                let Some(Value::Object(only)) = branches.pop() else {
                    continue;
                };
                map.shift_remove(keyword);
                for (k, v) in only {
                    map.entry(k).or_insert(v);
                }
                merged = true;
            }
        }
        if !merged {
            return nullable;
        }
    }
}

/// `anyOf` branches that are each one string value (a unit enum whose variants have doc
/// comments) become one string `enum`, the variants' descriptions listed in the description.
fn collapse_enum_branches(map: &mut Object) {
    let Some(Value::Array(branches)) = map.get("anyOf") else {
        return;
    };
    let mut values = Vec::new();
    let mut notes = Vec::new();
    for branch in branches {
        let Some(branch) = branch.as_object() else {
            return;
        };
        let only_value = branch
            .keys()
            .all(|k| ["type", "enum", "description"].contains(&k.as_str()));
        let value = match branch
            .get("enum")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([Value::String(value)])
                if only_value && branch.get("type").is_none_or(|t| t == "string") =>
            {
                value
            }
            _ => return,
        };
        if let Some(description) = branch.get("description").and_then(Value::as_str) {
            notes.push(format!("`{value}`: {description}"));
        }
        values.push(json!(value));
    }
    map.shift_remove("anyOf");
    map.insert("type".into(), json!("string"));
    map.insert("enum".into(), Value::Array(values));
    if !notes.is_empty() {
        append_description(map, &notes.join(" "));
    }
}

fn append_description(map: &mut Object, note: &str) {
    let description = match map.get("description").and_then(Value::as_str) {
        Some(text) if !text.is_empty() => format!("{text} {note}"),
        _ => note.to_string(),
    };
    map.insert("description".into(), Value::String(description));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_inlined_nulls_lifted_and_enums_collapsed() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Args",
            "type": "object",
            "properties": {
                "speed": {"$ref": "#/$defs/Speed", "description": "How fast."},
                "notify": {"anyOf": [{"$ref": "#/$defs/Notify"}, {"type": "null"}], "description": "Whom."},
                "count": {"type": "integer", "format": "uint32", "minimum": 0}
            },
            "required": ["speed"],
            "additionalProperties": false,
            "$defs": {
                "Speed": {"oneOf": [
                    {"const": "slow", "type": "string", "description": "Days."},
                    {"const": "fast", "type": "string", "description": "Hours."}
                ]},
                "Notify": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"], "additionalProperties": false}
            }
        });
        assert_eq!(
            parameters(&schema).unwrap(),
            json!({
                "type": "object",
                "properties": {
                    "speed": {"type": "string", "enum": ["slow", "fast"], "description": "How fast. `slow`: Days. `fast`: Hours."},
                    "notify": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"], "description": "Whom.", "nullable": true},
                    "count": {"type": "integer", "minimum": 0}
                },
                "required": ["speed"]
            })
        );
    }

    #[test]
    fn no_parameters_declares_none() {
        let schema = json!({"type": "object", "additionalProperties": false});
        let def = ToolDefinition::new("ping", "Ping.", schema, crate::Story::ReadOnly);
        assert_eq!(
            def.to_gemini(),
            json!({"name": "ping", "description": "Ping."})
        );
    }
}
