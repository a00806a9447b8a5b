"""Would a per-request correction learned online make the model drafter's confidence mean more?

    python -m bench.request_bias [--trace out/traces/cal_t0_heldout.jsonl] [--model-calibration FILE]
                                 [--etas 0.02,0.05,0.1,0.2] [--lag 1]

Why: the shipped model calibration is one temperature per depth (docs/calibration_check.md, "Model drafter"), and the
check on held-out requests found that requests differ more than depths (one looping chat is accepted far above its
prediction, whole requests sit below it). Richer features of the same softmax did not help (``bench.model_features``).
What a per-depth table cannot see, an engine can: each verify tells it how the request's own model chain fared. This
study asks whether a per-request offset on the calibrated logit, learned from those outcomes as decoding goes,

    a' = sigmoid(logit(a_cal) + b_r),        b_r <- b_r + eta * sum over the step's tested tokens (hit - a'),

(one stochastic-gradient step on the log loss per decode step) predicts held-out acceptance better.

What it models: each request of a reference trace (real SmolLM2 outputs with the EAGLE head's chain at every
position) is decoded as an EAGLE-only engine would step through it: a step at output position ``p`` drafts the chain
recorded at ``p``, its tokens are tested while they match the greedy output (token j counts when tokens 0..j-1 were
right, the survival definition), and the next step starts after the accepted tokens and the bonus token. A step's
outcome reaches the bias ``lag`` steps later (1: SGLang's overlap scheduler prepares step t+1 while step t verifies).
Only the model chain's own outcomes are used, which an engine has whatever it verified: the greedy target tokens it
commits are compared with the chain it drafted. Everything is measured on held-out requests (the calibration was fit
on others); no model runs here (seconds).

It prints Brier score and ECE (10 bins) of the calibrated and of the online-corrected predictions for each ``eta``,
the Brier difference with a 90 % request-bootstrap interval, and a verdict: the correction helps where the interval
lies below 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sglang_hybrid.request_bias import EPS

DEFAULT_TRACE = Path("out/traces/cal_t0_heldout.jsonl")


def engine_steps(tokens: list, probs: list, output: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """The steps an EAGLE-only engine takes through one request: per step, the tested chain tokens' draft
    probabilities and labels (``[n]`` each; the chain up to and including its first miss)."""
    steps, p = [], 0
    while p < len(output) and p < len(tokens):
        q, y = [], []
        for j, (t, pr) in enumerate(zip(tokens[p], probs[p])):
            if t < 0 or p + j >= len(output):
                break
            hit = int(t) == int(output[p + j])
            q.append(float(pr))
            y.append(float(hit))
            if not hit:
                break
        steps.append((np.asarray(q), np.asarray(y)))
        p += int(sum(y)) + 1                          # accepted drafts, then the bonus token
    return steps


def online_predictions(cal_steps: list[tuple[np.ndarray, np.ndarray]], eta: float, lag: int) -> np.ndarray:
    """Online-corrected predictions for one request's steps (calibrated acceptances and labels per step), with the
    core's rule (``sglang_hybrid.request_bias``, as the reference loop runs it): the bias starts at 0 and learns from
    each step's outcome ``lag`` steps after it (prediction always before learning)."""
    import torch

    from sglang_hybrid.request_bias import corrected_acceptance, update_bias

    bias, pending, out = torch.zeros(1), [], []
    for a, y in cal_steps:
        while len(pending) > lag:                     # outcomes old enough to have reached the engine
            priced, py = pending.pop(0)
            hit = torch.as_tensor(py[None] > 0.5)
            bias = update_bias(bias, priced, torch.ones_like(hit), hit, eta)
        priced = corrected_acceptance(torch.as_tensor(a, dtype=torch.float32)[None], bias)
        out.append(priced[0].double().numpy())
        pending.append((priced, y))
    return np.concatenate(out) if out else np.zeros(0)


