"""Pieces of the SGLang worker that can be checked against SGLang's real objects without starting an engine.

The decode step itself (draft, select, verify, draft extend, the n-gram feeder on real requests) runs end to end in a
live SGLang engine in ``tests/live/test_sglang_live.py``; nothing here stands in for an SGLang method's body.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sglang.srt.speculative.eagle_worker_v2 as eagle_v2  # noqa: E402
from sglang.srt.layers.attention.verify_mask import VerifyMask, maybe_create_verify_mask  # noqa: E402

from sglang_hybrid.selector import ancestors_from_parents  # noqa: E402
from sglang_hybrid.sglang_plugin import worker as hw  # noqa: E402
from sglang_hybrid.sglang_plugin.tp_sync import TreeBroadcast, pack_tree, unpack_tree  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input  # noqa: E402

from tests.helpers.sglang_requests import real_req  # noqa: E402
from tests.helpers.trees import mixed_batch  # noqa: E402

pytestmark = pytest.mark.sglang
HEAD = Path(__file__).resolve().parents[2] / "sglang_hybrid" / "data" / "eagle_smollm2"


def test_draft_worker_class_swap_is_scoped():
    original = eagle_v2.EagleDraftWorker
    with hw._draft_worker_class(hw.HybridDraftWorker):
        assert eagle_v2.EagleDraftWorker is hw.HybridDraftWorker
    assert eagle_v2.EagleDraftWorker is original
    with pytest.raises(RuntimeError):
        with hw._draft_worker_class(hw.HybridDraftWorker):
            raise RuntimeError("constructor failed")
    assert eagle_v2.EagleDraftWorker is original


class _Backend:
    """Holds a verify mask the way SGLang's attention backends expose it (the ``verify_mask`` property)."""

    def __init__(self, verify_mask):
        self.verify_mask = verify_mask


def test_mask_into_tritons_uint8_buffer():
    """SGLang's Triton backend allocates its verify mask with ``maybe_create_verify_mask(dtype=torch.uint8)``; the
    builder must write the same mask into it that it builds as a fresh bool tensor (a bool scatter into the uint8
    buffer raised a dtype error before)."""
    tree, seq_lens = mixed_batch(), torch.tensor([7, 3, 12, 1, 9, 4])
    bs, w = tree.tokens.shape
    ctx = 64
    mask = maybe_create_verify_mask(is_draft_runner=False, skip_prefill=False, max_bs=bs, max_context_len=ctx,
                                    num_draft_tokens=w, device="cpu", is_read=True, dtype=torch.uint8)
    assert mask.buffer.dtype == torch.uint8
    assert mask.mode == TreeMaskMode.FULL_MASK         # outside a CPU engine, SGLang's default layout
    buf = hw.verify_mask_buffer(_Backend(mask), bs)
    assert buf is mask.buffer
    total = int(seq_lens.sum())
    mode = TreeMaskMode.FULL_MASK
    fresh = build_verify_input(tree, seq_lens, num_steps=3, max_depth=4, mask_mode=mode, seq_lens_sum=total)
    into = build_verify_input(tree, seq_lens, num_steps=3, max_depth=4, mask_mode=mode, seq_lens_sum=total,
                              mask_buf=buf)
    n = fresh.custom_mask.numel()
    assert into.custom_mask.data_ptr() == mask.buffer.data_ptr()
    assert torch.equal(into.custom_mask[:n].to(torch.bool), fresh.custom_mask)


def test_mask_mode_follows_the_backend_not_the_platform():
    """On SGLang's CPU engine ``default_tree_mask_mode()`` answers QLEN_ONLY (intel_amx's layout), but Triton reads
    FULL_MASK: the worker builds FULL_MASK and never writes into a buffer of another layout."""
    qlen = VerifyMask(buffer=torch.zeros(4 * 13 * 13, dtype=torch.uint8), mode=TreeMaskMode.QLEN_ONLY, max_bs=4)
    assert hw.verify_mask_buffer(_Backend(qlen), 2) is None
    assert hw.verify_mask_buffer(_Backend(None), 2) is None
    full = VerifyMask(buffer=torch.zeros(2 * 13 * 80, dtype=torch.uint8), mode=TreeMaskMode.FULL_MASK, max_bs=2)
    assert hw.verify_mask_buffer(_Backend(full), 3) is None               # batch too large for it
    assert hw.verify_mask_buffer(_Backend(full), 2) is full.buffer


