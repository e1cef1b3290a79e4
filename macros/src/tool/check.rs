//! Checks across parts: the fn's shape, names, the key template against the parameters.

use proc_macro2::Span;
use syn::Type;

use super::ctxt::{did_you_mean, Ctxt};
use super::key::{Piece, Template, CTX_FIELDS};
use super::model::{last_segment, Param, ParamKind, Tool};

/// The longest literal namespace: with a 64-hex hash after it, a key stays within 255 bytes.
const MAX_PREFIX_BYTES: usize = 128;

pub fn check(cx: &Ctxt, tool: &Tool) {
    check_signature(cx, tool);
    check_name(cx, &tool.name, tool.name_span, "tool name");
    check_params(cx, tool);
    check_settings(cx, tool);
    if let Some(output) = &tool.output {
        check_result(cx, output);
    }
    if let Some(keyed) = tool.keyed() {
        if let Some(template) = &keyed.template {
            check_template(cx, tool, template);
        }
        if let Some((status, span)) = &keyed.status {
            check_name(cx, status, *span, "status tool name");
            if let Some(template) = keyed.template.as_ref().filter(|t| t.uses_ctx("step")) {
                cx.error_spanned_by(
                    &template.lit,
                    "a status companion cannot find a key that uses `<ctx.step>`: the step of the call it asks about is not the step it runs in; key on business fields, or turn the companion off with `status = false`",
                );
            }
        }
    }
}

fn check_signature(cx: &Ctxt, tool: &Tool) {
    let sig = &tool.func.sig;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!("a `#[tool]` fn must be `async`: write `async fn {}`; the toolbox awaits it in a task of its own", sig.ident),
        );
    }
    let generic = "a `#[tool]` fn cannot be generic: its schema is derived from concrete parameter types; write the types out";
    if !sig.generics.params.is_empty() {
        cx.error_spanned_by(&sig.generics, generic);
    } else if let Some(where_clause) = &sig.generics.where_clause {
        cx.error_spanned_by(where_clause, generic);
    }
    if tool.output.is_none() {
        cx.error_spanned_by(
            &sig.ident,
            "a `#[tool]` fn returns `Result<T, E>`, with `T: Serialize` and `E: Into<ToolError>`",
        );
    }
}

fn check_name(cx: &Ctxt, name: &str, span: Span, what: &str) {
    let mut chars = name.chars();
    let valid = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        cx.error_at(
            span,
            format!("invalid {what} `{name}`: LLM APIs accept 1 to 64 characters of `A-Z a-z 0-9 _ -`, starting with a letter or `_`"),
        );
    }
}

