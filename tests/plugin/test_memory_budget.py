"""Start-up memory budget (``sglang_hybrid.sglang_plugin.memory_budget``: the start-up memory targets).

(a) Llama-3.1-8B shapes, an EAGLE-3 head, 128 running requests, a 131,072-token context, an H200 at the memory
fraction SGLang picks for it, both cost tables: plain EAGLE against HYBRID as built (one runtime state per (depth,
width) pair, assembled from a draft part per depth and a verify part per width) and against the ragged per-depth
layout (one verify part), measured against the issue's targets (speculative memory <= 1.5x EAGLE's, captured graph
sets <= 2x). The ragged layout meets both (SGLang's target verify graphs not captured, depths 2 and 3 in the start-up
draft buffers); the padded one misses them, a strict xfail that states the ratios; the numbers themselves are
pinned (docs/sglang.md, "Start-up memory budget", quotes them). The deployment is built by ``bench.memory_budget``
(``python -m bench.memory_budget`` prints it across batches and contexts; its table is tested here too).
(b) The refusal names the settings to change; the worker's entry point logs on the CPU engine and never refuses there.
(c) The formulas against a brute-force count: SGLang's own objects and methods run on the CPU (its graph input
buffers, shared logits buffer, the FlashInfer and Triton backends' ``init_cuda_graph_state``, its captured batch size
list) and HYBRID's real ``HybridStep`` (fixed buffers, and the fused step's workspace under Triton's interpreter), with
every tensor they allocate summed. What no CPU can construct (FlashInfer's wrappers, 8 MiB each) is cited in the
module. SGLang and the interpreter run in one subprocess (``TRITON_INTERPRET`` must be set before Triton's import:
``tests/plugin/_scripts/memory_budget_probe.py``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import memory_budget as BM
from sglang_hybrid.sglang_plugin import memory_budget as mb
from sglang_hybrid.sglang_plugin.config import HybridSettings
from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

ROOT = Path(__file__).resolve().parents[2]
GiB, MiB = mb.GiB, mb.MiB

# the Llama-3.1-8B / EAGLE-3 / H200 deployment is shared with the benchmark (python -m bench.memory_budget)
H200_MIB, STEPS = BM.H200_MIB, BM.STEPS
CONTEXT, RUNNING = BM.LLAMA8B_CONTEXT, 128


# -- SGLang's objects, and HYBRID's, counted tensor by tensor (one subprocess: _scripts/memory_budget_probe.py) --------
@pytest.fixture(scope="module")
def measured() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "tests.plugin._scripts.memory_budget_probe", str(H200_MIB)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_memory_budget_formulas_match_sglang_objects(measured):
    """(c) SGLang's own objects, built on the CPU, allocate what the formulas say (small shapes: max_bs 6, width 5,
    context 64). Differences allowed and named: index arrays the budget leaves out (FlashInfer's two ``max_bs + 1``
    int32 indptr clones, the verify runner's two int32 token counters)."""
    m, w, c, h, s = 6, 5, 64, 48, 3
    bs = tuple(range(1, m + 1))
    shape = mb.ModelShape(hidden=h, layers=1, heads=4, kv_heads=1, head_dim=16, vocab=100)
    dep = mb.Deployment(target=shape, draft=shape, draft_logits_vocab=40, draft_input_hidden=h, draft_weight_bytes=0,
                        max_running_requests=m, context_len=c, cuda_graph_bs=bs, sm_count=3)
    wrappers = len(bs) * mb.FLASHINFER_WRAPPER_BYTES
    assert measured["capture_bs"]["128"] == [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 129, 8)]
    assert len(measured["capture_bs"]["128"]) == 35
    assert measured["flashinfer_graph_state"] - (mb._verify_graphs(dep, w) - wrappers) == 2 * (m + 1) * 4
    assert measured["flashinfer_graph_state"] - (mb._extend_graphs(dep, w) - wrappers) == 2 * (m + 1) * 4
    assert measured["flashinfer_draft_graph_state"] == mb._draft_graphs(dep, s) - (s - 1) * wrappers
    tri = dataclasses.replace(dep, attention_backend="triton")
    assert measured["triton_verify_graph_state"] == mb._verify_graphs(tri, w)
    assert measured["triton_extend_graph_state"] == mb._extend_graphs(tri, w)
    assert measured["triton_draft_graph_state"] == mb._draft_graphs(tri, s)
    verify = sum(n * size for (name, n, size), part in mb._input_buffers(dep, s, w).items() if part == "verify")
    assert measured["verify_input_buffers"] - verify == 2 * 4
    rows = m * w
    assert measured["logits"] == rows * (100 + 40) * 4
    assert mb.budget(dep, [(s, w)], layout="x", max_draft_tokens=w).items["logits buffers"] == measured["logits"]


