"""GPU-shaped step-time tables from a stated roofline (no GPU needed).

Why: the paper's numbers come from a 7-8B target on a datacenter GPU, where a decode step is memory-bound
(weights + KV cache read once per step) until enough tokens are verified to make it compute-bound, and where
CUDA graphs pad every step up to a captured size. A replay on this CPU machine can only *model* that regime;
this module makes the model explicit: every constant below is an assumption and is printed with the results.

The table maps "tokens verified in the whole batch" (n = sum over requests of 1 + verified draft nodes) to
seconds for one target forward, for a fixed number of requests R (the KV cache read depends on R, not on n).
It also gives the cost of one EAGLE draft step at batch R, so policies that run the model drafter pay for it.

Run ``python -m bench.cost_tables.roofline --out bench/cost_tables/h200_llama8b.json`` to regenerate the
shipped table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Optional

FORMAT = "hybrid-spark-cost-tables"


@dataclasses.dataclass(frozen=True)
class Roofline:
    """All assumptions of the GPU-shaped cost model (defaults: Llama-3.1-8B-shaped target on one H200)."""

    gpu: str = "H200-class (141 GB HBM3e)"
    hbm_bytes_per_s: float = 4.8e12          # peak HBM bandwidth
    hbm_efficiency: float = 0.75             # fraction of peak a decode step achieves
    bf16_flops: float = 989e12               # dense bf16 tensor-core peak
    flops_efficiency: float = 0.55           # fraction of peak the verify GEMMs achieve
    model: str = "Llama-3.1-8B-shaped target, bf16"
    weight_bytes: float = 16.06e9            # all weights in bf16
    embedding_bytes: float = 1.05e9          # input embedding table: only gathered rows are read
    linear_params: float = 7.50e9            # params touched per token by GEMMs (incl. lm_head, excl. embedding)
    n_layers: int = 32
    hidden: int = 4096
    n_kv_heads: int = 8
    head_dim: int = 128
    context_tokens: int = 2048               # KV-cache length per request read by every step
    step_overhead_s: float = 0.30e-3         # per target step: graph launch, sampling, scheduling not hidden
    eager_overhead_s: float = 1.5e-3         # extra when n exceeds the largest captured graph (eager launch)
    # EAGLE-3-style draft head: one decoder layer + fc over concatenated features + reduced-vocab lm_head.
    draft_params: float = 0.218e9 + 0.050e9 + 0.131e9   # layer + fc (3h->h) + 32k-vocab lm_head
    draft_step_overhead_s: float = 0.05e-3   # per draft step inside the draft CUDA graph
    graph_buckets: tuple = tuple(list(range(8, 257, 8)) + list(range(272, 513, 16))
                                 + list(range(544, 1025, 32)) + list(range(1088, 2049, 64)))
    #: how the memory and compute times combine: a p-norm ``(t_mem^p + t_flop^p)^(1/p)`` with this p (the smooth
    #: knee: near the ridge point a step is neither purely memory- nor compute-bound, so tokens are never free),
    #: or ``None`` for the hard ``max(t_mem, t_flop)`` of the textbook roofline
    knee_p: Optional[float] = 3.0

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, all layers, bf16."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 2

    def bucket(self, n: int) -> tuple[int, bool]:
        """Padded size of a step verifying n tokens, and whether a captured graph exists for it."""
        if not self.graph_buckets:
            return n, True
        for b in self.graph_buckets:
            if n <= b:
                return b, True
        return n, False

    def combine(self, t_mem: float, t_flop: float) -> float:
        """Memory and compute time of one forward combined by the knee (``knee_p``; None: the hard max)."""
        if self.knee_p is None:
            return max(t_mem, t_flop)
        p = float(self.knee_p)
        return (t_mem ** p + t_flop ** p) ** (1.0 / p)

    def target_step_s(self, n: int, requests: int, context_total: Optional[float] = None) -> float:
        """One target forward over n batch tokens for `requests` requests (each reading its KV prefix once).

        ``context_total``: the KV tokens of the whole batch (the sum of each request's real context length); None
        assumes ``context_tokens`` per request. Attention FLOPs use the batch's mean context per verified token."""
        if n < requests:
            raise ValueError(f"n={n} tokens cannot be fewer than requests={requests} (1 token per request)")
        ctx_total = requests * self.context_tokens if context_total is None else float(context_total)
        padded, graphed = self.bucket(n)
        bw = self.hbm_bytes_per_s * self.hbm_efficiency
        kv_bytes = ctx_total * self.kv_bytes_per_token
        mem_bytes = (self.weight_bytes - self.embedding_bytes) + kv_bytes
        attn_flops_per_token = 4.0 * (ctx_total / requests) * self.hidden * self.n_layers
        flops = padded * (2.0 * self.linear_params + attn_flops_per_token)
        t = self.combine(mem_bytes / bw, flops / (self.bf16_flops * self.flops_efficiency)) + self.step_overhead_s
        return t + (0.0 if graphed else self.eager_overhead_s)

    def draft_step_s(self, requests: int, context_total: Optional[float] = None) -> float:
        """One EAGLE draft step (one token per request) for `requests` requests (``context_total`` as in
        `target_step_s`)."""
        ctx_total = requests * self.context_tokens if context_total is None else float(context_total)
        bw = self.hbm_bytes_per_s * self.hbm_efficiency
        draft_kv = 2 * self.n_kv_heads * self.head_dim * 2  # one layer
        mem = 2.0 * self.draft_params + ctx_total * draft_kv
        flops = requests * 2.0 * self.draft_params
        return self.combine(mem / bw, flops / (self.bf16_flops * self.flops_efficiency)) + self.draft_step_overhead_s

    def _knee_text(self) -> str:
        if self.knee_p is None:
            return "hard max (textbook roofline: verified tokens are free up to the ridge point)"
        return (f"smooth knee, p-norm p={self.knee_p:g}, (t_mem^p + t_flop^p)^(1/p) (near the ridge point both "
                "costs show)")

    def _bucket_text(self) -> str:
        ragged = "Verify is ragged (n = sum over requests of 1 + verified draft nodes, as in DSpark's compact mode)"
        if not self.graph_buckets:
            return ragged + ", with no CUDA-graph padding (smooth roofline, a sensitivity variant)"
        b = self.graph_buckets
        return (ragged + f", padded up to a CUDA-graph token bucket ({b[0]}..256 step 8, ..512 step 16, ..1024 "
                f"step 32, ..{b[-1]} step 64); above that eager with +{self.eager_overhead_s * 1e3:.1f} ms")

    def assumptions(self) -> list[str]:
        """Human-readable list of every assumption, printed next to the results."""
        a = self
        return [
            f"GPU: {a.gpu}; HBM {a.hbm_bytes_per_s / 1e12:.1f} TB/s x {a.hbm_efficiency:.0%} achieved; "
            f"bf16 {a.bf16_flops / 1e12:.0f} TFLOP/s dense peak x {a.flops_efficiency:.0%} achieved",
            f"Target: {a.model}; weights {a.weight_bytes / 1e9:.2f} GB read per step (minus the "
            f"{a.embedding_bytes / 1e9:.2f} GB input embedding); {2 * a.linear_params / 1e9:.1f} GFLOP/token in GEMMs",
            f"KV cache: {a.n_layers} layers x {a.n_kv_heads} KV heads x {a.head_dim} dims bf16 = "
            f"{a.kv_bytes_per_token / 1024:.0f} KiB/token; each request's prefix read once per step (tree-verify "
            f"kernel tiles all of a request's queries together); the tables are at {a.context_tokens} context tokens "
            f"per request (the README's launch prices with them blended with the same roofline at an eighth of that, "
            f"as its two start-up probes), a replay step is charged at its requests' real contexts",
            f"Attention: {4 * a.context_tokens * a.hidden * a.n_layers / 1e9:.2f} GFLOP per verified token at that "
            "context",
            f"Step time = {a._knee_text()} of (bytes / achieved bandwidth, FLOPs on the padded token count / achieved "
            f"FLOP/s) + {a.step_overhead_s * 1e3:.2f} ms fixed per step",
            self._bucket_text(),
            f"EAGLE draft step: EAGLE-3-style head ({a.draft_params / 1e9:.2f} B params: 1 layer + fc + 32k-vocab "
            f"lm_head) + its 1-layer KV at the same context, same roofline, +{a.draft_step_overhead_s * 1e3:.2f} ms; "
            "a policy that drafts k model tokens pays k draft steps, as SGLang 0.5.23 runs them (the draft-extend "
            "after verify + k - 1 draft decodes; bench.replay.policies.draft_forwards)",
            "Host-side drafting (n-gram, prompt lookup) and each engine's own per-step kernel launches are not in "
            "these tables: the replay charges them per policy (bench.replay.host)",
        ]


def build_tables(roof: Roofline, batch_sizes=(4, 32, 128), max_width: int = 17) -> dict:
    """Per batch size R: T(n) for n = R .. R * max_width (every integer), plus the draft-step cost."""
    tables = {}
    for r in batch_sizes:
        ns = list(range(r, r * max_width + 1))
        tables[str(r)] = {
            "requests": r,
            "tokens": ns,
            "seconds": [roof.target_step_s(n, r) for n in ns],
            "draft_step_seconds": roof.draft_step_s(r),
        }
    return {
        "format": FORMAT,
        "version": 1,
        "source": "roofline (simulated, not measured)",
        "description": "GPU-shaped step times for a 7-8B target on an H200-class GPU",
        "assumptions": roof.assumptions(),
        "roofline": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(roof).items()},
        "tables": tables,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("h200_llama8b.json"))
    p.add_argument("--context", type=int, default=Roofline.context_tokens)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 32, 128])
    p.add_argument("--no-buckets", action="store_true", help="no CUDA-graph padding (smooth roofline)")
    args = p.parse_args(argv)
    roof = Roofline(context_tokens=args.context, **({"graph_buckets": ()} if args.no_buckets else {}))
    doc = build_tables(roof, args.batch_sizes)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for line in roof.assumptions():
        print(" -", line)
    for r, t in doc["tables"].items():
        s = t["seconds"]
        print(f"R={r}: T(R)={s[0] * 1e3:.2f} ms  T(2R)={s[r_i(t, 2)] * 1e3:.2f} ms  "
              f"T(5R)={s[r_i(t, 5)] * 1e3:.2f} ms  T(9R)={s[r_i(t, 9)] * 1e3:.2f} ms  "
              f"draft step {t['draft_step_seconds'] * 1e3:.3f} ms")
    print(f"wrote {args.out}")
    return 0


def r_i(table: dict, mult: int) -> int:
    """Index of n = mult * R in a table's token list."""
    return min(len(table["tokens"]) - 1, (mult - 1) * table["requests"])


if __name__ == "__main__":
    raise SystemExit(main())
