"""The worker's share of the EAGLE alternatives (setting ``eagle_alternatives``) as three Triton kernels, beside the
torch reference they equal (``sglang_plugin.alternatives``).

Why: in torch the alternatives add about fifty small operators to every decode step (the first position's table,
taking the chain's token out, the counters after verify), each a launch on the critical path of a GPU step. Here:

* ``_record_kernel``: ``FirstAlternatives.record`` (the draft extend's top tokens kept per request slot, with the
  slot's generation; its ``top_tokens`` stay torch's top-k over the softmax the worker takes once for the first
  drafted token's confidence too);
* ``_alternatives_kernel``: ``step_alternatives`` (position 0 from the table where its generation is the request's,
  the later positions from the draft's records, the chain's token taken out, rank order kept);
* ``_outcome_kernel``: ``alternatives_outcome`` added into the counters (one program looping over the batch, no
  atomics: the same float64 sums of integers as torch's).

Exact: gathers, comparisons and integer counts only. Static shapes, no host read: capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pow2, rows_per_program
from .workspace import alloc


#: Not specialised (all three kernels): the batch size and the strides (runtime ints: ``B`` moves every step, a
#: stride with the depth or the alternatives' count; the loads are a few values per row, nothing to vectorise), and
#: the alignment of SGLang's tensors (request slots, the draft tokens, the verify's emitted tokens and accept lengths),
#: which are read per row.
RECORD_DNS, RECORD_DNA = ("p_s0", "i_s0", "B"), ("slots_ptr",)
ALTERNATIVES_DNS = ("rp_s0", "rp_s1", "ri_s0", "ri_s1", "ch_s0", "ch_s1", "B")
ALTERNATIVES_DNA = ("slots_ptr", "chain_ptr")
OUTCOME_DNS, OUTCOME_DNA = ("ch_s0", "em_s0", "em_s1", "B"), ("emit_ptr", "accept_ptr")


@triton.jit(do_not_specialize=RECORD_DNS, do_not_specialize_on_alignment=RECORD_DNA)
def _record_kernel(slots_ptr, gens_ptr, p_ptr, p_s0, i_ptr, i_s0, t_p_ptr, t_i_ptr, t_gen_ptr, B,
                   M1: tl.constexpr, M2: tl.constexpr, BB: tl.constexpr):
    """``FirstAlternatives.record``: row ``b``'s ``M1`` top tokens and probabilities into the table row of its slot."""
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rm = rows < B
    r64 = rows.to(tl.int64)
    c = tl.arange(0, M2)
    m = rm[:, None] & (c[None, :] < M1)
    slot = tl.load(slots_ptr + rows, mask=rm, other=0).to(tl.int64)
    p = tl.load(p_ptr + r64[:, None] * p_s0 + c[None, :], mask=m, other=0.0)
    i = tl.load(i_ptr + r64[:, None] * i_s0 + c[None, :], mask=m, other=0)
    tl.store(t_p_ptr + slot[:, None] * M1 + c[None, :], p.to(tl.float32), mask=m)
    tl.store(t_i_ptr + slot[:, None] * M1 + c[None, :], i.to(tl.int64), mask=m)
    tl.store(t_gen_ptr + slot, tl.load(gens_ptr + rows, mask=rm, other=0).to(tl.int64), mask=rm)


