"""The ragged layout of one verify step: each request's own nodes, packed back to back, with its own tree mask.

Why: HYBRID's trees are ``[B, W]`` with the real nodes a prefix of each row (``VerifyTree.valid``). Verifying the
padded ``B x W`` block spends target compute on nodes nobody proposed; a request verifying a 28-token n-gram copy
next to requests verifying 2 or 3 tokens made everyone pay 28. In the ragged layout the target forward sees only the
``T = sum(n_b)`` real nodes (``n_b`` = request ``b``'s node count, root included), and everything after the forward
(SGLang's tree walk, KV commit, draft extend) keeps the padded ``[B, W]`` bookkeeping it already has: the forward's
outputs are scattered back to their padded rows (``scatter_rows``), and padded rows are unreachable from the root
(``verify_input``), so they are never read.

Contract (checked by ``tests/test_ragged_verify.py`` against the padded layout and a dense attention reference):

* ``token_index [T]``: compact row ``j`` -> padded row ``b * W + k``, requests in batch order, nodes in node order;
* ``rows >= T``: the forward's row count, ``T`` rounded up to its token tier (``tiers.tier_rows``) so that its shape
  comes from a short fixed list (a CUDA graph per tier). Rows ``T .. rows`` belong to no request: zero tokens in
  (``gather_rows``), KV writes to SGLang's sink (``kv_write_cols``: -1), outputs never read (``scatter_rows`` takes the
  first ``T``);
* ``qo_indptr [B + 1]`` (int32): request ``b``'s compact rows are ``qo_indptr[b] .. qo_indptr[b + 1]``;
* ``mask_indptr [B + 1]`` (int64) and ``custom_mask``: request ``b`` owns ``n_b`` rows of ``seq_len_b + n_b`` entries
  starting at ``mask_indptr[b]``: its committed prefix visible, then its own ancestor matrix (the layout of SGLang's
  Triton extend kernel and FlashInfer's packed custom mask, per request instead of per width).

Pure PyTorch; every shape is fixed by host integers (``T``, ``rows`` and an upper bound of the mask size), so the
build has no device-to-host read of its own and ``torch.compile(fullgraph=True)`` traces it. ``T`` itself comes from
the device (``node_counts``): the worker reads the counts once per step (docs/sglang.md, "Ragged verify").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RaggedLayout:
    """Where each request's nodes sit in the compact verify forward (contract in the module docstring)."""

    counts: torch.Tensor        # [B] int64, nodes per request (root included), >= 1
    token_index: torch.Tensor   # [T] int64, compact row -> padded row b * W + k
    qo_indptr: torch.Tensor     # [B + 1] int32
    mask_indptr: torch.Tensor   # [B + 1] int64
    custom_mask: torch.Tensor   # packed, >= mask_indptr[B] entries (bool or uint8)
    total: int                  # T (host int)
    max_nodes: int              # max(counts) (host int): the attention kernel's longest query
    width: int                  # W of the padded layout
    rows: int                   # the forward's rows (host int): T rounded up to its token tier, >= T

    @property
    def batch_size(self) -> int:
        return int(self.counts.shape[0])


