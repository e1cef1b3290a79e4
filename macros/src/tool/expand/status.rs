//! `fn status_companion`: the status tool that answers, by a keyed tool's key, what became of a
//! call, taking the call's own arguments.

use proc_macro2::TokenStream;
use quote::quote;

use super::{only_defaults, Expansion};
use crate::tool::key::Template;
use crate::tool::model::Param;

/// The companion takes its target's whole argument set, so "call the status tool with the same
/// arguments" works as written: the key fields as the target has them, every other field
/// accepted whatever it holds and said so (the toolbox checks a whole call's arguments against
/// the record's fingerprint). Plain where the target's fields allow it, derived otherwise.
pub fn companion(e: &Expansion, template: &Template, status: &str) -> TokenStream {
    let key_params: Vec<&Param> = template.params().filter_map(|n| e.tool.param(n)).collect();
    plain(e, &key_params, status).unwrap_or_else(|| derived(e, &key_params, status))
}

/// The status companion of a tool whose fields carry no serde or schemars attribute (but
/// `#[serde(default)]` on a field outside the key, which the companion ignores anyway) and whose
/// docs are plain text: its schema is built from the target's, and its arguments are read field
/// by field, so no arguments struct of its own is derived and compiled for every keyed tool.
/// `None` when a field's attributes or docs need the derived struct (`derived` below).
fn plain(e: &Expansion, key_params: &[&Param], status: &str) -> Option<TokenStream> {
    let (tool, tk, name) = (e.tool, &e.tk, &e.tool.name);
    let is_key = |p: &Param| key_params.iter().any(|k| k.ident == p.ident);
    let plain = |p: &Param| match is_key(p) {
        true => p.forwarded.is_empty(),
        false => only_defaults(p),
    };
    if !tool.model_params().all(plain) {
        return None;
    }
    let note = ignored_note(status, name);
    let mut ignored = Vec::new();
    for p in tool.model_params().filter(|p| !is_key(p)) {
        // The docs as the derived struct's field has them: the field's, an empty line, the note.
        let mut lines = doc_lines(&p.docs)?;
        lines.push(String::new());
        lines.push(note.clone());
        let (title, description) = title_and_description(&lines);
        let (field, ty) = (p.field_name(), &p.ty);
        ignored.push(quote! {
            #tk::IgnoredField {
                name: #field,
                nullable: #tk::nullable_schema::<#ty>,
                title: #title,
                description: #description,
            }
        });
    }
    let fields = tool.model_params().map(Param::field_name);
    let keys = key_params.iter().map(|p| {
        let (field, ty) = (p.field_name(), &p.ty);
        quote!(&__s.key::<#ty>(#field)?)
    });
    Some(quote! {
        fn status_companion(&self) -> ::core::option::Option<#tk::StatusCompanion> {
            ::core::option::Option::Some(#tk::status_companion(
                #name,
                #status,
                #tk::status_schema(#tk::schema_for::<__Args>(), #tk::prime_generator::<__Args>, &[#(#ignored),*]),
                #tk::std::boxed::Box::new(|__args, __ctx| {
                    let __s = #tk::StatusArgs::new(#status, &__args, &[#(#fields),*], #tk::schema_for::<__Args>)?;
                    __key(__ctx, #(#keys),*)
                }),
            ))
        }
    })
}

