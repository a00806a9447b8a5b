"""The ragged layout of one verify step: each request's own nodes, packed back to back, with its own tree mask.

Why: HYBRID's trees are ``[B, W]`` with the real nodes a prefix of each row (``VerifyTree.valid``). Verifying the
padded ``B x W`` block spends target compute on nodes nobody proposed; a request verifying a 28-token n-gram copy
next to requests verifying 2 or 3 tokens made everyone pay 28. In the ragged layout the target forward sees only the
``T = sum(n_b)`` real nodes (``n_b`` = request ``b``'s node count, root included), and everything after the forward
(SGLang's tree walk, KV commit, draft extend) keeps the padded ``[B, W]`` bookkeeping it already has: the forward's
outputs are scattered back to their padded rows (``scatter_rows``), and padded rows are unreachable from the root
(``verify_input``), so they are never read.

Contract (checked by ``tests/kernels/test_ragged_verify.py`` against the padded layout and a dense attention reference):

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
the device (``node_counts``): the counts are read once per step (docs/sglang.md, "Ragged verify"). Where the mask has
a buffer sized for the running limit (the Triton backend's), the worker builds the layout before that read
(``build_pending_layout``, shapes from the padded batch) and the read waits until the verify forward needs it
(``PendingLayout.read`` in ``RaggedVerifyTarget``), so the device is not left idle while the layout is built.
With the fused step (setting ``decision_kernels``) that build and the compaction before the read are one Triton
launch each (``kernels.ragged_layout``, equal to the torch code here, which stays the reference and the path
elsewhere).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .tiers import tier_rows


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


def mask_out_checked(out: torch.Tensor, numel: int) -> torch.Tensor:
    """``out`` after checking that it can hold a ragged mask of ``numel`` entries (``mask_numel_bound``) in a dtype
    the attention kernels read."""
    if out.numel() < numel:
        raise ValueError(f"ragged mask buffer holds {out.numel()} entries, this step needs up to {numel}")
    if out.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"ragged mask buffer must be bool or uint8 (Triton's), got {out.dtype}")
    return out


def ragged_full_mask(ancestors: torch.Tensor, counts: torch.Tensor, token_index: torch.Tensor,
                     seq_lens: torch.Tensor, seq_lens_sum: int, out: torch.Tensor | None = None,
                     max_nodes: int | None = None, row_bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(custom_mask, mask_indptr)`` of the ragged layout from ``ancestors [B, W, W]`` (reflexive, restricted to real
    nodes: ``tree_mask.verify_nodes``).

    ``seq_lens_sum``: a host int ``>= sum(seq_lens)``; ``max_nodes``: a host int ``>= max(counts)`` (default: the
    padded width), which sizes the mask with ``seq_lens_sum`` and ``row_bound`` (``mask_numel_bound``). The mask
    starts all ones (every prefix column is visible); then each compact row writes its ``W`` tree columns, those past
    the request's ``n_b`` into the one spare entry at the end (a fixed-shape scatter: no host read of the per-request
    counts). An entry of ``token_index`` at ``B * W`` or above is a sentinel row (``build_pending_layout``'s rows past
    ``T``): all its columns go to the spare entry."""
    bs, w, _ = ancestors.shape
    dev = ancestors.device
    total = int(token_index.shape[0])
    numel = mask_numel_bound(w if max_nodes is None else max_nodes, total, seq_lens_sum, row_bound)
    if out is None:
        out = torch.ones(numel, dtype=torch.bool, device=dev)
    else:
        out = mask_out_checked(out, numel)
        out[:numel].fill_(1)
    sl = seq_lens.to(torch.int64)
    row_len = sl + counts                                                   # [B]
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    mask_indptr[1:] = torch.cumsum(counts * row_len, 0)
    live = token_index < bs * w                                             # [T]: False on a sentinel row
    padded_row = torch.where(live, token_index, 0)
    req = torch.div(padded_row, w, rounding_mode="floor")                   # [T]
    node = padded_row - req * w                                             # [T] = rank within the request
    col = torch.arange(w, device=dev)
    start = mask_indptr[req] + node * row_len[req] + sl[req]                # [T]: first tree column of the row
    index = start[:, None] + col[None, :]
    index = torch.where((col[None, :] < counts[req][:, None]) & live[:, None], index, numel - 1)
    bits = ancestors.reshape(bs * w, w)[padded_row]                         # [T, W]
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
    rows = _checked_rows(bs, w, total, max_nodes, rows)
    token_index = torch.nonzero_static(valid.reshape(-1), size=total).reshape(-1)
    mask, mask_indptr = ragged_full_mask(ancestors, counts, token_index, seq_lens, seq_lens_sum, mask_out, max_nodes,
                                         row_bound)
    return RaggedLayout(counts=counts, token_index=token_index, qo_indptr=_qo_indptr(counts),
                        mask_indptr=mask_indptr, custom_mask=mask, total=total, max_nodes=max_nodes, width=w,
                        rows=rows)


