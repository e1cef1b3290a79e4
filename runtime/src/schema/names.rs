//! The names a tool's arguments may carry when one of its fields is `#[serde(flatten)]`.
//!
//! serde cannot refuse unknown fields beside a flattened map or enum: `deny_unknown_fields`
//! then refuses the map's keys and the enum's tag too, so such a tool could not be called at
//! all. Its arguments type is derived without it, and the names are checked here instead,
//! against the schema the model was given: a name no part of it takes is refused, as serde
//! would refuse it, and so is a set of names no one branch of a flattened enum takes together.

use std::collections::BTreeSet;

use serde::de::{self, Visitor};
use serde_json::{Map, Value};

/// What follows the field's name in the refusal of a field of one branch beside another's.
pub(super) const DOES_NOT_GO_WITH: &str = "` does not go with the other fields given";

/// A refusal of the names given, in serde's words, and whether it says they are no whole call
/// (a field of one branch beside another's, a branch's field missing) rather than that a name or
/// value is wrong: the status companion then checks the key alone.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    problem: String,
    pub(super) not_whole: bool,
}

impl Refused {
    fn wrong(problem: String) -> Refused {
        Refused {
            problem,
            not_whole: false,
        }
    }

    fn not_whole(problem: String) -> Refused {
        Refused {
            problem,
            not_whole: true,
        }
    }
}

impl std::ops::Deref for Refused {
    type Target = str;

    fn deref(&self) -> &str {
        &self.problem
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.problem)
    }
}

/// The names an object schema takes.
#[derive(Default, Debug)]
pub(super) struct Names {
    /// Names taken whatever else is given.
    fixed: BTreeSet<String>,
    /// Any name is taken: a flattened map, or a schema that does not say.
    open: bool,
    /// Groups of branches (`oneOf`, `anyOf`): in each, one branch must take what is left.
    choices: Vec<Vec<Names>>,
    /// Fields that hold one value only (`const`): a flattened enum's tag, in its branch.
    tags: Vec<(String, Value)>,
    /// Fields that must be given (`required`).
    required: BTreeSet<String>,
}

/// The names a call gives, and their values where known.
struct Given<'a> {
    names: BTreeSet<&'a str>,
    args: Option<&'a Map<String, Value>>,
}

impl Given<'_> {
    /// False when `branch` cannot be the one serde reads: its tag holds another value here.
    fn tags_agree(&self, branch: &Names) -> bool {
        let Some(args) = self.args else {
            return true;
        };
        (branch.tags.iter()).all(|(tag, value)| args.get(tag).is_none_or(|v| v == value))
    }
}

/// How deep `$ref`s and combinators are followed; a recursive type stops here, open.
const DEPTH: usize = 32;

impl Names {
    /// The names `schema` (a canonical root schema) takes, and `extra` besides: aliases, which
    /// no schema lists.
    pub(super) fn of(schema: &Value, extra: &[&str]) -> Names {
        let defs = schema.get("$defs").and_then(Value::as_object);
        let mut names = Names::default();
        names.read(schema, defs, DEPTH);
        names.fixed.extend(extra.iter().map(|s| s.to_string()));
        names
    }

