"""Runtime states assembled from parts (``sglang_hybrid.sglang_plugin.runtime_states``): the wiring, and its GPU branch.

The live CPU engine builds the parts from SGLang's real objects (``tests/live/test_sglang_live.py``: the counters'
``runtime_parts`` under ragged and padded verify, outputs token-identical to plain greedy), but it captures no CUDA
graph, so the branch that constructs graph runners never runs there. Here a worker with SGLang's attribute layout
holds start-up graph runners whose classes subclass SGLang's real ``DecodeCudaGraphRunner``,
``EAGLEDraftCudaGraphRunner`` and ``EAGLEDraftExtendCudaGraphRunner`` and record their construction instead of
capturing: every construction must bind to the real class's ``__init__`` signature, under the (steps, width) override
SGLang's own ``build_adaptive_runtime_state`` uses for that shape. The backends are plain objects (what a backend is
does not matter to the assembly, only which one each state holds).
"""
from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace as NS

import pytest

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner  # noqa: E402
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner  # noqa: E402
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (  # noqa: E402
    EAGLEDraftExtendCudaGraphRunner,
)

from sglang_hybrid.sglang_plugin import runtime_states as rs  # noqa: E402

pytestmark = pytest.mark.sglang


def _recording(real):
    """A subclass of SGLang's graph runner ``real`` whose constructor checks its arguments against ``real.__init__``
    and records them with the worker's override in force, instead of capturing graphs."""
    class Recording(real):
        made: list = []

        def __init__(self, *args, **kwargs):
            inspect.signature(real.__init__).bind(self, *args, **kwargs)
            self.args, self.kwargs = args, kwargs
            self.override = args[0].owner.override
            Recording.made.append(self)

    Recording.__name__ = f"Recording{real.__name__}"
    return Recording


class _Worker:
    """SGLang's ``EAGLEWorkerV2`` attribute layout at start: steps 4, full width 13, one backend object per build."""

    def __init__(self, graphs: bool):
        self.speculative_num_steps, self.speculative_num_draft_tokens = 4, 13
        self.override = None
        self.built = []
        runner = NS(init_new_workspace=False, owner=self)
        runner._get_attention_backend = lambda init_new_workspace: self._backend("target", init_new_workspace)
        self._target_worker = NS(model_runner=runner)
        dw = NS(owner=self, topk=1)
        dw.init_attention_backend = lambda: self._init_draft_backends(dw)
        self._draft_worker = dw
        runner.attn_backend = "target@start"
        dw.draft_attn_backend, dw.draft_extend_attn_backend = "draft@start", "extend@start"
        self.classes = {}
        if graphs:
            self.classes = {k: _recording(c) for k, c in (("verify", DecodeCudaGraphRunner),
                                                           ("draft", EAGLEDraftCudaGraphRunner),
                                                           ("extend", EAGLEDraftExtendCudaGraphRunner))}
            for c in self.classes.values():
                c.made = []
            runner.decode_cuda_graph_runner = self.classes["verify"](runner)
            dw.cuda_graph_runner = self.classes["draft"](dw)
            dw.cuda_graph_runner_for_draft_extend = self.classes["extend"](dw)
            for c in self.classes.values():
                c.made.clear()
        else:
            runner.decode_cuda_graph_runner = dw.cuda_graph_runner = dw.cuda_graph_runner_for_draft_extend = None

    def _backend(self, kind, *extra):
        b = (kind, self.override, *extra)
        self.built.append(b)
        return b

    def _init_draft_backends(self, dw):
        dw.draft_attn_backend = self._backend("draft")
        dw.draft_extend_attn_backend = self._backend("extend")

    @contextlib.contextmanager
    def _override_worker_state(self, steps, width):
        """As SGLang's: the shape in force while building, the draft worker's fields restored after."""
        dw = self._draft_worker
        saved = (dw.draft_attn_backend, dw.draft_extend_attn_backend)
        self.override = (steps, width)
        try:
            yield
        finally:
            self.override = None
            dw.draft_attn_backend, dw.draft_extend_attn_backend = saved


