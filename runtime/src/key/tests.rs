use super::*;
use crate::ErrorCode;

#[test]
fn templates_that_can_build_one_key_are_found() {
    let overlap = [
        ("order:<id>", "order:<id>:line:<line>"),
        ("invoice:<customer>", "invoice:<customer>:<period>"),
        ("inv:<a>", "inv:x<b>"),
        ("pair:<a>x<b>", "pair:<a>"),
        ("ord:<a>", "ord:x:<b>"),
        ("a:<x>:<y>", "a:<x>-<y>"),
    ];
    for (a, b) in overlap {
        assert!(templates_overlap(a, b), "{a} / {b}");
        assert!(templates_overlap(b, a), "{b} / {a}");
    }
    // A namespace that spells every letter and digit (and the first private-use character)
    // leaves none of those to stand for the other characters: the walk finds one further on.
    let every = "abcdefghijklmnopqrstuvwxyz0123456789\u{e000}";
    let (short, long) = (format!("{every}:<a>"), format!("{every}:<a>:<b>"));
    assert!(templates_overlap(&short, &long));
    assert!(!templates_overlap(&short, &format!("{every}-x:<a>")));
    let apart = [
        (
            "invoice:<customer>:<period>",
            "reminder:<customer>:<period>",
        ),
        ("order:<id>:cancel", "order:<id>:ship"),
        ("charge:<order>", "refund:<order>"),
        ("payment:<order>", "payment:<order>"),
        ("payment:<order>", "payment:<id>"),
        ("ship:<order>", "ship-plain:<order>"),
        ("a:<x>:<y>:z", "a:<x>:<y>:w"),
    ];
    for (a, b) in apart {
        assert!(!templates_overlap(a, b), "{a} / {b}");
        assert!(!templates_overlap(b, a), "{b} / {a}");
    }
}

/// The walk misses no overlap: for templates of one or two parts, every key a search over
/// short values finds both building is one the walk reports.
#[test]
fn the_walk_agrees_with_a_search_over_values() {
    let templates = [
        "k:<a>",
        "k:<a>:<b>",
        "k:<a>x<b>",
        "k:x<a>",
        "k:<a>:x",
        "k:<a>-<b>",
        "k:<a>:<b>:",
    ];
    let values = ["", "x", ":", "-", "x:", ":x", "x-x", "a", "a:x", "x:a"];
    let build = |template: &str, vals: &[&str]| -> Option<String> {
        let shape = Shape::of(template);
        let mut key = String::new();
        let mut vals = vals.iter();
        for item in &shape.items {
            match item {
                Item::Char(c) => key.push(*c),
                Item::Value => {
                    for c in vals.next()?.chars() {
                        if shape.escaped.contains(&c) {
                            key.push(ESCAPE);
                        }
                        key.push(c);
                    }
                }
            }
        }
        Some(key)
    };
    let keys = |template: &str| -> HashSet<String> {
        let parts = Shape::of(template)
            .items
            .iter()
            .filter(|i| **i == Item::Value)
            .count();
        let mut all = HashSet::new();
        for a in values {
            for b in values {
                if let Some(key) = build(template, &[a, b][..parts]) {
                    all.insert(key);
                }
            }
        }
        all
    };
    for a in templates {
        for b in templates {
            let found = a != b && !keys(a).is_disjoint(&keys(b));
            assert!(
                !found || templates_overlap(a, b),
                "{a} / {b}: the search found a shared key"
            );
        }
    }
}

fn build(fold: bool, customer: &str, period: &str) -> Result<IdempotencyKey, ToolError> {
    let mut b = KeyBuilder::new("invoice:", ":");
    if fold {
        b.part_case_insensitive(customer, "customer");
    } else {
        b.part(customer, "customer");
    }
    b.literal(":");
    b.part(period, "period");
    b.finish()
}

fn key(customer: &str, period: &str) -> IdempotencyKey {
    build(true, customer, period).unwrap()
}

fn exact(customer: &str, period: &str) -> IdempotencyKey {
    build(false, customer, period).unwrap()
}

#[test]
fn folds_case_only_where_asked_and_always_trims_and_composes() {
    assert_eq!(key("  ACME ", "2026-10"), key("acme", "2026-10"));
    assert_eq!(key("acme", "2026-10").as_str(), "invoice:acme:2026-10");
    assert_ne!(exact("ch_3MtwBw", "x"), exact("ch_3mtwbw", "x"));
    assert_eq!(exact(" ch_3MtwBw ", "x").as_str(), "invoice:ch_3MtwBw:x");
    // "é" precomposed and decomposed are one value, whatever the case rule.
    assert_eq!(key("caf\u{e9}", "x"), key("cafe\u{301}", "x"));
    assert_eq!(exact("caf\u{e9}", "x"), exact("cafe\u{301}", "x"));
}

