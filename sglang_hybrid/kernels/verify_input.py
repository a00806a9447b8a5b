"""The verify input's tree links and FULL_MASK in one Triton kernel.

Why: ``sglang_plugin.tree_mask`` builds the verify forward's view of HYBRID's tree with some eighty small operators
(``verify_nodes``, ``tree_links_torch``, ``full_mask``: fill, cumsum, scatter); this kernel writes the same arrays
in one launch, one program per request.

What it fuses and why it is exact: ``verify_nodes`` (padding nodes see only themselves and carry the root token),
``tree_links_torch`` (position = sequence length + strict ancestors; parent = the deepest strict ancestor, which in
topological order is the one of highest index; first child; next node with the same parent) and ``full_mask``
(request ``b``'s rows start at ``W * sum(seq_lens[:b]) + W * W * b``; each row is ``seq_len`` ones, the prefix, then
the ancestor row). Every value is a count, a minimum or a copy of booleans: integer arithmetic, no rounding. Unlike
``full_mask`` it writes only the requests' rows: the tail of an over-sized buffer (``seq_lens_sum`` above the real
sum) is left as it was, which is what ``full_mask`` promises readers anyway (unread).
"""
from __future__ import annotations

import triton
import triton.language as tl


#: Not specialised: the batch size (a runtime int: it bounds the sum of the sequence lengths before the request and
#: moves every step); the alignment of ``next_ptr`` (the middle third of one ``[3, B, W]`` workspace buffer: 16-byte
#: aligned only when ``B x W`` is even), of SGLang's sequence lengths and of the mask buffer (the backend's or the
#: workspace's; its rows start at data-dependent offsets, so its stores cannot use the base's alignment anyway).
#: ``B2``, the batch's power-of-two bucket, stays a constexpr: it sets the tile the lengths are summed over.
VERIFY_INPUT_DNS, VERIFY_INPUT_DNA = ("B",), ("seq_ptr", "next_ptr", "mask_ptr")


@triton.jit(do_not_specialize=VERIFY_INPUT_DNS, do_not_specialize_on_alignment=VERIFY_INPUT_DNA)
def _verify_input_kernel(
        tok_ptr, val_ptr, anc_ptr, seq_ptr,
        draft_ptr, pos_ptr, idx_ptr, next_ptr, sib_ptr, mask_ptr,
        B,
        W: tl.constexpr, W2: tl.constexpr, B2: tl.constexpr, CH: tl.constexpr):
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    i = tl.arange(0, W2)
    im = i < W
    row = b64 * W
    tok = tl.load(tok_ptr + row + i, mask=im, other=0)
    val = tl.load(val_ptr + row + i, mask=im, other=0) != 0
    root_tok = tl.load(tok_ptr + row)
    tl.store(draft_ptr + row + i, tl.where(val, tok, root_tok), mask=im)
    m2 = im[:, None] & im[None, :]
    anc = tl.load(anc_ptr + (row + i[:, None]) * W + i[None, :], mask=m2, other=0) != 0
    anc = (anc & val[:, None] & val[None, :]) | (i[:, None] == i[None, :])
    anc = anc & m2
    strict = anc & (i[None, :] < i[:, None])
    depth = tl.sum(strict.to(tl.int64), 1)
    sl = tl.load(seq_ptr + b).to(tl.int64)
    tl.store(pos_ptr + row + i, depth + sl, mask=im)
    tl.store(idx_ptr + row + i, row + i, mask=im)
    parent = tl.max(tl.where(strict, i[None, :], -1), 1)                          # [W]
    # first child of node t: the lowest k whose parent is t
    child = (parent[:, None] == i[None, :]) & im[:, None]                          # [k, t]
    first_child = tl.min(tl.where(child, i[:, None], W), 0)
    tl.store(next_ptr + row + i, tl.where(first_child < W, first_child, -1).to(tl.int64), mask=im)
    # next sibling of node t: the lowest k > t with the same parent
    sib = (parent[:, None] == parent[None, :]) & (i[:, None] > i[None, :]) & im[:, None]      # [k, t]
    first_sib = tl.min(tl.where(sib, i[:, None], W), 0)
    tl.store(sib_ptr + row + i, tl.where((parent >= 0) & (first_sib < W), first_sib, -1).to(tl.int64), mask=im)
    # FULL_MASK rows of this request: seq_len ones (the prefix), then the ancestor row
    bb = tl.arange(0, B2)
    before = tl.sum(tl.where(bb < b, tl.load(seq_ptr + bb, mask=bb < B, other=0).to(tl.int64), 0), 0)
    start = W * before + W * W * b64
    rows_at = start + i.to(tl.int64) * (sl + W)                                    # [W]
    one = tl.full((W2, CH), 1, tl.int1)
    for c0 in range(0, sl.to(tl.int32), CH):          # int32 bounds: a context is far below 2**31 tokens
        c = c0 + tl.arange(0, CH)
        tl.store(mask_ptr + rows_at[:, None] + c[None, :], one.to(mask_ptr.dtype.element_ty),
                 mask=im[:, None] & (c[None, :] < sl))
    tl.store(mask_ptr + rows_at[:, None] + sl + i[None, :], anc.to(mask_ptr.dtype.element_ty), mask=m2)