def test_memory_budget_hybrid_buffers_match_hybrid_step(measured):
    """(c) HYBRID's own buffers: a real ``HybridStep`` (pool 4, context 32, 3 steps, ngram_k 3, online offsets on
    both sides, two EAGLE alternatives) with the worker's per-slot position-0 alternatives, and the fused step's
    workspace after one step at the full width under Triton's interpreter, tensor by tensor. The one difference
    allowed and named: the draft worker's records of the alternatives (two ``[max_bs, steps, 3]`` tensors of
    ``HybridDraftWorker``, which needs a live draft model), counted by the formula."""
    sh = measured["hybrid_shape"]
    own = mb.hybrid_buffer_bytes(pool_size=4, num_steps=3, ngram_k=sh["k"], proposal_width=sh["pw"], context_cols=32,
                                 model_bias=True, ngram_bias=True, fused=True, max_bs=sh["b"], width=sh["width"],
                                 depths=sh["depths"],
                                 mask_entries=sh["seq_sum"] * sh["width"] + sh["width"] ** 2 * sh["b"],
                                 alternatives=2)
    draft_records = (4 + 8) * sh["b"] * 3 * (2 + 1)
    assert own.fixed - draft_records == measured["hybrid_fixed"]
    assert own.workspace == measured["hybrid_workspace"]


def test_memory_budget_ragged_triton_buffers_match_the_backend(measured):
    """(c) Under ragged verify on the Triton backend the start-up budget adds the buffers its plan writes: the bytes
    ``ragged.triton_backend.enable`` allocates on SGLang's real ``TritonAttnBackend`` (max_bs 6, width 13, context
    100), and on the Llama-8B stand-in worker (48 running requests, width 13, context 131,072) exactly that formula
    over the padded budget with eager forwards, that plus the token-tier graphs' memory with them, in both cases less
    SGLang's target verify graph set, which is not captured under ragged verify."""
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sglang_hybrid.sglang_plugin.ragged import triton_backend as rt

    backend = TritonAttnBackend.__new__(TritonAttnBackend)
    backend.qo_indptr, backend.max_context_len, backend.device = torch.zeros(9, dtype=torch.int64), 100, "cpu"
    rt.enable(backend, 6, 13)
    buf = backend.ragged_buffers
    allocated = sum(t.untyped_storage().nbytes() for t in (buf.kv_indices, buf.mask))
    assert allocated == mb.ragged_buffer_bytes(6, 13, 100)
    extra = measured["ragged_triton_extra"]
    # SGLang's target verify graph set is not captured under ragged verify (its graph state and the input buffers
    # only its runner keys: HybridWorkerV2._skip_target_verify_capture), eager forwards or HYBRID's graphs
    assert extra["sglang_verify_set"] == extra["verify_set_formula"] > 0
    assert extra["verify_with_tiers"] == extra["verify_eager"] == 0
    assert extra["verify_inputs"] == extra["verify_only_inputs"] > 0
    without_sglang_set = extra["sglang_verify_set"] + extra["verify_inputs"]
    assert extra["backend"] == "triton"
    assert extra["eager"] == mb.ragged_buffer_bytes(48, 13, 131072) - without_sglang_set
    # with the token-tier graphs (setting ragged_graphs): their inputs, hidden state buffer (the width the verify
    # forward returns: EAGLE-3's three layers here), and the logits buffer of their own unless SGLang shares one (it
    # does where it captures graphs, as this stand-in's runner says)
    assert extra["verify_hidden"] == 3 * 4096
    graphs = mb.ragged_graph_bytes(48, 13, vocab=128256, hidden=3 * 4096, hidden_bytes=2, own_logits=False)
    assert extra["graph_bs"] and extra["total"] == extra["eager"] + graphs


def test_memory_budget_ragged_flashinfer_tier_buffers_match_the_backend(monkeypatch):
    """(c) Under ragged verify in the token-tier graphs on the FlashInfer backend the start-up budget adds the buffers
    their wrappers plan into: each tensor ``ragged.flashinfer_backend.enable`` allocates on SGLang's real
    ``FlashInferAttnBackend`` (max_bs 6, width 13, context 100) has the entries ``flashinfer_tier_buffer_sizes``
    gives, and ``ragged_flashinfer_bytes`` is their bytes, each tier wrapper's KV length buffer and the graphs' own
    memory (nothing eager). ``enable`` is idempotent at the same sizes and refuses a backend that cannot plan tiers,
    naming the setting. The flashinfer package is stood in (this machine has none):
    ``enable`` only checks that SGLang imported its wrapper class; the wrappers are made at a tier's first plan."""
    import sglang.srt.layers.attention.flashinfer_backend as fb

    from sglang_hybrid.sglang_plugin.ragged import flashinfer_backend as rf
    from sglang_hybrid.sglang_plugin.ragged.tiers import token_tiers

    from tests.helpers.sglang_backends_on_cpu import flashinfer_step

    def backend(**attrs):
        b = flashinfer_step(fb, max_bs=6, context=100)
        b.prefill_uses_dequant_workspace = False
        for k, v in attrs.items():
            setattr(b, k, v)
        return b

    monkeypatch.setattr(fb, "BatchPrefillWithPagedKVCacheWrapper", object, raising=False)
    b = backend()
    rf.enable(b, 6, 13)
    assert type(b) is rf.RaggedFlashInferAttnBackend and b.tier_wrappers == {}
    buf = b.ragged_buffers
    sizes = mb.flashinfer_tier_buffer_sizes(6, 13, 100)
    tensors = {k: getattr(buf, k) for k in sizes}
    assert {k: t.numel() for k, t in tensors.items()} == sizes
    assert buf.last_page_len.tolist() == [1] * 7 and (buf.max_bs, buf.width, buf.max_rows) == (6, 13, 78)
    allocated = sum(t.untyped_storage().nbytes() for t in tensors.values())
    dep = dataclasses.replace(BM.llama8b_h200(6, 100).dep, context_len=100)
    graphs = mb.ragged_graph_bytes(6, 13, vocab=dep.target.vocab, hidden=dep.draft_input_hidden,
                                   hidden_bytes=dep.target.dtype_bytes, own_logits=not dep.cuda_graph_bs)
    kv_lens = len(token_tiers(78)) * mb.FLASHINFER_WRAPPER_KV_LENS_BYTES
    assert mb.ragged_flashinfer_bytes(dep, 6, 13, tier_graphs=True) == allocated + kv_lens + graphs
    assert mb.ragged_flashinfer_bytes(dep, 6, 13, tier_graphs=False) == 0
    rf.enable(b, 6, 13)                                  # turned once (``ragged.retype``, tested with the Triton one)
    assert b.ragged_buffers is buf
    for attrs, why in (({"num_wrappers": 2}, "sliding-window"), ({"prefill_uses_dequant_workspace": True}, "FP4")):
        with pytest.raises(RuntimeError, match=f"{why}.*ragged_graphs=false"):
            rf.enable(backend(**attrs), 6, 13)
    monkeypatch.delattr(fb, "BatchPrefillWithPagedKVCacheWrapper")
    with pytest.raises(RuntimeError, match="flashinfer package is not installed"):
        rf.enable(backend(), 6, 13)


