"""The fused Triton step (``sglang_hybrid.kernels``) against the torch reference it replaces.

The kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), in a subprocess because the flag must be set
before Triton is first imported (``tests/kernels/_scripts/fused_decision.py``). What is compared
(``bench/fused_exactness.py``, whose full run is the 10,000-batch target): the decision on random and adversarial
batches (``FusedDecisionStep`` against ``DecisionStep``) and on steps recorded from the CPU reference loop on real
text, and the worker's whole device step (``HybridStep`` with ``decision_kernels`` fused against torch: select, the
verify input's links and mask, after_verify, over evolving batches), and ragged verify's layout kernels against the
torch builder, with positive controls that must be caught; and all three again at the rows per program a GPU launches
(a batch spread over many programs).
Also: the fused step's launch count, that it reads nothing back to the host, and the errors for what it does not
cover.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _interpreted(name: str, timeout: int = 900, env_extra: Optional[dict] = None) -> dict:
    """Run the function ``name`` of ``_scripts/fused_decision.py`` under Triton's interpreter (and ``env_extra``); it
    prints one JSON line last."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-m", "tests.kernels._scripts.fused_decision", name], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exactness():
    """One interpreter run of both comparisons and both controls (the start-up is shared)."""
    return _interpreted("exactness")


def test_fused_decision_equals_torch_on_random_and_adversarial_batches(exactness):
    res = exactness["decision"]
    assert res["batches"] == 400
    assert res["failed"] == 0, res


def test_fused_worker_step_equals_torch_step(exactness):
    """select (alignment, prompt lookup, decision, counters), the verify input and after_verify (ring, context
    table, online offsets of both sides, counters): 240 steps of 40 evolving batches, in some of which the n-gram
    offsets were learned (so they are compared moving, not at zero)."""
    res = exactness["steps"]
    assert res["batches"] == 240
    assert res["failed"] == 0, res
    assert res["ngram_offsets_learned"] >= 5, res
    assert res["ngram_tokens_tested"] > 0, res          # both sides' chain outcomes were counted, and compared


def test_fused_ragged_layout_equals_torch(exactness):
    """Ragged verify's layout before the read and its compaction, one Triton launch each
    (``kernels.ragged_layout``), against the torch builder: 150 random trees (prefixes past the mask kernel's chunk,
    int32 and int64 lengths, widened non-contiguous rows, missing self bits) here, and every decided tree of the
    worker-step comparison above (its ``ragged.*`` fields)."""
    res = exactness["ragged"]
    assert res["batches"] == 150
    assert res["failed"] == 0, res


def test_fused_path_equals_torch_at_the_gpu_rows_per_program():
    """The same comparisons with the rows per program a GPU launches (``kernels.GPU_TILES_ENV``: 8 rows a program for
    the decision, 32 per loop iteration after verify, 1,024 for the compaction), so a batch spans many programs as
    on a GPU, where the interpreter otherwise takes it whole in one: the paths by which programs share a batch
    (offsets over earlier requests, loops over row blocks) are compared too."""
    from sglang_hybrid.kernels import GPU_BLOCK_ROWS, GPU_TILES_ENV

    res = _interpreted("gpu_rows", env_extra={GPU_TILES_ENV: "1"})
    assert res.pop("rows") == GPU_BLOCK_ROWS                # the switch took: a GPU's rows, not the whole batch
    assert (res["decision"]["batches"], res["steps"]["batches"], res["ragged"]["batches"]) == (120, 48, 60), res
    assert all(r["failed"] == 0 for r in res.values()), res


@pytest.mark.real_model
def test_fused_decision_equals_torch_on_reference_loop_steps():
    """Steps recorded from the CPU reference loop on real text (SmolLM2-135M with the shipped EAGLE head, code edits
    and chats), decided again by both paths in the worker's configuration."""
    res = _interpreted("recorded")
    assert res["steps"] >= 8 and res["batches"] >= 4 * (res["steps"] - res["skipped"]) > 0, res
    assert res["failed"] == 0, res


def test_fused_comparison_catches_a_wrong_reference(exactness):
    """Positive controls: the reference deciding in the other mode must be reported as different."""
    assert exactness["decision_control"]["failed"] > 5, exactness["decision_control"]
    assert exactness["steps_control"]["failed"] > 0, exactness["steps_control"]


