"""A torch twin of SGLang's Triton kernel ``generate_draft_decode_kv_indices`` for the CPU engine (a test switch, not
a deployment one; the same switch as the attention twins, ``torch_attention.TORCH_ATTENTION_ENV``).

Why: with the attention twins on, the EAGLE draft step's remaining interpreted kernel is this one. SGLang's Triton
multi-step draft backend (``TritonMultiStepDraftBackend.common_template``) launches it once per draft plan to lay out
every draft step's KV indices and ``kv_indptr``: in Triton's interpreter, a few tens of milliseconds a plan at four
requests. A py-spy profile of a start with the cost tables measured at start (docs/benchmarks.md, section 3d) found
it three-quarters of the draft-table probe and 21 % of both probes' samples: a GPU kernel of microseconds emulated on
the CPU, charged to the start-up measurement (its target: at most +10 %), and to every draft step of the live
cases that run the twins.

What it computes, exactly as the kernel (``sglang.kernels.ops.speculative.cache_locs``), for the launch grid
``(steps, requests, topk)`` (or ``(NUM_STEPS x blocks, requests, topk)``): for draft step ``s`` (``s + 1`` draft
tokens so far) and request ``b``'s branch ``t``, its committed KV ids (or, under a draft window, its ``sink_size``
first and most recent ones) then its ``s + 1`` draft slots, at the offset the kernel writes them, in row ``s`` of
``kv_indices``; and ``kv_indptr[s, z]`` at the branch's start ``z = b x topk + t`` (branch 0 writes the end, entry
``requests x topk``, instead; entry 0 is left as it was, zero in the backend's buffer). Ids are read through the
``KVIndexTable``'s row source as the kernel reads them: token or page entries (``ENTRY_PAGE_SIZE``), translated
through ``v2p`` (``TRANSLATE``).

Checked against the kernel (interpreter) on ``tests/kernels/test_torch_kv_indices.py``'s batches: chains and top-k
branches, several steps, contexts longer than the kernel's copy block, page entries, translation, a draft window with
sinks, the block-split grid. Refuses by name a grid it cannot read (a callable) and a non-contiguous buffer (the
kernel's pointer arithmetic assumes rows ``stride`` apart). Nothing in the plugin imports this module.

The second twin, ``create_flashinfer_kv_indices_torch``, stands in for SGLang's KV-index gather
``create_flashinfer_kv_indices_triton`` (``sglang.kernels.ops.attention.kv_indices``), which the Triton backend's
metadata launches through the KV index translator (``kv_index_translator.pack_read_stream``) for every forward: each
request's ``page_kernel_lens`` ids from its ``req_to_token`` row (from ``kv_start_idx`` on, where given; page entries
expanded, ``token_mapping`` applied) written at its ``kv_indptr`` offset. Only under ``TORCH_KERNELS_ENV`` (the try-out
server's ``--torch-kernels``), not under ``TORCH_ATTENTION_ENV``: the live cases keep running the kernel. Checked
against the kernel (interpreter) in ``tests/plugin/test_cpu_tryout.py``.
"""
from __future__ import annotations

import functools
import logging

import torch

from sglang_hybrid.sglang_plugin.ragged.graph_capture import kernel_launch

#: the module whose name ``generate_draft_decode_kv_indices`` the Triton draft backend calls (imported there from
#: ``sglang.srt.speculative.spec_utils`` at its own import, so the twin replaces that module's name)
TRITON_BACKEND = "sglang.srt.layers.attention.triton_backend"
#: logged once per process when the twin replaces the kernel
KV_INDICES_SWAP_LOG = ("CPU engine: the draft step's KV indices are laid out by the torch twin of SGLang's Triton "
                       "kernel generate_draft_decode_kv_indices (sglang_hybrid/cpu_engine/torch_kv_indices.py)")
logger = logging.getLogger(__name__)


