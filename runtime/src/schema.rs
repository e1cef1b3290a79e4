//! A tool's arguments: the canonical JSON Schema they are described by, and their parsing, whose
//! errors name the field and what the schema says it expects.
//!
//! Generated code reaches these through `__private`; the schema profiles of
//! [`export`](crate::export) start from [`schema_for`]'s canonical form.

use schemars::SchemaGenerator;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::Mark;
use crate::{texts, ToolError};

mod names;
mod nested;
mod tracked;
pub(crate) mod walk;

pub use names::struct_fields;
pub(crate) use nested::Nested;

/// The canonical schema of `T`: JSON Schema 2020-12 as schemars derives it, without the root
/// `title` (the Rust type's name, `__Args` for a tool's arguments: nothing a model should read)
/// and with every plain object closed, as the arguments struct itself is.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    canonical(generator.into_root_schema_for::<T>().to_value())
}

/// The canonical schema of a tool's arguments with a `#[serde(flatten)]` field, which are derived
/// without `deny_unknown_fields`: closed at the root all the same, with `unevaluatedProperties:
/// false` where schemars leaves it open (a flattened enum's branches), unless a flattened map
/// says what other fields may be. The root has no `description`: schemars gives it the
/// flattened type's doc, which describes one parameter, not the arguments.
pub fn schema_for_flattened<T: schemars::JsonSchema>() -> Value {
    let mut schema = schema_for::<T>();
    if let Value::Object(root) = &mut schema {
        root.shift_remove("description");
        let says = [
            "additionalProperties",
            "unevaluatedProperties",
            "patternProperties",
        ];
        if !says.iter().any(|k| root.contains_key(*k)) {
            root.insert("unevaluatedProperties".into(), Value::Bool(false));
        }
    }
    schema
}

/// The canonical schema of a status companion's arguments beside a `#[serde(flatten)]` field:
/// one object, closed, whose properties are the key's and, optional, every other field the
/// target takes, a flattened enum's included. The target's schema says which fields go together;
/// the companion's, that each may be given or left out.
pub fn status_schema_for_flattened<T: schemars::JsonSchema>() -> Value {
    let mut schema = schema_for::<T>();
    let lifted = walk::lift(&schema, &schema);
    if let Value::Object(root) = &mut schema {
        root.shift_remove("description");
        for keyword in ["allOf", "anyOf", "oneOf", "properties"] {
            root.shift_remove(keyword);
        }
        root.insert("properties".into(), Value::Object(lifted.properties));
        root.shift_remove("unevaluatedProperties");
        if !root.contains_key("additionalProperties") && !root.contains_key("patternProperties") {
            // Closed, unless a branch takes other fields (a flattened map in a variant).
            let other = lifted.open.unwrap_or(Value::Bool(false));
            root.insert("additionalProperties".into(), other);
        }
    }
    schema
}

/// The arguments of a tool with a `#[serde(flatten)]` field: its schema, and the names the
/// schema does not list (aliases), from which the names the arguments may carry are read
/// once. Built by generated code.
#[doc(hidden)]
pub struct FlattenedArgs {
    schema: fn() -> Value,
    extra: fn() -> Vec<&'static str>,
    names: std::sync::OnceLock<names::Names>,
}

impl FlattenedArgs {
    /// Arguments described by `schema`, whose fields are also read by the names `extra` gives.
    pub const fn new(schema: fn() -> Value, extra: fn() -> Vec<&'static str>) -> Self {
        FlattenedArgs {
            schema,
            extra,
            names: std::sync::OnceLock::new(),
        }
    }
}

