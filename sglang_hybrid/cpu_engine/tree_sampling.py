"""CPU stand-in for SGLang's tree speculative sampling op and its top-k / top-p renorms (not SGLang's kernels).

Why it exists: SGLang 0.5.23 verifies greedily on CPU whatever the temperature (``eagle_utils._verify_uses_greedy``
is true when ``is_cpu``), and there ``tree_speculative_sampling_target_only``, ``top_k_renorm_prob`` and
``top_p_renorm_prob`` resolve to ``None`` (``sglang.kernels.ops.speculative.verify_sampling``,
``sglang.kernels.ops.sampling.renorm``). So EAGLE's sampling verify branch (``eagle_utils.eagle_sample``, the branch
that serves every request with temperature > 0 on a GPU) never runs here. These ops let it run on CPU with SGLang's
real verify code; ``sampling_verify_patches()`` lists what to install where (the non-live tests install it with
pytest's ``monkeypatch``). In a live CPU engine, ``prepare_environment(tree_sampling_counts=PATH)`` sets
``TREE_SAMPLING_ENV``; the stand-in ``sgl_kernel``, which every CPU engine process imports, then calls
``install_when_imported()``, which applies the same patches to SGLang's ``eagle_utils`` in that process and counts the
op's calls (sampling verify steps) into ``PATH``. Nothing in the plugin imports this module, so a GPU deployment
never sees it.

``tree_speculative_sampling_target_only_cpu`` mirrors the CUDA kernel ``TreeSpeculativeSamplingTargetOnly``
(``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``, launched by
``sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only``) step for step, one request per
kernel block, vectorised here over the batch:

* from the root (local node 0) walk ``num_speculative_tokens - 1`` levels; at each level try the children of the last
  accepted node in sibling order (``retrive_next_token``, then ``retrive_next_sibling``), adding each child's target
  probability ``q(token)`` (the row of the last accepted node) to ``prob_acc``; accept the child when ``q(token) > 0``
  and (``coin < prob_acc / threshold_acc`` or ``q(token) >= threshold_single``), where ``coin`` is
  ``uniform_samples[b, cur]`` of the last accepted node ``cur`` (one coin per level, shared by the siblings);
* on accept: ``predicts[retrive_index of the parent] = token``, append the child's ``retrive_index`` to
  ``accept_index``, reset ``prob_acc``, move the coin and the probability row to the child;
* on reject: ``draft_probs[b, cur, token] = q(token)`` (the kernel's in-place write) and try the next sibling;
  when no child is accepted the walk stops;
* ``accept_token_num[b]`` = accepted drafts; the last accepted node's ``predicts`` entry is sampled from
  ``relu(q - draft_probs)`` of its row (``draft_probs`` ignored when every level accepted: the bonus token) with
  ``uniform_samples_for_final_sampling[b]``: the first token whose inclusive cumulative residual exceeds
  ``coin * sum`` among tokens with positive residual (FlashInfer's ``DeviceSamplingFromProb``), else the last
  positive one, else ``vocab - 1``.

Why it is exact (``threshold_single = threshold_acc = 1``, SGLang's defaults, and ``draft_probs`` zero as SGLang
passes it outside rejection sampling: each drafted token is a point mass). At a node with target distribution ``q``
and distinct sibling tokens ``t_1..t_k``, one coin ``c ~ U[0, 1)`` accepts ``t_i`` exactly when
``sum_{j<i} q(t_j) <= c < sum_{j<=i} q(t_j)``: probability ``q(t_i)``. No child is accepted with probability
``1 - sum_i q(t_i)``, and then the residual ``q`` minus the rejected siblings' mass is ``q`` restricted to the other
tokens, renormalised: token ``v`` comes out with probability ``q(v)``. So each emitted token follows the target
distribution given the accepted prefix, by induction the whole emitted sequence. (Duplicate sibling tokens would
break this: the second copy adds its mass again. SGLang's trees and HYBRID's merged trees, which fold identical
paths, have none; the tests check it.) The acceptance walk is the kernel's float32 arithmetic in the kernel's order;
the residual's cumulative sum is ``torch.cumsum``'s order, not the kernel's block scan, so a final coin within float32
rounding of a bucket edge may land one token over: a difference of measure ~1e-7, not of distribution.

``top_k_renorm_prob_cpu`` / ``top_p_renorm_prob_cpu`` follow SGLang's torch/Triton renorms
(``sglang.kernels.ops.sampling.renorm_triton``, FlashInfer's threshold semantics): keep the tokens whose probability
is at least the pivot (k-th largest; for top-p the smallest token of the ascending prefix whose cumulative mass
reaches ``1 - p``), ties kept, renormalised.
"""
from __future__ import annotations

import json
import os
from typing import Callable, List, Tuple

import torch

from . import TREE_SAMPLING_ENV
from .import_hook import patch_after_import

_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"


