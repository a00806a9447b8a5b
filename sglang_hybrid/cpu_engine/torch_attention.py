"""Torch twins of SGLang's Triton extend- and decode-attention kernels for the CPU engine (a test switch and the
try-out server's, ``python -m sglang_hybrid.serve --cpu --torch-kernels``; not a deployment one).

Why: on a CPU the engine runs SGLang's Triton attention in Triton's interpreter, which is most of the live suite's
time (a profile of a live HYBRID run: 80 % of the scheduler's samples inside ``extend_attention_fwd``: prompt
prefills, verify forwards and draft extends). Every HYBRID live case needs the Triton backend (the backends that apply
a tree mask are Triton and FlashInfer), but only some cases need the Triton *kernel* itself; the others test what
HYBRID does around it (its trees, ragged layout, KV, counters, the server). With ``TORCH_ATTENTION_ENV`` set, the
stand-in ``sgl_kernel`` (imported by every CPU engine process) calls ``install_when_imported``, which replaces
``extend_attention_fwd`` in SGLang's ``extend_attention`` module and ``decode_attention_fwd`` in its
``decode_attention`` module, before any backend reads them (``TritonAttnBackend`` imports both in its constructor),
with ``extend_attention_torch`` and ``decode_attention_torch`` below. The backend's metadata -- HYBRID's ragged
``qo_indptr``, packed tree mask and ``mask_indptr`` included -- is computed exactly as before and handed to the twins
unchanged. Decode attention was 1.6 % of that profile, but it is all of the draft forward the start-up measurement
times (``startup_costs.measure_draft_costs``): in the interpreter each probe forward takes about half a second, in the
twin a few milliseconds, so the start-up benchmark (``bench.startup_profile``) runs both twins.

The extend twin is checked against SGLang's kernel (interpreter) on every batch of
``tests/kernels/test_ragged_verify.py``: ragged trees, GQA, causal and not, prefix mask columns skipped and read,
requests longer than a query tile; the decode twin on ragged decode batches, GQA and not, with KV slots scattered
through the pool (``tests/kernels/test_torch_attention.py``). Each refuses, by name, every feature of its kernel it does
not implement (sliding windows, sinks, logit caps, score mods, LSE output, split prefix/extend stages, paged KV, fp8
scales, MLA), and the extend twin a ``max_len_extend`` shorter than a request (the kernel's grid would leave that
request's later rows unwritten). Nothing in the plugin imports this module.
"""
from __future__ import annotations

import logging
import os

import torch

from sglang_hybrid.sglang_plugin.ragged.graph_capture import kernel_launch

from .import_hook import patch_after_import

from sglang_hybrid.sglang_plugin.config import TORCH_ATTENTION_ENV, TORCH_KERNELS_ENV

EXTEND_ATTENTION = "sglang.kernels.ops.attention.extend_attention"
DECODE_ATTENTION = "sglang.kernels.ops.attention.decode_attention"
#: logged once per process when the twin replaces the extend kernel
SWAP_LOG = (f"CPU engine: extend attention runs the torch twin of SGLang's Triton kernel ({TORCH_ATTENTION_ENV} or "
            f"{TORCH_KERNELS_ENV} is set; sglang_hybrid/cpu_engine/torch_attention.py)")
#: logged once per process when the twin replaces the decode kernel
DECODE_SWAP_LOG = (f"CPU engine: decode attention runs the torch twin of SGLang's Triton kernel ({TORCH_ATTENTION_ENV} "
                   f"or {TORCH_KERNELS_ENV} is set; sglang_hybrid/cpu_engine/torch_attention.py)")
logger = logging.getLogger(__name__)


def _refuse(twin: str = "extend", **features) -> None:
    """Raise naming the first kernel feature in use that the ``twin`` (``extend`` or ``decode``) does not implement."""
    for name, used in features.items():
        if used:
            raise NotImplementedError(f"{twin}_attention_torch (the CPU engine's torch twin of SGLang's Triton {twin} "
                                      f"attention) does not implement {name}; unset {TORCH_ATTENTION_ENV} to run "
                                      "SGLang's kernel")


