"""Ragged verify graphs (``sglang_plugin/ragged/graph_capture.py``, ``graph_runner.py``): a forward captured at a
token tier and replayed over refreshed static buffers computes the next step's ragged batch, and the CPU's traced
replay refuses exactly what a CUDA graph could not replay.

The attention in the captured forward is SGLang 0.5.23's Triton extend kernel (``extend_attention_fwd``, in Triton's
interpreter: a subprocess, this module run with ``python -m``, since ``TRITON_INTERPRET`` must be set before Triton is
imported) and, in-process, the CPU engine's torch twin of it (``cpu_engine.torch_attention``). Both are called as
``RaggedTritonAttnBackend`` calls the kernel in a graph: every argument a buffer of fixed address and shape sized for
the running limit (``slots`` requests, the tier's rows), the longest query fixed at the full width, requests past the
step's own padded with no rows (``graph_runner.pad_requests``). Two ragged batches of different request counts,
prefixes and trees at the same tier go through one capture; each output is compared with the dense float64 reference
of ``tests/helpers/ragged_cases.py``. The live suite runs the whole runner in every ragged case
(``tests/live/test_sglang_live.py``, ``_assert_ragged``).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from tests.helpers.interpreted import run_interpreted
from tests.helpers.ragged_cases import ATOL, dense_reference, make_case, plugin_layout

from sglang_hybrid.sglang_plugin.ragged.graph_capture import (GraphReplayMismatch, TracedEagerCapture, capture_kind,
                                                              kernel_launch, trace_forward)
from sglang_hybrid.sglang_plugin.ragged.graph_runner import pad_requests

pytestmark = pytest.mark.sglang
#: the tier both batches run at, the request slots and the full width the graph is captured for
TIER, SLOTS, WIDTH = 80, 8, 30
#: (seed, prefix lengths, extend lengths): 76 and 73 tokens, both at tier 80; 6 and 4 requests
BATCHES = ((2, [129, 0, 64, 7, 33, 1], [1, 28, 5, 13, 2, 27]), (7, [3, 250, 41, 90], [28, 28, 13, 4]))
HEADS, KV_HEADS = 4, 2


# ----------------------------------------------------------------------------------------------- the mechanism
def test_traced_replay_reads_the_refreshed_buffers():
    """A forward over static buffers replays after the buffers change: the trace matches, the output is the new
    one."""
    w, x = torch.randn(4, 4), torch.zeros(2, 4)
    cap = TracedEagerCapture()
    def forward():
        return (x @ w).relu() + 1

    assert "t" not in cap
    cap.run("t", forward)
    assert "t" in cap
    x.copy_(torch.randn(2, 4))
    out = cap.run("t", forward)
    assert torch.equal(out, (x @ w).relu() + 1) and cap.replays == {"t": 1}


def test_capture_kind_follows_device_and_tensor_parallelism():
    """Traced replays on the CPU engine (which runs SGLang with its graphs off), CUDA graphs on a GPU at TP 1 with
    SGLang's decode graphs on, eager elsewhere: what the worker builds and the start-up budget counts."""
    assert capture_kind("cpu", 1) == capture_kind("cpu", 2) == "traced"
    assert capture_kind("cpu", 1, decode_graphs=False) == "traced"
    assert capture_kind("cuda", 1) == capture_kind("cuda:3", 1) == "cuda"
    assert capture_kind("cuda", 2) is None and capture_kind("xpu", 1) is None
    assert capture_kind("cuda", 1, decode_graphs=False) is None           # --disable-cuda-graph: none of HYBRID's


