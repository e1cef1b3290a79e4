//! Idempotency keys: what can be a part of one, how parts are normalized and encoded, and the
//! key type.
//!
//! A key is its template's literal text with each `<placeholder>` replaced by a value:
//! `invoice:<customer>:<period>` gives `invoice:acme:2026-10`.
//!
//! - **Normalization**: text is trimmed and put in Unicode NFC, and keeps its case unless the
//!   parameter is `#[arg(key = "case_insensitive")]` (then it is case-folded too). Integers are
//!   decimal, `bool` is `true`/`false`, UUIDs are lowercase hyphenated, unit enums use their
//!   serde names.
//! - **Encoding**: inside a value, `\` escapes itself, `#`, `<`, `>` and every character of the
//!   template's literal text after its namespace. No value can forge the literal text between two
//!   parts, so key derivation is injective: two argument tuples that differ after normalization
//!   never share a key. (The macro rejects templates whose literal text holds `\`, `#` or a
//!   control character.)
//! - **Invalid values**: a control character in a key part is `INVALID_ARGUMENTS` (for a context
//!   field, `MISSING_CONTEXT`), before any store sees it.
//! - **Length**: a key over [`MAX_KEY_BYTES`] keeps its namespace and ends in `#` and the SHA-256
//!   of the rest; with `hash = true` every key takes that form.
//! - **Steps**: a `ctx.once` step is keyed `<parent key>><step name>`; no tool key holds an
//!   unescaped `>`.

use std::collections::HashSet;
use std::fmt;

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

use crate::{texts, ToolError};

/// Keys longer than this many bytes keep their namespace and are completed by a SHA-256.
pub const MAX_KEY_BYTES: usize = 255;

/// The escape character inside key parts. Values escape it, `#`, `<`, `>` and every character
/// of the template's literal text after the namespace, so the literal text and the parts of a
/// key can always be told apart again: key derivation is injective. Template literals may not
/// contain the escape character, `#` or a control character (the macro rejects them).
const ESCAPE: char = '\\';
/// Marks a hashed key (`invoice:#<sha256>`).
const HASH_MARK: char = '#';
/// Separates a parent call's key from the name of one of its steps (`invoice:acme:2026-10>email`).
/// No tool key contains it unescaped, so a step's record can never be a tool's record.
const STEP_MARK: char = '>';

/// The normalized idempotency key of one action, for example `invoice:acme:2026-10`.
///
/// Only generated code builds keys, from the fields a template names: the model never supplies
/// one, and no public constructor takes a string. A tool body reads its own key with
/// [`ToolContext::idempotency_key`](crate::ToolContext::idempotency_key), for example to forward it
/// as a payment provider's `Idempotency-Key` header.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    text: String,
    /// Bytes of the literal prefix (`invoice:`), the namespace and its separator.
    prefix_len: usize,
}

impl IdempotencyKey {
    /// The key as stored, for example `invoice:acme:2026-10`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The literal prefix the template starts with, for example `invoice:`.
    pub fn prefix(&self) -> &str {
        &self.text[..self.prefix_len]
    }

    /// Everything after the prefix: the normalized values (or `#` and their hash).
    pub fn rest(&self) -> &str {
        &self.text[self.prefix_len..]
    }

    /// A short SHA-256 of the key, for logs: it names the action without showing its values.
    pub fn log_hash(&self) -> String {
        self.for_logs().to_string()
    }

    /// The short hash as a `Display` value computed only when formatted, so a disabled log
    /// event costs nothing.
    pub(crate) fn for_logs(&self) -> LogHash<'_> {
        log_hash(&self.text)
    }

    /// The key of one step of a multi-step tool: the parent's whole key (namespace included),
    /// [`STEP_MARK`], the step's name (`invoice:acme:2026-10>email`). No tool key holds an
    /// unescaped `>`, and step names hold none, so a step's key is never another tool's key, the
    /// parent's own key, or another step's.
    pub(crate) fn step_key(&self, step: &str) -> IdempotencyKey {
        let mut text = String::with_capacity(self.text.len() + 1 + step.len());
        text.push_str(&self.text);
        text.push(STEP_MARK);
        text.push_str(step);
        IdempotencyKey {
            text,
            prefix_len: self.prefix_len,
        }
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.text).finish()
    }
}

