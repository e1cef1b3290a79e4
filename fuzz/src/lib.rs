//! Fuzz targets for every input a model or client controls: tool arguments through
//! [`Toolbox::call`](toolkey::Toolbox::call), the OpenAI Chat Completions and Responses,
//! Anthropic and MCP call adapters and the conversation handlers, status calls, key derivation
//! and fingerprints; and the operator's surfaces ([`operator`]): the lines `toolkey` prints to
//! paste, its command line, and `Admin`.
//!
//! Each target takes arbitrary bytes, reads them as arbitrary JSON (or as JSON shaped by a tool's
//! schema and then broken a little, or as raw text), and checks that nothing panics or hangs,
//! that memory stays bounded (every input starts from an empty store; an answer is never much
//! larger than its input), and that bad input is a clear `INVALID_ARGUMENTS` — or the
//! provider's error shape — and never a store write: the store under the toolbox counts every
//! write ([`store::CountingStore`]) and the tools count every effect on a fake outside system
//! ([`tools::Ledger`]). [`targets`] lists each target's properties.
//!
//! The targets run under [bolero](https://docs.rs/bolero), on the stable toolchain, from
//! `tests/fuzz.rs`. This crate is a workspace of its own, outside toolkey's: bolero pins exact
//! versions of crates the workspace shares, and nothing here belongs in toolkey's build.
//!
//! ```text
//! # A short sample of every target, as CI runs it (a few thousand inputs each):
//! cargo test --release --manifest-path fuzz/Cargo.toml
//!
//! # 1,000,000 inputs of every target (a few minutes each on two cores):
//! BOLERO_RANDOM_ITERATIONS=1000000 cargo test --release --manifest-path fuzz/Cargo.toml -- --nocapture
//!
//! # One target: name it as a test filter.
//! BOLERO_RANDOM_ITERATIONS=1000000 cargo test --release --manifest-path fuzz/Cargo.toml -- --nocapture toolbox_call
//!
//! # Replay a failure from the seed bolero printed:
//! BOLERO_RANDOM_SEED=<seed> BOLERO_RANDOM_ITERATIONS=0 cargo test --release --manifest-path fuzz/Cargo.toml -- <target>
//! ```
//!
//! Each target prints one line when it ends:
//! `fuzz <target>: <N> inputs; answers: <A> ok, <I> INVALID_ARGUMENTS, <O> other errors (by code); 0 failures`.

pub mod gen;
pub mod harness;
pub mod keys;
pub mod operator;
pub mod store;
pub mod targets;
pub mod tools;