/// The companion through a derived `__StatusArgs`, whose fields carry their attributes and docs
/// as the target's have them.
fn derived(e: &Expansion, key_params: &[&Param], status: &str) -> TokenStream {
    let (tk, name) = (&e.tk, &e.tool.name);
    let (serde_path, schemars_path) = (&e.serde_path, &e.schemars_path);
    // A doc line as `///` writes it: with its leading space.
    let ignored_doc = format!(" {}", ignored_note(status, name));
    let fields = e
        .tool
        .model_params()
        .map(|p| derived_field(e, p, key_params, &ignored_doc));
    let args = key_params.iter().map(|p| {
        let ident = &p.ident;
        quote!(&__s.#ident)
    });
    // Open beside a flattened field, as the target's arguments are, and checked the same way
    // against its own schema.
    let (deny, schema, parse, names) = if e.flattened {
        (
            quote!(),
            quote!(#tk::status_schema_for_flattened::<__StatusArgs>),
            quote!(#tk::parse_flattened_args(#status, &__args, &__STATUS_FLATTENED)),
            quote! {
                static __STATUS_FLATTENED: #tk::FlattenedArgs = #tk::FlattenedArgs::new(
                    #tk::status_schema_for_flattened::<__StatusArgs>,
                    __extra_names,
                );
            },
        )
    } else {
        (
            quote!(, deny_unknown_fields),
            quote!(#tk::schema_for::<__StatusArgs>),
            quote!(#tk::parse_args(#status, &__args, #tk::schema_for::<__StatusArgs>)),
            quote!(),
        )
    };
    quote! {
        fn status_companion(&self) -> ::core::option::Option<#tk::StatusCompanion> {
            #[derive(#tk::serde::Deserialize, #tk::schemars::JsonSchema)]
            #[serde(crate = #serde_path #deny)]
            #[schemars(crate = #schemars_path)]
            struct __StatusArgs { #(#fields,)* }
            #names
            ::core::option::Option::Some(#tk::status_companion(
                #name,
                #status,
                #schema(),
                #tk::std::boxed::Box::new(|__args, __ctx| {
                    let __s: __StatusArgs = #parse?;
                    __key(__ctx, #(#args),*)
                }),
            ))
        }
    }
}

/// One field of `__StatusArgs`: a key field as the target has it, any other read and ignored.
fn derived_field(
    e: &Expansion,
    p: &Param,
    key_params: &[&Param],
    ignored_doc: &str,
) -> TokenStream {
    let tk = &e.tk;
    let (ident, ty, docs, forwarded) = (&p.ident, &p.ty, &p.docs, &p.forwarded);
    if key_params.iter().any(|k| k.ident == p.ident) {
        return quote!(#(#docs)* #(#forwarded)* #ident: #ty);
    }
    if p.serde_flatten() {
        // Its fields sit beside the others in the call's arguments: taken as the target takes
        // them, or none at all, never refused as unknown.
        return quote! {
            #(#docs)*
            #[serde(flatten)]
            #[allow(dead_code)]
            #ident: ::core::option::Option<#ty>
        };
    }
    // Read by the names the target reads it by, and nothing else of its serde attributes: its
    // own `default` would be a second one.
    let json = p.json_name();
    let rename = (json != p.field_name()).then(|| quote!(#[serde(rename = #json)]));
    let aliases = p.aliases();
    let schema_type = format!("::core::option::Option<{}>", quote!(#ty));
    quote! {
        #(#docs)*
        #[doc = ""]
        #[doc = #ignored_doc]
        #rename
        #(#[serde(alias = #aliases)])*
        #[serde(default)]
        #[schemars(with = #schema_type)]
        #[allow(dead_code)]
        #ident: ::core::option::Option<#tk::Ignored>
    }
}

/// What the companion's schema says of each field outside the key.
fn ignored_note(status: &str, name: &str) -> String {
    format!("Not part of `{status}`'s key: accepted so that the arguments of a `{name}` call can be passed as they are; given all of them, `{status}` checks that the key's record is that call's.")
}

/// Doc comment lines as schemars' derive reads them (one leading space dropped), or `None` when
/// one is not a string literal.
fn doc_lines(docs: &[syn::Attribute]) -> Option<Vec<String>> {
    docs.iter()
        .filter(|a| a.path().is_ident("doc"))
        .map(|a| match &a.meta.require_name_value().ok()?.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) => {
                let text = text.value();
                Some(text.strip_prefix(' ').map(str::to_string).unwrap_or(text))
            }
            _ => None,
        })
        .collect()
}

/// The title and description schemars makes of doc lines: joined by new lines and trimmed; a
/// first line that starts with `#` is the title.
fn title_and_description(lines: &[String]) -> (String, String) {
    let doc = lines.join("\n");
    let doc = doc.trim_matches(|c: char| c.is_ascii_whitespace());
    match doc.strip_prefix('#') {
        Some(_) => {
            let end = doc.find('\n').unwrap_or(doc.len());
            let title = doc[..end].trim_start_matches('#');
            let trim = |s: &str| {
                s.trim_matches(|c: char| c.is_ascii_whitespace())
                    .to_string()
            };
            (trim(title), trim(&doc[end..]))
        }
        None => (String::new(), doc.to_string()),
    }
}
