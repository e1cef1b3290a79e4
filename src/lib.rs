//! Declare the tools an LLM agent may call, so that a retry can never do the work twice.
//!
//! An agent stack retries at every layer — the HTTP client, the tool wrapper, the model after a
//! timeout, the run loop after a crash — and a timeout only means the caller stopped waiting.
//! toolkey puts the guard where the side effect happens: one attribute on an async fn gives the
//! tool a schema for every LLM API, an idempotency key, a fingerprint, a status tool, and a
//! runtime that runs each action once.
//!
//! # The model
//!
//! - **Stories.** Every [`tool`] states what calling it again does: `read_only` (changes
//!   nothing), `natural` (repeating is harmless by nature), `idempotent(key = "...")` (an effect
//!   a repeat would double, named by a key) or `unkeyed` (effects and no key: needs an
//!   [`Approver`], and a timeout is not retryable).
//! - **Keys.** An idempotent tool's key is derived from the fields its template names
//!   (`"invoice:<customer>:<period>"` gives `invoice:acme:2026-10`), never supplied by the model,
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
//!   crashed worker's key is recovered, never silently run twice: [`store::MemoryStore`] (the
//!   default), [`store::SqliteStore`] (embedded), `PostgresStore` and `RedisStore` (features
//!   `postgres`, `redis`).
//! - **Errors the model reads.** Every failure is a [`ToolError`] with a code, a message, whether
//!   a retry is safe, and what to do next ([`ErrorCode`] lists toolkey's own codes).
//! - **Limits.** A model that repeats a failing call is stopped: after a tool's [`RetryLimit`]
//!   of retryable failures of one call within a window (10 in 10 minutes unless set), the answer
//!   is `RETRY_LIMIT`, telling it to stop and tell the user. A tool's `concurrency` bounds its
//!   bodies running at once in a process; a call beyond it waits for a slot within its timeout,
//!   then is answered `BUSY`.
//!
//! - **Operators.** A record nobody can finish (its worker died mid-call) is listed, shown and
//!   resolved as done or not done through [`admin::Admin`] ([`Toolbox::admin`]), or with the
//!   `toolkey` command-line tool against a SQLite file, PostgreSQL or Redis.
//!
//! A [`Toolbox`] holds the tools, their store and shared [`State`]; [`Toolbox::call`] runs one
//! call by name. [`providers`] turns the tool calls of OpenAI, Anthropic and MCP into calls and
//! their results back into messages; every [`ToolDefinition`] exports its schema for each API.
//! [`observe`] names the `tracing` span each call is and the metrics it counts in.
//!
//! # Getting started
//!
//! The [README](https://github.com/toolkey-rs/toolkey#readme) walks through a complete program
//! (`examples/quickstart.rs`), the `[dependencies]` it needs, and a checklist for choosing each
//! tool's story.
#![warn(missing_docs)]

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
    ToolDefinition, ToolError, ToolOutput, Toolbox, ToolboxBuilder, MAX_KEY_BYTES,
};

#[doc(inline)]
pub use toolkey_runtime::{adapters, admin, observe, providers, store};

/// The retry-safety check users run against their own tools (feature `testing`).
#[cfg(feature = "testing")]
#[doc(inline)]
pub use toolkey_runtime::testing;

#[doc(hidden)]
pub use toolkey_runtime::__private;

// Every Rust block of README.md compiles and runs as a doctest, so the README cannot drift from
// the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