@pytest.mark.parametrize("graphs", [False, True])
def test_runtime_states_are_assembled_from_one_part_per_depth_and_one_per_width(graphs):
    """Depths 1-4 x widths 2, 8, 13 (the start-up pair (4, 13) among them): 12 states from 4 draft parts and 3 verify
    parts, each built once under the override of its shape; the start-up state is SGLang's own objects; every state
    holds its depth's draft part and its width's verify part; the start-up fields are restored."""
    w = _Worker(graphs)
    states = rs.build_states(w, (1, 2, 3, 4), (2, 8, 13))
    assert sorted(states) == [(d, x) for d in (1, 2, 3, 4) for x in (2, 8, 13)]
    assert rs.parts_built(states) == {"states": 12, "draft_parts": 4, "shared_draft_parts": 0, "verify_parts": 3}
    start = states[(4, 13)]
    assert (start.target_attn_backend, start.draft_attn_backend, start.draft_extend_attn_backend) == (
        "target@start", "draft@start", "extend@start")
    # a fresh target backend (its own workspace) per extra width, built at the start-up depth and that width
    assert [b for b in w.built if b[0] == "target"] == [("target", (4, 2), True), ("target", (4, 8), True)]
    for (d, x), s in states.items():
        assert (s.speculative_num_steps, s.speculative_num_draft_tokens) == (d, x)
        if d != 4:
            assert s.draft_attn_backend == ("draft", (d, 13))       # the depth's draft part, built at the full width
        if x != 13:
            assert s.target_attn_backend == ("target", (4, x), True)
            assert s.draft_extend_attn_backend == ("extend", (4, x))
        assert s.draft_attn_backend is states[(d, 2)].draft_attn_backend       # one draft part per depth
        assert s.target_attn_backend is states[(1, x)].target_attn_backend     # one verify part per width
    assert w._draft_worker.draft_attn_backend == "draft@start"
    assert w._target_worker.model_runner.init_new_workspace is False
    if not graphs:
        assert all(s.cuda_graph_runner is None and s.target_graph_runner is None
                   and s.cuda_graph_runner_for_draft_extend is None for s in states.values())
        return
    made = {k: c.made for k, c in w.classes.items()}
    # graphs: a verify and a draft extend set per extra width, a draft decode set per extra depth above 1
    assert sorted(g.override for g in made["verify"]) == [(4, 2), (4, 8)]
    assert sorted(g.override for g in made["extend"]) == [(4, 2), (4, 8)]
    assert sorted(g.override for g in made["draft"]) == [(2, 13), (3, 13)]
    for g in made["verify"]:
        assert g.kwargs == {"attn_backend": ("target", g.override, True), "speculative_num_steps": 4,
                            "speculative_num_draft_tokens": g.override[1]}
    for g in made["extend"]:
        assert g.kwargs == {"draft_extend_attn_backend": ("extend", g.override)}
    for g in made["draft"]:
        assert g.kwargs == {"draft_attn_backend": ("draft", g.override), "speculative_num_steps": g.override[0]}
    assert states[(1, 8)].cuda_graph_runner is None                  # depth 1: SGLang captures no draft decode graph
    assert states[(3, 8)].cuda_graph_runner is states[(3, 2)].cuda_graph_runner in made["draft"]
    assert states[(1, 8)].target_graph_runner is states[(3, 8)].target_graph_runner in made["verify"]


def test_runtime_states_refuse_a_depth_above_the_launch():
    """A depth deeper than the start-up state's (``--speculative-num-steps``) has no graph class or KV plan to copy:
    refused with the setting named (the settings validate depths first; this guards the module's own contract)."""
    with pytest.raises(ValueError, match="--speculative-num-steps"):
        rs.build_states(_Worker(False), (5,), (13,))
