//! The fuzz targets under bolero: a short sample in `cargo test`, as many inputs as
//! `BOLERO_RANDOM_ITERATIONS` says otherwise. See the crate docs for the commands.

use toolkey_fuzz::harness::{guarded, Tally};
use toolkey_fuzz::{operator, targets};

/// Inputs per target when `BOLERO_RANDOM_ITERATIONS` is not set: the CI sample.
const SAMPLE: usize = 3_000;

fn fuzz(name: &'static str, target: fn(&[u8], &Tally)) {
    fuzz_sample(name, target, SAMPLE);
}

/// As [`fuzz`], with a sample of `sample` inputs: for a target whose input runs processes.
fn fuzz_sample(name: &'static str, target: fn(&[u8], &Tally), sample: usize) {
    let tally = Tally::default();
    bolero::check!()
        .with_iterations(sample)
        .with_max_len(4096)
        .for_each(|input: &[u8]| {
            tally.input();
            guarded(name, input, || target(input, &tally));
        });
    println!("{}", tally.summary(name));
}

#[test]
fn toolbox_call() {
    fuzz("toolbox_call", targets::toolbox_call);
}

#[test]
fn status_call() {
    fuzz("status_call", targets::status_call);
}

#[test]
fn openai_tool_call() {
    fuzz("openai_tool_call", targets::openai_tool_call);
}

#[test]
fn openai_function_call() {
    fuzz("openai_function_call", targets::openai_function_call);
}

#[test]
fn anthropic_tool_use() {
    fuzz("anthropic_tool_use", targets::anthropic_tool_use);
}

#[test]
fn openai_tool_calls() {
    fuzz("openai_tool_calls", targets::openai_tool_calls);
}

#[test]
fn openai_function_calls() {
    fuzz("openai_function_calls", targets::openai_function_calls);
}

#[test]
fn anthropic_tool_uses() {
    fuzz("anthropic_tool_uses", targets::anthropic_tool_uses);
}

#[test]
fn mcp_tools_call() {
    fuzz("mcp_tools_call", targets::mcp_tools_call);
}

#[test]
fn key_derivation() {
    fuzz("key_derivation", targets::key_derivation);
}

#[test]
fn fingerprint() {
    fuzz("fingerprint", targets::fingerprint);
}

#[test]
fn shell_quoting() {
    fuzz("shell_quoting", operator::shell_quoting);
}

#[test]
fn cli_resolve() {
    // Each input runs a shell and the command, which opens the store: a smaller sample.
    fuzz_sample("cli_resolve", operator::cli_resolve, 300);
}

#[test]
fn admin_operations() {
    fuzz("admin_operations", operator::admin_operations);
}