/// Formats a key's short hash (see [`IdempotencyKey::log_hash`]) when, and only when, it is shown.
pub(crate) struct LogHash<'a>(&'a str);

/// The short hash of a stored key's text, for logs and operator messages: keys carry argument
/// values, which never go there.
pub(crate) fn log_hash(key: &str) -> LogHash<'_> {
    LogHash(key)
}

impl fmt::Display for LogHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = Sha256::digest(self.0.as_bytes());
        f.write_str(&hex::encode(&digest[..8]))
    }
}

/// A type whose values can be part of an idempotency key.
///
/// A key part needs exactly one canonical text form, so that two calls meaning the same action
/// always build the same key, and two calls meaning different actions never do. Strings are
/// trimmed and put in Unicode NFC, and keep their case: identifiers such as charge ids are
/// case-sensitive. A parameter marked `#[arg(key = "case_insensitive")]` (a customer name, an
/// email address) is case-folded as well (Unicode's full folding: `ß` and `SS` are one value).
/// Integers, `bool`, `char` and UUIDs have one form; unit enums get one from
/// `#[derive(toolkey::KeyPart)]`, which uses their serde names. A control character in a key part
/// is invalid input, refused before any store sees it.
///
/// ```text
/// #[derive(serde::Serialize, toolkey::KeyPart)]
/// #[serde(rename_all = "snake_case")]
/// enum Plan { Basic, Pro }     // key parts "basic" and "pro"
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "this type has no single canonical text form",
    note = "a key part must mean one action whatever way it is written: use a String, an integer, a bool, a char, a uuid::Uuid, or a unit enum with `#[derive(toolkey::KeyPart)]`",
    note = "to keep this parameter out of the key, remove its `<placeholder>` from the key template"
)]
pub trait KeyPart {
    /// Writes this value's canonical text through the writer, which escapes and normalizes it.
    fn write_key_part(&self, out: &mut KeyPartWriter<'_>);
}

/// Receives one key part's text and escapes and normalizes it into the key.
pub struct KeyPartWriter<'a> {
    buf: &'a mut String,
    specials: &'static str,
    /// The ASCII characters escaped (the marks and the specials), one bit each.
    escaped: u128,
    fold_case: bool,
    invalid: bool,
}

impl KeyPartWriter<'_> {
    /// Text that is normalized: trimmed and NFC; case-folded too where the parameter is
    /// `#[arg(key = "case_insensitive")]`.
    pub fn text(&mut self, text: &str) {
        self.untrimmed(text.trim())
    }

    /// [`text`](Self::text) without the trim: for a value whose white space is the value (a
    /// `char`: trimmed, every white-space character would be the same empty part).
    fn untrimmed(&mut self, text: &str) {
        if text.is_ascii() {
            if self.plain(text) {
                let start = self.buf.len();
                self.buf.push_str(text);
                if self.fold_case {
                    self.buf[start..].make_ascii_lowercase();
                }
                return;
            }
            for c in text.chars() {
                let c = if self.fold_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                };
                self.push(c);
            }
        } else if !self.fold_case {
            let normalized: String = text.nfc().collect();
            normalized.chars().for_each(|c| self.push(c));
        } else {
            // Full case folding, not lowercasing: `Straße` and `STRASSE` are one street, and a
            // final sigma one letter with any other.
            let folded = unicase::UniCase::unicode(text.nfc().collect::<String>()).to_folded_case();
            let normalized: String = folded.nfc().collect();
            normalized.chars().for_each(|c| self.push(c));
        }
    }

    /// Text that is already canonical (digits, `true`), written as it is but still escaped.
    pub fn canonical(&mut self, text: &str) {
        if text.is_ascii() && self.plain(text) {
            self.buf.push_str(text);
        } else {
            text.chars().for_each(|c| self.push(c));
        }
    }

    /// True when ASCII `text` is written as it is (bar its case): nothing in it is escaped, and
    /// it holds no control character. Most values are, and are copied whole. A part whose case
    /// is folded is judged as it will be written, lowercased: `A` becomes the `a` a template's
    /// literal text may hold, and must be escaped like it.
    fn plain(&self, text: &str) -> bool {
        let refused = self.escaped | CONTROLS;
        match self.fold_case {
            true => !text
                .bytes()
                .any(|b| refused & bit(b.to_ascii_lowercase()) != 0),
            false => !text.bytes().any(|b| refused & bit(b) != 0),
        }
    }

    /// True when `c` is written after an escape.
    fn escaped(&self, c: char) -> bool {
        match u8::try_from(c) {
            Ok(b) if b.is_ascii() => self.escaped & bit(b) != 0,
            _ => self.specials.contains(c),
        }
    }

    fn push(&mut self, c: char) {
        if c.is_control() {
            self.invalid = true;
        }
        if self.escaped(c) {
            self.buf.push(ESCAPE);
        }
        self.buf.push(c);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
        (**self).write_key_part(out)
    }
}

