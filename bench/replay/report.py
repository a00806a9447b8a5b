"""The replay's report: per-cell tables, the paper's layout with its targets met or missed, and plots."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

PUBLISHED = {  # Hybrid Spark paper, HYBRID / DSpark output throughput (DESIGN.md section 3)
    "code_b4": (1.10, 1.62),
    "code_b128": (1.04, 1.27),
    "chat_t0": (0.97, 1.01),
}
TARGETS = {"code_b4": 1.62, "code_b128": 1.27, "chat_t0": 1.00}


def fmt_table(results: list) -> str:
    base = {r.policy: r for r in results}.get("no_spec")
    head = f"{'policy':<18}{'tok/s':>10}{'vs no-spec':>11}{'acc/step':>10}{'tok/step':>10}{'verified':>10}{'ngram%':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        sp = r.tok_per_s / base.tok_per_s if base and base.tok_per_s else float("nan")
        lines.append(f"{r.policy:<18}{r.tok_per_s:>10.1f}{sp:>10.2f}x{r.accepted_per_step:>10.2f}"
                     f"{r.tokens_per_step:>10.2f}{r.verified_per_step:>10.2f}{100 * r.ngram_share:>7.0f}%")
    return "\n".join(lines)


def ratio(results: dict, key, num: str, den: str = "model_adaptive") -> Optional[float]:
    a, b = results.get(key + (num,)), results.get(key + (den,))
    if a is None or b is None or b.tok_per_s == 0:
        return None
    return a.tok_per_s / b.tok_per_s


def paper_layout(results: dict, cost: str, temps: list, batches: list) -> tuple[str, list]:
    """HYBRID / model-only adaptive throughput beside the published ranges, and the targets met or missed."""
    lines = [f"Paper layout ({cost}): HYBRID / model-only adaptive output throughput",
             f"{'row':<26}{'published':>12}{'choose':>12}{'merge':>12}{'target':>9}  verdict"]
    verdicts = []
    t0 = 0.0 if 0.0 in temps else None
    rows = []
    if t0 is not None:
        if 4 in batches:
            rows.append(("code editing, batch 4", "code_b4", [("code", t0, 4)]))
        if 128 in batches:
            rows.append(("code editing, batch 128", "code_b128", [("code", t0, 128)]))
        rows.append(("chat, temperature 0", "chat_t0", [("chat", t0, b) for b in batches]))
    for title, key, cells in rows:
        if len(cells) > 1:  # the chat row spans the batch sizes this cost model has results for
            cells = [c for c in cells if ratio(results, (cost,) + c, "hybrid_choose") is not None] or cells
        ch = [ratio(results, (cost,) + c, "hybrid_choose") for c in cells]
        me = [ratio(results, (cost,) + c, "hybrid_merge") for c in cells]
        if any(v is None for v in ch + me):
            lines.append(f"{title:<26}  (missing results)")
            continue
        lo, hi = PUBLISHED[key]
        rng = lambda v: f"{min(v):.2f}" if len(v) == 1 else f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
        met = {m: min(v) >= TARGETS[key] for m, v in (("choose", ch), ("merge", me))}
        verdict = ", ".join(f"{m} {'MET' if ok else 'MISSED'}" for m, ok in met.items())
        lines.append(f"{title:<26}{lo:>6.2f}-{hi:.2f}x{rng(ch):>12}{rng(me):>12}"
                     f"{'>=' + format(TARGETS[key], '.2f'):>9}  {verdict}"
                     + ("  (worst batch counts)" if len(cells) > 1 else ""))
        for m, v in (("choose", ch), ("merge", me)):
            verdicts.append((f"{cost}: {title}: HYBRID {m} / model-only >= {TARGETS[key]:.2f}x", met[m],
                             f"{rng(v)}" + (f" over batches {[c[2] for c in cells]}" if len(cells) > 1 else "")))
    return "\n".join(lines), verdicts


def merge_vs_choose(results: dict, cost: str):
    """(verdict name, met, detail) for "merge >= choose in every cell" under one cost model, or None."""
    worst = None
    for key, r in results.items():
        if key[0] != cost or key[4] != "hybrid_merge":
            continue
        c = results.get(key[:4] + ("hybrid_choose",))
        if c is None or c.tok_per_s == 0:
            continue
        q = r.tok_per_s / c.tok_per_s
        if worst is None or q < worst[0]:
            worst = (q, key)
    if worst is None:
        return None
    _, w, t, b, _ = worst[1]
    return (f"{cost}: HYBRID merge >= choose everywhere", worst[0] >= 1.0,
            f"worst merge/choose = {worst[0]:.3f} ({w}, T={t:g}, B={b})")


def plot(results: dict, path: Path, cost: str, workloads, temps, batches, policies) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cells = [(w, t, b) for w in workloads for t in temps for b in batches
             if (cost, w, t, b, "no_spec") in results]
    if not cells:
        return None
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 4.2), sharey=False, squeeze=False)
    for ax, (w, t, b) in zip(axes[0], cells):
        base = results[(cost, w, t, b, "no_spec")].tok_per_s
        names = [p for p in policies if (cost, w, t, b, p) in results]
        vals = [results[(cost, w, t, b, p)].tok_per_s / base for p in names]
        colors = ["#d62728" if p.startswith("hybrid") else "#1f77b4" if p == "model_adaptive" else "#7f7f7f"
                  for p in names]
        ax.barh(range(len(names)), vals, color=colors)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names if ax is axes[0][0] else [""] * len(names), fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.5)
        ax.set_title(f"{w} T={t:g} B={b}", fontsize=9)
        ax.set_xlabel("speedup vs no speculation", fontsize=8)
    fig.suptitle(f"Replay throughput, cost model: {cost}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def hybrid_ahead(results: dict, cost: str, temps: list, batches: list, policies) -> list:
    """(verdict name, met, detail) per mixed-workload cell of a measured cost model: is the better HYBRID policy
    faster than every other policy?"""
    verdicts = []
    for temp in temps:
        for b in batches:
            cell = {p: results.get((cost, "mixed", temp, b, p)) for p in policies}
            cell = {p: r for p, r in cell.items() if r is not None}
            if "hybrid_choose" not in cell and "hybrid_merge" not in cell:
                continue
            hy = max((cell[p] for p in ("hybrid_choose", "hybrid_merge") if p in cell),
                     key=lambda r: r.tok_per_s)
            rivals = [r for p, r in cell.items() if not p.startswith("hybrid")]
            best = max(rivals, key=lambda r: r.tok_per_s)
            verdicts.append((f"{cost}: HYBRID ahead of every other policy, mixed T={temp:g} B={b}",
                             hy.tok_per_s > best.tok_per_s,
                             f"{hy.policy} {hy.tok_per_s:.1f} tok/s vs best other {best.policy} "
                             f"{best.tok_per_s:.1f} ({hy.tok_per_s / best.tok_per_s:.3f}x)"))
    return verdicts
