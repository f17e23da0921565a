#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting and lints, then every test of the
# workspace (unit, conformance against embedded / real etcd / sharded stores, the SIGKILL
# crash test).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --all-targets --locked
