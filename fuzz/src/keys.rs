//! Key derivation under fuzzing: tools whose keys are built from model-controlled text, with
//! separators of every kind, checked against the documented normalization.
//!
//! Two calls share a key exactly when every key part normalizes to the same text: for strings,
//! trimmed and in Unicode NFC, and case-folded too where the parameter is
//! `#[arg(key = "case_insensitive")]`; a control character left after trimming is refused.
//! A value may contain any separator, escape or hash mark; none of them may make two different
//! actions share a key, or keep two spellings of one action apart.

use serde_json::Value;
use toolkey::{tool, ErrorCode, Tool, ToolContext, ToolError, MAX_KEY_BYTES};
use unicode_normalization::UnicodeNormalization;

use crate::gen::Gen;
use crate::harness::{check_error_json, Tally};

/// Case-sensitive parts around the usual separator.
#[tool(idempotent(key = "exact:<a>:<b>"))]
async fn exact_pair(a: String, b: String) -> Result<(), ToolError> {
    let _ = (a, b);
    Ok(())
}

/// Case-insensitive parts around the usual separator.
#[tool(idempotent(key = "folded:<a>:<b>"))]
async fn folded_pair(
    #[arg(key = "case_insensitive")] a: String,
    #[arg(key = "case_insensitive")] b: String,
) -> Result<(), ToolError> {
    let _ = (a, b);
    Ok(())
}

/// Parts separated by a letter: a value must not be able to forge it either.
#[tool(idempotent(key = "mixed:<a>x<b>"))]
async fn letter_separated(a: String, b: String) -> Result<(), ToolError> {
    let _ = (a, b);
    Ok(())
}

/// Several separators, one of them a letter, and a trailing literal.
#[tool(idempotent(key = "several:<a>/<b>-x<c>.end"))]
async fn several_separators(a: String, b: String, c: String) -> Result<(), ToolError> {
    let _ = (a, b, c);
    Ok(())
}

/// The keyed tools of this module: name, key namespace, and whether their parts are exact.
const TOOLS: &[(&str, &str, bool)] = &[
    ("exact_pair", "exact:", true),
    ("folded_pair", "folded:", false),
    ("letter_separated", "mixed:", true),
    ("several_separators", "several:", true),
];

fn tool_for(name: &str) -> Box<dyn Tool> {
    match name {
        "exact_pair" => Box::new(ExactPair),
        "folded_pair" => Box::new(FoldedPair),
        "letter_separated" => Box::new(LetterSeparated),
        _ => Box::new(SeveralSeparators),
    }
}

/// The parameters of each tool, in key order.
fn params(name: &str) -> &'static [&'static str] {
    if name == "several_separators" {
        &["a", "b", "c"]
    } else {
        &["a", "b"]
    }
}

/// A key part as the documentation says it is compared: trimmed, NFC, and for case-insensitive
/// parts case-folded in full (then NFC again, since folding can decompose).
fn normalized(text: &str, exact: bool) -> String {
    let nfc: String = text.trim().nfc().collect();
    if exact {
        nfc
    } else {
        unicase::UniCase::unicode(nfc)
            .to_folded_case()
            .nfc()
            .collect()
    }
}

/// Text from a small alphabet of separators, escapes, cases and spellings, so that two values
/// often differ only by where a separator falls or how a letter is written.
fn part(g: &mut Gen) -> String {
    const ALPHABET: &[&str] = &[
        "a", "A", "b", "x", "X", ":", "\\", "#", "/", "-", ".", "end", "<", ">", " ", "\u{e9}",
        "e\u{301}", "\u{0}", "\t", "\u{1f}", "\u{85}", "\u{130}", "\u{212a}", "k",
    ];
    let mut out = String::new();
    for _ in 0..g.range(0, 5) {
        out.push_str(g.pick::<&str>(ALPHABET));
    }
    if g.chance(1, 16) {
        // Long enough to be hashed.
        out.push_str(&"x".repeat(g.range(100, 300)));
    }
    out
}

