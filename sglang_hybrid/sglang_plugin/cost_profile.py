"""Cost table for a deployment from SGLang's own one-batch benchmark: ``python -m sglang_hybrid.sglang_plugin.cost_profile``.

Why this source: HYBRID's price needs ``T(n)``, the time of one target forward over ``n`` batch tokens on *this* GPU,
model, attention backend and CUDA-graph buckets. ``sglang.benchmark.one_batch_server`` measures plain decoding at
fixed batch sizes against a running server; at batch size ``b`` each step runs ``b`` tokens and the server reports
its decode throughput ``last_gen_throughput`` (tokens/s), so ``T(b) = b / last_gen_throughput``. A verify step of
``R`` requests x ``W`` tokens runs ``R * W`` tokens with ``R`` KV contexts rather than ``R * W``, so this slightly
overstates attention cost at long context; it keeps the shape that matters (flat while memory-bound, rising once
compute-bound, steps at graph buckets).

    python -m sglang.launch_server --model-path M --port 30000 --max-running-requests 512 &
    python -m sglang.benchmark.one_batch_server --model None --base-url http://localhost:30000 \
        --batch-size 1 2 4 8 16 32 64 128 256 512 --input-len 1024 --output-len 64 --result-filename raw.jsonl
    python -m sglang_hybrid.sglang_plugin.cost_profile raw.jsonl --out cost.json
    SGLANG_HYBRID_COST_TABLE=cost.json python -m sglang.launch_server ... --speculative-algorithm HYBRID
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from sglang_hybrid.cost import CostModel


def cost_from_one_batch(path) -> CostModel:
    """``CostModel`` from a ``one_batch_server --result-filename`` JSONL (one line per batch size; the median of
    repeated batch sizes is used)."""
    by_bs: dict = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            bs, thr = int(rec["batch_size"]), float(rec["last_gen_throughput"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a one_batch_server result line ({e})") from None
        if thr <= 0:
            raise ValueError(f"{path}:{n}: last_gen_throughput {thr} (the server reported no decode throughput; "
                             "use a longer --output-len)")
        by_bs.setdefault(bs, []).append(bs / thr)
    if not by_bs:
        raise ValueError(f"{path}: no result lines")
    sizes = sorted(by_bs)
    secs = [sorted(by_bs[b])[len(by_bs[b]) // 2] for b in sizes]
    return CostModel(sizes, secs, {"source": "sglang.benchmark.one_batch_server", "file": str(path),
                                   "rule": "T(b) = b / last_gen_throughput"})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="one_batch_server --result-filename JSONL")
    ap.add_argument("--out", required=True, help="cost table JSON to write (SGLANG_HYBRID_COST_TABLE)")
    args = ap.parse_args(argv)
    model = cost_from_one_batch(args.results)
    model.save(args.out)
    print(f"wrote {args.out}: sizes {model.to_json()['sizes']}")


if __name__ == "__main__":
    main()
