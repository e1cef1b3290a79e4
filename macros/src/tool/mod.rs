//! `#[tool]`: parse → validate → expand.

mod attr;
mod check;
mod ctxt;
mod expand;
mod key;
mod model;
#[cfg(test)]
mod tests;

use proc_macro2::TokenStream;
use quote::quote;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let err = not_a_fn(&item).to_compile_error();
            return quote!(#err #item);
        }
    };
    let cx = ctxt::Ctxt::new();
    let attr = attr::parse(&cx, args);
    let tool = model::Tool::from_fn(&cx, attr, func);
    check::check(&cx, &tool);
    match cx.finish() {
        Ok(()) => expand::expand(&tool),
        Err(err) => {
            let errors = err.to_compile_error();
            let fallback = expand::fallback(&tool);
            quote!(#errors #fallback)
        }
    }
}

/// `#[tool]` on something other than a fn: the error names what it is, at its keyword.
fn not_a_fn(item: &TokenStream) -> syn::Error {
    let (span, what) = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Struct(s)) => (s.struct_token.span, "a `struct`"),
        Ok(syn::Item::Enum(e)) => (e.enum_token.span, "an `enum`"),
        Ok(syn::Item::Impl(i)) => (
            i.impl_token.span,
            "an `impl` block; put it on each tool fn, outside the `impl`",
        ),
        Ok(syn::Item::Trait(t)) => (t.trait_token.span, "a `trait`"),
        Ok(syn::Item::Mod(m)) => (m.mod_token.span, "a `mod`"),
        Ok(syn::Item::Const(c)) => (c.const_token.span, "a `const`"),
        Ok(syn::Item::Static(s)) => (s.static_token.span, "a `static`"),
        _ => {
            return syn::Error::new_spanned(item, "`#[tool]` goes on an `async fn`");
        }
    };
    syn::Error::new(
        span,
        format!("`#[tool]` goes on an `async fn`, and this is {what}"),
    )
}
