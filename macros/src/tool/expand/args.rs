//! `struct __Args`: the arguments as the model sends them, derived for serde and schemars; the
//! schema the definition gives for them, and how `prepare` reads them.

use proc_macro2::TokenStream;
use quote::quote;

use super::Expansion;

/// `struct __Args { .. }`, and beside a flattened parameter the names it may be sent.
///
/// serde cannot refuse unknown fields beside a flattened map or enum: it would refuse their keys
/// and tags too. Such arguments are derived open, and their names are checked against the schema
/// by the runtime (`__FLATTENED`), with every alias, the flattened structs' too.
pub fn args_struct(e: &Expansion) -> TokenStream {
    let (tk, serde_path, schemars_path) = (&e.tk, &e.serde_path, &e.schemars_path);
    let fields = e.tool.model_params().map(|p| {
        let (ident, ty, docs, forwarded) = (&p.ident, &p.ty, &p.docs, &p.forwarded);
        quote!(#(#docs)* #(#forwarded)* #ident: #ty)
    });
    let (deny, flattened_names) = if e.flattened {
        (quote!(), flattened_names(e))
    } else {
        (quote!(, deny_unknown_fields), quote!())
    };
    quote! {
        #[derive(#tk::serde::Deserialize, #tk::schemars::JsonSchema)]
        #[serde(crate = #serde_path #deny)]
        #[schemars(crate = #schemars_path)]
        #[allow(non_camel_case_types)]
        struct __Args { #(#fields,)* }
        #flattened_names
    }
}

/// `fn __extra_names` and `static __FLATTENED`: what the runtime checks open arguments against.
fn flattened_names(e: &Expansion) -> TokenStream {
    let tk = &e.tk;
    let aliases = e.tool.model_params().flat_map(|p| p.aliases());
    let flat_types = e
        .tool
        .model_params()
        .filter(|p| p.serde_flatten())
        .map(|p| &p.ty);
    quote! {
        fn __extra_names() -> #tk::std::vec::Vec<&'static str> {
            let mut __names: #tk::std::vec::Vec<&'static str> = #tk::std::vec![#(#aliases),*];
            #(__names.extend_from_slice(#tk::struct_fields::<#flat_types>());)*
            __names
        }
        static __FLATTENED: #tk::FlattenedArgs =
            #tk::FlattenedArgs::new(#tk::schema_for_flattened::<__Args>, __extra_names);
    }
}

/// The fn that gives the arguments' schema.
pub fn schema(e: &Expansion) -> TokenStream {
    let tk = &e.tk;
    if e.flattened {
        quote!(#tk::schema_for_flattened::<__Args>)
    } else {
        quote!(#tk::schema_for::<__Args>)
    }
}

/// `__Args` read from the JSON value `args`, or the tool error that says what is wrong with it.
pub fn parse(e: &Expansion, args: TokenStream) -> TokenStream {
    let (tk, name) = (&e.tk, &e.tool.name);
    if e.flattened {
        quote!(#tk::parse_flattened_args(#name, #args, &__FLATTENED))
    } else {
        quote!(#tk::parse_args(#name, #args, #tk::schema_for::<__Args>))
    }
}
