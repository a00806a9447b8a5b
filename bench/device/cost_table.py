"""Measured step-time tables: a Llama-3.1-8B-shaped bf16 target verifying ``B x W`` tree tokens at 2k context.

    python -m bench.device.cost_table                       # GPU: the full grid; no GPU: the CPU smoke grid
    python -m bench.device.cost_table --core-table 32 IN.json OUT.json   # one batch -> the core's CostModel file
    python -m bench.device.cost_table --draft-table IN.json OUT.json      # draft step by batch -> draft_cost_table

For batch ``B`` in {1, 4, 16, 32, 64, 128} and verify width ``W`` in {1, 2, 4, 8, 13, 16} one target forward (the
compact decoder of ``bench.device.decoder``, random weights, NOT SGLang) is captured in a CUDA graph and replayed;
the median of the replays is ``T(B * W)``. Every request has ``ctx = 2048`` cached tokens and verifies a ``W``-node
tree (two branches under the root) with ``scaled_dot_product_attention`` and a boolean tree mask. The EAGLE draft
step (an EAGLE-3-shaped one-layer head over one token per request, same context) is measured per batch the same way.

Output, ``cost_tables.json``: the replay's per-batch format (``hybrid-spark-cost-tables``: for each ``B``,
``tokens = B * W``, ``seconds`` -- a running maximum of the raw medians, kept in ``raw_seconds``, so the core's
``CostModel`` accepts it -- and ``draft_step_seconds``), read by ``python -m bench.replay --cost-table FILE``; each
batch's ``(tokens, seconds)`` is a valid ``sglang_hybrid.cost.CostModel`` (checked before writing), and
``--core-table B`` writes that batch as the core's own file (``hybrid-spark-cost``, the worker's ``cost_table``
setting), and ``--draft-table`` writes the draft step time by batch size as the core's file for the worker's
``draft_cost_table`` setting (adaptive drafting). ``cost_tables.png``: step time against verified tokens per batch.

Without a GPU the same code runs a tiny fp32 decoder on the CPU at a few sizes, eagerly: it checks the plumbing and the
file format, and its file says plainly that it is a CPU smoke table, not a GPU measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.device import _env
from bench.device.decoder import EAGLE3_DRAFT_VOCAB, LLAMA_8B, TINY, EagleDraft, Target, tree_mask

FORMAT = "hybrid-spark-cost-tables"
GPU_GRID = dict(batches=(1, 4, 16, 32, 64, 128), widths=(1, 2, 4, 8, 13, 16), ctx=2048, iters=20)
CPU_GRID = dict(batches=(1, 4), widths=(1, 4, 13), ctx=64, iters=2)
SOURCE_GPU = "measured on a GPU with a compact PyTorch decoder (random weights; not SGLang)"
SOURCE_CPU = "CPU smoke run of bench/device (tiny decoder on the CPU): NOT a GPU table, do not price with it"


def _time(fn, on_gpu: bool, iters: int) -> float:
    """Median seconds of ``fn``: CUDA-graph replays timed with events on the GPU, wall time on the CPU."""
    if on_gpu:
        graph, _ = _env.capture(fn)
        ms = _env.cuda_ms(graph.replay, iters)
        del graph
        return _env.median(ms) / 1e3
    fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return _env.median(ts)


def measure(on_gpu: bool, grid: dict | None = None, log=print) -> dict:
    grid = dict(grid or (GPU_GRID if on_gpu else CPU_GRID))
    dev = torch.device("cuda" if on_gpu else "cpu")
    dims, dtype = (LLAMA_8B, torch.bfloat16) if on_gpu else (TINY, torch.float32)
    draft_vocab = EAGLE3_DRAFT_VOCAB if on_gpu else 256
    ctx, batches, widths = grid["ctx"], tuple(grid["batches"]), tuple(grid["widths"])
    t_start = time.perf_counter()
    target = Target(dims, dev, dtype, max(batches), ctx + max(widths))
    draft = EagleDraft(dims, draft_vocab, dev, dtype, max(batches), ctx + 1)
    g = torch.Generator(device=dev).manual_seed(0)
    tables = {}
    # one attention kernel for every shape: memory-efficient SDPA (takes a boolean mask; FlashAttention does not)
    kernels = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if on_gpu else [SDPBackend.MATH]
    with torch.inference_mode(), sdpa_kernel(kernels):
        for b in batches:
            raw = []
            for w in widths:
                tokens = torch.randint(0, dims.vocab, (b, w), device=dev, generator=g)
                mask, depth = tree_mask(b, w, ctx, dev)
                positions = (ctx + depth)[None].expand(b, w).contiguous()
                raw.append(_time(lambda: target.verify(tokens, positions, mask, ctx), on_gpu, grid["iters"]))
                if on_gpu:
                    log(f"  target  B={b:<4} W={w:<3} tokens={b * w:<5} {raw[-1] * 1e3:8.3f} ms")
            tok1 = torch.randint(0, dims.vocab, (b, 1), device=dev, generator=g)
            hid3 = torch.randn(b, 1, 3 * dims.hidden, device=dev, dtype=dtype, generator=g)
            pos1 = torch.full((b, 1), ctx, device=dev, dtype=torch.int64)
            t_draft = _time(lambda: draft.step(tok1, hid3, pos1, ctx), on_gpu, grid["iters"])
            if on_gpu:
                log(f"  draft   B={b:<4} one EAGLE-3 step {t_draft * 1e3:8.3f} ms")
            secs = [max(raw[: i + 1]) for i in range(len(raw))]   # a larger step never costs less (timing noise)
            tables[str(b)] = {"requests": b, "widths": list(widths), "tokens": [b * w for w in widths],
                              "seconds": secs, "raw_seconds": raw, "draft_step_seconds": t_draft}
    target = draft = None  # free the weights and caches before the next job
    if on_gpu:
        torch.cuda.empty_cache()
    env = _env.environment()
    shape = (f"Llama-3.1-8B-shaped target ({dims.params / 1e9:.2f} B params, bf16, random weights)" if on_gpu
             else f"tiny decoder (hidden {dims.hidden}, {dims.layers} layers, fp32) on the CPU")
    doc = {
        "format": FORMAT, "version": 1,
        "source": SOURCE_GPU if on_gpu else SOURCE_CPU,
        "description": f"{shape}; {env['gpu'] or 'no GPU'}; torch {env['torch']}",
        "assumptions": [
            "NOT SGLang: a compact PyTorch decoder (bench/device/decoder.py) with dense bf16 GEMMs, a contiguous "
            "KV cache and torch scaled_dot_product_attention (memory-efficient kernel) with a boolean tree mask "
            "(not FlashInfer/FA3, no paged KV, no fused kernels); random weights (step time does not depend on "
            "them)",
            f"every request has {ctx} cached tokens and verifies a W-node tree (two branches under the root); "
            "n = requests x W tokens per forward, logits for every verified token",
            ("each (B, W) forward captured in a CUDA graph and replayed; median of "
             f"{grid['iters']} replays timed with CUDA events") if on_gpu else
            f"eager CPU forwards, median of {grid['iters']} wall-clock runs (smoke only)",
            "seconds: running maximum of the raw medians (raw_seconds); linear interpolation in between",
            f"EAGLE draft step: EAGLE-3-shaped head (fc 3h->h, one layer with 2h-wide attention input, "
            f"{draft_vocab}-token head) over one token per request with its own KV at the same context; a policy "
            "drafting k model tokens pays k + 1 steps",
            "n-gram drafting cost not charged (host-side, overlapped)",
        ],
        "environment": env, "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()},
        "profile_seconds": round(time.perf_counter() - t_start, 1),
        "tables": tables,
    }
    check(doc)
    return doc


def check(doc: dict) -> None:
    """Every batch's table must be a valid core CostModel and the file must load in the replay."""
    from sglang_hybrid.cost import CostModel

    for b, t in doc["tables"].items():
        CostModel(t["tokens"], t["seconds"])


