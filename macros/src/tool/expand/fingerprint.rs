//! The fingerprint: what of a call's arguments a retry under the same key must repeat. Its
//! schema, a static beside the key fn, and its value, taken in `prepare`.

use proc_macro2::{Ident, TokenStream};
use quote::quote;

use super::{args, only_defaults, Expansion};
use crate::tool::key::Template;
use crate::tool::model::Param;

/// `static __FINGERPRINT_SCHEMA`. The fingerprint's own schema says which arrays are sets, whose
/// order is no part of the action; it is derived once per process.
pub fn schema(e: &Expansion, template: &Template) -> TokenStream {
    schema_of(e, &key_fields(template))
}

/// [`schema`] of a fingerprint without the fields in `key_fields`.
fn schema_of(e: &Expansion, key_fields: &[&str]) -> TokenStream {
    let (tk, name, schemars_path) = (&e.tk, &e.tool.name, &e.schemars_path);
    // Where no field carries a serde or schemars attribute (but `#[serde(default)]`, which
    // changes no field's name or type), each field's schema in the arguments' own schema is the
    // one it would have here, under the same name: that schema serves, and no struct is derived
    // for it.
    if e.tool.model_params().all(only_defaults) {
        return quote! {
            static __FINGERPRINT_SCHEMA: #tk::FingerprintSchema =
                #tk::FingerprintSchema::new(#name, #tk::schema_for::<__Args>);
        };
    }
    let fields = fields(e, key_fields);
    let idents = fields.iter().map(|p| &p.ident);
    let types = fields.iter().map(|p| &p.ty);
    // A `#[schemars(with = ..)]` a parameter needs for its schema, it needs here too.
    let schemars = fields.iter().map(|p| {
        let attrs = p.forwarded.iter().filter(|a| a.path().is_ident("schemars"));
        quote!(#(#attrs)*)
    });
    quote! {
        #[derive(#tk::schemars::JsonSchema)]
        #[schemars(crate = #schemars_path)]
        #[allow(dead_code)]
        struct __Fingerprint {
            #(#schemars #idents: #types,)*
        }
        static __FINGERPRINT_SCHEMA: #tk::FingerprintSchema =
            #tk::FingerprintSchema::new(#name, #tk::schema_for::<__Fingerprint>);
    }
}

/// `fingerprint({ .. })` of the parsed arguments `__a`. The fields go into the hash in the byte
/// order of their names, the canonical object's order, each through a function generic over its
/// type alone.
pub fn value(e: &Expansion, template: &Template) -> TokenStream {
    let tk = &e.tk;
    let adds = sorted(e, &key_fields(template))
        .into_iter()
        .map(|(name, ident)| quote!(__f.field(#name, &__a.#ident);));
    quote! {
        #tk::fingerprint({
            let mut __f = #tk::FingerprintFields::new(&__FINGERPRINT_SCHEMA);
            #(#adds)*
            __f
        })
    }
}

/// A tool without a key: `static __FINGERPRINT_SCHEMA` and `fn __arguments_fingerprint`, which
/// reads arguments into the tool's types (defaults applied) and fingerprints them as a keyed
/// call's are. Its retry limit counts a call by it, so a default spelled out or a field given in
/// another order makes no new call; it runs only when a count is read or written, never on a
/// call's way. A type that is not `Serialize` gives the fingerprint up (`None`): such a tool's
/// calls are counted by their JSON, and its arguments need nothing they did not before.
pub fn of_arguments(e: &Expansion) -> TokenStream {
    let tk = &e.tk;
    let schema = schema_of(e, &[]);
    let parse_args = args::parse(e, quote!(__args));
    let adds = sorted(e, &[]).into_iter().map(|(name, ident)| {
        quote!(__all &= (&#tk::FingerprintArg(&__a.#ident)).add_to(&mut __f, #name);)
    });
    quote! {
        #schema
        // A tool without arguments adds nothing.
        #[allow(unused_mut, unused_variables)]
        fn __arguments_fingerprint(
            __args: &#tk::serde_json::Value,
        ) -> ::core::option::Option<#tk::Fingerprint> {
            #[allow(unused_imports)]
            use #tk::{AddOpaque as _, AddSerializable as _};
            let __a: __Args = #parse_args.ok()?;
            let mut __f = #tk::FingerprintFields::new(&__FINGERPRINT_SCHEMA);
            let mut __all = true;
            #(#adds)*
            if __all { __f.finish().ok() } else { ::core::option::Option::None }
        }
    }
}

/// A fingerprint's fields (serde name, parameter), in the byte order of their names, the
/// canonical object's order.
fn sorted<'a>(e: &Expansion<'a>, key_fields: &[&str]) -> Vec<(String, &'a Ident)> {
    let mut sorted: Vec<(String, &Ident)> = fields(e, key_fields)
        .iter()
        .map(|p| (p.field_name(), &p.ident))
        .collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    sorted
}

fn key_fields(template: &Template) -> Vec<&str> {
    template.params().collect()
}

/// The fields a fingerprint covers. Key fields are left out: the normalized key already names
/// them, and " ACME " and "acme" are one customer, not a conflict. Ignored fields are what a
/// retry may change.
fn fields<'a>(e: &Expansion<'a>, key_fields: &[&str]) -> Vec<&'a Param> {
    e.tool
        .model_params()
        .filter(|p| p.ignore.is_none() && !key_fields.iter().any(|k| p.field_name() == *k))
        .collect()
}
