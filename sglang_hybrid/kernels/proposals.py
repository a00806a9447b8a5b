"""The n-gram side of HYBRID's step before the decision, as two Triton kernels: align, then prompt lookup.

Why: in the torch path, recording the root, aligning the host's late proposals (``sglang_plugin.alignment``), the
device prompt lookup (``sglang_plugin.context_lookup``) and the merge of the two are about two hundred small operators
per step. Here they are two launches:

1. ``_prepare_kernel`` (grid: request blocks) fuses ``alignment.ring_write_root``, ``context_lookup.write_rows`` of
   the root, ``alignment.align`` and the gather of each request's online EAGLE offset (``HybridStep.select``).
   Invariant that makes it exact: align compares the proposal's first ``d`` tokens with the committed tokens at
   positions ``at .. seq_len``; the last of them is the root this kernel writes, so it takes the root from its
   register instead of reading the ring back (every other compared position is less than the ring length away from
   ``seq_len``, hence in another ring column).
2. ``_lookup_kernel`` (grid: requests) fuses ``context_lookup.lookup`` and ``context_lookup.fill_missing`` for the
   rows left without an aligned proposal (the others keep theirs, as ``fill_missing`` keeps them). It scans each
   row's first ``span`` positions in chunks: the first pass keeps the longest match and, among equals, the latest end
   (chunks go in increasing position, so a later chunk's equal match replaces the kept one), the second counts the
   occurrences as long as it and those followed by the copied token. Integer arithmetic throughout: exact.
"""
from __future__ import annotations

import triton
import triton.language as tl


#: ``_prepare_kernel``: the batch size is not specialised (a runtime int moving every step; it masks the last block's
#: rows), nor the alignment of SGLang's tensors (request slots, sequence lengths, the root tokens: per-row loads).
PREPARE_DNS, PREPARE_DNA = ("B",), ("slots_ptr", "seq_ptr", "root_ptr")