/// [`parse_args`] for arguments with a `#[serde(flatten)]` field, which serde reads without
/// refusing unknown fields: first, each name is checked against the schema, and a name it does
/// not take is refused as serde refuses an unknown field.
pub fn parse_flattened_args<A: DeserializeOwned>(
    tool: &str,
    args: &Value,
    flattened: &FlattenedArgs,
) -> Result<A, ToolError> {
    let object = arguments_object(tool, args)?;
    let names = flattened
        .names
        .get_or_init(|| names::Names::of(&(flattened.schema)(), &(flattened.extra)()));
    let refusal = |refused: names::Refused| {
        let field = field_in(&refused);
        let err = texts::invalid_arguments(tool, ".", &refused, field.as_deref(), None);
        match refused.not_whole {
            true => err.with_mark(Mark::NotAWholeCall),
            false => err,
        }
    };
    names.check_args(object).map_err(refusal)?;
    let parsed = parse_args(tool, args, flattened.schema)?;
    names.check_whole(object).map_err(refusal)?;
    Ok(parsed)
}

/// True when arguments described by `schema` may carry a name beside `names`: a property, a
/// property of a flattened enum's branch, or any name where a flattened map takes any.
pub(crate) fn takes_other_names(schema: &Value, names: &[String]) -> bool {
    names::Names::of(schema, &[]).takes_other(names)
}

/// The canonical form of a schema schemars derived: compiled once, not once per type.
fn canonical(mut schema: Value) -> Value {
    if let Value::Object(root) = &mut schema {
        root.shift_remove("title");
    }
    walk::merge_refs_beside_properties(&mut schema);
    walk::close_objects(&mut schema);
    schema
}

/// Parses a call's arguments, which stay the caller's; on failure, names the field and what it
/// expects.
///
/// They are read as serde_json reads a value first; only arguments that fail are read again,
/// tracking the path to the field at fault for the error. Both reads go through one
/// deserializer, so the arguments type's visitor is compiled once, and only the
/// reading is generic: what comes before and after is compiled once, not once per tool.
pub fn parse_args<A: DeserializeOwned>(
    tool: &str,
    args: &Value,
    schema: fn() -> Value,
) -> Result<A, ToolError> {
    let args = arguments_object(tool, args)?;
    if let Ok(parsed) = tracked::read(args) {
        return Ok(parsed);
    }
    // JSON Schema's `integer` takes `5.0`, and models write it; serde does not. Such arguments
    // are read again with their integral floats as integers, and a fault is looked for there:
    // `5.0` is no fault, and naming it would hide the one that is.
    let respelled = respelled(args);
    if let Some(respelled) = &respelled {
        if let Ok(parsed) = tracked::read(respelled) {
            return Ok(parsed);
        }
    }
    let read = respelled.as_ref().unwrap_or(args);
    tracked::locate(read).map_err(|failure| {
        // Inside a flattened field serde knows no path: the value it names does.
        let path = match failure.path.as_str() {
            "." if field_in(&failure.error.to_string()).is_none() => {
                holding(read, &failure.error.to_string()).unwrap_or(failure.path)
            }
            _ => failure.path,
        };
        invalid_arguments(tool, path, failure.error, schema)
    })
}

/// The path of the one value in `args` that serde's "invalid type: integer `4242`, expected a
/// string" names, if one holds it and no other does.
fn holding(args: &Map<String, Value>, error: &str) -> Option<String> {
    let unexpected = error
        .strip_prefix("invalid type: ")?
        .split(", expected")
        .next()?;
    let mut found = Vec::new();
    for (name, value) in args {
        find_value(value, name.clone(), unexpected, &mut found);
    }
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Adds to `found` the path of each value at or below `value` that serde writes as `text`.
fn find_value(value: &Value, path: String, text: &str, found: &mut Vec<String>) {
    let written = match value {
        Value::Bool(b) => Some(format!("boolean `{b}`")),
        Value::Number(n) if n.is_f64() => n.as_f64().map(|f| match f.fract() == 0.0 {
            true => format!("floating point `{f:.1}`"),
            false => format!("floating point `{f}`"),
        }),
        Value::Number(n) => Some(format!("integer `{n}`")),
        Value::String(s) => Some(format!("string {s:?}")),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                find_value(item, format!("{path}[{i}]"), text, found);
            }
            None
        }
        Value::Object(map) => {
            for (name, item) in map {
                // A key is read as a value too (a map's `u32` key): it is a candidate as well.
                if format!("string {name:?}") == text {
                    found.push(format!("{path}.{name}"));
                }
                find_value(item, format!("{path}.{name}"), text, found);
            }
            None
        }
        Value::Null => Some("null".to_string()),
    };
    if written.as_deref() == Some(text) {
        found.push(path);
    }
}

