//! Collects every error, so one compile reports them all.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

pub struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Vec::new()),
        }
    }

    pub fn error_spanned_by(&self, tokens: impl ToTokens, message: impl Display) {
        self.errors
            .borrow_mut()
            .push(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    pub fn error_at(&self, span: proc_macro2::Span, message: impl Display) {
        self.errors
            .borrow_mut()
            .push(syn::Error::new(span, message));
    }

    pub fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    pub fn finish(self) -> Result<(), syn::Error> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut first) = errors.next() else {
            return Ok(());
        };
        for err in errors {
            first.combine(err);
        }
        Err(first)
    }
}

/// "did you mean `x`?" when one of `candidates` is close to `name`.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}
