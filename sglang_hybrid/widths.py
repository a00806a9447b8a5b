"""Verify-width buckets: the price realised as compute the engine can actually save.

Why: an engine that verifies every request at one fixed width ``W`` pays ``T(R * W)`` per step whatever the price
selected; a price that only *masks* nodes inside that width saves nothing and throws expected tokens away. CUDA-graph
engines cannot verify a ragged batch either: each graph is captured for one width. So the engine captures a small set
of widths (``buckets``) and the decision picks one per step. With padding, every request gets ``W - 1`` draft slots
for the same cost, so for a bucket ``W`` the best tree of each request is its ``W - 1`` most likely nodes (the
selector's rank order: survival descending, every parent before its children, so a prefix of the selection is always
a tree), and the step's goodput is

    G(W) = (R + sum_r sum_{i < W} s_{r,i}) / T(R * W)

over the ``R`` requests (``s_{r,i}`` the survival of request ``r``'s ``i``-th ranked node, ``s_{r,0} = 1`` the root
whose token is emitted for sure). The chosen width is the first ``argmax`` of ``G`` over the buckets (the smallest of
equal ones): the price's budget ``b*`` restricted to widths the engine can run. Without a cost table (``T`` unknown,
price 0) the width is the smallest bucket that holds every request's useful nodes (positive survival).

The engine learns the width one step late: the step decides from this step's survivals which bucket the *next* step
verifies at (the host reads it after the step's results arrive, as SGLang's adaptive speculation does with its own
step counts), and verifies *this* step at the width decided before (``truncate``). Losslessness never depends on the
width: any prefix-closed tree verifies exactly.

Device code is static-shape gathers and an argmax (no host sync, CUDA-graph safe); ``truncate`` slices by a host int.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Union

import torch

from .cost import CostTables
from .selector import VerifyTree


def check_buckets(buckets: Sequence[int], max_width: int) -> tuple[int, ...]:
    """Validated, sorted, de-duplicated widths; ``max_width`` (the widest tree the configuration builds) is always
    included, so every decision has a bucket that holds it. Each width is an int in ``[1, max_width]``; width 1
    verifies the root only (no speculation)."""
    if isinstance(max_width, bool) or not isinstance(max_width, int) or max_width < 1:
        raise ValueError(f"max_width must be a positive int, got {max_width!r}")
    out = set()
    for w in buckets:
        if isinstance(w, bool) or not isinstance(w, int):
            raise ValueError(f"verify width buckets must be ints, got {w!r}")
        if not 1 <= w <= max_width:
            raise ValueError(f"verify width bucket {w} is outside [1, {max_width}] (the widest tree is n_nodes + 1 = "
                             f"{max_width}); drop it or raise n_nodes")
        out.add(w)
    out.add(max_width)
    return tuple(sorted(out))


def default_buckets(max_width: int) -> tuple[int, ...]:
    """Even widths 2 to 8 and 7, then doubling, below ``max_width``, plus ``max_width`` itself:
    ``13 -> (2, 4, 6, 7, 8, 13)``.

    Why 6: a model chain of 4-5 tokens (EAGLE's usual depth) fits 6 but not 4, and padding it to 8 cost 10 % of chat
    throughput in the realistic replay (docs/benchmarks.md). Why 7: the root, a 4-token EAGLE chain and the n-gram
    branch's first two nodes. In the realistic replay (seed 0; simulated drafter strengths 0.5, 0.7, 0.8 x code, chat,
    mixed x batch 4, 32, 128) adding it was 0.3-5.7 % faster in every batch-32 cell (mixed most) and never slower;
    every width from 2 to 13 gained nothing more (docs/benchmarks.md).
    Each bucket is one more set of captured graphs per draft depth in SGLang, so the set stays small. Width 1 (no draft
    verified) is left out: the draft forwards have already run by then, so verifying nothing rarely wins (the plugin's
    ``verify_widths`` setting refuses it: HYBRID does not switch to SGLang's zero-step draft)."""
    ws = [w for w in (2, 4, 6, 7, 8, 16, 32) if w < max_width]
    return check_buckets(ws, max_width)


#: a width between plain EAGLE's and the full tree is worth a runtime state only where the full tree's verify takes at
#: least this many times its own at the running limit (``paying_extras``)
MIN_CUT_SAVING = 1.25


def measured_table_buckets(num_steps: int, max_width: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The width buckets of a launch whose verify cost table is measured at start (no ``cost_table``, no
    ``verify_widths``): ``(required, extras)``. Required: plain EAGLE's width ``num_steps + 1`` and the full tree
    ``max_width``. Extras, in the order the worker adds them while they pay (``paying_extras``) and their runtime
    states fit the GPU memory SGLang left (``memory_budget.fit_widths``): the geometric middle of the two
    (``round(sqrt(E * full))``), then one narrower than EAGLE's (``num_steps``, at least 2).
    ``4, 13 -> ((5, 13), (8, 4))``.

    Why these two: in the realistic replay (the tuning seed 0, padded verify with a two-step lag, docs/benchmarks.md
    1a) the middle bucket lifted code at batch 32 and 128 by 16-56 % over EAGLE's width and the full tree alone (a
    long copy no longer makes the whole batch pay the full tree), and the narrower one chat at batch 128 by 6 % (a busy
    server trims EAGLE's chain by a token); width 2 changed no cell, and adding 6 and 7 as well cost chat at batch 32
    1 % (more switching under the lag). Why the middle first: it pays most where memory is tightest (batch 128)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int (EAGLE draft steps), got {num_steps!r}")
    if isinstance(max_width, bool) or not isinstance(max_width, int) or max_width < 2:
        raise ValueError(f"max_width must be an int >= 2 (the full verify tree, root included), got {max_width!r}")
    eagle = min(num_steps + 1, max_width)
    required = tuple(sorted({eagle, max_width}))
    extras = []
    for w in (round(math.sqrt(eagle * max_width)), num_steps):
        if 2 <= w < max_width and w not in required and w not in extras:
            extras.append(w)
    return required, tuple(extras)


def paying_extras(num_steps: int, max_width: int, extras: Sequence[int], step_time, batch: int) -> tuple[int, ...]:
    """The ``extras`` (``measured_table_buckets``) worth a runtime state at ``batch`` requests (the running limit),
    in order, by the verify step-time table ``step_time(n)`` (seconds at ``n`` batch tokens): a width above plain
    EAGLE's only where the full tree's verify takes at least ``MIN_CUT_SAVING`` times its own,
    ``T(batch * full) >= 1.25 T(batch * w)``; a width below EAGLE's always.

    Why: a width above EAGLE's cuts n-gram copies, and the width applies two steps after it is chosen; where it saves
    little (a memory-bound verify) a copy that starts in between is cut for almost nothing. On the replay's tuning
    seed the middle bucket 12 of 5 and 29 saved 11 % of the step at batch 4 and lost 5 % of throughput on
    copy-heavy code there, while at batch 32 (it saves 56 %) it gained 56 %. A width below EAGLE's trims the model
    chain, whose worth changes slowly."""
    eagle = min(int(num_steps) + 1, int(max_width))
    full = float(step_time(int(batch) * int(max_width)))
    return tuple(int(w) for w in extras if w < eagle or full >= MIN_CUT_SAVING * float(step_time(int(batch) * int(w))))


def default_depths(num_steps: int) -> tuple[int, ...]:
    """EAGLE draft depths adaptive drafting picks from by default: every depth up to 4, then ``num_steps // 2`` and
    ``num_steps``: ``4 -> (1, 2, 3, 4)``, ``8 -> (1, 2, 3, 4, 8)``.

    Why every small depth: a depth pairs with the width bucket its chain fills. Without depth 3, a 3-token chain in
    width 4 (root + 3: plain EAGLE's best shape on chat at batch 128 in the realistic replay) had to be drafted 4
    deep, one wasted draft forward per step (-3 % of throughput there, docs/benchmarks.md)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int (EAGLE draft steps), got {num_steps!r}")
    return tuple(sorted({d for d in (1, 2, 3, 4) if d <= num_steps} | {max(num_steps // 2, 1), num_steps}))


def start_width(buckets: Sequence[int], num_steps: int) -> int:
    """The width a fresh engine verifies at before its first decision arrives (the decision is one or two steps
    late): the narrowest bucket that holds a plain EAGLE chain of ``num_steps`` tokens and its root, else the widest.

    Why not the widest: until the first decision lands the engine knows nothing of the text, and plain EAGLE's shape
    is the usual choice on unknown text; starting at ``n_nodes + 1`` cost the first two steps of every cold start 2-3x
    a step's verify compute at batch 128 (``buckets``: validated, sorted, as ``check_buckets`` returns them)."""
    need = int(num_steps) + 1
    return next((w for w in buckets if w >= need), buckets[-1])


class WidthChoice(NamedTuple):
    """``width``: the chosen bucket (0-dim int64); ``goodput [J]``: ``G(W)`` per bucket (tokens per second with a
    cost table, expected tokens per step without one); ``b_star``: draft slots paid for at that width,
    ``R * (width - 1)`` (0-dim int64); ``lam``: the price of the next slot, the goodput lost per extra draft slot if
    the next wider bucket were verified (0-dim float32, 0 without a cost table or at the widest bucket); ``depth``:
    the chosen model-draft depth (0-dim int64; with one depth candidate, that depth)."""

    width: torch.Tensor
    goodput: torch.Tensor
    b_star: torch.Tensor
    lam: torch.Tensor
    depth: torch.Tensor


def choose_width(tree: VerifyTree, buckets: torch.Tensor, cost: Optional[CostTables] = None,
                 num_requests: Union[int, torch.Tensor, None] = None) -> WidthChoice:
    """The width bucket that maximises padded goodput for ``tree`` (selected at the widest bucket, nodes in rank
    order). ``buckets``: sorted int64 widths on the tree's device, each ``<= tree width``. ``num_requests``: the
    ``R`` of the formula (default: the batch); the step verifies ``R * W`` tokens."""
    return choose_plan(tree.survival[None], tree.valid[None], buckets, cost, num_requests)


def choose_plan(survival: torch.Tensor, valid: torch.Tensor, buckets: torch.Tensor,
                cost: Optional[CostTables] = None, num_requests: Union[int, torch.Tensor, None] = None,
                depths: Optional[torch.Tensor] = None, draft_cost: Optional[CostTables] = None) -> WidthChoice:
    """Joint choice of model-draft depth and verify width.

    ``survival``/``valid`` ``[D, B, W]``: for each candidate depth ``depths[d]`` (int64 ``[D]``, default one depth 0)
    the trees selected at the widest bucket with the model chain cut to that depth. The step with depth ``d`` and
    width ``W`` costs ``T(R W) + d * t_draft(R)`` (``t_draft`` from ``draft_cost``: one draft forward of ``R``
    requests; none: drafting is free) and is expected to emit ``R + sum_r sum_{i<W} s_{d,r,i}`` tokens; the pair of
    highest goodput wins (first maximum in depth-major order: the shallowest, then the narrowest).
    """
    nd, b, w_max = survival.shape
    dev = survival.device
    if buckets.dim() != 1 or buckets.numel() == 0 or buckets.dtype != torch.int64:
        raise ValueError("buckets must be a non-empty 1-d int64 tensor of widths")
    if buckets.device != dev:
        raise ValueError(f"buckets are on {buckets.device} but the survivals are on {dev}")
    if depths is None:
        depths = torch.zeros(1, dtype=torch.int64, device=dev)
    if depths.shape != (nd,):
        raise ValueError(f"depths must be [{nd}] (one per survival block), got {tuple(depths.shape)}")
    f32, f64 = torch.float32, torch.float64
    # expected tokens and goodput in float64: plans whose goodputs differ by a float32 rounding step are then ordered
    # the same whatever order an engine sums in (the fused kernels sum over requests in another order than torch)
    s = torch.where(valid, survival.to(f64), torch.zeros((), dtype=f64, device=dev))
    s = torch.cat([torch.zeros((nd, b, 1), dtype=f64, device=dev), s[:, :, 1:]], 2)          # drafts only
    csum = torch.cumsum(s, 2)                                                                  # [D, B, W]
    idx = (buckets - 1).clamp(min=0, max=w_max - 1)
    drafts = csum.index_select(2, idx).sum(1)                                                  # [D, J]
    r = (num_requests.to(f64) if isinstance(num_requests, torch.Tensor)
         else torch.full((), float(b if num_requests is None else num_requests), dtype=f64, device=dev))
    expected = r + drafts
    bw = buckets.to(f64)
    nj = buckets.numel()
    if cost is None:
        # T unknown: the deepest draft, and the smallest width that holds every request's useful nodes
        d_i = torch.full((), nd - 1, dtype=torch.int64, device=dev)
        useful = ((s[nd - 1] > 0).sum(1).amax() + 1).to(torch.int64)             # widest useful tree, root included
        j = torch.argmax((buckets >= useful).to(torch.int64))                    # first bucket that holds it
        goodput = expected
        lam = torch.zeros((), dtype=f32, device=dev)
    else:
        t_draft = (draft_cost.step_time(r).to(f64) if draft_cost is not None
                   else torch.zeros((), dtype=f64, device=dev))
        t_verify = cost.step_time(r * bw).to(f64)                                              # [J]
        t = t_verify[None, :] + depths.to(f64)[:, None] * t_draft                              # [D, J]
        goodput = expected / t
        flat = torch.argmax(goodput.reshape(-1))                                 # first maximum, depth-major
        d_i, j = flat // nj, flat % nj
        nxt = (j + 1).clamp(max=nj - 1)
        # index_select, not t[d_i]: a tensor used as a Python index is data-dependent for torch.compile
        row_t, row_g = t.index_select(0, d_i.reshape(1))[0], goodput.index_select(0, d_i.reshape(1))[0]
        pick = torch.stack([j, nxt])
        t_j, t_n = row_t.gather(0, pick).unbind(0)
        w_j, w_n = bw.gather(0, pick).unbind(0)
        extra = r * (w_n - w_j)
        lam = torch.where(extra > 0, row_g.gather(0, j[None])[0] * (t_n - t_j) / extra.clamp(min=1.0),
                          torch.zeros((), dtype=f64, device=dev)).to(f32)
    width = buckets.gather(0, j[None])[0]
    b_star = r.to(torch.int64) * (width - 1)
    depth = depths.gather(0, d_i.reshape(1))[0]
    goodput = goodput.to(f32)
    return WidthChoice(width, goodput.index_select(0, d_i.reshape(1))[0], b_star, lam, depth)


def truncate(tree: VerifyTree, width: int) -> VerifyTree:
    """The first ``width`` nodes of every request's tree (root included): its ``width - 1`` best-ranked drafts, a
    prefix-closed tree because the selector orders every parent before its children. ``width`` is a host int."""
    w_max = tree.tokens.shape[1]
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= w_max:
        raise ValueError(f"width must be an int in [1, {w_max}], got {width!r}")
    if width == w_max:
        return tree
    valid = tree.valid[:, :width]
    survival = tree.survival[:, :width]
    return VerifyTree(tokens=tree.tokens[:, :width], parents=tree.parents[:, :width],
                      ancestors=tree.ancestors[:, :width, :width], depth=tree.depth[:, :width], valid=valid,
                      source=tree.source[:, :width], survival=survival,
                      expected_accepted=torch.where(valid[:, 1:], survival[:, 1:], 0.0).sum(1))


def widen(tree: VerifyTree, width: int) -> VerifyTree:
    """``tree`` padded to ``width`` nodes per request with invalid nodes (the inverse of ``truncate``): a ragged
    verify runs every step at the full width, where padding costs nothing, while the price still chooses how many nodes
    each step may verify. ``width`` is a host int, at least the tree's."""
    b, w = tree.tokens.shape
    if isinstance(width, bool) or not isinstance(width, int) or width < w:
        raise ValueError(f"width must be an int >= the tree's {w}, got {width!r}")
    if width == w:
        return tree
    pad = width - w

    def right(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, pad), value=value)

    return VerifyTree(tokens=right(tree.tokens, -1), parents=right(tree.parents, -1),
                      ancestors=torch.nn.functional.pad(tree.ancestors, (0, pad, 0, pad), value=False),
                      depth=right(tree.depth, 0), valid=right(tree.valid, False), source=right(tree.source, -1),
                      survival=right(tree.survival, 0.0), expected_accepted=tree.expected_accepted)


__all__ = ["WidthChoice", "check_buckets", "choose_plan", "choose_width", "default_buckets", "default_depths",
           "start_width", "truncate", "widen"]