def _accepts(coin: torch.Tensor, prob_acc: torch.Tensor, q: torch.Tensor, thr_acc: torch.Tensor,
             thr_single: torch.Tensor) -> torch.Tensor:
    """The kernel's acceptance test for a child of target probability ``q`` after its earlier siblings' mass:
    ``prob_acc`` includes ``q``."""
    return (q > 0) & ((coin < prob_acc / thr_acc) | (q >= thr_single))


def _residual_sample(q: torch.Tensor, p: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """Rows of ``relu(q - p)`` sampled with ``coin [B]`` by FlashInfer's ``DeviceSamplingFromProb`` rule."""
    x = (q - p).clamp_min(0.0)
    cdf = torch.cumsum(x, dim=-1)
    u = coin * cdf[:, -1]
    positive = x > 0
    hit = positive & (cdf > u[:, None])
    vocab = x.shape[-1]
    ids = torch.arange(vocab, device=x.device)
    first_hit = torch.where(hit, ids, vocab).amin(-1)
    last_valid = torch.where(positive, ids, -1).amax(-1)
    fallback = torch.where(last_valid >= 0, last_valid, vocab - 1)
    return torch.where(first_hit < vocab, first_hit, fallback)


def tree_speculative_sampling_target_only_cpu(
    predicts: torch.Tensor,  # mutable [bs * W] int32
    accept_index: torch.Tensor,  # mutable [bs, num_speculative_tokens] int32
    accept_token_num: torch.Tensor,  # mutable [bs] int32
    candidates: torch.Tensor,  # [bs, W] int64
    retrive_index: torch.Tensor,  # [bs, W] int64 (global node index)
    retrive_next_token: torch.Tensor,  # [bs, W] int64 (local index, -1 none)
    retrive_next_sibling: torch.Tensor,  # [bs, W] int64 (local index, -1 none)
    uniform_samples: torch.Tensor,  # [bs, W] float32
    uniform_samples_for_final_sampling: torch.Tensor,  # [bs] float32
    target_probs: torch.Tensor,  # [bs, W, vocab] float32
    draft_probs: torch.Tensor,  # mutable [bs, W, vocab] float32
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """``tree_speculative_sampling_target_only`` (SGLang's CUDA kernel ``TreeSpeculativeSamplingTargetOnly``) in
    torch: same arguments, same in-place outputs; the rule and why it is exact are in the module docstring.
    ``deterministic`` selects the kernel's deterministic block scan; torch's cumsum is deterministic either way."""
    bs, w = candidates.shape
    spec = accept_index.shape[1]
    if not (0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0):
        raise ValueError(f"thresholds must be in [0, 1], got {threshold_single}, {threshold_acc}")
    if bs == 0:
        return
    dev = candidates.device
    rows = torch.arange(bs, device=dev)
    thr_acc = torch.tensor(max(float(threshold_acc), 1e-9), dtype=torch.float32)
    thr_single = torch.tensor(float(threshold_single), dtype=torch.float32)
    cur = torch.zeros(bs, dtype=torch.long, device=dev)               # local index of the last accepted node
    last_ri = retrive_index[:, 0].clone()                             # its global index
    accept_index[:, 0] = last_ri.to(accept_index.dtype)
    coin = uniform_samples[:, 0].to(torch.float32).clone()
    prob_acc = torch.zeros(bs, dtype=torch.float32, device=dev)
    n_acc = torch.zeros(bs, dtype=torch.long, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    for _ in range(1, spec):
        child = torch.where(alive, retrive_next_token[rows, cur], -1)
        accepted = torch.zeros(bs, dtype=torch.bool, device=dev)
        while bool((child != -1).any()):
            trying = child != -1
            c = child.clamp_min(0)
            tok = candidates[rows, c]
            q = target_probs[rows, cur, tok].to(torch.float32)
            prob_acc = torch.where(trying, prob_acc + q, prob_acc)
            acc = trying & _accepts(coin, prob_acc, q, thr_acc, thr_single)
            rej = trying & ~acc
            if bool(rej.any()):
                draft_probs[rows[rej], cur[rej], tok[rej]] = target_probs[rows[rej], cur[rej], tok[rej]]
            if bool(acc.any()):
                predicts[last_ri[acc]] = tok[acc].to(predicts.dtype)
                n_acc = n_acc + acc.long()
                ri_c = retrive_index[rows, c]
                accept_index[rows[acc], n_acc[acc]] = ri_c[acc].to(accept_index.dtype)
                last_ri = torch.where(acc, ri_c, last_ri)
                cur = torch.where(acc, c, cur)
                coin = torch.where(acc, uniform_samples[rows, c].to(torch.float32), coin)
                prob_acc = torch.where(acc, torch.zeros_like(prob_acc), prob_acc)
                accepted |= acc
            child = torch.where(rej, retrive_next_sibling[rows, c], -1)
        alive &= accepted
        if not bool(alive.any()):
            break
    accept_token_num.copy_(n_acc.to(accept_token_num.dtype))
    q_row = target_probs[rows, cur].to(torch.float32)
    p_row = torch.where((n_acc != spec - 1)[:, None], draft_probs[rows, cur].to(torch.float32),
                        torch.zeros_like(q_row))
    sampled = _residual_sample(q_row, p_row, uniform_samples_for_final_sampling.to(torch.float32))
    predicts[last_ri] = sampled.to(predicts.dtype)


def _per_row(value, n: int, dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        v = value.to(device=device, dtype=dtype).reshape(-1)
        return v.expand(n) if v.numel() == 1 else v
    return torch.full((n,), value, dtype=dtype, device=device)


def _renorm_from_pivots(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    kept = torch.where(probs >= pivots[:, None], probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_k_renorm_prob_cpu(probs: torch.Tensor, top_k) -> torch.Tensor:
    """``top_k_renorm_prob`` (FlashInfer's ``top_k_renorm_probs``; SGLang's ``top_k_renorm_probs_triton``): keep
    each row's tokens at least as probable as its ``top_k``-th largest (ties kept), renormalised."""
    p = probs.float()
    n, vocab = p.shape
    if n == 0 or vocab == 0:
        return p
    ks = _per_row(top_k, n, torch.int64, p.device)
    sorted_desc = torch.sort(p, dim=-1, descending=True).values
    cutoff = (ks - 1).clamp(0, vocab - 1)
    return _renorm_from_pivots(p, sorted_desc.gather(1, cutoff[:, None]).squeeze(1))


def top_p_renorm_prob_cpu(probs: torch.Tensor, top_p) -> torch.Tensor:
    """``top_p_renorm_prob`` (FlashInfer's ``top_p_renorm_probs``; SGLang's ``top_p_renorm_probs_triton``): sort
    ascending, drop the prefix whose cumulative mass is below ``1 - p``, keep every token at least as probable as
    the pivot (ties kept), renormalised."""
    p = probs.float()
    n, vocab = p.shape
    if n == 0 or vocab == 0:
        return p
    ps = _per_row(top_p, n, torch.float32, p.device)
    sorted_asc = torch.sort(p, dim=-1).values
    cdf = torch.cumsum(sorted_asc, dim=-1)
    cutoff = torch.searchsorted(cdf, (1.0 - ps)[:, None], right=False).squeeze(1).clamp(max=vocab - 1)
    return _renorm_from_pivots(p, sorted_asc.gather(1, cutoff[:, None]).squeeze(1))


def lifted_verify_uses_greedy(original: Callable[..., bool]) -> Callable[..., bool]:
    """``eagle_utils._verify_uses_greedy`` with the CPU gate lifted: the CPU decides like a CUDA device (greedy only
    when every request is greedy)."""

    def _verify_uses_greedy(**kwargs) -> bool:
        return original(**{**kwargs, "is_cpu": False})

    _verify_uses_greedy.__wrapped__ = original
    return _verify_uses_greedy


def sampling_verify_patches() -> List[Tuple[object, str, object]]:
    """``(module, attribute, value)`` triples that make SGLang's ``eagle_sample`` take its sampling branch on CPU with
    these stand-ins; install them with ``monkeypatch.setattr(module, attribute, value)`` (imports sglang)."""
    from sglang.srt.speculative import eagle_utils

    return [
        (eagle_utils, "_verify_uses_greedy", lifted_verify_uses_greedy(eagle_utils._verify_uses_greedy)),
        (eagle_utils, "tree_speculative_sampling_target_only", tree_speculative_sampling_target_only_cpu),
        (eagle_utils, "top_k_renorm_prob", top_k_renorm_prob_cpu),
        (eagle_utils, "top_p_renorm_prob", top_p_renorm_prob_cpu),
    ]


class _Counted:
    """The stand-in op, counting its calls, requests and accepted drafts into a JSON file after each call."""

    def __init__(self, path: str):
        self.path = path
        self.counts = {"calls": 0, "requests": 0, "accepted_drafts": 0, "pid": os.getpid()}

    def __call__(self, **kwargs) -> None:
        tree_speculative_sampling_target_only_cpu(**kwargs)
        c = self.counts
        c["calls"] += 1
        c["requests"] += int(kwargs["candidates"].shape[0])
        c["accepted_drafts"] += int(kwargs["accept_token_num"].sum())
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(c, f)
        os.replace(tmp, self.path)


def _patch_eagle_utils(counts_path: str) -> None:
    for module, name, value in sampling_verify_patches():
        if name == "tree_speculative_sampling_target_only":
            value = _Counted(counts_path)
        setattr(module, name, value)


def install_when_imported() -> bool:
    """If ``TREE_SAMPLING_ENV`` is set in this process: patch SGLang's ``eagle_utils`` now (already imported) or right
    after its import. Returns whether it is set. Called by the stand-in ``sgl_kernel`` at import."""
    counts_path = os.environ.get(TREE_SAMPLING_ENV)
    if not counts_path:
        return False
    patch_after_import(_EAGLE_UTILS, lambda _module: _patch_eagle_utils(counts_path))
    return True