def test_memory_budget_ragged_graphs_by_hand():
    """(c) The token-tier graphs' memory on a case small enough to count: 2 requests at width 5 (10 rows: tiers 8 and
    10, which share one hidden state buffer of the 10 rows), vocabulary 100, hidden 4 in bf16."""
    inputs = 8 * (3 * 10 + 2 * 2)
    assert mb.ragged_graph_bytes(2, 5, vocab=100, hidden=4, hidden_bytes=2, own_logits=False) == inputs + 10 * 4 * 2
    assert mb.ragged_graph_bytes(2, 5, vocab=100, hidden=4, hidden_bytes=2, own_logits=True) == \
        inputs + 10 * 100 * 4 + 10 * 4 * 2


def test_memory_budget_small_case_by_hand():
    """(c) The assembly on a case small enough to count by hand: FlashInfer, max_bs 2 (sizes 1 and 2), context 16.
    Plain EAGLE with 2 steps (width 3) and HYBRID's states (2, 3) first, then (1, 2), (1, 3), (2, 2)."""
    t = mb.ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)
    d = mb.ModelShape(hidden=8, layers=1, heads=2, kv_heads=1, head_dim=4, vocab=10)
    dep = mb.Deployment(target=t, draft=d, draft_logits_vocab=6, draft_input_hidden=24, draft_weight_bytes=1000,
                        max_running_requests=2, context_len=16, cuda_graph_bs=(1, 2))
    wr = mb.FLASHINFER_WRAPPER_BYTES
    e = mb.eagle_budget(dep, 2)
    # verify: int32 indices + uint8 mask of 2 x 3 tokens x 16 positions, a wrapper per captured size
    assert e.items["verify"] == 6 * 16 * 5 + 2 * wr
    # draft extend: the same graph state and wrappers, and its backend's four constructor wrappers
    assert e.items["draft extend"] == 6 * 16 * 5 + 2 * wr + 4 * wr
    # draft decode (2 steps): int32 indices 2 x 2 x 16, one step backend: 2 constructor wrappers + one per size
    assert e.items["draft decode"] == 2 * 2 * 16 * 4 + 2 * wr + 2 * wr
    assert e.items["target workspaces"] == 0                 # one FlashInfer workspace, shared with the target's
    # input buffers: verify 48+96+48+48+144+24+16+16, extend's own 288+8+8+8+16, draft decode's own 16+32+16+48+32+8+16
    assert e.items["input buffers"] == 440 + 328 + 168
    assert e.items["logits buffers"] == 2 * 3 * (10 + 6) * 4
    assert (e.graph_sets, e.graphs, e.total) == (3, 6, 96 * MiB + 3536)
    assert e.from_free == e.total - 1000 and e.to_build == 0 and e.draft_kv_per_token == 2 * 1 * 1 * 4 * 2
    own = mb.HybridBuffers(fixed=500, workspace=70)
    hy = mb.budget(dep, [(2, 3), (1, 2), (1, 3), (2, 2), (2, 3)], layout="HYBRID", max_draft_tokens=3, own=own)
    assert hy.states == ((2, 3), (1, 2), (1, 3), (2, 2))
    # assembled from parts: draft parts at depths 2 (the start-up one) and 1, verify parts at widths 3 and 2
    assert [d for d, _ in hy.draft_parts] == [2, 1] and [w for w, _ in hy.verify_parts] == [3, 2]
    # graph sets: verify and draft extend per width, draft decode at depth 2 only (none at depth 1)
    assert (hy.graph_sets, hy.graphs) == (2 * 2 + 1, 10)
    assert hy.items["target workspaces"] == mb.FLASHINFER_WORKSPACE_BYTES + 4 * wr     # the one width after 3
    assert hy.items["verify"] == (6 + 4) * 16 * 5 + 2 * 2 * wr
    assert hy.items["draft decode"] == e.items["draft decode"]      # one depth-2 draft part, as plain EAGLE's
    assert dict(hy.draft_parts)[1] == 0                                                  # depth 1: no draft graph
    later = dict(hy.draft_parts)[1] + dict(hy.verify_parts)[2]
    assert hy.items["hybrid buffers"] == 570 and hy.to_build == later + 70
    parts = sum(b for _, b in hy.draft_parts) + sum(b for _, b in hy.verify_parts)
    assert parts + hy.items["logits buffers"] + 1000 + 570 == hy.total
    # the verify mask HYBRID's workspace keeps: FlashInfer has none of its own, Triton under graphs has
    assert mb.workspace_mask_entries(dep, 3) == 2 * 16 * 3 + 3 * 3 * 2
    assert mb.workspace_mask_entries(dataclasses.replace(dep, kv_pool_tokens=5), 3) == 5 * 3 + 3 * 3 * 2
    assert mb.workspace_mask_entries(dataclasses.replace(dep, attention_backend="triton"), 3) == 0
    with pytest.raises(ValueError, match="torch_native"):
        dataclasses.replace(dep, attention_backend="torch_native")
    nographs = dataclasses.replace(dep, cuda_graph_bs=())
    cpu = mb.budget(nographs, [(2, 3), (1, 3)], layout="HYBRID", max_draft_tokens=3)
    assert (cpu.graph_sets, cpu.items["verify"], cpu.items["logits buffers"]) == (0, 0, 0)
    assert cpu.items["target workspaces"] == 0          # one width: the depth-1 state shares the start-up verify part


