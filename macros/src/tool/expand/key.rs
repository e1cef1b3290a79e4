//! `fn __key`: the tool's idempotency key, built from its arguments as the template spells it.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote};

use super::Expansion;
use crate::tool::key::{Piece, Template};
use crate::tool::model::{Keyed, Param};

/// `fn __key(ctx, &customer, &period) -> Result<IdempotencyKey, ToolError>`. Each field goes in
/// as `KeyBuilder::part::<Type>(..)`: the type written in turbofish keeps the user's span, so a
/// type that is no `KeyPart` is reported once, on the parameter's type.
pub fn key_fn(e: &Expansion, keyed: &Keyed, template: &Template) -> TokenStream {
    let (tk, tool) = (&e.tk, e.tool);
    let prefix = template.prefix();
    let specials = template.specials();
    let builder = if keyed.hash {
        quote!(hashed)
    } else {
        quote!(new)
    };
    let params: Vec<&Param> = template.params().filter_map(|n| tool.param(n)).collect();
    let idents: Vec<&Ident> = params.iter().map(|p| &p.ident).collect();
    let types: Vec<&syn::Type> = params.iter().map(|p| &p.ty).collect();
    let steps = template
        .pieces
        .iter()
        .skip(1)
        .filter_map(|piece| match piece {
            Piece::Literal(text) => Some(quote!(__k.literal(#text);)),
            Piece::Param(name) => {
                // An unknown placeholder was reported by `check`.
                let param = tool.param(name)?;
                let (ident, ty) = (&param.ident, &param.ty);
                // As the arguments spell it: a key error names the field the model sent.
                let field = param.json_name();
                let part = if param.case_insensitive.is_some() {
                    quote!(part_case_insensitive)
                } else {
                    quote!(part)
                };
                Some(quote!(#tk::KeyBuilder::#part::<#ty>(&mut __k, #ident, #field);))
            }
            Piece::Ctx(field) => {
                let getter = format_ident!("ctx_{}", field);
                Some(quote!(__k.ctx_part(&#tk::#getter(__ctx)?, #field);))
            }
        });
    // A template that starts with a placeholder was rejected by `check`.
    quote! {
        #[allow(clippy::ptr_arg)]
        fn __key(
            __ctx: &#tk::ToolContext,
            #(#idents: &#types),*
        ) -> ::core::result::Result<#tk::IdempotencyKey, #tk::ToolError> {
            let mut __k = #tk::KeyBuilder::#builder(#prefix, #specials);
            #(#steps)*
            __k.finish()
        }
    }
}
