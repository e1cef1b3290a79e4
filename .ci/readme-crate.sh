#!/usr/bin/env bash
# What a new user does: a crate outside the workspace with README's `[dependencies]` lines and
# README's quickstart as its `main.rs`. It must build, run, and send exactly one invoice. The
# README's quickstart must also be examples/quickstart.rs, so the two cannot drift apart.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"

# The first ```toml block and the first ```rust block of the README.
block() { awk -v tag="$1" '$0 == "```" tag {on=1; next} on && $0 == "```" {exit} on {print}' "$root/README.md"; }
deps=$(block toml)
block rust > "$dir/src/main.rs"

grep -v '^//!' "$root/examples/quickstart.rs" | sed '/./,$!d' > "$dir/example.rs"
if ! diff -u "$dir/example.rs" "$dir/src/main.rs"; then
  echo "README's quickstart differs from examples/quickstart.rs (above)" >&2
  exit 1
fi

{
  printf '[package]\nname = "quickstart"\nversion = "0.1.0"\nedition = "2021"\npublish = false\n\n[workspace]\n\n'
  # The published version line points at this checkout instead.
  printf '%s\n' "$deps" | sed "s|^toolkey = \".*\"|toolkey = { path = \"$root\" }|"
} > "$dir/Cargo.toml"
grep -q "toolkey = { path" "$dir/Cargo.toml" || { echo "README's [dependencies] name no toolkey version" >&2; exit 1; }

cd "$dir"
CARGO_TARGET_DIR="$root/target/readme-crate" cargo run --quiet | tee "$dir/out.txt"
grep -q "invoices sent: 1$" "$dir/out.txt"
grep -q "replayed: true" "$dir/out.txt"
echo "readme crate: built from README's lines outside the workspace, ran, sent 1 invoice"