    fn read(&mut self, schema: &Value, defs: Option<&Map<String, Value>>, depth: usize) {
        let Value::Object(map) = schema else {
            // `true` takes anything; `false` takes nothing, and serde refuses it first.
            self.open |= schema == &Value::Bool(true);
            return;
        };
        if depth == 0 {
            self.open = true;
            return;
        }
        if let Some(Value::Object(properties)) = map.get("properties") {
            self.fixed.extend(properties.keys().cloned());
            let tags = properties
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p.get("const")?.clone())));
            self.tags.extend(tags);
        }
        if let Some(Value::Array(required)) = map.get("required") {
            let required = required
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string);
            self.required.extend(required);
        }
        for keyword in [
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
        ] {
            if map.get(keyword).is_some_and(|v| v != &Value::Bool(false)) {
                self.open = true;
            }
        }
        if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
            match reference
                .strip_prefix("#/$defs/")
                .and_then(|name| defs?.get(name))
            {
                Some(def) => self.read(def, defs, depth - 1),
                None => self.open = true,
            }
        }
        if let Some(Value::Array(all)) = map.get("allOf") {
            for part in all {
                self.read(part, defs, depth - 1);
            }
        }
        for keyword in ["oneOf", "anyOf"] {
            if let Some(Value::Array(branches)) = map.get(keyword) {
                let group = branches
                    .iter()
                    .map(|branch| {
                        let mut names = Names::default();
                        names.read(branch, defs, depth - 1);
                        names
                    })
                    .collect();
                self.choices.push(group);
            }
        }
    }

    /// True when this schema takes a name beside `names`.
    pub(super) fn takes_other(&self, names: &[String]) -> bool {
        self.open
            || self.fixed.iter().any(|n| !names.contains(n))
            || self.choices.iter().flatten().any(|b| b.takes_other(names))
    }

    /// Every name this schema takes anywhere, in order.
    fn all(&self, into: &mut BTreeSet<String>) {
        into.extend(self.fixed.iter().cloned());
        for branch in self.choices.iter().flatten() {
            branch.all(into);
        }
    }

    /// Checks the names `given`: `Err` with the problem in serde's words when one is not taken.
    #[cfg(test)]
    pub(super) fn check<'a>(&self, given: impl Iterator<Item = &'a str>) -> Result<(), String> {
        self.check_given(&Given {
            names: given.collect(),
            args: None,
        })
        .map_err(|refused| refused.problem)
    }

    fn check_given(&self, given: &Given<'_>) -> Result<(), Refused> {
        if self.open {
            return Ok(());
        }
        let rest: Vec<&str> = (given.names.iter().copied())
            .filter(|n| !self.fixed.contains(*n))
            .collect();
        self.check_rest(rest, given)
    }

    /// Checks the names and the tags of `args`: a tag every branch of a group has (a flattened
    /// enum's `method`) must hold one branch's value. serde reads a tag as a variant's name or
    /// its index, so `"method": 1` would be a refund to the second branch, which the schema
    /// does not say.
    pub(super) fn check_args(&self, args: &Map<String, Value>) -> Result<(), Refused> {
        for group in &self.choices {
            let tags = group.first().map(|b| b.tags.as_slice()).unwrap_or_default();
            for (tag, _) in tags {
                let Some(taken) = tag_values(group, tag) else {
                    continue;
                };
                match args.get(tag) {
                    Some(value) if !taken.contains(&value) => {
                        let listed: Vec<String> = taken.iter().map(|v| v.to_string()).collect();
                        return Err(Refused::wrong(format!(
                            "field `{tag}` holds {value}, which no form of the arguments takes: expected one of {}",
                            listed.join(", ")
                        )));
                    }
                    _ => {}
                }
            }
        }
        self.check_given(&Given {
            names: args.keys().map(String::as_str).collect(),
            args: Some(args),
        })
    }

    /// Checks, once serde has read `args`, that each branch it read fields of was given whole.
    /// serde reads a flattened `Option` whose fields do not parse as `None`: `"method": "card"`
    /// without `last4` would run with no card at all, the fields given dropped in silence. A
    /// flattened `Option` is a compile error, and one behind a type alias does not build; one
    /// inside a flattened struct is out of sight of both, but its schema (`anyOf` of the enum
    /// and `{}`) is not.
    pub(super) fn check_whole(&self, args: &Map<String, Value>) -> Result<(), Refused> {
        self.check_whole_given(&Given {
            names: args.keys().map(String::as_str).collect(),
            args: Some(args),
        })
    }

    /// [`check_whole`](Self::check_whole), where a name this schema's own properties take
    /// (another parameter's, a flattened struct's) touches no branch: it was given for them.
    fn check_whole_given(&self, given: &Given<'_>) -> Result<(), Refused> {
        for group in &self.choices {
            let touches = |branch: &Names| branch.takes_given(given, &self.fixed);
            if !group.iter().any(touches) {
                continue;
            }
            let read = serde_reads(group, given);
            let missing = |branch: &&Names| branch.missing(given).is_some();
            if let Some(whole) = read.iter().find(|b| touches(b) && !missing(b)) {
                whole.check_whole_given(given)?;
                continue;
            }
            let Some(name) = (read.iter().copied())
                .chain(group)
                .filter(|b| touches(b))
                .find_map(|b| b.missing(given))
            else {
                continue;
            };
            return Err(Refused::not_whole(format!("missing field `{name}`")));
        }
        Ok(())
    }

    /// True when this schema takes a name `given` has, other than those in `except`.
    fn takes_given(&self, given: &Given<'_>, except: &BTreeSet<String>) -> bool {
        let given_here = |n: &String| given.names.contains(n.as_str()) && !except.contains(n);
        self.fixed.iter().any(given_here)
            || (self.choices.iter().flatten()).any(|branch| branch.takes_given(given, except))
    }

    /// The first field this branch requires that `given` lacks.
    fn missing(&self, given: &Given<'_>) -> Option<&String> {
        (self.required.iter()).find(|name| !given.names.contains(name.as_str()))
    }

    fn check_rest(&self, rest: Vec<&str>, given: &Given<'_>) -> Result<(), Refused> {
        let groups: Vec<&[Names]> = self.choices.iter().map(Vec::as_slice).collect();
        let (left, taken) = left(rest, &groups, given);
        let Some(name) = left.first() else {
            return Ok(());
        };
        let mut known = BTreeSet::new();
        self.all(&mut known);
        if !known.contains(*name) {
            return Err(Refused::wrong(format!(
                "unknown field `{name}`, expected one of {}",
                listed(&self.fixed, known.iter())
            )));
        }
        Err(Refused::not_whole(format!(
            "field `{name}{DOES_NOT_GO_WITH}: with them, expected only {}",
            listed(&self.fixed, taken.iter())
        )))
    }
}

