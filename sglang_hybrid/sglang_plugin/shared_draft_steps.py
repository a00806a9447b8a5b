"""A shallower EAGLE depth's draft decode backend, run in the start-up depth's buffers (SGLang's Triton and FlashInfer).

Why: HYBRID builds a draft part per EAGLE depth (``runtime_states``), and each built its own multi-step draft backend:
``depth - 1`` step backends, each with its graph state, and KV indices of ``depth x max_bs x context`` entries. For
Llama-3.1-8B at 128 requests and a 131,072-token context, depths 2 and 3 took 0.68 GiB on Triton and 1.18 GiB on
FlashInfer (0.31 GiB of it KV indices) beside the start-up depth's part (``memory_budget``), enough to keep ragged
verify's start-up memory above 1.5x plain EAGLE's. Yet one depth runs per step, and what a depth's backend holds is
scratch rewritten before each forward reads it: eager forwards allocate their KV indices afresh
(``init_forward_metadata``), and before each graph replay ``init_forward_metadata_out_graph`` rewrites the step rows
of the KV indices (and, on Triton, ``kv_indptr`` and the split counts), with device work ordered after the previous
forward (on the replays' stream, or on SGLang's plan stream, which waits on it first), exactly as plain EAGLE rewrites
its one backend's buffers from step to step. For a chain draft (top-k 1, what HYBRID drafts) step ``i``'s rows do not
depend on the step count (``generate_draft_decode_kv_indices`` lays out ``seq_len + i + 1`` entries per request).
So a shallower depth runs in the start-up backend's buffers, as SGLang's graph runners already share one set of
buffers across their batch sizes:

* Triton (``SharedDraftSteps``): the whole backend is a view, the start-up backend's first ``depth - 1`` step
  backends and the first ``depth`` rows of its buffers; nothing is allocated.
* FlashInfer (``SharedKVIndexRows``): the depth keeps step backends of its own, because each holds a wrapper set per
  captured batch size (``FlashInferAttnBackend.decode_cuda_graph_metadata[bs]``) that each capture replaces: a view's
  capture would swap out the wrappers the start-up depth's graphs replay with. Only the KV index rows
  (``4 x depth x max_bs x context`` bytes) are the start-up backend's; the wrapper sets (8 MiB per captured batch
  size and step) stay the depth's own.

Other backends, and tree drafts (top-k > 1), keep a backend of their own per depth (``shallower_backend``).
"""
from __future__ import annotations

from typing import Any, Callable

from sglang.srt.layers.attention.flashinfer_backend import FlashInferMultiStepDraftBackend
from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend
from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width


def shallower_backend(startup, depth: int, topk: int, build: Callable[[], Any]):
    """The multi-step draft backend at ``depth`` (2 to the start-up depth less one) beside ``startup``: a view of it
    on SGLang's Triton backend; on FlashInfer ``build()``'s backend with the start-up KV index rows; elsewhere, or for
    tree drafts (``topk`` > 1), ``build()``'s as it is. Exact classes only: a subclass's buffers are unread here."""
    if topk == 1 and type(startup) is TritonMultiStepDraftBackend:
        return SharedDraftSteps(startup, depth)
    backend = build()
    if topk == 1 and type(startup) is FlashInferMultiStepDraftBackend:
        if type(backend) is not FlashInferMultiStepDraftBackend:
            raise TypeError(f"the draft backend at depth {depth} is {type(backend).__name__}, the start-up one "
                            "FlashInferMultiStepDraftBackend")
        _check_depth(startup, depth)
        backend.__class__ = SharedKVIndexRows
        backend.startup = startup
    return backend


def _check_depth(startup, depth: int) -> None:
    if not 2 <= depth < startup.speculative_num_steps:
        raise ValueError(f"a draft backend sharing the start-up one runs depths 2 to "
                         f"{startup.speculative_num_steps - 1} (the start-up depth, --speculative-num-steps, less "
                         f"one), not {depth}")


