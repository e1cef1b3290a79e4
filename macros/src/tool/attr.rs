//! The `#[tool(...)]` grammar.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::parse::Parse;
use syn::{LitBool, LitInt, LitStr, Path};

use super::ctxt::{did_you_mean, Ctxt};

/// A value with the span it was written at.
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoryKind {
    ReadOnly,
    Idempotent,
    Natural,
    Unkeyed,
}

pub struct Keyed {
    pub key: Option<LitStr>,
    /// `None`: the default name; `Some(None)`: `status = false`.
    pub status: Option<Spanned<Option<String>>>,
    pub hash: bool,
    pub recover: Option<Path>,
    pub wait_in_progress: Option<Duration>,
    pub destructive: bool,
    /// The `idempotent` token, for errors about the story as a whole.
    pub span: Span,
    /// `key` was given but is not a string: already reported.
    pub key_missing: bool,
}

/// `retry_limit = "5/10m"` or `retry_limit = "off"`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RetryLimit {
    Off,
    After { failures: u32, window: Duration },
}

pub struct Attr {
    pub story: Option<Spanned<StoryKind>>,
    pub keyed: Option<Keyed>,
    pub timeout: Option<Spanned<Duration>>,
    pub lease: Option<Spanned<Duration>>,
    pub retain: Option<Spanned<Duration>>,
    pub retry_limit: Option<Spanned<RetryLimit>>,
    pub concurrency: Option<Spanned<usize>>,
    /// `approval`: every call waits for a person's approval.
    pub approval: bool,
    pub name: Option<LitStr>,
    pub description: Option<LitStr>,
    pub krate: Option<Path>,
}

const TOP_KEYS: &[&str] = &[
    "read_only",
    "idempotent",
    "natural",
    "unkeyed",
    "timeout",
    "lease",
    "retain",
    "retry_limit",
    "concurrency",
    "approval",
    "name",
    "description",
    "crate",
];
const KEYED_KEYS: &[&str] = &[
    "key",
    "status",
    "hash",
    "recover",
    "on_in_progress",
    "destructive",
];
const STORIES: &str = "`read_only`, `idempotent(key = \"...\")`, `natural`, `unkeyed`";

