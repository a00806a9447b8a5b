"""A per-request correction of a drafter's calibrated acceptance, learned online from the request's own verify
outcomes: the model drafter's (setting ``model_bias_eta``) and, alike, the n-gram drafter's (``ngram_bias_eta``).

Why: the model calibration is one temperature per depth (``calibration.ModelCalibration``), and on held-out requests
the requests differ more than the depths do (docs/calibration_check.md): a looping chat is accepted far above its
prediction, other requests sit below it. Features of the same softmax do not tell them apart
(``bench.model_features``); the request's own record does. Each verify shows how the request's model chain fared:
the tokens the engine commits (accepted drafts, then the bonus token) are the target's choices at those positions,
so every model-chain token up to the first that differs from them was *tested*, whatever tree was verified (choose,
merge, or a step that verified no model token at all).

The correction is an offset on the calibrated logit, one per request, updated by one stochastic-gradient step on the
log loss of the step's tested tokens:

    a'_j = sigmoid(logit(a_j) + b),        b <- b + eta * sum_{tested j} (hit_j - a'_j)

``b`` starts at 0 for a new request (the calibrated prediction), moves toward the request's observed acceptance at a
rate set by ``eta``, and stays where it is on steps that tested nothing. Measured on held-out traces
(``python -m bench.request_bias``): Brier 0.185 -> 0.174 on 28 unseen requests with ``eta = 0.1``, where the softmax
features moved it by +0.010 / -0.0001.

The n-gram side uses the same functions on its chain (``tree_outcome`` where its draft is a tree): the shipped
n-gram table is fit on general text and under-values a request that copies (docs/calibration_check.md), which a
ragged verify, pricing node by node, pays for; each verify shows how far the request's own n-gram chain was accepted
(docs/sglang.md, "The n-gram side's online offset").

Static shapes, no host sync, no data-dependent branching: graph-safe like the rest of the decision step.
"""
from __future__ import annotations

import torch

#: acceptances are clamped into (EPS, 1 - EPS) before the logit
EPS = 1e-6


def corrected_acceptance(a: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``a [B, S]`` calibrated acceptances, ``bias [B]`` the requests' offsets -> ``sigmoid(logit(a) + bias)``, float32
    computed in float64 (as ``ModelCalibrationTables.acceptance``: equal acceptances stay equal whatever tensor they
    sit in)."""
    a = a.to(torch.float32).clamp(EPS, 1.0 - EPS).to(torch.float64)
    return torch.sigmoid(torch.logit(a) + bias.to(torch.float64)[:, None]).to(torch.float32)


def chain_outcome(model_tokens: torch.Tensor, model_length: torch.Tensor, committed: torch.Tensor,
                  n_committed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which model-chain tokens a step tested and whether each hit: ``(tested [B, S] bool, hit [B, S] bool)``.

    ``model_tokens [B, S]`` / ``model_length [B]``: the chain drafted; ``committed [B, C]`` / ``n_committed [B]``:
    the tokens the step committed after the root (accepted drafts, then the bonus token). Token ``j`` is tested when
    ``j < model_length``, ``j < n_committed`` and tokens ``0..j-1`` equal the committed ones."""
    b, s = model_tokens.shape
    c = committed.shape[1]
    j = torch.arange(s, device=model_tokens.device)
    if c < s:
        committed = torch.cat([committed, torch.full((b, s - c), -1, dtype=committed.dtype,
                                                     device=committed.device)], 1)
    hit = (model_tokens.to(torch.int64) == committed[:, :s].to(torch.int64)) & (j[None, :] < n_committed[:, None])
    before = torch.cumprod(torch.cat([torch.ones((b, 1), dtype=torch.int64, device=hit.device),
                                      hit[:, :-1].to(torch.int64)], 1), 1) > 0 if s > 0 else hit
    tested = before & (j[None, :] < model_length[:, None]) & (j[None, :] < n_committed[:, None])
    return tested, hit & tested


def tree_outcome(tokens: torch.Tensor, parents: torch.Tensor, length: torch.Tensor, committed: torch.Tensor,
                 n_committed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``chain_outcome`` for a draft tree: which nodes a step tested and whether each hit, ``(tested [B, K] bool,
    hit [B, K] bool)``.

    ``parents [B, K]``: each node's parent (an earlier index, ``-1`` = the root), as ``step.NgramDraft`` holds them.
    Node ``j`` at depth ``d`` (1 under the root) is tested when ``j < length``, ``d <= n_committed`` and its parent is
    the root or hit; it hits when it also equals ``committed[d - 1]``. Siblings are all tested once their parent hit
    (the target's token there is known; at most one of them equals it). A chain (``parents = j - 1``) gives
    ``chain_outcome``'s answer. Why a tree: the CPU reference loop drafts the n-gram side as one in merge mode; the
    worker's n-gram drafts are chains."""
    b, k = tokens.shape
    dev = tokens.device
    c = committed.shape[1]
    tested = torch.zeros((b, k), dtype=torch.bool, device=dev)
    hit = torch.zeros((b, k), dtype=torch.bool, device=dev)
    depth = torch.zeros((b, k), dtype=torch.int64, device=dev)
    tokens, committed = tokens.to(torch.int64), committed.to(torch.int64)
    for j in range(k):
        p = parents[:, j].to(torch.int64)
        under_root = p < 0
        at = p.clamp(0, k - 1)[:, None]
        parent_hit = under_root | hit.gather(1, at)[:, 0]
        d = torch.where(under_root, 0, depth.gather(1, at)[:, 0]) + 1
        t = parent_hit & (j < length) & (d <= n_committed) & (under_root | (p < j))
        target = committed.gather(1, (d - 1).clamp(0, max(c - 1, 0))[:, None])[:, 0] if c else torch.full_like(d, -1)
        depth[:, j] = d
        tested[:, j] = t
        hit[:, j] = t & (d <= c) & (tokens[:, j] == target)
    return tested, hit


def update_bias(bias: torch.Tensor, acceptance: torch.Tensor, tested: torch.Tensor, hit: torch.Tensor,
                eta: float) -> torch.Tensor:
    """One online step: ``bias + eta * sum_j tested_j (hit_j - acceptance_j)`` per request. ``acceptance [B, S]``:
    the corrected acceptances the step was priced with (``corrected_acceptance``, before this update)."""
    g = torch.where(tested, hit.to(torch.float32) - acceptance.to(torch.float32), 0.0).sum(1)
    return bias.to(torch.float32) + float(eta) * g


__all__ = ["EPS", "corrected_acceptance", "chain_outcome", "tree_outcome", "update_bias"]
