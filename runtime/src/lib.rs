//! The runtime of toolkey: the [`Tool`] trait the `#[tool]` attribute implements, the
//! [`Toolbox`] that runs tools, the stores that enforce idempotency keys, and the errors the
//! model reads.
//!
//! Users depend on the `toolkey` crate, which re-exports this one.

pub mod adapters;
mod context;
mod error;
mod exec;
mod export;
mod fingerprint;
mod key;
mod lease;
pub mod providers;
pub mod store;
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
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyPart, KeyPartWriter, MAX_KEY_BYTES};
pub use lease::{ShutdownReport, Unrecorded};
pub use tool::{Annotations, Settings, Story, Tool, ToolDefinition};
pub use toolbox::{
    ApprovalRequest, Approver, BuildError, Stats, ToolOutput, Toolbox, ToolboxBuilder,
};
