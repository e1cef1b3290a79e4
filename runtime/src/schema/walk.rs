//! Walking and rewriting JSON Schemas: the closing of objects, `$ref`s inlined or merged, unions
//! lifted into one object, `null` in and out of unions. Argument parsing and the tool's
//! definition read schemas with these; each API's profile ([`export`](crate::export)) rewrites
//! them.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

pub(crate) type Object = Map<String, Value>;

/// Keywords whose value is one subschema.
pub(crate) const ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keywords whose value maps names to subschemas.
pub(crate) const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Keywords whose value is a list of subschemas.
pub(crate) const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];

/// Calls `f` with the keyword and each subschema directly below `schema`. Data keywords
/// (`enum`, `const`, `default`, `examples`) are not schemas and are never visited.
pub(crate) fn for_each_child(schema: &Object, mut f: impl FnMut(&str, &Value)) {
    for (keyword, value) in schema {
        let keyword = keyword.as_str();
        match value {
            Value::Object(map) if MAP.contains(&keyword) => {
                map.values().for_each(|v| f(keyword, v))
            }
            Value::Array(list) if LIST.contains(&keyword) || keyword == "items" => {
                list.iter().for_each(|v| f(keyword, v))
            }
            _ if ONE.contains(&keyword) => f(keyword, value),
            _ => {}
        }
    }
}

/// [`for_each_child`], mutably.
pub(crate) fn for_each_child_mut(schema: &mut Object, mut f: impl FnMut(&str, &mut Value)) {
    for (keyword, value) in schema.iter_mut() {
        let keyword = keyword.as_str();
        match value {
            Value::Object(map) if MAP.contains(&keyword) => {
                map.values_mut().for_each(|v| f(keyword, v))
            }
            Value::Array(list) if LIST.contains(&keyword) || keyword == "items" => {
                list.iter_mut().for_each(|v| f(keyword, v))
            }
            _ if ONE.contains(&keyword) => f(keyword, value),
            _ => {}
        }
    }
}

/// Closes every object schema of a canonical schema with `additionalProperties: false`, as the
/// `#[tool]` arguments struct itself is closed, so a model is never told it may add fields.
///
/// Objects that already say what extra properties may be (maps, `patternProperties`) stay as
/// they are, and so do objects combined with `allOf`/`anyOf`/`oneOf`: there the other branches
/// validate the same instance, and closing one branch would forbid the fields of the others.
pub(crate) fn close_objects(schema: &mut Value) {
    close(schema, true);
}

pub(crate) fn close(schema: &mut Value, may_close: bool) {
    let Value::Object(map) = schema else { return };
    let composed = ["allOf", "anyOf", "oneOf", "$ref"]
        .iter()
        .any(|k| map.contains_key(*k));
    let open = [
        "additionalProperties",
        "unevaluatedProperties",
        "patternProperties",
    ];
    let has_properties = map.contains_key("properties");
    if may_close && has_properties && !composed && !open.iter().any(|k| map.contains_key(*k)) {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for_each_child_mut(map, |keyword, child| {
        let may_close = match keyword {
            "allOf" | "if" | "then" | "else" | "not" | "dependentSchemas" => false,
            // A branch validates the instance its parent does: nested in a branch that may not
            // close (a flattened `Option` of an enum: `anyOf` of its `oneOf` and `{}`), neither
            // may its own branches.
            "anyOf" | "oneOf" => may_close && !has_properties,
            _ => true,
        };
        close(child, may_close);
    });
}

/// The local definition a `$ref` names: `#/$defs/Name` (or `#/definitions/Name`).
pub(crate) fn def_name(reference: &str) -> Option<String> {
    let name = reference
        .strip_prefix("#/$defs/")
        .or_else(|| reference.strip_prefix("#/definitions/"))?;
    (!name.contains('/')).then(|| name.replace("~1", "/").replace("~0", "~"))
}

/// The definitions of a root schema, by name.
pub(crate) fn definitions(root: &Value) -> Object {
    let mut defs = Object::new();
    for keyword in ["definitions", "$defs"] {
        if let Some(Value::Object(map)) = root.get(keyword) {
            defs.extend(map.clone());
        }
    }
    defs
}

/// Which `$ref`s [`inline_refs`] replaces by the definition they point to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inline {
    /// Every one (for APIs that do not resolve references).
    All,
    /// Those with sibling keywords, such as a field's `description` beside `$ref`.
    WithSiblings,
    /// Those with `properties` or `required` beside them: an internally tagged enum's newtype
    /// variant, whose tag is a property beside the variant's type. Closing that type on its
    /// own would forbid the tag.
    BesideProperties,
}