@pytest.mark.parametrize("backend, ragged, ragged_graphs, device, tp, disabled, want, why", [
    ("TritonAttnBackend", True, True, "cpu", 1, False, "traced", ""),
    ("RaggedTritonAttnBackend", True, True, "cuda", 1, False, "cuda", ""),  # after triton_backend.enable
    ("TritonAttnBackend", True, True, "cuda", 1, True, None, "--disable-cuda-graph"),  # SGLang's decode graphs off
    ("TritonAttnBackend", True, True, "cuda", 2, False, None, "TP 1"),
    ("TritonAttnBackend", True, True, "xpu", 1, False, None, "xpu device"),
    ("TritonAttnBackend", False, True, "cpu", 1, False, None, "padded verify"),
    ("TritonAttnBackend", True, False, "cpu", 1, False, None, "ragged_graphs=false"),
    ("FlashAttentionBackend", True, True, "cuda", 1, False, None, "Triton and FlashInfer backends only"),
])
def test_ragged_tier_graph_kind_is_the_one_answer(monkeypatch, backend, ragged, ragged_graphs, device, tp, disabled,
                                                  want, why):
    """``tier_graph_kind``: ragged, the setting, SGLang's Triton backend (before or after HYBRID's subclass) and a
    capture for the device, TP size and SGLang's decode graph switch. SGLang's switch is read with its own
    ``check_cuda_graph_backend``, which answers from the config SGLang publishes at start (none here: graphs on);
    ``disabled`` stands for a launch with ``--disable-cuda-graph``, as SGLang's hook resolves it (the decode phase's
    backend DISABLED). Where none runs, the reason the worker's start-up line gives."""
    from types import SimpleNamespace

    import sglang.srt.model_executor.cuda_graph_config as cgc

    from sglang_hybrid.sglang_plugin.ragged.graph_capture import tier_graph_kind

    assert cgc.check_cuda_graph_backend(cgc.Phase.DECODE, cgc.Backend.DISABLED) is False     # unpublished: on
    if disabled:
        monkeypatch.setattr(cgc, "check_cuda_graph_backend",
                            lambda phase, b: (phase, b) == (cgc.Phase.DECODE, cgc.Backend.DISABLED))
    runner = SimpleNamespace(attn_backend=type(backend, (), {})(), device=device)
    kind, reason = tier_graph_kind(runner, tp, ragged=ragged, ragged_graphs=ragged_graphs)
    assert kind == want
    assert (why in reason) if why else reason == ""


@pytest.mark.parametrize("installed, attrs, want, why", [
    (True, {}, "cuda", ""),
    (True, {"num_wrappers": 1}, "cuda", ""),
    (False, {}, None, "flashinfer package is not installed"),
    (True, {"num_wrappers": 2}, None, "sliding-window or cross-attention"),
    (True, {"prefill_uses_dequant_workspace": True}, None, "FP4 KV cache"),
])
def test_ragged_tier_graph_kind_on_flashinfer(monkeypatch, installed, attrs, want, why):
    """``tier_graph_kind`` on SGLang's FlashInfer backend (or HYBRID's subclass of it): CUDA graphs at TP 1 where the
    backend can plan ragged tiers (``flashinfer_backend.cannot_plan_tiers``: one wrapper per plan, no FP4 dequantising
    workspace, the flashinfer package installed, which SGLang's module imports its wrappers from); else eager, with
    the reason. ``installed`` stands the package in: this machine has none."""
    from types import SimpleNamespace

    import sglang.srt.layers.attention.flashinfer_backend as sglang_flashinfer

    from sglang_hybrid.sglang_plugin.ragged.graph_capture import tier_graph_kind

    if installed:
        monkeypatch.setattr(sglang_flashinfer, "BatchPrefillWithPagedKVCacheWrapper", object, raising=False)
    else:
        monkeypatch.delattr(sglang_flashinfer, "BatchPrefillWithPagedKVCacheWrapper", raising=False)
    for name in ("FlashInferAttnBackend", "RaggedFlashInferAttnBackend"):
        runner = SimpleNamespace(attn_backend=type(name, (), attrs)(), device="cuda")
        kind, reason = tier_graph_kind(runner, 1, ragged=True, ragged_graphs=True)
        assert kind == want, name
        assert (why in reason) if why else reason == ""


