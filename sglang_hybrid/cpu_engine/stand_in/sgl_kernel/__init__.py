"""CPU stand-in for the ``sgl_kernel`` ops that SGLang 0.5.23's CPU engine imports (not a real ``sgl_kernel``).

Why it exists: with ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports ``sgl_kernel`` even for plain serving, and no package
on PyPI provides its CPU build. ``sglang_hybrid.cpu_engine`` puts the folder holding this package on the path *only*
for CPU runs (the self-check's ``--cpu`` and the live tests); a real ``sgl_kernel`` installed on a GPU machine is never
shadowed because nothing else adds this folder.

Each op is written from the contract of SGLang's own Triton kernel of the same job (named in its docstring) in plain
torch; the two tree ops call SGLang's Triton implementations (the path SGLang uses on XPU), which Triton's
interpreter (``TRITON_INTERPRET=1``) runs on CPU. Any other attribute resolves to a function that raises
``NotImplementedError`` naming the op, so a code path this stand-in does not cover fails loudly, never silently.

Tree speculative sampling (SGLang's sampling verify, which SGLang never runs on CPU) has its stand-in in
``sglang_hybrid/cpu_engine/tree_sampling.py``; when ``prepare_environment(tree_sampling_counts=...)`` asked for it,
importing this package installs it in the engine's process (``install_when_imported``). Likewise KV window planning
(``sglang_hybrid/cpu_engine/kv_window.py``), which SGLang gates off on CPU, when ``prepare_environment(kv_window=True)``
asked for it, and the torch twin of SGLang's Triton extend attention (``sglang_hybrid/cpu_engine/torch_attention.py``)
when the environment asks for it (``HYBRID_CPU_ENGINE_TORCH_ATTENTION``, a test switch). With
``HYBRID_CPU_ENGINE_TORCH_KERNELS`` (the try-out server's ``--torch-kernels``) the greedy tree verify op is the torch
twin of SGLang's Triton kernel (``sglang_hybrid/cpu_engine/torch_tree_verify.py``) instead of the kernel itself.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

__version__ = "0.0.0+sglang-hybrid-cpu-stand-in"


def _segments(start: torch.Tensor, end: torch.Tensor):
    """Host ``(start, end)`` pairs: CPU ops run on host tensors already, so ``tolist`` costs no device sync."""
    return list(zip(start.tolist(), end.tolist()))


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """``allocation.assign_req_to_token_pool``: ``req_to_token[row_i, start_i:end_i] = out_cache_loc[off_i:...]``
    with ``off_i`` the running sum of the earlier requests' lengths."""
    off = 0
    for row, (s, e) in zip(req_pool_indices.tolist(), _segments(start_offset, end_offset)):
        n = e - s
        if n > 0:
            req_to_token[row, s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += max(n, 0)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """``cache_locs.assign_extend_cache_locs``: the inverse gather,
    ``out[off_i:...] = req_to_token[row_i, s_i:e_i]``."""
    off = 0
    for row, (s, e) in zip(req_pool_indices.tolist(), _segments(start_offset, end_offset)):
        n = e - s
        if n > 0:
            out_cache_loc[off:off + n] = req_to_token[row, s:e].to(out_cache_loc.dtype)
        off += max(n, 0)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk,
                                           num_cols) -> None:
    """``cache_locs.assign_draft_cache_locs_contiguous``: request ``i``'s ``topk * num_cols`` slots from
    ``seq_lens[i]`` on, copied to ``out_cache_loc[i * topk * num_cols:...]``."""
    n = int(topk) * int(num_cols)
    for i, (row, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * n:(i + 1) * n] = req_to_token[row, s:s + n].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    """``eagle.fill_bonus_tokens``: the last accepted token of each request (``accept_lens`` includes the bonus)."""
    idx = torch.arange(accept_lens.shape[0]) * int(accept_stride) + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """``eagle.fill_accept_out_cache_loc``: the cache locations of accepted slots (``accept_index != -1``), in order,
    compacted to the front of ``accept_out_cache_loc``."""
    flat = accept_index.reshape(-1)
    src = flat[flat != -1].to(torch.int64)
    accept_out_cache_loc[: src.shape[0]] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """``cache_move.copy_all_layer_kv_cache_tiled``: for every KV buffer (raw pointer ``data_ptrs[i]``, slot size
    ``strides[i]`` bytes) copy slot ``src_loc[j]`` to slot ``tgt_loc[j]``; all sources are read before any write."""
    tgt = tgt_loc.to(torch.int64).numpy()
    src = src_loc.to(torch.int64).numpy()
    if tgt.size == 0:
        return
    slots = int(max(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        buf = (ctypes.c_uint8 * (slots * int(stride))).from_address(int(ptr))
        view = np.ctypeslib.as_array(buf).reshape(slots, int(stride))
        view[tgt] = view[src]


def build_tree_kernel_efficient_cpu(*args) -> None:
    """SGLang's Triton tree builder (its XPU path), run by Triton's CPU interpreter."""
    from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

    sgl_build_tree_kernel_triton(*args)


def verify_tree_greedy_cpu(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """SGLang's Triton greedy tree verification (its XPU path), run by Triton's CPU interpreter."""
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    verify_tree_greedy_triton(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
                              candidates=candidates, retrieve_index=retrive_index,
                              retrieve_next_token=retrive_next_token, retrieve_next_sibling=retrive_next_sibling,
                              target_predict=target_predict)


def _install_tree_sampling() -> None:
    import os

    from sglang_hybrid.cpu_engine import TREE_SAMPLING_ENV

    if os.environ.get(TREE_SAMPLING_ENV):
        from sglang_hybrid.cpu_engine.tree_sampling import install_when_imported

        install_when_imported()


_install_tree_sampling()


def _install_kv_window() -> None:
    from sglang_hybrid.cpu_engine.kv_window import install_when_imported

    install_when_imported()


_install_kv_window()


def _install_torch_attention() -> None:
    from sglang_hybrid.cpu_engine.torch_attention import install_when_imported

    install_when_imported()


_install_torch_attention()


def _install_torch_tree_verify() -> None:
    import os
    import sys

    from sglang_hybrid.sglang_plugin.config import TORCH_KERNELS_ENV

    if os.environ.get(TORCH_KERNELS_ENV):
        from sglang_hybrid.cpu_engine.torch_tree_verify import swap_tree_verify

        swap_tree_verify(sys.modules[__name__])


_install_torch_tree_verify()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by Hybrid Spark's CPU stand-in (sglang_hybrid/cpu_engine/stand_in); "
            "this SGLang code path needs the real sgl_kernel, which has no CPU build on PyPI")

    missing.__name__ = name
    return missing