/// Replaces `$ref`s by a copy of their definition, the use site's own keywords winning: a
/// field's doc comment says more than its type's.
///
/// Properties and required names on both sides are united, the use site's first.
///
/// A reference back into a definition being inlined cannot be inlined: with [`Inline::All`] it
/// becomes a plain `{"type": "object"}` (the recursion is cut), with [`Inline::WithSiblings`] it
/// stays a bare `$ref` and loses its siblings, with [`Inline::BesideProperties`] it stays as it
/// is.
pub(crate) fn inline_refs(schema: &mut Value, which: Inline) {
    let defs = definitions(schema);
    inline(schema, &defs, which, &mut Vec::new());
}

pub(crate) fn inline(node: &mut Value, defs: &Object, which: Inline, stack: &mut Vec<String>) {
    let Value::Object(map) = node else { return };
    let target = map.get("$ref").and_then(Value::as_str).and_then(def_name);
    if let Some(name) = target {
        let wanted = match which {
            Inline::All => true,
            Inline::WithSiblings => map.len() > 1,
            Inline::BesideProperties => {
                map.contains_key("properties") || map.contains_key("required")
            }
        };
        if wanted && stack.contains(&name) {
            match which {
                Inline::All => {
                    map.shift_remove("$ref");
                    map.insert("type".into(), json!("object"));
                }
                Inline::WithSiblings => map.retain(|k, _| k == "$ref"),
                Inline::BesideProperties => {}
            }
            return;
        }
        if let (true, Some(def)) = (wanted, defs.get(&name)) {
            let mut merged = match def {
                Value::Object(def) => def.clone(),
                _ => Object::new(),
            };
            map.shift_remove("$ref");
            for (keyword, value) in std::mem::take(map) {
                match (keyword.as_str(), value, merged.get_mut(&keyword)) {
                    ("properties", Value::Object(mut mine), Some(Value::Object(theirs))) => {
                        for (name, schema) in std::mem::take(theirs) {
                            mine.entry(name).or_insert(schema);
                        }
                        *theirs = mine;
                    }
                    ("required", Value::Array(mut mine), Some(Value::Array(theirs))) => {
                        for name in std::mem::take(theirs) {
                            if !mine.contains(&name) {
                                mine.push(name);
                            }
                        }
                        *theirs = mine;
                    }
                    (_, value, _) => {
                        merged.insert(keyword, value);
                    }
                }
            }
            *map = merged;
            stack.push(name);
            for_each_child_mut(map, |_, child| inline(child, defs, which, stack));
            stack.pop();
            return;
        }
    }
    for_each_child_mut(map, |_, child| inline(child, defs, which, stack));
}

/// Follows `$ref`s to the object schema they name.
pub(crate) fn resolve<'a>(mut schema: &'a Value, root: &'a Value) -> Option<&'a Object> {
    for _ in 0..32 {
        let map = schema.as_object()?;
        let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(def_name) else {
            return Some(map);
        };
        schema = root
            .get("$defs")
            .and_then(|d| d.get(&name))
            .or_else(|| root.get("definitions")?.get(&name))?;
    }
    None
}

