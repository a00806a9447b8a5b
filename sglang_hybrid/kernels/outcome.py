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
  n-gram chain the step priced (counted always, learned from when the n-gram side learns an offset).

Exact: copies, integer counts and float sums of the same terms in the same roles (the float64 counter sums and the
offset's float32 sum over chain positions may round in another order than torch's; both are within 1e-6).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decision import tree_class


@triton.jit
def _after_verify_kernel(
        slots_ptr, seq_ptr, emit_ptr, emit_s0, emit_s1, acc_ptr, ring_ptr, ctx_ptr,
        chain_ptr, chain_s0, gen_ptr, bias_ptr, accept_ptr, mb_ptr, mb_gen_ptr,
        ng_tok_ptr, ng_tok_s0, ng_len_ptr, ng_acc_ptr, ng_used_ptr, nb_ptr, nb_gen_ptr,
        t_val_ptr, t_src_ptr, totals_ptr,
        B,
        C: tl.constexpr, D_EMIT: tl.constexpr, C2: tl.constexpr, R: tl.constexpr, L: tl.constexpr,
        HAS_CTX: tl.constexpr, MODEL: tl.constexpr, S: tl.constexpr, S2: tl.constexpr, HAS_BIAS: tl.constexpr,
        ETA: tl.constexpr, NGRAM: tl.constexpr, K: tl.constexpr, K2: tl.constexpr, NG_BIAS: tl.constexpr,
        NG_ETA: tl.constexpr, W: tl.constexpr, W2: tl.constexpr, BB: tl.constexpr,
        C_ACC: tl.constexpr, C_TESTED: tl.constexpr, C_PRED: tl.constexpr, C_HIT: tl.constexpr,
        C_NTESTED: tl.constexpr, C_NPRED: tl.constexpr, C_NHIT: tl.constexpr):
    j = tl.arange(0, C2)
    s = tl.arange(0, S2)
    o = tl.arange(0, W2)
    c4 = tl.arange(0, 4)
    acc_by_class = tl.zeros((4,), tl.float64)
    tested_n = tl.zeros((), tl.float64)
    pred_sum = tl.zeros((), tl.float64)
    hit_n = tl.zeros((), tl.float64)
    ng_tested_n = tl.zeros((), tl.float64)
    ng_pred_sum = tl.zeros((), tl.float64)
    ng_hit_n = tl.zeros((), tl.float64)
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
        # ---- how the EAGLE chain fared (request_bias.chain_outcome), counted and learned from ----
        if MODEL:
            sm = rm[:, None] & (s[None, :] < S)
            chain = tl.load(chain_ptr + r64[:, None] * chain_s0 + s[None, :], mask=sm, other=-2)
            committed = tl.load(emit_ptr + r64[:, None] * emit_s0 + s[None, :] * emit_s1,
                                mask=sm & (s[None, :] < C), other=-1).to(tl.int64)
            hit = (chain.to(tl.int64) == committed) & (s[None, :] < n[:, None]) & sm
            miss_before = tl.min(tl.where(hit, S2, s[None, :]), 1)               # first position that missed
            tested = (s[None, :] <= miss_before[:, None]) & (s[None, :] < n[:, None]) & sm
            hit = hit & tested
            a = tl.load(accept_ptr + r64[:, None] * S + s[None, :], mask=sm, other=0.0)
            tested_n += tl.sum(tl.sum(tested.to(tl.float64), 1), 0)
            pred_sum += tl.sum(tl.sum(tl.where(tested, a.to(tl.float64), 0.0), 1), 0)
            hit_n += tl.sum(tl.sum(hit.to(tl.float64), 1), 0)
            if HAS_BIAS:
                g = tl.sum(tl.where(tested, hit.to(tl.float32) - a, 0.0), 1)
                new = tl.load(bias_ptr + rows, mask=rm, other=0.0) + ETA * g
                tl.store(mb_ptr + slot, new, mask=rm)
                tl.store(mb_gen_ptr + slot, tl.load(gen_ptr + rows, mask=rm, other=0).to(tl.int64), mask=rm)
        # ---- how the n-gram chain fared (request_bias.chain_outcome over its length), counted and learned from ----
        if NGRAM:
            kk = tl.arange(0, K2)
            km = rm[:, None] & (kk[None, :] < K)
            ntok = tl.load(ng_tok_ptr + r64[:, None] * ng_tok_s0 + kk[None, :], mask=km, other=-2).to(tl.int64)
            nlen = tl.minimum(tl.load(ng_len_ptr + rows, mask=rm, other=0).to(tl.int64), K)
            committed_n = tl.load(emit_ptr + r64[:, None] * emit_s0 + kk[None, :] * emit_s1,
                                  mask=km & (kk[None, :] < C), other=-1).to(tl.int64)
            hit_k = (ntok == committed_n) & (kk[None, :] < n[:, None]) & km
            first_miss = tl.min(tl.where(hit_k, K2, kk[None, :]), 1)
            tested_k = ((kk[None, :] <= first_miss[:, None]) & (kk[None, :] < n[:, None])
                        & (kk[None, :] < nlen[:, None]) & km)
            hit_k = hit_k & tested_k
            a_k = tl.load(ng_acc_ptr + r64[:, None] * K + kk[None, :], mask=km, other=0.0)
            ng_tested_n += tl.sum(tl.sum(tested_k.to(tl.float64), 1), 0)
            ng_pred_sum += tl.sum(tl.sum(tl.where(tested_k, a_k.to(tl.float64), 0.0), 1), 0)
            ng_hit_n += tl.sum(tl.sum(hit_k.to(tl.float64), 1), 0)
            if NG_BIAS:
                g_k = tl.sum(tl.where(tested_k, hit_k.to(tl.float32) - a_k, 0.0), 1)
                tl.store(nb_ptr + slot, tl.load(ng_used_ptr + rows, mask=rm, other=0.0) + NG_ETA * g_k, mask=rm)
                tl.store(nb_gen_ptr + slot, tl.load(gen_ptr + rows, mask=rm, other=0).to(tl.int64), mask=rm)
    cp = totals_ptr + C_ACC + c4
    tl.store(cp, tl.load(cp) + acc_by_class)
    if MODEL:
        tl.store(totals_ptr + C_TESTED, tl.load(totals_ptr + C_TESTED) + tested_n)
        tl.store(totals_ptr + C_PRED, tl.load(totals_ptr + C_PRED) + pred_sum)
        tl.store(totals_ptr + C_HIT, tl.load(totals_ptr + C_HIT) + hit_n)
    if NGRAM:
        tl.store(totals_ptr + C_NTESTED, tl.load(totals_ptr + C_NTESTED) + ng_tested_n)
        tl.store(totals_ptr + C_NPRED, tl.load(totals_ptr + C_NPRED) + ng_pred_sum)
        tl.store(totals_ptr + C_NHIT, tl.load(totals_ptr + C_NHIT) + ng_hit_n)
