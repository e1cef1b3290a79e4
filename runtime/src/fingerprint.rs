//! Fingerprints: SHA-256 over a canonical JSON form of the arguments that define an action.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod direct;

/// The SHA-256 of the canonical JSON of a call's defining arguments.
///
/// Same key and same fingerprint is a retry (replayed); same key and another fingerprint is a
/// different action under a name already taken (CONFLICT).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of any serializable value, through its canonical JSON form.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::Fingerprint;
    ///
    /// let a = Fingerprint::of(&json!({"amount": 100.0, "customer": "acme"})).unwrap();
    /// let b = Fingerprint::of(&json!({"customer": "acme", "amount": 100})).unwrap();
    /// assert_eq!(a, b); // key order and number spelling do not matter
    /// ```
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, serde_json::Error> {
        let value = serde_json::to_value(value)?;
        let mut hasher = HashSink::new();
        write_canonical(&value, &mut hasher).expect("hashing cannot fail");
        Ok(hasher.finish())
    }

    /// The fingerprint as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// A call's fingerprint, written field by field: the name of its tool, then the canonical JSON
/// object of its defining arguments, each field as [`FingerprintSchema`] canonicalizes it
/// (arrays the schema calls sets are sorted, so equal sets are equal whatever their order in
/// memory). Two tools that share a key template therefore never replay each other's results:
/// their calls are a `CONFLICT`.
///
/// Generated code gives the fields in the byte order of their names, which is the order the
/// canonical object writes them in: the text goes straight into the hash, with no buffer and no
/// value built for a field that is a scalar. Only [`field`](Self::field) is generic, over the
/// field's type, so tools share its code for the types they share.
#[doc(hidden)]
pub struct FingerprintFields<'s> {
    hasher: HashSink,
    schema: &'s Value,
    has_sets: bool,
    /// What the schema's root stands for (itself and what its references lead to): found at
    /// the first field that goes through its value when the schema has sets, then kept.
    root: Vec<&'s Value>,
    last: Option<&'static str>,
    error: Option<serde_json::Error>,
}

impl<'s> FingerprintFields<'s> {
    /// Starts the fingerprint of a call of the tool `schema` belongs to.
    pub fn new(schema: &'s FingerprintSchema) -> Self {
        let (schema, has_sets, hasher) = schema.get();
        FingerprintFields {
            hasher,
            schema,
            has_sets,
            root: Vec::new(),
            last: None,
            error: None,
        }
    }

    /// Adds field `name` (its serde name), which sorts after every field added before it.
    pub fn field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        if self.error.is_some() {
            return;
        }
        self.name(name);
        // A scalar is written as it is; anything else, or anything when the schema has sets,
        // goes through its value.
        if !self.has_sets && value.serialize(direct::Scalar(&mut self.hasher)).is_ok() {
            return;
        }
        match serde_json::to_value(value) {
            Ok(value) => self.value(name, value),
            Err(e) => self.error = Some(e),
        }
    }

    fn name(&mut self, name: &'static str) {
        debug_assert!(
            self.last
                .is_none_or(|last| last.as_bytes() < name.as_bytes()),
            "fingerprint fields must come in the byte order of their names: {name:?} after {:?}",
            self.last
        );
        if self.last.is_some() {
            self.hasher.bytes(b",");
        }
        self.last = Some(name);
        write_string(name, &mut self.hasher).expect("hashing cannot fail");
        self.hasher.bytes(b":");
    }

    fn value(&mut self, name: &str, mut value: Value) {
        if self.has_sets {
            if self.root.is_empty() {
                expand(self.schema, self.schema, 0, &mut self.root);
            }
            let schemas = property_schemas(&self.root, name);
            sort_sets(&mut value, &schemas, self.schema, 1);
        }
        write_canonical(&value, &mut self.hasher).expect("hashing cannot fail");
    }

    /// The fingerprint, or why a field could not be written.
    pub fn finish(mut self) -> Result<Fingerprint, serde_json::Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.hasher.bytes(b"}");
        Ok(self.hasher.finish())
    }
}

