"""Conditional acceptance -> survival (probability that a draft node is accepted).

A draft node is accepted only if its whole path from the root is, so its survival is the product of the conditional
acceptances ``a`` along that path. Chains are a cumulative product; trees use pointer jumping (each round doubles the
span of ancestors already multiplied in), so a tree of ``N`` nodes needs ``ceil(log2(N))`` gathers -- a static number,
which keeps the function CUDA-graph and ``torch.compile(fullgraph=True)`` safe.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks


def _valid_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, device=lengths.device)[None, :] < lengths.to(torch.int64)[:, None]


def chain_parents(batch: int, k: int, device=None) -> torch.Tensor:
    """Parents of a chain in tree layout: node ``j`` has parent ``j - 1`` (``-1`` = root)."""
    return (torch.arange(k, device=device, dtype=torch.int64) - 1).expand(batch, k).contiguous()


def chain_products(a: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``p[b, j] = prod_{i <= j} a[b, i]`` for ``j < lengths[b]``, else 0, float64 ``[B, K]``: the product a chain's
    survivals (``chain_survival``) and its EAGLE alternatives' (``DecisionStep.alternatives_survival``: the parent's
    product times the alternative's acceptance) are each rounded from once, so one as likely as the chain's token
    beside it ties with it exactly. No input checks: ``chain_survival`` makes them."""
    a = a.to(torch.float32)
    return _products(a, _valid_mask(lengths, a.shape[1]))


def _products(a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.cumprod(torch.where(valid, a, torch.zeros_like(a)).to(torch.float64), dim=1)


def chain_survival(a: torch.Tensor, lengths: torch.Tensor, check_values: Optional[bool] = None) -> torch.Tensor:
    """``s[b, j] = prod_{i <= j} a[b, i]`` for ``j < lengths[b]``, else 0. float32 ``[B, K]``.

    The product runs in float64 and each entry is rounded once to float32 (``chain_products``; what torch's
    ``cumprod`` of a float32 tensor does on the CPU anyway, on a GPU it would run in float32). Why: an EAGLE
    alternative's survival is rounded from the same product times its own acceptance, so an alternative exactly as
    likely as the chain's token beside it ties with it exactly on every device, and the fused kernels, which take the
    same products, order the two as this reference does."""
    _checks.float_tensor(a, "a", 2)
    _checks.int_tensor(lengths, "lengths", 1)
    _checks.same_device(["a", "lengths"], [a, lengths])
    _checks.shape(lengths, "lengths", (a.shape[0],))
    if _checks.want_values(check_values, a, lengths):
        _checks.probabilities(a, "a")
        _checks.lengths(lengths, "lengths", a.shape[1])
    a = a.to(torch.float32)
    valid = _valid_mask(lengths, a.shape[1])
    s = _products(a, valid).to(torch.float32)
    return torch.where(valid, s, torch.zeros_like(s))


def _path_reduce(values: torch.Tensor, parents: torch.Tensor, combine) -> torch.Tensor:
    """Reduce ``values`` over each node's path node..root (root excluded) by pointer jumping.

    ``parents[b, i] < i`` or ``-1``. Invariant after round r: ``acc[i]`` combines the ``2^r`` nearest path nodes
    starting at ``i``; ``up[i]`` = the ancestor ``2^r`` steps above ``i`` (``-1`` once past the root). A path has at
    most ``n`` nodes, so ``ceil(log2 n)`` rounds -- a static count -- finish it.
    """
    n = values.shape[1]
    acc = values
    up = parents.to(torch.int64)
    for _ in range(max(0, (n - 1).bit_length())):
        has = up >= 0
        idx = up.clamp(min=0)
        acc = torch.where(has, combine(acc, torch.gather(acc, 1, idx)), acc)
        up = torch.where(has, torch.gather(up, 1, idx), up)
    return acc


def path_product(values: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Product of ``values`` along each node's path from the root (root excluded)."""
    return _path_reduce(values, parents, torch.mul)


def path_sum(values: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` along each node's path from the root (root excluded); with ones this is the depth."""
    return _path_reduce(values, parents, torch.add)


def path_min(values: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Minimum of ``values`` along each node's path from the root (root excluded)."""
    return _path_reduce(values, parents, torch.minimum)


def tree_survival(a: torch.Tensor, parents: torch.Tensor, lengths: torch.Tensor,
                  check_values: Optional[bool] = None) -> torch.Tensor:
    """Survival of each node of a draft tree: product of ``a`` along its path; 0 for ``i >= lengths[b]``."""
    _checks.float_tensor(a, "a", 2)
    _checks.int_tensor(parents, "parents", 2)
    _checks.int_tensor(lengths, "lengths", 1)
    _checks.same_device(["a", "parents", "lengths"], [a, parents, lengths])
    _checks.shape(parents, "parents", tuple(a.shape))
    _checks.shape(lengths, "lengths", (a.shape[0],))
    n = a.shape[1]
    valid = _valid_mask(lengths, n)
    if _checks.want_values(check_values, a, parents, lengths):
        _checks.probabilities(a, "a")
        _checks.lengths(lengths, "lengths", n)
        check_parents(parents, valid, "parents")
    a = a.to(torch.float32)
    par = torch.where(valid, parents.to(torch.int64), torch.full_like(parents, -1, dtype=torch.int64))
    s = path_product(torch.where(valid, a, torch.zeros_like(a)), par)
    return torch.where(valid, s, torch.zeros_like(s))


def check_parents(parents: torch.Tensor, valid: torch.Tensor, name: str) -> None:
    """Host-side check of the topological-order contract ``-1 <= parents[i] < i`` on valid nodes."""
    if parents.numel() == 0:
        return
    idx = torch.arange(parents.shape[1], device=parents.device)[None, :]
    p = parents.to(torch.int64)
    bad = valid & ((p < -1) | (p >= idx))
    if bool(bad.any()):
        b, i = [int(v) for v in bad.nonzero()[0]]
        raise ValueError(f"{name}[{b}, {i}] = {int(p[b, i])}: parents must satisfy -1 <= parents[i] < i")
    # a valid node's parent must itself be valid
    pv = torch.gather(valid, 1, p.clamp(min=0)) | (p < 0)
    bad = valid & ~pv
    if bool(bad.any()):
        b, i = [int(v) for v in bad.nonzero()[0]]
        raise ValueError(f"{name}[{b}, {i}] points to an invalid (padding) parent {int(p[b, i])}")
