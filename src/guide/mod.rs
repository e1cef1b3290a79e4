#![doc = include_str!("index.md")]

#[doc = include_str!("keys.md")]
pub mod keys {}

#[doc = include_str!("steps.md")]
pub mod steps {}

#[doc = include_str!("approvals.md")]
pub mod approvals {}

#[doc = include_str!("stores.md")]
pub mod stores {}

#[doc = include_str!("mcp.md")]
pub mod mcp {}

#[doc = include_str!("providers.md")]
pub mod providers {}

#[doc = include_str!("operations.md")]
pub mod operations {}

#[doc = include_str!("testing.md")]
pub mod testing {}

#[doc = include_str!("performance.md")]
pub mod performance {}
