//! Objects nested in a tool's arguments carry only the fields their schema names.
//!
//! serde ignores a field that a struct without `deny_unknown_fields` does not declare, and reads
//! an untagged enum as its first branch that parses, ignoring the fields of the others. A nested
//! struct is such a struct unless its author said otherwise, so `{"shipping": {"expres": true}}`
//! ran as a shipping without `express`, and `{"email": .., "phone": .., "cc": ..}` as an email
//! contact, the phone dropped: the model asked for something and the tool did something else, in
//! silence. The canonical schema closes every plain object, so by the schema the model was given
//! those calls are invalid, and here they are refused as such, before anything is done.
//!
//! The check follows the schema, not serde: an object is refused only where no form the schema
//! gives it (a branch of a union, its tags agreeing) takes all its fields, so no call the schema
//! takes is refused. It is built once per tool, when the toolbox is built, and only a tool with
//! a closed object below its top level has one: the top level is serde's (or, beside a flattened
//! field, [`Names`](super::names)'), and a tool of scalar fields pays nothing per call.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value};

use super::names::DOES_NOT_GO_WITH;

/// How deep `$ref`s and unions are followed; below that, anything is taken.
const DEPTH: usize = 32;

/// How many schemas are read for one tool at most (a union of unions of one type, read once per
/// branch, could otherwise take time that grows as a power of its depth); past that, anything
/// is taken.
const BUDGET: usize = 4096;

/// The check of the objects below a tool's top level: the value of each top-level field named
/// here is checked against its schema.
pub(crate) struct Nested {
    /// Each schema read, by its index: the ways a value there may be written.
    shapes: Vec<Vec<Form>>,
    /// The top-level fields whose values hold a closed object somewhere.
    fields: BTreeMap<String, usize>,
    /// Each shape's forms, those it refers to in their place, as (shape, form) indices: found
    /// once, so a call follows no reference.
    resolved: Vec<Vec<(usize, usize)>>,
}

/// A definition printed with `{:?}` names the fields checked, not every shape read.
impl std::fmt::Debug for Nested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<&String> = self.fields.keys().collect();
        f.debug_struct("Nested")
            .field("fields", &fields)
            .finish_non_exhaustive()
    }
}

/// One way a value may be written.
#[derive(Debug)]
enum Form {
    /// Anything: a schema that does not say, or one this check does not read (`allOf`, a union
    /// beside properties, an object open to fields by pattern).
    Any,
    /// An object.
    Object(Object),
    /// An array: the shapes of its first items, each its own (a tuple), and of the items after
    /// them, if the schema gives them.
    Array(Vec<usize>, Option<usize>),
    /// The forms of another shape: a `$defs` entry, read once however often it is named.
    Ref(usize),
    /// A value of another kind (a string, a number, `null`): not an object or an array.
    Other,
}

#[derive(Debug)]
struct Object {
    /// Its properties, and the shape of each one's value.
    properties: BTreeMap<String, usize>,
    /// Properties that hold one value only (an internally tagged enum's tag).
    tags: Vec<(String, Value)>,
    /// Whether it takes fields its properties do not name, and the shape of their values if
    /// the schema gives one (a map's values).
    open: bool,
    other: Option<usize>,
}

/// Why an object was refused: where it is, what is wrong, and the field to fix.
#[derive(Debug, PartialEq)]
pub(crate) struct Refusal {
    pub path: String,
    pub problem: String,
    pub field: String,
}

impl Nested {
    /// The check of the objects below the top level of arguments described by `schema` (a
    /// canonical root schema): none when no closed object is below it.
    pub(crate) fn of(schema: &Value) -> Option<Nested> {
        let mut reader = Reader {
            root: schema,
            shapes: Vec::new(),
            refs: HashMap::new(),
            budget: BUDGET,
        };
        let properties = schema.get("properties").and_then(Value::as_object)?;
        let read: Vec<(String, usize)> = properties
            .iter()
            .map(|(name, part)| (name.clone(), reader.shape(part, DEPTH)))
            .collect();
        let shapes = reader.shapes;
        let closing = closing(&shapes);
        let fields: BTreeMap<String, usize> =
            (read.into_iter()).filter(|(_, id)| closing[*id]).collect();
        let resolved = (0..shapes.len()).map(|id| resolve(&shapes, id)).collect();
        (!fields.is_empty()).then_some(Nested {
            shapes,
            fields,
            resolved,
        })
    }

