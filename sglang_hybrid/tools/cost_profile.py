"""Cost table for a deployment from SGLang's own one-batch benchmark.

Run: ``python -m sglang_hybrid.tools.cost_profile RESULTS.jsonl --out cost.json``.

Why this source: HYBRID's price needs ``T(n)``, the time of one target forward over ``n`` batch tokens on *this* GPU,
model, attention backend and CUDA-graph buckets. ``sglang.benchmark.one_batch_server`` measures plain decoding at
fixed batch sizes against a running server; ``sglang_hybrid.cost.cost_from_one_batch`` turns its results into a table
(``T(b) = b / last_gen_throughput``; its docstring says where that is approximate).

    python -m sglang.launch_server --model-path M --port 30000 --max-running-requests 512 &
    python -m sglang.benchmark.one_batch_server --model None --base-url http://localhost:30000 \\
        --batch-size 1 2 4 8 16 32 64 128 256 512 --input-len 1024 --output-len 64 --result-filename raw.jsonl
    python -m sglang_hybrid.tools.cost_profile raw.jsonl --out cost.json
    SGLANG_HYBRID_COST_TABLE=cost.json python -m sglang.launch_server ... --speculative-algorithm HYBRID
"""
from __future__ import annotations

import argparse
from typing import Optional

from sglang_hybrid.cost import cost_from_one_batch


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.cost_profile",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="one_batch_server --result-filename JSONL")
    ap.add_argument("--out", required=True, help="cost table JSON to write (SGLANG_HYBRID_COST_TABLE)")
    args = ap.parse_args(argv)
    model = cost_from_one_batch(args.results)
    model.save(args.out)
    print(f"wrote {args.out}: sizes {model.to_json()['sizes']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
