//! The `#[tool]` attribute of toolkey. Use it through the `toolkey` crate.
//!
//! The macro parses the attribute and the fn (`tool::attr`, `tool::model`), validates them
//! together (`tool::check`), and writes the code (`tool::expand`). It depends on no runtime
//! crate: generated code names `::toolkey::__private` (or the `crate = "..."` override).
#![warn(missing_docs)]

use proc_macro::TokenStream;

mod data;
mod key_part;
mod tool;

/// Declares an LLM tool from an `async fn`, with its idempotency story.
///
/// ```text
/// /// Create and send the invoice for one customer and billing period.
/// #[tool(idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"), timeout = "2s")]
/// async fn send_invoice(
///     billing: State<Billing>,
///     ctx: &ToolContext,
///     /// Customer ID, for example "acme".
///     customer: String,
///     /// Billing period as YYYY-MM.
///     period: String,
///     /// Amount in EUR.
///     amount: f64,
///     /// What the invoice is for.
///     #[arg(ignore)]
///     memo: String,
/// ) -> Result<Invoice, ToolError> { /* ... */ }
/// ```
///
/// The story is exactly one of `read_only`, `idempotent(key = "...")`, `natural`, `unkeyed`.
/// Inside `idempotent(...)`: `key` (the template: a literal namespace, then `<param>` or
/// `<ctx.run_id>`, `<ctx.step>`, `<ctx.tenant>`, `<ctx.event_id>` placeholders), `status`
/// (the companion's name, or `false`), `hash = true` (store only a hash of the values),
/// `recover = path::to_fn`, `on_in_progress = "wait(2s)"` or `"reject"`, `destructive = false`.
/// Beside the story: `timeout`, `lease`, `retain` (durations such as `"200ms"`, `"2s"`, `"5m"`,
/// `"7d"`; a lease is at least `"30ms"`, as it is renewed every third of it and at most every
/// 10 ms), `retry_limit = "5/10m"` (after five retryable failures of one call within ten
/// minutes, answer `RETRY_LIMIT`; `"off"` for none; the toolbox's default otherwise),
/// `concurrency = 4` (at most four bodies at once in a process; a call beyond waits within its
/// `timeout`, then is answered `BUSY`), `name`, `description`, `crate = "path"`.
///
/// Parameters: `State<T>` and `&ToolContext` are injected; every other parameter is filled by
/// the model, described by its `///` comment. `#[arg(ignore)]` leaves a parameter out of the
/// fingerprint. Key parts are trimmed and put in Unicode NFC and keep their case (charge ids,
/// order ids and tokens are case-sensitive); `#[arg(key = "case_insensitive")]` on a key field
/// case-folds it too (a customer name, an email address; `ß` and `SS` are one value).
/// `#[serde(..)]` and `#[schemars(..)]` attributes on a parameter go to its schema field.
#[proc_macro_attribute]
pub fn tool(args: TokenStream, item: TokenStream) -> TokenStream {
    tool::expand(args.into(), item.into()).into()
}

/// Makes a struct or enum usable as a tool's argument or result: derives `Serialize`,
/// `Deserialize` and `JsonSchema` through toolkey's own serde and schemars, so the crate needs
/// neither as a dependency. Doc comments become schema descriptions; `#[serde(..)]` and
/// `#[schemars(..)]` attributes work as usual.
///
/// ```text
/// #[toolkey::data]
/// struct Invoice { number: u32, customer: String }
/// ```
#[proc_macro_attribute]
pub fn data(args: TokenStream, item: TokenStream) -> TokenStream {
    data::expand(args.into(), item.into()).into()
}

/// Lets a unit enum be part of an idempotency key, by its serde name.
///
/// ```text
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, toolkey::KeyPart)]
/// #[serde(rename_all = "snake_case")]
/// enum Plan { Basic, Pro }
/// ```
#[proc_macro_derive(KeyPart, attributes(key_part))]
pub fn derive_key_part(item: TokenStream) -> TokenStream {
    key_part::expand(item.into()).into()
}
