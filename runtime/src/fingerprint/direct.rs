//! A fingerprint's scalar fields written straight into the hash, without building their JSON
//! values first: the same bytes [`write_canonical`](super::write_canonical) writes for
//! `serde_json::to_value(field)`, so a fingerprint is the same whichever way it was made, and
//! the fingerprints stores already hold still match.
//!
//! It takes scalars only (strings, booleans, numbers up to 64 bits, `Option`s and newtypes of
//! them, unit enum variants). Any other shape (a sequence, a map, a struct, a data enum, 128-bit
//! numbers, bytes) says [`Fallback`] with nothing written, and the caller builds the field's
//! value and writes it. Each scalar goes through the same `serde_json::Value` (built on the
//! stack: no scalar but a string owns memory) and the same writer, so numbers are written
//! exactly as the value would write them.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};
use serde_json::Value;

use super::{write_canonical, write_string};

/// This shape is not taken here: build the value and write it.
#[derive(Debug)]
pub(super) struct Fallback;

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a scalar")
    }
}

impl std::error::Error for Fallback {}

impl ser::Error for Fallback {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Fallback
    }
}

/// Writes a scalar as the canonical writer writes its value. It writes only at a scalar, once,
/// so a shape it does not take fails with nothing written.
pub(super) struct Scalar<'a>(pub(super) &'a mut dyn fmt::Write);

impl Scalar<'_> {
    fn value(self, value: &Value) -> Result<(), Fallback> {
        write_canonical(value, self.0).map_err(|_| Fallback)
    }
}

/// Every method a shape not taken here would call.
macro_rules! fall_back {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(
            fn $method(self, $(_: $arg),*) -> Result<$ok, Fallback> {
                Err(Fallback)
            }
        )*
    };
}

impl<'a> ser::Serializer for Scalar<'a> {
    type Ok = ();
    type Error = Fallback;
    type SerializeSeq = Impossible<(), Fallback>;
    type SerializeTuple = Impossible<(), Fallback>;
    type SerializeTupleStruct = Impossible<(), Fallback>;
    type SerializeTupleVariant = Impossible<(), Fallback>;
    type SerializeMap = Impossible<(), Fallback>;
    type SerializeStruct = Impossible<(), Fallback>;
    type SerializeStructVariant = Impossible<(), Fallback>;

