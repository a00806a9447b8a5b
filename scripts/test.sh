#!/usr/bin/env bash
# The test command: sets up (idempotent), then runs the Rust and Python test suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/venv.sh
cargo fmt --all --check
python -m ruff check .
cargo test --workspace --release
python -m pytest -q "$@"
