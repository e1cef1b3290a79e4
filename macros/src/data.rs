//! `#[data]`: the derives a tool's argument and result types need, through toolkey's own serde
//! and schemars, so a user's crate needs neither as a dependency and no version can mismatch.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut krate: syn::Path = syn::parse_quote!(::toolkey);
    if !args.is_empty() {
        let parser = syn::meta::parser(|meta| {
            if meta.path.is_ident("crate") {
                let lit: syn::LitStr = meta.value()?.parse()?;
                krate = lit.parse()?;
                Ok(())
            } else {
                Err(meta.error("unknown `data` key; expected `crate = \"...\"`"))
            }
        });
        if let Err(err) = syn::parse::Parser::parse2(parser, args) {
            let err = err.to_compile_error();
            return quote!(#err #item);
        }
    }
    let item: syn::DeriveInput = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(_) => {
            let err = syn::Error::new(
                item.span(),
                "`#[toolkey::data]` goes on a struct or an enum: a tool's argument or result type",
            )
            .to_compile_error();
            return quote!(#err #item);
        }
    };
    let tk = quote!(#krate::__private);
    let serde_path = format!("{}", quote!(#tk::serde)).replace(' ', "");
    let schemars_path = format!("{}", quote!(#tk::schemars)).replace(' ', "");
    quote! {
        #[derive(#tk::serde::Serialize, #tk::serde::Deserialize, #tk::schemars::JsonSchema)]
        #[serde(crate = #serde_path)]
        #[schemars(crate = #schemars_path)]
        #item
    }
}