# -- (a) Llama-3.1-8B on an H200 ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(measured) -> dict:
    """EAGLE, HYBRID as built and HYBRID ragged per depth, with both cost tables, and the free memory SGLang leaves:
    the benchmark's deployment (``bench.memory_budget.llama8b_h200``) at SGLang's own captured batch sizes, its
    reproductions of SGLang's lists checked against SGLang's functions and HybridStep's shapes."""
    for m, bs in measured["capture_bs"].items():
        assert BM.sglang_decode_capture_bs(int(m)) == tuple(bs), m
    assert len(BM.sglang_prefill_capture_sizes(BM.H200_CHUNKED_PREFILL)) == measured["prefill_graph_sizes_8192"]
    capture_bs = tuple(measured["capture_bs"]["128"])        # --cuda-graph-max-bs = min(256, 128) on an H200
    case = BM.llama8b_h200(RUNNING, CONTEXT, capture_bs=capture_bs)
    assert case == BM.llama8b_h200(RUNNING, CONTEXT)
    settings = BM.hybrid_settings()
    depths, widths = settings.resolved_shapes(STEPS)
    full = widths[-1]
    step = HybridStep(HybridSettings(log_interval=0, decision_kernels="torch"), num_steps=STEPS, pool_size=2,
                      device="cpu")
    assert (step.k, step.proposal_width) == (settings.ngram_k, BM.proposal_width(settings, STEPS))
    mask = mb.workspace_mask_entries(case.dep, full)
    assert mask == case.pool_tokens * full + full * full * RUNNING   # FlashInfer keeps none: HYBRID's workspace has it
    padded = BM.hybrid_budget(case, settings, layout="HYBRID as built")
    ragged = BM.hybrid_budget(case, settings, layout="HYBRID ragged per depth", ragged=True, tier_graphs=True)
    one = BM.hybrid_budget(case, BM.hybrid_settings(False, False), layout="HYBRID without a price")
    default = BM.hybrid_budget(case, BM.hybrid_settings(False, False, measure="auto"), layout="HYBRID default",
                               widths=BM.default_launch_widths(RUNNING, STEPS, BM.NGRAM_K, context=CONTEXT))
    return {"eagle": mb.eagle_budget(case.dep, STEPS), "padded": padded, "ragged": ragged, "one": one,
            "default": default,
            "mfs": case.mfs, "free": case.free, "reserve": case.reserve, "depths": depths, "widths": widths}


