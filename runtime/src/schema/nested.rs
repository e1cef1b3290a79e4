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
mod tests;
