//! The runtime of toolkey: the [`Tool`] trait the `#[tool]` attribute implements, the
//! [`Toolbox`] that runs tools, the stores that enforce idempotency keys, and the errors the
//! model reads.
//!
//! Users depend on the `toolkey` crate, which re-exports this one.

mod error;
mod fingerprint;
mod key;
pub mod store;

pub use error::{ErrorCode, ToolError};
pub use fingerprint::{canonical_json, Fingerprint};
pub use key::{IdempotencyKey, KeyPart, KeyPartWriter, MAX_KEY_BYTES};
