"""``ContextCostTables.follow`` for the verify and the draft table in one Triton launch.

Why a kernel: the fused step runs in a handful of launches (``bench.step_launches``); the torch rule is 23
operators a table. One program reads the batch's committed tokens, blends each table at their mean and writes the
seconds and segment slopes in place, with the same float32 operations in the same order as the torch rule, so both
paths price alike (tests/kernels/test_fused_decision.py compares them exactly). The tables measured at start have one
entry per probe batch size (a dozen at most), so the running maximum is a loop over the entries, unrolled at compile
time; a table of more than ``MAX_ENTRIES`` (a user's file) follows by the torch rule instead.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang_hybrid.cost import ContextCostTables

#: committed-token counts summed per loop iteration
BLOCK = 256
#: entries of a table the kernel unrolls its loop over; a longer one follows by ``ContextCostTables.follow``
MAX_ENTRIES = 64


@triton.jit
def _blend(mean, sizes_ptr, short_ptr, long_ptr, seconds_ptr, slope_ptr, c_short_ptr, c_span_ptr,
           NS: tl.constexpr):
    """One table: ``seconds[i] = running max of short[i] + w * (long[i] - short[i])``, ``slope[i]`` the slope of
    the segment that ends at entry ``i`` (entry ``NS`` the last segment's again; entry 0, flat, is left at 0)."""
    w = tl.maximum((mean - tl.load(c_short_ptr)) / tl.load(c_span_ptr), 0.0)
    run = tl.load(short_ptr) + w * (tl.load(long_ptr) - tl.load(short_ptr))
    tl.store(seconds_ptr, run)
    x_prev = tl.load(sizes_ptr)
    for i in tl.static_range(1, NS):
        lo = tl.load(short_ptr + i)
        v = tl.maximum(run, lo + w * (tl.load(long_ptr + i) - lo))
        x = tl.load(sizes_ptr + i)
        slope = (v - run) / (x - x_prev)
        tl.store(seconds_ptr + i, v)
        tl.store(slope_ptr + i, slope)
        if i == NS - 1:
            tl.store(slope_ptr + NS, slope)
        run, x_prev = v, x


#: Not specialised: the batch size (the loop's bound and the mean's divisor, a runtime int that moves every step) and
#: the alignment of SGLang's sequence lengths (summed in ``BLOCK_B`` chunks; nothing to vectorise at this size).
FOLLOW_DNS, FOLLOW_DNA = ("B",), ("seq_ptr",)


@triton.jit(do_not_specialize=FOLLOW_DNS, do_not_specialize_on_alignment=FOLLOW_DNA)
def _follow_kernel(seq_ptr, B,
                   sz_ptr, ss_ptr, ls_ptr, sec_ptr, sl_ptr, cs_ptr, cw_ptr,
                   dsz_ptr, dss_ptr, dls_ptr, dsec_ptr, dsl_ptr, dcs_ptr, dcw_ptr,
                   NS: tl.constexpr, NDS: tl.constexpr, HAS_VERIFY: tl.constexpr, HAS_DRAFT: tl.constexpr,
                   BLOCK_B: tl.constexpr):
    o = tl.arange(0, BLOCK_B)
    total = tl.zeros((BLOCK_B,), tl.int64)
    for start in range(0, B, BLOCK_B):
        total += tl.load(seq_ptr + start + o, mask=start + o < B, other=0).to(tl.int64)
    mean = tl.sum(total, 0).to(tl.float32) / B
    if HAS_VERIFY:
        _blend(mean, sz_ptr, ss_ptr, ls_ptr, sec_ptr, sl_ptr, cs_ptr, cw_ptr, NS)
    if HAS_DRAFT:
        _blend(mean, dsz_ptr, dss_ptr, dls_ptr, dsec_ptr, dsl_ptr, dcs_ptr, dcw_ptr, NDS)


def _args(t: Optional[ContextCostTables], dummy: torch.Tensor) -> tuple:
    if t is None:
        return (dummy,) * 7
    return t.sizes, t.short_seconds, t.long_seconds, t.seconds, t._seg_slope, t._c_short, t._c_span


def follow_context(seq_lens: torch.Tensor, cost: Optional[ContextCostTables],
                   draft_cost: Optional[ContextCostTables]) -> None:
    """``cost.follow(seq_lens)`` and ``draft_cost.follow(seq_lens)`` (either may be None) in one launch."""
    if seq_lens.numel() < 1 or not seq_lens.is_contiguous():
        raise ValueError("follow_context needs a non-empty contiguous seq_lens")
    long = [t for t in (cost, draft_cost) if t is not None and t.sizes.numel() > MAX_ENTRIES]
    for table in long:
        table.follow(seq_lens)
    cost, draft_cost = (None if t is None or t in long else t for t in (cost, draft_cost))
    if cost is None and draft_cost is None:
        return
    any_table = cost if cost is not None else draft_cost
    _follow_kernel[(1,)](
        seq_lens, seq_lens.numel(), *_args(cost, any_table.sizes), *_args(draft_cost, any_table.sizes),
        NS=cost.sizes.numel() if cost is not None else 1,
        NDS=draft_cost.sizes.numel() if draft_cost is not None else 1,
        HAS_VERIFY=cost is not None, HAS_DRAFT=draft_cost is not None, BLOCK_B=BLOCK)
