#!/usr/bin/env bash
# Builds the sglang-hybrid wheel (Python package + the Rust extension `sglang_hybrid._ngram`) into dist/.
#
# The extension uses PyO3's stable ABI (abi3, CPython >= 3.10; see rust_ngram_py/Cargo.toml), so the one wheel
# this prints (tagged cp310-abi3-<platform>) installs on every CPython >= 3.10 of the same OS and architecture,
# e.g. a GPU machine with Python 3.12. Usage: scripts/build_wheel.sh [extra maturin build args]
# The last line of the output is the path of the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v maturin >/dev/null || { echo "maturin not found: pip install 'maturin>=1.7,<2'" >&2; exit 1; }
mkdir -p dist
# --strip: no debug symbols in the shared object (the wheel stays small).
maturin build --release --strip --out dist "$@" >&2
# The newest abi3 wheel is the one just built (maturin overwrites a wheel of the same name).
wheel=$(ls -1t dist/sglang_hybrid-*abi3*.whl 2>/dev/null | head -n 1 || true)
[ -n "$wheel" ] || { echo "no abi3 wheel found in dist/" >&2; exit 1; }
echo "built $(du -h "$wheel" | cut -f1) wheel" >&2
realpath "$wheel"
