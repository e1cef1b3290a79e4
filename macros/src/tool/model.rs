//! The validated tool: the fn, its parameters, its story and key template.

use std::time::Duration;

use proc_macro2::{Ident, Span};
use syn::ext::IdentExt;
use syn::{Attribute, FnArg, ItemFn, LitStr, Pat, Path, Type};

use super::attr::{skip_value, value, Attr, RetryLimit, Spanned, StoryKind};
use super::ctxt::Ctxt;
use super::key::{self, Template};

pub struct Tool {
    /// The fn as the user wrote it, parameter attributes removed.
    pub func: ItemFn,
    pub name: String,
    pub name_span: Span,
    pub description: String,
    pub story: Story,
    pub timeout: Option<Duration>,
    pub lease: Option<Spanned<Duration>>,
    pub retain: Option<Spanned<Duration>>,
    /// `retry_limit = "5/10m"` or `"off"`; the toolbox's when not given.
    pub retry_limit: Option<RetryLimit>,
    /// `concurrency = 2`: at most this many bodies at once in a process.
    pub concurrency: Option<usize>,
    /// `approval`: every call waits for a person's approval.
    pub approval: bool,
    pub krate: Path,
    pub params: Vec<Param>,
    pub output: Option<Type>,
    pub struct_ident: Ident,
}

/// What the tool does when called again, with what that story needs.
pub enum Story {
    ReadOnly,
    /// `idempotent(...)`: the key and its options.
    Idempotent(Keyed),
    Natural,
    Unkeyed,
}

pub struct Keyed {
    /// The key template; `None` when `key` was missing or not a string (already reported).
    pub template: Option<Template>,
    pub status: Option<(String, Span)>,
    pub hash: bool,
    pub recover: Option<Path>,
    pub wait_in_progress: Option<Duration>,
    pub destructive: bool,
}

/// The database a transactional tool writes in, as its transaction's type says.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Database {
    Postgres,
    Sqlite,
}

pub enum ParamKind {
    /// `State<T>`: injected from the toolbox; holds `T`.
    State(Box<Type>),
    /// `&ToolContext`: injected.
    Context,
    /// `&rusqlite::Transaction<'_>` or `&tokio_postgres::Transaction<'_>`: the call's
    /// transaction, which its key's record commits in. `None`: a `Transaction` whose crate the
    /// path does not say (reported by `check`).
    Transaction(Option<Database>),
    /// Filled by the model.
    Model,
}

pub struct Param {
    pub ident: Ident,
    pub ty: Type,
    pub kind: ParamKind,
    pub docs: Vec<Attribute>,
    /// `#[serde(..)]` and `#[schemars(..)]`, forwarded to the schema field.
    pub forwarded: Vec<Attribute>,
    /// `#[arg(ignore)]`, with the span of `ignore`.
    pub ignore: Option<Span>,
    /// `#[arg(key = "case_insensitive")]`, with the span of the literal: the key part is
    /// case-folded, so `"ACME"` and `"acme"` name one action.
    pub case_insensitive: Option<Span>,
}

impl Tool {
    /// The database of the tool's transaction parameter, if it takes one.
    pub fn transaction(&self) -> Option<Database> {
        self.params.iter().find_map(|p| match p.kind {
            ParamKind::Transaction(database) => database,
            _ => None,
        })
    }
}

impl Param {
    /// The field's name as serde and schemars spell it: a raw identifier without its `r#`.
    pub fn field_name(&self) -> String {
        self.ident.unraw().to_string()
    }

    /// The field's name in the arguments' JSON, which are read: its `#[serde(rename = "..")]`
    /// or `#[serde(rename(deserialize = ".."))]`, else its name.
    pub fn json_name(&self) -> String {
        self.serde_names().0.unwrap_or_else(|| self.field_name())
    }

    /// The other names the arguments' JSON may give the field: its `#[serde(alias = "..")]`s.
    pub fn aliases(&self) -> Vec<String> {
        self.serde_names().1
    }