def test_tree_pack_roundtrip_is_exact():
    tree = mixed_batch()
    tree = tree._replace(survival=torch.rand(tree.survival.shape) * tree.valid,
                         expected_accepted=torch.rand(tree.tokens.shape[0]))
    back = unpack_tree(pack_tree(tree), tree.tokens.shape[1])
    for name in tree._fields:
        a, b = getattr(tree, name), getattr(back, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(back.ancestors, ancestors_from_parents(back.parents) & back.ancestors)


class _RecordingGroup:
    """Follows SGLang's ``GroupCoordinator.broadcast`` contract: fills ``input_`` in place with rank 0's tensor."""

    def __init__(self, world_size, rank0_tensor):
        self.world_size, self.rank0, self.calls = world_size, rank0_tensor, 0

    def broadcast(self, input_, src=0):
        assert src == 0
        self.calls += 1
        input_.copy_(self.rank0)
        return input_


def test_tree_broadcast_replaces_a_diverged_tree_with_rank0s():
    tree = mixed_batch()
    other = tree._replace(tokens=torch.where(tree.valid, tree.tokens + 1, tree.tokens))   # this rank diverged
    b = tree.tokens.shape[0]
    rank0_plan = torch.tensor([2, 4])                                  # EAGLE depth 2, verify width 4
    group = _RecordingGroup(2, torch.cat([pack_tree(tree), rank0_plan[None].expand(b, 2)], 1))
    got, plan = TreeBroadcast(group)(other, torch.tensor([4, 13]))   # this rank chose another plan too
    assert group.calls == 1 and torch.equal(got.tokens, tree.tokens) and plan.tolist() == [2, 4]
    single = TreeBroadcast(_RecordingGroup(1, None))
    mine = torch.tensor([4, 13])
    assert not single.enabled and single(other, mine) == (other, mine)
    assert not TreeBroadcast(None).enabled


def test_lookup_memory_span_from_host_known_lengths():
    """The worker bounds the prompt lookup by what the host knows without a device read: SGLang's CPU copy of the
    sequence lengths (exact, plus the root), else the feeder's committed lengths plus what the steps in flight can
    have committed, else nothing (the whole table). The batch's device lengths are meta tensors: reading their values
    would fail."""
    from types import SimpleNamespace

    worker = SimpleNamespace(_host_committed=None, hybrid_step=SimpleNamespace(max_depth=12))
    batch = SimpleNamespace(seq_lens=torch.empty(3, dtype=torch.int64, device="meta"),
                            seq_lens_cpu=torch.tensor([5, 2049, 3]))
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2050
    worker._host_committed = 2000
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2050          # the exact copy wins
    batch.seq_lens_cpu = None                                              # e.g. the Triton backend opts out of it
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2000 + hw._PLAN_IN_FLIGHT * 13
    worker._host_committed = None
    assert hw.HybridWorkerV2._longest_context(worker, batch) is None


def test_shipped_head_is_not_tied():
    """A tied EAGLE config makes ``lm_head`` the embedding module and SGLang's ``set_embed_and_head`` fails when the
    draft loads (``del self.lm_head.weight``); the live suite loads the shipped head in SGLang."""
    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    from sglang_hybrid.reference.eagle import head_config

    assert head_config(dict(cfg, tie_word_embeddings=True))["tie_word_embeddings"] is False


# -- no silent fallbacks: each is counted (fallback_<cause>) and logged once per worker and cause ---------------------

def _fallback_logs(caplog, cause):
    return [r for r in caplog.records if r.name == hw.logger.name and f"HYBRID fallback {cause}:" in r.getMessage()]


def test_fallback_counts_on_the_device_without_reading_it():
    """``on_fallback`` adds a host int into the device vector: on meta tensors (no values at all) it still runs, so it
    never reads the device; the count reaches the summary and the periodic log line under ``fallback_<cause>``."""
    from sglang_hybrid.sglang_plugin.metrics import FALLBACKS, HybridCounters, format_summary

    meta = HybridCounters("meta")
    meta.on_fallback("no_host_view", 3)
    assert meta.totals.is_meta
    counters = HybridCounters("cpu", log_interval=1)
    counters.on_fallback("conf_placeholder", 2)
    counters.on_fallback("plan_missing")
    out = counters.maybe_log()
    assert {f"fallback_{c}" for c in FALLBACKS} <= out.keys()
    assert out["fallback_conf_placeholder"] == 2 and out["fallback_plan_missing"] == 1
    assert out["fallback_no_host_view"] == 0 and out["fallback_lookup_whole_table"] == 0
    line = format_summary(out)
    assert "fallback_conf_placeholder=2" in line and "fallback_no_host_view=0" in line
    counters.on_fallback("conf_placeholder", 1)
    assert counters.maybe_log()["fallback_conf_placeholder"] == 1          # the interval's count
    assert counters.snapshot()["fallback_conf_placeholder"] == 3           # cumulative (the self-check's file)
    with pytest.raises(KeyError):
        counters.on_fallback("no_such_cause")


def test_fallback_conf_placeholder_is_counted_and_logged_once(caplog):
    """EAGLE's topk=1 draft extend reports the placeholder 1.0 as the next step's first-token confidence; the draft
    worker replaces it with the drafted token's softmax probability from the extend's logits (SGLang's real
    ``LogitsProcessorOutput`` and ``EagleDraftInput``). When the logits do not fit (row count) or none were captured
    the placeholder stays: counted per request, logged once over repeated steps."""
    from types import SimpleNamespace

    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    counters = HybridCounters("cpu")
    draft_worker = SimpleNamespace(hybrid_owner=SimpleNamespace(fallbacks=hw.Fallbacks(counters)), alternatives=0)
    batch = SimpleNamespace(seq_lens=torch.tensor([5, 9]))
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 1.0]])

    def draft_input():
        index = torch.tensor([[0], [2]])
        return EagleDraftInput(topk_p=torch.ones(2, 1), topk_index=index)

    nd = draft_input()
    with caplog.at_level("WARNING", logger=hw.logger.name):
        hw.HybridDraftWorker._after_extend(draft_worker, batch, nd, [LogitsProcessorOutput(logits)])
    want = torch.softmax(logits, -1).gather(-1, torch.tensor([[0], [2]]))
    assert torch.allclose(nd.topk_p, want) and nd.topk_p[0, 0] < 1
    assert counters.snapshot()["fallback_conf_placeholder"] == 0 and not _fallback_logs(caplog, "conf_placeholder")

    padded = LogitsProcessorOutput(torch.cat([logits, logits[:1]]))      # 3 rows for 2 requests
    with caplog.at_level("WARNING", logger=hw.logger.name):
        for captured in ([padded], [padded], []):                        # no logits captured at all: also counted
            nd = draft_input()
            hw.HybridDraftWorker._after_extend(draft_worker, batch, nd, captured)
            assert torch.equal(nd.topk_p, torch.ones(2, 1))              # the placeholder stayed
    assert counters.snapshot()["fallback_conf_placeholder"] == 6
    logs = _fallback_logs(caplog, "conf_placeholder")
    assert len(logs) == 1 and logs[0].levelname == "WARNING"
    assert "3 rows for 2 requests" in logs[0].getMessage() and "placeholder confidence 1.0" in logs[0].getMessage()
    # an idle batch (DP attention) has nothing to fix and nothing to count
    empty = EagleDraftInput(topk_p=torch.ones(0, 1), topk_index=torch.zeros(0, 1, dtype=torch.int64))
    assert hw.extend_probabilities(None, empty) == (None, None)
    hw.HybridDraftWorker._after_extend(draft_worker, SimpleNamespace(seq_lens=torch.zeros(0)),
                                                 EagleDraftInput(topk_p=torch.ones(0, 1)), [])
    assert counters.snapshot()["fallback_conf_placeholder"] == 6


