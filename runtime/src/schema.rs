//! A tool's arguments: the canonical JSON Schema they are described by, and their parsing, whose
//! errors name the field and what the schema says it expects.
//!
//! Generated code reaches these through `__private`; the schema profiles of
//! [`export`](crate::export) start from [`schema_for`]'s canonical form.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{texts, ToolError};

/// The canonical schema of `T`: JSON Schema 2020-12 as schemars derives it, without the root
/// `title` (the Rust type's name, `__Args` for a tool's arguments: nothing a model should read)
/// and with every plain object closed, as the arguments struct itself is.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(root) = &mut schema {
        root.shift_remove("title");
    }
    crate::export::close_objects(&mut schema);
    schema
}

/// Parses a call's arguments, which stay the caller's; on failure, names the field and what it
/// expects.
///
/// They are read with serde alone first; only arguments that fail are read again, tracking the
/// path to the field at fault for the error.
pub fn parse_args<A: DeserializeOwned>(
    tool: &str,
    args: &Value,
    schema: impl FnOnce() -> Value,
) -> Result<A, ToolError> {
    let empty;
    let args = match args {
        Value::Null => {
            empty = Value::Object(Default::default());
            &empty
        }
        Value::Object(_) => args,
        // serde's derived structs also take their fields as an array, in order: the schema
        // promises an object of named fields, and positional arguments are not what it says.
        other => {
            let kind = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            };
            return Err(texts::arguments_not_an_object(tool, kind));
        }
    };
    if let Ok(parsed) = A::deserialize(args) {
        return Ok(parsed);
    }
    // JSON Schema's `integer` takes `5.0`, and models write it; serde does not. Such arguments
    // are read again with their integral floats as integers.
    if has_integral_float(args) {
        let mut respelled = args.clone();
        integral_floats_as_integers(&mut respelled);
        if let Ok(parsed) = A::deserialize(&respelled) {
            return Ok(parsed);
        }
    }
    let first = serde_path_to_error::deserialize::<_, A>(args);
    first.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner().to_string();
        let field = if path == "." {
            field_in(&inner)
        } else {
            Some(path.clone())
        };
        let expected = field
            .as_deref()
            .and_then(|field| describe(&schema(), field));
        texts::invalid_arguments(tool, &path, &inner, field.as_deref(), expected.as_deref())
    })
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

/// The integer a float such as `5.0` equals, when it is exactly one in i64 or u64 range.
fn as_integer(n: &serde_json::Number) -> Option<Value> {
    let f = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0)?;
    // 2^63 and 2^64 are exact as floats; the ranges are half-open so the casts are exact.
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
        Some(Value::from(f as i64))
    } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        Some(Value::from(f as u64))
    } else {
        None
    }
}

/// The field a serde message names, as in "missing field `amount`".
fn field_in(message: &str) -> Option<String> {
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
        let args = parse(json!({"customer": "acme", "cents": 18446744073709549568.0})).unwrap();
        assert_eq!(args.cents, 18446744073709549568);
        for cents in [json!(5.5), json!(-1.0), json!(1e20), json!("5")] {
            let err = parse(json!({"customer": "acme", "cents": cents})).unwrap_err();
            assert!(err.message().contains("`cents`"), "{cents}: {err:?}");
        }
    }
}
