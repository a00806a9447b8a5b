"""SGLang's FlashInfer attention backend, planning a ragged verify for HYBRID's token-tier CUDA graphs.

Why a subclass: eagerly SGLang's ``FlashInferAttnBackend`` plans a ragged verify as it is, from the verify input
(``flashinfer_plan.paged_verify_args``). Its CUDA-graph path cannot: it keeps one wrapper set per batch size, each
captured at ``bs x W`` rows (``_create_prefill_wrappers``, ``init_forward_metadata_out_graph``, which also refuses
SGLang's own ragged layout by name), while a token-tier graph (``graph_runner``) runs a fixed request count and a row
count that changes with the tier. FlashInfer 0.7.2 allows what the tiers need: a CUDA-graph
``BatchPrefillWithPagedKVCacheWrapper`` fixes its request count (``_fixed_batch_size``) and, at its first plan, its
row count (``_max_total_num_rows``, the grid's bound: ``attention/scheduler.cuh``, ``PrefillSplitQOKVIndptr``, sizes
the tiles from the total rows and the request count alone under graphs); within those any ``qo_indptr`` and custom
mask may be planned again before each replay, outside the graph, as SGLang's runners do.

``RaggedFlashInferAttnBackend`` therefore keeps one such wrapper per token tier, made the first time the tier is planned
(the float workspace is SGLang's shared one), all over one set of buffers allocated once at start (``enable``): the
indptrs of the graph runner's slots plus one request that owns the tier's spare rows
(``flashinfer_plan.tier_verify_args``), the KV indices, and the packed mask. So every plan of a tier has the same
request count (slots + 1) and the same rows (the tier's), and writes the same addresses its graph reads. The tiers'
wrappers share one int workspace too (``reset_workspace_buffer``): a tier's plan rewrites it before that tier's replay,
and no two tiers run at once. Any other batch, a verify without a layout, or a ragged verify not at the slots (eager),
is planned exactly as SGLang does.

One consequence read from FlashInfer's scheduler: under graphs it bounds each request's rows by ``rows - requests +
1``, which wraps around when a tier has fewer rows than the slots (few requests running under a high running limit);
the bound then only picks its tallest query tile, the grid staying ``ceil(rows x group / tile) + requests - 1``
tiles, so the plan stays valid, at the tall tile's cost for short queries.

What cannot run here: FlashInfer has no CPU kernels and is not installed on this project's CPU machines. On the CPU,
``tests/kernels/test_ragged_verify.py`` plans steps through ``init_forward_metadata`` on SGLang's real backend object
against a model of FlashInfer's CUDA-graph wrapper contract read from its source (request count, rows, buffer sizes),
and runs the planned arguments through a float64 model of FlashInfer's masked paged prefill against a dense reference;
``tests/plugin/test_memory_budget.py`` checks the buffers against the budget's formula. ``bench/sglang_gpu.sh`` runs the
graphs on a GPU against plain greedy decoding and against the eager forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.attention import flashinfer_backend as sglang_flashinfer
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

from ..memory_budget import FLASHINFER_TIER_BYTE_BUFFERS, flashinfer_tier_buffer_sizes
from .flashinfer_plan import tier_verify_args
from .retype import already_enabled


@dataclass(frozen=True)
class RaggedTierBuffers:
    """What every token tier's wrapper plans into, sized once for the largest step (``enable``;
    ``memory_budget.flashinfer_tier_buffer_sizes``)."""

    max_bs: int                  # the graph runner's request slots (the running limit); the wrappers plan one more
    width: int                   # the full verify width W
    max_rows: int                # forward rows: max_bs x W (tiers.tier_rows never exceeds it)
    qo_indptr: torch.Tensor      # [max_bs + 2] int32
    kv_indptr: torch.Tensor      # [max_bs + 2] int32
    last_page_len: torch.Tensor  # [max_bs + 1] int32, all 1 (page size 1)
    kv_indices: torch.Tensor     # int32: prefixes, verify slots, the spare rows' owner's sink entries
    mask: torch.Tensor           # uint8, bit-packed (FlashInfer packs each request's bits to whole bytes)
    mask_indptr: torch.Tensor    # [max_bs + 2] int32
    int_workspace: torch.Tensor  # uint8: FlashInfer's int workspace, one for every tier's wrapper


class RaggedFlashInferAttnBackend(FlashInferAttnBackend):
    """``FlashInferAttnBackend`` whose ragged verify at the graph runner's slots plans its tier's CUDA-graph wrapper
    (contract in the module docstring)."""

    ragged_buffers: RaggedTierBuffers
    tier_wrappers: dict

    def init_forward_metadata(self, forward_batch) -> None:
        layout = getattr(forward_batch.spec_info, "ragged", None)
        if (layout is None or not forward_batch.forward_mode.is_target_verify()
                or forward_batch.batch_size != self.ragged_buffers.max_bs):
            return super().init_forward_metadata(forward_batch)
        buf = self.ragged_buffers
        if forward_batch.input_ids.shape[0] != layout.rows or layout.rows > buf.max_rows or layout.width != buf.width:
            raise RuntimeError(
                f"ragged verify graphs on FlashInfer: a batch of {forward_batch.input_ids.shape[0]} tokens, its layout "
                f"{layout.rows} rows at width {layout.width}; the buffers were sized for {buf.max_rows} rows at width "
                f"{buf.width}")
        kv_indices, kv_indptr, qo_indptr, mask = tier_verify_args(
            layout, req_pool_indices=forward_batch.req_pool_indices, paged_kernel_lens=forward_batch.seq_lens,
            paged_kernel_lens_sum=forward_batch.seq_lens_sum, translator=self.kv_index_translator,
            plan=forward_batch.kv_loc_plan)
        wrapper = self.tier_wrapper(layout.rows)
        updater = self.indices_updater_prefill
        # SGLang's own TARGET_VERIFY plan call (``call_begin_forward``), with the tier's arguments
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, buf.last_page_len, updater.num_qo_heads, updater.num_kv_heads,
                     updater.head_dim, 1, q_data_type=updater.q_data_type, kv_data_type=updater.data_type,
                     custom_mask=mask, non_blocking=True)
        self.forward_metadata = PrefillMetadata([wrapper], False, False)

    def tier_wrapper(self, rows: int):
        """The CUDA-graph wrapper of the tier of ``rows``, made the first time it is asked for."""
        wrapper = self.tier_wrappers.get(rows)
        if wrapper is None:
            buf = self.ragged_buffers
            wrapper = sglang_flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer, "NHD", use_cuda_graph=True, backend=self.prefill_backend,
                qo_indptr_buf=buf.qo_indptr, paged_kv_indptr_buf=buf.kv_indptr, paged_kv_indices_buf=buf.kv_indices,
                paged_kv_last_page_len_buf=buf.last_page_len, custom_mask_buf=buf.mask,
                mask_indptr_buf=buf.mask_indptr)
            # one int workspace for every tier (FlashInfer's own API for it): a tier's plan rewrites it before the
            # tier's replay, and the tiers never run at once (8 MiB each otherwise: ``memory_budget``)
            wrapper.reset_workspace_buffer(self.workspace_buffer, buf.int_workspace)
            self.tier_wrappers[rows] = wrapper
        return wrapper


def cannot_plan_tiers(backend) -> str | None:
    """Why ``backend`` (SGLang's ``FlashInferAttnBackend``) cannot plan ragged verify tiers, or None: sliding-window
    or cross-attention layers (a second wrapper per plan), an FP4 KV cache's dequantising workspace, or no FlashInfer
    package (SGLang imports its wrappers only where it is installed)."""
    if getattr(backend, "num_wrappers", 1) != 1:
        return "its sliding-window or cross-attention layers plan a second wrapper"
    if getattr(backend, "prefill_uses_dequant_workspace", False):
        return "its FP4 KV cache is read through a dequantising workspace"
    if not hasattr(sglang_flashinfer, "BatchPrefillWithPagedKVCacheWrapper"):
        return "the flashinfer package is not installed"
    return None


def enable(backend, max_bs: int, width: int) -> None:
    """Make ``backend`` (a ``FlashInferAttnBackend`` SGLang built) plan ragged verify tiers of up to ``max_bs``
    requests (the running limit) at the full width ``width``, allocating the buffers once; a no-op when it already
    does. Any other class, or a backend that cannot (``cannot_plan_tiers``), is refused with the fix."""
    if already_enabled(backend, RaggedFlashInferAttnBackend, FlashInferAttnBackend, max_bs, width):
        return
    why = cannot_plan_tiers(backend)
    if why is not None:
        raise RuntimeError(f"ragged verify graphs on FlashInfer: {why}; run with HYBRID setting ragged_graphs=false "
                           "(an eager verify forward) or ragged_verify=off")
    if max_bs < 1 or width < 1:
        raise ValueError(f"ragged verify tiers for {max_bs} requests at width {width}")
    sizes = flashinfer_tier_buffer_sizes(max_bs, width, int(backend.max_context_len))
    dev = backend.kv_indptr[0].device              # where SGLang put the backend's own index buffers
    arrays = {k: torch.zeros(n, dtype=torch.uint8 if k in FLASHINFER_TIER_BYTE_BUFFERS else torch.int32, device=dev)
              for k, n in sizes.items()}
    arrays["last_page_len"].fill_(1)
    backend.__class__ = RaggedFlashInferAttnBackend
    backend.ragged_buffers = RaggedTierBuffers(max_bs=max_bs, width=width, max_rows=max_bs * width, **arrays)
    backend.tier_wrappers = {}


__all__ = ["RaggedFlashInferAttnBackend", "RaggedTierBuffers", "cannot_plan_tiers", "enable"]