/// The JSON schema of a tool's defining arguments, derived once per process: it says which
/// arrays are sets (`uniqueItems`), whose order means nothing. Built by generated code.
#[doc(hidden)]
pub struct FingerprintSchema {
    tool: &'static str,
    derive: fn() -> Value,
    cached: std::sync::OnceLock<Derived>,
}

/// What a [`FingerprintSchema`] derives on first use.
struct Derived {
    schema: Value,
    has_sets: bool,
    /// The hash with the tool's name written (the text every fingerprint of the tool starts
    /// with): copied for each call rather than written again, which cost each call about 300
    /// instructions.
    start: HashSink,
}

impl FingerprintSchema {
    /// The schema of `tool`'s fingerprints, derived by `derive` on first use.
    pub const fn new(tool: &'static str, derive: fn() -> Value) -> Self {
        FingerprintSchema {
            tool,
            derive,
            cached: std::sync::OnceLock::new(),
        }
    }

    /// The schema, whether it has sets, and a hash with the start of a fingerprint of a call of
    /// the tool written.
    fn get(&self) -> (&Value, bool, HashSink) {
        let derived = self.cached.get_or_init(|| {
            let schema = (self.derive)();
            let has_sets = mentions_sets(&schema);
            Derived {
                schema,
                has_sets,
                start: HashSink::start(self.tool),
            }
        });
        (&derived.schema, derived.has_sets, derived.start.clone())
    }
}

fn mentions_sets(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            map.get("uniqueItems") == Some(&Value::Bool(true)) || map.values().any(mentions_sets)
        }
        Value::Array(items) => items.iter().any(mentions_sets),
        _ => false,
    }
}

/// How deep `$ref`s and `anyOf`s are followed for one value: deeper schemas are recursive.
const MAX_SCHEMA_DEPTH: usize = 32;

/// The schemas `schema` stands for: itself, and what its `$ref`, `anyOf`, `oneOf` and `allOf`
/// lead to.
fn expand<'a>(schema: &'a Value, root: &'a Value, depth: usize, out: &mut Vec<&'a Value>) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    let Value::Object(map) = schema else { return };
    if let Some(Value::String(reference)) = map.get("$ref") {
        let target = reference
            .strip_prefix("#/$defs/")
            .and_then(|name| root.get("$defs")?.get(name))
            .or_else(|| {
                reference
                    .strip_prefix("#/definitions/")
                    .and_then(|name| root.get("definitions")?.get(name))
            });
        if let Some(target) = target {
            expand(target, root, depth + 1, out);
        }
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = map.get(combinator) {
            for branch in branches {
                expand(branch, root, depth + 1, out);
            }
        }
    }
    out.push(schema);
}

fn accepts_arrays(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "array",
        Some(Value::Array(types)) => types.iter().any(|t| t == "array"),
        _ => ["items", "prefixItems", "uniqueItems"]
            .iter()
            .any(|k| schema.get(k).is_some()),
    }
}

/// True unless `schema` says its items are of a JSON type one of `items` is not (a number
/// for an `integer` only when whole); an item schema that names no type takes anything.
fn items_take(schema: &Value, items: &[Value], root: &Value) -> bool {
    let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) else {
        return true;
    };
    let mut candidates = Vec::new();
    expand(item_schema, root, 0, &mut candidates);
    let mut types = Vec::new();
    for candidate in candidates {
        match candidate.get("type") {
            Some(Value::String(t)) => types.push(t.as_str()),
            Some(Value::Array(ts)) => types.extend(ts.iter().filter_map(Value::as_str)),
            // A `$ref` or a combinator stands for the schemas `expand` found behind it.
            _ if ["$ref", "anyOf", "oneOf", "allOf"]
                .iter()
                .any(|k| candidate.get(k).is_some()) => {}
            _ => return true,
        }
    }
    if types.is_empty() {
        return true;
    }
    items.iter().all(|item| {
        types.iter().any(|t| match (*t, item) {
            ("null", Value::Null) | ("boolean", Value::Bool(_)) => true,
            ("string", Value::String(_)) | ("array", Value::Array(_)) => true,
            ("object", Value::Object(_)) | ("number", Value::Number(_)) => true,
            ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
            _ => false,
        })
    })
}

