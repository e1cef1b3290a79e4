//! The arguments of the catalogue's retries, derived from the tool's definition: ignored fields
//! reworded, key fields respelled only as the key normalizes them, one fingerprinted field
//! changed.

use serde_json::{Map, Value};
use unicode_normalization::UnicodeNormalization;

use crate::ToolDefinition;

/// What the definition says about each argument.
pub(crate) struct Fields<'a> {
    def: &'a ToolDefinition,
    key: Vec<String>,
}

/// One retry: what it changed, and its arguments.
pub(crate) struct Variation {
    pub(crate) label: String,
    pub(crate) args: Value,
}

impl<'a> Fields<'a> {
    pub(crate) fn of(def: &'a ToolDefinition) -> Fields<'a> {
        Fields {
            def,
            key: def.key_arguments(),
        }
    }

    /// The key template, for the reasons a failing row gives.
    pub(crate) fn template(&self) -> Option<&str> {
        self.def.key_template()
    }

    /// The schema of field `name`: a property, a field of a flattened enum's branch (not its
    /// tag, which names the branch), or a flattened map's entry.
    fn property(&self, name: &str) -> Option<&Value> {
        let schema = self.def.input_schema();
        if let Some(property) = schema.get("properties").and_then(|p| p.get(name)) {
            return Some(property);
        }
        let root = schema.as_object()?;
        if let Some(found) = in_branches(root, schema, name, 8) {
            return found;
        }
        schema.get("additionalProperties").filter(|v| v.is_object())
    }

    /// True when `args` has a field outside the key that is not ignored: one the fingerprint
    /// covers.
    pub(crate) fn has_fingerprinted(&self, args: &Value) -> bool {
        args.as_object().is_some_and(|object| {
            object
                .keys()
                .any(|name| !self.is_key(name) && !self.is_ignored(name))
        })
    }

    fn is_key(&self, name: &str) -> bool {
        self.key.iter().any(|k| k == name)
    }

    fn is_ignored(&self, name: &str) -> bool {
        self.def.ignored_arguments().iter().any(|k| k == name)
    }

    /// The retries a tool must answer as replays: each ignored field reworded, each text key
    /// field respelled as its normalization allows, then all of them at once.
    pub(crate) fn rewordings(&self, args: &Value) -> Vec<Variation> {
        let mut changes: Vec<(String, String, Value)> = Vec::new();
        for name in self.def.ignored_arguments() {
            let (Some(value), Some(schema)) = (args.get(name), self.property(name)) else {
                continue;
            };
            if let Some(new) = reword(value, schema) {
                changes.push((name.clone(), format!("`{name}` reworded"), new));
            }
        }
        for name in &self.key {
            let (Some(Value::String(text)), Some(schema)) = (args.get(name), self.property(name))
            else {
                continue;
            };
            if !is_plain_text(schema) {
                continue;
            }
            let folds = self
                .def
                .case_insensitive_arguments()
                .iter()
                .any(|k| k == name);
            let new = respell(text, folds);
            changes.push((
                name.clone(),
                format!("`{name}` written {new:?}"),
                Value::String(new),
            ));
        }
        let mut retries: Vec<Variation> = changes
            .iter()
            .map(|(name, label, value)| Variation {
                label: label.clone(),
                args: with(args, [(name.as_str(), value.clone())]),
            })
            .collect();
        if changes.len() > 1 {
            retries.push(Variation {
                label: "all of these at once".into(),
                args: with(
                    args,
                    changes.iter().map(|(n, _, v)| (n.as_str(), v.clone())),
                ),
            });
        }
        retries
    }

    /// A retry under the same key with another value of one fingerprinted field: numbers first
    /// (an amount), then text, then the rest.
    pub(crate) fn other_arguments(&self, args: &Value) -> Option<Variation> {
        let object = args.as_object()?;
        let candidates = object
            .iter()
            .filter(|(name, _)| !self.is_key(name) && !self.is_ignored(name));
        let mut best: Option<(u8, Variation)> = None;
        for (name, value) in candidates {
            let Some(schema) = self.property(name) else {
                continue;
            };
            let Some((rank, new)) = change(value, schema) else {
                continue;
            };
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                let label = format!("another `{name}` ({})", short(&new));
                let args = with(args, [(name.as_str(), new)]);
                best = Some((rank, Variation { label, args }));
            }
        }
        best.map(|(_, v)| v)
    }
}

