"""Measure the CPU cost table for SmolLM2-135M-Instruct (the reference loop's target) on this machine.

Why measured: the replay's "CPU" column must reflect what the CPU reference loop really pays per step, so the table
is the median wall time of real forwards -- the target verifying n batch tokens over a KV cache, and one EAGLE draft
step -- profiled with the core's `sglang_hybrid.cost.profile` helper. Kept short (a few minutes on 2 cores): a few
probe widths per batch size, linear interpolation in between (the core's CostModel), and a KV cache built by one
prefill that is expanded to the batch (timings do not depend on the cached values).

Run ``python -m bench.cost_tables.profile_cpu`` (writes bench/cost_tables/cpu_smollm2.json).

``python -m bench.cost_tables.profile_cpu --loop-table`` instead measures the *reference loop's* table, the one the
demo prices with and ships inside the package (``sglang_hybrid/data/cpu_cost_smollm2.json``, see
``sglang_hybrid.reference.costs``): one request's verify forward, the batched lm_head draft read and one head step,
minimum over interleaved repeats, monotone (PAV) fit. By default it times CPU time on one thread (``--clock cpu``),
which other jobs time-slicing the cores do not inflate; ``--clock wall --threads 2`` measures what the demo's two
threads see, on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

FORMAT = "hybrid-spark-cost-tables"
OUT = Path(__file__).with_name("cpu_smollm2.json")


def _target_forward(model, cache, context: int, batch: int, width: int) -> None:
    """One target forward verifying `width` new tokens per request over a `context`-token cache, then roll back."""
    ids = torch.randint(0, model.config.vocab_size, (batch, width))
    pos = torch.arange(context, context + width).expand(batch, width)
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
    cache.crop(-width)  # drop the tokens just verified


def profile_batch(model, head, batch: int, context: int, widths, repeats: int, warmup: int) -> dict:
    from transformers import DynamicCache

    from sglang_hybrid.cost import profile

    prompt = torch.randint(0, model.config.vocab_size, (1, context))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(batch)

    t0 = time.perf_counter()
    sizes, secs = [], []
    for w in widths:  # one probe size per call, so the monotonicity check happens below, after all sizes
        cm = profile(lambda n: _target_forward(model, cache, context, batch, n // batch), [batch * w],
                     warmup=warmup, repeats=repeats)
        sizes.append(batch * w)
        secs.append(float(cm.seconds[0]))
    t_target = time.perf_counter() - t0
    raw = list(secs)
    for i in range(1, len(secs)):  # timing noise on a shared machine: a larger forward never costs less
        secs[i] = max(secs[i], secs[i - 1])

    # One EAGLE draft step: the head (fc + 1 layer) over one token per request with its own KV at the same context,
    # then the target's lm_head (shared) -- the work the reference loop does per drafted token.
    h = model.config.hidden_size
    d = head.dims
    hk = torch.zeros(batch, d.num_kv_heads, context, d.head_dim)
    hv = torch.zeros_like(hk)

    def draft_step(_n):
        with torch.no_grad():
            x = torch.randn(batch, 1, h)
            g, _ = head(x, x, torch.full((batch, 1), context), cache=(hk, hv))
            model.lm_head(g).argmax(-1)

    dm = profile(draft_step, [batch], warmup=warmup, repeats=max(5, repeats))
    return {"requests": batch, "tokens": sizes, "seconds": secs, "raw_seconds": raw,
            "draft_step_seconds": float(dm.seconds[0]), "profile_seconds": round(t_target, 1)}


def write(path: Path, name: str, dtype: str, args, tables: dict) -> None:
    """Write the table file (after every batch size, so an interrupted run keeps what it measured)."""
    doc = {
        "format": FORMAT, "version": 1, "source": "measured on this machine",
        "description": f"{name} ({dtype}) on CPU, torch {torch.__version__}, {args.threads} threads",
        "assumptions": [
            f"measured: {name} {dtype} forward on {platform.processor() or platform.machine()} "
            f"({os.cpu_count()} cores visible, torch threads {args.threads}); dates per batch in 'measured'",
            f"each request has a {args.context}-token KV cache; n = requests x width tokens verified per forward, "
            f"median of {args.repeats} after {args.warmup} warm-up; linear interpolation between probe sizes, "
            "last slope beyond the largest; a probe timed below a smaller one (noise) is raised to it (running max; "
            "raw medians kept in raw_seconds)",
            "EAGLE draft step: the reference head (fc + 1 layer, SmolLM2 dims) + the target lm_head, one token per "
            "request; a policy drafting k model tokens pays k + 1 steps",
            "the machine is shared by other jobs: timings carry their noise; n-gram drafting cost not charged",
        ],
        "tables": tables,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--context", type=int, default=384, help="KV-cache tokens per request")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 32, 128])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default 1, steadier when other jobs share the cores; "
                         "--loop-table --clock wall: 2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--update", action="store_true", help="keep batch sizes already in --out, measure the others")
    ap.add_argument("--loop-table", action="store_true",
                    help="measure the reference loop's cost table (sglang_hybrid.reference.costs) instead; --out "
                         "defaults to the packaged sglang_hybrid/data/cpu_cost_smollm2.json, --threads to 2 "
                         "(the demo's)")
    ap.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                    help="--loop-table: time CPU time on 1 thread (default; robust on a shared machine) or wall time")
    args = ap.parse_args(argv)
    if args.loop_table:
        return loop_table(args)
    args.threads = args.threads or 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from sglang_hybrid.reference.eagle import new_head
    from sglang_hybrid.reference.models import load_smollm2

    lm = load_smollm2()
    model = lm.model
    head = new_head(model.config).eval()
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    widths = {4: [1, 2, 3, 5, 9, 17], 32: [1, 2, 3, 5, 9, 17], 128: [1, 2, 3, 5, 9]}
    tables = {}
    if args.update and args.out.is_file():
        tables = json.loads(args.out.read_text()).get("tables", {})
    for b in args.batch_sizes:
        if str(b) in tables:
            print(f"batch {b}: kept from {args.out}")
            continue
        w = widths.get(b, [1, 2, 3, 5, 9])
        print(f"profiling batch {b} (widths {w}) over {args.context} cached tokens ...", flush=True)
        t = profile_batch(model, head, b, args.context, w, args.repeats, args.warmup)
        t["measured"] = time.strftime("%Y-%m-%d %H:%M")
        tables[str(b)] = t
        print("  " + "  ".join(f"T({n})={s * 1e3:.1f}ms" for n, s in zip(t["tokens"], t["seconds"]))
              + f"  draft step {t['draft_step_seconds'] * 1e3:.1f} ms", flush=True)
        write(args.out, lm.name, dtype, args, tables)
    print(f"wrote {args.out}")
    return 0


def loop_table(args) -> int:
    """The demo's shipped table: ``profile_loop_costs`` with the shipped head, drafting in the demo's dtype."""
    from sglang_hybrid.reference import costs
    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2
    from sglang_hybrid.tools.demo import cpu_has_bf16
    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT

    threads = 1 if args.clock == "cpu" else (args.threads or 2)
    torch.set_num_threads(threads)
    out = args.out if args.out != OUT else costs.DEFAULT_PATH
    lm = load_smollm2()
    head = load_head(DEFAULT_OUT, lm.model.config) if (DEFAULT_OUT / "model.safetensors").is_file() else None
    dd = torch.bfloat16 if cpu_has_bf16() else torch.float32
    print(f"profiling the reference loop's costs ({threads} threads, {args.clock} clock, drafting in {dd}, "
          f"{max(args.repeats, 5)} rounds) ...", flush=True)
    t = costs.profile_loop_costs(lm.model, head, context=args.context, repeats=max(args.repeats, 5),
                                 draft_dtype=dd, threads=threads, clock=args.clock)
    t.meta["load_average"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    t.save(out)
    print("  verify " + "  ".join(f"T({n})={s * 1e3:.1f}ms" for n, s in zip(t.verify.sizes, t.verify.seconds)))
    print("  draft lm_head " + "  ".join(f"A={n}:{s * 1e3:.1f}ms" for n, s in zip(t.draft_lm.sizes,
                                                                                  t.draft_lm.seconds))
          + f"  head step {t.draft_head * 1e3:.2f}ms")
    print(f"wrote {out} ({t.meta['profile_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