/// Sorts, inside `value`, every array the schemas describing it call a set (see the branches
/// of an untagged enum below).
fn sort_sets(value: &mut Value, schemas: &[&Value], root: &Value, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH || schemas.is_empty() {
        return;
    }
    let mut candidates = Vec::new();
    for schema in schemas {
        expand(schema, root, 0, &mut candidates);
    }
    match value {
        Value::Array(items) => {
            let arrays: Vec<&Value> = candidates
                .iter()
                .copied()
                .filter(|s| accepts_arrays(s))
                .collect();
            for (i, item) in items.iter_mut().enumerate() {
                let item_schemas: Vec<&Value> = arrays
                    .iter()
                    .filter_map(|s| {
                        s.get("prefixItems")
                            .and_then(|p| p.get(i))
                            .or_else(|| s.get("items").filter(|i| i.is_object()))
                    })
                    .collect();
                sort_sets(item, &item_schemas, root, depth + 1);
            }
            let set = |s: &&Value| s.get("uniqueItems") == Some(&Value::Bool(true));
            let is_set = if arrays.iter().all(set) {
                !arrays.is_empty()
            } else {
                // Schemas that disagree are the branches of an untagged enum (a set beside a
                // list): serde reads the array as the first branch whose items take it, and
                // so does the fingerprint. Sorting always would make two lists one action;
                // never, one set sent twice two actions, its order being a hash set's.
                arrays
                    .iter()
                    .find(|s| items_take(s, items, root))
                    .is_some_and(set)
            };
            if is_set {
                let mut keyed: Vec<(String, Value)> = items
                    .drain(..)
                    .map(|item| {
                        let mut text = String::new();
                        canonical_json(&item, &mut text);
                        (text, item)
                    })
                    .collect();
                keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                items.extend(keyed.into_iter().map(|(_, item)| item));
            }
        }
        Value::Object(map) => {
            for (name, field) in map.iter_mut() {
                let field_schemas = property_schemas(&candidates, name);
                sort_sets(field, &field_schemas, root, depth + 1);
            }
        }
        _ => {}
    }
}

/// The schemas of property `name` of an object that `candidates` describe: the named property,
/// else the schemas of patterned or additional properties (maps keyed by integers have a
/// `patternProperties` schema; without a regex engine every pattern is taken to match, and a
/// set is only sorted when all of them say it is one).
fn property_schemas<'a>(candidates: &[&'a Value], name: &str) -> Vec<&'a Value> {
    let mut field_schemas: Vec<&Value> = Vec::new();
    for s in candidates {
        if let Some(named) = s.get("properties").and_then(|p| p.get(name)) {
            field_schemas.push(named);
            continue;
        }
        if let Some(Value::Object(patterns)) = s.get("patternProperties") {
            field_schemas.extend(patterns.values());
        }
        if let Some(additional) = s.get("additionalProperties").filter(|a| a.is_object()) {
            field_schemas.push(additional);
        }
    }
    field_schemas
}

impl From<Fingerprint> for String {
    fn from(fp: Fingerprint) -> String {
        fp.to_hex()
    }
}

impl TryFrom<String> for Fingerprint {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Fingerprint::from_hex(&text)
    }
}