/// The canonical schema without `$schema`, its top level one object schema with no `oneOf`,
/// `anyOf` or `allOf` beside it: what Anthropic and OpenAI take (a flattened enum's branches
/// spread over the arguments become optional properties of the one object).
pub(crate) fn without_top_level_unions(canonical: &Value) -> Value {
    let mut schema = canonical.clone();
    let Value::Object(root) = &mut schema else {
        return json!({"type": "object"});
    };
    root.shift_remove("$schema");
    let unions = ["allOf", "anyOf", "oneOf"];
    let mut lifted_open = None;
    if !merge_all_of(root) || unions.iter().any(|k| root.contains_key(*k)) {
        let lifted = lift(&Value::Object(root.clone()), canonical);
        lifted_open = lifted.open;
        for keyword in unions.iter().chain(&["properties"]) {
            root.shift_remove(*keyword);
        }
        root.insert("properties".into(), Value::Object(lifted.properties));
        if lifted.required.is_empty() {
            root.shift_remove("required");
        } else {
            root.insert("required".into(), Value::Array(lifted.required));
        }
    }
    root.entry("type").or_insert_with(|| json!("object"));
    if let (Some(open), false) = (lifted_open, root.contains_key("additionalProperties")) {
        // A branch takes other fields (a flattened map in a variant): so does the one object.
        root.shift_remove("unevaluatedProperties");
        root.insert("additionalProperties".into(), open);
    }
    // Every property is now the root's own: closed at the root is closed.
    if root.get("unevaluatedProperties") == Some(&Value::Bool(false))
        && !root.contains_key("additionalProperties")
    {
        root.shift_remove("unevaluatedProperties");
        root.insert("additionalProperties".into(), Value::Bool(false));
    }
    schema
}

/// An object schema with its unions lifted: see [`lift`].
pub(crate) struct Lifted {
    /// Its own properties and those of every branch below it, united.
    pub(crate) properties: Object,
    /// The names it requires whichever branch is taken.
    pub(crate) required: Vec<Value>,
    /// What other fields may hold, where it or a branch takes fields beside its properties (a
    /// flattened map's entries, in a variant or not): the first such schema found.
    pub(crate) open: Option<Value>,
}

/// Lifts the branches of `schema`'s unions, and of theirs, into one object schema: their
/// properties united, required only what every branch requires (everything, for `allOf`). A
/// `$ref` is followed in `whole`'s definitions and read as a branch of `allOf`. The model is
/// told less than the unions say; the tool's own argument parsing still refuses what no branch
/// allows.
pub(crate) fn lift(schema: &Value, whole: &Value) -> Lifted {
    lift_below(schema, whole, &mut Vec::new())
}

/// [`lift`], below the references in `path` (each followed once on a path: a recursive type
/// adds nothing the first reading did not).
pub(crate) fn lift_below<'a>(
    schema: &'a Value,
    whole: &'a Value,
    path: &mut Vec<&'a str>,
) -> Lifted {
    let mut lifted = Lifted {
        properties: Object::new(),
        required: Vec::new(),
        open: None,
    };
    let Some(map) = schema.as_object() else {
        return lifted;
    };
    if let Some(Value::Object(own)) = map.get("properties") {
        lifted.properties = own.clone();
    }
    lifted.open = ["additionalProperties", "unevaluatedProperties"]
        .iter()
        .filter_map(|keyword| map.get(*keyword))
        .find(|other| *other != &Value::Bool(false))
        .cloned();
    let require = |required: &mut Vec<Value>, names: Vec<Value>| {
        for name in names {
            if !required.contains(&name) {
                required.push(name);
            }
        }
    };
    require(
        &mut lifted.required,
        map.get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    );
    let unite = |lifted: &mut Lifted, branch: &'a Value, path: &mut Vec<&'a str>| {
        let inner = lift_below(branch, whole, path);
        for (name, schema) in &inner.properties {
            unite_property(&mut lifted.properties, name, schema);
        }
        if lifted.open.is_none() {
            lifted.open = inner.open;
        }
        inner.required
    };
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        let target = def_name(reference).and_then(|name| {
            whole
                .get("$defs")
                .and_then(|d| d.get(&name))
                .or_else(|| whole.get("definitions")?.get(&name))
        });
        if let (Some(target), false) = (target, path.contains(&reference)) {
            path.push(reference);
            let required = unite(&mut lifted, target, path);
            require(&mut lifted.required, required);
            path.pop();
        }
    }
    for branch in map
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let required = unite(&mut lifted, branch, path);
        require(&mut lifted.required, required);
    }
    for keyword in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get(keyword) else {
            continue;
        };
        let mut common: Option<Vec<Value>> = None;
        for branch in branches {
            let required = unite(&mut lifted, branch, path);
            common = Some(match common {
                None => required,
                Some(common) => common
                    .into_iter()
                    .filter(|n| required.contains(n))
                    .collect(),
            });
        }
        require(&mut lifted.required, common.unwrap_or_default());
    }
    lifted
}