/// The arguments, when they are an object; `null` is read as no arguments.
fn arguments_object<'a>(tool: &str, args: &'a Value) -> Result<&'a Map<String, Value>, ToolError> {
    static NONE: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    match args {
        Value::Null => Ok(NONE.get_or_init(Map::new)),
        Value::Object(map) => Ok(map),
        // serde's derived structs also take their fields as an array, in order: the schema
        // promises an object of named fields, and positional arguments are not what it says.
        other => {
            let kind = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            };
            Err(texts::arguments_not_an_object(tool, kind))
        }
    }
}

/// `value` with its integral floats as integers, when it has any.
fn respelled_value(value: &Value) -> Option<Value> {
    has_integral_float(value).then(|| {
        let mut respelled = value.clone();
        integral_floats_as_integers(&mut respelled);
        respelled
    })
}

/// The path of a failure inside field `field`, whose own path inside it is `inner` (`.` for
/// the field itself), as `serde_path_to_error` writes paths: `lines[2].sku`.
fn join_path(field: &str, inner: &str) -> String {
    match inner {
        "." => field.to_string(),
        _ if inner.starts_with('[') => format!("{field}{inner}"),
        _ => format!("{field}.{inner}"),
    }
}

/// `args` with its integral floats as integers, when it has any.
fn respelled(args: &Map<String, Value>) -> Option<Map<String, Value>> {
    args.values().any(has_integral_float).then(|| {
        let mut respelled = args.clone();
        respelled.values_mut().for_each(integral_floats_as_integers);
        respelled
    })
}

/// The error for arguments serde refused at `path`.
fn invalid_arguments(
    tool: &str,
    path: String,
    err: serde_json::Error,
    schema: fn() -> Value,
) -> ToolError {
    let inner = err.to_string();
    let field = if path == "." {
        field_in(&inner)
    } else {
        Some(path.clone())
    };
    let expected = field
        .as_deref()
        .and_then(|field| describe(&schema(), field));
    // serde says a field is missing only in words: a field of the arguments' own missing makes
    // them no whole call (one missing inside a value given is that value refused).
    let not_whole = path == "." && inner.starts_with("missing field `");
    let err = texts::invalid_arguments(tool, &path, &inner, field.as_deref(), expected.as_deref());
    match not_whole {
        true => err.with_mark(Mark::NotAWholeCall),
        false => err,
    }
}

/// True when `value` holds a float with no fractional part that an integer type could hold.
fn has_integral_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => as_integer(n).is_some(),
        Value::Array(items) => items.iter().any(has_integral_float),
        Value::Object(map) => map.values().any(has_integral_float),
        _ => false,
    }
}

/// Rewrites every integral float of `value` as the integer it equals.
fn integral_floats_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(integer) = as_integer(n) {
                *value = integer;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

/// The integer a float such as `5.0` equals, when the model can only have meant that one: a
/// whole float below 2^53 in size. From 2^53 on, floats are further apart than 1, and the text
/// the model wrote may have been another integer (`9007199254740993.0` reads as
/// 9007199254740992): an order id read that way would name another order.
fn as_integer(n: &serde_json::Number) -> Option<Value> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    let f = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0)?;
    // Below 2^53 in size, the cast is exact.
    (f.abs() < EXACT).then(|| Value::from(f as i64))
}