    fn serialize_bool(self, v: bool) -> Result<(), Fallback> {
        self.value(&Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_u8(self, v: u8) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_f32(self, v: f32) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Fallback> {
        self.value(&Value::from(v))
    }
    fn serialize_char(self, v: char) -> Result<(), Fallback> {
        let mut utf8 = [0; 4];
        write_string(v.encode_utf8(&mut utf8), self.0).map_err(|_| Fallback)
    }
    fn serialize_str(self, v: &str) -> Result<(), Fallback> {
        write_string(v, self.0).map_err(|_| Fallback)
    }
    fn serialize_none(self) -> Result<(), Fallback> {
        self.value(&Value::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Fallback> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Fallback> {
        self.value(&Value::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Fallback> {
        self.value(&Value::Null)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Fallback> {
        write_string(variant, self.0).map_err(|_| Fallback)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Fallback> {
        // serde_json reads its raw values by this name; leave them to it.
        if name.starts_with("$serde_json") {
            return Err(Fallback);
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Fallback> {
        Err(Fallback)
    }

    fall_back! {
        serialize_i128(i128) -> ();
        serialize_u128(u128) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Fingerprint, FingerprintFields, FingerprintSchema};
    use super::*;
    use serde::Serialize;

    #[derive(Serialize, Clone, Copy)]
    enum Tier {
        Gold,
        #[serde(rename = "plain-silver")]
        Silver,
    }

    #[derive(Serialize)]
    struct Cents(u32);

    /// Fields named so that declaration order is not byte order.
    #[derive(Serialize)]
    struct Args {
        zeta: String,
        alpha: bool,
        #[serde(rename = "Beta")]
        beta: i64,
        _x: u64,
        a1: u8,
        a: i32,
        amount: f64,
        ratio: f32,
        initial: char,
        memo: Option<String>,
        maybe: Option<f64>,
        tier: Tier,
        cents: Cents,
        #[serde(skip_serializing_if = "Option::is_none")]
        sometimes: Option<i64>,
        unit: (),
    }

    /// The canonical text of `args` the way fingerprints were always written: its value first.
    fn through_value<T: Serialize>(args: &T) -> String {
        let mut text = String::new();
        write_canonical(&serde_json::to_value(args).unwrap(), &mut text).unwrap();
        text
    }

    fn direct<T: Serialize>(value: &T) -> Result<String, Fallback> {
        let mut text = String::new();
        value.serialize(Scalar(&mut text)).map(|()| text)
    }

    /// What was hashed for a call of `tool` with `args`, the way fingerprints were always made.
    fn fingerprint_through_value<T: Serialize>(tool: &str, args: &T) -> Fingerprint {
        let mut text = String::new();
        write_string(tool, &mut text).unwrap();
        text.push('\n');
        text.push_str(&through_value(args));
        use sha2::Digest;
        Fingerprint(sha2::Sha256::digest(text.as_bytes()).into())
    }

    /// `args`' fields added one by one in the byte order of their names, as generated code does.
    fn fingerprint_by_fields(args: &Args, schema: &FingerprintSchema) -> Fingerprint {
        let mut fp = FingerprintFields::new(schema);
        // Byte order: upper case, then `_`, then lower case; shorter prefixes first.
        fp.field("Beta", &args.beta);
        fp.field("_x", &args._x);
        fp.field("a", &args.a);
        fp.field("a1", &args.a1);
        fp.field("alpha", &args.alpha);
        fp.field("amount", &args.amount);
        fp.field("cents", &args.cents);
        fp.field("initial", &args.initial);
        fp.field("maybe", &args.maybe);
        fp.field("memo", &args.memo);
        fp.field("ratio", &args.ratio);
        if let Some(sometimes) = &args.sometimes {
            fp.field("sometimes", sometimes);
        }
        fp.field("tier", &args.tier);
        fp.field("unit", &args.unit);
        fp.field("zeta", &args.zeta);
        fp.finish().unwrap()
    }

    const FLOATS: &[f64] = &[
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        100.0,
        100.5,
        1e300,
        -1e-300,
        5e-324,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        9_007_199_254_740_991.0,
        9_007_199_254_740_992.0,
        9_007_199_254_740_994.0,
        -9_007_199_254_740_992.0,
        1e16,
        123_456_789.125,
        0.1,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];

    const TEXTS: &[&str] = &[
        "",
        "acme",
        " ACME ",
        "quote \" and \\ backslash",
        "tab\tnew\nline\rcarriage",
        "\u{0}\u{1}\u{1f}\u{7f}",
        "\u{2028}\u{2029}",
        "ünïcödé",
        "emoji 🧾",
        "</script>",
    ];

    /// Every field takes values from lists of awkward ones, cycled at different strides so
    /// that many combinations meet.
    #[test]
    fn a_struct_of_scalars_is_written_as_its_value_would_be() {
        for i in 0..2_000usize {
            let float = FLOATS[i % FLOATS.len()];
            let args = Args {
                zeta: TEXTS[i % TEXTS.len()].to_string(),
                alpha: i % 2 == 0,
                beta: [0, -1, i64::MIN, i64::MAX, 42][i % 5],
                _x: [0, 1, u64::MAX, 1 << 53, (1 << 53) + 1][i % 5],
                a1: (i % 256) as u8,
                a: [i32::MIN, -7, 0, i32::MAX][i % 4],
                amount: float,
                ratio: FLOATS[(i / 3) % FLOATS.len()] as f32,
                initial: ['a', '"', '\\', '\n', '\u{0}', 'é', '🧾'][i % 7],
                memo: (i % 3 != 0).then(|| TEXTS[(i / 7) % TEXTS.len()].to_string()),
                maybe: (i % 4 != 0).then_some(FLOATS[(i / 5) % FLOATS.len()]),
                tier: [Tier::Gold, Tier::Silver][i % 2],
                cents: Cents(i as u32 * 7919),
                sometimes: (i % 5 == 0).then_some(i as i64),
                unit: (),
            };
            for (name, field) in serde_json::to_value(&args).unwrap().as_object().unwrap() {
                let written = match name.as_str() {
                    "zeta" => direct(&args.zeta),
                    "alpha" => direct(&args.alpha),
                    "Beta" => direct(&args.beta),
                    "_x" => direct(&args._x),
                    "a1" => direct(&args.a1),
                    "a" => direct(&args.a),
                    "amount" => direct(&args.amount),
                    "ratio" => direct(&args.ratio),
                    "initial" => direct(&args.initial),
                    "memo" => direct(&args.memo),
                    "maybe" => direct(&args.maybe),
                    "tier" => direct(&args.tier),
                    "cents" => direct(&args.cents),
                    "sometimes" => direct(&args.sometimes),
                    "unit" => direct(&args.unit),
                    other => panic!("no field {other}"),
                };
                let mut expected = String::new();
                write_canonical(field, &mut expected).unwrap();
                assert_eq!(written.unwrap(), expected, "case {i}, field {name}");
            }
            // The whole fingerprint, field by field, is the one its value always made.
            let plain = FingerprintSchema::new("send_invoice", || serde_json::json!({}));
            assert_eq!(
                fingerprint_by_fields(&args, &plain),
                fingerprint_through_value("send_invoice", &args),
                "case {i}"
            );
        }
    }

    #[test]
    fn other_shapes_are_left_to_the_value() {
        #[derive(Serialize)]
        struct Nested {
            inner: Cents2,
        }
        #[derive(Serialize)]
        struct Cents2 {
            cents: u32,
        }
        #[derive(Serialize)]
        struct Listed {
            items: Vec<u32>,
        }
        #[derive(Serialize)]
        struct Wide {
            n: u128,
        }
        #[derive(Serialize)]
        enum Shape {
            Circle(f64),
        }
        #[derive(Serialize)]
        struct Data {
            shape: Shape,
        }
        assert!(direct(&Nested {
            inner: Cents2 { cents: 1 }
        })
        .is_err());
        assert!(direct(&Listed { items: vec![1] }).is_err());
        assert!(direct(&Wide { n: 1 }).is_err());
        assert!(direct(&Data {
            shape: Shape::Circle(1.0)
        })
        .is_err());
        assert!(direct(&vec![1u32]).is_err());
        assert!(direct(&Some(vec![1u32])).is_err());
        assert!(direct(&serde_json::json!({"a": 1})).is_err());
        // And a fingerprint whose fields take the value's way is the one the value makes.
        let schema = FingerprintSchema::new("tool", || serde_json::json!({}));
        let mut fp = FingerprintFields::new(&schema);
        fp.field(
            "data",
            &Data {
                shape: Shape::Circle(1.5),
            },
        );
        fp.field("items", &vec![3u32, 1]);
        fp.field("n", &7u32);
        fp.field(
            "nested",
            &Nested {
                inner: Cents2 { cents: 1 },
            },
        );
        fp.field("wide", &u128::from(u64::MAX));
        let whole = serde_json::json!({
            "items": [3, 1], "n": 7, "nested": {"inner": {"cents": 1}},
            "data": {"shape": {"Circle": 1.5}}, "wide": u64::MAX,
        });
        assert_eq!(
            fp.finish().unwrap(),
            fingerprint_through_value("tool", &whole)
        );
    }

    /// With a schema that has sets, every field goes through its value, and a set's order
    /// means nothing: the fingerprint is the one the whole value, sorted, always made.
    #[test]
    fn sets_are_sorted_field_by_field_as_in_the_whole_value() {
        #[derive(Serialize, schemars::JsonSchema)]
        struct WithSets {
            amount: u64,
            codes: std::collections::HashSet<u32>,
            tags: std::collections::BTreeSet<String>,
            labels: Vec<String>,
        }
        let schema = FingerprintSchema::new("tag", crate::schema::schema_for::<WithSets>);
        let by_fields = |codes: &[u32], tags: &[&str], labels: &[&str]| {
            let mut fp = FingerprintFields::new(&schema);
            fp.field("amount", &5u64);
            // Slices in any order stand for the sets: the schema says `codes` and `tags` are.
            fp.field("codes", &codes);
            fp.field("labels", &labels);
            fp.field("tags", &tags);
            fp.finish().unwrap()
        };
        let sorted = serde_json::json!({
            "amount": 5, "codes": [1, 2], "labels": ["b", "a"], "tags": ["x", "y"],
        });
        assert_eq!(
            by_fields(&[2, 1], &["y", "x"], &["b", "a"]),
            fingerprint_through_value("tag", &sorted)
        );
        assert_eq!(
            by_fields(&[1, 2], &["x", "y"], &["b", "a"]),
            by_fields(&[2, 1], &["y", "x"], &["b", "a"])
        );
        // A list is not a set: its order is part of the action.
        assert_ne!(
            by_fields(&[1, 2], &["x", "y"], &["a", "b"]),
            by_fields(&[1, 2], &["x", "y"], &["b", "a"])
        );
    }

    /// A value that spells a separator and a field of its own is one field's text: written
    /// escaped, it cannot pass for two fields, on the scalar way or the value's.
    #[test]
    fn a_value_cannot_forge_a_field() {
        for sets in [false, true] {
            let schema = if sets {
                FingerprintSchema::new("pay", || serde_json::json!({"uniqueItems": true}))
            } else {
                FingerprintSchema::new("pay", || serde_json::json!({}))
            };
            let one = {
                let mut fp = FingerprintFields::new(&schema);
                fp.field("a", "1\",\"b\":\"2");
                fp.finish().unwrap()
            };
            let two = {
                let mut fp = FingerprintFields::new(&schema);
                fp.field("a", "1");
                fp.field("b", "2");
                fp.finish().unwrap()
            };
            assert_ne!(one, two, "sets: {sets}");
            let forged = serde_json::json!({"a": "1\",\"b\":\"2"});
            assert_eq!(
                one,
                fingerprint_through_value("pay", &forged),
                "sets: {sets}"
            );
        }
        // Nor can a tool's name pass for the start of the fields.
        let named = |tool: &'static str, field: Option<&str>| {
            let schema = FingerprintSchema::new(tool, || serde_json::json!({}));
            let mut fp = FingerprintFields::new(&schema);
            if let Some(value) = field {
                fp.field("a", value);
            }
            fp.finish().unwrap()
        };
        assert_ne!(named("pay\"\n{\"a\":\"1\"}", None), named("pay", Some("1")));
    }

    /// A tool's schema keeps the start of its fingerprints, its name written, and hands each
    /// call a copy: every call, the first and those after, gets the start the name makes.
    #[test]
    fn each_call_starts_from_its_tools_name() {
        for tool in ["pay", "refund", "pay\u{e9}", "a\"b\n{"] {
            let schema = FingerprintSchema::new(tool, || serde_json::json!({}));
            for a in [1u8, 2, 1] {
                let mut fp = FingerprintFields::new(&schema);
                fp.field("a", &a);
                assert_eq!(
                    fp.finish().unwrap(),
                    fingerprint_through_value(tool, &serde_json::json!({"a": a})),
                    "{tool} {a}"
                );
            }
        }
    }

    #[test]
    fn a_field_that_cannot_be_serialized_is_an_error_not_a_fingerprint() {
        let schema = FingerprintSchema::new("tool", || serde_json::json!({}));
        let mut fp = FingerprintFields::new(&schema);
        let mut bad = std::collections::HashMap::new();
        bad.insert((1u8, 2u8), 3u8);
        fp.field("bad", &bad);
        fp.field("later", &1u8);
        assert!(fp.finish().is_err());
    }
}
