#!/usr/bin/env bash
# The whole test suite, with no test skipped, on a machine that has only Rust and the OS's
# package manager: starts (installing where missing) PostgreSQL, Redis, the Redis Cluster and the
# Python MCP SDK the tests drive, then runs every test of the workspace with every feature.
# Arguments go to `cargo test` (for example `-- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/services.sh
exec cargo test --workspace --all-features "$@"
