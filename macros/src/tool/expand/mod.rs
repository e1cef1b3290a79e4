//! The generated code. `quote!` only: every decision was made in `model` and `check`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

mod args;
mod fingerprint;
mod key;
mod prepare;
mod status;

use crate::tool::attr::RetryLimit;
use crate::tool::model::{Param, ParamKind, Story, Tool};

/// The tool being expanded, and the names every piece of its expansion uses.
struct Expansion<'a> {
    tool: &'a Tool,
    /// `<crate>::__private`: every runtime name goes through it, so `crate = ".."` reaches all.
    tk: TokenStream,
    /// The same paths as the strings serde's and schemars' `crate = ".."` attributes take.
    serde_path: String,
    schemars_path: String,
    /// A parameter is `#[serde(flatten)]`: the arguments are derived open (see `args`).
    flattened: bool,
    /// `<Output as IntoToolResult>`, spanned at the return type: both uses of the return type
    /// name it so, and a type that is no tool result gets one error, on the user's return type.
    as_result: TokenStream,
}

impl<'a> Expansion<'a> {
    fn new(tool: &'a Tool, output: &syn::Type) -> Self {
        let krate = &tool.krate;
        let tk = quote!(#krate::__private);
        Expansion {
            tool,
            serde_path: format!("{}", quote!(#tk::serde)).replace(' ', ""),
            schemars_path: format!("{}", quote!(#tk::schemars)).replace(' ', ""),
            flattened: tool.model_params().any(|p| p.serde_flatten()),
            as_result: quote_spanned!(output.span()=> <#output as #tk::IntoToolResult>),
            tk,
        }
    }
}

/// On error: the user's fn and the struct, so uses of either do not cascade into more errors.
/// A fn with a `self` receiver sits in an `impl`, where a struct cannot go: the fn alone then.
pub fn fallback(tool: &Tool) -> TokenStream {
    let func = &tool.func;
    if func.sig.receiver().is_some() {
        return quote!(#func);
    }
    let vis = &func.vis;
    let ident = &tool.struct_ident;
    quote! {
        #func
        #[allow(dead_code)]
        #vis struct #ident;
    }
}

pub fn expand(tool: &Tool) -> TokenStream {
    let Some(output) = tool.output.as_ref() else {
        return fallback(tool); // reported by `check`: a tool returns `Result`
    };
    let e = Expansion::new(tool, output);
    let tk = &e.tk;
    let func = &tool.func;
    let vis = &func.vis;
    let fn_ident = &func.sig.ident;
    let ident = &tool.struct_ident;
    let name = &tool.name;

    let flattened = e.flattened;
    let args_struct = args::args_struct(&e);
    let args_schema = args::schema(&e);

    let as_result = &e.as_result;
    let state_needs = tool.params.iter().filter_map(|p| match &p.kind {
        ParamKind::State(inner) => Some(quote!(.with_need(#tk::StateNeed::of::<#inner>()))),
        _ => None,
    });
    let description = &tool.description;
    let story = story_tokens(&tk, &tool.story);
    let not_destructive = tool
        .keyed()
        .is_some_and(|k| !k.destructive)
        .then(|| quote!(.not_destructive()));
    let duration = |d: Option<std::time::Duration>| match d {
        Some(d) => {
            let ms = d.as_millis() as u64;
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    let timeout = duration(tool.timeout);
    let wait = duration(tool.keyed().and_then(|k| k.wait_in_progress));
    let lease = tool.lease.as_ref().map(|l| {
        let ms = l.value.as_millis() as u64;
        quote!(__settings.lease = ::core::time::Duration::from_millis(#ms);)
    });
    let retain = tool.retain.as_ref().map(|r| {
        let ms = r.value.as_millis() as u64;
        quote!(__settings.retain = ::core::time::Duration::from_millis(#ms);)
    });
    let retry_limit = tool.retry_limit.map(|limit| match limit {
        RetryLimit::Off => quote!(__settings.retry_limit = #tk::RetryLimit::off();),
        RetryLimit::After { failures, window } => {
            let ms = window.as_millis() as u64;
            quote! {
                __settings.retry_limit = #tk::RetryLimit::after(#failures, ::core::time::Duration::from_millis(#ms));
            }
        }
    });
    let concurrency = tool
        .concurrency
        .map(|n| quote!(__settings.concurrency = ::core::num::NonZeroUsize::new(#n);));
    let status_tool = tool
        .keyed()
        .and_then(|k| k.status.as_ref())
        .map(|(status, _)| quote!(.with_status_tool(#status)));
    // What a retry may change without changing the action: for tools and kits that read the
    // definition (`toolkey::testing` rewords ignored fields and respells key fields).
    let key_template = tool.keyed().and_then(|k| k.template.as_ref()).map(|t| {
        let text = t.lit.value();
        quote!(.with_key_template(#text))
    });
    let ignored = tool.model_params().filter(|p| p.ignore.is_some()).map(|p| {
        // As the arguments spell it: what reads the definition reads the arguments' JSON.
        let name = p.json_name();
        quote!(.with_ignored_argument(#name))
    });
    let case_insensitive = tool
        .model_params()
        .filter(|p| p.case_insensitive.is_some())
        .map(|p| {
            let name = p.json_name();
            quote!(.with_case_insensitive_argument(#name))
        });
    // A key template names its fields as the fn does; what reads the arguments reads the JSON.
    let renamed = tool.model_params().filter_map(|p| {
        let (field, json) = (p.field_name(), p.json_name());
        (field != json).then(|| quote!(.with_renamed_argument(#field, #json)))
    });
    let aliases = tool.model_params().flat_map(|p| {
        let json = p.json_name();
        p.aliases()
            .into_iter()
            .map(move |alias| quote!(.with_argument_alias(#json, #alias)))
    });
    // Beside a flattened parameter, the order serde reads them in: the toolbox refuses a field
    // one parameter would take from another.
    let parameters = tool.model_params().filter(|_| flattened).map(|p| {
        let (json, ty) = (p.json_name(), &p.ty);
        if p.serde_flatten() {
            quote!(.with_flattened_parameter(
                #json,
                #tk::struct_fields::<#ty>(),
                #tk::schema_for::<#ty>,
            ))
        } else {
            quote!(.with_own_parameter(#json))
        }
    });

    // An `idempotent` tool whose template is missing was reported by `check` and never gets here.
    let keyed = tool
        .keyed()
        .and_then(|k| k.template.as_ref().map(|t| (k, t)));
    let key_items = keyed.map(|(keyed, template)| {
        let key_fn = key::key_fn(tool, keyed, template, tk);
        let fingerprint = fingerprint::schema(&e, template);
        quote!(#key_fn #fingerprint)
    });
    let prepare = prepare::prepare(&e, keyed);
    let companion = keyed.and_then(|(keyed, template)| {
        let (status, _) = keyed.status.as_ref()?;
        Some(status::companion(&e, template, status))
    });

    let doc = format!(" The `{name}` tool, generated by `#[tool]` from `{fn_ident}`: add it to a toolbox with `.tool({ident})`.");
    quote! {
        #func

        #[doc = #doc]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #ident;

        const _: () = {
            #args_struct
            #key_items

            #[automatically_derived]
            impl #tk::Tool for #ident {
                fn definition(&self) -> #tk::ToolDefinition {
                    #[allow(unused_mut)]
                    let mut __settings = #tk::Settings::default();
                    __settings.timeout = #timeout;
                    __settings.wait_in_progress = #wait;
                    #lease
                    #retain
                    #retry_limit
                    #concurrency
                    #tk::ToolDefinition::new(#name, #description, #args_schema(), #story)
                        .with_output_schema(#as_result::output_schema())
                        .with_annotations(#tk::Annotations::for_story(#story) #not_destructive)
                        .with_settings(__settings)
                        #status_tool
                        #key_template
                        #(#ignored)*
                        #(#case_insensitive)*
                        #(#renamed)*
                        #(#aliases)*
                        #(#parameters)*
                        #(#state_needs)*
                }

                #prepare

                #companion
            }
        };
    }
}

/// True when every attribute forwarded to the field's schema is `#[serde(default)]` or
/// `#[serde(default = "path")]`: the field keeps its name and its type's schema, and is only no
/// longer required.
pub(super) fn only_defaults(p: &Param) -> bool {
    p.forwarded.iter().all(|attr| {
        attr.path().is_ident("serde")
            && attr
                .parse_nested_meta(|meta| {
                    if !meta.path.is_ident("default") {
                        return Err(meta.error("not `default`"));
                    }
                    if meta.input.peek(syn::Token![=]) {
                        meta.value()?.parse::<syn::LitStr>()?;
                    }
                    Ok(())
                })
                .is_ok()
    })
}

fn story_tokens(tk: &TokenStream, story: &Story) -> TokenStream {
    match story {
        Story::ReadOnly => quote!(#tk::Story::ReadOnly),
        Story::Idempotent(_) => quote!(#tk::Story::Idempotent),
        Story::Natural => quote!(#tk::Story::Natural),
        Story::Unkeyed => quote!(#tk::Story::Unkeyed),
    }
}