/// The values `tag` holds in the branches of `group`, when every branch has it as a tag.
fn tag_values<'a>(group: &'a [Names], tag: &str) -> Option<Vec<&'a Value>> {
    let mut values = Vec::new();
    for branch in group {
        let before = values.len();
        let own = branch.tags.iter().filter(|(name, _)| name == tag);
        values.extend(own.map(|(_, value)| value));
        if values.len() == before {
            return None;
        }
    }
    Some(values)
}

/// `fixed` and then `more`, each once, as serde lists names: `` `a`, `b` ``.
fn listed<'a>(fixed: &'a BTreeSet<String>, more: impl Iterator<Item = &'a String>) -> String {
    let mut seen = BTreeSet::new();
    fixed
        .iter()
        .chain(more)
        .filter(|n| seen.insert(n.as_str()))
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is left of `rest` when each group's best branch has taken its names, and the names
/// the branches chosen take: nothing left when the names are taken.
fn left<'a>(
    rest: Vec<&'a str>,
    groups: &[&[Names]],
    given: &Given<'_>,
) -> (Vec<&'a str>, BTreeSet<String>) {
    let Some((first, others)) = groups.split_first() else {
        return (rest, BTreeSet::new());
    };
    let mut best: Option<(Vec<&str>, BTreeSet<String>)> = None;
    for branch in serde_reads(first, given) {
        if branch.open {
            return (Vec::new(), BTreeSet::new());
        }
        let after: Vec<&str> = rest
            .iter()
            .copied()
            .filter(|n| !branch.fixed.contains(*n))
            .collect();
        let mut groups: Vec<&[Names]> = branch.choices.iter().map(Vec::as_slice).collect();
        groups.extend_from_slice(others);
        let (left, mut taken) = left(after, &groups, given);
        taken.extend(branch.fixed.iter().cloned());
        if left.is_empty() {
            return (left, taken);
        }
        if best.as_ref().is_none_or(|(l, _)| left.len() < l.len()) {
            best = Some((left, taken));
        }
    }
    // A group with no branch takes nothing and leaves everything.
    best.unwrap_or_else(|| left(rest, others, given))
}