def test_memory_budget_llama8b_h200_numbers(llama):
    """(a) The numbers docs/sglang.md quotes. Both cost tables: depths 1-4 and widths 2, 4, 6, 7, 8, 13 (4 EAGLE steps,
    ngram_k 8, merge): 24 states from 4 draft and 6 verify parts (padded), 4 states from 4 draft parts and one verify
    part (ragged). SGLang's fraction on an H200 is 0.905, which leaves at most 13.34 GiB free: plain EAGLE fits it,
    HYBRID with both tables fits ragged but not padded, HYBRID without cost tables (one state at width 13) fits."""
    e, p, r, one = llama["eagle"], llama["padded"], llama["ragged"], llama["one"]
    assert (llama["depths"], llama["widths"], llama["mfs"]) == ((1, 2, 3, 4), (2, 4, 6, 7, 8, 13), 0.905)
    assert round(llama["free"] / GiB, 2) == 13.34
    gib = {k: round(b.total / GiB, 2) for k, b in (("eagle", e), ("padded", p), ("ragged", r), ("one", one))}
    assert gib == {"eagle": 3.67, "padded": 15.75, "ragged": 5.34, "one": 5.64}
    assert (len(p.states), len(r.states), len(one.states)) == (24, 4, 1)
    assert ([d for d, _ in p.draft_parts], [w for w, _ in p.verify_parts]) == ([4, 1, 2, 3], [13, 2, 4, 6, 7, 8])
    assert ([d for d, _ in r.draft_parts], [w for w, _ in r.verify_parts]) == ([4, 1, 2, 3], [13])
    # graph sets: a verify and a draft extend set per width, a draft decode set per depth above 1
    assert (e.graph_sets, p.graph_sets, r.graph_sets, one.graph_sets) == (3, 15, 5, 3)
    assert (e.graphs, p.graphs) == (105, 525)
    assert round(p.items["target workspaces"] / GiB, 3) == round(5 * (384 + 32) / 1024, 3)
    # ragged: SGLang's target verify graph set not captured; padded and ragged, depths 2 and 3 in the start-up draft
    # part's KV index rows (shared_draft_steps): 0.31 GiB less draft decode than four parts of their own
    assert r.items["target workspaces"] == 0 and r.items["verify"] == 0 < one.items["verify"]
    assert p.items["draft decode"] == r.items["draft decode"]
    dep = BM.llama8b_h200(RUNNING, CONTEXT).dep
    rows = sum(mb._draft_graphs(dep, d) - mb._draft_graphs(dep, d, shared=True) for d in (2, 3))
    assert rows == (2 + 3) * RUNNING * CONTEXT * 4 and round(rows / GiB, 2) == 0.31
    assert round(p.total / e.total, 2) == 4.29 and round(r.total / e.total, 2) == 1.46
    assert round(one.total / e.total, 2) == 1.54
    # the default launch (no table given: both measured at start, widths 5 and 13 and the extras that fit, the
    # default depths 1-4 for the draft table): all four widths (4, 5, 8, 13) still fit at 128 requests and a 131,072
    # context beside the four depths (11.31 GiB with one depth)
    d = llama["default"]
    assert sorted(d.states) == [(dd, w) for dd in (1, 2, 3, 4) for w in (4, 5, 8, 13)]
    assert round(d.total / GiB, 2) == 12.18
    assert d.from_free + llama["reserve"] <= llama["free"]
    fits = {k: b.from_free + llama["reserve"] <= llama["free"] for k, b in (("eagle", e), ("padded", p),
                                                                               ("ragged", r), ("one", one))}
    assert fits == {"eagle": True, "padded": False, "ragged": True, "one": True}


