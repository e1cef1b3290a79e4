//! The runtime of toolkey: the [`Tool`] trait the `#[tool]` attribute implements, the
//! [`Toolbox`] that runs tools, the stores that enforce idempotency keys, and the errors the
//! model reads.
//!
//! Users depend on the `toolkey` crate, which re-exports this one.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules, declared from the bottom up: each uses only itself and those declared before it,
// so the runtime reads from the bottom up and no two modules need each other. `tests/layers.rs`
// checks it, reading each use by the module that defines the name, not by the re-exports below.

// What a tool's story is.
mod story;

// The error type and its codes.
mod error;

// Every text a model or operator reads, and the constructors that carry them.
mod texts;

// Idempotency keys: key parts, the injective encoding, normalization.
mod key;

// Fingerprints: canonical JSON and its hash.
mod fingerprint;

// The executor's counters.
mod stats;

// The store trait, the record judgement, the stores.
pub mod store;

// The spans and metrics of calls, steps and store operations.
pub mod observe;

// Keeping a reservation held: its lease renewed, its ending writes retried until they land.
mod lease;

// The reservation protocol of keys and steps alike: reserve, judge, take over, drive, settle.
mod reservation;

// `ctx.once` steps, held as a call is.
mod once;

// What a call carries: `ToolContext`, state.
mod context;

// Argument parsing and schema walking.
mod schema;

// The `Tool` trait, definitions, prepared calls.
mod tool;

// Which calls wait for a person's approval, and the requests they open and use up.
mod approval;

// A definition's schema in each API's dialect.
mod export;

// Runs one call of a tool, keyed or not, within its limits.
mod exec;

// What a status companion answers.
mod status;

// Operators' listings and resolutions on a store.
pub mod admin;

// Registers tools and dispatches calls by name to the executor.
mod toolbox;

// Provider tool calls in and results out, through a toolbox.
pub mod providers;

// The same for agent frameworks and client crates (rig, async-openai).
pub mod adapters;

// The retry-safety kit.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

// What the `#[tool]` expansion calls.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

// What users write. The plumbing generated code needs is in `__private`.
pub use approval::{DEFAULT_APPROVAL_EXPIRY, DEFAULT_APPROVAL_RETENTION};
pub use context::{State, ToolContext};
pub use error::{ErrorCode, ToolError};
pub use exec::{ApprovalRequest, Approver, ToolOutput};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyPart, KeyPartWriter, MAX_KEY_BYTES};
pub use lease::{ShutdownReport, Unrecorded};
pub use stats::Stats;
pub use story::{Annotations, Story};
pub use tool::{RetryLimit, Settings, Tool, ToolDefinition, TxBody};
pub use toolbox::{BuildError, Toolbox, ToolboxBuilder};