def evaluate(requests: list[list[tuple[np.ndarray, np.ndarray]]], etas, lag: int = 1, n_boot: int = 1000,
             seed: int = 0) -> dict:
    """``requests``: per request, its steps as (calibrated acceptance, label) arrays. Returns the calibrated
    baseline's Brier and ECE and, per eta, the online correction's, with the Brier difference (online - calibrated)
    and its 90 % request-bootstrap interval."""
    from sglang_hybrid.calibration_metrics import brier, ece

    base = [np.clip(np.concatenate([a for a, _ in r]), EPS, 1 - EPS) if r else np.zeros(0) for r in requests]
    ys = [np.concatenate([y for _, y in r]) if r else np.zeros(0) for r in requests]
    y = np.concatenate(ys)
    b = np.concatenate(base)
    out = {"n": int(len(y)), "requests": len(requests), "hit": float(y.mean()), "calibrated": {
        "brier": brier(b, y), "ece": ece(b, y), "mean": float(b.mean())}, "online": {}}
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, len(requests), len(requests)) for _ in range(n_boot)]
    for eta in etas:
        on = [online_predictions(r, eta, lag) for r in requests]
        o = np.concatenate(on)
        diff = [((oi - yi) ** 2 - (bi - yi) ** 2) for oi, bi, yi in zip(on, base, ys)]
        sums, counts = np.array([d.sum() for d in diff]), np.array([len(d) for d in diff])
        boots = [sums[i].sum() / max(counts[i].sum(), 1) for i in picks]
        out["online"][eta] = {"brier": brier(o, y), "ece": ece(o, y), "mean": float(o.mean()),
                              "brier_diff": float(sums.sum() / max(counts.sum(), 1)),
                              "brier_diff_ci": (float(np.quantile(boots, 0.05)), float(np.quantile(boots, 0.95)))}
    return out


def trace_requests(trace: Path, calibration) -> list:
    """Per request of a trace, its engine steps with calibrated acceptances (``calibration``: ``ModelCalibration``)."""
    import torch

    from sglang_hybrid.reference.trace import read_trace

    tables = calibration.to()
    _, records = read_trace(trace)
    out = []
    for r in records:
        steps = []
        for q, y in engine_steps(r.eagle_tokens, r.eagle_probs, r.output):
            if len(q) == 0:
                continue
            depth = torch.arange(1, len(q) + 1)
            a = tables.acceptance(torch.tensor(q, dtype=torch.float32).clamp(0.0, 1.0), depth).double().numpy()
            steps.append((a, y))
        out.append(steps)
    return out


def main(argv=None) -> int:
    from sglang_hybrid.calibration import ModelCalibration

    ap = argparse.ArgumentParser(prog="python -m bench.request_bias", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                    help=f"held-out reference trace with EAGLE chains (default {DEFAULT_TRACE})")
    ap.add_argument("--model-calibration", type=Path, default=None,
                    help="model calibration JSON (default: the shipped sglang_hybrid/data/model_calibration.json)")
    ap.add_argument("--etas", default="0.02,0.05,0.1,0.2", help="learning rates to compare, comma-separated")
    ap.add_argument("--lag", type=int, default=1, help="steps before a step's outcome reaches the bias (>= 0)")
    a = ap.parse_args(argv)
    try:
        etas = [float(x) for x in a.etas.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--etas must be comma-separated numbers, got {a.etas!r}")
    if not etas or any(e <= 0 for e in etas):
        ap.error(f"--etas must be numbers > 0, got {a.etas!r}")
    if a.lag < 0:
        ap.error(f"--lag must be >= 0, got {a.lag}")
    if not a.trace.is_file():
        print(f"trace not found: {a.trace} (docs/calibration_check.md shows how to record the calibration traces)",
              file=sys.stderr)
        return 2
    cal = ModelCalibration.load(a.model_calibration) if a.model_calibration else ModelCalibration.load(
        Path(__file__).resolve().parents[1] / "sglang_hybrid" / "data" / "model_calibration.json")
    res = evaluate(trace_requests(a.trace, cal), etas, a.lag)
    print(f"{a.trace}: {res['requests']} requests, {res['n']} tested chain tokens (EAGLE-only engine walk), hit rate "
          f"{res['hit']:.3f}; outcome lag {a.lag} step(s)")
    print(f"{'prediction':<22} {'mean':>6} {'Brier':>7} {'ECE':>7} {'Brier diff [90 % request bootstrap]':>38}")
    c = res["calibrated"]
    print(f"{'calibrated (shipped)':<22} {c['mean']:6.3f} {c['brier']:7.4f} {c['ece']:7.4f}")
    for eta, o in res["online"].items():
        lo, hi = o["brier_diff_ci"]
        print(f"{'online, eta ' + format(eta, 'g'):<22} {o['mean']:6.3f} {o['brier']:7.4f} {o['ece']:7.4f} "
              f"{o['brier_diff']:+18.4f} [{lo:+.4f}, {hi:+.4f}]")
    best = min(res["online"].items(), key=lambda kv: kv[1]["brier"])
    helps = best[1]["brier_diff_ci"][1] < 0
    print(f"verdict: the per-request online correction {'helps' if helps else 'does not help'} (best eta "
          f"{best[0]:g}: Brier {best[1]['brier_diff']:+.4f}, interval "
          f"{'below' if helps else 'not below'} 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