def flat_view(twin: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` as the flat array a Triton kernel's pointer arithmetic addresses; refuses, naming the twin ``twin`` and
    the argument, a layout that is not that (every torch twin of the CPU engine reads its arguments so)."""
    if not t.is_contiguous():
        raise NotImplementedError(f"{twin}: {name} is not contiguous (the kernel addresses it as one flat array)")
    return t.view(-1)


def _flat(name: str, t: torch.Tensor) -> torch.Tensor:
    return flat_view("generate_draft_decode_kv_indices_torch", name, t)


def draft_decode_kv_indices(grid, req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, positions,
                            row_stride, kv_indices_stride, kv_indptr_stride, bs_upper, iter_upper, num_tokens_upper,
                            page_size, window_size=0, sink_size=0, NUM_STEPS=0, ENTRY_PAGE_SIZE=1, v2p=None,
                            TRANSLATE=False) -> None:
    """``generate_draft_decode_kv_indices[grid](...)`` in torch, writing ``kv_indices`` and ``kv_indptr`` in place
    (the module docstring says what). Stands in for one kernel launch (``kernel_launch``), as the attention twins."""
    with kernel_launch("generate_draft_decode_kv_indices_torch", (grid,), dict(locals())):
        if callable(grid) or len(grid) != 3:
            raise NotImplementedError("generate_draft_decode_kv_indices_torch: needs the grid as a (steps, requests, "
                                      f"topk) tuple, got {grid!r}")
        steps = int(NUM_STEPS) or int(grid[0])
        num_seqs, topk = int(grid[1]), int(grid[2])
        out, ptr = _flat("kv_indices", kv_indices), _flat("kv_indptr", kv_indptr)
        table = _flat("req_to_token", req_to_token)
        rows = req_pool_indices[:num_seqs].long().tolist()
        lens = paged_kernel_lens[:num_seqs].long().tolist()
        cap = int(window_size) + int(sink_size) if window_size > 0 else None
        # the kernel's kv_indptr entry z sums the first z positions (window-capped), the same for every step: once
        pos = positions[:int(num_tokens_upper)].long()
        pos_sums = [0] + (pos if cap is None else pos.clamp_max(cap)).cumsum(0).tolist()

        def load(row: int, at: torch.Tensor) -> torch.Tensor:
            # _load_token_ids: a row's token entries, or page entries expanded, then through v2p
            base = row * int(row_stride)
            if ENTRY_PAGE_SIZE == 1:
                ids = table[base + at].long()
            else:
                ids = table[base + at // ENTRY_PAGE_SIZE].long() * ENTRY_PAGE_SIZE + at % ENTRY_PAGE_SIZE
            if TRANSLATE:
                negative = ids < 0
                page = torch.where(negative, 0, ids // page_size)
                phys = v2p[page].long() * page_size + ids % page_size
                ids = torch.where(negative, 0, phys.clamp_min(0))
            return ids

        for s in range(steps):
            iters = s + 1
            row_out, row_ptr = s * int(kv_indices_stride), s * int(kv_indptr_stride)
            cum = 0
            for b in range(num_seqs):
                seq_len = lens[b]
                if cap is None:
                    seq_len_w, s_eff, recent_start = seq_len, 0, 0
                else:
                    seq_len_w = min(seq_len, cap)
                    s_eff = min(int(sink_size), seq_len)
                    recent_start = seq_len - (seq_len_w - s_eff)
                offsets = torch.arange(seq_len_w)
                prefix = load(rows[b], torch.where(offsets < s_eff, offsets, recent_start + offsets - s_eff))
                draft = torch.arange(iters)
                for t in range(topk):
                    at = cum * topk + b * iters * topk + t * (seq_len_w + iters)
                    out[row_out + at:row_out + at + seq_len_w] = prefix.to(out.dtype)
                    if page_size == 1 or topk == 1:
                        first = seq_len + t * steps
                    else:
                        last_page = seq_len % page_size
                        pages = (last_page + steps + page_size - 1) // page_size
                        first = seq_len // page_size * page_size + t * pages * page_size + last_page
                    out[row_out + at + seq_len_w:row_out + at + seq_len_w + iters] = \
                        load(rows[b], first + draft).to(out.dtype)
                    z = b * topk + t or num_seqs * topk
                    ptr[row_ptr + z] = pos_sums[min(z, len(pos_sums) - 1)] + z * iters
                cum += seq_len_w


class _LaunchByGrid:
    """What ``kernel[grid](...)`` reads: indexing by the grid gives the call."""

    __name__ = "generate_draft_decode_kv_indices_torch"

    def __getitem__(self, grid):
        return functools.partial(draft_decode_kv_indices, grid)


#: the twin as the backend calls the kernel: ``generate_draft_decode_kv_indices_torch[grid](...)``
generate_draft_decode_kv_indices_torch = _LaunchByGrid()


def swap_kv_indices_kernel(module) -> None:
    """Replace ``generate_draft_decode_kv_indices`` in SGLang's Triton backend module with the twin, and say so in the
    process's log (``KV_INDICES_SWAP_LOG``)."""
    module.generate_draft_decode_kv_indices = generate_draft_decode_kv_indices_torch
    logger.warning(KV_INDICES_SWAP_LOG)


def kv_indices_gather(grid, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx,
                      kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False,
                      token_mapping=None) -> None:
    """``create_flashinfer_kv_indices_triton[grid](...)`` in torch, writing ``kv_indices_ptr`` in place: for each of
    the grid's ``grid[0]`` requests ``b``, the ids of positions ``kv_start .. kv_start + page_kernel_lens[b]`` of row
    ``req_pool_indices[b]`` (``kv_start = kv_start_idx[b]``, or 0 without it), at offset ``kv_indptr[b]``. Token entries
    as they are; page entries (``ENTRY_PAGE_SIZE > 1``) as ``entry * ENTRY_PAGE_SIZE + position % ENTRY_PAGE_SIZE``;
    then through ``token_mapping`` where given (a negative id stays -1). The grid's second axis
    (``TOKEN_BLOCK_PARALLEL``) splits a request's copy among programs and changes nothing written. Stands in for one
    kernel launch (``kernel_launch``), as the attention twins."""
    with kernel_launch("create_flashinfer_kv_indices_torch", (grid,), dict(locals())):
        if callable(grid) or not 1 <= len(grid) <= 2:
            raise NotImplementedError("create_flashinfer_kv_indices_torch: needs the grid as a (requests,) or "
                                      f"(requests, blocks) tuple, got {grid!r}")
        table = _flat("req_to_token", req_to_token_ptr)
        out = _flat("kv_indices", kv_indices_ptr)
        bs, stride, page = int(grid[0]), int(req_to_token_ptr_stride), int(ENTRY_PAGE_SIZE)
        rows = req_pool_indices_ptr[:bs].long().tolist()
        lens = page_kernel_lens_ptr[:bs].long().tolist()
        starts = kv_indptr[:bs].long().tolist()
        firsts = kv_start_idx[:bs].long().tolist() if kv_start_idx is not None else [0] * bs
        for row, n, at, first in zip(rows, lens, starts, firsts):
            if n <= 0:
                continue
            base = row * stride
            if page == 1:
                ids = table[base + first:base + first + n].long()
            else:
                pos = torch.arange(first, first + n, device=table.device)
                ids = table[base + pos // page].long() * page + pos % page
            if token_mapping is not None:
                ids = torch.where(ids >= 0, token_mapping[ids.clamp_min(0)].long(), -1)
            out[at:at + n] = ids.to(out.dtype)


class _GatherByGrid:
    """What ``kernel[grid](...)`` reads: indexing by the grid gives the call."""

    __name__ = "create_flashinfer_kv_indices_torch"

    def __getitem__(self, grid):
        return functools.partial(kv_indices_gather, grid)


#: the twin as the KV index translator calls the kernel: ``create_flashinfer_kv_indices_torch[grid](...)``
create_flashinfer_kv_indices_torch = _GatherByGrid()
#: the module whose name ``create_flashinfer_kv_indices_triton`` the translator launches (imported at its import)
KV_INDEX_TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator"
#: logged once per process when the twin replaces the gather kernel
KV_GATHER_SWAP_LOG = ("CPU engine: every forward's KV indices are gathered by the torch twin of SGLang's Triton kernel "
                      "create_flashinfer_kv_indices_triton (sglang_hybrid/cpu_engine/torch_kv_indices.py)")


def swap_kv_gather_kernel(module) -> None:
    """Replace ``create_flashinfer_kv_indices_triton`` in SGLang's KV index translator module with the twin, and say
    so in the process's log (``KV_GATHER_SWAP_LOG``)."""
    module.create_flashinfer_kv_indices_triton = create_flashinfer_kv_indices_torch
    logger.warning(KV_GATHER_SWAP_LOG)


__all__ = ["KV_GATHER_SWAP_LOG", "KV_INDEX_TRANSLATOR", "KV_INDICES_SWAP_LOG", "TRITON_BACKEND",
           "create_flashinfer_kv_indices_torch", "draft_decode_kv_indices", "generate_draft_decode_kv_indices_torch",
           "kv_indices_gather", "swap_kv_gather_kernel", "swap_kv_indices_kernel"]