macro_rules! text_parts {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
                out.text(self)
            }
        }
    )*};
}
text_parts!(
    str,
    String,
    Box<str>,
    std::sync::Arc<str>,
    std::borrow::Cow<'_, str>
);

macro_rules! canonical_parts {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
                out.canonical(&self.to_string())
            }
        }
    )*};
}
canonical_parts!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, bool);

impl KeyPart for char {
    fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
        // Not trimmed: ' ' and '\u{3000}' are two values, and a control character ('\t')
        // must reach the check that refuses it rather than vanish.
        let mut buf = [0u8; 4];
        out.untrimmed(self.encode_utf8(&mut buf))
    }
}

impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
        // Hyphenated lowercase is the canonical form, whatever form the model sent.
        out.canonical(&self.hyphenated().to_string())
    }
}

/// The ASCII control characters, one bit each (as [`char::is_control`] has them below 128).
const CONTROLS: u128 = ((1 << 32) - 1) | (1 << 127);

/// `b`'s bit in a set of ASCII characters; none for a byte of 128 or more.
fn bit(b: u8) -> u128 {
    1u128.checked_shl(u32::from(b)).unwrap_or(0)
}

/// What every value escapes, whatever its template: the escape itself, the marks of hashed keys
/// and steps, and the start of a placeholder.
const MARKS: [char; 4] = [ESCAPE, HASH_MARK, STEP_MARK, '<'];

/// The ASCII characters a value's text escapes: the marks, and those of `specials`, which
/// also escapes characters beyond ASCII (see [`KeyPartWriter::escaped`]).
fn escaped_ascii(specials: &str) -> u128 {
    let marks = MARKS.map(|c| bit(c as u8));
    let specials = specials.bytes().filter(u8::is_ascii).map(bit);
    marks.into_iter().chain(specials).fold(0, |set, b| set | b)
}

/// Builds one key from a template's literal pieces and parts. Used by generated code only.
#[doc(hidden)]
pub struct KeyBuilder {
    buf: String,
    prefix_len: usize,
    specials: &'static str,
    escaped: u128,
    hash: bool,
    /// The first part that held a control character, and whether it came from the context.
    invalid: Option<(&'static str, bool)>,
}

impl KeyBuilder {
    /// `prefix` is the template's literal text before its first placeholder (the namespace);
    /// `specials` are the characters of the literal text after it, which values escape.
    pub fn new(prefix: &'static str, specials: &'static str) -> Self {
        Self::start(prefix, specials, false)
    }

    /// As [`new`](Self::new), for `hash = true`: the key keeps only a hash of its values.
    pub fn hashed(prefix: &'static str, specials: &'static str) -> Self {
        Self::start(prefix, specials, true)
    }