/// Gives property `name` the schema `schema` beside the one it has from another branch of a
/// union, if any: either is then allowed. Constants of one type become one `enum`, as a
/// flattened enum's tag does (`"method": "card"` in one branch, `"bank"` in the other).
pub(crate) fn unite_property(properties: &mut Object, name: &str, schema: &Value) {
    let Some(existing) = properties.get_mut(name) else {
        properties.insert(name.to_string(), schema.clone());
        return;
    };
    if existing == schema {
        return;
    }
    let constants = |s: &Value| match s.get("const") {
        Some(value) => Some(vec![value.clone()]),
        None => s.get("enum")?.as_array().cloned(),
    };
    if let (Some(mut values), Some(more), Value::Object(map)) =
        (constants(existing), constants(schema), &mut *existing)
    {
        if map.get("type") == schema.get("type") {
            for value in more {
                if !values.contains(&value) {
                    values.push(value);
                }
            }
            map.shift_remove("const");
            map.insert("enum".into(), Value::Array(values));
            return;
        }
    }
    if let Value::Object(map) = &mut *existing {
        if let (1, Some(Value::Array(branches))) = (map.len(), map.get_mut("anyOf")) {
            if !branches.contains(schema) {
                branches.push(schema.clone());
            }
            return;
        }
    }
    let first = existing.take();
    *existing = serde_json::json!({"anyOf": [first, schema.clone()]});
}

/// Replaces each `$ref` with `properties` or `required` beside it by its definition, merged
/// with them (see [`Inline::BesideProperties`]); then drops the definitions no longer used.
pub(crate) fn merge_refs_beside_properties(schema: &mut Value) {
    inline_refs(schema, Inline::BesideProperties);
    prune_defs(schema);
}

/// Removes the definitions nothing refers to any more, and `$defs` itself when it is empty.
pub(crate) fn prune_defs(schema: &mut Value) {
    let defs = definitions(schema);
    let Value::Object(root) = &*schema else {
        return;
    };
    let mut body = root.clone();
    body.shift_remove("$defs");
    body.shift_remove("definitions");
    let mut pending = Vec::new();
    collect_refs(&Value::Object(body), &mut pending);
    let mut used = BTreeSet::new();
    while let Some(name) = pending.pop() {
        if let (true, Some(def)) = (used.insert(name.clone()), defs.get(&name)) {
            collect_refs(def, &mut pending);
        }
    }
    let Value::Object(root) = schema else { return };
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(map)) = root.get_mut(keyword) {
            map.retain(|name, _| used.contains(name));
            if map.is_empty() {
                root.shift_remove(keyword);
            }
        }
    }
}