def test_ragged_graph_tiers_share_one_hidden_state_buffer():
    """``RaggedVerifyGraphRunner.keep_hidden``: every tier's hidden states are copied to one ``[max_rows, width]``
    buffer, made by the first forward outside the trace (as a buffer made at start), so a captured tier's output
    holds no tensor of its own and its replays match the capture (the copy is recorded in both); a forward of
    another width or dtype is refused by name."""
    from sglang_hybrid.sglang_plugin.ragged.graph_runner import RaggedVerifyGraphRunner

    runner = RaggedVerifyGraphRunner.__new__(RaggedVerifyGraphRunner)
    runner.max_rows, runner.hidden = 16, None
    cap = TracedEagerCapture()
    x = torch.randn(16, 4)
    outs = {rows: cap.run(rows, lambda rows=rows: runner.keep_hidden(x[:rows] * 2)) for rows in (8, 16)}
    assert runner.hidden.shape == (16, 4)
    for rows, out in outs.items():
        assert out.untyped_storage().data_ptr() == runner.hidden.untyped_storage().data_ptr()
        assert torch.equal(out, x[:rows] * 2)
    x.copy_(torch.randn(16, 4))
    replayed = cap.run(8, lambda: pytest.fail("a replay reruns the captured closure"))
    assert cap.replays[8] == 1 and torch.equal(replayed, x[:8] * 2)
    with pytest.raises(RuntimeError, match=r"hidden states of \(5,\)"):
        runner.keep_hidden(torch.randn(8, 5))


def test_traced_static_buffer_is_external_even_at_an_address_the_trace_saw_made():
    """``graph_capture.static_buffer``: a buffer made once inside a captured forward is recorded as external to the
    trace, so its replays (which find it made) match the capture. The allocator may give it the address of a tensor
    the forward made and freed earlier in the same trace (a live retraction case met that): here the factory returns
    such a tensor itself, and the replay still matches. Without the mark the capture records the buffer as the
    forward's own and the replay refuses."""
    from sglang_hybrid.sglang_plugin.ragged.graph_capture import static_buffer

    state, src = {}, torch.randn(4, 3)

    def forward():
        made = src * 1.0                                    # the forward's own tensor
        if "buf" not in state:
            state["buf"] = static_buffer(lambda: made)     # handed that very address
        kept = state["buf"][:2]
        kept.copy_(src[:2] * 2)
        return kept

    cap = TracedEagerCapture()
    cap.run("tier", forward)
    src.copy_(torch.randn(4, 3))
    assert torch.equal(cap.run("tier", forward), src[:2] * 2) and cap.replays["tier"] == 1


def test_traced_replay_refuses_what_a_graph_cannot_replay():
    """A tensor outside the static buffers, a changed shape, a host read: each fails its replay, naming the first
    operator that differs; a replay of the captured closure ignores a new closure (a graph cannot see one)."""
    w = torch.randn(4, 4)
    cap = TracedEagerCapture()
    state = {"x": torch.randn(2, 4)}
    cap.run("fresh", lambda: state["x"] @ w)
    keep = state["x"]                                   # keep the old address alive: the new one must differ
    state["x"] = torch.randn(2, 4)
    with pytest.raises(GraphReplayMismatch, match="operator 0.*aten.mm"):
        cap.run("fresh", lambda: state["x"] @ w)
    del keep
    n = [3]
    cap.run("shape", lambda: torch.ones(n[0]) * 2)
    n[0] = 4
    with pytest.raises(GraphReplayMismatch, match="aten.ones"):
        cap.run("shape", lambda: torch.ones(n[0]) * 2)
    x = torch.randn(3)
    with pytest.raises(GraphReplayMismatch, match="host"):
        cap.run("item", lambda: x + 1 if bool(x.sum() > 0) else x - 1)
    # the replay reruns the captured forward: a new closure passed later is not what the graph would run
    cap.run("closure", lambda: x * 2)
    assert torch.equal(cap.run("closure", lambda: x * 3), x * 2)


def test_kernel_launch_is_one_recorded_operator():
    """A ``kernel_launch`` body is one record with its arguments (shapes, strides, addresses of external tensors),
    not its inner operators; outside a trace it just runs; traces do not nest."""
    a, b = torch.randn(5), torch.randn(5)

    def forward():
        with kernel_launch("axpy", (a, 2.0), {"out": b}):
            b.copy_(a * 2.0 + b)           # several ATen operators, one launch
        return b.sum()

    _, ops = trace_forward(forward)
    assert [op[0] for op in ops] == ["axpy", "aten.sum.default"]
    assert ops[0][1][0][-1] == ("external", a.untyped_storage().data_ptr()) and ops[0][1][1] == 2.0
    before = b.clone()
    with kernel_launch("axpy", (a,)):
        b.add_(1)
    assert torch.equal(b, before + 1)
    with pytest.raises(RuntimeError, match="already being traced"):
        trace_forward(lambda: trace_forward(lambda: a + 1))