impl Fingerprint {
    /// Parses 64 hex digits, as stores keep them.
    pub fn from_hex(text: &str) -> Result<Fingerprint, String> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out)
            .map_err(|e| format!("bad fingerprint {text:?}: {e}"))?;
        Ok(Fingerprint(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Writes the canonical JSON form: object keys sorted by their bytes, no white space, numbers by
/// value (a whole float that an `i64` or `u64` holds is written as that integer), strings
/// escaped as JSON.
pub fn canonical_json(value: &Value, out: &mut String) {
    write_canonical(value, out).expect("writing to a String cannot fail")
}

/// An object's entries (some of them: the caller filters) in canonical form, as
/// [`canonical_json`] writes an object.
pub(crate) fn canonical_fields<'a>(
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut String,
) {
    write_object(entries, out).expect("writing to a String cannot fail")
}

/// Feeds canonical text written to it straight into a SHA-256: no buffer of its own on the call
/// path (one in front of the hasher, gathering the short pieces, cost more than it saved: the
/// hasher keeps its own).
#[derive(Clone)]
struct HashSink(Sha256);

impl HashSink {
    fn new() -> HashSink {
        HashSink(Sha256::new())
    }

    /// A hash with the start of a fingerprint of a call of `tool` written: its name, then the
    /// opening of the object of its fields.
    fn start(tool: &str) -> HashSink {
        let mut hasher = HashSink::new();
        write_string(tool, &mut hasher).expect("hashing cannot fail");
        hasher.bytes(b"\n{");
        hasher
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

impl fmt::Write for HashSink {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}

/// 2^63: the whole floats in `-2^63..2^63` are `i64`s, those in `2^63..2^64` are `u64`s.
const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;

fn write_canonical<W: fmt::Write + ?Sized>(value: &Value, out: &mut W) -> fmt::Result {
    match value {
        Value::Null => out.write_str("null"),
        Value::Bool(b) => out.write_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0) {
            // A whole float is the integer it equals, however large: `1e16` and
            // `10000000000000000` are one value. -0.0 and 0.0 are one value.
            Some(f) if (-TWO_TO_63..TWO_TO_63).contains(&f) => {
                out.write_str(itoa::Buffer::new().format(f as i64))
            }
            Some(f) if (0.0..2.0 * TWO_TO_63).contains(&f) => {
                out.write_str(itoa::Buffer::new().format(f as u64))
            }
            _ => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => out.write_str(itoa::Buffer::new().format(i)),
                (None, Some(u)) => out.write_str(itoa::Buffer::new().format(u)),
                (None, None) => write!(out, "{n}"),
            },
        },
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                write_canonical(item, out)?;
            }
            out.write_char(']')
        }
        Value::Object(map) => write_object(map.iter(), out),
    }
}

/// An object's entries in canonical form: sorted by their keys' bytes.
fn write_object<'a, W: fmt::Write + ?Sized>(
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut W,
) -> fmt::Result {
    let mut entries: Vec<(&String, &Value)> = entries.collect();
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.write_char('{')?;
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.write_char(',')?;
        }
        write_string(k, out)?;
        out.write_char(':')?;
        write_canonical(v, out)?;
    }
    out.write_char('}')
}

