"""The FlashInfer backend's plan of a ragged verify: what HYBRID's verify input hands it, and what a token tier adds.

Why no backend subclass for the eager forward: SGLang's ``FlashInferAttnBackend`` takes every argument of its
TARGET_VERIFY plan that depends on the tree from the verify input (``spec_info.generate_attn_arg_prefill``:
``qo_indptr``, the paged KV ``kv_indptr`` / ``kv_indices`` and the custom mask; ``flashinfer_backend.py`` ~2273-2293 in
SGLang 0.5.23), then plans FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` with them. FlashInfer 0.7.2's plan takes
any ``qo_indptr`` with a custom mask of ``qo_len x kv_len`` bits per request, row-major, at the running sum of those
products (``prefill.py`` ~1594-1614): with ``qo_len = n_b`` and ``kv_len = s_b + n_b`` that is exactly the ragged
layout's mask and ``mask_indptr`` (``layout.ragged_full_mask``). So ``HybridVerifyInput.generate_attn_arg_prefill``
returns ``paged_verify_args`` when the step is ragged, and SGLang's eager FlashInfer path verifies ragged trees.

FlashInfer reads the verify tokens' own KV from the pool, not from ``k``/``v``: request ``b`` reads its request row
of SGLang's ``req_to_token`` for ``s_b + n_b`` positions, its prefix and then its first ``n_b`` verify slots, which
hold its real nodes (the ragged forward writes node ``k``'s KV at verify window column ``k``:
``layout.kv_write_cols``). The eager forward is not padded to a token tier (``rows = T``): FlashInfer 0.7.2's ``run``
refuses a query whose row count is not ``qo_indptr[-1]`` (``prefill.py``, ``BatchPrefillWithPagedKVCacheWrapper.run``).

Under HYBRID's token-tier graphs (``flashinfer_backend``) the forward is padded to its tier, so ``tier_verify_args``
adds one request that owns the tier's spare rows: ``rows - T`` query rows over as many KV entries, all SGLang's sink
slot (id 0, where those rows write their KV: ``layout.kv_write_cols``), every mask bit set. Then ``qo_indptr[-1]`` is
the tier's rows at every step, as ``run`` requires at the capture, and the request count is the graph runner's slots
plus one at every step, as a CUDA-graph wrapper's plan requires (``_fixed_batch_size``). The spare rows attend to
nothing a real row reads, and no real row attends to them (each request's KV entries are its own).

Not run on this project's CPU machines (FlashInfer has no CPU kernels): ``tests/kernels/test_ragged_verify.py`` checks
both functions' arguments with SGLang's own KV index translator, through a float64 model of FlashInfer's masked paged
prefill, against a dense reference; ``bench/sglang_gpu.sh`` runs HYBRID with them on a GPU against plain greedy
decoding.
"""
from __future__ import annotations

import torch
from sglang.srt.mem_cache.kv_index_translator import IdSpaceKind

from .layout import RaggedLayout


def paged_verify_args(layout: RaggedLayout, *, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor,
                      paged_kernel_lens_sum: int, translator, plan, kind=IdSpaceKind.FULL) -> tuple:
    """``(kv_indices, kv_indptr, qo_indptr, custom_mask)`` of a ragged verify for SGLang's FlashInfer prefill plan,
    in the signature of ``EagleVerifyInput.generate_attn_arg_prefill`` (``paged_kernel_lens``: the committed prefix
    lengths; ``translator`` and ``plan``: SGLang's ``KVIndexTranslator`` and the step's ``KVLocPlan``)."""
    if layout.rows != layout.total:
        raise ValueError(f"FlashInfer's eager ragged plan takes an unpadded forward: {layout.rows} rows for "
                         f"{layout.total} verify tokens")
    kv_indices, kv_indptr = _request_kv(layout, None, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum,
                                        translator, plan, kind)
    return kv_indices, kv_indptr, layout.qo_indptr, layout.custom_mask.to(torch.bool)


def tier_verify_args(layout: RaggedLayout, *, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor,
                     paged_kernel_lens_sum: int, translator, plan, kind=IdSpaceKind.FULL) -> tuple:
    """``paged_verify_args`` of a forward padded to its token tier (``layout.rows >= layout.total``), for a
    CUDA-graph wrapper: the layout's requests (the graph runner's slots, ``graph_runner.pad_requests``), then one
    more that owns the ``rows - T`` spare rows (module docstring). Device ops only past the host ints the layout and
    the batch already hold."""
    spare = layout.rows - layout.total
    if spare < 0:
        raise ValueError(f"a forward of {layout.rows} rows cannot hold {layout.total} verify tokens")
    kv_indices, kv_indptr = _request_kv(layout, spare, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum,
                                        translator, plan, kind)
    qo_indptr = torch.cat([layout.qo_indptr, layout.qo_indptr.new_full((1,), layout.rows)])
    # the owner's bits follow the requests' (FlashInfer indexes qo_len x kv_len per request at their running sum)
    mask = layout.custom_mask.to(torch.bool)
    mask = torch.cat([mask, mask.new_ones(spare * spare)])
    owner_bits = layout.mask_indptr[-1:] + torch.arange(spare * spare, device=mask.device)
    return kv_indices, kv_indptr, qo_indptr, mask.index_fill_(0, owner_bits, True)


def _request_kv(layout: RaggedLayout, spare: int | None, req_pool_indices: torch.Tensor,
                paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, translator, plan, kind) -> tuple:
    """``(kv_indices, kv_indptr)``: each request's prefix then its first ``n_b`` verify slots, read through SGLang's
    translator; unless ``spare`` is None, one more request of ``spare`` sink entries (``tier_verify_args``)."""
    device = req_pool_indices.device
    bs = int(req_pool_indices.numel())
    owner = spare is not None
    spare = spare or 0
    kv_lens = paged_kernel_lens + layout.counts.to(paged_kernel_lens.dtype)
    kv_indptr = torch.zeros(bs + 1 + owner, dtype=torch.int32, device=device)
    kv_indptr[1:bs + 1] = torch.cumsum(kv_lens, 0)
    real = paged_kernel_lens_sum + layout.total
    kv_indices = torch.empty(real + spare, dtype=torch.int32, device=device)
    translator.pack_read_stream(plan, req_pool_indices=req_pool_indices, seq_lens=kv_lens, indptr=kv_indptr[:bs + 1],
                                out=kv_indices, kind=kind, num_token_blocks=None, kv_lens_sum=paged_kernel_lens_sum)
    if owner:
        kv_indptr[bs + 1] = kv_indptr[bs] + spare
        kv_indices[real:].zero_()                       # the sink: id 0 in every id space (SGLang's KVLocPlan)
    return kv_indices, kv_indptr


__all__ = ["paged_verify_args", "tier_verify_args"]
