//! toolkey: declare the tools an LLM agent may call, so that a retry can never do the work twice.
//!
//! See the README for the walk-through; the attribute is [`tool`].

pub use toolkey_macros::{tool, KeyPart};
pub use toolkey_runtime::*;
