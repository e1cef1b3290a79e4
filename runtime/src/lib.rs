//! The runtime of toolkey: the [`Tool`] trait the `#[tool]` attribute implements, the
//! [`Toolbox`] that runs tools, the stores that enforce idempotency keys, and the errors the
//! model reads.
//!
//! Users depend on the `toolkey` crate, which re-exports this one.

mod context;
mod error;
mod exec;
mod export;
mod fingerprint;
mod key;
mod lease;
pub mod providers;
pub mod store;
mod texts;
mod tool;
mod toolbox;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use context::{State, StateMap, ToolContext};
pub use error::{ErrorCode, ToolError};
pub use fingerprint::{canonical_json, Fingerprint};
pub use key::{IdempotencyKey, KeyPart, KeyPartWriter, MAX_KEY_BYTES};
pub use lease::{ShutdownReport, Unrecorded};
pub use tool::{
    Annotations, Body, BoxFuture, Call, Invocation, KeyFn, Recover, Settings, StateNeed,
    StatusCompanion, Story, Tool, ToolDefinition,
};
pub use toolbox::{
    ApprovalRequest, Approver, BuildError, Stats, ToolOutput, Toolbox, ToolboxBuilder,
};