/// The field a serde message names, as in "missing field `amount`"; none for a message about a
/// value ("invalid type: integer `5`, expected a string", of a field flattened into the
/// arguments), whose backticks hold the value, not a field.
fn field_in(message: &str) -> Option<String> {
    let names_a_field = [
        "missing field `",
        "unknown field `",
        "duplicate field `",
        "field `",
    ];
    if !names_a_field.iter().any(|start| message.starts_with(start)) {
        return None;
    }
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

/// What the schema says a top-level field expects: its type and description.
fn describe(schema: &Value, field: &str) -> Option<String> {
    let top = field.split(['.', '[']).next()?;
    let property = schema.get("properties")?.get(top)?;
    let ty = match property.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "the schema's type".into(),
    };
    Some(match property.get("description").and_then(Value::as_str) {
        Some(description) => format!("{ty} ({description})"),
        None => ty,
    })
}

/// A field of a status companion's target that the companion accepts and ignores: its name, the
/// schema of `Option<T>` for its type `T` ([`nullable_schema`]), and the title and description
/// its docs give, with the companion's note that it is ignored. Built by generated code.
#[doc(hidden)]
pub struct IgnoredField {
    /// The field's name.
    pub name: &'static str,
    /// The schema of `Option<T>`, from a generator that has seen the target's arguments.
    pub nullable: fn(&mut SchemaGenerator) -> Value,
    /// The title its docs give, or `""`.
    pub title: &'static str,
    /// The description its docs give, or `""`.
    pub description: &'static str,
}

/// The schema of `Option<T>`, as schemars derives it for a field (definitions left out: the
/// target's schema has them).
pub fn nullable_schema<T: schemars::JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    generator.subschema_for::<Option<T>>().to_value()
}

/// Shows `generator` the type `A` (a tool's arguments), so that the definitions it names for
/// `A`'s fields, two types of one name among them, are named as in `A`'s own schema.
pub fn prime_generator<A: schemars::JsonSchema>(generator: &mut SchemaGenerator) {
    // `A`'s own schema, as its root schema is made: its fields' definitions are named in the
    // same order, and `A` itself takes no name.
    A::json_schema(generator);
}

/// A status companion's schema, from its target's (`target`, from [`schema_for`]): each ignored
/// field takes any value its type takes, or `null`, is no longer required, and says it is
/// ignored. It is the schema schemars derives for the companion's own arguments struct, whose
/// ignored fields are `Option<T>` with the docs of `ignored`; built this way, no such struct is
/// compiled for every keyed tool. `prime` shows the generator the target's arguments type
/// ([`prime_generator`]).
pub fn status_schema(
    mut target: Value,
    prime: fn(&mut SchemaGenerator),
    ignored: &[IgnoredField],
) -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    prime(&mut generator);
    if let Some(Value::Object(properties)) = target.get_mut("properties") {
        for field in ignored {
            if let Some(property) = properties.get_mut(field.name) {
                let mut schema = schemars::Schema::try_from((field.nullable)(&mut generator))
                    .unwrap_or_else(|_| schemars::Schema::from(true));
                // As schemars' derive adds a field's docs: title, then description, if any.
                for (keyword, text) in [("title", field.title), ("description", field.description)]
                {
                    if !text.is_empty() {
                        schema.insert(keyword.into(), text.into());
                    }
                }
                *property = schema.to_value();
            }
        }
    }
    if let Value::Object(root) = &mut target {
        if let Some(Value::Array(required)) = root.get_mut("required") {
            required.retain(|name| !ignored.iter().any(|field| name == field.name));
            if required.is_empty() {
                root.shift_remove("required");
            }
        }
    }
    canonical(target)
}

/// A status companion's arguments, read field by field: its target's field names, the key's
/// fields read as the target reads them, every other field taken whatever it holds. Each key
/// field is read by a function generic over its type alone, which keyed tools share.
#[doc(hidden)]
pub struct StatusArgs<'a> {
    tool: &'a str,
    args: &'a Map<String, Value>,
    schema: fn() -> Value,
}