def core_table(doc: dict, batch: int) -> dict:
    """One batch's table as the core's ``hybrid-spark-cost`` file (the worker's ``cost_table`` setting)."""
    from sglang_hybrid.cost import CostModel

    t = doc["tables"][str(batch)]
    meta = {"source": doc["source"], "description": doc["description"], "requests": batch,
            "draft_step_seconds": t["draft_step_seconds"], "assumptions": doc["assumptions"]}
    return CostModel(t["tokens"], t["seconds"], meta).to_json()


def draft_table(doc: dict) -> dict:
    """The EAGLE draft step time by batch size as the core's ``hybrid-spark-cost`` file (``draft_cost_table``: one
    draft forward of ``B`` requests takes ``T(B)``)."""
    from sglang_hybrid.cost import CostModel

    batches = sorted(int(b) for b in doc["tables"])
    secs = [float(doc["tables"][str(b)]["draft_step_seconds"]) for b in batches]
    secs = [max(secs[:i + 1]) for i in range(len(secs))]      # running maximum: timing noise must not decrease T
    meta = {"source": doc["source"], "description": doc["description"], "what": "one EAGLE draft forward by batch"}
    return CostModel(batches, secs, meta).to_json()


def plot(doc: dict, path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no plot: matplotlib missing (python -m bench.device.cost_table --plot {path.with_suffix('.json')})"
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for b, t in doc["tables"].items():
        ax[0].plot(t["tokens"], [s * 1e3 for s in t["raw_seconds"]], "o-", label=f"B={b}")
        ax[1].plot(t["widths"], [s / t["raw_seconds"][0] for s in t["raw_seconds"]], "o-", label=f"B={b}")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("verified tokens per step n = B x W")
    ax[0].set_ylabel("target step time (ms)")
    ax[1].set_xlabel("verify width W (tokens per request)")
    ax[1].set_ylabel("T(B x W) / T(B x 1)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    title = doc["description"] + ("  [CPU SMOKE, not a GPU table]" if doc["source"] == SOURCE_CPU else "")
    fig.suptitle(title + "\n" + doc["source"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def run(log=print) -> dict:
    on_gpu = _env.gpu()
    log(f"[cost_table] {'GPU: ' + torch.cuda.get_device_name(0) if on_gpu else 'CPU smoke (no GPU)'}")
    doc = measure(on_gpu, log=log)
    path = _env.write_json("cost_tables.json", doc)
    png = plot(doc, _env.out_dir() / "cost_tables.png")
    if on_gpu:
        log(f"[cost_table] wrote {path} and {png}; {doc['profile_seconds']} s")
    else:
        log(f"[cost_table] CPU smoke table (tiny decoder, not a GPU number) written to {path}: "
            f"{len(doc['tables'])} batches x {len(doc['grid']['widths'])} widths, each a valid CostModel; plot {png}")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--core-table", nargs=3, metavar=("BATCH", "IN", "OUT"),
                    help="write batch BATCH of the per-batch file IN as the core's CostModel file OUT")
    ap.add_argument("--draft-table", nargs=2, metavar=("IN", "OUT"),
                    help="write the draft step time by batch of the per-batch file IN as the core's CostModel file OUT "
                         "(the worker's draft_cost_table)")
    ap.add_argument("--plot", metavar="IN", help="plot an existing cost_tables.json next to it")
    args = ap.parse_args(argv)
    if args.draft_table:
        src, dst = args.draft_table
        with open(dst, "w") as f:
            f.write(json.dumps(draft_table(json.loads(open(src).read())), indent=1) + "\n")
        print(f"wrote {dst} (draft step by batch of {src})")
        return 0
    if args.core_table:
        b, src, dst = args.core_table
        doc = json.loads(open(src).read())
        with open(dst, "w") as f:
            f.write(json.dumps(core_table(doc, int(b)), indent=1) + "\n")
        print(f"wrote {dst} (batch {b} of {src})")
        return 0
    if args.plot:
        from pathlib import Path

        src = Path(args.plot)
        print(plot(json.loads(src.read_text()), src.with_suffix(".png")))
        return 0
    run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