pub fn parse(cx: &Ctxt, args: TokenStream) -> Attr {
    let mut attr = Attr {
        story: None,
        keyed: None,
        timeout: None,
        lease: None,
        retain: None,
        retry_limit: None,
        concurrency: None,
        approval: false,
        name: None,
        description: None,
        krate: None,
    };
    let mut seen: Vec<String> = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let key = path_name(&meta.path);
        let span = span_of(&meta.path);
        if seen.contains(&key) && TOP_KEYS.contains(&key.as_str()) {
            cx.error_at(span, format!("duplicate `{key}`: each key is given once"));
            skip_value(&meta)?;
            return Ok(());
        }
        seen.push(key.clone());
        let story = match key.as_str() {
            "read_only" => Some(StoryKind::ReadOnly),
            "natural" => Some(StoryKind::Natural),
            "unkeyed" => Some(StoryKind::Unkeyed),
            "idempotent" => Some(StoryKind::Idempotent),
            _ => None,
        };
        if let Some(kind) = story {
            if let Some(first) = &attr.story {
                cx.error_at(
                    span,
                    format!(
                        "a tool states exactly one story, and `{}` was already given; expected one of: {STORIES}",
                        story_name(first.value)
                    ),
                );
                skip_value(&meta)?;
                return Ok(());
            }
            attr.story = Some(Spanned { value: kind, span });
            if kind == StoryKind::Idempotent {
                attr.keyed = Some(parse_keyed(cx, &meta, span)?);
            } else if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                cx.error_at(span, format!("`{key}` takes no arguments"));
                skip_value(&meta)?;
            }
            return Ok(());
        }
        match key.as_str() {
            "timeout" => attr.timeout = parse_duration(cx, &meta)?,
            "lease" => attr.lease = parse_duration(cx, &meta)?,
            "retain" => attr.retain = parse_duration(cx, &meta)?,
            "retry_limit" => {
                let takes = "failures and a window in a string, as in `retry_limit = \"5/10m\"`, or `retry_limit = \"off\"`";
                if let Some(lit) = value::<LitStr>(cx, &meta, takes)? {
                    match retry_limit(&lit.value()) {
                        Ok(value) => {
                            attr.retry_limit = Some(Spanned {
                                value,
                                span: lit.span(),
                            })
                        }
                        Err(msg) => cx.error_spanned_by(&lit, msg),
                    }
                }
            }
            "concurrency" => {
                let takes = "how many calls may run at once, as in `concurrency = 4`";
                if let Some(lit) = value::<LitInt>(cx, &meta, takes)? {
                    match lit.base10_parse::<usize>() {
                        Ok(0) => cx.error_spanned_by(&lit, "`concurrency = 0` would let no call run; give at least 1, or leave `concurrency` out for no limit"),
                        Ok(value) => {
                            attr.concurrency = Some(Spanned {
                                value,
                                span: lit.span(),
                            })
                        }
                        Err(_) => cx.error_spanned_by(&lit, format!("`concurrency` takes {takes}")),
                    }
                }
            }
            "approval" => {
                if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                    cx.error_at(span, "`approval` takes no arguments: every call of the tool waits for a person's approval");
                    skip_value(&meta)?;
                }
                attr.approval = true;
            }
            "name" => {
                attr.name = value(
                    cx,
                    &meta,
                    "a tool name in a string, as in `name = \"send_invoice\"`",
                )?
            }
            "description" => {
                attr.description = value(
                    cx,
                    &meta,
                    "a string, as in `description = \"Sends the invoice\"`",
                )?
            }
            "crate" => {
                let takes = "a path in a string, as in `crate = \"::toolkey\"`";
                if let Some(lit) = value::<LitStr>(cx, &meta, takes)? {
                    match lit.parse::<Path>() {
                        Ok(path) => attr.krate = Some(path),
                        Err(_) => cx.error_spanned_by(&lit, format!("`crate` takes {takes}")),
                    }
                }
            }
            other if KEYED_KEYS.contains(&other) => {
                cx.error_at(span, format!("`{other}` belongs inside `idempotent(...)`, as in `idempotent(key = \"...\", {other} = ...)`"));
                skip_value(&meta)?;
            }
            other => {
                let hint = did_you_mean(other, TOP_KEYS.iter().copied())
                    .map(|c| format!(" (did you mean `{c}`?)"))
                    .unwrap_or_default();
                cx.error_at(
                    span,
                    format!(
                        "unknown `#[tool]` key `{other}`{hint}; expected one of: `read_only`, `idempotent(...)`, `natural`, `unkeyed`, `timeout`, `lease`, `retain`, `retry_limit`, `concurrency`, `approval`, `name`, `description`, `crate`"
                    ),
                );
                skip_value(&meta)?;
            }
        }
        Ok(())
    });
    if let Err(err) = syn::parse::Parser::parse2(parser, args) {
        cx.syn_error(err);
    }
    attr
}

