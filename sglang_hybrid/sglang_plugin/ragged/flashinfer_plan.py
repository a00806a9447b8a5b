"""The FlashInfer backend's eager plan of a ragged verify: what HYBRID's verify input hands it.

Why no backend subclass: SGLang's ``FlashInferAttnBackend`` takes every argument of its TARGET_VERIFY plan that
depends on the tree from the verify input (``spec_info.generate_attn_arg_prefill``: ``qo_indptr``, the paged KV
``kv_indptr`` / ``kv_indices`` and the custom mask; ``flashinfer_backend.py`` ~2273-2293 in SGLang 0.5.23), then
plans FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` with them. FlashInfer 0.7.2's plan takes any
``qo_indptr`` with a custom mask of ``qo_len x kv_len`` bits per request, row-major, at the running sum of those
products (``prefill.py`` ~1594-1614): with ``qo_len = n_b`` and ``kv_len = s_b + n_b`` that is exactly the ragged
layout's mask and ``mask_indptr`` (``layout.ragged_full_mask``). So ``HybridVerifyInput.generate_attn_arg_prefill``
returns ``paged_verify_args`` when the step is ragged, and SGLang's eager FlashInfer path verifies ragged trees.

FlashInfer reads the verify tokens' own KV from the pool, not from ``k``/``v``: request ``b`` reads its request row
of SGLang's ``req_to_token`` for ``s_b + n_b`` positions, its prefix and then its first ``n_b`` verify slots, which
hold its real nodes (the ragged forward writes node ``k``'s KV at verify window column ``k``:
``layout.kv_write_cols``). The forward is not padded to a token tier here (``rows = T``): FlashInfer 0.7.2's ``run``
refuses a query whose row count is not ``qo_indptr[-1]`` (``prefill.py``, ``BatchPrefillWithPagedKVCacheWrapper.run``),
so a tier's spare rows would have to belong to a padding request (as SGLang's own compact mode pads), which a
captured FlashInfer verify graph would need and which is not built; eagerly, the plan reads the indptrs to the host
every step anyway.

Not run on this project's CPU machines (FlashInfer has no CPU kernels): ``tests/test_ragged_verify.py`` checks these
arguments with SGLang's own KV index translator and the layout FlashInfer derives from them; ``bench/sglang_gpu.sh``
runs HYBRID with it on a GPU against plain greedy decoding.
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
    device = req_pool_indices.device
    bs = int(req_pool_indices.numel())
    kv_lens = paged_kernel_lens + layout.counts.to(paged_kernel_lens.dtype)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(kv_lens, 0)
    kv_indices = torch.empty(paged_kernel_lens_sum + layout.total, dtype=torch.int32, device=device)
    translator.pack_read_stream(plan, req_pool_indices=req_pool_indices, seq_lens=kv_lens, indptr=kv_indptr,
                                out=kv_indices, kind=kind, num_token_blocks=None, kv_lens_sum=paged_kernel_lens_sum)
    return kv_indices, kv_indptr, layout.qo_indptr, layout.custom_mask.to(torch.bool)


__all__ = ["paged_verify_args"]
