#!/usr/bin/env bash
# What a user gets from crates.io: every publishable crate packaged (`cargo package`, which also
# proves each builds alone from its package), then README's quickstart built and run in a scratch
# crate against the packaged crates, not the workspace's paths: the `.crate` files are unpacked
# and `[patch.crates-io]` points `toolkey = "0.1"` at them. A file the build needs but the
# package leaves out, or a dependency that only resolves by path, fails here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
crates=(toolkey-macros toolkey-runtime toolkey toolkey-cli)

# Packaged together, so each finds the others at this version as a registry would serve them.
# `--no-verify`: the quickstart below builds the library crates from their packages, and the
# command is checked from its own after, in one target directory rather than one per crate.
cargo package --workspace --exclude toolkey-tests --no-verify --allow-dirty --quiet
for crate in "${crates[@]}"; do
  file="target/package/$crate-$version.crate"
  [ -f "$file" ] || { echo "package: $file was not made" >&2; exit 1; }
  echo "packaged $crate $version: $(tar -tzf "$file" | wc -l) files, $(du -k "$file" | cut -f1) KiB"
done

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for crate in "${crates[@]}"; do
  tar -xzf "target/package/$crate-$version.crate" -C "$dir"
done

# The scratch crate: README's `[dependencies]` as written (a version, not a path), README's
# quickstart as main.rs, and the packaged crates standing in for crates.io's.
block() { awk -v tag="$1" '$0 == "```" tag {on=1; next} on && $0 == "```" {exit} on {print}' "$root/README.md"; }
mkdir -p "$dir/quickstart/src"
block rust > "$dir/quickstart/src/main.rs"
{
  printf '[package]\nname = "quickstart"\nversion = "0.1.0"\nedition = "2021"\npublish = false\n\n[workspace]\n\n'
  block toml
  printf '\n[patch.crates-io]\n'
  for crate in toolkey toolkey-macros toolkey-runtime; do
    printf '%s = { path = "%s" }\n' "$crate" "$dir/$crate-$version"
  done
} > "$dir/quickstart/Cargo.toml"
# The workspace's lock file, so the scratch crate resolves the versions CI tested.
cp Cargo.lock "$dir/quickstart/Cargo.lock"

cd "$dir/quickstart"
# The target directory .ci/readme-crate.sh builds the same program in: only the toolkey crates
# themselves are built again.
CARGO_TARGET_DIR="$root/target/readme-crate" cargo run --quiet | tee "$dir/out.txt"
# Every packaged crate was used, none from a path inside the checkout.
cargo metadata --format-version 1 --quiet | grep -q "\"manifest_path\":\"$dir/toolkey-$version/Cargo.toml\"" ||
  { echo "package: the quickstart did not build against the packaged toolkey" >&2; exit 1; }
if cargo metadata --format-version 1 --quiet | grep -q "\"manifest_path\":\"$root/"; then
  echo "package: the quickstart built a crate from the checkout's paths" >&2
  exit 1
fi
grep -q "invoices sent: 1$" "$dir/out.txt"
grep -q "replayed: true" "$dir/out.txt"
echo "packaged quickstart: built from the packaged crates, ran, sent 1 invoice"

# The command, checked (not built: its server clients are the workspace's to build) from its
# package against the packaged library crates.
cd "$dir/toolkey-cli-$version"
{
  printf '\n[patch.crates-io]\n'
  for crate in toolkey toolkey-macros toolkey-runtime; do
    printf '%s = { path = "%s" }\n' "$crate" "$dir/$crate-$version"
  done
  printf '\n[workspace]\n'
} >> Cargo.toml
cp "$root/Cargo.lock" Cargo.lock
CARGO_TARGET_DIR="$root/target/readme-crate" cargo check --quiet
echo "packaged command: toolkey-cli checked from its package against the packaged crates"
