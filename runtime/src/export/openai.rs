//! OpenAI function tools, Chat Completions and Responses forms, with strict-mode schemas.
//!
//! Strict mode (structured outputs) accepts a subset of JSON Schema: every object closed with
//! `additionalProperties: false`, every property listed in `required` (an optional one is a union
//! with `null`), `anyOf` but no `oneOf`/`allOf`, no `$ref` with sibling keywords, a short list of
//! `format`s, and no `default`. A schema that needs more than that (a map, a tuple, an arbitrary
//! JSON value) is exported as it is with `"strict": false`, which OpenAI accepts too.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::{
    accepts_null, for_each_child_mut, inline_refs, is_object, merge_all_of, prune_defs, required,
    resolve, without_top_level_unions, Inline, Object,
};
use crate::ToolDefinition;

/// The keywords strict mode accepts.
pub(crate) const KEYWORDS: &[&str] = &[
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

/// The string formats strict mode accepts.
pub(crate) const FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Keywords strict mode cannot express: a schema using one is exported with `"strict": false`.
const NOT_STRICT: &[&str] = &[
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "prefixItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
];

impl ToolDefinition {
    /// The tool for OpenAI's Chat Completions API, for the request's `tools` list:
    /// `{"type": "function", "function": {"name", "description", "parameters", "strict"}}`.
    ///
    /// The parameters are a strict-mode schema: optional fields are required and accept `null`,
    /// which the [`providers::openai`](crate::providers::openai) adapters read as "not given".
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{Story, ToolDefinition};
    ///
    /// let schema = json!({
    ///     "type": "object",
    ///     "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]}},
    ///     "required": ["city"],
    ///     "additionalProperties": false
    /// });
    /// let def = ToolDefinition::new("forecast", "The weather ahead.", schema, Story::ReadOnly);
    /// let tool = def.to_openai();
    /// assert_eq!(tool["function"]["strict"], true);
    /// assert_eq!(tool["function"]["parameters"]["required"], json!(["city", "days"]));
    /// ```
    pub fn to_openai(&self) -> Value {
        let (parameters, strict) = parameters(&self.input_schema);
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
                "strict": strict,
            }
        })
    }

    /// The tool for OpenAI's Responses API: `{"type": "function", "name", "description",
    /// "parameters", "strict"}`, with the same strict-mode schema as [`to_openai`](Self::to_openai).
    pub fn to_openai_responses(&self) -> Value {
        let (parameters, strict) = parameters(&self.input_schema);
        json!({
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": parameters,
            "strict": strict,
        })
    }
}

/// The strict-mode parameters, or the canonical schema (without `$schema`) and `false`; either
/// way without a top-level union, which OpenAI refuses even where it is not strict.
fn parameters(canonical: &Value) -> (Value, bool) {
    let lifted = without_top_level_unions(canonical);
    match strict_schema(&lifted) {
        Some(schema) => (schema, true),
        None => (lifted, false),
    }
}

/// The canonical schema rewritten for strict mode, or `None` when strict mode cannot express it.
pub(crate) fn strict_schema(canonical: &Value) -> Option<Value> {
    let mut schema = canonical.clone();
    let root = schema.as_object_mut()?;
    root.shift_remove("$schema");
    if !is_object(root) || root.contains_key("anyOf") || root.contains_key("oneOf") {
        return None;
    }
    inline_refs(&mut schema, Inline::WithSiblings);
    let mut strict = true;
    strictify(&mut schema, &mut strict);
    prune_defs(&mut schema);
    strict.then_some(schema)
}

