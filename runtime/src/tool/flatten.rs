//! How serde reads a tool's flattened parameters (`#[serde(flatten)]`), for the checks the
//! toolbox makes of them when it is built.

use serde_json::Value;

use super::{Parameter, ToolDefinition};

impl ToolDefinition {
    /// How serde reads each flattened parameter, in order: each type's schema derived once,
    /// for every check the toolbox makes of them.
    pub(crate) fn flattened_reads(&self) -> Vec<FlattenedRead<'_>> {
        (self.parameters.iter())
            .filter_map(|parameter| match parameter {
                Parameter::Own(_) => None,
                Parameter::Flattened {
                    name,
                    takes,
                    schema,
                } => Some(FlattenedRead::of(name, takes, schema())),
            })
            .collect()
    }

    /// A field of a flattened parameter that serde gives to another parameter first: (that
    /// name, the parameter that takes it). serde reads the parameters of their own first, then
    /// the flattened ones in order; a flattened struct, or an externally tagged enum, takes its
    /// fields away from those after it, an internally tagged enum or a map takes nothing away.
    /// Inside a flattened struct, its own fields come before the enum it flattens.
    pub(crate) fn shadowed_field(&self, reads: &[FlattenedRead<'_>]) -> Option<(String, String)> {
        let mut taken: Vec<(String, String)> = Vec::new();
        for parameter in &self.parameters {
            if let Parameter::Own(name) = parameter {
                taken.extend(self.names_of(name).map(|n| (n.to_string(), name.clone())));
            }
        }
        for read in reads {
            if let Some((field, by)) = taken.iter().find(|(n, _)| read.fields.contains(n)) {
                return Some((field.clone(), by.clone()));
            }
            if let Some(field) = read.shadowed_inside() {
                return Some((field, read.name.to_string()));
            }
            if read.takes_away {
                let fields = read.takes.iter().map(|f| f.to_string());
                let fields = fields.chain(read.fields.iter().cloned());
                taken.extend(fields.map(|f| (f, read.name.to_string())));
            }
        }
        None
    }

    /// The fields of a flattened enum without a tag (`#[serde(untagged)]`), if the arguments
    /// have one: serde reads the first of its branches that parses, whatever fields the call
    /// gave, and drops the fields that branch does not take.
    pub(crate) fn untagged_flattened(&self) -> Option<Vec<String>> {
        untagged_union(&self.input_schema, &self.input_schema, &mut Vec::new())
    }
}

/// The field names of the first union at or below `schema` (through `allOf`, unions and
/// `$ref`s, not properties) whose branches no tag tells apart: neither a `const` field in each
/// (an internally or adjacently tagged enum) nor one field of its own each (an externally
/// tagged one). A branch that takes no field (`{}`, beside a flattened `Option`'s) is none.
fn untagged_union<'a>(
    schema: &'a Value,
    whole: &'a Value,
    path: &mut Vec<&'a str>,
) -> Option<Vec<String>> {
    let map = schema.as_object()?;
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        if path.contains(&reference) {
            return None;
        }
        let target = crate::schema::walk::resolve(schema, whole)?;
        path.push(reference);
        let found = (["allOf", "anyOf", "oneOf"].iter())
            .filter_map(|keyword| target.get(*keyword)?.as_array())
            .flatten()
            .find_map(|branch| untagged_union(branch, whole, path));
        path.pop();
        if found.is_some() {
            return found;
        }
    }
    for branch in map
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(found) = untagged_union(branch, whole, path) {
            return Some(found);
        }
    }
    for keyword in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get(keyword) else {
            continue;
        };
        let lifted = fielded_branches(branches, whole);
        let tagged = lifted
            .iter()
            .all(|branch| branch.properties.values().any(|p| p.get("const").is_some()));
        if lifted.len() > 1 && !tagged && !one_field_of_its_own_each(&lifted) {
            let mut names: Vec<String> = Vec::new();
            for name in lifted.iter().flat_map(|branch| branch.properties.keys()) {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            return Some(names);
        }
        for branch in branches {
            if let Some(found) = untagged_union(branch, whole, path) {
                return Some(found);
            }
        }
    }
    None
}

/// True when `schema` (a type's own, at its root) takes `null`: `"type": [.., "null"]`, or a
/// union with a `{"type": "null"}` branch, as schemars writes an `Option`.
fn takes_null(schema: &Value) -> bool {
    let null = |ty: &Value| match ty {
        Value::String(ty) => ty == "null",
        Value::Array(types) => types.iter().any(|t| t == "null"),
        _ => false,
    };
    schema.get("type").is_some_and(null)
        || (["anyOf", "oneOf"].iter())
            .filter_map(|keyword| schema.get(*keyword)?.as_array())
            .flatten()
            .any(|branch| branch.get("type").is_some_and(null))
}