    /// Checks the objects below the top level of `args`: `Err` names the first object that
    /// carries a field no form of its schema takes with the others.
    pub(crate) fn check(&self, args: &Map<String, Value>) -> Result<(), Refusal> {
        for (name, &id) in &self.fields {
            if let Some(value) = args.get(name) {
                self.check_value(id, value, &At::Field(None, name))?;
            }
        }
        Ok(())
    }

    /// The forms of shape `id`, those it refers to in their place.
    fn forms(&self, id: usize) -> impl Iterator<Item = &Form> + Clone {
        (self.resolved[id].iter()).map(|&(shape, form)| &self.shapes[shape][form])
    }

    fn check_value(&self, id: usize, value: &Value, at: &At<'_>) -> Result<(), Refusal> {
        let forms = self.forms(id);
        if forms.clone().any(|f| matches!(f, Form::Any)) {
            return Ok(());
        }
        match value {
            Value::Object(map) => {
                let objects = || {
                    (forms.clone())
                        .filter_map(|f| match f {
                            Form::Object(object) => Some(object),
                            _ => None,
                        })
                        .filter(|object| tags_agree(object, map))
                };
                let mut best: Option<(usize, Refusal)> = None;
                for object in objects() {
                    match self.check_object(object, map, at) {
                        Ok(()) => return Ok(()),
                        Err(mut refusal) => {
                            let taken = map.keys().filter(|k| takes(object, k)).count();
                            if best.as_ref().is_none_or(|(t, _)| taken > *t) {
                                if refusal.problem.is_empty() {
                                    let all: Vec<&Object> = objects().collect();
                                    refusal.problem = not_taken(&refusal.field, object, &all);
                                    refusal.field = format!("{at}.{}", refusal.field);
                                }
                                best = Some((taken, refusal));
                            }
                        }
                    }
                }
                if let Some((_, refusal)) = best {
                    return Err(refusal);
                }
                // No object form whose tags agree: a tag no form holds (serde reads it as a
                // `#[serde(other)]` variant, dropping the other fields), or no object form at all
                // (serde read it as a custom type does: nothing to check).
                match no_form_holds(forms, map) {
                    Some((tag, problem)) => Err(Refusal {
                        path: at.to_string(),
                        problem,
                        field: format!("{at}.{tag}"),
                    }),
                    None => Ok(()),
                }
            }
            Value::Array(items) => {
                let mut first = None;
                for form in forms {
                    let Form::Array(prefix, rest) = form else {
                        continue;
                    };
                    let shape_of = |i: usize| prefix.get(i).copied().or(*rest);
                    let checked = (items.iter().enumerate()).try_for_each(|(i, item)| {
                        shape_of(i).map_or(Ok(()), |shape| {
                            self.check_value(shape, item, &At::Index(at, i))
                        })
                    });
                    match checked {
                        Ok(()) => return Ok(()),
                        Err(refusal) => {
                            first.get_or_insert(refusal);
                        }
                    }
                }
                first.map_or(Ok(()), Err)
            }
            _ => Ok(()),
        }
    }

    /// Checks `map` as `object`. A field `object` does not take is refused with no problem
    /// yet, and the field's name alone: the caller, which knows the other forms, words it.
    fn check_object(
        &self,
        object: &Object,
        map: &Map<String, Value>,
        at: &At<'_>,
    ) -> Result<(), Refusal> {
        if let Some(name) = map.keys().find(|k| !takes(object, k)) {
            return Err(Refusal {
                path: at.to_string(),
                problem: String::new(),
                field: name.clone(),
            });
        }
        for (name, value) in map {
            let shape = match object.properties.get(name) {
                Some(&id) => Some(id),
                None => object.other,
            };
            if let Some(id) = shape {
                self.check_value(id, value, &At::Field(Some(at), name))?;
            }
        }
        Ok(())
    }
}

/// Where a value is in the arguments, written only for a refusal: `lines[1].parts`.
enum At<'a> {
    /// A field of the object at the first (none: of the arguments).
    Field(Option<&'a At<'a>>, &'a str),
    /// An item of the array at the first.
    Index(&'a At<'a>, usize),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Field(None, name) => write!(f, "{name}"),
            At::Field(Some(at), name) => write!(f, "{at}.{name}"),
            At::Index(at, i) => write!(f, "{at}[{i}]"),
        }
    }
}