def test_memory_budget_bench_table(capsys):
    """``python -m bench.memory_budget``: the benchmark prints its table, one row per layout at every (batch, context)
    of the realistic replay's batches (4, 32, 128) x contexts (8,192, 32,768, 131,072) and one largest-grid row per
    (batch, context); at 128 x 131,072 its as-built row is the pinned one (24 states, 15 graph sets, 15.75 GiB,
    4.29x) and DOES NOT FIT. Its HYBRID states are the replay's (``EngineConfig()``: depths 1-4, its width buckets)."""
    from bench.replay.engine import EngineConfig

    eng = EngineConfig()
    assert (eng.num_steps, eng.ngram_k, eng.n_nodes) == (BM.STEPS, BM.NGRAM_K, BM.hybrid_settings().resolved_n_nodes(4))
    assert BM.hybrid_settings().resolved_shapes(BM.STEPS) == (eng.depths, eng.buckets())
    assert BM.main([]) == 0
    out = capsys.readouterr().out
    assert "COMPUTED from SGLang 0.5.23's sizing formulas" in out and "NOT measured" in out
    rows = [line.split() for line in out.splitlines()]
    for b in BM.BATCHES:
        for c in BM.CONTEXTS:
            cell = [r for r in rows if r[:2] == [str(b), f"{c:,}"]]
            assert len(cell) == 1 + len(BM.LAYOUTS) + 1, (b, c)          # EAGLE, the HYBRID layouts, the grid row
            assert sum(r[-1] in ("FITS", "FIT") for r in cell) == 1 + len(BM.LAYOUTS), (b, c)
    line = next(line for line in out.splitlines() if line.split()[:2] == ["128", "131,072"] and "as built" in line)
    assert line.endswith("DOES NOT FIT")
    fields = line.split("both cost tables")[1].split()
    assert fields == ["24", "15", "15.75", "4.29x", "16.58", "13.34", "DOES", "NOT", "FIT"]
    # ragged (ragged_verify=on, in its token-tier graphs; one verify part, depths 2 and 3 in the start-up draft
    # buffers): within the target's 1.5x of plain EAGLE's memory in every cell, 1.46x at 128 x 131,072
    ragged = [line for line in out.splitlines() if "HYBRID ragged" in line]
    assert len(ragged) == len(BM.BATCHES) * len(BM.CONTEXTS)
    assert all(float(line.split("both cost tables")[1].split()[3][:-1]) <= 1.5 for line in ragged), ragged
    last = next(line for line in ragged if line.split()[:2] == ["128", "131,072"])
    assert last.split("both cost tables")[1].split() == ["4", "5", "5.34", "1.46x", "6.18", "13.34", "FITS"]
    # the same with three EAGLE alternatives per chain position (eagle_alternatives, off by default): the leaves
    # compete for the chains' 12 nodes (HybridSettings.resolved_n_nodes), so the verify width, SGLang's buffers and
    # graphs are the chain launch's; only HYBRID's alternatives tables (KiB) are added: 1.46x at 128 x 131,072, within
    # the target's 1.5x in every cell (the tree widened by 12 nodes took 7.30 GiB, 1.99x, before they competed)
    alt = [line for line in out.splitlines() if "+3 alternatives" in line]
    assert len(alt) == len(BM.BATCHES) * len(BM.CONTEXTS) and all(line.endswith("FITS") for line in alt), alt
    assert all(float(line.split("ragged")[1].split()[3][:-1]) <= 1.5 for line in alt), alt
    last = next(line for line in alt if line.split()[:2] == ["128", "131,072"])
    assert last.split("ragged")[1].split() == ["4", "5", "5.34", "1.46x", "6.18", "13.34", "FITS"]
    case = BM.llama8b_h200(128, 131_072)
    chain, leaves = (BM.hybrid_budget(case, BM.hybrid_settings(eagle_alternatives=m), ragged=True, tier_graphs=True)
                     for m in (0, 3))
    assert chain.states == leaves.states and 0 < leaves.total - chain.total < MiB
    assert {k: v for k, v in leaves.items.items() if k != "hybrid buffers"} == \
        {k: v for k, v in chain.items.items() if k != "hybrid buffers"}
    no_table = next(line for line in out.splitlines() if line.split()[:2] == ["128", "131,072"] and "no price" in line)
    assert no_table.split("(width 13)")[1].split() == ["1", "3", "5.64", "1.54x", "6.47", "13.34", "FITS"]
    # the default launch at 128 x 131,072: EAGLE's width, the full tree and both extras (8, 4) fit, x 4 depths
    default = next(line for line in out.splitlines() if line.split()[:2] == ["128", "131,072"] and "default" in line)
    assert default.split("(4,5,8,13)")[1].split() == ["16", "11", "12.18", "3.32x", "13.01", "13.34", "FITS"]
    default4 = next(line for line in out.splitlines() if line.split()[:2] == ["4", "131,072"] and "default" in line)
    assert "(4,5,8,13)" in default4 and default4.endswith("FITS")


@pytest.mark.xfail(strict=True, reason="MISSED as built: HYBRID's 24 padded runtime states, from 4 draft and 6 verify "
                                       "parts, take 15.75 GiB against plain EAGLE's 3.67 GiB (4.29x, target 1.5x) "
                                       "and capture 15 graph sets against 3 (5x, target 2x)")
def test_memory_budget_llama8b_h200_as_built_meets_issue_targets(llama):
    """(a) The start-up targets for the layout HYBRID builds on a GPU with graphs (padded: a verify part per width)."""
    e, p = llama["eagle"], llama["padded"]
    assert p.total <= 1.5 * e.total and p.graph_sets <= 2 * e.graph_sets


def test_memory_budget_llama8b_h200_ragged_per_depth_meets_graph_set_target(llama):
    """(a) The graph set target (<= 2x EAGLE's) for the ragged layout: one verify part (the full width 13)
    shared by the 4 depths' draft parts, 5 graph sets against EAGLE's 3 (1.67x): MET."""
    e, r = llama["eagle"], llama["ragged"]
    assert r.graph_sets <= 2 * e.graph_sets


def test_memory_budget_llama8b_h200_ragged_per_depth_meets_memory_target(llama):
    """(a) The memory target (<= 1.5x EAGLE's) for the ragged layout on FlashInfer, in its token-tier graphs
    (TP 1): 5.34 GiB, 1.46x, MET; 5.20 GiB, 1.42x, with the verify forward eager (TP > 1, ``ragged_graphs=false``):
    the tiers' plan buffers and shared int workspace (0.10 GiB), their inputs and the one hidden state buffer they
    share (0.04 GiB). Two changes took the layout from 6.82 GiB (1.86x): SGLang's target verify graph set is not
    captured under ragged verify (1.30 GiB: ``HybridWorkerV2._skip_target_verify_capture``), and depths 2 and 3 use
    the start-up draft part's KV index rows (0.31 GiB: ``shared_draft_steps``)."""
    e, r = llama["eagle"], llama["ragged"]
    assert r.total <= 1.5 * e.total
    eager = BM.hybrid_budget(BM.llama8b_h200(RUNNING, CONTEXT), BM.hybrid_settings(), ragged=True)
    assert (round(eager.total / GiB, 2), round(eager.total / e.total, 2)) == (5.20, 1.42)
    assert round((r.total - eager.total) / GiB, 2) == 0.14 and eager.total <= 1.5 * e.total