/// A flattened parameter that takes any field (a map, in a struct or a variant or not) and
/// would be given a field another flattened parameter reads: (the map's parameter, the
/// field, the parameter that reads it). serde gives such a parameter every field not taken
/// away before it, and takes none away itself.
pub(crate) fn map_takes_others_fields(
    reads: &[FlattenedRead<'_>],
) -> Option<(String, String, String)> {
    for (i, open) in reads.iter().enumerate().filter(|(_, r)| r.open) {
        for (j, other) in reads.iter().enumerate() {
            if j == i || (j < i && other.takes_away) {
                continue;
            }
            if let Some(field) = other.fields.first() {
                let (map, parameter) = (open.name.to_string(), other.name.to_string());
                return Some((map, field.clone(), parameter));
            }
        }
    }
    None
}

/// The name of a flattened parameter whose schema takes `null`: an `Option` the macro could
/// not see (behind a type alias), which serde reads as `None` when its fields do not parse.
pub(crate) fn flattened_option<'r>(reads: &'r [FlattenedRead<'_>]) -> Option<&'r str> {
    reads
        .iter()
        .find(|read| takes_null(&read.schema))
        .map(|read| read.name)
}

/// How serde reads one flattened parameter.
pub(crate) struct FlattenedRead<'a> {
    /// The parameter's name.
    name: &'a str,
    /// The names a struct reads by name, aliases included.
    takes: &'static [&'static str],
    /// Its schema.
    schema: Value,
    /// The fields its schema names, a flattened enum's branches' included.
    fields: Vec<String>,
    /// It takes its fields away from the parameters after it: a struct read field by field,
    /// or an externally tagged enum (its one entry).
    takes_away: bool,
    /// It takes any other field: a map, or a struct or branch holding one.
    open: bool,
}

impl<'a> FlattenedRead<'a> {
    fn of(name: &'a str, takes: &'static [&'static str], schema: Value) -> Self {
        let lifted = crate::schema::walk::lift(&schema, &schema);
        let open = lifted.open.is_some() || schema.get("patternProperties").is_some();
        FlattenedRead {
            name,
            takes,
            fields: lifted.properties.keys().cloned().collect(),
            takes_away: !takes.is_empty() || externally_tagged(&schema),
            open,
            schema,
        }
    }

    /// A field of an enum this parameter flattens that one of its own fields has: the struct
    /// takes it first.
    fn shadowed_inside(&self) -> Option<String> {
        let root = self.schema.as_object()?;
        let own = root.get("properties")?.as_object()?;
        let unions: serde_json::Map<String, Value> = (root.iter())
            .filter(|(keyword, _)| ["allOf", "anyOf", "oneOf"].contains(&keyword.as_str()))
            .map(|(keyword, branches)| (keyword.clone(), branches.clone()))
            .collect();
        let branches = crate::schema::walk::lift(&Value::Object(unions), &self.schema);
        own.keys()
            .find(|name| branches.properties.contains_key(*name))
            .cloned()
    }
}

/// True when `schema` is an externally tagged enum's: a union whose branches that take a field
/// each take one of their own, the variant's name, which serde takes away when it reads it (a
/// unit variant is a string, and takes none).
fn externally_tagged(schema: &Value) -> bool {
    ["anyOf", "oneOf"].iter().any(|keyword| {
        let Some(Value::Array(branches)) = schema.get(*keyword) else {
            return false;
        };
        let lifted = fielded_branches(branches, schema);
        !lifted.is_empty() && one_field_of_its_own_each(&lifted)
    })
}

/// The branches of a union lifted into one object each, those that take no field left out
/// (a unit variant's string, the `{}` beside a flattened `Option`'s).
fn fielded_branches(branches: &[Value], whole: &Value) -> Vec<crate::schema::walk::Lifted> {
    (branches.iter())
        .map(|branch| crate::schema::walk::lift(branch, whole))
        .filter(|lifted| !lifted.properties.is_empty())
        .collect()
}

/// True when each branch takes exactly one field, no two the same: an externally tagged
/// enum's, each variant's name.
fn one_field_of_its_own_each(branches: &[crate::schema::walk::Lifted]) -> bool {
    let mut seen: Vec<&String> = Vec::new();
    branches.iter().all(|branch| {
        let mut keys = branch.properties.keys();
        match (keys.next(), keys.next()) {
            (Some(only), None) if !seen.contains(&only) => {
                seen.push(only);
                true
            }
            _ => false,
        }
    })
}