def _host_worker(counters, **kw):
    """The worker state ``host_proposals`` and ``_lookup_span`` use, with HYBRID's real step, the Rust
    drafter behind the real feeder, and SGLang's pool generations (a host tensor)."""
    from types import SimpleNamespace

    from sglang_hybrid.ngram import NgramDrafter
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep
    from sglang_hybrid.sglang_plugin.ngram_host import NgramFeeder

    step = HybridStep(HybridSettings(mode="merge", ngram_k=4), num_steps=3, pool_size=4, device="cpu",
                      counters=counters, max_context_len=256)
    feeder = NgramFeeder(NgramDrafter(max_draft=step.proposal_width), step.proposal_width, "cpu", max_bs=4,
                         context=step.context is not None)
    pool = SimpleNamespace(req_generation=torch.ones(4, dtype=torch.int64))
    worker = SimpleNamespace(hybrid_step=step, feeder=feeder, fallbacks=hw.Fallbacks(counters), counters=counters,
                             _cur_gen=None, _host_committed=None, _launched=1, _processed=0, req_to_token_pool=pool,
                             **kw)
    worker._longest_context = lambda batch: hw.HybridWorkerV2._longest_context(worker, batch)
    return worker


def test_fallback_no_host_view_is_counted_and_logged_once(caplog):
    """A decode batch without a host view of its requests (no request list, or no host copy of its slots) gets its
    host n-gram proposals invalidated for the step: counted per request, logged once over repeated steps."""
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    counters = HybridCounters("cpu")
    worker = _host_worker(counters)
    phrase = [101, 102, 103, 104, 105, 106, 107, 108]
    reqs = [real_req("a", phrase * 3, phrase[:2], 2), real_req("b", phrase * 2, phrase[:1], 0)]
    slots = torch.tensor([2, 0])
    batch = SimpleNamespace(reqs=reqs, req_pool_indices=slots, req_pool_indices_cpu=slots.clone(),
                            seq_lens=torch.tensor([25, 16]), seq_lens_cpu=None)
    assert hw.missing_host_view(batch, 2) is None
    with caplog.at_level("WARNING", logger=hw.logger.name):
        hw.HybridWorkerV2.host_proposals(worker, batch)
    buffers = worker.hybrid_step.buffers
    assert (buffers.length[slots] > 0).all() and worker._host_committed == 26 and worker._cur_gen is not None
    assert counters.snapshot()["fallback_no_host_view"] == 0 and not _fallback_logs(caplog, "no_host_view")

    no_slots = SimpleNamespace(reqs=reqs, req_pool_indices=slots, req_pool_indices_cpu=None)
    no_reqs = SimpleNamespace(req_pool_indices=slots, req_pool_indices_cpu=slots.clone())
    short = SimpleNamespace(reqs=reqs[:1], req_pool_indices=slots, req_pool_indices_cpu=slots.clone())
    assert "req_pool_indices_cpu" in hw.missing_host_view(no_slots, 2)
    assert "batch.reqs" in hw.missing_host_view(no_reqs, 2)
    assert "1 requests for 2" in hw.missing_host_view(short, 2)
    with caplog.at_level("WARNING", logger=hw.logger.name):
        for b in (no_slots, no_slots, no_reqs, short):
            buffers.length[slots] = 3
            hw.HybridWorkerV2.host_proposals(worker, b)
            assert (buffers.length[slots] == 0).all() and worker._cur_gen is None and worker._host_committed is None
    assert counters.snapshot()["fallback_no_host_view"] == 8
    logs = _fallback_logs(caplog, "no_host_view")
    assert len(logs) == 1 and "batch.req_pool_indices_cpu" in logs[0].getMessage()