def extend_attention_torch(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                           kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale=1.0,
                           v_scale=1.0, sm_scale=None, logit_cap=0.0, skip_prefix_custom_mask=True,
                           sliding_window_size=-1, sinks=None, window_kv_offsets=None, xai_temperature_len=-1,
                           lse_extend=None, skip_prefix=False, skip_extend=False, page_size: int = 1, score_mod=None,
                           aux_tensors=None, extend_seq_lens_cpu=None, identity_kv_indices: bool = False) -> None:
    """SGLang's ``extend_attention_fwd`` contract, in torch, writing ``o_extend`` in place.

    Request ``b`` owns query rows ``qo_indptr[b]:qo_indptr[b+1]`` (``n`` rows) and sees its prefix -- the KV pool rows
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (``p`` keys) -- then its own ``n`` extend keys. Visibility: with a
    ``custom_mask``, row ``i`` reads its ``p + n`` flags at ``mask_indptr[b] + i * (p + n)``, prefix columns first
    (ignored, i.e. all visible, under ``skip_prefix_custom_mask``); without one, every prefix key and the extend keys
    up to ``i`` (``is_causal``) or all of them. Query head ``h`` reads KV head ``h // (heads / kv_heads)``. Scores
    are ``q . k * sm_scale`` (default ``1/sqrt(head_dim)``), softmax in float32 as the kernel accumulates.

    It stands in for one kernel launch: a traced graph replay (``ragged.graph_capture``) records the call with its
    arguments, as it records a Triton launch, and does not look inside (its host reads of the per-request lengths are
    what the kernel reads on the device)."""
    with kernel_launch("extend_attention_torch", kwargs=dict(locals())):
        _extend_attention(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                          kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale,
                          logit_cap, skip_prefix_custom_mask, sliding_window_size, sinks, window_kv_offsets,
                          xai_temperature_len, lse_extend, skip_prefix, skip_extend, page_size, score_mod,
                          aux_tensors)


def _extend_attention(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                      custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale, logit_cap,
                      skip_prefix_custom_mask, sliding_window_size, sinks, window_kv_offsets, xai_temperature_len,
                      lse_extend, skip_prefix, skip_extend, page_size, score_mod, aux_tensors) -> None:
    _refuse(sliding_window=sliding_window_size is not None and sliding_window_size > 0, sinks=sinks is not None,
            window_kv_offsets=window_kv_offsets is not None, logit_cap=bool(logit_cap and logit_cap > 0),
            xai_temperature=xai_temperature_len is not None and xai_temperature_len > 0,
            lse_output=lse_extend is not None, skip_prefix=skip_prefix, skip_extend=skip_extend,
            paged_kv=page_size != 1, score_mod=score_mod is not None or aux_tensors is not None,
            kv_scales=float(k_scale) != 1.0 or float(v_scale) != 1.0)
    scale = sm_scale or 1.0 / q_extend.shape[-1] ** 0.5
    kv_heads = k_extend.shape[1]
    group = q_extend.shape[1] // kv_heads
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    masks = mask_indptr.tolist() if custom_mask is not None else None
    for b in range(len(qo) - 1):
        q0, n = qo[b], qo[b + 1] - qo[b]
        if n == 0:
            continue
        if n > max_len_extend:
            raise ValueError(f"request {b} extends {n} tokens but max_len_extend is {max_len_extend}: SGLang's "
                             "kernel would leave its later rows unwritten (a metadata bug)")
        idx = kv_indices[kvp[b]:kvp[b + 1]].long()
        p = idx.shape[0]
        keys = torch.cat([k_buffer[idx], k_extend[q0:q0 + n]]).float()
        vals = torch.cat([v_buffer[idx], v_extend[q0:q0 + n]]).float()
        if custom_mask is not None:
            allowed = custom_mask[masks[b]:masks[b] + n * (p + n)].view(n, p + n) != 0
            if is_causal and bool(allowed[:, p:].triu(1).any()):
                # the kernel stops a causal row's keys at the end of its query tile, wherever the mask points
                raise NotImplementedError("extend_attention_torch: a causal call whose custom mask lets a row see a "
                                          "later extend key (a tree mask lists ancestors first, so never does)")
            if skip_prefix_custom_mask:
                allowed = allowed.clone()
                allowed[:, :p] = True
        else:
            own = torch.ones(n, n, dtype=torch.bool, device=q_extend.device)
            allowed = torch.cat([torch.ones(n, p, dtype=torch.bool, device=q_extend.device),
                                 own.tril() if is_causal else own], 1)
        # query head h = kv head h // group, its g-th: a (kv head, g) view of the query heads reads each KV head
        # once, where repeating the keys and values per query head would copy them ``group`` times
        queries = q_extend[q0:q0 + n].float().unflatten(1, (kv_heads, group))
        scores = torch.einsum("qkgd,skd->kgqs", queries, keys) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("kgqs,skd->qkgd", scores.softmax(-1), vals)
        o_extend[q0:q0 + n] = out.flatten(1, 2).to(o_extend.dtype)