fn parse_keyed(cx: &Ctxt, meta: &ParseNestedMeta, span: Span) -> syn::Result<Keyed> {
    let mut keyed = Keyed {
        key: None,
        status: None,
        hash: false,
        recover: None,
        wait_in_progress: None,
        destructive: true,
        span,
        key_missing: false,
    };
    if meta.input.is_empty() || meta.input.peek(syn::Token![,]) {
        cx.error_at(span, "`idempotent` needs a key template, as in `idempotent(key = \"invoice:<customer>:<period>\")`");
        return Ok(keyed);
    }
    let mut seen: Vec<String> = Vec::new();
    meta.parse_nested_meta(|inner| {
        let key = path_name(&inner.path);
        let span = span_of(&inner.path);
        if seen.contains(&key) {
            cx.error_at(span, format!("duplicate `{key}`: each key is given once"));
            skip_value(&inner)?;
            return Ok(());
        }
        seen.push(key.clone());
        match key.as_str() {
            "key" => {
                keyed.key = value(cx, &inner, "a template in a string, as in `key = \"invoice:<customer>:<period>\"`")?;
                keyed.key_missing = keyed.key.is_none();
            }
            "status" => {
                let takes = "a tool name in a string, as in `status = \"invoice_status\"`, or `false`; leave it out for the default `<tool>_status`";
                match value::<StatusValue>(cx, &inner, takes)? {
                    Some(StatusValue::Off(b)) if b.value => cx.error_spanned_by(&b, format!("`status` takes {takes}")),
                    Some(StatusValue::Off(b)) => keyed.status = Some(Spanned { value: None, span: b.span }),
                    Some(StatusValue::Name(lit)) => {
                        keyed.status = Some(Spanned { value: Some(lit.value()), span: lit.span() })
                    }
                    None => {}
                }
            }
            "hash" => {
                if let Some(b) = value::<LitBool>(cx, &inner, "`true` or `false`, as in `hash = true`")? {
                    keyed.hash = b.value;
                }
            }
            "destructive" => {
                if let Some(b) = value::<LitBool>(cx, &inner, "`true` or `false`, as in `destructive = false`")? {
                    keyed.destructive = b.value;
                }
            }
            "recover" => {
                keyed.recover = value(cx, &inner, "the path of an async fn, as in `recover = find_invoice`")?;
            }
            "on_in_progress" => {
                let takes = "`\"reject\"` or `\"wait(2s)\"`";
                if let Some(lit) = value::<LitStr>(cx, &inner, takes)? {
                    match parse_on_in_progress(&lit.value()) {
                        Ok(wait) => keyed.wait_in_progress = wait,
                        Err(msg) => cx.error_spanned_by(&lit, msg),
                    }
                }
            }
            other => {
                let hint = did_you_mean(other, KEYED_KEYS.iter().copied())
                    .map(|c| format!(" (did you mean `{c}`?)"))
                    .unwrap_or_default();
                cx.error_at(
                    span,
                    format!("unknown `idempotent` key `{other}`{hint}; expected one of: `key`, `status`, `hash`, `recover`, `on_in_progress`, `destructive`"),
                );
                skip_value(&inner)?;
            }
        }
        Ok(())
    })?;
    if keyed.key.is_none() && !keyed.key_missing {
        cx.error_at(span, "`idempotent` needs a key template, as in `idempotent(key = \"invoice:<customer>:<period>\")`");
    }
    Ok(keyed)
}

/// `status = "name"` or `status = false`.
enum StatusValue {
    Name(LitStr),
    Off(LitBool),
}

impl Parse for StatusValue {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        if input.peek(LitBool) {
            input.parse().map(StatusValue::Off)
        } else {
            input.parse().map(StatusValue::Name)
        }
    }
}

/// The value after `key =` when it is a `T`. Anything else is reported at the value, as what
/// `key` takes, and skipped, so parsing goes on to report the rest.
pub fn value<T: Parse>(cx: &Ctxt, meta: &ParseNestedMeta, takes: &str) -> syn::Result<Option<T>> {
    let key = path_name(&meta.path);
    if !meta.input.peek(syn::Token![=]) {
        cx.error_at(span_of(&meta.path), format!("`{key}` takes {takes}"));
        skip_value(meta)?;
        return Ok(None);
    }
    let input = meta.value()?;
    let fork = input.fork();
    if fork.parse::<T>().is_ok() && (fork.is_empty() || fork.peek(syn::Token![,])) {
        return input.parse().map(Some);
    }
    let mut written = TokenStream::new();
    while !input.is_empty() && !input.peek(syn::Token![,]) {
        written.extend(input.parse::<proc_macro2::TokenTree>()?.into_token_stream());
    }
    cx.error_spanned_by(written, format!("`{key}` takes {takes}"));
    Ok(None)
}