# -- (b) the refusal ---------------------------------------------------------------------------------------------------
def test_memory_budget_refusal_names_the_settings(llama):
    """(b) Where the parts still to build and SGLang's runtime reserve exceed the free memory, the start stops with
    the settings to change and how short it is; where they fit it passes. Free at the check: what SGLang left after
    its KV pool less the start-up state and HYBRID's fixed buffers, already built then."""
    p = llama["padded"]
    free = llama["free"] - (p.from_free - p.to_build)
    with pytest.raises(mb.HybridMemoryError) as err:
        mb.check_fits(p, free, llama["reserve"], total_memory=H200_MIB * MiB, mem_fraction_static=0.905)
    msg = str(err.value)
    for name in ("verify_widths", "draft_depths", "SGLANG_HYBRID_VERIFY_WIDTHS",
                 "SGLANG_HYBRID_DRAFT_DEPTHS='[]': one depth, even with a draft table given or measured", "cost_table",
                 "SGLANG_HYBRID_RAGGED_VERIFY=on", "--cuda-graph-max-bs", "--context-length", "--mem-fraction-static",
                 "short"):
        assert name in msg, name
    assert "building the 8 parts after the start-up state's" in msg
    assert "a verify part per verify width (6 here, the dearest still to build 2.27 GiB)" in msg
    assert "a draft part per EAGLE depth (4 here, the dearest still to build 0.58 GiB)" in msg
    short = p.to_build + llama["reserve"] - free
    assert short == p.from_free + llama["reserve"] - llama["free"] > 0       # the bench's criterion: the same shortfall
    assert f"at most {0.905 - short / (H200_MIB * MiB):.3f}" in msg
    mb.check_fits(p, p.to_build + llama["reserve"], llama["reserve"])
    mb.check_fits(llama["eagle"], llama["free"], llama["reserve"])
    r = llama["ragged"]
    mb.check_fits(r, llama["free"] - (r.from_free - r.to_build), llama["reserve"])
    with pytest.raises(mb.HybridMemoryError) as err:             # already one verify part: ragged is no remedy there
        mb.check_fits(r, 0, llama["reserve"])
    assert "RAGGED_VERIFY" not in str(err.value) and "draft_depths" in str(err.value)


def test_memory_budget_fit_widths_keeps_the_required_and_adds_extras_in_order_while_they_fit():
    """``fit_widths`` by hand, on a predicate that allows at most ``cap`` widths summing to at most ``room``: the
    required widths are kept whatever they need, each extra in order is added if the set still fits, and one that
    does not is skipped while a later, cheaper one is still tried."""
    def fits(cap, room):
        return lambda ws: len(ws) <= cap and sum(ws) <= room
    assert mb.fit_widths(fits(4, 100), (5, 13), (8, 4)) == (4, 5, 8, 13)
    assert mb.fit_widths(fits(3, 100), (13, 5), (8, 4)) == (5, 8, 13)           # sorted; 4 is one width too many
    assert mb.fit_widths(fits(4, 25), (5, 13), (8, 4)) == (4, 5, 13)            # 8 too dear, 4 still fits
    assert mb.fit_widths(fits(1, 0), (5, 13), (8, 4)) == (5, 13)                # the required ones stay regardless
    assert mb.fit_widths(fits(9, 100), (5, 13), (5, 8, 8)) == (5, 8, 13)        # repeats add nothing
    assert mb.fit_widths(fits(9, 100), (5, 13), ()) == (5, 13)


def test_memory_budget_default_launch_fits_widths_at_start_on_gpu(measured):
    """``fit_widths_at_start`` on the stand-in worker (Llama-8B shapes, 128 requests, a 131,072 context, 8,192-token
    chunked prefill, one depth; the verify parts after SGLang's start-up state, with the runtime reserve and the
    runtime activation reserve, 2.79 GiB here, against the free memory): with 15 GiB free all four widths; with 9 GiB
    EAGLE's width 5, the full tree 13 and the first extra 8, leaving out 4, which would need more, named in the log
    line; with 7 GiB only the required two (8 and 4 each too dear). The line names both reserves."""
    reserve = measured["reserve"]
    for gib, kept, left in (("15.0", [4, 5, 8, 13], []), ("9.0", [5, 8, 13], [4]), ("7.0", [5, 13], [8, 4])):
        f = measured["fit"][gib]
        free = float(gib) * GiB
        assert round(f["activations"] / GiB, 2) == 2.79
        need = {k: v + reserve + f["activations"] for k, v in f["need"].items()}
        assert f["kept"] == kept, f
        fits = {k: n <= free for k, n in need.items()}
        assert fits["5,8,13"] == (8 in kept) and fits["4,5,8,13"] == (4 in kept and 8 in kept), need
        assert f["line"].startswith(f"HYBRID: verify widths {kept}"), f["line"]
        assert f"fit {gib[:-2]}.00 GiB free with 1.62 GiB kept for the runtime and 2.79 GiB for its activations at " \
               "width 13 x 128 requests: sampled verify 1.67 GiB" in f["line"], f["line"]
        assert "chunked prefill 1.12 GiB" in f["line"], f["line"]
        assert ("left out: " in f["line"]) == bool(left), f["line"]
        for w in left:
            assert f"{w} (would need" in f["line"], f["line"]


