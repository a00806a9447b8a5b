#!/usr/bin/env bash
# The test command: sets up (idempotent), then runs the Rust and Python test suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all --check
python3 -m ruff check .
cargo test --workspace --release
python3 -m pytest -q "$@"