/// Every definition named by a `$ref` at or below `value`.
pub(crate) fn collect_refs(value: &Value, out: &mut Vec<String>) {
    let Value::Object(map) = value else { return };
    if let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(def_name) {
        out.push(name);
    }
    for_each_child(map, |_, child| collect_refs(child, out));
}

/// Merges the branches of an `allOf` into the schema holding it: properties and `required` are
/// united, other keywords copied. False (and nothing changed) when two branches disagree on a
/// keyword, or a branch is not an object schema.
pub(crate) fn merge_all_of(map: &mut Object) -> bool {
    let Some(Value::Array(branches)) = map.get("allOf") else {
        return true;
    };
    let mut merged = map.clone();
    merged.shift_remove("allOf");
    for branch in branches {
        let Value::Object(branch) = branch else {
            return false;
        };
        for (keyword, value) in branch {
            match (keyword.as_str(), merged.get_mut(keyword)) {
                (_, None) => {
                    merged.insert(keyword.clone(), value.clone());
                }
                ("properties", Some(Value::Object(properties))) => {
                    let Value::Object(more) = value else {
                        return false;
                    };
                    for (name, schema) in more {
                        if properties.get(name).is_some_and(|s| s != schema) {
                            return false;
                        }
                        properties.insert(name.clone(), schema.clone());
                    }
                }
                ("required", Some(Value::Array(required))) => {
                    for name in value.as_array().into_iter().flatten() {
                        if !required.contains(name) {
                            required.push(name.clone());
                        }
                    }
                }
                ("description", Some(_)) => {}
                (_, Some(existing)) if existing == value => {}
                _ => return false,
            }
        }
    }
    *map = merged;
    true
}

/// True when the schema's `type` is or includes `ty`.
pub(crate) fn has_type(map: &Object, ty: &str) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == ty,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == ty),
        _ => false,
    }
}

/// True when the schema is an object schema: by its `type`, or by having `properties`.
pub(crate) fn is_object(map: &Object) -> bool {
    has_type(map, "object") || (!map.contains_key("type") && map.contains_key("properties"))
}

/// True when `null` is certainly valid against the schema (a `$ref` is not followed).
pub(crate) fn accepts_null(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(map) => {
            let by_type = has_type(map, "null") && map.get("enum").is_none_or(contains_null);
            let by_enum = !map.contains_key("type") && map.get("enum").is_some_and(contains_null);
            let by_const = map.get("const") == Some(&Value::Null);
            let by_branch = ["anyOf", "oneOf"].iter().any(|k| {
                map.get(*k)
                    .and_then(Value::as_array)
                    .is_some_and(|bs| bs.iter().any(accepts_null))
            });
            by_type || by_enum || by_const || by_branch
        }
        _ => false,
    }
}

pub(crate) fn contains_null(values: &Value) -> bool {
    values
        .as_array()
        .is_some_and(|vs| vs.contains(&Value::Null))
}

/// The names in an object schema's `required`.
pub(crate) fn required(map: &Object) -> BTreeSet<String> {
    map.get("required")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Removes what makes an optional field's schema accept `null`: `["string", "null"]` becomes
/// `"string"`, `anyOf: [X, {"type": "null"}]` becomes X. For APIs and clients that read
/// "optional" from `required` alone and trip over the null union.
pub(crate) fn strip_null(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            map.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    for keyword in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get_mut(keyword) else {
            continue;
        };
        branches.retain(|b| !is_null_schema(b));
        if branches.len() == 1 {
            let Some(Value::Object(only)) = branches.pop() else {
                continue;
            };
            map.shift_remove(keyword);
            for (k, v) in only {
                map.entry(k).or_insert(v);
            }
        }
    }
}

/// `{"type": "null"}`, with or without annotations.
pub(crate) fn is_null_schema(schema: &Value) -> bool {
    schema.get("type") == Some(&json!("null")) || schema.get("const") == Some(&Value::Null)
}

#[cfg(test)]
mod tests;