def test_memory_budget_worker_check_logs_on_cpu_and_refuses_on_gpu(measured):
    """(b) ``check_start`` on a stand-in worker with SGLang's attribute layout (Llama-8B shapes, 24 states): on the
    CPU engine one log line and no refusal however large; on a GPU with 8 GiB free the start stops, naming the
    settings; a single state fits there."""
    cpu = measured["cpu"]
    assert cpu["states"] == 24 and cpu["total"] > 14 * GiB
    assert cpu["line"].startswith("HYBRID start-up memory: 24 runtime states [(4, 13), (1, 2)")
    assert "from draft parts at depths [4, 1, 2, 3] and verify parts at widths [13, 2, 4, 6, 7, 8]" in cpu["line"]
    assert "15 graph sets (525 graphs)" in cpu["line"] and "plain EAGLE at the same settings" in cpu["line"]
    assert "free" not in cpu["line"]
    cuda = measured["cuda"]
    assert cuda["raised"] and "verify_widths" in cuda["raised"] and "--mem-fraction-static" in cuda["raised"]
    assert "against 8.00 GiB free" in cuda["line"]
    assert measured["cuda_one_state"] < 1 * GiB               # nothing left to build but the workspace


def test_memory_budget_captured_batch_sizes_from_the_draft_runners_when_the_target_captured_none():
    """``deployment_of``'s captured batch sizes: SGLang's target verify runner's list; where SGLang captured no
    target verify graphs (its eager runner stands in: ragged verify in HYBRID's token-tier graphs) the draft runners'
    list, which SGLang captures from the same server arguments; none without graphs anywhere."""
    from types import SimpleNamespace as NS

    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    eager = EagerRunner.__new__(EagerRunner)
    target = NS(decode_cuda_graph_runner=NS(capture_bs=[1, 2, 4]))
    draft = NS(cuda_graph_runner=NS(capture_bs=[1, 2]), cuda_graph_runner_for_draft_extend=NS(capture_bs=[1, 2]))
    assert mb._captured_bs(NS(_draft_worker=draft), target) == (1, 2, 4)
    target.decode_cuda_graph_runner = eager
    assert mb._captured_bs(NS(_draft_worker=draft), target) == (1, 2)
    depth1 = NS(cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=NS(capture_bs=[1, 2, 8]))
    assert mb._captured_bs(NS(_draft_worker=depth1), target) == (1, 2, 8)        # one EAGLE step: no draft decode
    assert mb._captured_bs(NS(_draft_worker=NS(cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=None)),
                           NS(decode_cuda_graph_runner=None)) == ()


def test_memory_budget_llama8b_h200_ragged_triton_token_tier_graphs(llama):
    """(a) The same deployment on SGLang's Triton backend with ragged verify in HYBRID's token-tier CUDA graphs (TP 1,
    ``ragged_verify=on``): SGLang captures no target verify graph set (``HybridWorkerV2._skip_target_verify_capture``),
    HYBRID's plan buffers and graphs count instead, and the draft parts at depths 2 and 3 run in the start-up depth's
    draft backend (``shared_draft_steps``). Against plain EAGLE on Triton (3.23 GiB): both cost tables 4.63 GiB
    (1.43x, 5 graph sets: the memory and graph set targets both met), the same as one state with no cost table
    given (the shallower depths add only their draft graph runners' input buffers, KBs); it fits the 13.34 GiB SGLang
    leaves. Without the shared draft steps the shallower depths would add 0.68 GiB (5.31 GiB, 1.64x)."""
    from dataclasses import replace

    case = BM.llama8b_h200(RUNNING, CONTEXT)
    triton = replace(case, dep=replace(case.dep, attention_backend="triton"))
    e = mb.eagle_budget(triton.dep, STEPS)
    both = BM.hybrid_budget(triton, BM.hybrid_settings(), ragged=True, tier_graphs=True)
    one = BM.hybrid_budget(triton, BM.hybrid_settings(False, False), ragged=True, tier_graphs=True)
    gib = {k: round(b.total / GiB, 2) for k, b in (("eagle", e), ("both", both), ("one", one))}
    assert gib == {"eagle": 3.23, "both": 4.63, "one": 4.63}
    assert both.items["verify"] == one.items["verify"] == 0 and e.items["verify"] > 0
    assert both.items["draft decode"] == one.items["draft decode"] == e.items["draft decode"]
    assert 0 < both.total - one.total < MiB                    # the depths' draft graph runners' input buffers
    assert (round(both.total / e.total, 2), round(one.total / e.total, 2)) == (1.43, 1.43)
    assert both.total <= 1.5 * e.total and both.graph_sets <= 2 * e.graph_sets          # the targets: MET
    unshared = sum(mb._draft_graphs(triton.dep, d) for d in (2, 3))
    assert round((both.total + unshared) / GiB, 2) == 5.31 and round(unshared / GiB, 2) == 0.68
    assert (both.graph_sets, one.graph_sets, e.graph_sets) == (5, 3, 3)
    assert all(b.from_free + triton.reserve <= triton.free for b in (both, one))
    with pytest.raises(ValueError, match="ragged=True"):
        BM.hybrid_budget(case, BM.hybrid_settings(), tier_graphs=True)