def _startup_rows(backend, max_bs: int):
    """The start-up backend's graph KV index rows for ``backend``'s steps, refused where the start-up depth has no
    graph state or one smaller than this graph's."""
    s = backend.startup
    have = getattr(s, "cuda_graph_kv_indices", None)
    if have is None:
        raise RuntimeError("a draft decode graph below the start-up EAGLE depth runs in the start-up depth's graph "
                           "state, but SGLang captured no draft decode graph at the start-up depth "
                           "(--speculative-num-steps): HYBRID builds a depth's draft graph only where SGLang built the "
                           "start-up one")
    need = draft_kv_indices_buffer_width(max_bs, backend.topk, backend.max_context_len)
    if need > have.shape[1]:
        raise RuntimeError(f"a draft decode graph for {max_bs} requests does not fit the start-up draft backend's "
                           f"graph state ({have.shape[1]} KV indices per step): every EAGLE depth captures the same "
                           "batch sizes (--cuda-graph-max-bs)")
    return have[:backend.speculative_num_steps]


class SharedDraftSteps(TritonMultiStepDraftBackend):
    """SGLang's Triton multi-step draft backend at ``depth`` running in ``startup``'s first ``depth - 1`` step
    backends and the first ``depth`` rows of its buffers: nothing is allocated for it.

    Invariant: ``startup`` and every view of it never run two forwards at once (one EAGLE depth per step), so each
    forward finds the rows it reads written by its own metadata call."""

    def __init__(self, startup: TritonMultiStepDraftBackend, depth: int):
        # not super().__init__(): that builds step backends and buffers, which are the start-up backend's here
        _check_depth(startup, depth)
        vars(self).update(vars(startup))
        self.startup = startup
        self.speculative_num_steps = depth
        self.attn_backends = startup.attn_backends[:depth - 1]
        self.kv_indptr = startup.kv_indptr[:depth]
        if startup.window_kv_indptr is not None:
            self.window_kv_indptr = startup.window_kv_indptr[:depth]
        if getattr(startup, "cuda_graph_kv_indices", None) is not None:
            self._take_graph_state(startup.cuda_graph_kv_indices[:depth])

    def _take_graph_state(self, rows) -> None:
        s, d = self.startup, self.speculative_num_steps
        self.cuda_graph_kv_indices = rows
        self.cuda_graph_num_kv_splits = s.cuda_graph_num_kv_splits
        if s.cuda_graph_window_kv_indices is not None:
            self.cuda_graph_window_kv_indices = s.cuda_graph_window_kv_indices[:d]

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Take the start-up backend's graph state (its draft graph runner made it at SGLang's start) instead of
        allocating one; refuse a graph larger than the one it was sized for."""
        rows = _startup_rows(self, max_bs)
        if max_num_tokens > self.startup.cuda_graph_num_kv_splits.numel():
            raise RuntimeError(f"a draft decode graph of {max_num_tokens} tokens does not fit the start-up draft "
                               f"backend's {self.startup.cuda_graph_num_kv_splits.numel()}: every EAGLE depth "
                               "captures the same batch sizes (--cuda-graph-max-bs)")
        self._take_graph_state(rows)


class SharedKVIndexRows(FlashInferMultiStepDraftBackend):
    """SGLang's FlashInfer multi-step draft backend at a shallower depth, with step backends (and their wrappers) of
    its own and the start-up backend's (``startup``) KV index rows as its graph state. Made by
    ``shallower_backend`` from the backend SGLang built at that depth. Same invariant as ``SharedDraftSteps``."""

    startup: FlashInferMultiStepDraftBackend

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """SGLang's graph state with the start-up backend's first ``depth`` KV index rows instead of new ones."""
        self.cuda_graph_kv_indices = _startup_rows(self, max_bs)
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(max_bs, max_num_tokens,
                                                        kv_indices_buf=self.cuda_graph_kv_indices[i])


def is_shared(backend) -> bool:
    """Whether ``backend`` runs in the start-up depth's buffers (``runtime_states.parts_built`` counts them)."""
    return isinstance(backend, (SharedDraftSteps, SharedKVIndexRows))