/// The tag in `map` that no object form of `forms` holds its value for, and the problem in
/// words: none when some object form's tags agree, or there is no object form.
fn no_form_holds<'f>(
    forms: impl Iterator<Item = &'f Form>,
    map: &Map<String, Value>,
) -> Option<(String, String)> {
    let objects: Vec<&Object> = forms
        .filter_map(|f| match f {
            Form::Object(object) => Some(object),
            _ => None,
        })
        .collect();
    let first = objects.first()?;
    let (tag, value) = (first.tags.iter())
        .find_map(|(tag, held)| map.get(tag).filter(|v| *v != held).map(|v| (tag, v)))?;
    let mut held: Vec<String> = Vec::new();
    for object in &objects {
        for (name, value) in &object.tags {
            if name == tag && !held.contains(&value.to_string()) {
                held.push(value.to_string());
            }
        }
    }
    let problem = format!(
        "field `{tag}` holds {value}, which no form of it takes: expected one of {}",
        held.join(", ")
    );
    Some((tag.clone(), problem))
}

/// True when `object` takes a field named `name`.
fn takes(object: &Object, name: &str) -> bool {
    object.open || object.properties.contains_key(name)
}

/// False when a tag of `object` holds another value in `map`.
fn tags_agree(object: &Object, map: &Map<String, Value>) -> bool {
    (object.tags.iter()).all(|(tag, value)| map.get(tag).is_none_or(|v| v == value))
}

/// Why field `name`, which `object` does not take, is refused: unknown, if no form of `objects`
/// takes it; else, it does not go with the others given.
fn not_taken(name: &str, object: &Object, objects: &[&Object]) -> String {
    let names = |objects: &[&Object]| {
        let all: BTreeSet<&str> = (objects.iter())
            .flat_map(|o| o.properties.keys().map(String::as_str))
            .collect();
        let listed: Vec<String> = all.iter().map(|n| format!("`{n}`")).collect();
        listed.join(", ")
    };
    if objects.iter().any(|o| takes(o, name)) {
        format!(
            "field `{name}{DOES_NOT_GO_WITH}: with them, expected only {}",
            names(&[object])
        )
    } else {
        format!("unknown field `{name}`, expected one of {}", names(objects))
    }
}

/// The forms of shape `id` in `shapes`, those it refers to in their place, as (shape, form)
/// indices (a reference cycle, which says nothing, adds nothing).
fn resolve(shapes: &[Vec<Form>], id: usize) -> Vec<(usize, usize)> {
    fn gather(
        shapes: &[Vec<Form>],
        id: usize,
        forms: &mut Vec<(usize, usize)>,
        seen: &mut Vec<usize>,
    ) {
        for (i, form) in shapes[id].iter().enumerate() {
            match form {
                Form::Ref(to) if !seen.contains(to) => {
                    seen.push(*to);
                    gather(shapes, *to, forms, seen);
                }
                Form::Ref(_) => {}
                _ => forms.push((id, i)),
            }
        }
    }
    let mut forms = Vec::new();
    gather(shapes, id, &mut forms, &mut vec![id]);
    forms
}

/// For each shape, whether a value there may hold a closed object: where the check has work.
fn closing(shapes: &[Vec<Form>]) -> Vec<bool> {
    let mut closing: Vec<bool> = (shapes.iter())
        .map(|forms| {
            (forms.iter()).any(|f| matches!(f, Form::Object(o) if !o.open))
                && !forms.iter().any(|f| matches!(f, Form::Any))
        })
        .collect();
    // What holds a closing shape closes too: spread until nothing changes (shapes refer to
    // each other, a recursive type to itself).
    loop {
        let mut changed = false;
        for (id, forms) in shapes.iter().enumerate() {
            if closing[id] || forms.iter().any(|f| matches!(f, Form::Any)) {
                continue;
            }
            let holds = forms.iter().any(|form| match form {
                Form::Object(o) => {
                    (o.properties.values().chain(&o.other)).any(|&inner| closing[inner])
                }
                Form::Array(prefix, rest) => prefix.iter().chain(rest).any(|&i| closing[i]),
                Form::Ref(inner) => closing[*inner],
                _ => false,
            });
            if holds {
                closing[id] = true;
                changed = true;
            }
        }
        if !changed {
            return closing;
        }
    }
}

/// Reads schemas into shapes, each `$ref` once.
struct Reader<'s> {
    /// The root schema, which holds the definitions `$ref`s name.
    root: &'s Value,
    shapes: Vec<Vec<Form>>,
    refs: HashMap<String, usize>,
    /// How many more schemas may be read.
    budget: usize,
}