def test_fallback_lookup_whole_table_is_counted_and_logged_once(caplog):
    """Without a host-known bound on the batch's contexts the device prompt lookup reads its whole table: counted per
    request, logged once; with SGLang's CPU sequence lengths it reads the batch's span and nothing is counted."""
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    counters = HybridCounters("cpu")
    worker = _host_worker(counters)
    assert worker.hybrid_step.context is not None                      # the setting context_lookup is on by default
    batch = SimpleNamespace(seq_lens=torch.tensor([5, 7, 9]), seq_lens_cpu=None)
    with caplog.at_level("WARNING", logger=hw.logger.name):
        assert hw.HybridWorkerV2._lookup_span(worker, batch) is None
        assert hw.HybridWorkerV2._lookup_span(worker, batch) is None
        batch.seq_lens_cpu = torch.tensor([5, 7, 9])
        assert hw.HybridWorkerV2._lookup_span(worker, batch) == worker.hybrid_step.lookup_span(10)
        batch.seq_lens_cpu, worker._host_committed = None, 9           # the feeder's committed lengths: a bound
        assert hw.HybridWorkerV2._lookup_span(worker, batch) is not None
    assert counters.snapshot()["fallback_lookup_whole_table"] == 6
    logs = _fallback_logs(caplog, "lookup_whole_table")
    assert len(logs) == 1 and "context_lookup" in logs[0].getMessage()