def test_pad_requests_gives_padding_requests_no_rows():
    seed, prefix, ext = BATCHES[1]
    layout = plugin_layout(make_case(seed, prefix, ext, HEADS, KV_HEADS), WIDTH, tier=True)
    padded = pad_requests(layout, SLOTS)
    b = layout.batch_size
    assert padded.batch_size == SLOTS and padded.rows == layout.rows and padded.total == layout.total
    assert torch.equal(padded.qo_indptr[: b + 1], layout.qo_indptr)
    assert (padded.qo_indptr[b:] == layout.qo_indptr[-1]).all()
    assert (padded.mask_indptr[b:] == layout.mask_indptr[-1]).all() and (padded.counts[b:] == 0).all()
    assert pad_requests(padded, SLOTS) is padded
    with pytest.raises(ValueError, match="does not fit 3 request slots"):
        pad_requests(layout, 3)


def test_ragged_graph_logits_go_to_one_buffer():
    """Every tier writes its logits into one ``[max_rows, vocab]`` buffer: SGLang's process-wide one
    (``GraphSharedOutput``, the real class) when it holds the rows, else the runner's own."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    from sglang_hybrid.sglang_plugin.ragged.graph_runner import logits_buffer

    config = SimpleNamespace(vocab_size=50)
    shared = GraphSharedOutput(device="cpu", max_rows=64)
    runner = SimpleNamespace(model_config=config, device="cpu", graph_shared_output=shared)
    got = logits_buffer(runner, 40)
    assert got.shape == (40, 50) and got.dtype == torch.float32
    assert got.data_ptr() == shared.get_logits_buffer(50, rows=64).data_ptr()
    own = logits_buffer(runner, 65)                                   # more rows than SGLang's holds
    assert own.shape == (65, 50) and own.data_ptr() != got.data_ptr()
    runner.graph_shared_output = None                                 # SGLang captured no graphs
    assert logits_buffer(runner, 8).shape == (8, 50)


# ----------------------------------------------------------------------------------------------- captured attention
def _static_buffers(cases: list) -> dict:
    """Buffers of fixed address and size for every batch: the tier's q/k/v/o rows, the KV pool, the plan's indices
    and mask (what ``RaggedVerifyBuffers`` and the runner's static inputs hold)."""
    pool = max(c["k_buffer"].shape[0] for c in cases)
    mask = max(int(plugin_layout(c, WIDTH, tier=True).custom_mask.numel()) for c in cases)
    kv = max(int(c["kv_indices"].numel()) for c in cases)
    d = cases[0]["q"].shape[2]
    return {"q": torch.zeros(TIER, HEADS, d), "k": torch.zeros(TIER, KV_HEADS, d), "v": torch.zeros(TIER, KV_HEADS, d),
            "o": torch.zeros(TIER, HEADS, d), "k_buffer": torch.zeros(pool, KV_HEADS, d),
            "v_buffer": torch.zeros(pool, KV_HEADS, d), "qo_indptr": torch.zeros(SLOTS + 1, dtype=torch.int32),
            "kv_indptr": torch.zeros(SLOTS + 1, dtype=torch.int32),
            "kv_indices": torch.zeros(kv, dtype=torch.int64), "custom_mask": torch.zeros(mask, dtype=torch.uint8),
            "mask_indptr": torch.zeros(SLOTS + 1, dtype=torch.int64)}


def _load(buf: dict, case: dict) -> None:
    """Refresh the static buffers in place with ``case`` as the worker's plan would: rows at the tier (spare rows
    zero), requests padded to the slots."""
    layout = pad_requests(plugin_layout(case, WIDTH, tier=True), SLOTS)
    total = layout.total
    for name in ("q", "k", "v"):
        buf[name].zero_()
        buf[name][:total].copy_(case[name])
    buf["o"].fill_(float("nan"))
    for name in ("k_buffer", "v_buffer"):
        buf[name].fill_(float("nan"))
        buf[name][: case[name].shape[0]].copy_(case[name])
    buf["qo_indptr"].copy_(layout.qo_indptr)
    b = len(case["ext_lens"])
    buf["kv_indptr"][: b + 1].copy_(case["kv_indptr"])
    buf["kv_indptr"][b + 1:] = case["kv_indptr"][-1]
    buf["kv_indices"][: case["kv_indices"].numel()].copy_(case["kv_indices"])
    buf["custom_mask"].zero_()
    buf["custom_mask"][: layout.custom_mask.numel()].copy_(layout.custom_mask)
    buf["mask_indptr"].copy_(layout.mask_indptr)


def _captured_attention(attention, buf: dict):
    """The forward a tier's graph captures: the extend attention over the static buffers, the longest query fixed at
    the full width."""
    def forward():
        attention(buf["q"], buf["k"], buf["v"], buf["o"], buf["k_buffer"], buf["v_buffer"], buf["qo_indptr"],
                  buf["kv_indptr"], buf["kv_indices"], buf["custom_mask"], True, buf["mask_indptr"], WIDTH, 1.0, 1.0,
                  sm_scale=None, skip_prefix_custom_mask=True)
        return buf["o"]
    return forward


def replay_two_batches(attention) -> list:
    """Capture the tier's attention on the first batch and replay it on the second: ``(outputs, refused)``, each
    batch's real rows; then
    the same attention captured with a per-step slice (``qo_indptr[: B + 1]``, as a runner without request slots
    would) fails its replay."""
    cases = [make_case(seed, prefix, ext, HEADS, KV_HEADS) for seed, prefix, ext in BATCHES]
    buf = _static_buffers(cases)
    cap = TracedEagerCapture()
    forward = _captured_attention(attention, buf)
    out = []
    for case in cases:
        _load(buf, case)
        o = cap.run(TIER, forward)
        out.append(o[: sum(case["ext_lens"])].clone())
        assert torch.isnan(o[sum(case["ext_lens"]):]).all()       # the tier's spare rows: never written
    assert cap.replays == {TIER: 1}
    bs = {"n": len(cases[0]["ext_lens"])}

    def sliced():
        n = bs["n"]
        attention(buf["q"], buf["k"], buf["v"], buf["o"], buf["k_buffer"], buf["v_buffer"], buf["qo_indptr"][: n + 1],
                  buf["kv_indptr"][: n + 1], buf["kv_indices"], buf["custom_mask"], True, buf["mask_indptr"][: n + 1],
                  WIDTH, 1.0, 1.0, sm_scale=None, skip_prefix_custom_mask=True)
        return buf["o"]

    _load(buf, cases[0])
    cap.run("sliced", sliced)
    bs["n"] = len(cases[1]["ext_lens"])
    _load(buf, cases[1])
    try:
        cap.run("sliced", sliced)
        refused = False
    except GraphReplayMismatch:
        refused = True
    return out, refused


def _check_replays(outputs: list, refused: bool) -> None:
    """Each batch's output equals its dense reference; the sliced capture was refused."""
    assert refused, "a replay whose slices follow the step's request count was not refused"
    assert len(outputs) == len(BATCHES)
    for (seed, prefix, ext), o in zip(BATCHES, outputs):
        case = make_case(seed, prefix, ext, HEADS, KV_HEADS)
        assert not torch.isnan(o).any()
        assert float((o.double() - dense_reference(case)).abs().max()) < ATOL


def test_ragged_graph_replay_with_the_torch_twin_matches_dense_reference():
    """The CPU engine's attention (the torch twin, one recorded launch) captured at a tier on one ragged batch and
    replayed on another (different requests, prefixes, trees): both equal the dense reference."""
    from sglang_hybrid.cpu_engine.torch_attention import extend_attention_torch

    _check_replays(*replay_two_batches(extend_attention_torch))


def _graph_main(out: str) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): the same two batches through SGLang's Triton kernel."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.modules.setdefault("vllm", None)
    torch.set_num_threads(1)
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    torch.save(replay_two_batches(extend_attention_fwd), out)


def test_ragged_graph_replay_with_sglang_triton_kernel_matches_dense_reference(tmp_path):
    """SGLang's Triton extend kernel (interpreter; every launch recorded with its grid and arguments) captured at a
    tier on one ragged batch and replayed on another: both equal the dense reference."""
    out = tmp_path / "replays.pt"
    run_interpreted(__name__, out)
    _check_replays(*torch.load(out))


if __name__ == "__main__":
    _graph_main(sys.argv[1])