impl<'s> Reader<'s> {
    /// The shape of a value described by `schema`.
    fn shape(&mut self, schema: &'s Value, depth: usize) -> usize {
        if let Some(name) = only_ref(schema) {
            return self.def_shape(name, depth);
        }
        let id = self.shapes.len();
        self.shapes.push(vec![Form::Any]);
        self.shapes[id] = self.forms(schema, depth);
        id
    }

    /// The shape of definition `name`, read the first time it is named.
    fn def_shape(&mut self, name: String, depth: usize) -> usize {
        if let Some(&id) = self.refs.get(&name) {
            return id;
        }
        let id = self.shapes.len();
        self.shapes.push(vec![Form::Any]);
        let def = self.def(&name);
        self.refs.insert(name, id);
        let forms = match def {
            Some(def) => self.forms(def, depth),
            None => vec![Form::Any],
        };
        self.shapes[id] = forms;
        id
    }

    /// Definition `name` of the root schema, in `$defs` or `definitions`.
    fn def(&self, name: &str) -> Option<&'s Value> {
        let root = self.root;
        (root.get("$defs").and_then(|defs| defs.get(name)))
            .or_else(|| root.get("definitions")?.get(name))
    }

    /// The forms `schema` gives a value.
    fn forms(&mut self, schema: &'s Value, depth: usize) -> Vec<Form> {
        let Value::Object(map) = schema else {
            return vec![Form::Any];
        };
        if depth == 0 || self.budget == 0 {
            return vec![Form::Any];
        }
        self.budget -= 1;
        let unread = ["allOf", "not", "if", "unevaluatedProperties"];
        if unread.iter().any(|k| map.contains_key(*k)) {
            return vec![Form::Any];
        }
        let union = ["anyOf", "oneOf"].iter().find_map(|k| map.get(*k));
        let object_words = [
            "properties",
            "additionalProperties",
            "patternProperties",
            "required",
        ];
        let objectish = object_words.iter().any(|k| map.contains_key(*k));
        if let Some(union) = union {
            let Value::Array(branches) = union else {
                return vec![Form::Any];
            };
            if objectish || map.contains_key("$ref") || map.contains_key("type") {
                // A union beside what every branch shares: not read here.
                return vec![Form::Any];
            }
            let mut forms = Vec::new();
            for branch in branches {
                match only_ref(branch) {
                    Some(name) => forms.push(Form::Ref(self.def_shape(name, depth - 1))),
                    None => forms.extend(self.forms(branch, depth - 1)),
                }
            }
            return forms;
        }
        if let Some(name) = map.get("$ref").and_then(Value::as_str) {
            if objectish {
                return vec![Form::Any];
            }
            return match super::walk::def_name(name) {
                Some(name) => vec![Form::Ref(self.def_shape(name, depth - 1))],
                None => vec![Form::Any],
            };
        }
        let types: Vec<&str> = match map.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let arrayish = map.contains_key("items") || map.contains_key("prefixItems");
        if types.is_empty() && !objectish && !arrayish {
            // `{}`, an `enum` or a `const` of no declared type: nothing read here.
            return vec![Form::Any];
        }
        let mut forms = Vec::new();
        if types.contains(&"object") || (types.is_empty() && objectish) {
            forms.push(Form::Object(self.object(map, depth)));
        }
        if types.contains(&"array") || (types.is_empty() && arrayish) {
            let prefix = match map.get("prefixItems") {
                Some(Value::Array(first)) => (first.iter())
                    .map(|item| self.shape(item, depth - 1))
                    .collect(),
                _ => Vec::new(),
            };
            let rest = match map.get("items") {
                Some(items @ Value::Object(_)) => Some(self.shape(items, depth - 1)),
                _ => None,
            };
            forms.push(Form::Array(prefix, rest));
        }
        if types.iter().any(|t| *t != "object" && *t != "array") {
            forms.push(Form::Other);
        }
        forms
    }

    fn object(&mut self, map: &'s Map<String, Value>, depth: usize) -> Object {
        let mut object = Object {
            properties: BTreeMap::new(),
            tags: Vec::new(),
            open: true,
            other: None,
        };
        if let Some(Value::Object(properties)) = map.get("properties") {
            for (name, part) in properties {
                if let Some(value) = part.get("const") {
                    object.tags.push((name.clone(), value.clone()));
                }
                let id = self.shape(part, depth - 1);
                object.properties.insert(name.clone(), id);
            }
        }
        match map.get("additionalProperties") {
            Some(Value::Bool(false)) => object.open = false,
            Some(other @ Value::Object(_)) => object.other = Some(self.shape(other, depth - 1)),
            _ => {}
        }
        if let Some(patterns) = map.get("patternProperties") {
            // A map keyed by numbers (`"^\d+$"`), whose keys serde has read: each value is
            // the pattern's, where there is one pattern and nothing else takes other fields.
            object.open = true;
            match patterns.as_object().map(|p| p.values().collect::<Vec<_>>()) {
                Some(values) if values.len() == 1 && object.other.is_none() => {
                    object.other = Some(self.shape(values[0], depth - 1));
                }
                _ => object.other = None,
            }
        }
        object
    }
}