fn check_params(cx: &Ctxt, tool: &Tool) {
    let mut contexts = 0;
    let mut transactions = 0;
    for param in &tool.params {
        match &param.kind {
            ParamKind::Context => contexts += 1,
            ParamKind::Transaction(database) => {
                transactions += 1;
                if database.is_none() {
                    cx.error_spanned_by(
                        &param.ty,
                        "write the transaction's type with its crate: `&rusqlite::Transaction<'_>` (SQLite) or `&tokio_postgres::Transaction<'_>` (PostgreSQL)",
                    );
                }
                match tool.keyed() {
                    None => cx.error_spanned_by(
                        &param.ty,
                        "a transaction commits with the key's record: only an `idempotent(key = \"...\")` tool takes one",
                    ),
                    Some(keyed) if keyed.recover.is_some() => cx.error_spanned_by(
                        &param.ty,
                        "a transactional tool needs no `recover` hook: its writes commit with its record or not at all; remove `recover`",
                    ),
                    Some(_) => {}
                }
            }
            ParamKind::State(_) => {}
            ParamKind::Model => {
                if param.ident == "idempotency_key" {
                    cx.error_spanned_by(
                        &param.ident,
                        "the model must not supply the idempotency key: remove `idempotency_key`; toolkey derives the key from the fields named in `idempotent(key = \"...\")`",
                    );
                } else if last_segment(&param.ty).is_some_and(|s| s.ident == "IdempotencyKey") {
                    cx.error_spanned_by(
                        &param.ty,
                        "a parameter typed `IdempotencyKey` would let the model supply the key: remove it; read the call's key with `ctx.idempotency_key()`",
                    );
                }
            }
        }
    }
    if contexts > 1 {
        cx.error_spanned_by(&tool.func.sig.inputs, "take `&ToolContext` once");
    }
    if transactions > 1 {
        cx.error_spanned_by(&tool.func.sig.inputs, "take the transaction once");
    }
    let key_fields: Vec<&str> = tool
        .keyed()
        .and_then(|k| k.template.as_ref())
        .into_iter()
        .flat_map(|t| t.params())
        .collect();
    let flattened = tool.model_params().filter(|p| p.serde_flatten()).count();
    for param in tool.model_params() {
        let is_key = key_fields.iter().any(|f| param.field_name() == *f);
        // serde hands a flattened map every field no other part of the arguments takes, and
        // beside another flattened part, that part's fields as well.
        let takes_any = last_segment(&param.ty).is_some_and(|s| {
            ["HashMap", "BTreeMap", "IndexMap", "Map", "Value"]
                .contains(&s.ident.to_string().as_str())
        });
        if param.serde_flatten() && takes_any && flattened > 1 {
            cx.error_spanned_by(
                &param.ty,
                format!("`{}` is a flattened map beside another flattened parameter: serde hands it that parameter's fields too, so its entries would not be the ones given; flatten only one of them, or take the map unflattened", param.ident),
            );
        }
        if let (Some(span), true) = (param.ignore, is_key) {
            cx.error_at(
                span,
                format!("`{}` is part of the key, so it defines the action: a key field cannot be `#[arg(ignore)]`; remove `ignore`, or remove `<{}>` from the key", param.ident, param.ident),
            );
        }
        if let (Some(span), true) = (param.ignore, param.serde_flatten()) {
            cx.error_at(
                span,
                format!("`{}` is `#[serde(flatten)]`: its fields sit beside the others in the arguments, under their own names, so the parameter cannot be `#[arg(ignore)]`; take it unflattened, or leave out of it what a retry may reword", param.ident),
            );
        }
        if is_key && param.serde_skips() {
            cx.error_spanned_by(
                &param.ident,
                format!("`{}` is skipped by serde: it is never read from the arguments, so every call would have the same value there and share one key; remove the skip, or remove `<{}>` from the key", param.ident, param.ident),
            );
        }
        if is_key && param.serde_flatten() {
            cx.error_spanned_by(
                &param.ident,
                format!("`{}` is `#[serde(flatten)]`: it has no field of its own in the arguments, only the fields it holds, so it cannot be part of the key; key on a field of its own, or take it unflattened", param.ident),
            );
        }
        // serde reads a flattened `Option` that does not parse as `None`: a call whose tag is
        // right and whose other field is wrong would run as if the whole were left out.
        let optional = last_segment(&param.ty).is_some_and(|s| s.ident == "Option");
        if param.serde_flatten() && optional {
            cx.error_spanned_by(
                &param.ty,
                format!("`{}` is `#[serde(flatten)]` and an `Option`: serde reads a flattened `Option` whose fields do not parse as `None`, so a call with one of its fields wrong would run as if none were given; take it unflattened, or flatten a type whose fields are each optional", param.ident),
            );
        }
        if let (Some(span), false) = (param.case_insensitive, is_key) {
            cx.error_at(
                span,
                format!(
                    "`{}` is not in the key template: `key = \"case_insensitive\"` applies to key fields only",
                    param.ident
                ),
            );
        }
    }
}

/// The shortest lease: renewals come every third of a lease, and never more often than every
/// 10 ms (the runtime's floor), so a shorter lease lapses between renewals while its body runs.
const MIN_LEASE: std::time::Duration = std::time::Duration::from_millis(30);

fn check_settings(cx: &Ctxt, tool: &Tool) {
    if let Some(lease) = tool.lease.as_ref().filter(|l| l.value < MIN_LEASE) {
        cx.error_at(
            lease.span,
            format!(
                "a lease of {:?} would lapse while its body runs: it is renewed every third of it, but never more often than every 10 ms, so another call could take the key over from a running body; use at least `\"30ms\"` (the default, `\"30s\"`, suits most tools)",
                lease.value
            ),
        );
    }
    if tool.keyed().is_none() {
        for (setting, span) in [
            ("lease", tool.lease.as_ref().map(|l| l.span)),
            ("retain", tool.retain.as_ref().map(|r| r.span)),
        ] {
            if let Some(span) = span {
                cx.error_at(span, format!("`{setting}` applies to `idempotent` tools only: other stories keep no record"));
            }
        }
    }
}

