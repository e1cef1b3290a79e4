//! toolkey's integration tests and benchmarks, as a workspace member of their own: the facade
//! crate's dev-dependencies stay what its examples need, so a user's first
//! `cargo run --example invoice` builds toolkey and the example alone.
//!
//! `cargo test --workspace --all-features` runs every test here; `cargo bench -p toolkey-tests`
//! runs the benchmarks.