@triton.jit(do_not_specialize=ALTERNATIVES_DNS, do_not_specialize_on_alignment=ALTERNATIVES_DNA)
def _alternatives_kernel(slots_ptr, gens_ptr, t_p_ptr, t_i_ptr, t_gen_ptr,
                         rp_ptr, rp_s0, rp_s1, ri_ptr, ri_s0, ri_s1, chain_ptr, ch_s0, ch_s1,
                         o_tok_ptr, o_p_ptr, B,
                         S: tl.constexpr, M: tl.constexpr, M2: tl.constexpr, BB: tl.constexpr):
    """``step_alternatives``: per row and chain position, the ``M + 1`` top tokens (position 0 from the slot's table
    row when its generation is the request's, else probability 0; later positions from the draft's records) without
    the chain's token, in rank order; the last one dropped where the chain's token is not among them (where it is
    there more than once, as in a table row never written, its copies follow the others: torch's stable sort)."""
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rm = rows < B
    r64 = rows.to(tl.int64)
    c = tl.arange(0, M2)
    m1 = rm[:, None] & (c[None, :] < M + 1)
    slot = tl.load(slots_ptr + rows, mask=rm, other=0).to(tl.int64)
    mine = tl.load(t_gen_ptr + slot, mask=rm, other=-1) == tl.load(gens_ptr + rows, mask=rm, other=0).to(tl.int64)
    for j in tl.static_range(S):
        if j == 0:
            p = tl.load(t_p_ptr + slot[:, None] * (M + 1) + c[None, :], mask=m1, other=0.0)
            p = tl.where(mine[:, None], p, 0.0)
            t = tl.load(t_i_ptr + slot[:, None] * (M + 1) + c[None, :], mask=m1, other=0)
        else:
            p = tl.load(rp_ptr + r64[:, None] * rp_s0 + j * rp_s1 + c[None, :], mask=m1, other=0.0)
            t = tl.load(ri_ptr + r64[:, None] * ri_s0 + j * ri_s1 + c[None, :], mask=m1, other=0)
        own = tl.load(chain_ptr + r64 * ch_s0 + j * ch_s1, mask=rm, other=0).to(tl.int64)
        other = (t.to(tl.int64) != own[:, None]) & m1
        same = (t.to(tl.int64) == own[:, None]) & m1
        # each rank's output column in a stable partition: the other tokens first, the chain's own after them
        col = tl.where(other, tl.cumsum(other.to(tl.int32), 1) - 1,
                       tl.sum(other.to(tl.int32), 1)[:, None] + tl.cumsum(same.to(tl.int32), 1) - 1)
        keep = m1 & (col < M)
        out = r64[:, None] * (S * M) + j * M + col
        tl.store(o_tok_ptr + out, t.to(tl.int64), mask=keep)
        tl.store(o_p_ptr + out, p.to(tl.float32), mask=keep)


@triton.jit(do_not_specialize=OUTCOME_DNS, do_not_specialize_on_alignment=OUTCOME_DNA)
def _outcome_kernel(tok_ptr, dep_ptr, val_ptr, src_ptr, chain_ptr, ch_s0, emit_ptr, em_s0, em_s1, accept_ptr,
                    totals_ptr, B,
                    W: tl.constexpr, W2: tl.constexpr, S: tl.constexpr, S2: tl.constexpr, C: tl.constexpr,
                    N: tl.constexpr, BB: tl.constexpr, C_NODES: tl.constexpr, C_TAKEN: tl.constexpr):
    """``alternatives_outcome`` over the batch (``[B, W]`` tree rows, contiguous; ``N = min(S, C)`` chain positions
    the emitted tokens can confirm), added into the counters."""
    o = tl.arange(0, W2)
    sc = tl.arange(0, S2)
    nodes = tl.zeros((), tl.float64)
    taken = tl.zeros((), tl.float64)
    for b0 in range(0, B, BB):
        rows = b0 + tl.arange(0, BB)
        rm = rows < B
        r64 = rows.to(tl.int64)
        wm = rm[:, None] & (o[None, :] < W)
        at = r64[:, None] * W + o[None, :]
        tok = tl.load(tok_ptr + at, mask=wm, other=-1)
        dep = tl.load(dep_ptr + at, mask=wm, other=0)
        val = tl.load(val_ptr + at, mask=wm, other=0) != 0
        src = tl.load(src_ptr + at, mask=wm, other=-1).to(tl.int32)
        d = tl.minimum(tl.maximum(dep, 1), S) - 1
        chain_tok = tl.load(chain_ptr + r64[:, None] * ch_s0 + d, mask=wm, other=-1).to(tl.int64)
        alt = val & (dep >= 1) & (dep <= S) & ((src == 0) | (src == 2)) & (tok != chain_tok) & (o[None, :] > 0)
        nodes += tl.sum(tl.sum(alt.to(tl.float64), 1), 0)
        # the chain tokens the path accepted before leaving it, and the token it took there
        sm = rm[:, None] & (sc[None, :] < N)
        ch = tl.load(chain_ptr + r64[:, None] * ch_s0 + sc[None, :], mask=sm, other=-1).to(tl.int64)
        em = tl.load(emit_ptr + r64[:, None] * em_s0 + sc[None, :] * em_s1, mask=sm, other=-2).to(tl.int64)
        miss = (ch != em) | ~sm
        h = tl.min(tl.where(miss, sc[None, :], N), 1)
        drafts = tl.maximum(tl.load(accept_ptr + rows, mask=rm, other=1).to(tl.int64) - 1, 0)
        left = (h < tl.minimum(drafts, N)) & rm
        took_tok = tl.load(emit_ptr + r64 * em_s0 + tl.minimum(h, C - 1) * em_s1, mask=rm, other=-3).to(tl.int64)
        hit = alt & (dep == (h + 1)[:, None]) & (tok == took_tok[:, None])
        took = (tl.max(hit.to(tl.int32), 1) > 0) & left
        taken += tl.sum(took.to(tl.float64), 0)
    tl.store(totals_ptr + C_NODES, tl.load(totals_ptr + C_NODES) + nodes)
    tl.store(totals_ptr + C_TAKEN, tl.load(totals_ptr + C_TAKEN) + taken)


