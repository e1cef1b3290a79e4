//! OpenAI's published rules for strict function tools (the Structured Outputs guide, "Supported
//! schemas"), written down as a checker independent of the export code: it lists every place a
//! tool would have to change before strict mode accepted it.
//!
//! - The root schema is an object, not `anyOf`.
//! - Every object sets `additionalProperties: false` and lists every property in `required`
//!   (an optional field is a union with `null`, never left out of `required`).
//! - Only the supported keywords: `type`, `properties`, `required`, `additionalProperties`,
//!   `items`, `enum`, `const`, `anyOf`, `$ref`, `$defs`/`definitions`, `description`, `title`,
//!   for strings `pattern` and `format` (`date-time`, `time`, `date`, `duration`, `email`,
//!   `hostname`, `ipv4`, `ipv6`, `uuid`), for numbers `multipleOf`, `maximum`,
//!   `exclusiveMaximum`, `minimum`, `exclusiveMinimum`, for arrays `minItems`, `maxItems`. So no
//!   `oneOf`, `allOf`, `not`, `if`/`then`/`else`, `default`, `patternProperties`, ...
//! - The types are `string`, `number`, `boolean`, `integer`, `object`, `array` and `null`; every
//!   schema names one (directly, or through `anyOf`, `$ref`, `enum`, `const`); arrays name their
//!   `items`.
//! - A `$ref` stands alone (no sibling keywords) and points to a definition that exists.
//! - Limits: at most 5000 object properties in all, 10 levels of object nesting, 1000 enum
//!   values, and 120,000 characters of property names, definition names, enum and const values.
//! - The function's name is 1 to 64 of `a-z A-Z 0-9 _ -`.

use serde_json::{Map, Value};

const KEYWORDS: &[&str] = &[
    "type",
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
    "description",
    "title",
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
const FORMATS: &[&str] = &[
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
const TYPES: &[&str] = &[
    "string", "number", "boolean", "integer", "object", "array", "null",
];

/// What strict mode would refuse in a Chat Completions tool (`{"type": "function", "function":
/// {..}}`) or a Responses tool (`{"type": "function", "name", ..}`); empty when it accepts it.
pub fn violations(tool: &Value) -> Vec<String> {
    let mut found = Vec::new();
    if tool["type"] != "function" {
        found.push("the tool's `type` is not \"function\"".to_string());
    }
    let function = tool.get("function").unwrap_or(tool);
    let name = function["name"].as_str().unwrap_or_default();
    let valid_name = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        found.push(format!(
            "the name `{name}` is not 1 to 64 of a-z A-Z 0-9 _ -"
        ));
    }
    if !function["description"].is_string() {
        found.push("no description".into());
    }
    if function["strict"] != true {
        found.push("`strict` is not true".into());
    }
    let schema = &function["parameters"];
    if schema["type"] != "object" {
        found.push("the root schema is not `\"type\": \"object\"`".into());
    }
    if schema.get("anyOf").is_some() {
        found.push("the root schema is `anyOf`".into());
    }
    let mut checker = Checker {
        root: schema,
        found: &mut found,
        properties: 0,
        enum_values: 0,
        text: 0,
    };
    checker.check(schema, "#", 0);
    let (properties, enum_values, text) = (checker.properties, checker.enum_values, checker.text);
    if properties > 5000 {
        found.push(format!("{properties} object properties, more than 5000"));
    }
    if enum_values > 1000 {
        found.push(format!("{enum_values} enum values, more than 1000"));
    }
    if text > 120_000 {
        found.push(format!(
            "{text} characters of names and values, more than 120,000"
        ));
    }
    found
}

struct Checker<'a> {
    root: &'a Value,
    found: &'a mut Vec<String>,
    properties: usize,
    enum_values: usize,
    text: usize,
}

