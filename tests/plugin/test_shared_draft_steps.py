"""Shallower EAGLE depths in the start-up depth's draft buffers (``sglang_hybrid.sglang_plugin.shared_draft_steps``).

The live CPU engine runs the shared Triton backend eagerly (``tests/live/test_sglang_live.py``, the retraction case:
depths 2 and 3 under a start-up depth of 3, depth 2 in the view, token-identical to plain greedy), but it captures no
CUDA graph, so the graph state it shares never exists there, and it runs no FlashInfer. Here SGLang's real multi-step
draft backends and step backends run their own methods on the CPU (their constructors need a model runner, so the
objects are made with ``__new__`` and the attributes those methods read: ``tests/helpers/sglang_backends_on_cpu.py``),
with SGLang's KV index kernel under Triton's interpreter, in one subprocess (``TRITON_INTERPRET`` must be set before
Triton's import: ``tests/plugin/_scripts/shared_draft_steps_probe.py``):

* Triton: the view's ``init_cuda_graph_state`` allocates nothing (every tensor it and its step backends hold lies in
  the start-up backend's storage), and before a graph replay ``init_forward_metadata_out_graph`` writes into the
  shared rows exactly what a depth-2 backend with buffers of its own writes into its own, over rows the start-up
  depth left dirty;
* FlashInfer: the depth keeps its own step backends and its graph state allocates nothing but takes the start-up
  backend's KV index rows (its wrappers and captures need a GPU);
* the refusals: a depth outside 2 to the start-up depth less one, a graph state the start-up backend never made, a
  graph larger than the one it was sized for, a backend of another class.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sglang.srt.layers.attention.triton_backend  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def probe() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run([sys.executable, "-m", "tests.plugin._scripts.shared_draft_steps_probe"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_memory_budget_shared_draft_steps_allocate_nothing(probe):
    """Triton: a depth-2 view of a depth-4 backend: its first step backend is the start-up one's, its buffers the
    first 2 rows of the start-up ones, and its ``init_cuda_graph_state`` (which a depth's draft graph runner calls)
    adds no storage. Tree drafts (top-k 2) keep the backend built for them."""
    assert probe["chosen"] == ["SharedDraftSteps", "built at top-k 2"]
    assert probe["new_storages"] == 0
    assert probe["steps"] == [2, 1, True]
    assert probe["shapes"] == [[2, 9], [2, 6 * 64]]


def test_shared_draft_steps_write_what_a_backend_of_their_own_writes(probe):
    """Before a replay, the view writes the KV indptr, the KV indices and the split counts of a 4-request batch into
    the start-up backend's rows (dirty from a 6-request batch at depth 4), equal to what a depth-2 backend writes
    into buffers of its own; step 0's indices are each request's prefix and its one draft slot."""
    assert probe["used"] == [11 + 30 + 2 + 25 + 4, 11 + 30 + 2 + 25 + 8]
    assert probe["indptr_equal"] and probe["indices_equal"] and probe["splits_equal"]
    assert probe["written_in_start"] and probe["step0_is_prefix_plus_one"]


def test_shared_draft_steps_refuse_what_they_cannot_share(probe):
    """The depths a view serves are 2 to the start-up depth less one (depth 1 has no draft decode backend, the
    start-up depth is the start-up backend itself); a graph needs the start-up graph state, at least as large."""
    e = probe["errors"]
    assert e["depth_1"].startswith("ValueError") and "--speculative-num-steps" in e["depth_1"]
    assert e["depth_4"].startswith("ValueError")
    assert e["no_graph_state"].startswith("RuntimeError") and "no draft decode graph" in e["no_graph_state"]
    assert e["larger"].startswith("RuntimeError") and "--cuda-graph-max-bs" in e["larger"]


def test_memory_budget_shared_draft_steps_flashinfer_keeps_its_steps_shares_the_kv_rows(probe):
    """FlashInfer: the depth-2 backend SGLang built keeps its own step backend (its wrappers are captured per batch
    size), and its graph state is the start-up backend's first 2 KV index rows: no new storage, where a depth-2
    backend alone allocates its 2 rows of ``max_bs x context`` int32 entries (what ``memory_budget`` no longer
    counts for it)."""
    f = probe["flashinfer"]
    assert f["class"] == "SharedKVIndexRows" and f["same_object"] and f["own_steps"]
    assert f["new_storages"] == 0 and f["rows_shared"] == [True, 2]
    assert f["alone_bytes"] == 2 * 6 * 64 * 4
    e = probe["errors"]
    assert e["flashinfer_larger"].startswith("RuntimeError") and "--cuda-graph-max-bs" in e["flashinfer_larger"]
    assert e["flashinfer_other_class"].startswith("TypeError")