/// The definition named by a schema that is a `$ref` and nothing that changes what it takes.
fn only_ref(schema: &Value) -> Option<String> {
    let map = schema.as_object()?;
    let name = super::walk::def_name(map.get("$ref")?.as_str()?)?;
    let words = ["description", "title", "default", "examples", "deprecated"];
    map.keys()
        .all(|k| k == "$ref" || words.contains(&k.as_str()))
        .then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn shipping_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "order": {"type": "string"},
                "shipping": {"$ref": "#/$defs/Shipping"},
                "contact": {"anyOf": [{"$ref": "#/$defs/Contact"}, {"type": "null"}]},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": false,
            "$defs": {
                "Shipping": {
                    "type": "object",
                    "properties": {"express": {"type": ["boolean", "null"]}},
                    "additionalProperties": false
                },
                "Contact": {"anyOf": [
                    {"type": "object", "properties": {"email": {"type": "string"}},
                     "required": ["email"], "additionalProperties": false},
                    {"type": "object", "properties": {"phone": {"type": "string"},
                     "cc": {"type": ["string", "null"]}}, "required": ["phone"],
                     "additionalProperties": false}
                ]},
                "Line": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"},
                                   "parts": {"type": "array", "items": {"$ref": "#/$defs/Line"}}},
                    "additionalProperties": false
                }
            }
        })
    }

    #[test]
    fn only_fields_holding_a_closed_object_are_checked() {
        let nested = Nested::of(&shipping_schema()).unwrap();
        let checked: Vec<&str> = nested.fields.keys().map(String::as_str).collect();
        assert_eq!(checked, ["contact", "lines", "shipping"]);
        let flat = json!({"type": "object", "properties": {"order": {"type": "string"}}});
        assert!(Nested::of(&flat).is_none());
    }

    #[test]
    fn a_field_no_form_takes_is_refused_where_it_is() {
        let nested = Nested::of(&shipping_schema()).unwrap();
        let ok = args(
            json!({"order": "o", "shipping": {"express": true}, "contact": null,
            "lines": [{"sku": "a", "parts": [{"sku": "b"}]}], "labels": {"any": "x"}}),
        );
        assert_eq!(nested.check(&ok), Ok(()));
        let refused = nested
            .check(&args(json!({"shipping": {"expres": true}})))
            .unwrap_err();
        assert_eq!(refused.path, "shipping");
        assert_eq!(refused.field, "shipping.expres");
        assert_eq!(
            refused.problem,
            "unknown field `expres`, expected one of `express`"
        );
        let deep = args(json!({"lines": [{"sku": "a"}, {"sku": "b", "parts": [{"skus": "c"}]}]}));
        let refused = nested.check(&deep).unwrap_err();
        assert_eq!(refused.field, "lines[1].parts[0].skus");
    }

    #[test]
    fn fields_of_two_branches_do_not_go_together() {
        let nested = Nested::of(&shipping_schema()).unwrap();
        for one in [json!({"email": "a@b"}), json!({"phone": "1", "cc": "44"})] {
            assert_eq!(nested.check(&args(json!({ "contact": one }))), Ok(()));
        }
        let both = json!({"contact": {"email": "a@b", "phone": "1", "cc": "44"}});
        let refused = nested.check(&args(both)).unwrap_err();
        assert_eq!(refused.path, "contact");
        assert!(
            refused
                .problem
                .starts_with("field `email` does not go with"),
            "{}",
            refused.problem
        );
        let unknown = json!({"contact": {"fax": "1"}});
        let refused = nested.check(&args(unknown)).unwrap_err();
        assert_eq!(
            refused.problem,
            "unknown field `fax`, expected one of `cc`, `email`, `phone`"
        );
    }

    #[test]
    fn a_tag_chooses_the_form() {
        let schema = json!({
            "type": "object",
            "properties": {"pay": {"$ref": "#/$defs/Pay"}},
            "$defs": {"Pay": {"oneOf": [
                {"type": "object", "properties": {"method": {"type": "string", "const": "card"},
                 "last4": {"type": "string"}}, "additionalProperties": false},
                {"type": "object", "properties": {"method": {"type": "string", "const": "bank"},
                 "iban": {"type": "string"}}, "additionalProperties": false}
            ]}}
        });
        let nested = Nested::of(&schema).unwrap();
        let card = args(json!({"pay": {"method": "card", "last4": "4242"}}));
        assert_eq!(nested.check(&card), Ok(()));
        let mixed = args(json!({"pay": {"method": "card", "iban": "DE00"}}));
        let refused = nested.check(&mixed).unwrap_err();
        assert_eq!(
            refused.problem,
            "unknown field `iban`, expected one of `last4`, `method`"
        );
    }

    #[test]
    fn what_the_check_does_not_read_takes_anything() {
        let schema = json!({
            "type": "object",
            "properties": {
                "open": {"type": "object", "properties": {"a": {"type": "string"}}},
                "all": {"allOf": [{"$ref": "#/$defs/Closed"}]},
                "any": {},
                "loop": {"$ref": "#/$defs/Loop"}
            },
            "$defs": {
                "Closed": {"type": "object", "properties": {}, "additionalProperties": false},
                "Loop": {"$ref": "#/$defs/Loop"}
            }
        });
        assert!(Nested::of(&schema).is_none());
    }

    /// Arguments serde writes are taken, whatever shapes their types have: each kind of enum,
    /// maps, options, arrays, a recursive type, a flattened field inside a nested struct, and
    /// renamed fields.
    #[test]
    fn what_serde_writes_is_taken() {
        use schemars::JsonSchema;
        use serde::Serialize;
        use std::collections::HashMap;

        #[derive(Serialize, JsonSchema)]
        struct Card {
            last4: String,
        }
        #[derive(Serialize, JsonSchema)]
        #[serde(tag = "method", rename_all = "snake_case")]
        enum Internal {
            Card(Card),
            Bank { iban: String },
            Cash,
        }
        #[derive(Serialize, JsonSchema)]
        #[serde(tag = "t", content = "c")]
        enum Adjacent {
            Unit,
            Pair(u8, u8),
            Named { x: u8 },
        }
        #[derive(Serialize, JsonSchema)]
        enum External {
            Unit,
            Wrapped(Card),
            Named { x: Option<u8> },
        }
        #[derive(Serialize, JsonSchema)]
        #[serde(untagged)]
        enum Untagged {
            Count { n: u32, unit: String },
            Text(String),
            Many(Vec<Card>),
        }
        #[derive(Serialize, JsonSchema)]
        struct Tree {
            name: String,
            children: Vec<Tree>,
            parent: Option<Box<Tree>>,
        }
        #[derive(Serialize, JsonSchema)]
        struct WithFlattened {
            id: u8,
            #[serde(flatten)]
            how: Internal,
            #[serde(flatten)]
            rest: HashMap<String, String>,
        }
        #[derive(Serialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        struct Renamed {
            gift_wrap: bool,
            #[serde(rename = "SKU")]
            sku: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            note: Option<String>,
        }
        #[derive(Serialize, JsonSchema)]
        struct Args {
            internal: Vec<Internal>,
            adjacent: Vec<Adjacent>,
            external: Vec<External>,
            untagged: Vec<Untagged>,
            tree: Tree,
            flattened: WithFlattened,
            renamed: Option<Renamed>,
            by_name: HashMap<String, Option<Card>>,
            tuple: (Card, u8),
            any: Value,
        }
        let leaf = |name: &str| Tree {
            name: name.into(),
            children: vec![],
            parent: None,
        };
        let card = || Card {
            last4: "4242".into(),
        };
        let args = Args {
            internal: vec![
                Internal::Card(card()),
                Internal::Bank {
                    iban: "DE00".into(),
                },
                Internal::Cash,
            ],
            adjacent: vec![
                Adjacent::Unit,
                Adjacent::Pair(1, 2),
                Adjacent::Named { x: 3 },
            ],
            external: vec![
                External::Unit,
                External::Wrapped(card()),
                External::Named { x: None },
            ],
            untagged: vec![
                Untagged::Count {
                    n: 2,
                    unit: "kg".into(),
                },
                Untagged::Text("t".into()),
                Untagged::Many(vec![card()]),
            ],
            tree: Tree {
                name: "root".into(),
                children: vec![Tree {
                    name: "a".into(),
                    children: vec![leaf("b")],
                    parent: Some(Box::new(leaf("root"))),
                }],
                parent: None,
            },
            flattened: WithFlattened {
                id: 1,
                how: Internal::Card(card()),
                rest: HashMap::from([("extra".into(), "yes".into())]),
            },
            renamed: Some(Renamed {
                gift_wrap: true,
                sku: "a".into(),
                note: None,
            }),
            by_name: HashMap::from([("a".into(), Some(card())), ("b".into(), None)]),
            tuple: (card(), 1),
            any: json!({"whatever": [1, {"x": 2}]}),
        };
        let schema = crate::schema::schema_for::<Args>();
        let nested = Nested::of(&schema).expect("closed objects below the top");
        let value = serde_json::to_value(&args).unwrap();
        assert_eq!(nested.check(value.as_object().unwrap()), Ok(()));
        // And a field no form takes is still seen, deep in the recursive type.
        let mut wrong = value.clone();
        wrong["tree"]["children"][0]["children"][0]["nam"] = json!("x");
        let refused = nested.check(wrong.as_object().unwrap()).unwrap_err();
        assert_eq!(refused.field, "tree.children[0].children[0].nam");
        let mut wrong = value;
        wrong["internal"][0]["iban"] = json!("DE00");
        let refused = nested.check(wrong.as_object().unwrap()).unwrap_err();
        assert_eq!(refused.field, "internal[0].iban");
    }

    /// More shapes serde writes: transparent and boxed structs, options of arrays and arrays of
    /// options, sets of structs, maps keyed by numbers, `#[serde(other)]`, a struct that denies
    /// unknown fields itself, defaults, and a field whose schema is written by hand.
    #[test]
    fn what_serde_writes_in_other_shapes_is_taken() {
        use schemars::JsonSchema;
        use serde::Serialize;
        use std::collections::{BTreeMap, BTreeSet};

        #[derive(Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
        struct Tag {
            name: String,
        }
        #[derive(Serialize, JsonSchema)]
        #[serde(transparent)]
        struct Wrapper(Tag);
        #[derive(Serialize, JsonSchema)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Kind {
            Known {
                tag: Tag,
            },
            #[serde(other)]
            Unknown,
        }
        #[derive(Serialize, JsonSchema, Default)]
        #[serde(deny_unknown_fields, default)]
        struct Strict {
            a: u8,
            b: Option<Tag>,
        }
        fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
            schemars::json_schema!({"type": "object"})
        }
        #[derive(Serialize, JsonSchema)]
        struct Args {
            wrapped: Wrapper,
            boxed: Box<Tag>,
            maybe_many: Option<Vec<Tag>>,
            many_maybe: Vec<Option<Tag>>,
            set: BTreeSet<Tag>,
            by_number: BTreeMap<u32, Tag>,
            kinds: Vec<Kind>,
            strict: Strict,
            #[schemars(schema_with = "free_form")]
            free: Value,
            pair: (Tag, u8),
        }
        let tag = |n: &str| Tag { name: n.into() };
        let args = Args {
            wrapped: Wrapper(tag("w")),
            boxed: Box::new(tag("b")),
            maybe_many: Some(vec![tag("m")]),
            many_maybe: vec![None, Some(tag("x"))],
            set: BTreeSet::from([tag("s"), tag("t")]),
            by_number: BTreeMap::from([(7, tag("seven"))]),
            kinds: vec![Kind::Known { tag: tag("k") }, Kind::Unknown],
            strict: Strict { a: 1, b: None },
            free: json!({"anything": {"at": "all"}}),
            pair: (tag("p"), 1),
        };
        let schema = crate::schema::schema_for::<Args>();
        let nested = Nested::of(&schema).expect("closed objects below the top");
        let value = serde_json::to_value(&args).unwrap();
        assert_eq!(nested.check(value.as_object().unwrap()), Ok(()));
        for (at, wrong) in [
            ("wrapped", json!({"name": "w", "nam": 1})),
            ("boxed", json!({"nme": "b"})),
            ("maybe_many", json!([{"name": "m"}, {"names": "n"}])),
            ("many_maybe", json!([null, {"name": "x", "x": 1}])),
            ("set", json!([{"name": "s", "other": true}])),
            ("by_number", json!({"7": {"name": "seven", "n": 7}})),
            (
                "kinds",
                json!([{"kind": "known", "tag": {"name": "k", "extra": 1}}]),
            ),
            ("pair", json!([{"name": "p", "nmae": "q"}, 1])),
        ] {
            let mut call = value.clone();
            call[at] = wrong;
            assert!(
                nested.check(call.as_object().unwrap()).is_err(),
                "{at}: refused"
            );
        }
        // A tag no variant holds is read by serde as the `other` variant, the fields beside it
        // dropped: refused, as the schema refuses it.
        let mut call = value;
        call["kinds"] = json!([{"kind": "whatever", "tag": {"name": "k"}}]);
        let refused = nested.check(call.as_object().unwrap()).unwrap_err();
        assert_eq!(refused.field, "kinds[0].kind");
        assert_eq!(
            refused.problem,
            "field `kind` holds \"whatever\", which no form of it takes: expected one of \"known\", \"unknown\""
        );
    }

    /// A type that names itself twice (a binary tree) is read once, not once per level: read
    /// again at each level, it doubled the reading per level until the budget ran out, and
    /// every field read after that, the tree's and the other parameters', was taken unchecked.
    #[test]
    fn a_type_that_names_itself_twice_is_read_once() {
        use schemars::JsonSchema;
        use serde::Serialize;

        #[derive(Serialize, JsonSchema)]
        struct Node {
            v: u8,
            left: Option<Box<Node>>,
            right: Option<Box<Node>>,
        }
        #[derive(Serialize, JsonSchema)]
        struct Card {
            last4: String,
        }
        #[derive(Serialize, JsonSchema)]
        struct Args {
            a_tree: Node,
            z_card: Card,
        }
        let schema = crate::schema::schema_for::<Args>();
        let nested = Nested::of(&schema).unwrap();
        assert!(nested.shapes.len() < 16, "{} shapes", nested.shapes.len());
        let mut deep = json!({"v": 0, "left": null, "rigth": null});
        for v in 1..14 {
            deep = json!({"v": v, "left": deep, "right": null});
        }
        for (args, field) in [
            (
                json!({"a_tree": {"v": 1, "left": null, "right": null},
                       "z_card": {"last4": "1", "lst4": "2"}}),
                "z_card.lst4",
            ),
            (
                json!({"a_tree": {"v": 1, "left": {"v": 2, "rigth": null}}, "z_card": {"last4": "1"}}),
                "a_tree.left.rigth",
            ),
            (
                json!({"a_tree": deep, "z_card": {"last4": "1"}}),
                "a_tree.left.left.left.left.left.left.left.left.left.left.left.left.left.rigth",
            ),
        ] {
            let refused = nested.check(args.as_object().unwrap()).unwrap_err();
            assert_eq!(refused.field, field);
        }
    }

    /// A schema written by hand in the older style (`definitions`, `#/definitions/Name`, a
    /// name escaped as a JSON pointer) is read as schemars's is: the check found no definition
    /// there and took anything.
    #[test]
    fn a_schema_with_definitions_is_read_as_one_with_defs() {
        let schema = json!({
            "type": "object",
            "properties": {
                "to": {"$ref": "#/definitions/Address"},
                "via": {"anyOf": [{"$ref": "#/definitions/a~1b"}, {"type": "null"}]}
            },
            "definitions": {
                "Address": {"type": "object", "properties": {"city": {"type": "string"}},
                            "additionalProperties": false},
                "a/b": {"type": "object", "properties": {"hub": {"type": "string"}},
                        "additionalProperties": false}
            }
        });
        let nested = Nested::of(&schema).expect("closed objects below the top");
        let ok = args(json!({"to": {"city": "Oslo"}, "via": {"hub": "x"}}));
        assert_eq!(nested.check(&ok), Ok(()));
        let refused = nested
            .check(&args(json!({"to": {"cty": "Oslo"}})))
            .unwrap_err();
        assert_eq!(refused.field, "to.cty");
        let refused = nested
            .check(&args(json!({"via": {"hubb": "x"}})))
            .unwrap_err();
        assert_eq!(refused.field, "via.hubb");
    }
}
