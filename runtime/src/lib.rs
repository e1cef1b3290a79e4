//! The runtime of toolkey: the [`Tool`] trait the `#[tool]` attribute implements, the
//! [`Toolbox`] that runs tools, the stores that enforce idempotency keys, and the errors the
//! model reads.
//!
//! Users depend on the `toolkey` crate, which re-exports this one.
#![warn(missing_docs)]

// The modules in layers, each using only those listed before it (doc links aside), so a
// maintainer can read the runtime from the bottom up:
//
// - vocabulary: `story`; `error` and `texts` (every text a model reads; the two use each other,
//   `ToolError::outcome_unknown` taking its default suggestion from `texts`); `key`,
//   `fingerprint`, `stats`; `store` (the trait, the record judgement, the stores); `observe`
//   (the spans and metrics of calls, steps and store operations)
// - holding a reservation: `lease` (renewal, the ending writes, `drive` and `settle`), then
//   `once` (`ctx.once` steps, held the same way)
// - what a call carries: `context` (`ToolContext`, state), `tool` (the `Tool` trait, definitions,
//   prepared calls), and beside them `export` and `schema` (a definition's schemas)
// - `exec`: runs one call of a tool, keyed or not, given its definition, store, state and context,
//   within its retry limit and concurrency limit
// - `admin`: operators' listings and resolutions on a store
// - `toolbox`: registers tools and dispatches calls by name to the executor
// - `providers`: provider tool calls in and results out, through a toolbox; `adapters`: the same
//   for agent frameworks and client crates (rig, async-openai)
// - `__private`: what the `#[tool]` expansion calls
pub mod adapters;
pub mod admin;
mod context;
mod error;
mod exec;
mod export;
mod fingerprint;
mod key;
mod lease;
pub mod observe;
mod once;
pub mod providers;
mod schema;
mod stats;
pub mod store;
mod story;
#[cfg(feature = "testing")]
pub mod testing;
mod texts;
mod tool;
mod toolbox;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

// What users write. The plumbing generated code needs is in `__private`.
pub use context::{State, ToolContext};
pub use error::{ErrorCode, ToolError};
pub use exec::{ApprovalRequest, Approver, ToolOutput};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyPart, KeyPartWriter, MAX_KEY_BYTES};
pub use lease::{ShutdownReport, Unrecorded};
pub use stats::Stats;
pub use story::{Annotations, Story};
pub use tool::{RetryLimit, Settings, Tool, ToolDefinition};
pub use toolbox::{BuildError, Toolbox, ToolboxBuilder};
