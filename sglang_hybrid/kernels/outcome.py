"""HYBRID's work after the verify in one Triton kernel: record what was committed, count it, learn from it.

Why: ``HybridStep.after_verify`` in torch is about a hundred small operators per step. This kernel (one program,
looping over the batch: the counters are a handful of sums, and one program adds them without atomics, in a fixed
order) fuses

* ``alignment.ring_write_emitted`` and ``context_lookup.write_rows`` of the emitted tokens (the alignment ring and the
  prompt lookup's context table; a position past the table or past the emitted length is skipped, where the torch
  path writes it to the trash column, which nothing reads);
* ``HybridCounters.on_accept`` (accepted drafts per tree class) and ``HybridCounters.on_chain_outcome`` of both
  sides;
* ``request_bias.chain_outcome`` (which EAGLE chain tokens the verify tested, which hit) and
  ``request_bias.update_bias`` (each request's online offset, stored with its slot generation); the same for the
  n-gram chain the step priced (counted always, learned from when the n-gram side learns an offset);
* ``online_calibration.update_temperatures`` (the model calibration's per-depth temperatures, in place, from every
  request's tested chain tokens: the one program sums their gradients over the batch, then takes the step).

Exact: copies, integer counts and float sums of the same terms in the same roles (the float64 counter sums and the
offset's float32 sum over chain positions may round in another order than torch's; both are within 1e-6).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decision import tree_class


@triton.jit
def _chain_outcome(tok_ptr, tok_s0, length, acc_ptr, emit_ptr, emit_s0, emit_s1, r64, rm, n,
                   N: tl.constexpr, N2: tl.constexpr, C: tl.constexpr):
    """``request_bias.chain_outcome`` for a block of rows: ``(tested, hit, acceptance)`` ``[rows, N2]`` of the chain
    at ``tok_ptr`` (row stride ``tok_s0``, unit column stride; its first ``length`` tokens, a scalar or ``[rows,
    1]``) against the tokens the step committed (``n`` per row), and the acceptances it was priced with (``acc_ptr``,
    ``[B, N]`` contiguous). One rule for the EAGLE chain and the n-gram chain."""
    c = tl.arange(0, N2)
    m = rm[:, None] & (c[None, :] < N)
    tok = tl.load(tok_ptr + r64[:, None] * tok_s0 + c[None, :], mask=m, other=-2).to(tl.int64)
    committed = tl.load(emit_ptr + r64[:, None] * emit_s0 + c[None, :] * emit_s1,
                        mask=m & (c[None, :] < C), other=-1).to(tl.int64)
    hit = (tok == committed) & (c[None, :] < n[:, None]) & m
    first_miss = tl.min(tl.where(hit, N2, c[None, :]), 1)
    tested = (c[None, :] <= first_miss[:, None]) & (c[None, :] < n[:, None]) & (c[None, :] < length) & m
    a = tl.load(acc_ptr + r64[:, None] * N + c[None, :], mask=m, other=0.0)
    return tested, hit & tested, a


@triton.jit
def _count(tested, hit, a, tested_n, pred_sum, hit_n):
    """``HybridCounters.on_chain_outcome``'s three sums, added to the running ones (float64)."""
    tested_n += tl.sum(tl.sum(tested.to(tl.float64), 1), 0)
    pred_sum += tl.sum(tl.sum(tl.where(tested, a.to(tl.float64), 0.0), 1), 0)
    hit_n += tl.sum(tl.sum(hit.to(tl.float64), 1), 0)
    return tested_n, pred_sum, hit_n


@triton.jit
def _learn(used_ptr, table_ptr, gen_table_ptr, gen_ptr, rows, rm, slot, tested, hit, a, ETA: tl.constexpr):
    """``request_bias.update_bias`` of the offsets the step used (``used_ptr``), stored in the slot-indexed table with
    the slot's request generation (``HybridStep``'s ``_learn_offsets``)."""
    g = tl.sum(tl.where(tested, hit.to(tl.float32) - a, 0.0), 1)
    tl.store(table_ptr + slot, tl.load(used_ptr + rows, mask=rm, other=0.0) + ETA * g, mask=rm)
    tl.store(gen_table_ptr + slot, tl.load(gen_ptr + rows, mask=rm, other=0).to(tl.int64), mask=rm)


