//! toolkey: declare the tools an LLM agent may call, so that a retry can never do the work twice.
//!
//! See the README for the walk-through; the attribute is [`tool`].

pub use toolkey_macros::{tool, KeyPart};
pub use toolkey_runtime::*;

// Every Rust block of README.md compiles and runs as a doctest, so the README cannot drift from
// the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