impl<'a> StatusArgs<'a> {
    /// The arguments of a call of status companion `tool`, whose target has fields `fields`;
    /// `schema` describes the key's fields for an error.
    pub fn new(
        tool: &'a str,
        args: &'a Value,
        fields: &'static [&'static str],
        schema: fn() -> Value,
    ) -> Result<Self, ToolError> {
        let args = arguments_object(tool, args)?;
        // As a struct that denies unknown fields: the first unknown one, in the order given.
        // (Where arguments have more than one fault, the one named may not be the one the
        // derived struct would name first; each is a fault.)
        if let Some(unknown) = args.keys().find(|name| !fields.contains(&name.as_str())) {
            let err = <serde_json::Error as serde::de::Error>::unknown_field(unknown, fields);
            return Err(invalid_arguments(tool, unknown.clone(), err, schema));
        }
        Ok(StatusArgs { tool, args, schema })
    }

    /// Key field `name`, read as the target's struct reads it: a missing `Option` is `None`, an
    /// integral float is taken for an integer.
    pub fn key<T: DeserializeOwned>(&self, name: &'static str) -> Result<T, ToolError> {
        let Some(value) = self.args.get(name) else {
            return T::deserialize(Missing(name))
                .map_err(|err| invalid_arguments(self.tool, ".".into(), err, self.schema));
        };
        if let Ok(parsed) = T::deserialize(value) {
            return Ok(parsed);
        }
        if let Some(respelled) = respelled_value(value) {
            if let Ok(parsed) = T::deserialize(&respelled) {
                return Ok(parsed);
            }
        }
        serde_path_to_error::deserialize::<_, T>(value).map_err(|err| {
            let path = join_path(name, &err.path().to_string());
            invalid_arguments(self.tool, path, err.into_inner(), self.schema)
        })
    }
}