@triton.jit
def _temperature_step(temps_ptr, g2_ptr, col_g, sj, S: tl.constexpr, NT: tl.constexpr, NT2: tl.constexpr,
                      ETA: tl.constexpr, DECAY: tl.constexpr, POOL: tl.constexpr, W_LO: tl.constexpr,
                      W_HI: tl.constexpr, NORM_EPS_C: tl.constexpr):
    """``online_calibration.update_temperatures`` from the chain columns' summed gradients ``col_g [S2]``: column
    ``j`` belongs to temperature ``min(j, NT - 1)``; each temperature's gradient plus ``POOL`` times their sum, the
    running squared gradients (``g2_ptr``) and the clamped inverse temperature's step, stored in place."""
    pp = tl.arange(0, NT2)
    pm = pp < NT
    col = tl.minimum(sj, NT - 1)
    g = tl.sum(tl.where((col[None, :] == pp[:, None]) & (sj[None, :] < S), col_g[None, :], 0.0), 1)
    g = g + POOL * tl.sum(g, 0)
    g2 = DECAY * tl.load(g2_ptr + pp, mask=pm, other=0.0).to(tl.float64) + g * g
    w = 1.0 / tl.load(temps_ptr + pp, mask=pm, other=1.0).to(tl.float64)
    w = tl.minimum(tl.maximum(w - ETA * g / (tl.sqrt(g2) + NORM_EPS_C), W_LO), W_HI)
    tl.store(g2_ptr + pp, g2.to(tl.float32), mask=pm)
    tl.store(temps_ptr + pp, (1.0 / w).to(tl.float32), mask=pm)


@triton.jit
def _add_totals(totals_ptr, C_T: tl.constexpr, C_P: tl.constexpr, C_H: tl.constexpr, tested_n, pred_sum, hit_n):
    tl.store(totals_ptr + C_T, tl.load(totals_ptr + C_T) + tested_n)
    tl.store(totals_ptr + C_P, tl.load(totals_ptr + C_P) + pred_sum)
    tl.store(totals_ptr + C_H, tl.load(totals_ptr + C_H) + hit_n)


#: Not specialised: the batch size (the loop's bound, moving every step) and the strides (the emitted tokens' follow
#: the verify width, the chains' the depth and proposal width; a few values per row are read); the alignment of
#: SGLang's tensors (request slots, sequence lengths, the verify's emitted tokens and accept lengths), read per row.
AFTER_VERIFY_DNS = ("emit_s0", "emit_s1", "chain_s0", "ng_tok_s0", "B")
AFTER_VERIFY_DNA = ("slots_ptr", "seq_ptr", "emit_ptr", "acc_ptr")


