//! The fingerprint: what of a call's arguments a retry under the same key must repeat. Its
//! schema, a static beside the key fn, and its value, taken in `prepare`.

use proc_macro2::{Ident, TokenStream};
use quote::quote;

use super::{only_defaults, Expansion};
use crate::tool::key::Template;
use crate::tool::model::Param;

/// `static __FINGERPRINT_SCHEMA`. The fingerprint's own schema says which arrays are sets, whose
/// order is no part of the action; it is derived once per process.
pub fn schema(e: &Expansion, template: &Template) -> TokenStream {
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
    let fields = fields(e, template);
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
    let mut sorted: Vec<(String, &Ident)> = fields(e, template)
        .iter()
        .map(|p| (p.field_name(), &p.ident))
        .collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let adds = sorted
        .iter()
        .map(|(name, ident)| quote!(__f.field(#name, &__a.#ident);));
    quote! {
        #tk::fingerprint({
            let mut __f = #tk::FingerprintFields::new(&__FINGERPRINT_SCHEMA);
            #(#adds)*
            __f
        })
    }
}

/// The fields a fingerprint covers. Key fields are left out: the normalized key already names
/// them, and " ACME " and "acme" are one customer, not a conflict. Ignored fields are what a
/// retry may change.
fn fields<'a>(e: &Expansion<'a>, template: &Template) -> Vec<&'a Param> {
    let key_fields: Vec<&str> = template.params().collect();
    e.tool
        .model_params()
        .filter(|p| p.ignore.is_none() && !key_fields.iter().any(|k| p.field_name() == *k))
        .collect()
}