    fn start(prefix: &'static str, specials: &'static str, hash: bool) -> Self {
        let mut buf = String::with_capacity(64);
        buf.push_str(prefix);
        KeyBuilder {
            buf,
            prefix_len: prefix.len(),
            specials,
            escaped: escaped_ascii(specials),
            hash,
            invalid: None,
        }
    }

    /// Literal text of the template, between parts.
    pub fn literal(&mut self, text: &'static str) {
        self.buf.push_str(text);
    }

    /// The model-given value of parameter `field`, its case kept.
    pub fn part<T: KeyPart + ?Sized>(&mut self, value: &T, field: &'static str) {
        self.write(value, false, field, false)
    }

    /// The model-given value of a `#[arg(key = "case_insensitive")]` parameter: case-folded.
    pub fn part_case_insensitive<T: KeyPart + ?Sized>(&mut self, value: &T, field: &'static str) {
        self.write(value, true, field, false)
    }

    /// The value of context field `field` (`ctx.run_id`), set by the caller.
    pub fn ctx_part<T: KeyPart + ?Sized>(&mut self, value: &T, field: &'static str) {
        self.write(value, false, field, true)
    }

    fn write<T: KeyPart + ?Sized>(
        &mut self,
        value: &T,
        fold_case: bool,
        field: &'static str,
        from_ctx: bool,
    ) {
        let mut writer = KeyPartWriter {
            buf: &mut self.buf,
            specials: self.specials,
            escaped: self.escaped,
            fold_case,
            invalid: false,
        };
        value.write_key_part(&mut writer);
        if writer.invalid && self.invalid.is_none() {
            self.invalid = Some((field, from_ctx));
        }
    }