def _checked_rows(bs: int, w: int, total: int, max_nodes: int, rows: int | None) -> int:
    """The forward's rows (``rows`` or ``total``), after checking the host ints against the batch's shape."""
    if not bs <= total <= bs * w:
        raise ValueError(f"total verify tokens {total} outside [{bs}, {bs * w}] for {bs} requests of width {w}")
    if not 1 <= max_nodes <= w:
        raise ValueError(f"max nodes per request {max_nodes} outside [1, {w}]")
    rows = total if rows is None else rows
    if rows < total:
        raise ValueError(f"a ragged forward of {rows} rows cannot hold {total} verify tokens")
    return rows


def _qo_indptr(counts: torch.Tensor) -> torch.Tensor:
    qo = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
    qo[1:] = torch.cumsum(counts, 0)
    return qo.to(torch.int32)


@dataclass(frozen=True)
class PendingLayout:
    """A step's ragged layout whose node counts have not reached the host yet (``build_pending_layout``).

    Why: the host needs ``T`` (and the token tier it rounds up to) before it can pick the verify graph, and reading
    it blocks until the draft and the decision have run. Everything the layout computes on the device is built here
    with shapes the host already knows (``B x W`` compact rows at most, the mask's bound at ``W`` nodes per request),
    so it is queued before that read; ``read`` then takes the counts and returns the ``RaggedLayout`` as views of
    these arrays, launching nothing. The read moves to the last moment before the verify forward
    (``RaggedVerifyTarget``), and the work the device waits on after it shrinks (``bench.ragged_sync_ops``)."""

    counts: torch.Tensor        # [B] int64, nodes per request (root included), >= 1
    token_index: torch.Tensor   # [B * W] int64: the compact rows' padded rows, then B * W (sentinel) past T
    qo_indptr: torch.Tensor     # [B + 1] int32
    mask_indptr: torch.Tensor   # [B + 1] int64
    custom_mask: torch.Tensor   # packed, as ``RaggedLayout.custom_mask``
    width: int                  # W of the padded layout
    #: the token tiers' cap (``tiers.tier_rows``): the forward runs at the tier of ``T``; None: exactly ``T`` rows
    max_rows: int | None = None
    #: called once with the host counts and the rows when they are read (the worker's counters)
    on_read: Callable[[list, int], None] | None = None
    #: built by the layout kernel (``kernels.ragged_layout``): ``compact_ahead`` compacts in one launch too
    fused: bool = False
    #: ``(counts, qo_indptr, mask_indptr)`` padded to the token-tier graphs' request slots by the layout kernel
    #: (``graph_runner.pad_requests`` takes them instead of padding), or None
    slot_arrays: tuple | None = None

    def rows_bound(self) -> int:
        """Rows the forward can take whatever the counts hold: the token tier of ``B x W`` (``T <= B x W``, and a
        tier grows with its tokens); ``B x W`` itself without tiers."""
        n = int(self.token_index.shape[0])
        return n if self.max_rows is None else tier_rows(n, self.max_rows)

    def gather_ahead(self, padded: torch.Tensor) -> torch.Tensor:
        """``gather_rows`` before the read: ``[rows_bound(), ...]``, the ``T`` real nodes then zeros; the forward's
        input is its first ``rows`` rows (a view, once ``read`` has given them)."""
        n = int(self.token_index.shape[0])
        live = self.token_index < n
        rows = padded.index_select(0, torch.where(live, self.token_index, 0))
        live = live.reshape((n,) + (1,) * (padded.dim() - 1))
        out = padded.new_zeros((self.rows_bound(),) + tuple(padded.shape[1:]))
        out[:n] = torch.where(live, rows, torch.zeros((), dtype=padded.dtype, device=padded.device))
        return out

    def write_cols_ahead(self) -> torch.Tensor:
        """``kv_write_cols`` before the read: ``[rows_bound()]``, each compact row's verify window column, -1 (SGLang's
        sink) past ``T``; the forward's are its first ``rows`` entries."""
        n = int(self.token_index.shape[0])
        out = self.token_index.new_full((self.rows_bound(),), -1)
        out[:n] = torch.where(self.token_index < n, self.token_index, -1)
        return out

    def compact_ahead(self, input_ids: torch.Tensor, positions: torch.Tensor, out: tuple | None = None):
        """``(gather_ahead(input_ids), gather_ahead(positions), write_cols_ahead())``: the forward's rows before the
        read, in one launch when the layout kernel built this layout (``kernels.ragged_layout.compact_ahead``;
        ``input_ids`` and ``positions`` 1-D there). ``out``: two 1-D buffers to hold the first two (the token-tier
        graphs' static inputs, ``graph_runner.load_ahead``), views of them returned."""
        if self.fused:
            from sglang_hybrid.kernels.ragged_layout import compact_ahead

            return compact_ahead(self.token_index, self.rows_bound(), input_ids, positions, out)
        rows = [self.gather_ahead(input_ids), self.gather_ahead(positions)]
        if out is not None:
            rows = [out_rows(o, t, t.shape[0]).copy_(t) for o, t in zip(out, rows)]
        return rows[0], rows[1], self.write_cols_ahead()

    def read(self) -> RaggedLayout:
        """Read the node counts to the host (the step's one blocking read) and return the step's layout."""
        host = self.counts.tolist()
        total, max_nodes = sum(host), max(host)
        rows = total if self.max_rows is None else tier_rows(total, self.max_rows)
        bs = len(host)
        rows = _checked_rows(bs, self.width, total, max_nodes, rows)
        if self.on_read is not None:
            self.on_read(host, rows)
        return RaggedLayout(counts=self.counts, token_index=self.token_index[:total], qo_indptr=self.qo_indptr,
                            mask_indptr=self.mask_indptr, custom_mask=self.custom_mask, total=total,
                            max_nodes=max_nodes, width=self.width, rows=rows)