    /// The field's `rename` (as read) and `alias`es, from its `#[serde(..)]` attributes.
    fn serde_names(&self) -> (Option<String>, Vec<String>) {
        let (mut renamed, mut aliases) = (None, Vec::new());
        for attr in self.forwarded.iter().filter(|a| a.path().is_ident("serde")) {
            let _ = attr.parse_nested_meta(|meta| {
                let rename = meta.path.is_ident("rename");
                if meta.input.peek(syn::Token![=]) {
                    let value = meta.value()?.parse::<syn::Expr>()?;
                    if let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(name),
                        ..
                    }) = value
                    {
                        if rename {
                            renamed = Some(name.value());
                        } else if meta.path.is_ident("alias") {
                            aliases.push(name.value());
                        }
                    }
                } else if meta.input.peek(syn::token::Paren) {
                    meta.parse_nested_meta(|inner| {
                        if inner.input.peek(syn::Token![=]) {
                            let value = inner.value()?.parse::<syn::Expr>()?;
                            if let (true, true, syn::Expr::Lit(lit)) =
                                (rename, inner.path.is_ident("deserialize"), value)
                            {
                                if let syn::Lit::Str(name) = lit.lit {
                                    renamed = Some(name.value());
                                }
                            }
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            });
        }
        (renamed, aliases)
    }

    /// True when the parameter is `#[serde(flatten)]`.
    pub fn serde_flatten(&self) -> bool {
        self.serde_says(&["flatten"])
    }

    /// True when serde never reads the parameter from the arguments: `#[serde(skip)]` or
    /// `#[serde(skip_deserializing)]`.
    pub fn serde_skips(&self) -> bool {
        self.serde_says(&["skip", "skip_deserializing"])
    }

    /// True when one of the parameter's `#[serde(..)]` attributes holds one of `words` alone.
    fn serde_says(&self, words: &[&str]) -> bool {
        self.forwarded.iter().any(|attr| {
            let mut said = false;
            let _ = attr.path().is_ident("serde")
                && attr
                    .parse_nested_meta(|meta| {
                        said |= words.iter().any(|word| meta.path.is_ident(word));
                        if meta.input.peek(syn::Token![=]) {
                            meta.value()?.parse::<syn::Expr>()?;
                        } else if meta.input.peek(syn::token::Paren) {
                            meta.parse_nested_meta(|_| Ok(()))?;
                        }
                        Ok(())
                    })
                    .is_ok();
            said
        })
    }
}

impl Tool {
    pub fn from_fn(cx: &Ctxt, attr: Attr, mut func: ItemFn) -> Tool {
        let params = parse_params(cx, &mut func);
        let keyed = attr.keyed.map(|k| Keyed {
            template: k.key.as_ref().map(|lit| key::parse(cx, lit)),
            status: match k.status {
                Some(Spanned { value: None, .. }) => None,
                Some(Spanned {
                    value: Some(name),
                    span,
                }) => Some((name, span)),
                None => Some((format!("{}_status", tool_name(&func, &attr.name)), k.span)),
            },
            hash: k.hash,
            recover: k.recover,
            wait_in_progress: k.wait_in_progress,
            destructive: k.destructive,
        });
        // The grammar gives `keyed` exactly when the (first) story is `idempotent`.
        let story = match (attr.story.map(|s| s.value), keyed) {
            (Some(StoryKind::Idempotent), Some(keyed)) => Story::Idempotent(keyed),
            (Some(StoryKind::Natural), _) => Story::Natural,
            (Some(StoryKind::Unkeyed), _) => Story::Unkeyed,
            (Some(StoryKind::ReadOnly | StoryKind::Idempotent), _) => Story::ReadOnly,
            (None, _) => {
                cx.error_at(
                    Span::call_site(),
                    "`#[tool]` needs an idempotency story; expected one of: `read_only`, `idempotent(key = \"...\")`, `natural`, `unkeyed`",
                );
                Story::ReadOnly
            }
        };
        let description = match &attr.description {
            Some(lit) => lit.value(),
            None => doc_text(&func.attrs),
        };
        let output = match &func.sig.output {
            syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
            syn::ReturnType::Default => None,
        };
        let name = tool_name(&func, &attr.name);
        let name_span = attr
            .name
            .as_ref()
            .map(|l| l.span())
            .unwrap_or_else(|| func.sig.ident.span());
        let struct_ident = Ident::new(
            &camel_case(&func.sig.ident.to_string()),
            func.sig.ident.span(),
        );
        Tool {
            func,
            name,
            name_span,
            description,
            story,
            timeout: attr.timeout.map(|t| t.value),
            lease: attr.lease,
            retain: attr.retain,
            retry_limit: attr.retry_limit.map(|r| r.value),
            concurrency: attr.concurrency.map(|c| c.value),
            approval: attr.approval,
            krate: attr.krate.unwrap_or_else(|| syn::parse_quote!(::toolkey)),
            params,
            output,
            struct_ident,
        }
    }

    /// The key and its options, for an `idempotent` tool.
    pub fn keyed(&self) -> Option<&Keyed> {
        match &self.story {
            Story::Idempotent(keyed) => Some(keyed),
            _ => None,
        }
    }

    pub fn model_params(&self) -> impl Iterator<Item = &Param> {
        self.params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Model))
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        // By the name serde gives it: `<type>` names `r#type`.
        self.params.iter().find(|p| p.field_name() == name)
    }
}

fn tool_name(func: &ItemFn, name: &Option<LitStr>) -> String {
    match name {
        Some(lit) => lit.value(),
        None => func.sig.ident.unraw().to_string(),
    }
}

