"""Check the shipped calibrations -- n-gram and model drafter -- on a real model's own outputs.

Run: ``python -m sglang_hybrid.tools.calibration_check``.

Why: the default ``NgramCalibration`` is fit once on general text (ShareGPT answers, HumanEval, stdlib, package
releases; see ``sglang_hybrid.tools.calibrate``). In serving, the "text" the drafter is judged against is the *target
model's* greedy output, whose repetitiveness differs per workload (a small model editing code copies a lot of its
prompt; in chat it loops). The selector turns the per-token estimates into survivals and an expected number of
accepted tokens per step, so a workload where the table is off shifts which drafter wins. This module measures that
error on a reference-loop trace (``sglang_hybrid.reference.trace``, greedy ``temperature == 0``):

* records: every output is replayed through ``NgramDrafter`` with ``calibration_replay.replay_document`` -- the very
  rule the default was fit with (a draft is accepted iff it equals the model's actual next token; records stop at the
  first miss, so they are conditional, exactly what ``a_j`` estimates);
* per workload x per position: n, mean predicted, hit rate, ECE and Brier, *before* (raw ``count / total``) and
  *after* (the calibrated table); ECE also with its noise floor (the ECE a perfectly calibrated predictor would show at
  this n) and a bootstrap interval over documents, because a trace has few documents;
* per step: expected accepted tokens ``sum_j prod_{i<=j} a_i`` over the whole proposed chain (untested drafts after a
  miss included -- the selector sees them too) versus the realised number of accepted drafts;
* a reliability plot (predicted vs observed per bin, one line per workload, before and after) as a PNG.

The drafter passed to ``replay_document`` is wrapped by ``_RecordingDrafter``, which keeps each step's full proposed
chain; the records themselves come unchanged from ``calibration_replay``.

The model drafter (EAGLE) side, beside it: the trace's per-position EAGLE chains give one record per tested draft
token (``calibration_replay.model_records_from_trace``: draft probability, depth, hit; conditional, like the n-gram
records), and the same per-workload x per-position table compares *raw* = the head's softmax probability of the
drafted token with *cal* = the ``ModelCalibration`` (per-depth temperature; default: the one shipped for the shipped
head, ``sglang_hybrid/data/model_calibration.json``, fit by ``tools.calibrate --model-out`` on a different trace).
A summary line per side (n-gram, model) closes the report.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.calibration_metrics import brier, ece
from sglang_hybrid.calibration_records import ModelRecords, NgramRecords
from sglang_hybrid.calibration_replay import model_records_from_trace, replay_document, trace_documents

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_TRACE = Path("out/traces/smollm2_t0.jsonl")
DEFAULT_OUT = Path("out/calibration_check")
DEFAULT_MODEL_CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "model_calibration.json"
N_BINS = 10


# ------------------------------------------------------------------------------------------------------------------
# replay (records from calibration_replay.replay_document + the full chain of every step)
# ------------------------------------------------------------------------------------------------------------------

class _RecordingDrafter:
    """Forwards to an ``NgramDrafter`` and keeps every ``propose`` result (one per replay step)."""

    def __init__(self, inner):
        self.inner = inner
        self.proposals = []

    def propose(self, rid, k):
        d = self.inner.propose(rid, k)
        self.proposals.append(d)
        return d

    def __getattr__(self, name):  # start / extend / finish / remove
        return getattr(self.inner, name)


@dataclass
class Steps:
    """One row per replay step: the proposed chain's features (padded to ``k``) and the realised acceptance."""

    length: np.ndarray        # int [S]   drafts proposed
    accepted: np.ndarray      # int [S]   leading drafts that equal the model's output
    match_len: np.ndarray     # int [S, k]
    count: np.ndarray
    total: np.ndarray
    depth: np.ndarray
    source: np.ndarray
    workload: np.ndarray      # str [S]
    doc: np.ndarray           # int [S]

    def valid(self) -> np.ndarray:
        k = self.match_len.shape[1]
        return np.arange(k)[None, :] < self.length[:, None]


