//! The key template: literal text and `<placeholder>`s.

use syn::LitStr;

use super::ctxt::Ctxt;

pub const CTX_FIELDS: &[&str] = &["run_id", "step", "tenant", "event_id"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Literal(String),
    /// A parameter of the fn.
    Param(String),
    /// `ctx.<field>`.
    Ctx(String),
}

pub struct Template {
    pub lit: LitStr,
    pub pieces: Vec<Piece>,
}

impl Template {
    /// The literal text before the first placeholder: the key's namespace.
    pub fn prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Literal(text)) => text,
            _ => "",
        }
    }

    /// Characters of the literal text after the namespace, which values escape: with them, no
    /// value can forge the text between two parts, so two argument tuples never share a key.
    /// The namespace itself needs none: it is the same fixed text at the start of every key.
    pub fn specials(&self) -> String {
        let mut specials: Vec<char> = self
            .pieces
            .iter()
            .skip(1)
            .filter_map(|p| match p {
                Piece::Literal(text) => Some(text.chars()),
                _ => None,
            })
            .flatten()
            .collect();
        specials.sort_unstable();
        specials.dedup();
        specials.into_iter().collect()
    }

    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Param(name) => Some(name.as_str()),
            _ => None,
        })
    }

    pub fn uses_ctx(&self, field: &str) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Ctx(f) if f == field))
    }
}

/// Parses `"invoice:<customer>:<period>"`; reports malformed placeholders on the literal.
pub fn parse(cx: &Ctxt, lit: &LitStr) -> Template {
    let text = lit.value();
    let mut pieces = Vec::new();
    let mut rest = text.as_str();
    while !rest.is_empty() {
        match rest.find(['<', '>']) {
            Some(i) if rest.as_bytes()[i] == b'>' => {
                cx.error_spanned_by(lit, format!("unmatched `>` in key template \"{text}\"; placeholders are written `<name>`"));
                return Template {
                    lit: lit.clone(),
                    pieces,
                };
            }
            Some(i) => {
                if i > 0 {
                    pieces.push(Piece::Literal(rest[..i].to_string()));
                }
                let after = &rest[i + 1..];
                let Some(end) = after.find('>') else {
                    cx.error_spanned_by(lit, format!("unclosed `<` in key template \"{text}\"; placeholders are written `<name>`"));
                    return Template {
                        lit: lit.clone(),
                        pieces,
                    };
                };
                let name = after[..end].trim();
                if name.is_empty() {
                    cx.error_spanned_by(lit, "empty placeholder `<>` in key template; name a parameter, as in `<customer>`");
                } else if let Some(field) = name.strip_prefix("ctx.") {
                    pieces.push(Piece::Ctx(field.to_string()));
                } else {
                    pieces.push(Piece::Param(name.to_string()));
                }
                rest = &after[end + 1..];
            }
            None => {
                pieces.push(Piece::Literal(rest.to_string()));
                rest = "";
            }
        }
    }
    Template {
        lit: lit.clone(),
        pieces,
    }
}
