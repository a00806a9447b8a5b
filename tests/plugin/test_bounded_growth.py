"""Host-side bookkeeping stays bounded over long serving: 10,000 steps of each structure that sees every step.

What grew before (a source review): the fused step's ``kernels.Workspace`` cached a view per (name, shape, dtype),
and the FULL_MASK verify mask on FlashInfer (no backend buffer) is sized by ``seq_lens_sum``, a new shape almost
every step; and every runtime-state switch appended an entry to SGLang's runtime-context ``_overrides_log``. The
other per-step host containers (the n-gram feeder's per-request maps, the plan FIFO, the counters' histograms) are
driven here too, so a regression in any of them shows as a size that keeps moving. Sizes are asserted, never times;
every step runs on the host (the Triton kernel's launch is stubbed; the runtime-state switch is SGLang's own
``apply_runtime_state`` on SGLang's real ``SpecRuntimeState`` and runtime context), so the file runs in seconds.
"""
from __future__ import annotations

import random
import types
from types import SimpleNamespace as NS

import pytest
import torch

STEPS = 10_000
WARMUP = 200


# -- (a) the kernels' workspace ---------------------------------------------------------------------------------------
def test_bounded_growth_workspace_views_per_name():
    """One name asked for 10,000 distinct shapes holds at most ``VIEWS_PER_NAME`` views; a hit returns the cached
    view, a miss a fresh view of the same buffer (the buffer stays where it was while no larger size is asked)."""
    from sglang_hybrid.kernels.workspace import VIEWS_PER_NAME, Workspace

    ws = Workspace("cpu")
    top = ws.take("m", (STEPS + 1,), torch.bool)
    ptr = top.data_ptr()
    for n in range(1, STEPS + 1):
        v = ws.take("m", (n,), torch.bool)
        assert v.shape == (n,) and v.data_ptr() == ptr
        assert ws.views_held <= VIEWS_PER_NAME
    assert ws.views_held == VIEWS_PER_NAME
    last = ws.take("m", (STEPS,), torch.bool)
    assert ws.take("m", (STEPS,), torch.bool) is last               # still cached: one dict lookup
    assert ws.nbytes == STEPS + 1


