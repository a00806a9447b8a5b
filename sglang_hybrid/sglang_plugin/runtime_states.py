"""HYBRID's runtime states, assembled from parts: one verify part per width, one draft part per EAGLE depth.

Why: SGLang's adaptive speculation builds one ``SpecRuntimeState`` per step count
(``EAGLEWorkerV2.build_adaptive_runtime_state``): fresh target and draft attention backends and the draft decode,
target verify and draft extend CUDA graph sets, all sized for that (steps, draft tokens) pair. HYBRID chooses its EAGLE
depth and its verify width independently, and built that way its states multiply: 4 depths x 6 widths = 24 full
states, about 64 GiB of graph buffers for Llama-3.1-8B at 128 requests and a 131,072-token context
(``memory_budget``), which no H200 holds. Yet what each resource depends on is disjoint (SGLang 0.5.23's sources):

* by the verify width only: the target's attention backend and its verify graph set (``DecodeCudaGraphRunner``
  captures ``speculative_num_draft_tokens`` tokens per request; the step count it is given only labels the capture's
  placeholder verify input), and the draft extend backend and graph set (``EAGLEDraftExtendCudaGraphRunner`` captures
  the full tree width per request, ``resolve_num_tokens_per_req(phase="draft_extend")``; the backends read the step
  count only for the version-1 draft extend, which ``EAGLEWorkerV2`` does not run);
* by the depth only: the multi-step draft decode backend and its graph set (``EAGLEDraftCudaGraphRunner`` reads the
  step count and top-k, never the draft token count).

So HYBRID builds a verify part per width and a draft part per depth, each with SGLang's own constructors under
SGLang's own ``_override_worker_state``, and assembles a ``SpecRuntimeState`` per (depth, width) pair from them:
``depths + widths`` part sets instead of ``depths x widths`` states. SGLang's ``apply_runtime_state`` swaps them as
before (``apply_state``, which keeps the runtime context's overrides log from growing by one entry per switch).
Graph runners are built of the classes SGLang chose for the start-up state (a start-up state without a graph
of a kind means none is captured for that kind, CPU engine included), and the start-up state's own parts are reused,
never rebuilt. ``memory_budget`` counts the same parts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sglang.srt.runtime_context import get_context
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

from .shared_draft_steps import is_shared, shallower_backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyPart:
    """What depends on the verify width: the target's attention backend and verify graph runner, and the draft
    extend's backend and graph runner (None where no graph is captured)."""

    width: int
    target_attn_backend: Any
    target_graph_runner: Any
    draft_extend_attn_backend: Any
    cuda_graph_runner_for_draft_extend: Any


@dataclass(frozen=True)
class DraftPart:
    """What depends on the EAGLE depth: the multi-step draft decode backend and its graph runner (None at depth 1,
    where SGLang captures no draft decode graph, and where no graph is captured)."""

    depth: int
    draft_attn_backend: Any
    cuda_graph_runner: Any


def startup_parts(worker) -> tuple[DraftPart, VerifyPart]:
    """The parts of the state SGLang built at start (``speculative_num_steps``, ``speculative_num_draft_tokens``)."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    draft = DraftPart(worker.speculative_num_steps, dw.draft_attn_backend, dw.cuda_graph_runner)
    verify = VerifyPart(worker.speculative_num_draft_tokens, runner.attn_backend, runner.decode_cuda_graph_runner,
                        dw.draft_extend_attn_backend, dw.cuda_graph_runner_for_draft_extend)
    return draft, verify


def build_verify_part(worker, width: int, startup: VerifyPart) -> VerifyPart:
    """A verify part at ``width``: a target attention backend with its own FlashInfer workspace (as SGLang's
    ``build_adaptive_runtime_state`` builds it) and, where the start-up state has them, its verify graph runner; the
    draft extend backend from the draft worker's own ``init_attention_backend`` (its draft decode backend, also made
    there, is dropped: draft parts hold those) and its graph runner. Built under SGLang's ``_override_worker_state``,
    which restores the draft worker's fields after."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    with worker._override_worker_state(worker.speculative_num_steps, width):
        backup = runner.init_new_workspace
        try:
            target = runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = backup
        target_graph = None
        if startup.target_graph_runner is not None:
            target_graph = type(startup.target_graph_runner)(
                runner, attn_backend=target, speculative_num_steps=worker.speculative_num_steps,
                speculative_num_draft_tokens=width)
        dw.init_attention_backend()
        extend = dw.draft_extend_attn_backend
        extend_graph = None
        if startup.cuda_graph_runner_for_draft_extend is not None and extend is not None:
            extend_graph = type(startup.cuda_graph_runner_for_draft_extend)(dw, draft_extend_attn_backend=extend)
    return VerifyPart(width, target, target_graph, extend, extend_graph)