def decode_attention_torch(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                           max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None,
                           xai_temperature_len=-1, has_mla=False, use_pdl=False, page_size: int = 1, score_mod=None,
                           aux_tensors=None, enable_lean=None, lean_Mp=None, lean_Lp=None, lean_Op=None,
                           lean_locks=None, uneven_batch=None) -> None:
    """SGLang's ``decode_attention_fwd`` contract, in torch, writing ``o`` in place.

    Row ``b`` of ``q`` (one query token per request, ``q.shape[0]`` requests) attends to the KV pool rows
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, all visible (its own token's KV is already in the pool). Query head
    ``h`` reads KV head ``h // (heads / kv_heads)``; scores are ``q . k * sm_scale * k_scale``, softmax in float32 as
    the kernel accumulates, the output times ``v_scale``. ``attn_logits`` and ``attn_lse`` are the kernel's split-KV
    scratch (its per-split partial outputs): the twin does not split, so it leaves them as they are (SGLang reads
    ``attn_lse`` back only in its decode-context-parallel path, which needs several GPUs). A request with no KV rows
    has no output (the kernel divides by a zero sum there); the twin refuses it. Stands in for one launch, as
    ``extend_attention_torch`` does."""
    with kernel_launch("decode_attention_torch", kwargs=dict(locals())):
        _refuse("decode", sinks=sinks is not None, logit_cap=bool(logit_cap and logit_cap > 0),
                xai_temperature=xai_temperature_len is not None and xai_temperature_len > 0, mla=bool(has_mla),
                paged_kv=page_size != 1, score_mod=score_mod is not None or aux_tensors is not None)
        kv_heads = k_buffer.shape[-2]
        group = q.shape[1] // kv_heads
        scale = float(sm_scale) * float(k_scale)
        kvp = kv_indptr[:q.shape[0] + 1].tolist()
        for b in range(q.shape[0]):
            idx = kv_indices[kvp[b]:kvp[b + 1]].long()
            if idx.numel() == 0:
                raise ValueError(f"decode_attention_torch: request {b} has no KV rows (kv_indptr {kvp[b]} to "
                                 f"{kvp[b + 1]}); a decode step always reads at least its own token")
            keys, vals = k_buffer[idx].float(), v_buffer[idx].float()
            queries = q[b].float().unflatten(0, (kv_heads, group))        # query head h reads KV head h // group
            probs = (torch.einsum("kgd,skd->kgs", queries, keys) * scale).softmax(-1)
            o[b] = (torch.einsum("kgs,skd->kgd", probs, vals).flatten(0, 1) * float(v_scale)).to(o.dtype)


def swap_kernel(module) -> None:
    """Replace ``extend_attention_fwd`` in SGLang's ``extend_attention`` module with the torch twin, and say so in the
    process's log (``SWAP_LOG``): a run can show which attention it used."""
    module.extend_attention_fwd = extend_attention_torch
    logger.warning(SWAP_LOG)


def swap_decode_kernel(module) -> None:
    """Replace ``decode_attention_fwd`` in SGLang's ``decode_attention`` module with the torch twin, and say so in the
    process's log (``DECODE_SWAP_LOG``)."""
    module.decode_attention_fwd = decode_attention_torch
    logger.warning(DECODE_SWAP_LOG)


def install_when_imported() -> bool:
    """If ``TORCH_ATTENTION_ENV`` or ``TORCH_KERNELS_ENV`` is set in this process: swap both kernels, and the draft
    step's KV-index kernel (``torch_kv_indices``, the draft plan's other interpreted kernel), now (module imported) or
    right after its import; under ``TORCH_KERNELS_ENV`` (the try-out server) also the KV-index gather every forward's
    metadata launches (``torch_kv_indices.swap_kv_gather_kernel``; the greedy tree verify's twin the stand-in swaps
    itself). Returns whether either is set. Called by the stand-in ``sgl_kernel`` at import."""
    every = bool(os.environ.get(TORCH_KERNELS_ENV))
    if not (every or os.environ.get(TORCH_ATTENTION_ENV)):
        return False
    from .torch_kv_indices import KV_INDEX_TRANSLATOR, TRITON_BACKEND, swap_kv_gather_kernel, swap_kv_indices_kernel

    patch_after_import(EXTEND_ATTENTION, swap_kernel)
    patch_after_import(DECODE_ATTENTION, swap_decode_kernel)
    patch_after_import(TRITON_BACKEND, swap_kv_indices_kernel)
    if every:
        patch_after_import(KV_INDEX_TRANSLATOR, swap_kv_gather_kernel)
    return True


__all__ = ["DECODE_ATTENTION", "DECODE_SWAP_LOG", "EXTEND_ATTENTION", "SWAP_LOG", "TORCH_ATTENTION_ENV",
           "TORCH_KERNELS_ENV", "decode_attention_torch", "extend_attention_torch", "install_when_imported",
           "swap_decode_kernel", "swap_kernel"]