    /// The key; a part that held a control character is refused here, before any store sees it.
    pub fn finish(mut self) -> Result<IdempotencyKey, ToolError> {
        if let Some((field, from_ctx)) = self.invalid {
            return Err(texts::control_character(field, from_ctx));
        }
        if self.hash || self.buf.len() > MAX_KEY_BYTES {
            let digest = Sha256::digest(&self.buf.as_bytes()[self.prefix_len..]);
            self.buf.truncate(self.prefix_len);
            self.buf.push(HASH_MARK);
            self.buf.push_str(&hex::encode(digest));
        }
        Ok(IdempotencyKey {
            text: self.buf,
            prefix_len: self.prefix_len,
        })
    }
}

/// The placeholders of `template` (as written in `idempotent(key = ..)`), their white space
/// trimmed as the macro trims it: parameters' names, and `ctx.` fields.
pub(crate) fn placeholders(template: &str) -> impl Iterator<Item = &str> {
    template
        .split('<')
        .skip(1)
        .filter_map(|rest| rest.split_once('>'))
        .map(|(name, _)| name.trim())
}

/// True when `template` holds the `<ctx.step>` placeholder.
pub(crate) fn follows_step(template: &str) -> bool {
    placeholders(template).any(|name| name == "ctx.step")
}

/// True when the key templates `a` and `b`, as written in `idempotent(key = ..)`, can build the
/// same key from some values, and are not one template (the same text, placeholders' names
/// aside), which two tools share on purpose to exclude each other. Each template alone is
/// injective; two templates whose namespaces are one, or one a prefix of the other, need not
/// be: `order:<id>` builds `order:o-1:line:2` for the id `o-1:line:2`, as `order:<id>:line:<line>`
/// does for `o-1` and `2`.
///
/// Decided exactly over the keys' text (each template's literal pieces, and values written as
/// [`KeyBuilder`] writes them: any text, each character the template escapes after a `\`), by
/// walking the two templates side by side. It allows more values than some placeholders take
/// (an integer's digits), so it may call two templates overlapping when their values never
/// would; never the other way round. A hashed key (`hash = true`, or a key over 255 bytes) is
/// its namespace, `#` and a hash of the rest, which two templates share only when the text they
/// hash is one.
pub(crate) fn templates_overlap(a: &str, b: &str) -> bool {
    let (a, b) = (Shape::of(a), Shape::of(b));
    if a.items == b.items {
        return false;
    }
    // The characters that can tell the two apart, and one that stands for all others.
    let mut alphabet: Vec<char> = [&a, &b]
        .iter()
        .flat_map(|shape| {
            shape
                .escaped
                .iter()
                .copied()
                .chain(shape.items.iter().filter_map(|item| match item {
                    Item::Char(c) => Some(*c),
                    Item::Value => None,
                }))
        })
        .collect();
    let other = ('a'..=char::MAX)
        .find(|c| !alphabet.contains(c) && !c.is_control())
        .expect("two templates use fewer characters than there are");
    alphabet.push(other);
    alphabet.sort_unstable();
    alphabet.dedup();

    let start = (a.closure(vec![(0, false)]), b.closure(vec![(0, false)]));
    let mut seen: HashSet<(At, At)> = HashSet::new();
    let mut queue: Vec<(At, At)> = Vec::new();
    for pair in pairs(&start.0, &start.1) {
        if seen.insert(pair) {
            queue.push(pair);
        }
    }
    while let Some((at_a, at_b)) = queue.pop() {
        if a.accepts(at_a) && b.accepts(at_b) {
            return true;
        }
        for &c in &alphabet {
            let next_a = a.closure(a.step(at_a, c));
            if next_a.is_empty() {
                continue;
            }
            let next_b = b.closure(b.step(at_b, c));
            for pair in pairs(&next_a, &next_b) {
                if seen.insert(pair) {
                    queue.push(pair);
                }
            }
        }
    }
    false
}

/// A place in a template's keys: the piece reached, and whether a value's `\` was just read.
type At = (usize, bool);

fn pairs(a: &[At], b: &[At]) -> Vec<(At, At)> {
    a.iter()
        .flat_map(|&x| b.iter().map(move |&y| (x, y)))
        .collect()
}

#[derive(PartialEq, Eq)]
enum Item {
    Char(char),
    Value,
}

/// A key template as the text of its keys: literal characters and values.
struct Shape {
    items: Vec<Item>,
    /// What a value escapes: the marks, and the literal text after the namespace.
    escaped: Vec<char>,
}

impl Shape {
    fn of(template: &str) -> Shape {
        let (mut items, mut in_value) = (Vec::new(), false);
        for c in template.chars() {
            match (in_value, c) {
                (false, '<') => {
                    in_value = true;
                    items.push(Item::Value);
                }
                (true, '>') => in_value = false,
                (true, _) => {}
                (false, c) => items.push(Item::Char(c)),
            }
        }
        let first_value = items
            .iter()
            .position(|i| *i == Item::Value)
            .unwrap_or(items.len());
        let mut escaped: Vec<char> = MARKS
            .into_iter()
            .chain(items[first_value..].iter().filter_map(|item| match item {
                Item::Char(c) => Some(*c),
                Item::Value => None,
            }))
            .collect();
        escaped.sort_unstable();
        escaped.dedup();
        Shape { items, escaped }
    }

    /// The places reached from `at` by reading `c`.
    fn step(&self, (i, after_escape): At, c: char) -> Vec<At> {
        match self.items.get(i) {
            Some(Item::Value) if after_escape => {
                if self.escaped.contains(&c) {
                    vec![(i, false)]
                } else {
                    vec![]
                }
            }
            Some(Item::Value) if c == ESCAPE => vec![(i, true)],
            Some(Item::Value) if !self.escaped.contains(&c) && !c.is_control() => vec![(i, false)],
            Some(Item::Char(l)) if *l == c && !after_escape => vec![(i + 1, false)],
            _ => vec![],
        }
    }

    /// `at` and the places a value may end at.
    fn closure(&self, mut at: Vec<At>) -> Vec<At> {
        let mut k = 0;
        while k < at.len() {
            let (i, after_escape) = at[k];
            if !after_escape
                && self.items.get(i) == Some(&Item::Value)
                && !at.contains(&(i + 1, false))
            {
                at.push((i + 1, false));
            }
            k += 1;
        }
        at
    }

    fn accepts(&self, (i, after_escape): At) -> bool {
        i == self.items.len() && !after_escape
    }
}

#[cfg(test)]
mod tests;
