//! Idempotency keys: what can be a part of one, how parts are normalized, and the key type.

use std::fmt;

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// Keys longer than this many bytes keep their namespace and are completed by a SHA-256.
pub const MAX_KEY_BYTES: usize = 255;

/// The escape character inside key parts. It is escaped itself, and so is `#` (which marks a
/// hashed key), so no value can forge another part or a hashed form.
const ESCAPE: char = '\\';
const HASH_MARK: char = '#';

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

    /// The key of one step of a multi-step tool: the step's name in place of the namespace,
    /// the parent's values after it (`invoice-email:acme:2026-10`).
    pub(crate) fn for_step(&self, step: &str) -> IdempotencyKey {
        let text = format!("{step}:{}", self.rest());
        IdempotencyKey {
            prefix_len: step.len() + 1,
            text,
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
/// always build the same key. Strings (trimmed, NFC, lowercased unless the parameter says
/// `#[arg(key = "exact")]`), integers, `bool`, `char` and UUIDs have one; unit enums get one from
/// `#[derive(toolkey::KeyPart)]`, which uses their serde names.
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
    exact: bool,
}

impl KeyPartWriter<'_> {
    /// Text that is normalized: trimmed, NFC, lowercased (unless the parameter is exact).
    pub fn text(&mut self, text: &str) {
        let text = text.trim();
        if text.is_ascii() {
            for c in text.chars() {
                let c = if self.exact {
                    c
                } else {
                    c.to_ascii_lowercase()
                };
                self.push(c);
            }
        } else if self.exact {
            let normalized: String = text.nfc().collect();
            normalized.chars().for_each(|c| self.push(c));
        } else {
            let lowered = text.nfc().collect::<String>().to_lowercase();
            let normalized: String = lowered.nfc().collect();
            normalized.chars().for_each(|c| self.push(c));
        }
    }

    /// Text that is already canonical (digits, `true`), written as it is but still escaped.
    pub fn canonical(&mut self, text: &str) {
        text.chars().for_each(|c| self.push(c));
    }

    fn push(&mut self, c: char) {
        if c == ESCAPE || c == HASH_MARK || self.specials.contains(c) {
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
        let mut buf = [0u8; 4];
        out.text(self.encode_utf8(&mut buf))
    }
}

impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: &mut KeyPartWriter<'_>) {
        // Hyphenated lowercase is the canonical form, whatever form the model sent.
        out.canonical(&self.hyphenated().to_string())
    }
}

/// Builds one key from a template's literal pieces and parts. Used by generated code only.
#[doc(hidden)]
pub struct KeyBuilder {
    buf: String,
    prefix_len: usize,
    specials: &'static str,
    hash: bool,
}

impl KeyBuilder {
    /// `prefix` is the template's literal text before its first placeholder; `specials` are the
    /// characters of the template's literal text that values must not contain unescaped.
    pub fn new(prefix: &'static str, specials: &'static str, hash: bool) -> Self {
        let mut buf = String::with_capacity(64);
        buf.push_str(prefix);
        KeyBuilder {
            buf,
            prefix_len: prefix.len(),
            specials,
            hash,
        }
    }

    pub fn literal(&mut self, text: &'static str) {
        self.buf.push_str(text);
    }

    pub fn part<T: KeyPart + ?Sized>(&mut self, value: &T, exact: bool) {
        let mut writer = KeyPartWriter {
            buf: &mut self.buf,
            specials: self.specials,
            exact,
        };
        value.write_key_part(&mut writer);
    }

    pub fn finish(mut self) -> IdempotencyKey {
        if self.hash || self.buf.len() > MAX_KEY_BYTES {
            let digest = Sha256::digest(&self.buf.as_bytes()[self.prefix_len..]);
            self.buf.truncate(self.prefix_len);
            self.buf.push(HASH_MARK);
            self.buf.push_str(&hex::encode(digest));
        }
        IdempotencyKey {
            text: self.buf,
            prefix_len: self.prefix_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(customer: &str, period: &str) -> IdempotencyKey {
        let mut b = KeyBuilder::new("invoice:", ":", false);
        b.part(customer, false);
        b.literal(":");
        b.part(period, false);
        b.finish()
    }

    #[test]
    fn normalizes_case_space_and_unicode_form() {
        assert_eq!(key("  ACME ", "2026-10"), key("acme", "2026-10"));
        assert_eq!(key("acme", "2026-10").as_str(), "invoice:acme:2026-10");
        // "é" precomposed and decomposed are one customer.
        assert_eq!(key("caf\u{e9}", "x"), key("cafe\u{301}", "x"));
    }

    #[test]
    fn a_value_cannot_forge_another_part() {
        assert_ne!(key("acme:2026", "10"), key("acme", "2026:10"));
        assert_ne!(key("a\\", ":b"), key("a", "\\:b"));
        assert_eq!(key("acme:2026", "10").as_str(), "invoice:acme\\:2026:10");
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
            let mut b = KeyBuilder::new("invoice:", ":", true);
            b.part("acme", false);
            b.finish()
        };
        let forged = key(hashed.rest(), "");
        assert_ne!(hashed.as_str(), forged.as_str().trim_end_matches(':'));
    }

    #[test]
    fn steps_take_the_parents_values() {
        assert_eq!(
            key("acme", "2026-10").for_step("invoice-email").as_str(),
            "invoice-email:acme:2026-10"
        );
    }
}