/// A case-insensitive part is case-folded in full, as Unicode matches text without case:
/// lowercasing alone leaves `ß` apart from the `SS` its capitals are written with.
#[test]
fn case_insensitive_parts_fold_case_in_full() {
    let folded_alike = [
        ("Hauptstraße", "HAUPTSTRASSE"),
        ("Hauptstraße", "hauptstrasse"),
        ("ΟΔΟΣ", "οδος"),
        ("οδοσ", "οδος"),
        ("ﬁle", "FILE"),
        ("Kelvin \u{212a}", "kelvin k"),
        ("Ꮳ", "ꮳ"),
    ];
    for (a, b) in folded_alike {
        assert_eq!(key(a, "x"), key(b, "x"), "{a} and {b}");
    }
    // Where the case is kept, they stay two values; and folding merges no other letters.
    assert_ne!(exact("Hauptstraße", "x"), exact("HAUPTSTRASSE", "x"));
    assert_ne!(key("straße", "x"), key("strase", "x"));
    assert_ne!(key("ΟΔΟΣ", "x"), key("οδο", "x"));
}

#[test]
fn a_value_cannot_forge_another_part() {
    assert_ne!(key("acme:2026", "10"), key("acme", "2026:10"));
    assert_ne!(key("a\\", ":b"), key("a", "\\:b"));
    assert_eq!(key("acme:2026", "10").as_str(), "invoice:acme\\:2026:10");
}

#[test]
fn letters_of_the_literal_text_are_escaped_too() {
    let pair = |a: &str, b: &str| {
        let mut k = KeyBuilder::new("pair:", "x");
        k.part(a, "a");
        k.literal("x");
        k.part(b, "b");
        k.finish().unwrap()
    };
    assert_ne!(pair("1x2", "3"), pair("1", "2x3"));
    assert_eq!(pair("1x2", "3").as_str(), "pair:1\\x2x3");
}

#[test]
fn control_characters_are_invalid_arguments() {
    for bad in ["a\u{0}b", "a\nb", "\u{7f}x", "x\u{85}y"] {
        let err = build(false, bad, "2026-10").unwrap_err();
        assert!(err.is(ErrorCode::InvalidArguments), "{bad:?}: {err}");
        assert!(!err.is_retryable());
        assert!(err.message().starts_with("`customer`"), "{err}");
        assert!(!err.message().contains(bad), "no value in the text: {err}");
    }
    // Surrounding white space, line breaks included, is trimmed first.
    assert!(build(false, "acme\n", "2026-10").is_ok());
    let mut b = KeyBuilder::new("refund:", "");
    b.ctx_part("run\u{0}", "run_id");
    assert!(b.finish().unwrap_err().is(ErrorCode::MissingContext));
}

#[test]
fn a_folded_capital_is_escaped_as_the_literal_letter_it_becomes() {
    // `nsa<x>a<y>`, both parts case-insensitive: ("A", "") and ("", "A") were both written
    // `nsaaa`, the capital lowercased after the check that escapes the literal `a`.
    let key = |x: &str, y: &str| {
        let mut k = KeyBuilder::new("nsa", "a");
        k.part_case_insensitive(x, "x");
        k.literal("a");
        k.part_case_insensitive(y, "y");
        k.finish().unwrap().as_str().to_string()
    };
    assert_ne!(key("A", ""), key("", "A"));
    assert_eq!(key("A", ""), key("a", ""));
    assert_eq!(key("ABA", "b"), key("aba", "B"));
}

/// A `char` is its own value: white-space characters are distinct parts, not all the empty
/// one, a control character is refused, and a char is composed and folded as text is.
#[test]
fn chars_are_not_trimmed() {
    let seat = |letter: char, fold: bool| {
        let mut b = KeyBuilder::new("seat:", "");
        if fold {
            b.part_case_insensitive(&letter, "letter");
        } else {
            b.part(&letter, "letter");
        }
        b.finish()
    };
    let spaces = [' ', '\u{a0}', '\u{3000}', '\u{2009}'];
    let keys: std::collections::HashSet<String> = spaces
        .iter()
        .map(|&c| seat(c, false).unwrap().as_str().to_owned())
        .collect();
    assert_eq!(keys.len(), spaces.len(), "{keys:?}");
    assert_eq!(seat(' ', false).unwrap().as_str(), "seat: ");
    for bad in ['\t', '\n', '\u{0}', '\u{85}'] {
        let err = seat(bad, false).unwrap_err();
        assert!(err.is(ErrorCode::InvalidArguments), "{bad:?}: {err}");
    }
    assert_eq!(seat('A', true).unwrap(), seat('a', true).unwrap());
    assert_ne!(seat('A', false).unwrap(), seat('a', false).unwrap());
    // U+212B ANGSTROM SIGN composes to U+00C5, as it would inside text.
    assert_eq!(
        seat('\u{212b}', false).unwrap(),
        seat('\u{c5}', false).unwrap()
    );
}

