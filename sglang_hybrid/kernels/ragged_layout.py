"""Ragged verify's layout and compaction, queued before the node counts are read, in two Triton launches.

Why: under ragged verify the device builds each step's layout (``sglang_plugin.ragged.layout.build_pending_layout``:
node counts, compact rows, index and mask pointers, the packed tree mask) and compacts the verify rows
(``PendingLayout.gather_ahead``, ``write_cols_ahead``) between the decision and the verify forward, which waits on
them. In PyTorch that is about sixty small operators, each a couple of microseconds of device time on a GPU
(``bench.ragged_sync_ops`` counts them live, the replay charges them: ``bench.replay.engine.RAGGED_AHEAD_OPS``).
These kernels write the same arrays in one launch each:

* ``_layout_kernel``, one program per request: every program reads the batch's ``valid`` flags (a ``B x W`` tile) to
  get the node counts and its own offsets (sums over the requests before it), writes its counts and pointers, its
  compact rows (``token_index``; the rows past ``T`` get the sentinel ``B x W``, each program those of its own padded
  rows) and its mask rows: ``seq_len`` ones, then its reflexive ancestor row (``tree_mask.verify_nodes``' rule: a real
  node sees its real ancestors and itself).
* ``_compact_kernel``: the forward's rows ahead of the read, ``rows_bound`` of them: the node tokens and positions of
  the compact rows (zero past ``T``) and their KV write columns (-1, SGLang's sink, past ``T``).

Exact by construction: every value is a count, a sum of counts or a copied bit or integer; the torch builder stays the
reference (``bench.fused_exactness.run_ragged`` compares the two on random trees and ``run_steps`` on every decided
tree, in ``tests/kernels/test_fused_decision.py``; the device kit on a GPU). Like the fused verify input it writes only
the requests' mask rows: entries past ``mask_indptr[B]`` are left as they were (no reader looks past them).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from . import pow2, rows_per_program

#: prefix columns of the mask written per loop iteration
MASK_CHUNK = 256
#: rows per program of the compaction on a GPU (the interpreter takes them all in one: each program costs it time)
GPU_COMPACT_ROWS = 1024


#: ``_layout_kernel``: not specialised: the batch size, the request slots and the strides (runtime ints: ``B`` moves
#: every step, ``SLOTS`` is the graphs' fixed count, the strides follow the widened tree; loads are tiles of at most
#: ``B2 x W2``), and the alignment of SGLang's sequence lengths (read per request). ``B2``, the batch's power-of-two
#: bucket, stays a constexpr: it sets the tile over the batch's flags.
LAYOUT_DNS = ("B", "SLOTS", "val_s0", "val_s1", "anc_s0", "anc_s1", "anc_s2")
LAYOUT_DNA = ("seq_ptr",)


@triton.jit(do_not_specialize=LAYOUT_DNS, do_not_specialize_on_alignment=LAYOUT_DNA)
def _layout_kernel(val_ptr, anc_ptr, seq_ptr, counts_ptr, index_ptr, qo_ptr, mind_ptr, mask_ptr, B, SLOTS,
                   val_s0, val_s1, anc_s0, anc_s1, anc_s2,
                   W: tl.constexpr, W2: tl.constexpr, B2: tl.constexpr, CH: tl.constexpr):
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    r = tl.arange(0, B2)
    i = tl.arange(0, W2)
    im = i < W
    rm = r < B
    v_all = tl.load(val_ptr + r[:, None].to(tl.int64) * val_s0 + i[None, :] * val_s1,
                    mask=rm[:, None] & im[None, :], other=0) != 0
    n_all = tl.sum(v_all.to(tl.int64), 1)                                         # [B2] nodes per request
    s_all = tl.load(seq_ptr + r, mask=rm, other=0).to(tl.int64)
    before = r < b
    qo_b = tl.sum(tl.where(before, n_all, 0), 0)                                  # compact rows before this one's
    mi_b = tl.sum(tl.where(before, n_all * (s_all + n_all), 0), 0)                # mask entries before this one's
    total = tl.sum(n_all, 0)                                                      # T
    n = tl.sum(tl.where(r == b, n_all, 0), 0)
    sl = tl.load(seq_ptr + b).to(tl.int64)
    tl.store(counts_ptr + b, n)
    tl.store(qo_ptr + b + 1, (qo_b + n).to(tl.int32))
    tl.store(mind_ptr + b + 1, mi_b + n * (sl + n))
    first = b == 0
    tl.store(qo_ptr, tl.zeros((), tl.int32), mask=first)
    tl.store(mind_ptr, tl.zeros((), tl.int64), mask=first)
    # the padding requests up to the slots (the last program): no rows, their pointers repeat the last real one
    mask_total = tl.sum(n_all * (s_all + n_all), 0)
    last = b == B - 1
    for p0 in range(B, SLOTS, B2):
        p = p0 + r
        pad = last & (p < SLOTS)
        tl.store(counts_ptr + p, tl.zeros((B2,), tl.int64), mask=pad)
        tl.store(qo_ptr + p + 1, tl.zeros((B2,), tl.int32) + total.to(tl.int32), mask=pad)
        tl.store(mind_ptr + p + 1, tl.zeros((B2,), tl.int64) + mask_total, mask=pad)
    node = i.to(tl.int64)
    live = node < n
    padded_row = b64 * W + node
    tl.store(index_ptr + qo_b + node, padded_row, mask=live)
    # the sentinel rows past T: positions T .. B * W, each program writing those that fall on its own padded rows
    tl.store(index_ptr + padded_row, tl.zeros((W2,), tl.int64) + B * W, mask=im & (padded_row >= total))
    # mask rows: seq_len ones (the prefix), then the ancestor row over the request's n nodes
    rows_at = mi_b + node * (sl + n)                                              # [W2]
    one = tl.full((W2, CH), 1, tl.int1)
    for c0 in range(0, sl.to(tl.int32), CH):          # int32 bounds: a context is far below 2**31 tokens
        c = c0 + tl.arange(0, CH)
        tl.store(mask_ptr + rows_at[:, None] + c[None, :], one.to(mask_ptr.dtype.element_ty),
                 mask=live[:, None] & (c[None, :] < sl))
    anc = tl.load(anc_ptr + b64 * anc_s0 + i[:, None] * anc_s1 + i[None, :] * anc_s2,
                  mask=im[:, None] & im[None, :], other=0) != 0
    anc = anc | (i[:, None] == i[None, :])
    tl.store(mask_ptr + rows_at[:, None] + sl + i[None, :], anc.to(mask_ptr.dtype.element_ty),
             mask=live[:, None] & (node[None, :] < n))


#: ``_compact_kernel``: the padded rows ``N``, the forward's ``ROWS`` and the strides are runtime ints (they move
#: with the batch and its token tier): not specialised. The node tokens and positions (SGLang's forward-batch tensors)
#: are read by gathers, so their alignment is not specialised either; the outputs (HYBRID's buffers) keep theirs.
COMPACT_DNS, COMPACT_DNA = ("N", "ROWS", "ids_s", "pos_s"), ("ids_ptr", "pos_ptr")


@triton.jit(do_not_specialize=COMPACT_DNS, do_not_specialize_on_alignment=COMPACT_DNA)
def _compact_kernel(index_ptr, ids_ptr, pos_ptr, ids_out, pos_out, cols_out, N, ROWS, ids_s, pos_s,
                    BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = j < ROWS
    ti = tl.load(index_ptr + j, mask=j < N, other=N)
    live = ti < N
    at = tl.where(live, ti, 0)
    tl.store(ids_out + j, tl.load(ids_ptr + at * ids_s, mask=live & inside, other=0), mask=inside)
    tl.store(pos_out + j, tl.load(pos_ptr + at * pos_s, mask=live & inside, other=0), mask=inside)
    tl.store(cols_out + j, tl.where(live, ti, -1), mask=inside)


def pending_layout(valid: torch.Tensor, ancestors: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                   mask_out: Optional[torch.Tensor] = None, row_bound: Optional[int] = None,
                   max_rows: Optional[int] = None, on_read: Optional[Callable[[list, int], None]] = None,
                   slots: Optional[int] = None):
    """``layout.build_pending_layout(valid, verify_nodes(...)[1], seq_lens, seq_lens_sum, node_counts(valid), ...)``
    in one launch, from the tree's own ``ancestors`` (the reflexive rule is applied here); the ``PendingLayout`` it
    returns compacts in one launch too (``PendingLayout.compact_ahead``). Same arguments and checks; its mask
    equals the torch builder's up to ``mask_indptr[B]``. ``slots`` (>= B, the token-tier graphs' request slots):
    the counts and pointers are also written padded to them (``PendingLayout.slot_arrays``, what
    ``graph_runner.pad_requests`` would build), in the same launch."""
    from sglang_hybrid.sglang_plugin.ragged.layout import PendingLayout, mask_numel_bound, mask_out_checked

    bs, w = valid.shape
    if tuple(ancestors.shape) != (bs, w, w) or tuple(seq_lens.shape) != (bs,):
        raise ValueError(f"ancestors must be [{bs}, {w}, {w}] and seq_lens [{bs}], got {tuple(ancestors.shape)} "
                         f"and {tuple(seq_lens.shape)}")
    if not seq_lens.is_contiguous():
        raise ValueError("seq_lens must be contiguous")
    dev = valid.device
    numel = mask_numel_bound(w, bs * w, seq_lens_sum, row_bound)
    mask = torch.ones(numel, dtype=torch.bool, device=dev) if mask_out is None else mask_out_checked(mask_out, numel)
    n = bs if slots is None else int(slots)
    if n < bs:
        raise ValueError(f"a ragged verify of {bs} requests does not fit {n} request slots")
    counts = torch.empty(n, dtype=torch.int64, device=dev)
    token_index = torch.empty(bs * w, dtype=torch.int64, device=dev)
    qo_indptr = torch.empty(n + 1, dtype=torch.int32, device=dev)
    mask_indptr = torch.empty(n + 1, dtype=torch.int64, device=dev)
    _layout_kernel[(bs,)](valid, ancestors, seq_lens, counts, token_index, qo_indptr, mask_indptr, mask, bs, n,
                          *valid.stride(), *ancestors.stride(), W=w, W2=pow2(w), B2=pow2(bs), CH=MASK_CHUNK)
    return PendingLayout(counts=counts[:bs], token_index=token_index, qo_indptr=qo_indptr[: bs + 1],
                         mask_indptr=mask_indptr[: bs + 1], custom_mask=mask, width=w, max_rows=max_rows,
                         on_read=on_read, fused=True,
                         slot_arrays=None if slots is None else (counts, qo_indptr, mask_indptr))


def compact_ahead(token_index: torch.Tensor, rows_bound: int, input_ids: torch.Tensor, positions: torch.Tensor,
                  out: Optional[tuple] = None):
    """``(input_ids, positions, kv write columns)`` of the forward's ``rows_bound`` rows from the padded ``[B x W]``
    node tokens and positions (``PendingLayout.gather_ahead`` of each and ``write_cols_ahead``) in one launch;
    ``out``: two buffers of at least ``rows_bound`` rows to write the node tokens and positions into (views of them
    returned)."""
    n = int(token_index.shape[0])
    for name, t in (("input_ids", input_ids), ("positions", positions)):
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"{name} must be the padded batch's [{n}] rows, got {tuple(t.shape)}")
    if out is None:
        ids, pos = (torch.empty(rows_bound, dtype=t.dtype, device=t.device) for t in (input_ids, positions))
    else:
        from sglang_hybrid.sglang_plugin.ragged.layout import out_rows

        ids, pos = (out_rows(o, t, rows_bound) for o, t in zip(out, (input_ids, positions)))
    cols = torch.empty(rows_bound, dtype=token_index.dtype, device=token_index.device)
    block = rows_per_program(input_ids.device, GPU_COMPACT_ROWS, pow2(rows_bound))
    _compact_kernel[(triton.cdiv(rows_bound, block),)](token_index, input_ids, positions, ids, pos, cols, n,
                                                       rows_bound, input_ids.stride(0), positions.stride(0),
                                                       BLOCK=block)
    return ids, pos, cols


__all__ = ["compact_ahead", "pending_layout"]
