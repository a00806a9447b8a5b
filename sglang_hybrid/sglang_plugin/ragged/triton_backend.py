"""SGLang's Triton attention backend, planning a TARGET_VERIFY batch ragged when its verify input carries a layout.

Why a subclass: SGLang's Triton extend kernel is ragged already (it reads each request's query length from
``qo_indptr`` and its mask from ``mask_indptr``; ``tests/kernels/test_ragged_verify.py`` runs it on ragged tree
batches); only the backend's plans assume one width (``qo_indptr = arange * W``, ``mask_indptr`` from
``W x (seq_len + W)`` blocks). ``RaggedTritonAttnBackend`` plans a ragged verify through SGLang's own graph-state entry
(``init_forward_metadata_out_graph``, the call a verify CUDA graph's capture makes) with the ragged fields from the
layout (``ragged.layout``), written into buffers allocated once at start (``enable``): a verify graph captured at a
token tier (``ragged.tiers``) would read the same buffers at the same addresses, and its replay would rewrite them in
place exactly as here. What stays fixed across steps: the buffers, and the longest query, the full width ``W`` (the
kernel's grid). What a step writes: ``qo_indptr``, ``mask_indptr``, the KV indices of the committed prefixes (SGLang's
own code, ragged verify does not change it) and the mask, which the worker builds in place in ``ragged_buffers.mask``
(``layout.build_ragged_layout``'s ``mask_out``, which refuses a buffer too small for the step). Any
other batch, and any verify without a layout, is planned exactly as SGLang does.

SGLang builds its backends through its registry, so the worker turns the instances it owns into this class
(``enable``) rather than asking the user for another backend name; no file of SGLang is patched.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.attention.triton_backend import ForwardMetadata, TritonAttnBackend

from .retype import already_enabled


@dataclass(frozen=True)
class RaggedVerifyBuffers:
    """What a ragged verify plan writes, sized once for the largest step the engine runs (``enable``)."""

    max_bs: int                  # requests: the backend's own index buffers hold this many
    width: int                   # the full verify width W: the longest query, fixed (the kernel's grid)
    max_rows: int                # forward rows: max_bs x W (tiers.tier_rows never exceeds it)
    row_bound: int               # context length + W: bounds every request's mask row (layout.mask_numel_bound)
    kv_indices: torch.Tensor     # [max_bs x context] int64: the committed prefixes' KV indices
    mask: torch.Tensor           # [max_rows x row_bound + 1] uint8: the packed ragged mask (layout.ragged_full_mask)


@dataclass(frozen=True)
class _Ragged:
    """What ``_update_target_verify_buffers`` reads of a verify input: its ragged layout."""

    ragged: object


class RaggedTritonAttnBackend(TritonAttnBackend):
    """``TritonAttnBackend`` whose TARGET_VERIFY plan follows ``spec_info.ragged`` when it is set."""

    ragged_buffers: RaggedVerifyBuffers

    def init_forward_metadata(self, forward_batch) -> None:
        layout = getattr(forward_batch.spec_info, "ragged", None)
        if layout is None or not forward_batch.forward_mode.is_target_verify():
            return super().init_forward_metadata(forward_batch)
        self._check_ragged(forward_batch, layout)
        self.init_forward_metadata_out_graph(forward_batch, in_capture=True)

    def finish_plan_ahead(self, forward_batch) -> None:
        """The host half of a ragged verify plan whose device half ``plan_ahead`` queued for this batch (its layout
        padded to the slots, ``graph_runner.load_ahead``): the metadata over the buffers it wrote, launching nothing.
        The graph runner calls it instead of ``init_forward_metadata`` for the step it loaded ahead."""
        layout = forward_batch.spec_info.ragged
        self._check_ragged(forward_batch, layout)
        if forward_batch.batch_size != self.ragged_buffers.max_bs:
            raise RuntimeError(f"ragged verify: a plan ahead is for the {self.ragged_buffers.max_bs} slots, the batch "
                               f"holds {forward_batch.batch_size}")
        self.forward_metadata = self._build_cuda_graph_forward_metadata(
            forward_batch.batch_size, forward_batch.forward_mode, forward_batch.spec_info,
            self._fill_cuda_graph_swa_out_cache_loc(forward_batch, in_capture=True))

    def _check_ragged(self, forward_batch, layout) -> None:
        """Refuse a ragged verify batch that is not compacted, does not fit the buffers or has sliding-window
        layers."""
        if forward_batch.input_ids.shape[0] != layout.rows:
            raise RuntimeError(
                f"ragged verify: the forward batch holds {forward_batch.input_ids.shape[0]} tokens but its layout "
                f"{layout.rows} rows; the batch was not compacted (RaggedVerifyTarget)")
        buf = self.ragged_buffers
        if layout.batch_size > buf.max_bs or layout.rows > buf.max_rows or layout.width != buf.width:
            raise RuntimeError(
                f"ragged verify: a step of {layout.batch_size} requests, {layout.rows} rows at width {layout.width} "
                f"exceeds the buffers sized at start ({buf.max_bs} requests, {buf.max_rows} rows, width {buf.width})")
        if self.sliding_window_size is not None and self.sliding_window_size > 0:
            raise RuntimeError("ragged verify does not plan sliding-window attention layers; "
                               "run with HYBRID setting ragged_verify=off")

    def plan_ahead(self, plan, bs: int, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, layout) -> None:
        """The device half of a ragged verify's plan (the layout's index and mask pointers, the committed prefixes'
        KV indices) for ``bs`` requests (the slots the token-tier graphs run at) of a ``layout`` padded to them, its
        row count not read yet (``layout.PendingLayout``): none of it depends on the rows. After the read,
        ``finish_plan_ahead`` builds the metadata, on the host (``graph_runner.load_ahead``)."""
        buf = self.ragged_buffers
        if bs != buf.max_bs or layout.width != buf.width or layout.counts.shape[0] != bs:
            raise RuntimeError(f"ragged verify: a plan ahead for {bs} slots of {layout.counts.shape[0]} requests at "
                               f"width {layout.width}; the buffers were sized for {buf.max_bs} at {buf.width}")
        self._update_target_verify_buffers(plan, bs, seq_lens, _Ragged(layout), req_pool_indices)

    def _update_target_verify_buffers(self, plan, bs, seq_lens, spec_info, req_pool_indices):
        layout = getattr(spec_info, "ragged", None)
        if layout is None:
            return super()._update_target_verify_buffers(plan, bs, seq_lens, spec_info, req_pool_indices)
        buf = self.ragged_buffers
        self.qo_indptr[: bs + 1].copy_(layout.qo_indptr)
        self.mask_indptr[: bs + 1].copy_(layout.mask_indptr)
        if layout.custom_mask.data_ptr() != buf.mask.data_ptr():
            raise RuntimeError("ragged verify: the step's mask was not built in the backend's buffer "
                               "(ragged_buffers.mask), where a captured graph would read it")
        self._fill_kv_indptr_and_indices(plan, bs, seq_lens, req_pool_indices, buf.kv_indices)

    def _build_cuda_graph_forward_metadata(self, bs, forward_mode, spec_info, swa_out_cache_loc=None):
        if getattr(spec_info, "ragged", None) is None or not forward_mode.is_target_verify():
            return super()._build_cuda_graph_forward_metadata(bs, forward_mode, spec_info, swa_out_cache_loc)
        buf = self.ragged_buffers
        return ForwardMetadata(
            attn_logits=None, attn_lse=None, max_extend_len=buf.width, num_kv_splits=None,
            kv_indptr=self.kv_indptr[: bs + 1], kv_indices=buf.kv_indices, qo_indptr=self.qo_indptr[: bs + 1],
            custom_mask=buf.mask, mask_indptr=self.mask_indptr[: bs + 1], window_kv_indptr=None,
            window_kv_indices=None, window_num_kv_splits=None, window_kv_offsets=None,
            swa_out_cache_loc=swa_out_cache_loc)


def enable(backend, max_bs: int, width: int) -> None:
    """Make ``backend`` (a ``TritonAttnBackend`` SGLang built) plan ragged verify batches of up to ``max_bs``
    requests (the running limit) at the full width ``width``, allocating the plan's buffers once; a no-op when it
    already does. Any other class is refused: it would ignore the layout and attend over the wrong rows."""
    if already_enabled(backend, RaggedTritonAttnBackend, TritonAttnBackend, max_bs, width):
        return
    if not 1 <= max_bs <= int(backend.qo_indptr.shape[0]) - 1:
        raise ValueError(f"ragged verify for {max_bs} requests: the backend's index buffers hold "
                         f"{int(backend.qo_indptr.shape[0]) - 1}")
    ctx = int(backend.max_context_len)
    max_rows, row_bound = max_bs * width, ctx + width
    backend.__class__ = RaggedTritonAttnBackend
    backend.ragged_buffers = RaggedVerifyBuffers(
        max_bs=max_bs, width=width, max_rows=max_rows, row_bound=row_bound,
        kv_indices=torch.zeros(max_bs * ctx, dtype=torch.int64, device=backend.device),
        mask=torch.ones(max_rows * row_bound + 1, dtype=torch.uint8, device=backend.device))


__all__ = ["RaggedTritonAttnBackend", "RaggedVerifyBuffers", "enable"]