def build_draft_part(worker, depth: int, startup: DraftPart) -> DraftPart:
    """A draft part at ``depth`` (at most the start-up depth, whose draft graph class it reuses): its multi-step draft
    backend and, above depth 1, its draft decode graph runner. The draft worker's ``init_attention_backend`` at that
    step count builds the backend (its draft extend backend, also made there, is dropped: verify parts hold those);
    above depth 1 it runs in the start-up part's buffers where the backend allows (``shared_draft_steps``: one depth
    runs per step): on Triton a view of the start-up backend, on FlashInfer its KV index rows."""
    if depth > startup.depth:
        raise ValueError(f"EAGLE depth {depth} exceeds the start-up depth {startup.depth} (--speculative-num-steps): "
                         "HYBRID's depths are 1 to the launch's step count")
    dw = worker._draft_worker
    with worker._override_worker_state(depth, worker.speculative_num_draft_tokens):
        def build():
            dw.init_attention_backend()
            return dw.draft_attn_backend

        backend = shallower_backend(startup.draft_attn_backend, depth, dw.topk, build) if depth > 1 else build()
        graph = None
        if depth > 1 and startup.cuda_graph_runner is not None:
            graph = type(startup.cuda_graph_runner)(dw, draft_attn_backend=backend, speculative_num_steps=depth)
    return DraftPart(depth, backend, graph)


def assemble(draft: DraftPart, verify: VerifyPart) -> SpecRuntimeState:
    """The runtime state of (``draft.depth``, ``verify.width``): SGLang's ``apply_runtime_state`` swaps its fields."""
    return SpecRuntimeState(
        speculative_num_steps=draft.depth, speculative_num_draft_tokens=verify.width,
        draft_attn_backend=draft.draft_attn_backend, cuda_graph_runner=draft.cuda_graph_runner,
        target_attn_backend=verify.target_attn_backend, target_graph_runner=verify.target_graph_runner,
        draft_extend_attn_backend=verify.draft_extend_attn_backend,
        cuda_graph_runner_for_draft_extend=verify.cuda_graph_runner_for_draft_extend)


def build_states(worker, depths: Sequence[int], widths: Sequence[int]) -> dict:
    """``{(depth, width): SpecRuntimeState}`` for every pair, the start-up pair from SGLang's own objects, the others
    assembled from one draft part per depth and one verify part per width, each built once. Call inside the draft
    worker's TP and MoE contexts, as SGLang's adaptive speculation does."""
    depths, widths = sorted({int(x) for x in depths}), sorted({int(x) for x in widths})
    draft0, verify0 = startup_parts(worker)
    drafts: dict[int, DraftPart] = {draft0.depth: draft0}
    verifies: dict[int, VerifyPart] = {verify0.width: verify0}
    for d in depths:
        if d not in drafts:
            drafts[d] = build_draft_part(worker, d, draft0)
    for w in widths:
        if w not in verifies:
            verifies[w] = build_verify_part(worker, w, verify0)
    states = {(draft0.depth, verify0.width): assemble(draft0, verify0)}
    for d in depths:
        for w in widths:
            states.setdefault((d, w), assemble(drafts[d], verifies[w]))
    logger.info("HYBRID: runtime states assembled from draft parts at depths %s and verify parts at widths %s",
                sorted(drafts), sorted(verifies))
    return states


