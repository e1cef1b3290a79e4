//! `fn definition`: what the toolbox, the model and the kits that read a tool learn of it — its
//! name, description, schemas and story, its settings, and how its arguments are spelled.

use proc_macro2::TokenStream;
use quote::quote;

use super::{args, Expansion};
use crate::tool::attr::RetryLimit;
use crate::tool::model::{Database, ParamKind, Story};

pub fn definition(e: &Expansion) -> TokenStream {
    let (tk, tool, as_result) = (&e.tk, e.tool, &e.as_result);
    let (name, description) = (&tool.name, &tool.description);
    let args_schema = args::schema(e);
    let story = story(tk, &tool.story);
    let not_destructive = tool
        .keyed()
        .is_some_and(|k| !k.destructive)
        .then(|| quote!(.not_destructive()));
    let settings = settings(e);
    let status_tool = tool
        .keyed()
        .and_then(|k| k.status.as_ref())
        .map(|(status, _)| quote!(.with_status_tool(#status)));
    let arguments = arguments(e);
    let state_needs = tool.params.iter().filter_map(|p| match &p.kind {
        ParamKind::State(inner) => Some(quote!(.with_need(#tk::StateNeed::of::<#inner>()))),
        _ => None,
    });
    let transaction = tool.transaction().map(|database| {
        let database = match database {
            Database::Postgres => quote!(Postgres),
            Database::Sqlite => quote!(Sqlite),
        };
        quote!(.with_transaction(#tk::Database::#database))
    });
    quote! {
        fn definition(&self) -> #tk::ToolDefinition {
            #settings
            #tk::ToolDefinition::new(#name, #description, #args_schema(), #story)
                .with_output_schema(#as_result::output_schema())
                .with_annotations(#tk::Annotations::for_story(#story) #not_destructive)
                .with_settings(__settings)
                #status_tool
                #arguments
                #(#state_needs)*
                #transaction
        }
    }
}

/// `let mut __settings = Settings::default();` and a line for each setting the tool gives.
fn settings(e: &Expansion) -> TokenStream {
    let (tk, tool) = (&e.tk, e.tool);
    let timeout = optional_duration(tool.timeout);
    let wait = optional_duration(tool.keyed().and_then(|k| k.wait_in_progress));
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
    let approval = tool.approval.then(|| quote!(__settings.approval = true;));
    quote! {
        #[allow(unused_mut)]
        let mut __settings = #tk::Settings::default();
        __settings.timeout = #timeout;
        __settings.wait_in_progress = #wait;
        #lease
        #retain
        #retry_limit
        #concurrency
        #approval
    }
}

fn optional_duration(d: Option<std::time::Duration>) -> TokenStream {
    match d {
        Some(d) => {
            let ms = d.as_millis() as u64;
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// `.with_key_template(..)`, `.with_ignored_argument(..)`, ...: what a retry may change without
/// changing the action, and how the arguments are spelled, for tools and kits that read the
/// definition (`toolkey::testing` rewords ignored fields and respells key fields).
fn arguments(e: &Expansion) -> TokenStream {
    let (tk, tool) = (&e.tk, e.tool);
    let key_template = tool.keyed().and_then(|k| k.template.as_ref()).map(|t| {
        let text = t.lit.value();
        quote!(.with_key_template(#text))
    });
    // A call without a key is counted against its retry limit by what the tool receives.
    let arguments_fingerprint = tool
        .keyed()
        .is_none()
        .then(|| quote!(.with_arguments_fingerprint(__arguments_fingerprint)));
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
    let parameters = tool.model_params().filter(|_| e.flattened).map(|p| {
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
    quote! {
        #key_template
        #arguments_fingerprint
        #(#ignored)*
        #(#case_insensitive)*
        #(#renamed)*
        #(#aliases)*
        #(#parameters)*
    }
}

fn story(tk: &TokenStream, story: &Story) -> TokenStream {
    match story {
        Story::ReadOnly => quote!(#tk::Story::ReadOnly),
        Story::Idempotent(_) => quote!(#tk::Story::Idempotent),
        Story::Natural => quote!(#tk::Story::Natural),
        Story::Unkeyed => quote!(#tk::Story::Unkeyed),
    }
}