/// Takes the parameters apart, removing the attributes only the macro understands.
fn parse_params(cx: &Ctxt, func: &mut ItemFn) -> Vec<Param> {
    let mut params = Vec::new();
    for arg in func.sig.inputs.iter_mut() {
        let pat_type = match arg {
            FnArg::Receiver(receiver) => {
                cx.error_spanned_by(
                    receiver.self_token,
                    "a `#[tool]` fn cannot take `self`: tools are free functions; move it out of the `impl` and take what it shares as `State<T>`",
                );
                continue;
            }
            FnArg::Typed(pat_type) => pat_type,
        };
        let mut docs = Vec::new();
        let mut forwarded = Vec::new();
        let mut ignore = None;
        let mut case_insensitive = None;
        let mut kept = Vec::new();
        for attr in pat_type.attrs.drain(..) {
            if attr.path().is_ident("doc") {
                docs.push(attr);
            } else if attr.path().is_ident("serde") || attr.path().is_ident("schemars") {
                forwarded.push(attr);
            } else if attr.path().is_ident("arg") {
                // Every mistake inside `#[arg(..)]` is reported, and parsing goes on after it.
                let parsed = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("ignore") {
                        ignore = Some(meta.path.segments[0].ident.span());
                    } else if meta.path.is_ident("key") {
                        let takes = "`\"case_insensitive\"`, as in `#[arg(key = \"case_insensitive\")]`";
                        if let Some(lit) = value::<LitStr>(cx, &meta, takes)? {
                            match lit.value().as_str() {
                                "case_insensitive" => case_insensitive = Some(lit.span()),
                                "exact" => cx.error_spanned_by(&lit, "key parts keep their case by default, so `key = \"exact\"` is not needed: remove it; `key = \"case_insensitive\"` is the other choice"),
                                other => cx.error_spanned_by(&lit, format!("invalid `key = \"{other}\"`; the only choice is `key = \"case_insensitive\"` (case-fold the value in the key; trimming and NFC always apply)")),
                            }
                        }
                    } else {
                        cx.error_spanned_by(&meta.path, "unknown `arg` key; expected `ignore` or `key = \"case_insensitive\"`");
                        skip_value(&meta)?;
                    }
                    Ok(())
                });
                if let Err(err) = parsed {
                    cx.syn_error(err);
                }
            } else {
                kept.push(attr);
            }
        }
        pat_type.attrs = kept;
        let ident = match &*pat_type.pat {
            Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => pat.ident.clone(),
            other => {
                cx.error_spanned_by(other, "tool parameters are plain names, as in `customer: String`: the name is the schema's field");
                continue;
            }
        };
        let ty = (*pat_type.ty).clone();
        let kind = classify(&ty);
        if !matches!(kind, ParamKind::Model) {
            if let Some(span) = ignore.or(case_insensitive) {
                cx.error_at(span, format!("`{ident}` is injected by the toolbox, not filled by the model: `#[arg(..)]` applies to model-visible parameters only"));
            }
        }
        params.push(Param {
            ident,
            ty,
            kind,
            docs,
            forwarded,
            ignore,
            case_insensitive,
        });
    }
    params
}

fn classify(ty: &Type) -> ParamKind {
    if let Type::Reference(r) = ty {
        if let Type::Path(path) = &*r.elem {
            let segments = &path.path.segments;
            if segments.last().is_some_and(|s| s.ident == "Transaction") {
                let names = |name: &str| segments.iter().any(|s| s.ident == name);
                return ParamKind::Transaction(if names("rusqlite") {
                    Some(Database::Sqlite)
                } else if names("tokio_postgres") {
                    Some(Database::Postgres)
                } else {
                    None
                });
            }
        }
    }
    match ty {
        Type::Reference(r) if last_segment(&r.elem).is_some_and(|s| s.ident == "ToolContext") => {
            ParamKind::Context
        }
        _ => match last_segment(ty) {
            Some(seg) if seg.ident == "State" => match &seg.arguments {
                syn::PathArguments::AngleBracketed(args) if args.args.len() == 1 => {
                    match &args.args[0] {
                        syn::GenericArgument::Type(inner) => {
                            ParamKind::State(Box::new(inner.clone()))
                        }
                        _ => ParamKind::Model,
                    }
                }
                _ => ParamKind::Model,
            },
            _ => ParamKind::Model,
        },
    }
}

pub fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        Type::Group(g) => last_segment(&g.elem),
        Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

/// The doc comment's text, with the common indentation removed.
pub fn doc_text(attrs: &[Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .flat_map(|s| s.split('\n').map(str::to_string).collect::<Vec<_>>())
        .collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let text: Vec<&str> = lines
        .iter()
        .map(|l| {
            if l.len() >= indent {
                &l[indent..]
            } else {
                l.trim()
            }
        })
        .collect();
    text.join("\n").trim().to_string()
}

fn camel_case(snake: &str) -> String {
    let snake = snake.strip_prefix("r#").unwrap_or(snake);
    let mut out = String::new();
    for part in snake.split('_').filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    if out.is_empty() {
        out.push_str("Tool");
    }
    out
}