@triton.jit(do_not_specialize=PREPARE_DNS, do_not_specialize_on_alignment=PREPARE_DNA)
def _prepare_kernel(
        slots_ptr, seq_ptr, gen_ptr, root_ptr,
        b_tok_ptr, b_len_ptr, b_at_ptr, b_gen_ptr, b_ml_ptr, b_ct_ptr, b_tt_ptr, b_src_ptr, ring_ptr, ctx_ptr,
        mb_ptr, mb_gen_ptr, nb_ptr, nb_gen_ptr,
        o_tok_ptr, o_len_ptr, o_dep_ptr, o_ml_ptr, o_ct_ptr, o_tt_ptr, o_src_ptr, o_shift_ptr, o_bias_ptr,
        o_nbias_ptr,
        B,
        PW: tl.constexpr, PW2: tl.constexpr, R: tl.constexpr, L: tl.constexpr, HAS_CTX: tl.constexpr,
        HAS_BIAS: tl.constexpr, NG_BIAS: tl.constexpr, BB: tl.constexpr):
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rows < B
    slot = tl.load(slots_ptr + rows, mask=rmask, other=0).to(tl.int64)
    seq = tl.load(seq_ptr + rows, mask=rmask, other=0).to(tl.int64)
    gen = tl.load(gen_ptr + rows, mask=rmask, other=0).to(tl.int64)
    root = tl.load(root_ptr + rows, mask=rmask, other=0).to(tl.int64)
    # the root: last committed token, at position seq_len (ring column seq_len % R; the context table's trash column
    # L when the position is past the table)
    tl.store(ring_ptr + slot * (R + 1) + seq % R, root, mask=rmask)
    if HAS_CTX:
        tl.store(ctx_ptr + slot * (L + 1) + tl.where(seq < L, seq, L), root.to(tl.int32), mask=rmask)
    # alignment of the host's proposal, computed at committed length ``at``, to the ``seq_len + 1`` committed now
    committed = seq + 1
    length = tl.load(b_len_ptr + slot, mask=rmask, other=0)
    at = tl.load(b_at_ptr + slot, mask=rmask, other=0)
    d = committed - at
    j = tl.arange(0, PW2)
    m2 = rmask[:, None] & (j[None, :] < PW)
    row_base = slot[:, None] * PW
    toks = tl.load(b_tok_ptr + row_base + j[None, :], mask=m2, other=-1)
    pos = at[:, None] + j[None, :]
    ring_tok = tl.load(ring_ptr + slot[:, None] * (R + 1) + pos % R, mask=m2, other=-1)
    ring_tok = tl.where(pos == seq[:, None], root[:, None], ring_tok)
    agree = (ring_tok == toks) | (j[None, :] >= d[:, None]) | (j[None, :] >= PW)
    overlap_ok = tl.min(agree.to(tl.int32), 1) > 0
    ok = (tl.load(b_gen_ptr + slot, mask=rmask, other=-1) == gen) & (d >= 0) & (d < length) & (d <= R) & overlap_ok
    shift = tl.where(ok, d, 0)
    src = tl.minimum(j[None, :] + shift[:, None], PW - 1)
    new_len = tl.where(ok, length - shift, 0)
    keep = (j[None, :] < new_len[:, None]) & m2
    out = rows.to(tl.int64)[:, None] * PW + j[None, :]
    tl.store(o_tok_ptr + out, tl.where(keep, tl.load(b_tok_ptr + row_base + src, mask=m2, other=-1), -1), mask=m2)
    tl.store(o_dep_ptr + out, tl.where(keep, j[None, :] + 1, 0).to(tl.int64), mask=m2)
    tl.store(o_ml_ptr + out, tl.where(keep, tl.load(b_ml_ptr + row_base + src, mask=m2, other=0), 0), mask=m2)
    tl.store(o_ct_ptr + out, tl.where(keep, tl.load(b_ct_ptr + row_base + src, mask=m2, other=0), 0), mask=m2)
    tl.store(o_tt_ptr + out, tl.where(keep, tl.load(b_tt_ptr + row_base + src, mask=m2, other=0), 0), mask=m2)
    tl.store(o_src_ptr + out, tl.where(keep, tl.load(b_src_ptr + row_base + src, mask=m2, other=0), 0), mask=m2)
    tl.store(o_len_ptr + rows, new_len, mask=rmask)
    tl.store(o_shift_ptr + rows, shift, mask=rmask)
    if HAS_BIAS:
        same = tl.load(mb_gen_ptr + slot, mask=rmask, other=-1) == gen
        tl.store(o_bias_ptr + rows, tl.where(same, tl.load(mb_ptr + slot, mask=rmask, other=0.0), 0.0), mask=rmask)
    if NG_BIAS:
        same_n = tl.load(nb_gen_ptr + slot, mask=rmask, other=-1) == gen
        tl.store(o_nbias_ptr + rows, tl.where(same_n, tl.load(nb_ptr + slot, mask=rmask, other=0.0), 0.0),
                 mask=rmask)


@triton.jit
def _match_lengths(base, e, i, tail, tc, span, N_MAX: tl.constexpr, N2: tl.constexpr):
    """``m(e)`` for the end positions ``e`` (``[CH]``): the leading run of ``c[e - i] == tail[i]`` over ``i < N_MAX``,
    0 where no committed token follows ``e`` (``e > tc - 2``), -1 past the span (``context_lookup._match_lengths``)."""
    wpos = e[:, None] - i[None, :]
    win = tl.load(base + tl.maximum(wpos, 0), mask=(wpos >= 0) & (e[:, None] < span), other=-3)
    eq = (win == tail[None, :]) & (i[None, :] < N_MAX) & ((i[None, :] > 0) | (e[:, None] <= tc - 2))
    m = tl.min(tl.where(eq, N2, i[None, :]), 1)                     # first mismatch = the leading run's length
    return tl.where(e < span, m, -1)


#: ``_lookup_kernel``: ``span`` (a power of two or the table's length, set per step by the batch's longest context)
#: only bounds the chunk loops and masks their last chunk: not specialised; nor the alignment of SGLang's slots and
#: sequence lengths (one scalar load per program).
LOOKUP_DNS, LOOKUP_DNA = ("span",), ("slots_ptr", "seq_ptr")


