#!/usr/bin/env bash
# The project's test command (README): every test of every crate.
# Uses cargo-nextest when present (parallel, per-test processes), cargo test otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
  # nextest does not run doctests
  cargo test --workspace --doc -q
else
  cargo test --workspace --no-fail-fast "$@"
fi