def test_fallback_plan_missing_is_counted_and_logged_once(caplog):
    """A chosen (EAGLE depth, verify width) without a runtime state keeps the current shapes: counted per step and
    logged once; a known pair is applied, the current one is not re-applied."""
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    counters = HybridCounters("cpu")
    applied = []
    worker = SimpleNamespace(runtime_states={(3, 8): "d3w8", (3, 5): "d3w5"}, speculative_num_steps=3,
                             speculative_num_draft_tokens=8, fallbacks=hw.Fallbacks(counters),
                             apply_runtime_state=applied.append, _ragged=False, _switch_log_entries=())
    with caplog.at_level("WARNING", logger=hw.logger.name):
        hw.HybridWorkerV2._apply_plan(worker, 2, 5)
        hw.HybridWorkerV2._apply_plan(worker, 2, 5)
        hw.HybridWorkerV2._apply_plan(worker, 3, 8)
        hw.HybridWorkerV2._apply_plan(worker, 3, 5)
    assert applied == ["d3w5"] and counters.snapshot()["fallback_plan_missing"] == 2
    logs = _fallback_logs(caplog, "plan_missing")
    assert len(logs) == 1 and "depth 2 and verify width 5" in logs[0].getMessage()
    fixed = SimpleNamespace(runtime_states={}, speculative_num_steps=3, speculative_num_draft_tokens=8,
                            fallbacks=hw.Fallbacks(counters), _ragged=False)
    hw.HybridWorkerV2._apply_plan(fixed, 2, 5)                          # fixed shapes (one state, or DP): no plan
    assert counters.snapshot()["fallback_plan_missing"] == 2


def test_ragged_plan_switches_depth_states_and_caps_tree_width():
    """Under ragged verify the runtime states are per EAGLE depth at the full width: a (depth, width) plan applies the
    depth's state and keeps the width as the next trees' cap (``_tree_width``), with no state per width."""
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    counters = HybridCounters("cpu")
    applied = []
    worker = SimpleNamespace(runtime_states={(3, 28): "d3", (1, 28): "d1"}, speculative_num_steps=3,
                             speculative_num_draft_tokens=28, fallbacks=hw.Fallbacks(counters),
                             apply_runtime_state=applied.append, _ragged=True, _full_width=28,
                             _tree_width=None, _switch_log_entries=())
    hw.HybridWorkerV2._apply_plan(worker, 3, 6)                         # the current depth: only the cap moves
    assert applied == [] and worker._tree_width == 6
    hw.HybridWorkerV2._apply_plan(worker, 1, 4)
    assert applied == ["d1"] and worker._tree_width == 4
    hw.HybridWorkerV2._apply_plan(worker, 2, 4)                         # a depth without a state: counted
    assert counters.snapshot()["fallback_plan_missing"] == 1


@pytest.mark.parametrize("mode, backend, graphs, cpu, want", [
    ("auto", "TritonAttnBackend", False, True, True),        # the CPU engine: ragged by default
    ("auto", "TritonAttnBackend", False, False, False),      # a GPU: the per-step host read is a sync, so padded
    ("on", "TritonAttnBackend", False, False, True),         # ... unless asked for
    ("off", "TritonAttnBackend", False, True, False),
    ("auto", "FlashInferAttnBackend", False, False, False),
    ("on", "FlashInferAttnBackend", False, False, True),     # FlashInfer plans it from the verify input, eager
    ("auto", "TritonAttnBackend", True, False, False),
    ("on", "TorchNativeAttnBackend", False, False, "or TritonAttnBackend, the target runs TorchNativeAttnBackend"),
    ("on", "TritonAttnBackend", True, False, True),          # SGLang's verify graphs are dropped at start
    ("on", "FlashInferAttnBackend", True, False, True),
])
def test_ragged_verify_setting_resolves_where_it_can_run(monkeypatch, mode, backend, graphs, cpu, want):
    """``ragged_verify``: auto is on only on the CPU engine; on runs it on the Triton or FlashInfer backend, with
    SGLang's CUDA graphs or without, and stops a start on another backend, naming the flag to change."""
    from types import SimpleNamespace

    import sglang.srt.utils as sglang_utils

    monkeypatch.setattr(sglang_utils, "is_cpu", lambda: cpu)
    runner = SimpleNamespace(attn_backend=type(backend, (), {})(),
                             decode_cuda_graph_runner=object() if graphs else None)
    worker = SimpleNamespace(settings=SimpleNamespace(ragged_verify=mode),
                             target_worker=SimpleNamespace(model_runner=runner))
    if isinstance(want, str):
        with pytest.raises(RuntimeError, match=want) as err:
            hw.HybridWorkerV2._ragged_wanted(worker)
        assert "--attention-backend triton (or flashinfer)," in str(err.value)
    else:
        assert hw.HybridWorkerV2._ragged_wanted(worker) is want


