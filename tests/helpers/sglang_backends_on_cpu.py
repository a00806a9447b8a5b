"""SGLang's Triton and FlashInfer attention backends made on the CPU, for tests that run their own methods.

Their constructors need a model runner (and FlashInfer's, CUDA), so the objects are made with ``__new__`` and given
the attributes the methods under test read (graph state, KV index kernels); SGLang's methods then run unchanged.
Import in a process where Triton's interpreter is set (``TRITON_INTERPRET=1`` before Triton's import), as the probes
of ``tests/plugin/_scripts`` (memory budget, shared draft steps) are run.
"""
from __future__ import annotations

import torch


def flashinfer_module():
    """SGLang's FlashInfer backend module, its literal ``device="cuda"`` allocations made on the host instead."""
    import sglang.srt.layers.attention.flashinfer_backend as fb

    class Host:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*a, device=None, **k):
            return torch.zeros(*a, **k)

    fb.torch = Host()
    return fb


def flashinfer_step(fb, *, max_bs: int, context: int, skip_prefill: bool = True):
    """A ``FlashInferAttnBackend`` (one wrapper) with what ``init_cuda_graph_state`` reads."""
    b = fb.FlashInferAttnBackend.__new__(fb.FlashInferAttnBackend)
    b.max_context_len, b.num_wrappers, b.use_sliding_window_kv_pool = context, 1, False
    b.skip_prefill, b.kv_indptr = skip_prefill, [torch.zeros(max_bs + 1, dtype=torch.int32)]
    return b


def flashinfer_multi_step(fb, steps: int, *, max_bs: int, context: int):
    """A ``FlashInferMultiStepDraftBackend`` of ``steps`` (top-k 1) with ``steps - 1`` step backends."""
    ms = fb.FlashInferMultiStepDraftBackend.__new__(fb.FlashInferMultiStepDraftBackend)
    ms.topk, ms.max_context_len, ms.speculative_num_steps = 1, context, steps
    ms.attn_backends = [flashinfer_step(fb, max_bs=max_bs, context=context) for _ in range(steps - 1)]
    return ms


def triton_step(*, context: int, heads: int, kv_splits: int, head_dim: int, sms: int, width: int,
                skip_prefill: bool = True, draft: bool = True):
    """A ``TritonAttnBackend`` with what ``init_cuda_graph_state`` and ``get_num_kv_splits`` read (``sms``: the
    device's SM count, which sizes the lean-decode partials and schedules the split counts)."""
    import sglang.srt.layers.attention.triton_backend as tb

    b = tb.TritonAttnBackend.__new__(tb.TritonAttnBackend)
    b.dllm_attention, b.num_head, b.num_kv_head, b.max_kv_splits = None, heads, heads, kv_splits
    b.v_head_dim, b.swa_v_head_dim, b.device = head_dim, None, "cpu"
    b.lean_total_programs, b.lean_block_m, b.max_context_len = sms, 16, context
    b.is_draft_runner, b.skip_prefill, b.num_draft_tokens = draft, skip_prefill, width
    b.sliding_window_size, b.use_sliding_window_kv_pool = None, False
    b.static_kv_splits, b.device_core_count, b.enable_deterministic, b.split_tile_size = False, sms, False, None
    return b