/// A second tuple: a separator moved across a boundary, a respelling, or new values.
fn neighbour(g: &mut Gen, values: &[String]) -> Vec<String> {
    let mut other = values.to_vec();
    match g.range(0, 3) {
        0 if values.len() > 1 => {
            // Move text across the boundary between two parts.
            let i = g.index(values.len() - 1);
            let (left, right) = other.split_at_mut(i + 1);
            let (left, right) = (&mut left[i], &mut right[0]);
            if g.chance(1, 2) {
                if let Some(c) = left.pop() {
                    right.insert(0, c);
                }
            } else if !right.is_empty() {
                let c = right.remove(0);
                left.push(c);
            }
            let literal = g
                .pick(&["x", ":", "/", "-x", ".end", "\\", "#"])
                .to_string();
            if g.chance(1, 2) {
                left.push_str(&literal);
            } else {
                right.insert_str(0, &literal);
            }
        }
        1 => {
            // The same values written otherwise.
            for value in &mut other {
                *value = match g.range(0, 3) {
                    0 => format!(" {value}\t"),
                    1 => value.to_uppercase(),
                    2 => value.nfd().collect(),
                    _ => value.clone(),
                };
            }
        }
        _ => {
            for value in &mut other {
                *value = part(g);
            }
        }
    }
    other
}

/// The key a tool derives for `values`, or the error it refuses them with.
fn key_of(name: &str, values: &[String]) -> Result<String, ToolError> {
    let mut args = serde_json::Map::new();
    for (param, value) in params(name).iter().zip(values) {
        args.insert((*param).to_string(), Value::String(value.clone()));
    }
    let ctx = ToolContext::new("run-fuzz");
    let call = tool_for(name).prepare(&Value::Object(args), &ctx)?;
    Ok(call
        .key()
        .expect("a keyed tool's call has a key")
        .as_str()
        .to_string())
}

/// True when a value of a key field of the main toolbox's tool `name` holds a control
/// character: such values may be refused even though the schema (a plain string) allows them.
pub fn has_control_in_key(name: &str, args: &Value) -> bool {
    let fields: &[&str] = match name {
        "send_invoice" | "invoice_status" => &["customer", "period"],
        "ship_order" | "ship_order_status" => &["order"],
        "pay_back" | "pay_back_status" | "tag_order" | "tag_order_status" | "pay_out"
        | "pay_out_status" => &["order"],
        "record_visit" | "record_visit_status" => &["patient", "born"],
        _ => &[],
    };
    fields.iter().any(|f| {
        args.get(*f)
            .and_then(Value::as_str)
            .is_some_and(|s| s.chars().any(char::is_control))
    })
}

/// One input: two tuples of values for one tool, their keys compared with their normalized
/// values.
pub fn check(g: &mut Gen, tally: &Tally) {
    let (name, namespace, exact) = *g.pick(TOOLS);
    let first: Vec<String> = params(name).iter().map(|_| part(g)).collect();
    let second = neighbour(g, &first);
    let mut keys = Vec::new();
    for values in [&first, &second] {
        let key = key_of(name, values);
        tally.answer(&key);
        let control = values
            .iter()
            .any(|v| normalized(v, exact).chars().any(char::is_control));
        match key {
            Ok(key) => {
                assert!(key.len() <= MAX_KEY_BYTES, "{name} {values:?}: {key}");
                assert!(key.starts_with(namespace), "{name} {values:?}: {key}");
                assert!(
                    !control && !key.chars().any(char::is_control),
                    "{name} {values:?}: a control character reached the key {key:?}"
                );
                keys.push(Some(key));
            }
            Err(err) => {
                check_error_json(&err.to_json());
                assert!(
                    err.is(ErrorCode::InvalidArguments) && control,
                    "{name} {values:?} refused: {err:?}"
                );
                keys.push(None);
            }
        }
    }
    if let [Some(a), Some(b)] = &keys[..] {
        let same_values = first
            .iter()
            .zip(&second)
            .all(|(x, y)| normalized(x, exact) == normalized(y, exact));
        assert_eq!(
            a == b,
            same_values,
            "{name}: {first:?} -> {a:?}, {second:?} -> {b:?}"
        );
    }
}