fn check_template(cx: &Ctxt, tool: &Tool, template: &Template) {
    let lit = &template.lit;
    let prefix = template.prefix();
    if prefix.is_empty() || !prefix.chars().any(char::is_alphanumeric) {
        cx.error_spanned_by(lit, "a key template starts with a literal namespace that names the action, as in `\"invoice:<customer>:<period>\"`");
    } else if prefix.len() > MAX_PREFIX_BYTES {
        cx.error_spanned_by(
            lit,
            format!(
                "the key's namespace is {} bytes; keep it within {MAX_PREFIX_BYTES}",
                prefix.len()
            ),
        );
    }
    if !template
        .pieces
        .iter()
        .any(|p| !matches!(p, Piece::Literal(_)))
    {
        cx.error_spanned_by(
            lit,
            "a key template without `<placeholder>`s gives every call the same key, so only the first would ever run; name the fields that identify the action, as in `\"invoice:<customer>:<period>\"`",
        );
    }
    for piece in &template.pieces {
        let Piece::Literal(text) = piece else {
            continue;
        };
        if let Some(c) = text
            .chars()
            .find(|c| matches!(c, '\\' | '#') || c.is_control())
        {
            let why = match c {
                '\\' => "`\\`: it escapes characters inside key values".to_string(),
                '#' => "`#`: it marks hashed keys".to_string(),
                c => format!("the control character {c:?}: not every store can keep it"),
            };
            cx.error_spanned_by(
                lit,
                format!("the key template's literal text cannot hold {why}; use another separator, such as `:`, `/` or `-`"),
            );
        }
    }
    let mut seen: Vec<&Piece> = Vec::new();
    let mut previous: Option<&Piece> = None;
    let params: Vec<String> = tool.model_params().map(Param::field_name).collect();
    for piece in &template.pieces {
        if let (Some(prev @ (Piece::Param(_) | Piece::Ctx(_))), Piece::Param(_) | Piece::Ctx(_)) =
            (previous, piece)
        {
            cx.error_spanned_by(
                lit,
                format!(
                    "placeholders {} and {} need literal text between them, or their values could run together; write a separator, as in `{}:{}`",
                    show(prev),
                    show(piece),
                    show(prev).trim_matches('`'),
                    show(piece).trim_matches('`')
                ),
            );
        }
        previous = Some(piece);
        if !matches!(piece, Piece::Literal(_)) && seen.contains(&piece) {
            cx.error_spanned_by(
                lit,
                format!(
                    "placeholder {} appears twice in the key template",
                    show(piece)
                ),
            );
        }
        seen.push(piece);
        match piece {
            Piece::Literal(_) => {}
            Piece::Ctx(field) => {
                if !CTX_FIELDS.contains(&field.as_str()) {
                    let hint = did_you_mean(field, CTX_FIELDS.iter().copied())
                        .map(|c| format!(" (did you mean `<ctx.{c}>`?)"))
                        .unwrap_or_default();
                    cx.error_spanned_by(
                        lit,
                        format!("unknown context field `<ctx.{field}>` in key template{hint}; expected one of: `<ctx.run_id>`, `<ctx.step>`, `<ctx.tenant>`, `<ctx.event_id>`"),
                    );
                }
            }
            Piece::Param(name) => match tool.param(name) {
                Some(param) if matches!(param.kind, ParamKind::Model) => check_key_type(cx, name, &param.ty),
                Some(_) => cx.error_spanned_by(
                    lit,
                    format!("`<{name}>` is injected by the toolbox, not a value of the call: a key names the action by the call's own fields; remove `<{name}>` from the key"),
                ),
                None => {
                    let hint = did_you_mean(name, params.iter().map(String::as_str))
                        .map(|c| format!("; did you mean `<{c}>`?"))
                        .unwrap_or_else(|| {
                            if params.is_empty() {
                                "; the fn has no model-visible parameters".to_string()
                            } else {
                                format!("; the parameters are: {}", params.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "))
                            }
                        });
                    cx.error_spanned_by(lit, format!("unknown placeholder `<{name}>` in key template: no parameter is named `{name}`{hint}"));
                }
            },
        }
    }
}

fn show(piece: &Piece) -> String {
    match piece {
        Piece::Literal(text) => format!("`{text}`"),
        Piece::Param(name) => format!("`<{name}>`"),
        Piece::Ctx(field) => format!("`<ctx.{field}>`"),
    }
}

/// Types that can never be key parts get a specific reason here; the rest meet the `KeyPart`
/// bound in generated code, which reports on the same type.
fn check_key_type(cx: &Ctxt, name: &str, ty: &Type) {
    let Some(segment) = last_segment(ty) else {
        if let Type::Reference(_) = ty {
            return;
        }
        cx.error_spanned_by(ty, format!("`{name}` cannot be part of an idempotency key: its type has no single canonical text form; use a String, an integer, a bool, a char, a Uuid or a unit enum"));
        return;
    };
    let why = match segment.ident.to_string().as_str() {
        "f32" | "f64" => "floats cannot be part of an idempotency key: the same amount has many spellings and roundings (0.1 + 0.2 != 0.3); use integer minor units (`amount_cents: i64`) or a String, or leave it out of the key and let the fingerprint catch a changed amount",
        "Option" => "an `Option` cannot be part of an idempotency key: an absent value would make different actions share one key; make the parameter required, or leave it out of the key",
        "Vec" | "HashSet" | "BTreeSet" | "VecDeque" => "a collection cannot be part of an idempotency key: its order and size make no single name for the action; key on an identifier of the whole (an order id), and let the fingerprint cover the items",
        "HashMap" | "BTreeMap" => "a map cannot be part of an idempotency key: it has no single canonical text form; key on an identifier of the action, and let the fingerprint cover the map",
        "Value" => "free-form JSON (`serde_json::Value`) cannot be part of an idempotency key: it has no single canonical text form; key on a typed identifier field",
        _ => return,
    };
    cx.error_spanned_by(ty, format!("`{name}`: {why}"));
}

/// A result is recorded after the tool acted, as JSON: a type that cannot become JSON would turn
/// an effect that happened into an unknown. Where the type shows it (a map keyed by something
/// other than text, a number, a bool or a unit enum), say so at compile time.
fn check_result(cx: &Ctxt, output: &Type) {
    let Some(segment) = last_segment(output) else {
        return;
    };
    let syn::PathArguments::AngleBracketed(args) = &segment.arguments else {
        return;
    };
    if segment.ident != "Result" {
        return;
    }
    if let Some(syn::GenericArgument::Type(ok)) = args.args.first() {
        check_serializable(cx, ok, 0);
    }
}

fn check_serializable(cx: &Ctxt, ty: &Type, depth: usize) {
    if depth > 16 {
        return;
    }
    match ty {
        Type::Tuple(t) => t
            .elems
            .iter()
            .for_each(|e| check_serializable(cx, e, depth + 1)),
        Type::Array(a) => check_serializable(cx, &a.elem, depth + 1),
        Type::Slice(s) => check_serializable(cx, &s.elem, depth + 1),
        Type::Reference(r) => check_serializable(cx, &r.elem, depth + 1),
        Type::Paren(p) => check_serializable(cx, &p.elem, depth + 1),
        Type::Group(g) => check_serializable(cx, &g.elem, depth + 1),
        Type::Path(path) => {
            for segment in &path.path.segments {
                let syn::PathArguments::AngleBracketed(args) = &segment.arguments else {
                    continue;
                };
                let types: Vec<&Type> = args
                    .args
                    .iter()
                    .filter_map(|a| match a {
                        syn::GenericArgument::Type(t) => Some(t),
                        _ => None,
                    })
                    .collect();
                let is_map = ["HashMap", "BTreeMap", "IndexMap"]
                    .iter()
                    .any(|m| segment.ident == m);
                if let (true, Some(key)) = (is_map, types.first()) {
                    if !can_be_json_key(key) {
                        cx.error_spanned_by(
                            key,
                            format!(
                                "`{}` cannot be a map key in a tool result: JSON object keys are text, so the result could not be recorded after the tool acted; key the map by a String, an integer or a unit enum, or return a `Vec` of pairs",
                                quote::quote!(#key).to_string().replace(' ', "")
                            ),
                        );
                    }
                }
                for t in types {
                    check_serializable(cx, t, depth + 1);
                }
            }
        }
        _ => {}
    }
}

fn can_be_json_key(ty: &Type) -> bool {
    match ty {
        Type::Tuple(_) | Type::Array(_) | Type::Slice(_) => false,
        Type::Reference(r) => can_be_json_key(&r.elem),
        Type::Paren(p) => can_be_json_key(&p.elem),
        _ => !last_segment(ty).is_some_and(|s| {
            [
                "Vec", "VecDeque", "HashSet", "BTreeSet", "HashMap", "BTreeMap", "Option", "Value",
            ]
            .iter()
            .any(|n| s.ident == n)
        }),
    }
}