/// The branches of `group` serde may read the call as. A tagged branch only where the tag
/// given is its own: `"kind": "pickup"` beside `address` is no delivery, and `address` would be
/// dropped. An untagged group's branches are tried in order, so the first whose required
/// fields are all given is the one read, whatever a later branch would take.
fn serde_reads<'g>(group: &'g [Names], given: &Given<'_>) -> Vec<&'g Names> {
    if group.iter().all(|branch| branch.tags.is_empty()) {
        let first = group.iter().find(|branch| {
            (branch.required.iter()).all(|name| given.names.contains(name.as_str()))
        });
        return match first {
            Some(branch) => vec![branch],
            None => group.iter().collect(),
        };
    }
    group.iter().filter(|b| given.tags_agree(b)).collect()
}

/// The names a struct type reads its fields by, aliases included, as serde's derive lists
/// them (`zip` and `zip_code` for a `zip` also read as `zip_code`); none for other types: a
/// map's and an enum's names are in the schema, or it is open.
pub fn struct_fields<T: de::DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(Introspect) {
        Err(Found(Some(fields))) => fields,
        _ => &[],
    }
}

/// A deserializer that reads nothing and says which fields a struct asked for.
struct Introspect;

/// The error [`Introspect`] ends every read with: the struct's fields when it asked for them.
#[derive(Debug)]
struct Found(Option<&'static [&'static str]>);

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("introspection")
    }
}

impl std::error::Error for Found {}

impl de::Error for Found {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Found(None)
    }
}

