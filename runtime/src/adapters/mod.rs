//! Toolbox tools inside the agent stacks Rust programs already run, each behind a feature.
//!
//! | feature | stack | what it gives | module |
//! |---|---|---|---|
//! | `rig` | [rig](https://crates.io/crates/rig-core) 0.44, the agent framework | each tool as a rig `DynamicTool`, for `AgentBuilder::dynamic_tools` | `rig` |
//! | `async-openai` | [async-openai](https://crates.io/crates/async-openai) 0.43, the OpenAI client | typed `tools` for the request, typed tool calls in, typed tool messages out | `async_openai` |
//!
//! Every call still goes through [`Toolbox::call`](crate::Toolbox::call): keys, replays,
//! `IN_PROGRESS` and `CONFLICT` hold, and the model reads the same text as through
//! [`providers::openai`](crate::providers::openai) — the result as JSON, a replay wrapped with a
//! note that it was not done again, an error as `{"error": {"code", "message", "retryable",
//! "suggestion"}}`. The adapters take only the types and traits of those crates, never their
//! HTTP clients: `rig-core` is built without default features, `async-openai` with its
//! `chat-completion-types` alone.
//!
//! rig-core 0.44 needs rustc 1.95; toolkey without the `rig` feature keeps its own minimum.

#[cfg(feature = "async-openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-openai")))]
pub mod async_openai;
#[cfg(feature = "rig")]
#[cfg_attr(docsrs, doc(cfg(feature = "rig")))]
pub mod rig;