/// A JSON string with exactly the escapes serde_json writes: `\"`, `\\`, the short forms of
/// control characters, `\u00XX` for the other control characters, everything else as it is.
fn write_string<W: fmt::Write + ?Sized>(s: &str, out: &mut W) -> fmt::Result {
    out.write_str("\"")?;
    // Byte by byte: every byte that is escaped is ASCII, and no byte of a longer character is
    // (UTF-8 sets their high bit), so each escape falls between characters. Read as characters
    // instead, a fingerprint of six fields took 4,224 instructions besides SHA-256; now 3,520.
    let mut start = 0;
    for (i, &b) in s.as_bytes().iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.write_str(&s[start..i])?;
        match b {
            b'"' => out.write_str("\\\"")?,
            b'\\' => out.write_str("\\\\")?,
            0x08 => out.write_str("\\b")?,
            0x0c => out.write_str("\\f")?,
            b'\n' => out.write_str("\\n")?,
            b'\r' => out.write_str("\\r")?,
            b'\t' => out.write_str("\\t")?,
            // A copy: formatting `b` itself would keep it in memory through the whole loop.
            code => {
                let code = u32::from(code);
                write!(out, "\\u{code:04x}")?
            }
        }
        start = i + 1;
    }
    out.write_str(&s[start..])?;
    out.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Of branches that disagree, the first whose items take the array decides, as serde's
    /// untagged reading does: a set of numbers before a list of names sorts numbers only.
    #[test]
    fn the_first_branch_that_takes_an_array_says_whether_it_is_a_set() {
        let root = json!({"anyOf": [
            {"type": "boolean"},
            {"type": "array", "uniqueItems": true, "items": {"$ref": "#/$defs/Id"}},
            {"type": "array", "items": {"type": "string"}},
        ], "$defs": {"Id": {"type": "integer"}}});
        let sorted = |mut value: Value| {
            sort_sets(&mut value, &[&root], &root, 1);
            value
        };
        assert_eq!(sorted(json!([3, 1, 2])), json!([1, 2, 3]));
        assert_eq!(sorted(json!(["b", "a"])), json!(["b", "a"]));
        assert_eq!(sorted(json!([2, "a", 1])), json!([2, "a", 1]));
        // Branches that agree decide together, as before.
        let sets = json!({"anyOf": [
            {"type": "array", "uniqueItems": true, "items": {"type": "integer"}},
            {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
        ]});
        let mut value = json!(["b", "a"]);
        sort_sets(&mut value, &[&sets], &sets, 1);
        assert_eq!(value, json!(["a", "b"]));
    }

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let a = Fingerprint::of(&json!({"b": [1, {"y": 2, "x": 1.0}], "a": "s"})).unwrap();
        let b = Fingerprint::of(&json!({"a": "s", "b": [1.0, {"x": 1, "y": 2}]})).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn different_values_differ() {
        let a = Fingerprint::of(&json!({"amount": 100})).unwrap();
        let b = Fingerprint::of(&json!({"amount": 100.5})).unwrap();
        let c = Fingerprint::of(&json!({"amount": "100"})).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn canonical_text_is_compact_and_sorted() {
        let mut out = String::new();
        canonical_json(&json!({"z": null, "a": [true, "q\""], "m": -0.0}), &mut out);
        assert_eq!(out, r#"{"a":[true,"q\""],"m":0,"z":null}"#);
    }

    /// Integers are written as serde_json writes them, whole floats as the integer they equal,
    /// and other floats as serde_json writes them.
    #[test]
    fn numbers_are_written_as_serde_json_writes_them() {
        for (value, text) in [
            (json!(i64::MIN), "-9223372036854775808"),
            (json!(-1), "-1"),
            (json!(0), "0"),
            (json!(u64::MAX), "18446744073709551615"),
            (json!(100.0), "100"),
            (json!(-0.0), "0"),
            (json!(-7.0), "-7"),
            (json!(9_007_199_254_740_991.0), "9007199254740991"),
            (json!(9_007_199_254_740_992.0), "9007199254740992"),
            (json!(1e16), "10000000000000000"),
            (json!(-9_223_372_036_854_775_808.0), "-9223372036854775808"),
            (json!(9_223_372_036_854_775_808.0), "9223372036854775808"),
            (json!(18_446_744_073_709_549_568.0), "18446744073709549568"),
            (
                json!(18_446_744_073_709_551_616.0),
                "1.8446744073709552e+19",
            ),
            (
                json!(-9_223_372_036_854_777_856.0),
                "-9.223372036854778e+18",
            ),
            (json!(1.5), "1.5"),
            (json!(1e300), "1e+300"),
        ] {
            let mut out = String::new();
            canonical_json(&value, &mut out);
            assert_eq!(out, text, "{value}");
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for text in [
            "plain",
            "q\"uote",
            "back\\slash",
            "\u{0}\u{8}\u{c}\n\r\t\u{1f}",
            "é ✓ \u{7f} /",
        ] {
            let mut out = String::new();
            canonical_json(&json!(text), &mut out);
            assert_eq!(out, serde_json::to_string(text).unwrap(), "{text:?}");
        }
        // Every ASCII character, alone and between wider characters on either side (where a
        // reading by bytes could cut one), and every written escape's neighbours.
        for b in 0u8..0x80 {
            let c = char::from(b);
            for text in [
                c.to_string(),
                format!("é{c}✓"),
                format!("{c}{c}𝄞"),
                format!("𝄞\n{c}\"é"),
            ] {
                let mut out = String::new();
                canonical_json(&json!(text), &mut out);
                assert_eq!(out, serde_json::to_string(&text).unwrap(), "{text:?}");
            }
        }
    }

    #[test]
    fn the_fingerprint_is_the_sha256_of_the_canonical_text() {
        let value = json!({"b": ["x\"y", 2.0], "a": {"z": null, "y": -1.5}});
        let mut text = String::new();
        canonical_json(&value, &mut text);
        let expected: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(Fingerprint::of(&value).unwrap(), Fingerprint(expected));
    }

    #[test]
    fn hex_round_trip() {
        let a = Fingerprint::of(&json!(1)).unwrap();
        assert_eq!(Fingerprint::from_hex(&a.to_hex()).unwrap(), a);
        assert!(Fingerprint::from_hex("zz").is_err());
    }
}
