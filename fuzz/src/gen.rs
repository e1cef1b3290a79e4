//! Turning the fuzzer's bytes into inputs: arbitrary JSON, JSON shaped by a tool's schema and then
//! broken in small ways, and text full of the characters that break keys and parsers.
//!
//! Everything reads from one [`Gen`] over the input bytes, so an input is replayed exactly from
//! its bytes (or from the seed bolero prints), and a coverage-guided engine that mutates bytes
//! mutates these values.

use arbitrary::Unstructured;
use serde_json::{Map, Number, Value};

/// Nesting deeper than this is cut short: the point is arbitrary shapes, not stack depth
/// (serde_json refuses input nested deeper than 128 anyway).
const MAX_DEPTH: usize = 8;
/// Items per array or object.
const MAX_WIDTH: usize = 6;

/// Text that has broken, or could break, keys, parsers and escaping.
const PIECES: &[&str] = &[
    "",
    " ",
    "  ",
    "acme",
    "ACME",
    " Acme ",
    "2026-10",
    "a",
    "b",
    "x",
    ":",
    "::",
    "/",
    "-",
    "\\",
    "\\:",
    "#",
    "<",
    ">",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "]",
    "null",
    "{}",
    "[]",
    "0",
    "-1",
    "1e400",
    "true",
    "caf\u{e9}",
    "cafe\u{301}",
    "CAFE\u{301}",
    "\u{301}",
    "\u{0}",
    "\n",
    "\r\n",
    "\t",
    "\u{b}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{200b}",
    "\u{202e}",
    "\u{feff}",
    "\u{fffd}",
    "\u{10ffff}",
    "\u{1f600}",
    "\u{130}",
    "\u{df}",
    "\u{3a3}",
    "\u{fb03}",
    "\u{212b}",
    "\u{c5}",
    "A\u{30a}",
    "67e55044-10b1-426f-9247-bb680e5fe0c8",
    "67E55044-10B1-426F-9247-BB680E5FE0C8",
    "67e5504410b1426f9247bb680e5fe0c8",
    "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0c8",
    "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
    "basic",
    "pro_plus",
    "Basic",
    "vegetarian",
    "regular",
    "invoice_status",
    "send_invoice",
];

/// Numbers at the edges of every integer type and of f64.
const INTEGERS: &[i128] = &[
    0,
    1,
    -1,
    2,
    127,
    128,
    -128,
    255,
    256,
    -129,
    32767,
    65535,
    65536,
    2147483647,
    2147483648,
    4294967295,
    4294967296,
    -2147483649,
    9007199254740991,
    9007199254740992,
    9007199254740993,
    i64::MAX as i128,
    i64::MIN as i128,
    u64::MAX as i128,
];

const FLOATS: &[f64] = &[
    0.0,
    -0.0,
    0.1,
    0.5,
    1.0,
    -1.0,
    100.0,
    1e15,
    9007199254740992.0,
    9007199254740994.0,
    1e16,
    9223372036854775808.0,
    18446744073709549568.0,
    18446744073709551616.0,
    1e300,
    -1e300,
    f64::MAX,
    f64::MIN,
    f64::MIN_POSITIVE,
    5e-324,
    4294967295.0,
    255.5,
];

/// Reads values from an input's bytes. Never fails: when the bytes run out, every choice is its
/// first option, so short inputs are small values.
pub struct Gen<'a> {
    u: Unstructured<'a>,
    /// Field names worth trying as object keys (the tools' parameter names).
    names: &'a [String],
}

impl<'a> Gen<'a> {
    /// A generator over `bytes`, with `names` as likely object keys.
    pub fn new(bytes: &'a [u8], names: &'a [String]) -> Self {
        Gen {
            u: Unstructured::new(bytes),
            names,
        }
    }

    /// True with probability `n` in `d`.
    pub fn chance(&mut self, n: u8, d: u8) -> bool {
        self.u.ratio(n, d).unwrap_or(false)
    }

