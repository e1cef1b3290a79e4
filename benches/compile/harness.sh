#!/usr/bin/env bash
# The compile-time harness: the same 50 four-field tools written three ways, each a program of its
# own whose main registers every tool (so everything a tool brings is compiled), built in debug as
# a user builds while writing code. Dependencies are built first (not
# timed); then each crate's own build is timed after touching its source, in the order
# A B C A B C, and the times and ratios are printed.
#
#   plain    serde + schemars: an argument struct per tool and its JSON schema, nothing else
#   rmcp     rmcp's #[tool_router] / #[tool] on a server with 50 tools
#   toolkey  #[toolkey::tool(idempotent(key = ...))] on 50 async fns (schema, key, fingerprint,
#            status companion, the Tool impl)
#
# Usage: bash benches/compile/harness.sh [rounds]   (default 2 rounds; needs crates.io once)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-2}
out="$root/target/compile-harness"
tools=50
mkdir -p "$out"
export CARGO_TARGET_DIR="$out/target"
# Each timed build compiles the whole crate: with incremental compilation a touched, unchanged
# file would reuse nearly everything and time nothing.
export CARGO_INCREMENTAL=0

manifest() { # name, dependencies
  cat <<TOML
[package]
name = "harness-$1"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[[bin]]
name = "harness-$1"
path = "src/main.rs"

[dependencies]
$2
TOML
}

generate_plain() {
  echo '#![allow(dead_code)]'
  echo 'fn main() {'
  echo '    let mut schemas = Vec::new();'
  for i in $(seq 1 $tools); do echo "    schemas.push(schema_$i()); drop(send_invoice_$i(serde_json::from_value(serde_json::json!({\"customer\": \"a\", \"period\": \"p\", \"amount\": 1, \"memo\": \"m\"})).unwrap()));"; done
  echo '    println!("{}", schemas.len());'
  echo '}'
  for i in $(seq 1 $tools); do
    cat <<RS
/// The arguments of tool $i.
#[derive(serde::Deserialize, schemars::JsonSchema)]
pub struct SendInvoice${i}Args { customer: String, period: String, amount: u64, memo: String }
/// Tool $i.
pub async fn send_invoice_$i(args: SendInvoice${i}Args) -> Result<String, String> {
    Ok(format!("{}:{}:{}:{}", args.customer, args.period, args.amount, args.memo.len()))
}
/// Tool $i's schema.
pub fn schema_$i() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(SendInvoice${i}Args)).unwrap()
}
RS
  done
}

generate_rmcp() {
  cat <<'RS'
#![allow(dead_code)]
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::{schemars, tool, tool_router};
RS
  for i in $(seq 1 $tools); do
    cat <<RS
/// The arguments of tool $i.
#[derive(serde::Deserialize, schemars::JsonSchema)]
pub struct SendInvoice${i}Args { customer: String, period: String, amount: u64, memo: String }
RS
  done
  cat <<'RS'
fn main() {
    println!("{}", Billing::new().tool_router.list_all().len());
}
/// The server.
#[derive(Clone)]
pub struct Billing { tool_router: ToolRouter<Self> }
impl Billing {
    /// A server with every tool.
    pub fn new() -> Self { Billing { tool_router: Self::tool_router() } }
}
#[tool_router]
impl Billing {
RS
  for i in $(seq 1 $tools); do
    cat <<RS
    #[tool(description = "Tool $i.")]
    async fn send_invoice_$i(&self, Parameters(args): Parameters<SendInvoice${i}Args>) -> String {
        format!("{}:{}:{}:{}", args.customer, args.period, args.amount, args.memo.len())
    }
RS
  done
  echo '}'
}

generate_toolkey() {
  echo '#![allow(dead_code)]'
  echo 'fn main() {'
  echo '    let toolbox = toolkey::Toolbox::builder()'
  for i in $(seq 1 $tools); do echo "        .tool(SendInvoice$i)"; done
  echo '        .build()'
  echo '        .unwrap();'
  echo '    println!("{}", toolbox.definitions().len());'
  echo '}'
  for i in $(seq 1 $tools); do
    cat <<RS
#[toolkey::tool(idempotent(key = "invoice$i:<customer>:<period>"))]
/// Tool $i.
pub async fn send_invoice_$i(
    customer: String,
    period: String,
    amount: u64,
    memo: String,
) -> Result<String, toolkey::ToolError> {
    Ok(format!("{customer}:{period}:{amount}:{}", memo.len()))
}
RS
  done
}

setup() { # name, dependencies
  mkdir -p "$out/$1/src"
  manifest "$1" "$2" >"$out/$1/Cargo.toml"
  "generate_$1" >"$out/$1/src/main.rs"
  cp "$root/Cargo.lock" "$out/$1/Cargo.lock"
}

setup plain 'serde = { version = "1", features = ["derive"] }
schemars = "1"
serde_json = "1"'
setup rmcp 'serde = { version = "1", features = ["derive"] }
schemars = "1"
rmcp = { version = "3", default-features = false, features = ["server", "macros"] }'
setup toolkey "toolkey = { path = \"$root\", default-features = false }"

styles=(plain rmcp toolkey)
echo "building each crate's dependencies (not timed)..."
for style in "${styles[@]}"; do
  cargo build --quiet --manifest-path "$out/$style/Cargo.toml"
done

declare -A total
for style in "${styles[@]}"; do total[$style]=0; done
for round in $(seq 1 "$rounds"); do
  for style in "${styles[@]}"; do
    touch "$out/$style/src/main.rs"
    start=$(date +%s.%N)
    cargo build --quiet --manifest-path "$out/$style/Cargo.toml"
    end=$(date +%s.%N)
    secs=$(awk "BEGIN { print $end - $start }")
    total[$style]=$(awk "BEGIN { print ${total[$style]} + $secs }")
    printf 'round %d  %-8s %6.2f s\n' "$round" "$style" "$secs"
  done
done

mean() { awk "BEGIN { print ${total[$1]} / $rounds }"; }
printf '\nmean of %d rounds (%d tools, debug build of the crate alone, not incremental):\n' "$rounds" "$tools"
for style in "${styles[@]}"; do printf '  %-8s %6.2f s\n' "$style" "$(mean "$style")"; done
printf '  toolkey / rmcp  %.2f\n' "$(awk "BEGIN { print $(mean toolkey) / $(mean rmcp) }")"
printf '  toolkey / plain %.2f\n' "$(awk "BEGIN { print $(mean toolkey) / $(mean plain) }")"