@pytest.mark.parametrize("mode, backend, device, tp, graphs, cpu, skipped", [
    ("auto", "TritonAttnBackend", "cpu", 1, True, True, True),         # the CPU engine: traced token-tier graphs
    ("auto", "TritonAttnBackend", "cuda", 1, True, False, False),      # a GPU: auto verifies padded, SGLang's graphs
    ("on", "TritonAttnBackend", "cuda", 1, True, False, True),         # CUDA token-tier graphs replace SGLang's
    ("on", "TritonAttnBackend", "cuda", 2, True, False, True),         # TP 2: no token-tier capture, eager ragged
    ("on", "TritonAttnBackend", "cuda", 1, False, False, True),        # ragged_graphs off: eager ragged
    ("on", "FlashInferAttnBackend", "cuda", 1, True, False, True),     # FlashInfer: eager ragged
    ("auto", "FlashInferAttnBackend", "cuda", 1, True, False, False),  # a GPU: padded
    ("off", "TritonAttnBackend", "cpu", 1, True, True, False),
])
def test_ragged_verify_target_graph_capture_skipped_under_ragged_verify(monkeypatch, mode, backend, device, tp,
                                                                        graphs, cpu, skipped):
    """SGLang captures the target's graphs before the draft's; the worker's hook on the target's
    ``init_cuda_graphs`` turns its verify graphs off (SGLang's own ``capture_decode_cuda_graph=False``) exactly when
    verify runs ragged, where they would be dropped unused (HYBRID's token-tier graphs or eager forwards run it), and
    decides ragged verify once for that and for its own start (its log line once)."""
    from types import SimpleNamespace

    import sglang.srt.utils as sglang_utils

    monkeypatch.setattr(sglang_utils, "is_cpu", lambda: cpu)
    calls = []
    worker = hw.HybridWorkerV2.__new__(hw.HybridWorkerV2)
    worker.settings = SimpleNamespace(ragged_verify=mode, ragged_graphs=graphs)
    worker.server_args = SimpleNamespace(tp_size=tp)
    runner = SimpleNamespace(attn_backend=type(backend, (), {})(), device=device)
    worker._target_worker = SimpleNamespace(model_runner=runner)
    worker._target_verify_skipped, worker._ragged_decision = False, None
    asked = []
    wanted = hw.HybridWorkerV2._ragged_wanted
    monkeypatch.setattr(hw.HybridWorkerV2, "_ragged_wanted", lambda self: asked.append(1) or wanted(self))
    init = worker._skip_target_verify_capture(lambda capture_decode_cuda_graph=True: calls.append(
        capture_decode_cuda_graph))
    init()
    assert calls == [not skipped] and worker._target_verify_skipped is skipped
    worker._ragged_decided()
    assert len(asked) == 1                      # decided once, for the hook (where it asked) and the worker's start
    init(capture_decode_cuda_graph=False)       # SGLang's draft-style call: left as it is
    assert calls[-1] is False


def test_ragged_verify_drops_sglang_target_verify_graphs():
    """Under ragged verify SGLang's target verify graphs (captured at one width) are dropped at start: the target
    runner's and every runtime state's reference (SGLang's real ``SpecRuntimeState``, which ``apply_runtime_state``
    restores from), the draft's graph runners kept; nothing to drop where SGLang captured none or its eager runner
    stands in for them."""
    from types import SimpleNamespace

    from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

    verify_graphs, draft_graphs, extend_graphs, eager = object(), object(), object(), object()

    def state(depth):
        return SpecRuntimeState(speculative_num_steps=depth, speculative_num_draft_tokens=13, draft_attn_backend=None,
                                cuda_graph_runner=draft_graphs, target_attn_backend=None,
                                target_graph_runner=verify_graphs, draft_extend_attn_backend=None,
                                cuda_graph_runner_for_draft_extend=extend_graphs)

    runner = SimpleNamespace(decode_cuda_graph_runner=verify_graphs, eager_runner=eager)
    worker = SimpleNamespace(target_worker=SimpleNamespace(model_runner=runner),
                             runtime_states={(d, 13): state(d) for d in (1, 2, 3)})
    assert hw.HybridWorkerV2._drop_target_verify_graphs(worker) is True
    assert runner.decode_cuda_graph_runner is None
    for s in worker.runtime_states.values():
        assert s.target_graph_runner is None
        assert s.cuda_graph_runner is draft_graphs and s.cuda_graph_runner_for_draft_extend is extend_graphs
    assert hw.HybridWorkerV2._drop_target_verify_graphs(worker) is False        # nothing left
    runner.decode_cuda_graph_runner = eager                                      # graphs off: SGLang's eager runner
    assert hw.HybridWorkerV2._drop_target_verify_graphs(worker) is False and runner.decode_cuda_graph_runner is eager
