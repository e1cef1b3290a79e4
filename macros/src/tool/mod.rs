//! `#[tool]`: parse → validate → expand.

mod attr;
mod check;
mod ctxt;
mod expand;
mod key;
mod model;

use proc_macro2::TokenStream;
use quote::quote;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let err = syn::Error::new_spanned(&item, "`#[tool]` goes on an `async fn`");
            let err = err.to_compile_error();
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