def test_bounded_growth_workspace_fused_verify_input(monkeypatch):
    """``kernels.fused_links_and_mask`` (its launch stubbed: the allocation is the host side under test) at 10,000
    varying ``seq_lens_sum``, batch sizes and widths, with no mask buffer of the backend's (FlashInfer): after warm-up
    the views held, the bytes held and every buffer's address stay fixed, and the stable shapes keep their view."""
    from sglang_hybrid import kernels
    from sglang_hybrid.kernels import verify_input as kv
    from sglang_hybrid.kernels.workspace import VIEWS_PER_NAME, Workspace

    launches = []

    class _Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(grid)

    monkeypatch.setattr(kv, "_verify_input_kernel", _Launch())
    ws = Workspace("cpu")
    rng = random.Random(0)
    trees = {(b, w): (torch.zeros((b, w), dtype=torch.int64), torch.ones((b, w), dtype=torch.bool),
                      torch.eye(w, dtype=torch.bool).expand(b, w, w).contiguous())
             for b in (3, 4) for w in (4, 6)}
    max_sum = 8 * 2048
    held = nbytes = ptrs = None
    stable = {}
    for step in range(STEPS):
        if step < len(trees):   # every shape once, the largest first: the buffers reach their size in warm-up
            b, w = sorted(trees, reverse=True)[step]
            seq_sum = max_sum
        else:
            b, w = rng.choice(list(trees))
            seq_sum = rng.randrange(b, max_sum + 1)
        tokens, valid, anc = trees[(b, w)]
        seq_lens = torch.full((b,), seq_sum // b, dtype=torch.int64)
        draft, *_, mask = kernels.fused_links_and_mask(tokens, valid, anc, seq_lens, seq_sum, None, workspace=ws)
        assert mask.numel() == seq_sum * w + w * w * b
        if step >= WARMUP:
            assert stable.setdefault((b, w), draft) is draft       # the stable shapes' views are hits
        if step == WARMUP:
            held, nbytes = ws.views_held, ws.nbytes
            ptrs = {name: buf.data_ptr() for name, buf in ws._bufs.items()}
        elif step > WARMUP:
            assert (ws.views_held, ws.nbytes) == (held, nbytes)
            assert {name: buf.data_ptr() for name, buf in ws._bufs.items()} == ptrs
    assert len(launches) == STEPS
    assert held == len(trees) * 3 + VIEWS_PER_NAME                 # draft, positions, links per shape; the mask's
    assert len(ws._keys["custom_mask"]) == VIEWS_PER_NAME


# -- (b) runtime-state switches and SGLang's overrides log ------------------------------------------------------------
class _Backend:
    def __init__(self, name):
        self.name = name


def _switching_worker(depths, widths):
    """A worker with ``EAGLEWorkerV2``'s attribute layout, whose ``apply_runtime_state`` is SGLang's own method, and
    HYBRID's runtime states assembled by ``runtime_states.assemble`` (SGLang's ``SpecRuntimeState``)."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from sglang_hybrid.sglang_plugin import runtime_states as rs
    from sglang_hybrid.sglang_plugin import worker as hw
    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    drafts = {d: rs.DraftPart(d, _Backend(f"draft{d}"), None) for d in depths}
    verifies = {w: rs.VerifyPart(w, _Backend(f"target{w}"), None, _Backend(f"extend{w}"), None) for w in widths}
    rebuilt = []
    dw = NS(speculative_num_steps=max(depths), speculative_num_draft_tokens=max(widths), draft_attn_backend=None,
            draft_extend_attn_backend=None, cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=None,
            draft_runner=NS(draft_attn_backend=None, attn_backend=None),
            _rebuild_topk1_chain_buffers=lambda: rebuilt.append(1))
    worker = NS(speculative_num_steps=max(depths), speculative_num_draft_tokens=max(widths), _draft_worker=dw,
                _target_worker=NS(model_runner=NS(attn_backend=None, decode_cuda_graph_runner=None)),
                runtime_states={(d, w): rs.assemble(drafts[d], verifies[w]) for d in depths for w in widths},
                fallbacks=hw.Fallbacks(HybridCounters("cpu")), _ragged=False, _switch_log_entries=())
    worker.apply_runtime_state = types.MethodType(EAGLEWorkerV2.apply_runtime_state, worker)
    worker._apply_plan = types.MethodType(hw.HybridWorkerV2._apply_plan, worker)
    return worker, rebuilt


def _overlay(log, names=("speculative_num_steps", "speculative_num_draft_tokens")):
    """``RuntimeContext.resolved_server_args_dict``'s overlay of ``log`` (in order, last writer wins), on ``names``."""
    out = {}
    for _source, fields in log:
        out.update((k, v) for k, v in fields.items() if k in names)
    return out


@pytest.fixture
def published_context(monkeypatch):
    """SGLang's real runtime context with a dummy config published (SGLang's own scoped test override), and a record
    of every entry ``RuntimeContext.override`` appends and their overlay (the untrimmed log's, to compare the resolved
    values with)."""
    from sglang.srt.runtime_context import RuntimeContext, get_context

    ctx = get_context()
    appended = []
    untrimmed = {}      # the untrimmed log's overlay (``_overlay(appended)``), kept as entries are appended
    original = RuntimeContext.override

    def recording(self, source, **fields):
        original(self, source, **fields)
        if fields:
            appended.append(self._overrides_log[-1])
            untrimmed.update(_overlay(appended[-1:]))

    monkeypatch.setattr(RuntimeContext, "override", recording)
    with ctx.override_server_args(speculative_num_steps=3, speculative_num_draft_tokens=8):
        yield ctx, appended, untrimmed


def test_bounded_growth_runtime_state_switches_keep_overrides_log_size(published_context):
    """10,000 runtime-state switches through ``HybridWorkerV2._apply_plan`` and SGLang's ``apply_runtime_state``: the
    overrides log keeps its size after the first switch (SGLang's earlier entries untouched, one switch entry: the
    state in force), and what ``resolved_server_args_dict`` resolves from it equals what the untrimmed log gives."""
    ctx, appended, untrimmed = published_context
    ctx.override("sglang.before", speculative_num_steps=3, speculative_num_draft_tokens=8)   # e.g. the start's
    before = list(ctx._overrides_log)
    depths, widths = (1, 2, 3), (4, 6, 8)
    worker, rebuilt = _switching_worker(depths, widths)
    pairs = [(d, w) for d in depths for w in widths]
    rng = random.Random(1)
    switches = 0
    for step in range(STEPS):
        d, w = pairs[step % len(pairs)] if step % 3 else rng.choice(pairs)
        was = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
        worker._apply_plan(d, w)
        switches += was != (d, w)
        assert (worker.speculative_num_steps, worker.speculative_num_draft_tokens) == (d, w)
        state = worker.runtime_states[(d, w)]
        assert worker._target_worker.model_runner.attn_backend is state.target_attn_backend
        assert worker._draft_worker.draft_attn_backend is state.draft_attn_backend
        if switches:
            log = ctx._overrides_log
            assert len(log) == len(before) + 1 and log[:len(before)] == before
            assert _overlay(log) == untrimmed == {"speculative_num_steps": d, "speculative_num_draft_tokens": w}
    assert switches > STEPS * 0.8 and len(rebuilt) == switches and len(appended) == switches + 1
    assert len(worker._switch_log_entries) == 1
    assert ctx.resolved_server_args_dict()["speculative_num_draft_tokens"] == worker.speculative_num_draft_tokens


def test_bounded_growth_switches_keep_foreign_overrides_in_place(published_context):
    """Entries another writer appends between switches (``/set_internal_state``, SGLang's capture overrides) are never
    dropped, whatever fields they write; only the switches' own superseded entries are, so the log grows by the
    foreign entries alone and every resolved value equals the untrimmed log's at every step."""
    ctx, appended, untrimmed = published_context
    worker, _ = _switching_worker((1, 2), (4, 8))
    pairs = [(1, 4), (2, 8), (1, 8), (2, 4)]
    foreign = []
    for step in range(STEPS):
        worker._apply_plan(*pairs[step % len(pairs)])
        if step % 1000 == 999:          # a foreign writer of the same fields, after the switch
            ctx.override("sglang.set_internal_state", speculative_num_steps=7)
            foreign.append(ctx._overrides_log[-1])
        log = ctx._overrides_log
        assert len(log) <= len(foreign) + 1
        assert all(any(e is f for e in log) for f in foreign)
        assert _overlay(log) == untrimmed
    assert len(appended) == STEPS + len(foreign)


def test_bounded_growth_plan_fifo_and_switch_path():
    """The plan's way to the host over 10,000 decode steps: ``_stage_plan`` every step, its result processed
    (``_switch_plan``) on most, dropped on some (a batch never processed): the FIFO never exceeds its bound."""
    from sglang_hybrid.sglang_plugin import worker as hw
    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    applied = []
    worker = NS(_plans_switch=True, _plan_fifo=hw.collections.deque(), _plan_next_buf=0, _launched=0,
                _plan_host=[torch.zeros(2, dtype=torch.int64) for _ in range(hw._PLAN_BUFFERS)],
                counters=HybridCounters("cpu"), _apply_plan=lambda d, w: applied.append((d, w)))
    rng = random.Random(2)
    for step in range(STEPS):
        worker._launched += 1
        plan = torch.tensor([rng.randint(1, 3), rng.choice((4, 6, 8))])
        hw.HybridWorkerV2._stage_plan(worker, plan)
        assert len(worker._plan_fifo) <= hw._PLAN_IN_FLIGHT
        if step % 7:
            hw.HybridWorkerV2._switch_plan(worker)        # the oldest plan in flight
            assert applied[-1][0] in (1, 2, 3) and applied[-1][1] in (4, 6, 8)
    assert len(worker.counters.lag_steps["plan"]) <= hw._PLAN_IN_FLIGHT + 1


# -- (c) the other per-step host containers ---------------------------------------------------------------------------
def test_bounded_growth_ngram_feeder_forgets_finished_and_absent_requests():
    """10,000 decode steps of a changing batch through ``NgramFeeder`` (the worker's calls: ``stage_batch``, then
    ``drop_absent`` with the batch's request ids; ``finish`` for finished requests): its per-request maps and the Rust
    drafter hold exactly the batch's requests, whether they left by finishing or by an abort (no ``finish``)."""
    from sglang_hybrid.ngram import NgramDrafter
    from sglang_hybrid.sglang_plugin.ngram_host import NgramFeeder

    max_bs = 8
    feeder = NgramFeeder(NgramDrafter(corpus_cap_tokens=4096), k=4, device="cpu", max_bs=max_bs, context=True)
    rng = random.Random(3)
    live, free_slots, next_rid = [], list(range(max_bs)), 0
    gens = [0] * max_bs
    finished = aborted = 0
    for step in range(STEPS):
        while len(live) < max_bs and rng.random() < 0.5:
            slot = free_slots.pop()
            gens[slot] += 1
            live.append(NS(rid=f"r{next_rid}", slot=slot, origin_input_ids=[rng.randrange(50) for _ in range(6)],
                           output_ids=[]))
            next_rid += 1
        for req in live:
            req.output_ids.extend(rng.randrange(50) for _ in range(rng.randint(0, 3)))
        slots = [r.slot for r in live]
        feeder.stage_batch(live, torch.tensor([gens[s] for s in slots], dtype=torch.int64), slots)
        feeder.drop_absent({r.rid for r in live})
        assert set(feeder._ids) == set(feeder._fed) == set(feeder._ctx_key) == {r.rid for r in live}
        assert len(feeder.drafter) == len(live)
        for req in list(live):
            if rng.random() < 0.05:
                live.remove(req)
                free_slots.append(req.slot)
                if rng.random() < 0.5:
                    feeder.finish(req.rid, natural_stop=True)
                    finished += 1
                else:
                    aborted += 1                # left without finish: the next step's drop_absent forgets it
    assert finished > 100 and aborted > 100 and next_rid > 1000
    assert len(feeder._ids) <= max_bs and len(feeder.drafter) <= max_bs
    assert feeder.drafter.corpus_stats()["donated_tokens"] <= 4096 + 1000   # the Rust corpus cap holds (+ separators)


def test_bounded_growth_counters_histograms():
    """The counters' host histograms over 10,000 steps: keyed by widths, depths, decision paths, lags and ragged
    node ranges and tiers, each a small fixed set, so their sizes stop moving after warm-up."""
    from sglang_hybrid.sglang_plugin.metrics import HybridCounters

    c = HybridCounters("cpu")
    rng = random.Random(4)
    sizes = None
    for step in range(STEPS):
        w = rng.choice((4, 6, 8))
        c.on_select_host(w, rng.randint(1, 3), rng.choice(("fused", "torch")))
        c.on_lag("plan", rng.randint(0, 2))
        c.on_lag("proposal", rng.randint(0, 1))
        counts = [rng.randint(1, w) for _ in range(rng.randint(1, 4))]
        c.on_ragged(counts, w, rng.choice((16, 32)))
        now = (len(c.width_steps), len(c.depth_steps), len(c.decision_steps), len(c.lag_steps["plan"]),
               len(c.lag_steps["proposal"]), len(c.ragged["node_range_steps"]), len(c.ragged["tier_steps"]))
        if step == 2000:
            sizes = now
        elif step > 2000:
            assert now == sizes
    assert sizes[-2] <= 8 * 9 // 2 and sum(c.width_steps.values()) == STEPS