def _steps_from_proposals(proposals, cols: dict, k: int, workload: str, doc: int) -> dict:
    """Align a document's proposals with its records: step ``s`` consumed ``min(acc + 1, length)`` records."""
    acc_col = cols["accepted"]
    i = 0
    rows = {c: [] for c in ("length", "accepted", "match_len", "count", "total", "depth", "source")}
    for d in proposals:
        n = int(d.lengths[0])
        acc = 0
        while acc < n and acc_col[i + acc] == 1:
            acc += 1
        i += min(acc + 1, n)
        rows["length"].append(n)
        rows["accepted"].append(acc)
        for c in ("match_len", "count", "total", "depth", "source"):
            v = np.zeros(k, dtype=np.int64)
            v[:n] = np.asarray(getattr(d, c))[0, :n]
            rows[c].append(v)
    if i != len(acc_col):
        raise RuntimeError(f"step/record alignment failed for document {doc}: {i} records consumed of {len(acc_col)}")
    out = {c: np.asarray(v, dtype=np.int64) for c, v in rows.items()}
    for c in ("match_len", "count", "total", "depth", "source"):
        out[c] = out[c].reshape(len(proposals), k)
    out["workload"] = np.full(len(proposals), workload)
    out["doc"] = np.full(len(proposals), doc, dtype=np.int64)
    return out


def replay_with_steps(docs, k: int = 8, corpus: str = "shared", drafter_kwargs=None) -> tuple:
    """Replay ``(workload, prompt, output, id)`` documents; returns ``(NgramRecords, Steps)``.

    ``corpus="shared"``: one drafter for all documents, each finished with ``donate=True`` (what
    ``calibration_replay.replay`` does, so later documents may copy from earlier ones: ``source = 1``).
    ``corpus="isolated"``: a fresh drafter per document (no cross-request copying, like the reference loop, which does
    not donate).
    """
    from sglang_hybrid.ngram import NgramDrafter
    if corpus not in ("shared", "isolated"):
        raise ValueError(f"corpus must be 'shared' or 'isolated', got {corpus!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    shared = NgramDrafter(max_draft=k, **(drafter_kwargs or {})) if corpus == "shared" else None
    rec_parts, step_parts = [], []
    for doc_id, (workload, prompt, output, _name) in enumerate(docs):
        inner = shared if shared is not None else NgramDrafter(max_draft=k, **(drafter_kwargs or {}))
        drafter = _RecordingDrafter(inner)
        cols = replay_document(drafter, doc_id, prompt, output, k)
        m = len(cols["accepted"])
        rec_parts.append(NgramRecords(**{c: np.asarray(v, dtype=np.int64) for c, v in cols.items()},
                                      workload=np.full(m, workload), doc=np.full(m, doc_id, dtype=np.int64)))
        step_parts.append(_steps_from_proposals(drafter.proposals, cols, k, workload, doc_id))
    records = NgramRecords.concat(rec_parts)
    if not step_parts:
        raise ValueError("no documents to replay")
    steps = Steps(**{c: np.concatenate([p[c] for p in step_parts]) for c in step_parts[0]})
    return records, steps


# ------------------------------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------------------------------

def ece_noise_floor(pred, n_draws: int = 200, seed: int = 0, n_bins: int = N_BINS) -> float:
    """Mean ECE of a *perfectly calibrated* predictor at these predictions: labels drawn as Bernoulli(pred).

    ECE is biased upwards at small n; an observed ECE near this floor is indistinguishable from perfect calibration.
    """
    p = np.asarray(pred, dtype=np.float64)
    if p.size == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(p, rng.random(p.size) < p, n_bins) for _ in range(n_draws)]))


def doc_bootstrap_ece(pred, label, doc, n_boot: int = 200, seed: int = 0, q=(0.05, 0.95)) -> tuple:
    """Percentile interval of ECE when whole documents are resampled (records within a document are correlated)."""
    p, y, d = np.asarray(pred, np.float64), np.asarray(label, np.float64), np.asarray(doc)
    ids = np.unique(d)
    if ids.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(d == i) for i in ids]
    vals = []
    for _ in range(n_boot):
        idx = np.concatenate([groups[j] for j in rng.integers(0, ids.size, ids.size)])
        vals.append(ece(p[idx], y[idx]))
    lo, hi = np.quantile(vals, q)
    return float(lo), float(hi)


