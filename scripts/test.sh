#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting and lints, then every test of the
# workspace (unit, conformance against embedded / real etcd / sharded stores, the SIGKILL
# crash test, kubectl end to end). The build runs where no system protoc or
# /usr/include/google can be seen (scripts/hermetic.sh), so it proves the set-up is complete.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

# A clean build gains nothing from incremental state; skipping it saves ~3 GB of disk.
export CARGO_INCREMENTAL=0
# Every shard and federation the tests start writes its log in 4 MiB segments instead of
# 64 MiB ones (`--wal-segment-mib`): hundreds of short-lived stores, little disk.
export TESSERA_WAL_SEGMENT_MIB=4

cargo fmt --all --check
./scripts/hermetic.sh cargo clippy --workspace --all-targets --locked -- -D warnings
./scripts/hermetic.sh cargo test --workspace --all-targets --locked
