//! `fn prepare`: a call's arguments read, its key and fingerprint taken, and the user's fn made
//! the call's body (and a `recover` fn its recover hook).

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::{args, fingerprint, Expansion};
use crate::tool::key::Template;
use crate::tool::model::{Database, Keyed, ParamKind, Tool};

pub fn prepare(e: &Expansion, keyed: Option<(&Keyed, &Template)>) -> TokenStream {
    let tk = &e.tk;
    let call = match keyed {
        None => unkeyed_call(e),
        Some((keyed, template)) => keyed_call(e, keyed, template),
    };
    quote! {
        fn prepare(
            &self,
            __args: &#tk::serde_json::Value,
            __ctx: &#tk::ToolContext,
        ) -> ::core::result::Result<#tk::Call, #tk::ToolError> {
            #call
        }
    }
}

fn unkeyed_call(e: &Expansion) -> TokenStream {
    let tk = &e.tk;
    let parse_args = args::parse(e, quote!(__args));
    let body = body(e);
    quote! {
        let __a: __Args = #parse_args?;
        let _ = __ctx;
        ::core::result::Result::Ok(#tk::Call::unkeyed(#body))
    }
}

/// The key from `__key`, the fingerprint, the body; with a `recover` fn, the arguments kept for
/// it as they came.
fn keyed_call(e: &Expansion, keyed: &Keyed, template: &Template) -> TokenStream {
    let tk = &e.tk;
    let parse_args = args::parse(e, quote!(__args));
    let key_args: Vec<TokenStream> = template
        .params()
        // An unknown placeholder was reported by `check`.
        .filter_map(|name| e.tool.param(name))
        .map(|param| {
            let ident = &param.ident;
            quote!(&__a.#ident)
        })
        .collect();
    let fingerprint = fingerprint::value(e, template);
    let body = match e.tool.transaction() {
        Some(database) => tx_body(e, database),
        None => body(e),
    };
    let constructor = match e.tool.transaction() {
        Some(_) => quote!(transactional),
        None => quote!(keyed),
    };
    let (keep_raw, with_recover) = match &keyed.recover {
        Some(recover) => (
            quote!(let __raw = __args.clone();),
            with_recover(e, recover),
        ),
        None => (quote!(), quote!()),
    };
    // A key on the call's place in the run is new at every call, the model's retry included: its
    // retry limit counts under the key as it would be at one fixed step, what stays the same
    // between the model's retries.
    let (limit_key, with_limit_key) = if template.uses_ctx("step") {
        (
            quote!(let __limit_key = __key(&__ctx.clone().with_step(0), #(#key_args),*)?;),
            quote!(.with_limit_key(__limit_key)),
        )
    } else {
        (quote!(), quote!())
    };
    quote! {
        #keep_raw
        let __a: __Args = #parse_args?;
        #limit_key
        let __key = __key(__ctx, #(#key_args),*)?;
        let __fp = #fingerprint?;
        ::core::result::Result::Ok(
            #tk::Call::#constructor(__key, __fp, #body) #with_recover #with_limit_key
        )
    }
}

/// The call's body: the user's fn called with the states it takes, the context and the
/// arguments, its result made a tool result.
fn body(e: &Expansion) -> TokenStream {
    let (tk, func, as_result) = (&e.tk, &e.tool.func, &e.as_result);
    let fn_ident = &func.sig.ident;
    let take_states = take_states(e.tool);
    let call_args = call_args(e.tool);
    // The body runs in a task of its own: its future must be `Send`. Checked at the call, spanned
    // at the fn, so the one error names the fn rather than the generated code.
    let user_future = quote_spanned! {func.sig.fn_token.span=>
        #tk::send_future(#fn_ident(#(#call_args),*))
    };
    // A body that borrows no context is the fn's own future, mapped by a function generic over
    // it: no async block of its own for every tool. One that borrows the context owns it in
    // an async block.
    let takes_context = e
        .tool
        .params
        .iter()
        .any(|p| matches!(p.kind, ParamKind::Context));
    if takes_context {
        quote! {
            #tk::body(move |__inv: #tk::Invocation| async move {
                #(#take_states)*
                let __ctx = __inv.into_context();
                #as_result::into_tool_result(#user_future.await)
            })
        }
    } else {
        quote! {
            #tk::body_of(
                move |__inv: #tk::Invocation| {
                    #(#take_states)*
                    ::core::result::Result::Ok(#user_future)
                },
                #as_result::into_tool_result,
            )
        }
    }
}

/// A transactional call's body: the user's fn called with the call's transaction, the states
/// it takes, the context and the arguments. On PostgreSQL it is awaited as every body is; on
/// SQLite it runs on the blocking pool holding the store's write lock, and is driven there.
fn tx_body(e: &Expansion, database: Database) -> TokenStream {
    let (tk, func, as_result) = (&e.tk, &e.tool.func, &e.as_result);
    let fn_ident = &func.sig.ident;
    let take_states = take_states(e.tool);
    let call_args = call_args(e.tool);
    match database {
        Database::Postgres => {
            let user_future = quote_spanned! {func.sig.fn_token.span=>
                #tk::send_future(#fn_ident(#(#call_args),*))
            };
            quote! {
                #tk::TxBody::postgres(move |__inv: #tk::Invocation, __tx| {
                    ::std::boxed::Box::pin(async move {
                        #(#take_states)*
                        let __ctx = __inv.into_context();
                        #as_result::into_tool_result(#user_future.await)
                    })
                })
            }
        }
        Database::Sqlite => quote! {
            #tk::TxBody::sqlite(move |__inv: #tk::Invocation, __tx| {
                #(#take_states)*
                let __ctx = __inv.into_context();
                #as_result::into_tool_result(#tk::block_on(#fn_ident(#(#call_args),*)))
            })
        },
    }
}

/// `.with_recover(..)`: the `recover` fn called as the user's fn is, on the arguments kept raw.
fn with_recover(e: &Expansion, recover: &syn::Path) -> TokenStream {
    let tk = &e.tk;
    let parse_raw = args::parse(e, quote!(&__raw));
    let take_states = take_states(e.tool);
    let call_args = call_args(e.tool);
    quote! {
        .with_recover(#tk::recover(move |__inv: #tk::Invocation| async move {
            let __a: __Args = #parse_raw?;
            #(#take_states)*
            let __ctx = __inv.into_context();
            #tk::IntoRecovered::into_recovered(#recover(#(#call_args),*).await)
        }))
    }
}

/// `let __state0 = __inv.state::<Billing>()?;` for each `State<_>` parameter.
fn take_states(tool: &Tool) -> Vec<TokenStream> {
    tool.params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.kind {
            ParamKind::State(inner) => {
                let var = state_var(i);
                Some(quote!(let #var = __inv.state::<#inner>()?;))
            }
            _ => None,
        })
        .collect()
}

/// The user's fn's arguments in its order: `__state0`, `&__ctx`, `__a.customer`, ...
fn call_args(tool: &Tool) -> Vec<TokenStream> {
    tool.params
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.kind {
            ParamKind::State(_) => {
                let var = state_var(i);
                quote!(#var)
            }
            ParamKind::Context => quote!(&__ctx),
            ParamKind::Transaction(_) => quote!(__tx),
            ParamKind::Model => {
                let ident = &p.ident;
                quote!(__a.#ident)
            }
        })
        .collect()
}

fn state_var(i: usize) -> Ident {
    format_ident!("__state{}", i)
}