/// The top-level fields whose values differ between two argument sets, in `b`'s order.
pub(crate) fn changed_fields(a: &Value, b: &Value) -> Vec<String> {
    let empty = Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let mut names: Vec<String> = b
        .iter()
        .filter(|(k, v)| a.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    names.extend(a.keys().filter(|k| !b.contains_key(*k)).cloned());
    names
}

fn with<'n>(args: &Value, changes: impl IntoIterator<Item = (&'n str, Value)>) -> Value {
    let mut args = args.clone();
    if let Some(object) = args.as_object_mut() {
        for (name, value) in changes {
            object.insert(name.to_string(), value);
        }
    }
    args
}

/// A schema for text of any shape: no enum, format, pattern or length limit to break.
fn is_plain_text(schema: &Value) -> bool {
    let is_string = match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    is_string
        && ["enum", "const", "format", "pattern", "maxLength", "$ref"]
            .iter()
            .all(|k| schema.get(*k).is_none())
}

fn enum_alternative(value: &Value, schema: &Value) -> Option<Value> {
    let options = schema.get("enum")?.as_array()?;
    options.iter().find(|o| *o != value).cloned()
}

/// The value as a model might write it the second time: other words, another number.
fn reword(value: &Value, schema: &Value) -> Option<Value> {
    if let Some(other) = enum_alternative(value, schema) {
        return Some(other);
    }
    match value {
        Value::String(text) if is_plain_text(schema) => {
            Some(Value::String(format!("{text} (in other words)")))
        }
        Value::Null if is_plain_text(schema) => Some(Value::String("in other words".into())),
        _ => change(value, schema).map(|(_, v)| v),
    }
}

/// Another value of the same type, ranked: numbers 0, text 1, booleans 2, enums 3.
fn change(value: &Value, schema: &Value) -> Option<(u8, Value)> {
    if let Some(other) = enum_alternative(value, schema) {
        return Some((3, other));
    }
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            let n = n.as_i64().map(|n| n.saturating_add(1)).map(Value::from);
            n.map(|v| (0, v))
        }
        Value::Number(n) => n.as_f64().map(|f| (0, Value::from(f + 1.0))),
        Value::String(text) if is_plain_text(schema) => {
            Some((1, Value::String(format!("{text}-other"))))
        }
        Value::Bool(b) => Some((2, Value::Bool(!b))),
        _ => None,
    }
}

/// The key's normalization of one text part: trimmed, NFC, lowercased where it folds case.
fn normalize(text: &str, folds: bool) -> String {
    let text: String = text.trim().nfc().collect();
    if folds {
        text.to_lowercase().nfc().collect()
    } else {
        text
    }
}

/// `text` written otherwise with the same key part: spaces around it, decomposed accents, and
/// upper case where the field folds case.
fn respell(text: &str, folds: bool) -> String {
    let target = normalize(text, folds);
    let mut candidates = Vec::new();
    let decomposed: String = text.nfd().collect();
    if folds {
        candidates.push(format!("  {} ", decomposed.to_uppercase()));
        candidates.push(format!("  {} ", text.to_uppercase()));
    }
    candidates.push(format!("  {decomposed} "));
    candidates
        .into_iter()
        .find(|c| normalize(c, folds) == target)
        .unwrap_or_else(|| format!("  {text} "))
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 24 {
        format!("{}…", text.chars().take(23).collect::<String>())
    } else {
        text
    }
}

