#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the end-to-end demo on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/venv.sh
python -m sglang_hybrid.tools.demo "$@"