@triton.jit(do_not_specialize=LOOKUP_DNS, do_not_specialize_on_alignment=LOOKUP_DNA)
def _lookup_kernel(
        ctx_ptr, ctx_gen_ptr, slots_ptr, seq_ptr, gen_ptr,
        o_tok_ptr, o_len_ptr, o_dep_ptr, o_ml_ptr, o_ct_ptr, o_tt_ptr, o_src_ptr, from_lookup_ptr,
        span,
        L: tl.constexpr, K: tl.constexpr, K2: tl.constexpr, N_MAX: tl.constexpr, N2: tl.constexpr,
        N_MIN: tl.constexpr, N_LONG: tl.constexpr, CH: tl.constexpr):
    row = tl.program_id(0)
    r64 = row.to(tl.int64)
    use = tl.load(o_len_ptr + row) == 0
    got = tl.full((), 0, tl.int32)
    if use:
        slot = tl.load(slots_ptr + row).to(tl.int64)
        t = tl.load(seq_ptr + row).to(tl.int64) + 1                    # committed tokens, root included
        fits = (t <= span) & (tl.load(ctx_gen_ptr + slot) == tl.load(gen_ptr + row).to(tl.int64))
        tc = tl.minimum(t, span)
        base = ctx_ptr + slot * (L + 1)
        i = tl.arange(0, N2)
        tpos = tc - 1 - i
        tail = tl.where(tpos >= 0, tl.load(base + tl.maximum(tpos, 0), mask=i < N_MAX, other=-2), -2)
        # pass 1: the longest match m(e) over end positions e <= tc - 2, the latest among equals
        best = tl.full((), -1, tl.int32)
        e_star = tl.full((), 0, tl.int64)
        for e0 in range(0, span, CH):
            e = e0 + tl.arange(0, CH).to(tl.int64)
            m = _match_lengths(base, e, i, tail, tc, span, N_MAX, N2)
            c_best = tl.max(m, 0)
            c_e = tl.max(tl.where(m == c_best, e, -1), 0)
            take = c_best >= best
            e_star = tl.where(take, c_e, e_star)
            best = tl.where(take, c_best, best)
        first = tl.load(base + tl.minimum(e_star + 1, span - 1))
        # pass 2: occurrences as long as the chosen one, and those followed by the copied token
        total = tl.full((), 0, tl.int32)
        count = tl.full((), 0, tl.int32)
        for e0 in range(0, span, CH):
            e = e0 + tl.arange(0, CH).to(tl.int64)
            m = _match_lengths(base, e, i, tail, tc, span, N_MAX, N2)
            strong = (m == tl.where(best > 0, best, -1)) & (e < span)
            nxt = tl.load(base + tl.minimum(e + 1, span - 1), mask=e < span - 1, other=-4)
            total += tl.sum(strong.to(tl.int32), 0)
            count += tl.sum((strong & (e <= span - 2) & (nxt == first)).to(tl.int32), 0)
        # the calibration's match length: the chosen occurrence's full match, up to N_LONG, when it reached N_MAX
        li = tl.arange(0, N_LONG).to(tl.int64)
        at_e = e_star - li
        at_t = tc - 1 - li
        same = (tl.load(base + tl.maximum(at_e, 0)) == tl.load(base + tl.maximum(at_t, 0))) & (at_e >= 0)
        run = tl.min(tl.where(same, N_LONG, li), 0)
        match = tl.where(best >= N_MAX, run, best.to(tl.int64))
        ok = fits & (best >= N_MIN)
        length = tl.where(ok, K, 0)
        j = tl.arange(0, K2)
        jm = j < K
        keep = j < length
        jj = j % tl.maximum(tc - 1 - e_star, 1)                        # past the root the copy repeats itself
        copied = tl.load(base + tl.minimum(e_star + 1 + jj, span - 1), mask=jm, other=-1).to(tl.int64)
        out = r64 * K + j
        tl.store(o_tok_ptr + out, tl.where(keep, copied, -1), mask=jm)
        tl.store(o_dep_ptr + out, tl.where(keep, j + 1, 0).to(tl.int64), mask=jm)
        tl.store(o_ml_ptr + out, tl.where(keep, match + jj, 0), mask=jm)
        tl.store(o_ct_ptr + out, tl.where(keep, count, 0).to(tl.int64), mask=jm)
        tl.store(o_tt_ptr + out, tl.where(keep, total, 0).to(tl.int64), mask=jm)
        tl.store(o_src_ptr + out, tl.zeros((K2,), tl.int64), mask=jm)
        tl.store(o_len_ptr + row, length)
        got = (length > 0).to(tl.int32)
    tl.store(from_lookup_ptr + row, got > 0)