    /// A number in `0..len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        self.u.choose_index(len).unwrap_or(0)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.u.int_in_range(lo..=hi).unwrap_or(lo)
    }

    /// The bytes not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.u.take_rest()
    }

    /// Up to `max` raw bytes.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = self.range(0, max.min(self.u.len()));
        self.u.bytes(len).unwrap_or(&[])
    }

    /// One of `options`.
    pub fn pick<'b, T>(&mut self, options: &'b [T]) -> &'b T {
        &options[self.index(options.len())]
    }

    /// Text built from pieces that break things, random characters and raw bytes.
    pub fn text(&mut self) -> String {
        let mut out = String::new();
        for _ in 0..self.range(0, 5) {
            match self.range(0, 9) {
                0..=5 => out.push_str(self.pick::<&str>(PIECES)),
                6 | 7 => {
                    let c = self.u.arbitrary::<char>().unwrap_or('a');
                    out.push(c);
                }
                8 => out.push_str(&String::from_utf8_lossy(self.bytes(16))),
                _ => {
                    // A long run, past the key length limit.
                    let piece = self.pick(PIECES).to_string();
                    let times = self.range(1, 300);
                    out.push_str(&piece.repeat(times));
                }
            }
        }
        out
    }

    /// A JSON number: an edge of some type, or any i64, u64 or finite f64.
    pub fn number(&mut self) -> Value {
        match self.range(0, 4) {
            0 | 1 => int_value(*self.pick(INTEGERS)),
            2 => Value::from(*self.pick(FLOATS)),
            3 => Value::from(self.u.arbitrary::<i64>().unwrap_or(0)),
            _ => {
                let f = self.u.arbitrary::<f64>().unwrap_or(0.0);
                Number::from_f64(f).map_or(Value::from(0), Value::Number)
            }
        }
    }

    /// An object key: a parameter name most of the time, so objects look almost right.
    fn key(&mut self) -> String {
        if !self.names.is_empty() && self.chance(3, 4) {
            self.pick(self.names).clone()
        } else {
            self.text()
        }
    }

    /// Any JSON value.
    pub fn json(&mut self) -> Value {
        self.json_at(0)
    }

    fn json_at(&mut self, depth: usize) -> Value {
        let deepest = if depth >= MAX_DEPTH { 3 } else { 5 };
        match self.range(0, deepest) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(1, 2)),
            2 => self.number(),
            3 => Value::String(self.text()),
            4 => {
                let len = self.range(0, MAX_WIDTH);
                Value::Array((0..len).map(|_| self.json_at(depth + 1)).collect())
            }
            _ => {
                let mut map = Map::new();
                for _ in 0..self.range(0, MAX_WIDTH) {
                    let key = self.key();
                    let value = self.json_at(depth + 1);
                    map.insert(key, value);
                }
                Value::Object(map)
            }
        }
    }

    /// A value shaped by `schema` (a canonical tool schema; `root` holds its `$defs`): valid
    /// most of the time, with the edges of every type.
    pub fn valid(&mut self, schema: &Value, root: &Value) -> Value {
        self.valid_at(schema, root, 0)
    }

    fn valid_at(&mut self, schema: &Value, root: &Value, depth: usize) -> Value {
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        let schema = resolve(schema, root);
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            if !options.is_empty() {
                return self.pick(options).clone();
            }
        }
        if let Some(value) = schema.get("const") {
            return value.clone();
        }
        if let (Some(parts), Some(_)) = (
            schema.get("allOf").and_then(Value::as_array),
            schema.get("properties"),
        ) {
            // An object beside several unions (two flattened enums' arguments): the object's
            // own fields, then each part's.
            let mut rest = schema.clone();
            if let Value::Object(rest) = &mut rest {
                rest.shift_remove("allOf");
            }
            let mut whole = self.valid_at(&rest, root, depth + 1);
            for part in parts {
                let chosen = self.valid_at(part, root, depth + 1);
                if let (Value::Object(whole), Value::Object(chosen)) = (&mut whole, chosen) {
                    whole.extend(chosen);
                }
            }
            return whole;
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(branches) = schema.get(keyword).and_then(Value::as_array) {
                if !branches.is_empty() {
                    let branch = self.pick(branches);
                    let chosen = self.valid_at(branch, root, depth + 1);
                    if schema.get("properties").is_none() {
                        return chosen;
                    }
                    // An object beside a union (a flattened enum's arguments): the object's own
                    // fields, then the chosen branch's.
                    let mut rest = schema.clone();
                    if let Value::Object(rest) = &mut rest {
                        rest.shift_remove(keyword);
                        rest.entry("type").or_insert_with(|| Value::from("object"));
                    }
                    let mut whole = self.valid_at(&rest, root, depth + 1);
                    if let (Value::Object(whole), Value::Object(chosen)) = (&mut whole, chosen) {
                        whole.extend(chosen);
                    }
                    return whole;
                }
            }
        }
        let ty = match schema.get("type") {
            Some(Value::String(ty)) => ty.as_str(),
            Some(Value::Array(types)) if !types.is_empty() => {
                self.pick(types).as_str().unwrap_or("null")
            }
            _ => return self.json_at(depth),
        };
        match ty {
            "null" => Value::Null,
            "boolean" => Value::Bool(self.chance(1, 2)),
            "integer" => self.integer(schema),
            "number" => {
                if self.chance(1, 2) {
                    self.integer(schema)
                } else {
                    Value::from(*self.pick(FLOATS))
                }
            }
            "string" => self.string(schema),
            "array" => {
                let items = schema.get("items").unwrap_or(&Value::Null);
                let len = self.range(0, 4);
                let mut out: Vec<Value> = Vec::new();
                for _ in 0..len {
                    let item = self.valid_at(items, root, depth + 1);
                    let unique = schema.get("uniqueItems") == Some(&Value::Bool(true));
                    if !unique || !out.contains(&item) || self.chance(1, 8) {
                        out.push(item);
                    }
                }
                Value::Array(out)
            }
            "object" => {
                let mut map = Map::new();
                let required: Vec<&str> = schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                    for (name, property) in properties {
                        if required.contains(&name.as_str()) || self.chance(1, 2) {
                            let value = self.valid_at(property, root, depth + 1);
                            map.insert(name.clone(), value);
                        }
                    }
                }
                if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                    for _ in 0..self.range(0, 3) {
                        let key = self.text();
                        let value = self.valid_at(values, root, depth + 1);
                        map.insert(key, value);
                    }
                }
                Value::Object(map)
            }
            _ => self.json_at(depth),
        }
    }

    fn integer(&mut self, schema: &Value) -> Value {
        let min = schema.get("minimum").and_then(Value::as_f64);
        let max = schema.get("maximum").and_then(Value::as_f64);
        if self.chance(1, 3) {
            return int_value(*self.pick(INTEGERS));
        }
        let lo = min.unwrap_or(-1000.0).max(-1e18) as i128;
        let hi = max.unwrap_or(1000.0).min(1e18) as i128;
        let edge = match self.range(0, 3) {
            0 => lo,
            1 => hi,
            _ => {
                let span = (hi - lo).clamp(0, 1_000_000) as usize;
                lo + self.range(0, span) as i128
            }
        };
        int_value(edge)
    }

    fn string(&mut self, schema: &Value) -> Value {
        let format = schema.get("format").and_then(Value::as_str);
        if format == Some("uuid") && self.chance(3, 4) {
            let bytes: [u8; 16] = self.u.arbitrary().unwrap_or_default();
            let uuid = uuid::Uuid::from_bytes(bytes);
            let text = match self.range(0, 3) {
                0 => uuid.hyphenated().to_string(),
                1 => uuid.hyphenated().to_string().to_uppercase(),
                2 => uuid.simple().to_string(),
                _ => uuid.urn().to_string(),
            };
            return Value::String(text);
        }
        let max = schema.get("maxLength").and_then(Value::as_u64);
        if max == Some(1) && self.chance(3, 4) {
            let c = if self.chance(1, 2) {
                self.pick(PIECES).chars().next().unwrap_or('x')
            } else {
                self.u.arbitrary::<char>().unwrap_or('x')
            };
            return Value::String(c.to_string());
        }
        Value::String(self.text())
    }

    /// `value` with zero or more small breaks: a field dropped, added, nulled, or replaced by
    /// any JSON, anywhere in the tree; sometimes a field added to an object below the top (a
    /// misspelling the model makes inside a nested struct, which serde alone would drop).
    pub fn mutate(&mut self, mut value: Value) -> Value {
        for _ in 0..self.range(0, 3) {
            self.mutate_once(&mut value, 0);
        }
        if self.chance(1, 8) {
            let mut objects = Vec::new();
            nested_objects(&value, &mut Vec::new(), &mut objects);
            if !objects.is_empty() {
                let path = objects.swap_remove(self.index(objects.len()));
                let (key, v) = (self.key(), self.json_at(MAX_DEPTH));
                if let Some(Value::Object(map)) = at_path(&mut value, &path) {
                    map.insert(key, v);
                }
            }
        }
        value
    }

    fn mutate_once(&mut self, value: &mut Value, depth: usize) {
        // Descend into a child with some probability, else break this node.
        let descend = depth < MAX_DEPTH && self.chance(1, 2);
        match value {
            Value::Object(map) if descend && !map.is_empty() => {
                let i = self.index(map.len());
                if let Some((_, child)) = map.iter_mut().nth(i) {
                    self.mutate_once(child, depth + 1);
                }
                return;
            }
            Value::Array(items) if descend && !items.is_empty() => {
                let i = self.index(items.len());
                self.mutate_once(&mut items[i], depth + 1);
                return;
            }
            _ => {}
        }
        match (self.range(0, 4), &mut *value) {
            (0, Value::Object(map)) if !map.is_empty() => {
                let i = self.index(map.len());
                if let Some(k) = map.keys().nth(i).cloned() {
                    map.remove(&k);
                }
            }
            (1, Value::Object(map)) => {
                let key = self.key();
                let v = self.json_at(depth + 1);
                map.insert(key, v);
            }
            (2, Value::Array(items)) => {
                let v = self.json_at(depth + 1);
                items.push(v);
            }
            (3, _) => *value = Value::Null,
            _ => *value = self.json_at(depth),
        }
    }
}

