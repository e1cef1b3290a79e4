//! What identifies a call: key derivation and fingerprints.

use serde_json::Value;
use toolkey::Fingerprint;

use crate::gen::Gen;
use crate::harness::Tally;
use crate::keys;

/// Key derivation, through the tools of [`keys`]: see [`keys::check`].
pub fn key_derivation(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    keys::check(&mut g, tally);
}

/// [`Fingerprint::of`] on any JSON: the value sent as JSON text and read back has the same
/// fingerprint; values equal by the documented rule (object key order, a whole float and the
/// integer it equals) share it, and values that differ do not.
pub fn fingerprint(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    let value = if g.chance(3, 4) {
        g.json()
    } else {
        serde_json::from_slice(g.bytes(1024)).unwrap_or(Value::Null)
    };
    let other = match g.range(0, 3) {
        0 => value.clone(),
        1 => respell_numbers(&value),
        2 => g.mutate(value.clone()),
        _ => g.json(),
    };
    let fp = Fingerprint::of(&value).expect("any JSON has a fingerprint");
    tally.code(None);
    let text = value.to_string();
    let reparsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("JSON text does not read back ({e}): {text}"));
    assert_eq!(
        Fingerprint::of(&reparsed).expect("fingerprint"),
        fp,
        "{text}"
    );
    let other_fp = Fingerprint::of(&other).expect("fingerprint");
    assert_eq!(
        same_value(&value, &other),
        fp == other_fp,
        "{value} and {other}"
    );
}

/// The whole number a JSON number is, when it is one an `i64` or `u64` holds (a float spelled
/// `1e16` included).
fn whole(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    let fits = (-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&f);
    (f.fract() == 0.0 && fits).then_some(f as i128)
}

/// The same value with its numbers spelled the other way where that keeps the value: integers
/// a float holds exactly as floats, whole floats as the integers they equal.
fn respell_numbers(value: &Value) -> Value {
    match value {
        Value::Number(n) => match whole(n) {
            Some(i) if n.is_f64() => match i64::try_from(i) {
                Ok(i) => Value::from(i),
                Err(_) => Value::from(u64::try_from(i).expect("a whole float in range")),
            },
            Some(i) if (i as f64) as i128 == i => Value::from(i as f64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(respell_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), respell_numbers(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Equality by the documented rule: numbers by value, where a whole float equals the integer
/// it is; object key order does not matter (serde_json's maps have none).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (whole(x), whole(y)) {
            (Some(i), Some(j)) => i == j,
            (None, None) => x.as_f64() == y.as_f64(),
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}
