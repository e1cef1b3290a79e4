//! toolkey's integration tests and benchmarks, as a workspace member of their own: the facade
//! crate's dev-dependencies stay what its examples need, so a user's first
//! `cargo run --example invoice` builds toolkey and the example alone.
//!
//! `cargo test --workspace --all-features` runs every test here; `cargo bench -p toolkey-tests`
//! runs the benchmarks.
//!
//! This library holds what several test and bench binaries share, so that it is compiled once
//! rather than into each of them: fake outside systems, tool catalogs, the store conformance
//! setup, server and child-process helpers, and the examples' scenarios.

pub mod billing;
pub mod catalog;
pub mod child;
pub mod conformance;
#[cfg(all(feature = "postgres", feature = "redis"))]
#[path = "../benches/direct.rs"]
pub mod direct;
#[cfg(feature = "sqlite")]
#[path = "../examples/invoice/scenario.rs"]
pub mod invoice;
pub mod mcp_python;
pub mod mcp_wire;
#[path = "../examples/refund/scenario.rs"]
pub mod refund;
#[path = "../benches/rounds.rs"]
pub mod rounds;
pub mod servers;