def record(first, slots: torch.Tensor, gens: torch.Tensor, probs: torch.Tensor, tokens: torch.Tensor) -> None:
    """``FirstAlternatives.record`` (``first``) in one launch."""
    b, m1 = probs.shape
    if b == 0:
        return
    block = rows_per_program(slots.device)
    _record_kernel[(triton.cdiv(b, block),)](slots, gens, probs, probs.stride(0), tokens, tokens.stride(0),
                                            first.probs, first.tokens, first.gen, b, M1=m1, M2=pow2(m1), BB=block)


def step_alternatives(first, slots: torch.Tensor, gens: torch.Tensor, recorded_p: torch.Tensor,
                      recorded_i: torch.Tensor, chain: torch.Tensor, workspace=None):
    """``sglang_plugin.alternatives.step_alternatives`` in one launch; ``recorded_p`` / ``recorded_i`` with unit
    stride along their last dimension. Returns ``(tokens, probabilities)`` ``[B, S, M]`` (from ``workspace`` when
    given: valid until the next call with it)."""
    b, s = chain.shape
    m = first.m
    for name, x in (("recorded_p", recorded_p), ("recorded_i", recorded_i)):
        if x.dim() != 3 or x.shape[0] < b or x.shape[1] < s or x.shape[2] != m + 1 or x.stride(2) != 1:
            raise ValueError(f"{name} must be [>= {b}, >= {s}, {m + 1}] with unit last stride, got "
                             f"{tuple(x.shape)} strides {x.stride()}")
    tokens = alloc(workspace, "alt_tokens", (b, s, m), torch.int64, chain.device)
    probs = alloc(workspace, "alt_conf", (b, s, m), torch.float32, chain.device)
    if b:
        block = rows_per_program(chain.device)
        _alternatives_kernel[(triton.cdiv(b, block),)](
            slots, gens, first.probs, first.tokens, first.gen, recorded_p, recorded_p.stride(0),
            recorded_p.stride(1), recorded_i, recorded_i.stride(0), recorded_i.stride(1), chain, *chain.stride(),
            tokens, probs, b, S=s, M=m, M2=pow2(m + 1), BB=block)
    return tokens, probs


def count_outcome(counters, tree, chain: torch.Tensor, emitted: torch.Tensor, accept_lens: torch.Tensor) -> None:
    """``counters.on_alternatives(*alternatives_outcome(...))`` in one launch."""
    from sglang_hybrid.sglang_plugin import metrics as mt

    b, w = tree.tokens.shape
    s, c = chain.shape[1], emitted.shape[1]
    for name in ("tokens", "depth", "valid", "source"):
        if not getattr(tree, name).is_contiguous():
            raise ValueError(f"tree.{name} must be contiguous")
    if chain.stride(1) != 1:
        raise ValueError(f"the chain must have unit column stride, got strides {chain.stride()}")
    _outcome_kernel[(1,)](tree.tokens, tree.depth, tree.valid, tree.source, chain, chain.stride(0), emitted,
                          *emitted.stride(), accept_lens, counters.totals, b, W=w, W2=pow2(w), S=s, S2=pow2(s), C=c,
                          N=min(s, c), BB=rows_per_program(chain.device, 32), C_NODES=mt.ALT_NODES,
                          C_TAKEN=mt.ALT_TAKEN)


__all__ = ["count_outcome", "record", "step_alternatives"]
