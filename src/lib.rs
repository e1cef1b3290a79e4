//! Declare the tools an LLM agent may call, so that a retry can never do the work twice.
//!
//! An agent stack retries at every layer (the HTTP client, the tool wrapper, the model after a
//! timeout, the run loop after a crash), and a timeout only means the caller stopped waiting.
//! toolkey puts the guard where the side effect happens: one attribute on an async fn gives the
//! tool a schema for every LLM API, an idempotency key, a fingerprint, a status tool, and a
//! runtime that runs each action once.
//!
//! # Example
//!
//! ```rust
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use toolkey::{json, tool, State, ToolContext, ToolError, Toolbox};
//!
//! /// The outside system: it counts the invoices it sends.
//! #[derive(Default)]
//! struct Billing {
//!     sent: AtomicU32,
//! }
//!
//! /// Send the invoice for one customer and month. Safe to retry.
//! #[tool(idempotent(key = "invoice:<customer>:<month>"))]
//! async fn send_invoice(
//!     billing: State<Billing>,
//!     /// The customer's name; its case does not matter.
//!     #[arg(key = "case_insensitive")]
//!     customer: String,
//!     /// The month billed, as YYYY-MM.
//!     month: String,
//!     /// The amount in cents.
//!     cents: i64,
//!     /// A note the model may reword on a retry: not part of the action.
//!     #[arg(ignore)]
//!     memo: String,
//! ) -> Result<u32, ToolError> {
//!     let _ = (customer, month, cents, memo);
//!     Ok(billing.sent.fetch_add(1, Ordering::SeqCst) + 1)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let toolbox = Toolbox::builder()
//!     .state(Billing::default())
//!     .tool(SendInvoice) // and its status companion, `send_invoice_status`
//!     .build()?;
//! let ctx = ToolContext::new("run-1");
//!
//! let args = json!({"customer": "acme", "month": "2026-10", "cents": 12000, "memo": "October"});
//! let first = toolbox.call("send_invoice", args, &ctx).await?;
//! assert!(!first.replayed);
//!
//! // The model retries after a timeout, rewording what it may: the first result, replayed.
//! let retry = json!({"customer": " ACME ", "month": "2026-10", "cents": 12000, "memo": "Oct."});
//! let again = toolbox.call("send_invoice", retry, &ctx).await?;
//! assert!(again.replayed);
//! assert_eq!(again.value, first.value);
//!
//! // The same key with another amount is another action: a CONFLICT, never a replay.
//! let other = json!({"customer": "acme", "month": "2026-10", "cents": 9900, "memo": ""});
//! let err = toolbox.call("send_invoice", other, &ctx).await.unwrap_err();
//! assert_eq!(err.code(), "CONFLICT");
//! # Ok(())
//! # }
//! ```
//!
//! # The model
//!
//! - **Stories.** Every [`tool`] states what calling it again does: `read_only` (changes
//!   nothing), `natural` (repeating is harmless by nature), `idempotent(key = "...")` (an effect
//!   a repeat would double, named by a key) or `unkeyed` (effects and no key: needs an
//!   [`Approver`], and a timeout is not retryable). A tool without one does not compile.
//! - **Keys.** An idempotent tool's key is derived from the fields its template names
//!   (`"invoice:<customer>:<month>"` gives `invoice:acme:2026-10`), never supplied by the model,
//!   checked at compile time, normalized (trimmed, NFC; case-folded only where a field says
//!   `#[arg(key = "case_insensitive")]`) and encoded so that two different actions never share
//!   one. The body reads it with [`ToolContext::idempotency_key`], to forward it to a provider.
//! - **Fingerprints.** The other arguments (all but `#[arg(ignore)]` ones) are fingerprinted
//!   ([`Fingerprint`]): the same key with the same fingerprint is a retry, answered with the
//!   recorded result; with another fingerprint it is a `CONFLICT`.
//! - **Status companions.** Each keyed tool brings a read-only `<tool>_status` tool taking the
//!   same arguments, which tells the model whether the action ran and what it returned.
//! - **Stores.** A [`store::Store`] reserves the key before the body runs, replays the first
//!   result, answers `IN_PROGRESS` while it runs, and fences every write with a lease token, so a
//!   crashed worker's key is recovered, never silently run twice.
//! - **Errors the model reads.** Every failure is a [`ToolError`] with a code, a message, whether
//!   a retry is safe, and what to do next ([`ErrorCode`] lists toolkey's own codes).
//! - **Limits.** A model that repeats a failing call is stopped by the tool's [`RetryLimit`]
//!   (`RETRY_LIMIT`); a tool's `concurrency` bounds its bodies running at once (`BUSY`).
//! - **Operators.** A record nobody can finish (its worker died mid-call) is listed, shown and
//!   resolved through [`admin::Admin`] ([`Toolbox::admin`]), or with the `toolkey` command.
//!
//! A [`Toolbox`] holds the tools, their store and shared [`State`]; [`Toolbox::call`] runs one
//! call by name. [`providers`] turns the tool calls of OpenAI, Anthropic and MCP into calls and
//! their results back into messages; every [`ToolDefinition`] exports its schema for each API.
//! [`observe`] names the `tracing` span each call is and the metrics it counts in.
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | `store::SqliteStore`, the embedded store |
//! | `postgres` | | `store::PostgresStore` |
//! | `redis` | | `store::RedisStore`, on one server or a Redis Cluster |
//! | `mcp` | | `providers::mcp::McpServer`: MCP over stdio, with rmcp |
//! | `mcp-http` | | `providers::mcp::http`: MCP over streamable HTTP, authentication, tasks |
//! | `mcp-oauth` | | `providers::mcp::oauth`: bearer JWTs checked against the issuer's keys, for an OAuth resource server |
//! | `testing` | | `testing::RetryCheck`, the retry-safety check ([guide](guide::testing)); `store::conformance`; `store::faults` |
//! | `rig` | | `adapters::rig` |
//! | `async-openai` | | `adapters::async_openai` |
//!
//! Without a store feature, [`store::MemoryStore`] keeps the records.
//!
//! # Learn more
//!
//! The [`guide`] covers the rest: [stories and keys](guide::keys), [steps](guide::steps),
//! [approvals](guide::approvals),
//! [stores and scaling out](guide::stores), [MCP](guide::mcp), [providers and
//! adapters](guide::providers), [operations](guide::operations), [testing your
//! tools](guide::testing) and [performance](guide::performance).
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(inline)]
pub use toolkey_macros::{data, tool, KeyPart};

/// Builds a `serde_json::Value` from JSON written inline, for a call's arguments.
#[doc(inline)]
pub use toolkey_runtime::__private::serde_json::json;
/// A JSON value: a call's arguments, a tool's result.
#[doc(inline)]
pub use toolkey_runtime::__private::serde_json::Value;

#[doc(inline)]
pub use toolkey_runtime::{
    Annotations, ApprovalRequest, Approver, BuildError, ErrorCode, Fingerprint, IdempotencyKey,
    KeyPart, KeyPartWriter, RetryLimit, Settings, State, Stats, Story, Tool, ToolContext,
    ToolDefinition, ToolError, ToolOutput, Toolbox, ToolboxBuilder, TxBody,
    DEFAULT_APPROVAL_EXPIRY, DEFAULT_APPROVAL_RETENTION, MAX_KEY_BYTES,
};

#[doc(inline)]
pub use toolkey_runtime::{adapters, admin, observe, providers, store};

/// The retry-safety check users run against their own tools (feature `testing`).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
#[doc(inline)]
pub use toolkey_runtime::testing;

#[doc(hidden)]
pub use toolkey_runtime::__private;

pub mod guide;

// Every Rust block of README.md compiles and runs as a doctest, so the README cannot drift from
// the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