/// The schema of field `name` in the first branch below `schema` that has it (a flattened enum's,
/// under `oneOf`/`anyOf`, or under `allOf` beside another's): `Some(None)` when it is a branch's
/// tag, which names another branch rather than another value.
fn in_branches<'a>(
    schema: &'a Map<String, Value>,
    whole: &'a Value,
    name: &str,
    depth: usize,
) -> Option<Option<&'a Value>> {
    let branches = ["allOf", "oneOf", "anyOf"]
        .into_iter()
        .filter_map(|k| schema.get(k)?.as_array())
        .flatten();
    for branch in branches.filter(|_| depth > 0) {
        let Some(resolved) = crate::schema::walk::resolve(branch, whole) else {
            continue;
        };
        if let Some(property) = resolved.get("properties").and_then(|p| p.get(name)) {
            return Some(property.get("const").is_none().then_some(property));
        }
        if let Some(found) = in_branches(resolved, whole, name, depth - 1) {
            return Some(found);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The key's fields of a definition keyed by `template`, `line` renamed `line_no`.
    fn key_fields(template: &str) -> Vec<String> {
        ToolDefinition::new("refund", "", json!({}), crate::Story::Idempotent)
            .with_key_template(template)
            .with_renamed_argument("line", "line_no")
            .key_arguments()
    }

    #[test]
    fn key_fields_leave_out_the_context_and_are_named_as_the_json_names_them() {
        assert_eq!(
            key_fields("refund:<order>:<ctx.run_id>:<ctx.step>:<line>"),
            ["order", "line_no"]
        );
    }

    /// Read as the macro reads a template: white space inside the brackets is not the name's.
    #[test]
    fn key_fields_are_named_as_the_macro_names_them() {
        assert_eq!(
            key_fields("refund:< order >:< ctx.step >:<line >"),
            ["order", "line_no"]
        );
    }

    #[test]
    fn a_respelling_keeps_the_key_part() {
        assert_eq!(respell("acme", true), "  ACME ");
        assert_eq!(respell("acme", false), "  acme ");
        // `ß` upper-cases to `SS`, which lowercases to `ss`: another key part, so not used.
        assert_eq!(normalize(&respell("straße", true), true), "straße");
        assert_eq!(normalize(&respell("café", false), false), "café");
        assert_ne!(respell("café", false).trim(), "café");
    }

    /// A flattened enum's branch field and a flattened map's entry are fields a retry under the
    /// key may change; a branch's tag is not changed (it would name another branch).
    #[test]
    fn a_flattened_fields_value_is_changed_and_a_tag_is_not() {
        let schema = json!({
            "properties": {"order": {"type": "string"}},
            "oneOf": [{"$ref": "#/$defs/Card"}],
            "$defs": {"Card": {"properties": {
                "method": {"type": "string", "const": "card"},
                "last4": {"type": "string"}
            }}},
            "additionalProperties": {"type": "string"}
        });
        let def = ToolDefinition::new("pay", "", schema, crate::Story::Idempotent)
            .with_key_template("pay:<order>");
        let fields = Fields::of(&def);
        let card = json!({"order": "o-1", "method": "card", "last4": "4242"});
        let other = fields.other_arguments(&card).unwrap();
        assert_eq!(other.args["last4"], "4242-other");
        assert_eq!(other.args["method"], "card");
        let tagged = json!({"order": "o-1", "gift": "yes"});
        assert_eq!(
            fields.other_arguments(&tagged).unwrap().args["gift"],
            "yes-other"
        );
        // A field outside the key whose value no change fits: said so, not "every argument
        // is a key field".
        let list = json!({"order": "o-1", "method": "card", "lines": [1]});
        assert!(fields.other_arguments(&list).is_none());
        assert!(fields.has_fingerprinted(&list));
        assert!(!fields.has_fingerprinted(&json!({"order": "o-1"})));
    }

    #[test]
    fn a_change_keeps_the_type() {
        let number = json!({"type": "number"});
        assert_eq!(change(&json!(1200.0), &number), Some((0, json!(1201.0))));
        assert_eq!(
            change(&json!(7), &json!({"type": "integer"})),
            Some((0, json!(8)))
        );
        let plan = json!({"type": "string", "enum": ["basic", "pro"]});
        assert_eq!(change(&json!("basic"), &plan), Some((3, json!("pro"))));
        assert_eq!(
            change(&json!("x"), &json!({"type": "string", "format": "uuid"})),
            None
        );
    }
}