/// ASCII values copied whole are written exactly as the character-by-character rule writes
/// them: every string of up to four characters over letters of both cases, a digit, the
/// template's specials, the marks, a space and control characters, in every way a value
/// reaches the key.
#[test]
fn a_value_copied_whole_is_written_as_each_character_would_be() {
    let alphabet = [
        'a', 'Z', '7', ':', 'x', '\\', '#', '>', '<', ' ', '\n', '\u{7f}', '\u{1}',
    ];
    // The rule, spelled independently: trimmed, each special or mark escaped, controls
    // refused, and letters lowered where the case is folded.
    let expected = |value: &str, fold: bool| -> Option<String> {
        let mut out = String::from("pair:");
        for c in value.trim().chars() {
            if c.is_control() {
                return None;
            }
            if "\\#><:x".contains(c) {
                out.push('\\');
            }
            out.push(if fold { c.to_ascii_lowercase() } else { c });
        }
        Some(out)
    };
    let mut values = vec![String::new()];
    for _ in 0..4 {
        let longer: Vec<String> = values
            .iter()
            .filter(|v| v.chars().count() == values.last().unwrap().chars().count())
            .flat_map(|v| alphabet.iter().map(move |c| format!("{v}{c}")))
            .collect();
        values.extend(longer);
    }
    assert_eq!(values.len(), 1 + 13 + 169 + 2197 + 28561);
    for value in &values {
        for fold in [false, true] {
            let mut b = KeyBuilder::new("pair:", ":x");
            if fold {
                b.part_case_insensitive(value.as_str(), "a");
            } else {
                b.part(value.as_str(), "a");
            }
            let got = b.finish().ok().map(|k| k.as_str().to_owned());
            assert_eq!(got, expected(value, fold), "{value:?}, folded: {fold}");
        }
        // Canonical text (a number's, say) is neither trimmed nor folded, but still escaped.
        let mut b = KeyBuilder::new("pair:", ":x");
        let mut writer = KeyPartWriter {
            buf: &mut b.buf,
            specials: b.specials,
            escaped: b.escaped,
            fold_case: false,
            invalid: false,
        };
        writer.canonical(value);
        let invalid = writer.invalid;
        let mut spelled = String::from("pair:");
        for c in value.chars() {
            if "\\#><:x".contains(c) {
                spelled.push('\\');
            }
            spelled.push(c);
        }
        assert_eq!(b.buf, spelled, "{value:?}");
        assert_eq!(invalid, value.chars().any(char::is_control), "{value:?}");
    }
}

/// A template whose literal text holds a character beyond ASCII escapes it in values too,
/// beside its ASCII specials, whichever way a value is written.
#[test]
fn specials_beyond_ascii_are_escaped_too() {
    let pair = |a: &str| {
        let mut k = KeyBuilder::new("pair:", ":\u{2192}");
        k.part(a, "a");
        k.literal("\u{2192}");
        k.part("b", "b");
        k.finish().unwrap().as_str().to_owned()
    };
    assert_eq!(pair("plain"), "pair:plain\u{2192}b");
    assert_eq!(pair("a:b"), "pair:a\\:b\u{2192}b");
    assert_eq!(pair("a\u{2192}b"), "pair:a\\\u{2192}b\u{2192}b");
    assert_eq!(pair("caf\u{e9}"), "pair:caf\u{e9}\u{2192}b");
    assert_ne!(pair("x\u{2192}b"), pair("x"));
}

#[test]
fn long_keys_keep_their_namespace_and_fit() {
    let long = "x".repeat(600);
    let k = key(&long, "2026-10");
    assert!(k.as_str().len() <= MAX_KEY_BYTES);
    assert!(k.as_str().starts_with("invoice:#"));
    assert_ne!(k, key(&"x".repeat(599), "2026-10"));
}

#[test]
fn a_value_cannot_forge_a_hashed_key() {
    let hashed = {
        let mut b = KeyBuilder::hashed("invoice:", ":");
        b.part("acme", "customer");
        b.finish().unwrap()
    };
    let forged = key(hashed.rest(), "");
    assert_ne!(hashed.as_str(), forged.as_str().trim_end_matches(':'));
}

#[test]
fn steps_keep_the_parents_whole_key() {
    let parent = key("acme", "2026-10");
    assert_eq!(
        parent.step_key("email").as_str(),
        "invoice:acme:2026-10>email"
    );
    // A value holding the step mark cannot make a tool key that looks like a step's.
    assert_ne!(key("acme", "2026-10>email"), parent.step_key("email"));
}
