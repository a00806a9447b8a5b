#!/usr/bin/env bash
# The device run: measured cost tables, the selection step graph-captured at deployed shapes, the ragged verify
# layout captured per token tier, lossless checks.
#
#   bash bench/device_run.sh              # GPU present: the full run (about 70 s on an H200);
#                                         # no GPU: the CPU mode (same checks, small sizes, < 2 minutes)
#   bash bench/device_run.sh --cpu        # the CPU mode even where a GPU is present
#   bash bench/device_run.sh --prepare    # here, before a GPU call: wheels into dist/device/, carry size checked
#   bash bench/device_run.sh --check-carry  # only the size check
#
# Outputs go to $OUT when set (the device tool sets it), else out/device/: device_run.log, summary.json,
# cost_tables.json + cost_tables.png, selection.json, ragged.json, lossless.json (seven files: the tool returns at
# most eight).
# The GPU machine has Python 3.12 and torch but no pydantic and no build of our Rust extension: --prepare downloads
# pydantic's wheels (cp312, manylinux x86_64) and copies the abi3 wheel of sglang_hybrid (scripts/build_wheel.sh)
# into dist/device/, which the run call carries. docs/benchmarks.md ("Device run") gives the exact call.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${HYBRID_DEVICE_WHEELS:-dist/device}
export HYBRID_DEVICE_WHEELS=$WHEELS

prepare() {
    set -e
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/*.whl
    # pydantic and its dependencies at the versions this checkout is tested with (fallback: known-good pins)
    local pins
    pins=$(python3 - <<'EOF'
from importlib import metadata
fallback = {"pydantic": "2.13.4", "pydantic_core": "2.46.4", "annotated_types": "0.7.0",
            "typing_inspection": "0.4.2", "typing_extensions": "4.16.0"}
out = []
for name, pin in fallback.items():
    try:
        out.append(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        out.append(f"{name}=={pin}")
print(" ".join(out))
EOF
)
    echo "downloading (cp312, manylinux x86_64): $pins"
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" $pins
    # the Rust extension as an abi3 wheel (loads on the machine's Python 3.12)
    local abi3
    abi3=$(ls -t dist/sglang_hybrid-*abi3*.whl 2>/dev/null | head -1 || true)
    local stale=""
    if [ -n "$abi3" ]; then   # a wheel older than the Rust sources or the Python wrapper would not match this tree
        stale=$(find rust_ngram/src rust_ngram_py rust_ngram/Cargo.toml Cargo.toml Cargo.lock sglang_hybrid/ngram.py \
                sglang_hybrid/_ngram.pyi -newer "$abi3" -type f 2>/dev/null | grep -v '/target/' | head -3 || true)
        if [ -n "$stale" ]; then
            echo "NOTE: $abi3 is older than: $(echo "$stale" | tr '\n' ' ')"
            if [ -f scripts/build_wheel.sh ]; then abi3=""; else
                echo "      and there is no scripts/build_wheel.sh to rebuild it: carrying it anyway; the reference-loop"
                echo "      check may fail on the device if the extension's interface changed since."
            fi
        fi
    fi
    if [ -z "$abi3" ] && [ -f scripts/build_wheel.sh ]; then
        echo "building the abi3 wheel with scripts/build_wheel.sh"
        abi3=$(bash scripts/build_wheel.sh | tail -1) || abi3=""   # its last line is the wheel's path
        [ -n "$abi3" ] || echo "NOTE: scripts/build_wheel.sh failed (output above)"
    fi
    if [ -n "$abi3" ]; then
        case "$abi3" in
            *x86_64*) cp "$abi3" "$WHEELS/" && echo "carrying $abi3" ;;
            *) echo "NOTE: $abi3 is not an x86_64 wheel; the GPU machine is x86_64, so it is NOT carried" ;;
        esac
    else
        echo "NOTE: no abi3 wheel of sglang_hybrid (dist/sglang_hybrid-*abi3*.whl) and no scripts/build_wheel.sh:"
        echo "      the reference-loop check (needs the Rust n-gram drafter) will be SKIPPED on the GPU machine."
    fi
    set +e
    python3 -m bench.device.carry --wheels "$WHEELS" || return 1
    cat <<EOF

Ready. The device call (run tool), from this checkout:
  command:   bash bench/device_run.sh
  carry:     ["$WHEELS"]
  timeout_s: 300
EOF
}

# Install what the carried wheels provide, only where it is missing (the GPU machine; not a machine with it).
use_wheels() {
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || return 0
    local tmp=${TMPDIR:-/tmp}
    if ! python3 -c "import pydantic" 2>/dev/null; then
        local site=$tmp/hybrid_device_site
        # shellcheck disable=SC2046
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            $(ls "$WHEELS"/*.whl | grep -v '/sglang_hybrid-') || { echo "pip install of the carried wheels failed"; return 1; }
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "pydantic from the carried wheels ($site)"
    fi
    if ! python3 -c "import sglang_hybrid._ngram" 2>/dev/null; then
        local whl ext=$tmp/hybrid_device_ext
        whl=$(ls "$WHEELS"/sglang_hybrid-*abi3*.whl 2>/dev/null | head -1 || true)
        if [ -n "$whl" ]; then
            rm -rf "$ext" && mkdir -p "$ext"
            python3 - "$whl" "$ext" <<'EOF'
import sys, zipfile
whl, ext = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("sglang_hybrid/_ngram") and n.endswith(".so")]
    for n in names:
        z.extract(n, ext)
print("Rust extension from the carried wheel:", ", ".join(names) or "NONE FOUND in " + whl)
EOF
            export HYBRID_DEVICE_EXT_DIR=$ext
        fi
    fi
}

case "${1:-}" in
    --prepare) prepare; exit $? ;;
    --check-carry) python3 -m bench.device.carry --wheels "$WHEELS"; exit $? ;;
    --cpu) export HYBRID_DEVICE_FORCE_CPU=1 ;;
    "") ;;
    *) echo "usage: bash bench/device_run.sh [--prepare | --check-carry | --cpu]"; exit 2 ;;
esac

OUT=${OUT:-out/device}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
use_wheels || exit 1
python3 -m bench.device 2>&1 | tee "$OUT/device_run.log"
exit "${PIPESTATUS[0]}"