def test_fused_step_reads_nothing_back_allocates_nothing_and_rejects_what_it_does_not_cover():
    """Between the draft and the verify launch the fused path reads no device value on the host: every way a tensor
    reaches the host (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool``/``int``/``float``) raises while it runs,
    except inside a Triton launch (the interpreter's own reads stand in for the GPU). And the fused decision refuses,
    naming the reason, what it does not implement: ragged verify, skipping the model draft, an n-gram tree. A second
    step at the same shapes allocates nothing outside the kernels (its outputs live in the first step's buffers), and
    the step replays as one graph would: captured once, three steps on new drafts launch the same kernels and
    operators with the same arguments on the same buffers (``ragged.graph_capture.TracedEagerCapture``). All of it
    also for a second step with EAGLE alternatives (setting ``eagle_alternatives``: the step's alternatives, the
    decision with them, their counters and the position-0 table's update, each a kernel)."""
    res = _interpreted("host_reads")
    assert res["reads"] == [] and res["steps"] == res["alt_steps"] == {"fused": 6}, res
    assert res["alt_nodes"] > 0 and res["alt_table"] == 5, res       # alternatives verified; the table kept
    assert res["followed"], res
    assert res["traced_replays"] == 3, res
    assert res["same_place"], res                      # the second step reused the first one's buffers
    assert len(res["errors"]) == 3, res["errors"]
    assert "padded verify only" in res["errors"][0]
    assert "depth 0" in res["errors"][1]
    assert "n-gram chain" in res["errors"][2]


def test_fused_context_blend_equals_torch():
    """``kernels.follow_context`` (one launch for both tables) writes exactly what ``ContextCostTables.follow`` does,
    on random tables of 1 to 16 entries and batches whose mean context lies below, between and past the probes'; a
    table longer than the kernel unrolls (70 entries) follows by the torch rule beside a short one in the kernel."""
    res = _interpreted("context_blend")
    assert res["cases"] == 82 and res["failed"] == [], res


@pytest.mark.parametrize("mode,width_plan,depth_plan,measured", [("merge", True, True, True),
                                                                  ("merge", True, True, False),
                                                                  ("choose", False, False, False)])
def test_fused_step_launches_at_most_twelve(mode, width_plan, depth_plan, measured):
    """The worker's whole device step on the fused path (``bench.step_launches``): at most 12 launches, the same at
    batch 1 and 32, where the torch path dispatches hundreds of operators; the tables measured at start (two
    contexts) cost one launch more than a user's, their blend at the batch's context."""
    from bench import step_launches

    kw = dict(width_plan=width_plan, depth_plan=depth_plan, measured=measured)
    fused = [step_launches.hybrid_launches(b, mode, **kw) for b in (1, 32)]
    assert fused[0] == fused[1] <= step_launches.TARGET, fused
    torch_ops = step_launches.hybrid_launches(1, mode, kernels="torch", **kw)
    assert torch_ops > 20 * fused[0]
    if measured:
        assert fused[0] == step_launches.hybrid_launches(1, mode, width_plan=True, depth_plan=True) + 1


def test_fused_setting_names_itself_where_triton_cannot_run():
    """This process imported Triton without its interpreter, so Triton cannot run on the CPU here: "auto" takes the
    torch path, "fused" is refused with the setting's name and the fix."""
    from sglang_hybrid import kernels
    from sglang_hybrid.sglang_plugin.config import HybridConfigError, HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    if kernels.available("cpu"):
        pytest.skip("this process runs Triton's interpreter")
    assert HybridStep(HybridSettings(), num_steps=2, pool_size=2, device="cpu").fused is None
    with pytest.raises(HybridConfigError, match="decision_kernels.*SGLANG_HYBRID_DECISION_KERNELS"):
        HybridStep(HybridSettings(decision_kernels="fused"), num_steps=2, pool_size=2, device="cpu")


def test_workspace_hands_out_one_view_per_shape_until_its_buffer_grows():
    """``Workspace.take`` returns the same view object for a (name, shape, dtype) asked for before (the eager step's
    host cost), views of one name share the front of its buffer, and a larger request replaces the buffer and every
    cached view of that name, never another name's."""
    import torch

    from sglang_hybrid.kernels.workspace import Workspace

    ws = Workspace("cpu")
    a = ws.take("x", (2, 3), torch.int32)
    assert ws.take("x", (2, 3), torch.int32) is a
    b = ws.take("x", (3,), torch.int32)                       # a smaller shape: the front of the same buffer
    assert b.data_ptr() == a.data_ptr() and b is not a
    other = ws.take("y", (4,), torch.float32)
    a.fill_(7)
    assert ws.take("x", (2, 3), torch.int32).eq(7).all()      # writes stay visible through the cached view
    big = ws.take("x", (5, 5), torch.int32)                   # grows: a new buffer
    assert ws.nbytes == 25 * 4 + 4 * 4
    again = ws.take("x", (2, 3), torch.int32)
    assert again is not a and again.data_ptr() == big.data_ptr()
    assert ws.take("y", (4,), torch.float32) is other         # another name's views are kept
    assert ws.take("x", (2, 3), torch.int64).dtype == torch.int64   # another dtype: its own buffer and views