def block_metrics(before, after, label, doc=None, uncertainty: bool = False) -> dict:
    """n, mean predicted (before/after), hit rate, ECE and Brier (before/after); optionally noise floor + CI."""
    y = np.asarray(label, dtype=np.float64)
    out = {"n": int(y.size), "hit_rate": float(y.mean()) if y.size else float("nan"),
           "mean_before": float(np.mean(before)) if y.size else float("nan"),
           "mean_after": float(np.mean(after)) if y.size else float("nan"),
           "ece_before": ece(before, y), "ece_after": ece(after, y),
           "brier_before": brier(before, y), "brier_after": brier(after, y)}
    if uncertainty and y.size:
        out["ece_after_floor"] = ece_noise_floor(after)
        if doc is not None:
            out["ece_after_ci90"] = list(doc_bootstrap_ece(after, y, doc))
    return out


def _metrics_by_workload(before, after, y, depth, work, doc, max_position: int) -> dict:
    """``{workload: {"all": block, "positions": {"1": block, ..., "<max>+": block}}}`` plus ``"all"`` over workloads;
    the one layout both drafters' records are reported in."""
    out = {}
    for w in ["all"] + sorted(set(work.tolist())):
        mw = np.ones(len(y), bool) if w == "all" else work == w
        entry = {"all": block_metrics(before[mw], after[mw], y[mw], None if doc is None else doc[mw], True),
                 "positions": {}}
        for p in range(1, max_position + 1):
            m = mw & ((depth == p) if p < max_position else (depth >= p))
            if m.any():
                entry["positions"][str(p) if p < max_position else f"{p}+"] = block_metrics(before[m], after[m], y[m])
        out[w] = entry
    return out


def record_metrics(cal: NgramCalibration, rec: NgramRecords, max_position: int = 8) -> dict:
    """n-gram records: raw = ``count / total``, cal = ``cal`` (layout of ``_metrics_by_workload``)."""
    work = rec.workload if rec.workload is not None else np.full(len(rec), "all")
    return _metrics_by_workload(rec.raw_frequency(), cal.predict(rec), rec.accepted, rec.depth, work, rec.doc,
                                max_position)


def model_record_metrics(cal: ModelCalibration, rec: ModelRecords, max_position: int = 6) -> dict:
    """Model-drafter records, same layout as ``record_metrics``: raw = draft probability, cal = ``cal``."""
    work = rec.workload if rec.workload is not None else np.full(len(rec), "all")
    return _metrics_by_workload(rec.prob, cal.acceptance_np(rec.prob, rec.depth), rec.accepted, rec.depth, work,
                                rec.doc, max_position)


def summary_lines(ngram: dict, model: Optional[dict]) -> list:
    """One line per drafter side and workload: n, hit rate, ECE and Brier raw -> calibrated."""
    lines = ["summary: per-token conditional acceptance, raw -> calibrated",
             f"  {'side':<8}{'workload':<10}{'n':>7}{'hit':>7}{'ECE raw':>9}{'ECE cal':>9}{'Brier raw':>10}"
             f"{'Brier cal':>10}"]
    for side, metrics in (("n-gram", ngram), ("model", model)):
        for w, e in (metrics or {}).items():
            a = e["all"]
            lines.append(f"  {side:<8}{w:<10}{a['n']:>7}{a['hit_rate']:>7.3f}{a['ece_before']:>9.4f}"
                         f"{a['ece_after']:>9.4f}{a['brier_before']:>10.4f}{a['brier_after']:>10.4f}")
    return lines


def step_estimates(cal: NgramCalibration, steps: Steps) -> tuple:
    """Per-step expected accepted drafts ``sum_j prod_{i<=j} a_i`` (before, after) over each full proposed chain."""
    valid = steps.valid()
    a_after = cal.acceptance_np(steps.match_len, steps.count, steps.total, steps.depth, steps.source)
    a_before = np.where(steps.total > 0, steps.count / np.maximum(steps.total, 1), 0.0)
    exp_after = np.sum(np.cumprod(np.where(valid, a_after, 0.0), axis=1), axis=1)
    exp_before = np.sum(np.cumprod(np.where(valid, a_before, 0.0), axis=1), axis=1)
    return exp_before, exp_after