def parts_built(states: dict) -> dict:
    """What ``states`` hold, counted by object identity rather than by key: runtime states, distinct draft parts (draft
    decode backends), those of them that run in the start-up depth's backend (``shared_draft_steps``) and distinct
    verify parts (target attention backends). Reported in the HYBRID counters (``runtime_parts``), so a deployment,
    and the live tests, see that parts are shared, not rebuilt per pair."""
    drafts = {id(s.draft_attn_backend): s.draft_attn_backend for s in states.values()}
    return {"states": len(states), "draft_parts": len(drafts),
            "shared_draft_parts": sum(is_shared(b) for b in drafts.values()),
            "verify_parts": len({id(s.target_attn_backend) for s in states.values()})}



def apply_state(apply: Callable[[SpecRuntimeState], None], state: SpecRuntimeState, previous: tuple = ()) -> tuple:
    """``apply(state)`` (SGLang's ``apply_runtime_state``), then drop from the runtime context's overrides log the
    entries an earlier switch appended (``previous``: what this function returned for it) that this switch's entries
    supersede; returns the switch entries the log still holds (this switch's, plus any earlier one not superseded), to
    pass as ``previous`` to the next switch.

    Why: SGLang 0.5.23's ``EAGLEWorkerV2.apply_runtime_state`` ends with ``get_context().override(
    "adaptive_spec.restore", speculative_num_steps=..., speculative_num_draft_tokens=...)``, and ``RuntimeContext
    .override`` appends ``(source, fields)`` to ``_overrides_log``, which nothing trims (only ``set_server_args``
    replaces it). SGLang's adaptive speculation switches rarely; HYBRID may switch every few steps, one entry per
    switch for the process's lifetime.

    What reads the log (``srt/runtime_context.py``): ``resolved_server_args_dict`` overlays the entries in order, the
    last writer of a field winning (the scheduler's ``get_internal_state``, i.e. ``/server_info``'s internal states,
    and ``TokenizerManager.resolved_config_dict``), and ``overrides_log()`` copies them into the crash and request
    dumps' ``config_updates`` (the tokenizer manager's process, whose context the scheduler's switches never reach).
    An earlier entry whose fields a later entry all writes changes no overlay, whatever lies between them: dropping
    the superseded switch entries keeps every reader's resolved value, and the log holds one switch entry, the state in
    force, instead of the history of switches. Keeping the log at its size before the switch (dropping this switch's
    entry too) would not: the readback would report the start-up shape, or an older override, rather than the one in
    force. Only entries a switch appended are dropped, found by identity, never by content: SGLang's own (the capture
    override and restore at start, ``/set_internal_state`` updates) stay where they are. Where the log was replaced
    meanwhile (``set_server_args``, a test's scoped override) the earlier entries are simply no longer in it.
    """
    ctx = get_context()
    log = getattr(ctx, "_overrides_log", None)
    if not isinstance(log, list):       # another SGLang layout: nothing to keep bounded here
        apply(state)
        return ()
    start = len(log)
    apply(state)
    if ctx._overrides_log is not log:   # replaced during the switch: this switch's entries are not ours to find
        return ()
    new = tuple(log[start:])
    written = {name for _source, fields in new for name in fields}
    kept = []
    for entry in previous:
        if set(entry[1]) <= written:
            _remove(log, entry)
        elif any(e is entry for e in log):
            kept.append(entry)
    return (*kept, *new)


def _remove(log: list, entry) -> None:
    """Remove ``entry`` (by identity) from ``log``; searched from the end, where the last switch's entry lies."""
    for i in range(len(log) - 1, -1, -1):
        if log[i] is entry:
            del log[i]
            return