@triton.jit(do_not_specialize=AFTER_VERIFY_DNS, do_not_specialize_on_alignment=AFTER_VERIFY_DNA)
def _after_verify_kernel(
        slots_ptr, seq_ptr, emit_ptr, emit_s0, emit_s1, acc_ptr, ring_ptr, ctx_ptr,
        chain_ptr, chain_s0, gen_ptr, bias_ptr, accept_ptr, mb_ptr, mb_gen_ptr, conf_ptr, temps_ptr, g2_ptr,
        ng_tok_ptr, ng_tok_s0, ng_len_ptr, ng_acc_ptr, ng_used_ptr, nb_ptr, nb_gen_ptr,
        t_val_ptr, t_src_ptr, totals_ptr,
        B,
        C: tl.constexpr, D_EMIT: tl.constexpr, C2: tl.constexpr, R: tl.constexpr, L: tl.constexpr,
        HAS_CTX: tl.constexpr, MODEL: tl.constexpr, S: tl.constexpr, S2: tl.constexpr, HAS_BIAS: tl.constexpr,
        ETA: tl.constexpr, NGRAM: tl.constexpr, K: tl.constexpr, K2: tl.constexpr, NG_BIAS: tl.constexpr,
        NG_ETA: tl.constexpr, W: tl.constexpr, W2: tl.constexpr, BB: tl.constexpr,
        CAL: tl.constexpr, CAL_ETA: tl.constexpr, NT: tl.constexpr, NT2: tl.constexpr, CAL_DECAY: tl.constexpr,
        CAL_POOL: tl.constexpr, W_LO: tl.constexpr, W_HI: tl.constexpr, CAL_EPS_C: tl.constexpr,
        NORM_EPS_C: tl.constexpr,
        C_ACC: tl.constexpr, C_TESTED: tl.constexpr, C_PRED: tl.constexpr, C_HIT: tl.constexpr,
        C_NTESTED: tl.constexpr, C_NPRED: tl.constexpr, C_NHIT: tl.constexpr):
    j = tl.arange(0, C2)
    o = tl.arange(0, W2)
    c4 = tl.arange(0, 4)
    acc_by_class = tl.zeros((4,), tl.float64)
    tested_n = tl.zeros((), tl.float64)
    pred_sum = tl.zeros((), tl.float64)
    hit_n = tl.zeros((), tl.float64)
    ng_tested_n = tl.zeros((), tl.float64)
    ng_pred_sum = tl.zeros((), tl.float64)
    ng_hit_n = tl.zeros((), tl.float64)
    sj = tl.arange(0, S2)
    cal_g = tl.zeros((S2,), tl.float64)
    for b0 in range(0, B, BB):
        rows = b0 + tl.arange(0, BB)
        rm = rows < B
        r64 = rows.to(tl.int64)
        slot = tl.load(slots_ptr + rows, mask=rm, other=0).to(tl.int64)
        seq = tl.load(seq_ptr + rows, mask=rm, other=0).to(tl.int64)
        n = tl.load(acc_ptr + rows, mask=rm, other=0).to(tl.int64)
        # ---- the emitted tokens into the ring and the context table ----
        em_m = rm[:, None] & (j[None, :] < D_EMIT)
        emitted = tl.load(emit_ptr + r64[:, None] * emit_s0 + j[None, :] * emit_s1, mask=em_m, other=-1).to(tl.int64)
        pos = seq[:, None] + 1 + j[None, :]
        keep = em_m & (j[None, :] < n[:, None])
        tl.store(ring_ptr + slot[:, None] * (R + 1) + pos % R, emitted, mask=keep)
        if HAS_CTX:
            tl.store(ctx_ptr + slot[:, None] * (L + 1) + pos, emitted.to(tl.int32), mask=keep & (pos < L))
        # ---- accepted drafts per tree class (metrics.tree_class) ----
        _, cls = tree_class(t_val_ptr, t_src_ptr, rows, rm, o, W)
        acc = tl.maximum(n - 1, 0).to(tl.float64)
        acc_by_class += tl.sum(tl.where((cls[:, None] == c4[None, :]) & rm[:, None], acc[:, None], 0.0), 0)
        # ---- how each chain fared (request_bias.chain_outcome), counted and learned from ----
        if MODEL:
            tested, hit, a = _chain_outcome(chain_ptr, chain_s0, S, accept_ptr, emit_ptr, emit_s0, emit_s1, r64, rm,
                                            n, S, S2, C)
            tested_n, pred_sum, hit_n = _count(tested, hit, a, tested_n, pred_sum, hit_n)
            if HAS_BIAS:
                _learn(bias_ptr, mb_ptr, mb_gen_ptr, gen_ptr, rows, rm, slot, tested, hit, a, ETA)
            if CAL:
                # the log loss's gradient in each column's inverse temperature, summed over the rows
                p = tl.load(conf_ptr + r64[:, None] * S + sj[None, :], mask=rm[:, None] & (sj[None, :] < S),
                            other=0.5).to(tl.float32)
                pc = tl.minimum(tl.maximum(p, CAL_EPS_C), 1.0 - CAL_EPS_C).to(tl.float64)
                z = tl.log(pc) - tl.log(1.0 - pc)
                cal_g += tl.sum(tl.where(tested, (a.to(tl.float64) - hit.to(tl.float64)) * z, 0.0), 0)
        if NGRAM:
            nlen = tl.load(ng_len_ptr + rows, mask=rm, other=0).to(tl.int64)
            tested, hit, a = _chain_outcome(ng_tok_ptr, ng_tok_s0, nlen[:, None], ng_acc_ptr, emit_ptr, emit_s0,
                                            emit_s1, r64, rm, n, K, K2, C)
            ng_tested_n, ng_pred_sum, ng_hit_n = _count(tested, hit, a, ng_tested_n, ng_pred_sum, ng_hit_n)
            if NG_BIAS:
                _learn(ng_used_ptr, nb_ptr, nb_gen_ptr, gen_ptr, rows, rm, slot, tested, hit, a, NG_ETA)
    cp = totals_ptr + C_ACC + c4
    tl.store(cp, tl.load(cp) + acc_by_class)
    if MODEL:
        _add_totals(totals_ptr, C_TESTED, C_PRED, C_HIT, tested_n, pred_sum, hit_n)
    if NGRAM:
        _add_totals(totals_ptr, C_NTESTED, C_NPRED, C_NHIT, ng_tested_n, ng_pred_sum, ng_hit_n)
    if CAL:
        _temperature_step(temps_ptr, g2_ptr, cal_g, sj, S, NT, NT2, CAL_ETA, CAL_DECAY, CAL_POOL, W_LO, W_HI,
                          NORM_EPS_C)