def step_metrics(cal: NgramCalibration, steps: Steps) -> dict:
    """Expected vs realised accepted drafts per step (steps that proposed >= 1 draft), per workload; plus
    per-depth survival: mean predicted ``P(accepted >= d)`` vs the observed share, over steps with ``length >= d``."""
    exp_b, exp_a = step_estimates(cal, steps)
    valid = steps.valid()
    a_after = cal.acceptance_np(steps.match_len, steps.count, steps.total, steps.depth, steps.source)
    surv = np.cumprod(np.where(valid, a_after, 0.0), axis=1)
    k = valid.shape[1]
    out = {}
    for w in ["all"] + sorted(set(steps.workload.tolist())):
        mw = np.ones(steps.length.size, bool) if w == "all" else steps.workload == w
        m = mw & (steps.length > 0)
        real = steps.accepted[m].astype(np.float64)
        e = {"steps": int(mw.sum()), "steps_with_draft": int(m.sum()),
             "mean_length": float(steps.length[m].mean()) if m.any() else float("nan"),
             "expected_before": float(exp_b[m].mean()) if m.any() else float("nan"),
             "expected_after": float(exp_a[m].mean()) if m.any() else float("nan"),
             "realised": float(real.mean()) if m.any() else float("nan"),
             "survival": {}}
        e["ratio_after"] = e["expected_after"] / e["realised"] if e["realised"] > 0 else float("nan")
        e["ratio_before"] = e["expected_before"] / e["realised"] if e["realised"] > 0 else float("nan")
        e["mae_after"] = float(np.mean(np.abs(exp_a[m] - real))) if m.any() else float("nan")
        for d in range(1, k + 1):
            md = mw & (steps.length >= d)
            if md.any():
                e["survival"][str(d)] = {"n": int(md.sum()), "predicted": float(surv[md, d - 1].mean()),
                                         "observed": float((steps.accepted[md] >= d).mean())}
        out[w] = e
    return out


def reliability_curve(pred, label, n_bins: int = N_BINS) -> tuple:
    """Per non-empty equal-width bin: (mean predicted, observed hit rate, count) -- the bins ``ece`` uses."""
    p, y = np.asarray(pred, np.float64), np.asarray(label, np.float64)
    b = np.clip((p * n_bins).astype(np.int64), 0, n_bins - 1)
    n = np.bincount(b, minlength=n_bins)
    sp = np.bincount(b, weights=p, minlength=n_bins)
    sy = np.bincount(b, weights=y, minlength=n_bins)
    m = n > 0
    return sp[m] / n[m], sy[m] / n[m], n[m]


# ------------------------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------------------------