impl<'de> de::Deserializer<'de> for Introspect {
    type Error = Found;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Found> {
        Err(Found(None))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Found> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Found> {
        Err(Found(Some(fields)))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(names: &Names, given: &[&str]) -> Result<(), String> {
        names.check(given.iter().copied())
    }

    #[test]
    fn a_name_is_taken_by_the_root_or_by_one_branch_with_the_rest() {
        let schema = json!({
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "oneOf": [
                {"properties": {"method": {"const": "card"}, "last4": {"type": "string"}}},
                {"$ref": "#/$defs/Bank"}
            ],
            "$defs": {"Bank": {"properties": {"method": {"const": "bank"}, "iban": {"type": "string"}}}}
        });
        let names = Names::of(&schema, &["purchase"]);
        assert_eq!(check(&names, &["order", "method", "last4"]), Ok(()));
        assert_eq!(check(&names, &["order", "method", "iban"]), Ok(()));
        assert_eq!(check(&names, &["purchase"]), Ok(()));
        let unknown = check(&names, &["order", "bogus"]).unwrap_err();
        assert!(unknown.starts_with("unknown field `bogus`"), "{unknown}");
        let mixed = check(&names, &["last4", "iban"]).unwrap_err();
        assert!(
            mixed.starts_with("field `iban` does not go with"),
            "{mixed}"
        );
        assert!(
            mixed.contains("`last4`") && !mixed.ends_with("`iban`"),
            "{mixed}"
        );
    }

    /// Found by fuzzing: serde reads a tag's value as a variant's index too, so `"method": 1`
    /// (or `1.0`) paid back to a bank account, a value the schema does not take.
    #[test]
    fn a_tag_holds_one_branchs_value_and_nothing_else() {
        let schema = json!({
            "properties": {"order": {}},
            "oneOf": [
                {"properties": {"method": {"const": "card"}, "last4": {}}},
                {"properties": {"method": {"const": "bank"}, "iban": {}}}
            ]
        });
        let names = Names::of(&schema, &[]);
        let args = |value: Value| json!({"order": "o", "method": value, "iban": "x"});
        let args = |value| args(value).as_object().unwrap().clone();
        assert_eq!(names.check_args(&args(json!("bank"))), Ok(()));
        for value in [
            json!(1),
            json!(1.0),
            json!("Bank"),
            json!(null),
            json!(["bank"]),
        ] {
            let err = names.check_args(&args(value.clone())).unwrap_err();
            assert!(err.starts_with("field `method` holds "), "{value}: {err}");
            assert!(err.ends_with(r#"expected one of "card", "bank""#), "{err}");
        }
        // A field named like a tag in one branch only is not a tag of the group.
        let loose = json!({"oneOf": [
            {"properties": {"kind": {"const": "a"}}},
            {"properties": {"kind": {"type": "string"}}}
        ]});
        let loose = Names::of(&loose, &[]);
        let kind = json!({"kind": "z"});
        assert_eq!(loose.check_args(kind.as_object().unwrap()), Ok(()));
    }

    /// Found in review: the names were checked against any branch, so a tag naming one branch
    /// beside another branch's field ran as the tag's branch, the field dropped in silence.
    #[test]
    fn the_branch_a_tag_names_must_take_the_fields_given() {
        let schema = json!({
            "properties": {"order": {}},
            "oneOf": [
                {"properties": {"kind": {"const": "pickup"}}, "required": ["kind"]},
                {"properties": {"kind": {"const": "deliver"}, "address": {}},
                 "required": ["kind", "address"]}
            ]
        });
        let names = Names::of(&schema, &[]);
        let args = |v: Value| v.as_object().unwrap().clone();
        let pickup = args(json!({"order": "o", "kind": "pickup", "address": "Main St"}));
        let err = names.check_args(&pickup).unwrap_err();
        assert!(err.starts_with("field `address` does not go with"), "{err}");
        let deliver = args(json!({"order": "o", "kind": "deliver", "address": "Main St"}));
        assert_eq!(names.check_args(&deliver), Ok(()));
        assert_eq!(names.check_args(&args(json!({"kind": "pickup"}))), Ok(()));
    }

    /// Found in review: serde reads an untagged enum's first branch that parses, so `w` and `h`
    /// ran as a square, `h` dropped. The branch serde reads must take every field given.
    #[test]
    fn an_untagged_group_is_read_as_serde_reads_it_first_branch_first() {
        let schema = json!({"anyOf": [
            {"properties": {"w": {}}, "required": ["w"]},
            {"properties": {"w": {}, "h": {}}, "required": ["w", "h"]}
        ]});
        let names = Names::of(&schema, &[]);
        assert_eq!(check(&names, &["w"]), Ok(()));
        let err = check(&names, &["w", "h"]).unwrap_err();
        assert!(err.starts_with("field `h` does not go with"), "{err}");
        // Externally tagged: each branch requires its own name.
        let external = json!({"oneOf": [
            {"properties": {"Card": {}}, "required": ["Card"]},
            {"properties": {"Bank": {}}, "required": ["Bank"]}
        ]});
        let external = Names::of(&external, &[]);
        assert_eq!(check(&external, &["Bank"]), Ok(()));
        assert!(check(&external, &["Card", "Bank"]).is_err());
    }

    #[test]
    fn a_map_takes_any_name_and_absent_additional_properties_do_not() {
        let map = json!({"properties": {"a": {}}, "additionalProperties": {"type": "string"}});
        assert_eq!(check(&Names::of(&map, &[]), &["a", "anything"]), Ok(()));
        let plain = json!({"properties": {"a": {}}});
        assert!(check(&Names::of(&plain, &[]), &["b"]).is_err());
        let names = Names::of(&plain, &[]);
        assert!(!names.takes_other(&["a".to_string()]));
        assert!(Names::of(&map, &[]).takes_other(&["a".to_string()]));
    }

    #[test]
    fn two_flattened_enums_each_take_their_own_branch() {
        let schema = json!({
            "properties": {"id": {}},
            "allOf": [
                {"oneOf": [
                    {"properties": {"a": {}}, "required": ["a"]},
                    {"properties": {"b": {}}, "required": ["b"]}
                ]},
                {"oneOf": [
                    {"properties": {"x": {}}, "required": ["x"]},
                    {"properties": {"y": {}}, "required": ["y"]}
                ]}
            ]
        });
        let names = Names::of(&schema, &[]);
        assert_eq!(check(&names, &["id", "b", "x"]), Ok(()));
        assert!(check(&names, &["a", "b"]).is_err());
        assert!(check(&names, &["x", "y"]).is_err());
    }

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Address {
        #[serde(alias = "zip_code")]
        zip: String,
        city: String,
    }

    #[test]
    fn a_structs_fields_are_read_with_their_aliases_and_other_types_have_none() {
        assert_eq!(struct_fields::<Address>(), ["zip", "zip_code", "city"]);
        assert_eq!(
            struct_fields::<Option<Address>>(),
            ["zip", "zip_code", "city"]
        );
        assert!(struct_fields::<std::collections::BTreeMap<String, String>>().is_empty());
        assert!(struct_fields::<String>().is_empty());
    }
}