impl Checker<'_> {
    fn check(&mut self, schema: &Value, at: &str, depth: usize) {
        let Value::Object(map) = schema else {
            self.found
                .push(format!("{at}: a boolean schema has no type"));
            return;
        };
        for keyword in map.keys() {
            if !KEYWORDS.contains(&keyword.as_str()) {
                self.found
                    .push(format!("{at}: `{keyword}` is not supported"));
            }
        }
        if let Some(reference) = map.get("$ref") {
            if map.len() > 1 {
                let siblings: Vec<&String> = map.keys().filter(|k| *k != "$ref").collect();
                self.found
                    .push(format!("{at}: `$ref` has sibling keywords {siblings:?}"));
            }
            let target = reference.as_str().and_then(|r| r.strip_prefix("#/$defs/"));
            if target
                .and_then(|name| self.root["$defs"].get(name))
                .is_none()
            {
                self.found
                    .push(format!("{at}: `$ref` {reference} points to no definition"));
            }
        }
        let types = match map.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(other) => {
                self.found.push(format!("{at}: `type` is {other}"));
                vec![]
            }
            None => vec![],
        };
        for ty in &types {
            if !TYPES.contains(ty) {
                self.found
                    .push(format!("{at}: type `{ty}` is not supported"));
            }
        }
        if !["type", "anyOf", "$ref", "enum", "const"]
            .iter()
            .any(|k| map.contains_key(*k))
        {
            self.found.push(format!("{at}: the schema names no type"));
        }
        if let Some(format) = map.get("format").and_then(Value::as_str) {
            if !FORMATS.contains(&format) {
                self.found
                    .push(format!("{at}: format `{format}` is not supported"));
            }
        }
        if let Some(values) = map.get("enum").and_then(Value::as_array) {
            self.enum_values += values.len();
            self.text += values
                .iter()
                .filter_map(Value::as_str)
                .map(str::len)
                .sum::<usize>();
        }
        if let Some(Value::String(value)) = map.get("const") {
            self.text += value.len();
        }
        let object = types.contains(&"object") || map.contains_key("properties");
        if object {
            self.check_object(map, at, depth);
        }
        if types.contains(&"array") {
            match map.get("items") {
                Some(items) => self.check(items, &format!("{at}/items"), depth),
                None => self.found.push(format!("{at}: an array without `items`")),
            }
        } else if let Some(items) = map.get("items") {
            self.check(items, &format!("{at}/items"), depth);
        }
        if let Some(branches) = map.get("anyOf") {
            match branches.as_array() {
                Some(branches) if !branches.is_empty() => {
                    for (i, branch) in branches.iter().enumerate() {
                        self.check(branch, &format!("{at}/anyOf/{i}"), depth);
                    }
                }
                _ => self
                    .found
                    .push(format!("{at}: `anyOf` is not a list of schemas")),
            }
        }
        for keyword in ["$defs", "definitions"] {
            if let Some(defs) = map.get(keyword).and_then(Value::as_object) {
                for (name, def) in defs {
                    self.text += name.len();
                    self.check(def, &format!("{at}/{keyword}/{name}"), depth);
                }
            }
        }
    }

    fn check_object(&mut self, map: &Map<String, Value>, at: &str, depth: usize) {
        if depth >= 10 {
            self.found
                .push(format!("{at}: objects nested more than 10 deep"));
        }
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            self.found.push(format!(
                "{at}: an object without `additionalProperties: false`"
            ));
        }
        let Some(properties) = map.get("properties").and_then(Value::as_object) else {
            self.found
                .push(format!("{at}: an object without `properties`"));
            return;
        };
        let mut required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        required.sort();
        let mut names: Vec<&str> = properties.keys().map(String::as_str).collect();
        names.sort();
        if required != names {
            self.found.push(format!(
                "{at}: `required` is {required:?}, not every property {names:?}"
            ));
        }
        for (name, property) in properties {
            self.properties += 1;
            self.text += name.len();
            self.check(property, &format!("{at}/properties/{name}"), depth + 1);
        }
    }
}