/// Rewrites one schema and everything below it; clears `strict` on what strict mode cannot say.
fn strictify(node: &mut Value, strict: &mut bool) {
    // `true` (any value) and `false` have no strict form.
    let Value::Object(map) = node else {
        *strict = false;
        return;
    };
    if NOT_STRICT.iter().any(|k| map.contains_key(*k)) {
        *strict = false;
    }
    if let Some(one_of) = map.shift_remove("oneOf") {
        match map.get_mut("anyOf") {
            None => {
                map.insert("anyOf".into(), one_of);
            }
            Some(_) => *strict = false,
        }
    }
    if !merge_all_of(map) {
        *strict = false;
    }
    if let Some(default) = map.shift_remove("default") {
        describe_default(map, default);
    }
    if map
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| !FORMATS.contains(&f))
    {
        map.shift_remove("format");
    }
    map.retain(|keyword, _| KEYWORDS.contains(&keyword.as_str()));
    let typed = ["type", "anyOf", "$ref", "enum", "const"]
        .iter()
        .any(|k| map.contains_key(*k));
    if !typed {
        *strict = false;
    }

    // `additionalProperties` is checked below: it must end up `false`, not be a schema.
    for_each_child_mut(map, |keyword, child| {
        if keyword != "additionalProperties" {
            strictify(child, strict)
        }
    });

    // An object with `anyOf` beside it: its fields are spread over the branches. Closing it
    // would forbid them; strict mode can say it only when the branches are whole objects.
    if is_object(map) && map.contains_key("anyOf") {
        let own_fields = map
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty());
        if own_fields {
            *strict = false;
            return;
        }
        map.shift_remove("properties");
        map.shift_remove("required");
        map.shift_remove("additionalProperties");
        map.shift_remove("type");
    }
    if is_object(map) {
        if !matches!(
            map.get("additionalProperties"),
            None | Some(Value::Bool(false))
        ) {
            *strict = false;
        }
        map.insert("additionalProperties".into(), Value::Bool(false));
        let optional: BTreeSet<String> = {
            let required = required(map);
            let properties = map.entry("properties").or_insert_with(|| json!({}));
            let names: BTreeSet<String> = properties
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            &names - &required
        };
        let Some(Value::Object(properties)) = map.get_mut("properties") else {
            return;
        };
        for name in &optional {
            if let Some(property) = properties.get_mut(name) {
                make_nullable(property);
            }
        }
        // Every property, in the order of `properties`: the order the fields are declared in.
        let Some(Value::Object(properties)) = map.get("properties") else {
            return;
        };
        let all: Vec<Value> = properties.keys().map(|name| json!(name)).collect();
        map.insert("required".into(), Value::Array(all));
    }
}

/// Strict mode has no `default`; the model learns it from the description, and sends `null`
/// for it (the field is optional, so it accepts `null`).
fn describe_default(map: &mut Object, default: Value) {
    if default.is_null() {
        return;
    }
    let note = format!("Default: {default}.");
    let description = match map.get("description").and_then(Value::as_str) {
        Some(text) if !text.is_empty() => format!("{text} {note}"),
        _ => note,
    };
    map.insert("description".into(), Value::String(description));
}

/// Lets an optional field's schema accept `null`: `"string"` becomes `["string", "null"]`, an
/// `anyOf` gains a `{"type": "null"}` branch, a `$ref` is wrapped in one.
fn make_nullable(schema: &mut Value) {
    if accepts_null(schema) {
        return;
    }
    let Value::Object(map) = schema else { return };
    if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
        branches.push(json!({"type": "null"}));
        return;
    }
    if map.contains_key("$ref") || map.contains_key("const") || !map.contains_key("type") {
        let description = map.shift_remove("description");
        let inner = std::mem::take(map);
        map.insert("anyOf".into(), json!([inner, {"type": "null"}]));
        if let Some(description) = description {
            map.insert("description".into(), description);
        }
        return;
    }
    match map.get_mut("type") {
        Some(Value::String(ty)) => {
            let ty = std::mem::take(ty);
            map.insert("type".into(), json!([ty, "null"]));
        }
        Some(Value::Array(types)) => types.push(json!("null")),
        _ => {}
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.push(Value::Null);
    }
}

/// Removes the `null`s strict mode makes a model send for the optional fields it leaves out, so
/// `{"limit": null}` reaches the tool as if `limit` were absent — and gets its default.
///
/// Guided by the canonical schema: only properties it does not list in `required` lose their
/// `null`, at every depth (through `$ref`, `items`, and the `anyOf`/`oneOf` branch whose
/// properties cover the object's keys).
pub(crate) fn drop_optional_nulls(arguments: &mut Value, canonical: &Value) {
    drop_nulls(arguments, canonical, canonical, 0);
}

/// True when `branch` of the union `list` describes `object`: its tags (`const`) agree with
/// the object's, and its properties cover the object's keys that any branch of the union has.
fn describes(
    branch: &Value,
    list: &[Value],
    object: &serde_json::Map<String, Value>,
    root: &Value,
) -> bool {
    let Some(mine) = properties_of(branch, root) else {
        return false;
    };
    let agree = mine
        .iter()
        .all(|(name, p)| match (p.get("const"), object.get(name)) {
            (Some(tag), Some(given)) => tag == given,
            _ => true,
        });
    let in_union = |k: &String| {
        list.iter()
            .filter_map(|b| properties_of(b, root))
            .any(|p| p.contains_key(k))
    };
    agree
        && object
            .keys()
            .filter(|k| in_union(k))
            .all(|k| mine.contains_key(k))
}

/// The properties of `branch`, through `$ref`s.
fn properties_of<'a>(
    branch: &'a Value,
    root: &'a Value,
) -> Option<&'a serde_json::Map<String, Value>> {
    resolve(branch, root)?.get("properties")?.as_object()
}