def node_counts(valid: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 real nodes per request (``valid`` is a prefix of each row, root always valid)."""
    return valid.sum(1, dtype=torch.int64)


def mask_numel_bound(max_nodes: int, total: int, seq_lens_sum: int, row_bound: int | None = None) -> int:
    """Entries a ragged mask can need: ``sum_b n_b (s_b + n_b) <= n_max * (sum(s) + T)`` (``n_b <= n_max``), and,
    given ``row_bound >= s_b + n_b`` for every request (the context length plus the width: what a buffer sized once at
    start knows), at most ``T * row_bound``; one more entry past the bound takes the writes of absent columns (see
    ``ragged_full_mask``)."""
    bound = max_nodes * (seq_lens_sum + total)
    if row_bound is not None:
        bound = min(bound, total * row_bound)
    return bound + 1


def ragged_full_mask(ancestors: torch.Tensor, counts: torch.Tensor, token_index: torch.Tensor,
                     seq_lens: torch.Tensor, seq_lens_sum: int, out: torch.Tensor | None = None,
                     max_nodes: int | None = None, row_bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(custom_mask, mask_indptr)`` of the ragged layout from ``ancestors [B, W, W]`` (reflexive, restricted to real
    nodes: ``tree_mask.verify_nodes``).

    ``seq_lens_sum``: a host int ``>= sum(seq_lens)``; ``max_nodes``: a host int ``>= max(counts)`` (default: the
    padded width), which sizes the mask with ``seq_lens_sum`` and ``row_bound`` (``mask_numel_bound``). The mask
    starts all ones (every prefix column is visible); then each compact row writes its ``W`` tree columns, those past
    the request's ``n_b`` into the one spare entry at the end (a fixed-shape scatter: no host read of the per-request
    counts)."""
    bs, w, _ = ancestors.shape
    dev = ancestors.device
    total = int(token_index.shape[0])
    numel = mask_numel_bound(w if max_nodes is None else max_nodes, total, seq_lens_sum, row_bound)
    if out is None:
        out = torch.ones(numel, dtype=torch.bool, device=dev)
    else:
        if out.numel() < numel:
            raise ValueError(f"ragged mask buffer holds {out.numel()} entries, this step needs up to {numel}")
        if out.dtype not in (torch.bool, torch.uint8):
            raise ValueError(f"ragged mask buffer must be bool or uint8 (Triton's), got {out.dtype}")
        out[:numel].fill_(1)
    sl = seq_lens.to(torch.int64)
    row_len = sl + counts                                                   # [B]
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    mask_indptr[1:] = torch.cumsum(counts * row_len, 0)
    req = torch.div(token_index, w, rounding_mode="floor")                  # [T]
    node = token_index - req * w                                            # [T] = rank within the request
    col = torch.arange(w, device=dev)
    start = mask_indptr[req] + node * row_len[req] + sl[req]                # [T]: first tree column of the row
    index = start[:, None] + col[None, :]
    index = torch.where(col[None, :] < counts[req][:, None], index, numel - 1)
    bits = ancestors.reshape(bs * w, w)[token_index]                        # [T, W]
    out.scatter_(0, index.reshape(-1), bits.reshape(-1).to(out.dtype))
    return out, mask_indptr


def build_ragged_layout(valid: torch.Tensor, ancestors: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                        counts: torch.Tensor, total: int, max_nodes: int,
                        mask_out: torch.Tensor | None = None, rows: int | None = None,
                        row_bound: int | None = None) -> RaggedLayout:
    """The ragged layout of a padded tree (``valid [B, W]``, ``ancestors [B, W, W]`` from ``verify_nodes``).

    ``counts`` = ``node_counts(valid)`` on the device; ``total`` and ``max_nodes`` its sum and maximum as host ints
    (read once by the caller: they size the forward); ``rows`` the forward's rows (default ``total``: no padding;
    ``tiers.tier_rows`` gives the token tier); ``mask_out`` and ``row_bound`` as ``ragged_full_mask`` takes them."""
    bs, w = valid.shape
    if counts.shape != (bs,):
        raise ValueError(f"counts must be [{bs}], got {tuple(counts.shape)}")
    if not bs <= total <= bs * w:
        raise ValueError(f"total verify tokens {total} outside [{bs}, {bs * w}] for {bs} requests of width {w}")
    if not 1 <= max_nodes <= w:
        raise ValueError(f"max nodes per request {max_nodes} outside [1, {w}]")
    rows = total if rows is None else rows
    if rows < total:
        raise ValueError(f"a ragged forward of {rows} rows cannot hold {total} verify tokens")
    qo = torch.zeros(bs + 1, dtype=torch.int64, device=valid.device)
    qo[1:] = torch.cumsum(counts, 0)
    token_index = torch.nonzero_static(valid.reshape(-1), size=total).reshape(-1)
    mask, mask_indptr = ragged_full_mask(ancestors, counts, token_index, seq_lens, seq_lens_sum, mask_out, max_nodes,
                                         row_bound)
    return RaggedLayout(counts=counts, token_index=token_index, qo_indptr=qo.to(torch.int32),
                        mask_indptr=mask_indptr, custom_mask=mask, total=total, max_nodes=max_nodes, width=w,
                        rows=rows)


def gather_rows(padded: torch.Tensor, layout: RaggedLayout) -> torch.Tensor:
    """The forward's ``[rows, ...]`` from a padded ``[B * W, ...]`` tensor (node tokens, positions): the ``T`` real
    nodes, then zeros for the tier's rows that belong to no request."""
    out = padded.new_zeros((layout.rows,) + tuple(padded.shape[1:]))
    out[: layout.total] = padded.index_select(0, layout.token_index)
    return out


def kv_write_cols(layout: RaggedLayout) -> torch.Tensor:
    """``[rows]`` int64: each forward row's column in the padded ``B x W`` verify window, -1 for the rows past ``T``:
    the flat index SGLang's ``KVLocPlan.bind(cols=...)`` takes, -1 naming its sink slot."""
    cols = layout.token_index.new_full((layout.rows,), -1)
    cols[: layout.total] = layout.token_index
    return cols


def scatter_rows(compact: torch.Tensor, layout: RaggedLayout) -> torch.Tensor:
    """Padded ``[B * W, ...]`` rows from the forward's ``[rows, ...]`` (logits, hidden states): its first ``T`` rows;
    rows of absent nodes are zero: unreachable in the tree walk, never read."""
    out = compact.new_zeros((layout.batch_size * layout.width,) + tuple(compact.shape[1:]))
    out.index_copy_(0, layout.token_index, compact[: layout.total])
    return out


__all__ = ["RaggedLayout", "build_ragged_layout", "gather_rows", "kv_write_cols", "mask_numel_bound", "node_counts",
           "ragged_full_mask", "scatter_rows"]