/// A field that is not there, as serde's derive reads one: `None` for an `Option`, else the
/// error "missing field".
struct Missing(&'static str);

impl<'de> serde::Deserializer<'de> for Missing {
    type Error = serde_json::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::missing_field(self.0))
    }

    fn deserialize_option<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_none()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use serde_json::json;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Args {
        #[allow(dead_code)]
        customer: String,
        cents: u64,
    }

    fn parse(args: Value) -> Result<Args, ToolError> {
        parse_args::<Args>("charge", &args, || json!({}))
    }

    #[test]
    fn arguments_are_an_object_of_named_fields() {
        assert!(parse(json!({"customer": "acme", "cents": 5})).is_ok());
        // Found by fuzzing: serde takes a struct's fields as an array too, so `["acme", 5]` ran
        // the tool, though the schema says object.
        for args in [json!(["acme", 5]), json!("acme"), json!(5), json!(true)] {
            let err = parse(args.clone()).unwrap_err();
            assert!(err.is(ErrorCode::InvalidArguments), "{args}: {err:?}");
            assert!(err.message().contains("must be a JSON object"), "{err:?}");
            assert!(err.suggestion().is_some());
        }
        let err = parse(Value::Null).unwrap_err();
        assert!(err.message().contains("missing field"), "{err:?}");
    }

    #[test]
    fn an_integral_float_is_an_integer() {
        // Found by fuzzing: JSON Schema's `integer` takes `5.0`, and the call refused it.
        let args = parse(json!({"customer": "acme", "cents": 5.0})).unwrap();
        assert_eq!(args.cents, 5);
        let args = parse(json!({"customer": "acme", "cents": 9007199254740991.0})).unwrap();
        assert_eq!(args.cents, 9007199254740991);
        // From 2^53 on, a float stands for several integers the model may have written.
        let past = [json!(9007199254740992.0), json!(18446744073709549568.0)];
        for cents in [json!(5.5), json!(-1.0), json!(1e20), json!("5")]
            .into_iter()
            .chain(past)
        {
            let err = parse(json!({"customer": "acme", "cents": cents})).unwrap_err();
            assert!(err.message().contains("`cents`"), "{cents}: {err:?}");
        }
        // Found by fuzzing: beside another fault, `5.0` was named as the fault, so a status call
        // missing a field was refused for a value its schema takes, not answered by key.
        for args in [json!({"cents": 5.0}), json!({"customer": 7, "cents": 5.0})] {
            let err = parse(args.clone()).unwrap_err();
            assert!(err.message().contains("customer"), "{args}: {err:?}");
            assert!(!err.message().contains("cents"), "{args}: {err:?}");
        }
    }

    /// Arguments with nested fields of every shape a path can pass through.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Order {
        customer: String,
        lines: Vec<Line>,
        address: Option<Address>,
        counts: std::collections::BTreeMap<String, u32>,
        pair: (u8, String),
        speed: Speed,
        #[serde(default)]
        note: Option<String>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
        quantity: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Address {
        street: String,
        zip: Option<u32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Speed {
        Standard,
        Express { by: String },
    }

    /// Every refusal names the path and the problem `serde_path_to_error` names over the
    /// arguments' value, the way they were always read; and what is taken is taken by both.
    #[test]
    fn a_refusal_is_located_as_a_path_tracking_read_of_the_value_locates_it() {
        let good = json!({
            "customer": "acme", "lines": [{"sku": "a", "quantity": 1}],
            "address": {"street": "Main", "zip": 1000}, "counts": {"a": 1},
            "pair": [1, "x"], "speed": "standard",
        });
        let mut cases = vec![good.clone()];
        let changes = [
            ("customer", json!(5)),
            (
                "lines",
                json!([{"sku": "a", "quantity": 1}, {"sku": "b", "quantity": "2"}]),
            ),
            (
                "lines",
                json!([{"sku": "a", "quantity": 1, "colour": "red"}]),
            ),
            ("lines", json!([{"quantity": 1}])),
            ("lines", json!({"sku": "a"})),
            ("address", json!({"street": 5})),
            ("address", json!({"street": "Main", "zip": -1})),
            ("address", json!(null)),
            ("counts", json!({"a": 1, "b": "two"})),
            ("pair", json!([1, 2])),
            ("pair", json!([300, "x"])),
            ("pair", json!([1])),
            ("speed", json!("slow")),
            ("speed", json!({"express": {"by": 5}})),
            ("speed", json!({"express": {}})),
            ("note", json!(["not", "a", "note"])),
            ("colour", json!("red")),
        ];
        for (field, value) in changes {
            let mut args = good.clone();
            args[field] = value;
            cases.push(args);
        }
        for missing in ["customer", "lines", "speed"] {
            let mut args = good.clone();
            args.as_object_mut().unwrap().remove(missing);
            cases.push(args);
        }
        for args in cases {
            let ours = parse_args::<Order>("order", &args, || json!({}));
            let theirs = serde_path_to_error::deserialize::<_, Order>(&args);
            match (ours, theirs) {
                (Ok(_), Ok(_)) => {}
                (Err(ours), Err(theirs)) => {
                    let expected = texts::invalid_arguments(
                        "order",
                        &theirs.path().to_string(),
                        &theirs.inner().to_string(),
                        None,
                        None,
                    );
                    // The message says the path and the problem; the suggestion is built
                    // from them alike, with the schema (empty here) saying nothing more.
                    assert_eq!(ours.message(), expected.message(), "{args}");
                }
                (ours, theirs) => panic!("{args}: ours {ours:?}, theirs {theirs:?}"),
            }
        }
        // The paths go inside the field.
        let mut args = good.clone();
        args["lines"] = json!([{"sku": "a", "quantity": 1}, {"sku": "b", "quantity": "2"}]);
        let err = parse_args::<Order>("order", &args, || json!({})).unwrap_err();
        assert!(
            err.message().contains("`lines[1].quantity`: invalid type"),
            "{err:?}"
        );
        args["lines"] = json!([{"sku": "a", "quantity": 1, "colour": "red"}]);
        let err = parse_args::<Order>("order", &args, || json!({})).unwrap_err();
        assert!(
            err.message().contains("`lines[0].colour`: unknown field"),
            "{err:?}"
        );
    }
}