def out_rows(buf: torch.Tensor, like: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` of ``buf``, after checking that it holds them, 1-D, in ``like``'s dtype and device."""
    if buf.dim() != 1 or buf.shape[0] < rows or buf.dtype != like.dtype or buf.device != like.device:
        raise ValueError(f"an output buffer of {tuple(buf.shape)} {buf.dtype} on {buf.device} cannot take {rows} rows "
                         f"of {like.dtype} on {like.device}")
    return buf[:rows]


def build_pending_layout(valid: torch.Tensor, ancestors: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                         counts: torch.Tensor, mask_out: torch.Tensor | None = None, row_bound: int | None = None,
                         max_rows: int | None = None,
                         on_read: Callable[[list, int], None] | None = None) -> PendingLayout:
    """``build_ragged_layout`` before the counts are read: the same arrays, sized by the padded batch (``B x W`` rows,
    ``W`` nodes per request) instead of ``T`` and ``max(counts)``, so no host int from the device is needed; after
    ``PendingLayout.read`` they equal ``build_ragged_layout``'s (``tests/kernels/test_ragged_verify.py``), the mask up
    to ``mask_indptr[B]``. The mask's bound grows with it (``mask_numel_bound`` at ``W`` nodes and ``B x W`` rows):
    give a buffer sized for the running limit (``triton_backend``) or expect an allocation of that bound."""
    bs, w = valid.shape
    if counts.shape != (bs,):
        raise ValueError(f"counts must be [{bs}], got {tuple(counts.shape)}")
    token_index = torch.nonzero_static(valid.reshape(-1), size=bs * w, fill_value=bs * w).reshape(-1)
    mask, mask_indptr = ragged_full_mask(ancestors, counts, token_index, seq_lens, seq_lens_sum, mask_out, w,
                                         row_bound)
    return PendingLayout(counts=counts, token_index=token_index, qo_indptr=_qo_indptr(counts),
                         mask_indptr=mask_indptr, custom_mask=mask, width=w, max_rows=max_rows, on_read=on_read)


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


__all__ = ["PendingLayout", "RaggedLayout", "build_pending_layout", "build_ragged_layout", "gather_rows",
           "kv_write_cols", "mask_numel_bound", "mask_out_checked", "node_counts", "out_rows", "ragged_full_mask",
           "scatter_rows"]
