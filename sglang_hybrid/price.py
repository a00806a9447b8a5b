"""Goodput budget ``b*`` and price ``lambda`` per verified draft slot.

With ``R`` requests each step emits ``R`` tokens for sure (the bonus) plus the accepted drafts. Verifying the ``b``
most likely draft slots of the batch yields goodput ``G(b) = (R + sum_{i<=b} s_(i)) / T(R + b)``. At the optimum
``b*`` one more slot costs ``T(R+b*+1) - T(R+b*)`` seconds, during which the batch would have produced ``G(b*)``
tokens per second, so a slot is worth verifying iff its survival ``s >= lambda = G(b*) (T(R+b*+1) - T(R+b*))``.

The marginal formula is exact for a smooth ``T``; on a staircase (CUDA-graph buckets) ``T(n+1) - T(n)`` at ``b*`` can
be a whole bucket's jump, which would price out the very slots the budget chose. So ``lambda`` is clamped into the
interval that separates the budget from the rest: at most ``s_(b*)`` (every slot in the budget passes ``s >= lambda``)
and above ``s_(b*+1)`` when that survival is positive (the next slot does not). Ties at the boundary pass together.
On smooth tables the clamp rarely binds; ``lambda`` stays ``0`` when every positive slot fits the budget.

``price_device`` is sort + cumsum + argmax on the device (no host sync); ``price_rows`` prices several candidate
sets of one batch at once (adaptive drafting prices every candidate depth), the same arithmetic row by row.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch

from . import _checks
from .cost import CostTables


def price_device(survivals: torch.Tensor, num_requests: Union[int, torch.Tensor], cost: CostTables,
                 check_values: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b_star, lam)`` as 0-dim int64 / float32 tensors on ``survivals.device``.

    ``survivals``: ``[B, K]`` candidate survivals of the batch, ``0`` for padding. ``b_star`` is the first argmax of
    ``G`` over ``b = 0..B*K`` (so zero-survival slots never enter the budget unless ``T`` is flat).
    """
    _checks.float_tensor(survivals, "survivals", 2)
    b_star, lam = price_rows(survivals[None], num_requests, cost, check_values)
    return b_star.squeeze(0), lam.squeeze(0)


def price_rows(survivals: torch.Tensor, num_requests: Union[int, torch.Tensor], cost: CostTables,
               check_values: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``price_device`` of each of ``D`` alternative candidate sets of the same batch: ``survivals [D, B, K]`` ->
    ``(b_star [D] int64, lam [D] float32)``, row ``d`` equal to ``price_device(survivals[d], ...)``. One sort, cumsum
    and argmax over all rows: why it exists is the per-step cost of adaptive drafting, which prices every candidate
    depth."""
    _checks.float_tensor(survivals, "survivals", 3)
    if not isinstance(cost, CostTables):
        raise TypeError("cost must be a CostTables (use CostModel.to(device))")
    if cost.device != survivals.device:
        raise ValueError(f"cost tables are on {cost.device} but survivals are on {survivals.device}")
    if isinstance(num_requests, torch.Tensor):
        if num_requests.dim() != 0:
            raise ValueError("num_requests must be an int or a 0-dim tensor")
        if num_requests.device != survivals.device:
            raise ValueError(f"num_requests is on {num_requests.device} but survivals are on {survivals.device}")
    elif not isinstance(num_requests, (int, np.integer)) or num_requests < 0:
        raise ValueError(f"num_requests must be a non-negative int, got {num_requests!r}")
    if _checks.want_values(check_values, survivals):
        _checks.probabilities(survivals, "survivals")
    d = survivals.shape[0]
    flat = survivals.reshape(d, -1).to(torch.float32)
    srt = torch.sort(flat, dim=1, descending=True).values
    csum = torch.cat([torch.zeros((d, 1), dtype=torch.float32, device=flat.device), torch.cumsum(srt, 1)], 1)
    b = torch.arange(csum.shape[1], device=flat.device)
    # torch.full (a fill kernel), not as_tensor (a host-to-device copy that CUDA graph capture rejects)
    r = (num_requests.to(torch.float32) if isinstance(num_requests, torch.Tensor)
         else torch.full((), float(num_requests), dtype=torch.float32, device=flat.device))
    g = (r + csum) / cost.step_time(r + b)[None, :]
    b_star = torch.argmax(g, 1)       # first maximum per row: the smallest optimal budget
    g_star = g.amax(1)
    n_star = r + b_star.to(torch.float32)
    lam = g_star * (cost.step_time(n_star + 1.0) - cost.step_time(n_star))
    # s_(b*) (inf when b* = 0) and s_(b*+1) (0 past the last slot), by one gather on a padded copy.
    inf = torch.full((d, 1), float("inf"), dtype=torch.float32, device=flat.device)
    padded = torch.cat([inf, srt, torch.zeros_like(inf)], 1)
    # gather, not padded[b_star]: a tensor used as a Python index is data-dependent for torch.compile
    s_in, s_out = padded.gather(1, torch.stack([b_star, b_star + 1], 1)).unbind(1)
    lo = torch.where(s_out > 0, torch.nextafter(s_out, inf[:, 0]), torch.zeros_like(s_out))
    lam = torch.minimum(torch.maximum(lam, lo), s_in)
    return b_star, lam