/// A step from a value to one inside it.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// The path of every object below the top of `value`, `at` being the path to it.
fn nested_objects(value: &Value, at: &mut Vec<Step>, into: &mut Vec<Vec<Step>>) {
    match value {
        Value::Object(map) => {
            if !at.is_empty() {
                into.push(at.clone());
            }
            for (k, v) in map {
                at.push(Step::Key(k.clone()));
                nested_objects(v, at, into);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                at.push(Step::Index(i));
                nested_objects(v, at, into);
                at.pop();
            }
        }
        _ => {}
    }
}

/// The value at `path` in `value`.
fn at_path<'v>(value: &'v mut Value, path: &[Step]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// A JSON integer for any value in i64 or u64 range (others clamp).
fn int_value(n: i128) -> Value {
    if let Ok(n) = i64::try_from(n) {
        Value::from(n)
    } else {
        Value::from(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

/// Follows a local `$ref` (`#/$defs/Name`) to its schema.
fn resolve<'s>(schema: &'s Value, root: &'s Value) -> &'s Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => reference
            .strip_prefix("#/")
            .map(|path| {
                path.split('/')
                    .try_fold(root, |node, part| node.get(part))
                    .unwrap_or(&Value::Null)
            })
            .unwrap_or(&Value::Null),
        None => schema,
    }
}