fn drop_nulls(value: &mut Value, schema: &Value, root: &Value, depth: usize) {
    const MAX_DEPTH: usize = 64;
    let Some(schema) = resolve(schema, root) else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    match value {
        Value::Object(object) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                let required = required(schema);
                object.retain(|k, v| {
                    !(v.is_null() && properties.contains_key(k) && !required.contains(k))
                });
                for (name, field) in object.iter_mut() {
                    if let Some(property) = properties.get(name) {
                        drop_nulls(field, property, root, depth + 1);
                    }
                }
            }
            // A field only a top-level branch has (a flattened enum's, lifted into one object
            // for the model) was optional where the model was told: its `null` is "not given"
            // too, unless every branch requires it. Deeper unions are exported as they are.
            let own = schema.get("properties").and_then(Value::as_object);
            let lifted_null = |(k, v): (&String, &Value)| {
                v.is_null() && own.is_none_or(|own| !own.contains_key(k))
            };
            if depth == 0 && object.iter().any(lifted_null) {
                // At the top, the schema is the root itself.
                let lifted = super::lift(root, root);
                object.retain(|k, v| {
                    !(lifted_null((k, v))
                        && lifted.properties.contains_key(k)
                        && !lifted.required.iter().any(|r| r == k))
                });
            }
            // The branches that describe this object: every `allOf` one, and the first
            // `anyOf`/`oneOf` one whose tags (`const`) agree with the object's and whose
            // properties cover the object's keys that any branch of the union has (the others
            // are the object's own, or another union's, beside a second flattened enum).
            let object = &*object;
            let mut branches: Vec<&Value> = Vec::new();
            for keyword in ["allOf", "anyOf", "oneOf"] {
                let Some(list) = schema.get(keyword).and_then(Value::as_array) else {
                    continue;
                };
                match keyword {
                    "allOf" => branches.extend(list),
                    _ => branches.extend(list.iter().find(|b| describes(b, list, object, root))),
                }
            }
            for branch in branches {
                drop_nulls(value, branch, root, depth + 1);
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items
                    .iter_mut()
                    .for_each(|v| drop_nulls(v, item, root, depth + 1));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_fields_become_required_and_nullable() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": "integer", "format": "uint32", "minimum": 0, "default": 20, "description": "How many."},
                "c": {"$ref": "#/$defs/E", "description": "An E."},
                "d": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}]}
            },
            "required": ["a", "c"],
            "additionalProperties": false,
            "$defs": {"E": {"type": "string", "enum": ["x", "y"]}}
        });
        let strict = strict_schema(&schema).unwrap();
        assert_eq!(
            strict,
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {"type": ["integer", "null"], "minimum": 0, "description": "How many. Default: 20."},
                    "c": {"type": "string", "enum": ["x", "y"], "description": "An E."},
                    "d": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}]}
                },
                "required": ["a", "b", "c", "d"],
                "additionalProperties": false,
                "$defs": {"E": {"type": "string", "enum": ["x", "y"]}}
            })
        );
    }

    #[test]
    fn maps_and_any_values_are_not_strict() {
        let map = json!({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "string"}}}});
        assert_eq!(strict_schema(&map), None);
        let any = json!({"type": "object", "properties": {"v": true}});
        assert_eq!(strict_schema(&any), None);
        let def = ToolDefinition::new("t", "d", any, crate::Story::ReadOnly);
        assert_eq!(def.to_openai()["function"]["strict"], false);
    }

    #[test]
    fn objects_spread_over_branches_stay_open() {
        // `#[serde(flatten)]` of an enum: the branches carry the fields.
        let flat = json!({"type": "object", "properties": {
            "f": {"type": "object", "properties": {"x": {"type": "string"}}, "oneOf": [
                {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]}
            ]}
        }});
        assert_eq!(strict_schema(&flat), None);
        // An object type beside whole-object branches: the branches say it all.
        let tagged = json!({"type": "object", "properties": {
            "f": {"type": "object", "oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]}]}
        }, "required": ["f"]});
        let strict = strict_schema(&tagged).unwrap();
        assert_eq!(
            strict["properties"]["f"],
            json!({"anyOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"], "additionalProperties": false}]})
        );
    }

    #[test]
    fn drops_nulls_of_optional_fields_only() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": ["string", "null"]},
                "b": {"type": ["string", "null"]},
                "n": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]},
                "list": {"type": "array", "items": {"$ref": "#/$defs/N"}}
            },
            "required": ["a"],
            "$defs": {"N": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]}}
        });
        let mut args = json!({"a": null, "b": null, "n": {"x": null, "y": null}, "list": [{"x": 1, "y": null}]});
        drop_optional_nulls(&mut args, &schema);
        assert_eq!(
            args,
            json!({"a": null, "n": {"x": null}, "list": [{"x": 1}]})
        );
    }
}