def format_tables(metrics: dict, steps: Optional[dict], what: str = "per-token conditional acceptance") -> str:
    lines = []
    hdr = (f"  {'slice':<12}{'n':>7}{'hit':>7}{'pred raw':>9}{'pred cal':>9}{'ECE raw':>9}{'ECE cal':>9}"
           f"{'Brier raw':>10}{'Brier cal':>10}")

    def row(name, b):
        return (f"  {name:<12}{b['n']:>7}{b['hit_rate']:>7.3f}{b['mean_before']:>9.3f}{b['mean_after']:>9.3f}"
                f"{b['ece_before']:>9.4f}{b['ece_after']:>9.4f}{b['brier_before']:>10.4f}{b['brier_after']:>10.4f}")
    for w, e in metrics.items():
        a = e["all"]
        extra = ""
        if "ece_after_floor" in a:
            extra = f"  (calibrated ECE noise floor {a['ece_after_floor']:.4f}"
            if "ece_after_ci90" in a and not np.isnan(a["ece_after_ci90"][0]):
                extra += f", 90% doc-bootstrap [{a['ece_after_ci90'][0]:.4f}, {a['ece_after_ci90'][1]:.4f}]"
            extra += ")"
        lines.append(f"workload {w}: {what}{extra}")
        lines.append(hdr)
        lines.append(row("all", a))
        for p, b in e["positions"].items():
            lines.append(row(f"position {p}", b))
        lines.append("")
    if steps is None:
        return "\n".join(lines)
    lines.append("expected vs realised accepted drafts per step (steps proposing >= 1 draft)")
    lines.append(f"  {'workload':<10}{'steps':>7}{'drafted':>8}{'len':>6}{'E raw':>8}{'E cal':>8}{'real':>8}"
                 f"{'cal/real':>9}{'|E-real|':>9}")
    for w, e in steps.items():
        lines.append(f"  {w:<10}{e['steps']:>7}{e['steps_with_draft']:>8}{e['mean_length']:>6.2f}"
                     f"{e['expected_before']:>8.3f}{e['expected_after']:>8.3f}{e['realised']:>8.3f}"
                     f"{e['ratio_after']:>9.3f}{e['mae_after']:>9.3f}")
    lines.append("")
    lines.append("survival P(accepted >= d): calibrated prediction / observed (steps with >= d drafts)")
    depths = sorted({int(d) for e in steps.values() for d in e["survival"]})
    lines.append(f"  {'workload':<10}" + "".join(f"{'d=' + str(d):>11}" for d in depths))
    for w, e in steps.items():
        cells = []
        for d in depths:
            s = e["survival"].get(str(d))
            cells.append(f"{s['predicted']:.2f}/{s['observed']:.2f}" if s else "-")
        lines.append(f"  {w:<10}" + "".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def plot_reliability(cal: NgramCalibration, rec: NgramRecords, steps: Steps, path: Path,
                     model: Optional[tuple] = None) -> Path:
    """Three panels: raw count/total, calibrated (per-token reliability, one line per workload), and per-step
    expected vs realised accepted drafts (binned by expected); with ``model = (ModelCalibration, ModelRecords)`` a
    fourth: the model drafter's reliability, raw draft probability (dashed) and calibrated (solid), per workload."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    after, before, y = cal.predict(rec), rec.raw_frequency(), rec.accepted
    work = rec.workload if rec.workload is not None else np.full(len(rec), "all")
    fig, axes = plt.subplots(1, 4 if model else 3, figsize=(20 if model else 15, 4.8))
    for ax, pred, title in ((axes[0], before, "before: raw count/total"), (axes[1], after, "after: calibrated")):
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
        for w in sorted(set(work.tolist())):
            m = work == w
            px, py, n = reliability_curve(pred[m], y[m])
            ax.plot(px, py, "o-", label=f"{w} (ECE {ece(pred[m], y[m]):.3f}, n={int(m.sum())})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted acceptance (bin mean)")
        ax.set_ylabel("observed hit rate")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left")
    ax = axes[2]
    exp_b, exp_a = step_estimates(cal, steps)
    top = max(1.0, float(steps.length.max()))
    ax.plot([0, top], [0, top], "k:", lw=1, label="perfect")
    edges = np.arange(0, top + 0.5, 0.5)
    for w in sorted(set(steps.workload.tolist())):
        m = (steps.workload == w) & (steps.length > 0)
        b = np.clip(np.searchsorted(edges, exp_a[m], side="right") - 1, 0, edges.size - 1)
        xs, ys = [], []
        for i in np.unique(b):
            sel = b == i
            if sel.sum() >= 5:
                xs.append(exp_a[m][sel].mean())
                ys.append(steps.accepted[m][sel].mean())
        ax.plot(xs, ys, "o-", label=f"{w} (steps={int(m.sum())})")
    ax.set_xlabel("expected accepted drafts per step (calibrated)")
    ax.set_ylabel("realised accepted drafts (bin mean)")
    ax.set_title("per step: sum of survivals vs realised")
    ax.legend(fontsize=8, loc="upper left")
    if model:
        mcal, mrec = model
        ax = axes[3]
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
        mwork = mrec.workload if mrec.workload is not None else np.full(len(mrec), "all")
        cal_p = mcal.acceptance_np(mrec.prob, mrec.depth)
        for i, w in enumerate(sorted(set(mwork.tolist()))):
            m = mwork == w
            color = f"C{i}"
            px, py, _ = reliability_curve(mrec.prob[m], mrec.accepted[m])
            ax.plot(px, py, "o--", color=color, alpha=0.5,
                    label=f"{w} raw (ECE {ece(mrec.prob[m], mrec.accepted[m]):.3f})")
            px, py, _ = reliability_curve(cal_p[m], mrec.accepted[m])
            ax.plot(px, py, "o-", color=color, label=f"{w} cal (ECE {ece(cal_p[m], mrec.accepted[m]):.3f}, "
                                                     f"n={int(m.sum())})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted acceptance (bin mean)")
        ax.set_ylabel("observed hit rate")
        ax.set_title("model drafter (EAGLE): raw draft prob vs calibrated")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("n-gram calibration (fit on general text) and model-drafter calibration on the target's own greedy "
                 "outputs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o))


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.calibration_check",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                    help=f"reference-loop trace (docs/ARCHITECTURE.md), greedy (default {DEFAULT_TRACE})")
    ap.add_argument("--calibration", type=Path, default=None, help="calibration JSON (default: the shipped one)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("-k", type=int, default=8, help="chain length proposed per step (calibrate's default: 8)")
    ap.add_argument("--model-calibration", type=Path, default=None,
                    help="model-drafter calibration JSON (default: the shipped one if present, else identity); "
                         "'none' = identity")
    ap.add_argument("--corpus", default="shared", choices=["shared", "isolated"],
                    help="shared: one drafter, finished requests donated (as tools.calibrate); isolated: fresh per "
                         "request (as the reference loop)")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace} (write one with the reference loop; see docs/reference.md)")
    from sglang_hybrid.reference.trace import read_trace
    header, _ = read_trace(args.trace)
    if float(getattr(header, "temperature", 0.0) or 0.0) != 0.0:
        print(f"warning: trace temperature {header.temperature} != 0; labels are a proxy for acceptance",
              file=sys.stderr)
    cal = NgramCalibration.load(args.calibration)
    docs = trace_documents(args.trace)
    if not docs:
        raise SystemExit(f"{args.trace}: no requests")
    rec, steps = replay_with_steps(docs, k=args.k, corpus=args.corpus)
    if len(rec) == 0:
        raise SystemExit("the replay produced no draft records (outputs too short or nothing to copy)")
    metrics = record_metrics(cal, rec)
    smetrics = step_metrics(cal, steps)
    by_w = {w: sum(d[0] == w for d in docs) for w in sorted({d[0] for d in docs})}
    print(f"trace {args.trace}: model {header.model}, T={header.temperature}, {len(docs)} requests {by_w}, "
          f"{sum(len(d[2]) for d in docs)} output tokens\n  k={args.k}, corpus={args.corpus}, "
          f"calibration {args.calibration or 'default (shipped)'}")
    print(format_tables(metrics, smetrics))
    mrec = model_records_from_trace(args.trace) if header.eagle_k > 0 else None
    mmetrics, mcal, mdesc = None, None, "identity"
    if mrec is not None and len(mrec):
        mpath = args.model_calibration
        if mpath is None and DEFAULT_MODEL_CALIBRATION.is_file():
            mpath = DEFAULT_MODEL_CALIBRATION
        if mpath is not None and str(mpath) != "none":
            mcal, mdesc = ModelCalibration.load(mpath), str(mpath)
        else:
            mcal = ModelCalibration.identity()
        mmetrics = model_record_metrics(mcal, mrec)
        print(f"\nmodel drafter (EAGLE, draft model {header.draft_model}): raw = draft probability, cal = {mdesc}")
        print(format_tables(mmetrics, None, "model-drafter per-token conditional acceptance"))
    else:
        print("\nmodel drafter: the trace has no EAGLE chains (eagle_k = 0 or no drafts); not checked")
    print("\n".join(summary_lines(metrics, mmetrics)))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot_reliability(cal, rec, steps, args.out / f"reliability_{args.corpus}.png",
                           (mcal, mrec) if mmetrics else None)
    js = args.out / f"metrics_{args.corpus}.json"
    js.write_text(json.dumps({"trace": str(args.trace), "model": header.model, "k": args.k, "corpus": args.corpus,
                              "calibration": str(args.calibration or "default"), "requests": by_w,
                              "per_token": metrics, "per_step": smetrics, "model_calibration": mdesc,
                              "model_per_token": mmetrics}, indent=1, default=_json_default) + "\n")
    print(f"wrote {png} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
