"""A torch twin of SGLang's Triton extend-attention kernel for the CPU engine (a test switch, not a deployment one).

Why: on a CPU the engine runs SGLang's Triton attention in Triton's interpreter, which is most of the live suite's
time (a profile of a live HYBRID run: 80 % of the scheduler's samples inside ``extend_attention_fwd``: prompt
prefills, verify forwards and draft extends). Every HYBRID live case needs the Triton backend (the backends that apply
a tree mask are Triton and FlashInfer), but only some cases need the Triton *kernel* itself; the others test what
HYBRID does around it (its trees, ragged layout, KV, counters, the server). With ``TORCH_ATTENTION_ENV`` set, the
stand-in ``sgl_kernel`` (imported by every CPU engine process) calls ``install_when_imported``, which replaces
``extend_attention_fwd`` in SGLang's ``extend_attention`` module, before any backend reads it (``TritonAttnBackend``
imports it in its constructor), with ``extend_attention_torch`` below. The backend's metadata -- HYBRID's ragged
``qo_indptr``, packed tree mask and ``mask_indptr`` included -- is computed exactly as before and handed to the twin
unchanged. Decode attention (1.6 % of that profile) stays SGLang's kernel.

The twin is checked against SGLang's kernel (interpreter) on every batch of ``tests/test_ragged_verify.py``: ragged
trees, GQA, causal and not, prefix mask columns skipped and read, requests longer than a query tile. It refuses, by
name, every feature of the kernel it does not implement (sliding windows, sinks, logit caps, score mods, LSE output,
split prefix/extend stages, paged KV, fp8 scales), and a ``max_len_extend`` shorter than a request (the kernel's
grid would leave that request's later rows unwritten). Nothing in the plugin imports this module.
"""
from __future__ import annotations

import logging
import os

import torch

from sglang_hybrid.sglang_plugin.ragged.graph_capture import kernel_launch

from .import_hook import patch_after_import

#: set (to any non-empty value) in a CPU engine's environment to run extend attention with the torch twin
TORCH_ATTENTION_ENV = "HYBRID_CPU_ENGINE_TORCH_ATTENTION"
EXTEND_ATTENTION = "sglang.kernels.ops.attention.extend_attention"
#: logged once per process when the twin replaces the kernel
SWAP_LOG = (f"CPU engine: extend attention runs the torch twin of SGLang's Triton kernel ({TORCH_ATTENTION_ENV} is "
            "set; sglang_hybrid/cpu_engine/torch_attention.py)")
logger = logging.getLogger(__name__)


def _refuse(**features) -> None:
    """Raise naming the first kernel feature in use that the twin does not implement."""
    for name, used in features.items():
        if used:
            raise NotImplementedError(f"extend_attention_torch (the CPU engine's torch twin of SGLang's Triton extend "
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
    group = q_extend.shape[1] // k_extend.shape[1]
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
        keys = torch.cat([k_buffer[idx], k_extend[q0:q0 + n]]).float().repeat_interleave(group, dim=1)
        vals = torch.cat([v_buffer[idx], v_extend[q0:q0 + n]]).float().repeat_interleave(group, dim=1)
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
        scores = torch.einsum("qhd,shd->hqs", q_extend[q0:q0 + n].float(), keys) * scale
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        out = torch.einsum("hqs,shd->qhd", scores.softmax(-1), vals)
        o_extend[q0:q0 + n] = out.to(o_extend.dtype)


def swap_kernel(module) -> None:
    """Replace ``extend_attention_fwd`` in SGLang's ``extend_attention`` module with the torch twin, and say so in the
    process's log (``SWAP_LOG``): a run can show which attention it used."""
    module.extend_attention_fwd = extend_attention_torch
    logger.warning(SWAP_LOG)


def install_when_imported() -> bool:
    """If ``TORCH_ATTENTION_ENV`` is set in this process: swap the kernel now (module imported) or right after its
    import. Returns whether it is set. Called by the stand-in ``sgl_kernel`` at import."""
    if not os.environ.get(TORCH_ATTENTION_ENV):
        return False
    patch_after_import(EXTEND_ATTENTION, swap_kernel)
    return True


__all__ = ["EXTEND_ATTENTION", "SWAP_LOG", "TORCH_ATTENTION_ENV", "extend_attention_torch", "install_when_imported",
           "swap_kernel"]