fn parse_on_in_progress(text: &str) -> Result<Option<Duration>, String> {
    if text == "reject" {
        return Ok(None);
    }
    let inner = text
        .strip_prefix("wait(")
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| {
            format!(
                "invalid `on_in_progress = \"{text}\"`; expected `\"reject\"` or `\"wait(2s)\"`"
            )
        })?;
    duration(inner).map(Some)
}

fn parse_duration(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Spanned<Duration>>> {
    let key = path_name(&meta.path);
    let takes = format!("a duration in a string, as in `{key} = \"2s\"`");
    let Some(lit) = value::<LitStr>(cx, meta, &takes)? else {
        return Ok(None);
    };
    match duration(&lit.value()) {
        Ok(value) => Ok(Some(Spanned {
            value,
            span: lit.span(),
        })),
        Err(msg) => {
            cx.error_spanned_by(&lit, msg);
            Ok(None)
        }
    }
}

/// `"5/10m"` (five failures within ten minutes) or `"off"`.
pub fn retry_limit(text: &str) -> Result<RetryLimit, String> {
    if text == "off" {
        return Ok(RetryLimit::Off);
    }
    let expected = "expected failures and a window, as in `\"5/10m\"` (five failures within ten minutes), or `\"off\"`";
    let Some((failures, window)) = text.split_once('/') else {
        return Err(format!("invalid retry limit `\"{text}\"`; {expected}"));
    };
    let failures = match failures.trim().parse::<u32>() {
        Ok(0) => {
            return Err(format!("invalid retry limit `\"{text}\"`: it allows no failure, so no call would run; allow at least 1, or write `\"off\"`"))
        }
        Ok(n) => n,
        Err(_) => {
            return Err(format!(
                "invalid retry limit `\"{text}\"`: `{failures}` is not a number of failures; {expected}"
            ))
        }
    };
    let window = duration(window.trim())
        .map_err(|why| format!("invalid retry limit `\"{text}\"`: its window is an {why}"))?;
    Ok(RetryLimit::After { failures, window })
}

/// `"200ms"`, `"2s"`, `"5m"`, `"7d"`: a positive duration with a unit.
pub fn duration(text: &str) -> Result<Duration, String> {
    let why = if text.trim().is_empty() {
        ": it is empty".to_string()
    } else if text.trim().chars().all(|c| c.is_ascii_digit()) {
        ": it has no unit".to_string()
    } else {
        match humantime::parse_duration(text) {
            Ok(d) if d.is_zero() => ": it is zero".to_string(),
            Ok(d) => return Ok(d),
            Err(humantime::DurationError::UnknownUnit { unit, .. }) => {
                format!(": `{unit}` is not a unit")
            }
            Err(humantime::DurationError::NumberOverflow) => ": it is too long".to_string(),
            Err(_) => String::new(),
        }
    };
    Err(format!(
        "invalid duration `\"{text}\"`{why}; expected a number and a unit (`ms`, `s`, `m`, `h`, `d`), as in `\"200ms\"`, `\"2s\"`, `\"5m\"`, `\"7d\"`"
    ))
}

fn path_name(path: &Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

fn span_of(path: &Path) -> Span {
    path.segments
        .first()
        .map(|s| s.ident.span())
        .unwrap_or_else(Span::call_site)
}

/// Consumes whatever value follows a key we reject, so parsing goes on to report the rest.
pub fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in meta.input);
        let _: TokenStream = _content.parse()?;
    }
    Ok(())
}

pub fn story_name(kind: StoryKind) -> &'static str {
    match kind {
        StoryKind::ReadOnly => "read_only",
        StoryKind::Idempotent => "idempotent",
        StoryKind::Natural => "natural",
        StoryKind::Unkeyed => "unkeyed",
    }
}
