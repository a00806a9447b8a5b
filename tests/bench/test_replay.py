"""Replay benchmark mechanics (the bench/replay/ package, bench/cost_tables/roofline.py) on tiny traces."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench.replay import policies as P
from bench.replay import (
    costs as replay_costs,
    drafts as replay_drafts,
    report as replay_report,
    sim as replay_sim,
    traces as replay_traces,
)
from bench.cost_tables import roofline
from tests.helpers.replay_traces import linear_cost, one_request_trace


class ExactDrafts(P.Policy):
    """Drafts the true next k tokens (an oracle) with no model cost: accepted must be k until the output ends."""

    name = "oracle"
    label = "oracle"

    def __init__(self, k):
        self.k = k

    def propose(self, view):
        toks = view.drafts.targets(view.req, view.pos, self.k)
        return P.Proposal(np.where(toks >= 0, toks, -1), P.chain_parents_np(len(view.req), self.k), 0)


def test_perfect_drafts_accept_k_and_emit_k_plus_one():
    bank = replay_drafts.DraftBank(one_request_trace(L=30, k=4), k=4)
    res = replay_sim.simulate(P.EagleFixed(4), bank, [0], batch=1, cost=linear_cost(), lockstep_start=True)
    # stream = the request twice (max(2 B, 1) requests); 30 = 6 steps x 5 tokens each time
    assert res.tokens == 60
    assert res.steps == 12
    assert res.accepted_per_step == 4.0
    assert res.tokens_per_step == 5.0


def test_oracle_at_end_of_output_caps_emitted_tokens():
    bank = replay_drafts.DraftBank(one_request_trace(L=7, k=4), k=4)
    res = replay_sim.simulate(ExactDrafts(4), bank, [0], batch=1, cost=linear_cost(), lockstep_start=True)
    # 7 tokens: one step of 5 (4 accepted + bonus), then 2 left: the second step emits exactly 2
    assert res.steps == 4 and res.tokens == 14
    assert res.accepted == 2 * (4 + 1)


def test_no_speculation_one_token_per_step_and_throughput_by_hand():
    reqs = one_request_trace(L=25) + one_request_trace(L=25)
    reqs[1].id = "r1"
    bank = replay_drafts.DraftBank(reqs, k=4)
    cost = linear_cost(base=2.0, per_token=0.5, draft=0.3)
    res = replay_sim.simulate(P.NoSpeculation(), bank, [0, 1], batch=2, cost=cost, lockstep_start=True)
    assert res.tokens_per_step == 1.0 and res.accepted == 0
    # stream of 4 requests (2 permutations), 2 slots, 25 tokens each: 50 steps, each verifying n = 2 tokens
    assert res.steps == 50 and res.tokens == 100
    t_step = 2.0 + 0.5 * 2
    assert res.seconds == pytest.approx(50 * t_step)
    assert res.tok_per_s == pytest.approx(100 / (50 * t_step))


def test_first_wave_starts_staggered_and_the_run_stops_at_the_third_finish_by_hand():
    """The default start: the first B requests at seeded uniform phases of their outputs (a server's steady state),
    the refills from their first token. No speculation over two requests of 25 and 40 tokens at batch 2: the stream
    holds 4 (two permutations), so the run stops at the first finish after two refills, every step emitting 2."""
    reqs = one_request_trace(L=25) + one_request_trace(L=40)
    reqs[1].id = "r1"
    bank = replay_drafts.DraftBank(reqs, k=4)
    seed = 7
    stream = replay_sim.request_stream([0, 1], 2, seed)
    start = replay_sim.start_positions(bank.lengths[stream[:2]], seed)
    assert ((start > 0) & (start < bank.lengths[stream[:2]])).all()       # both inside their outputs, not at 0
    # slot finish times by hand: each slot runs its request's remaining tokens, then the next of the stream from 0
    free_at = [int(bank.lengths[stream[i]] - start[i]) for i in range(2)]
    nxt, steps = 2, None
    while steps is None:
        slot = min(range(2), key=lambda i: (free_at[i], i))
        if nxt == len(stream):
            steps = free_at[slot]
        else:
            free_at[slot] += int(bank.lengths[stream[nxt]])
            nxt += 1
    res = replay_sim.simulate(P.NoSpeculation(), bank, [0, 1], batch=2, cost=linear_cost(), seed=seed)
    assert res.steps == steps and res.tokens == 2 * steps
    # a workload of one request, replicated over the batch, starts at many phases, not in lockstep
    many = replay_sim.start_positions(np.full(64, 128), seed=0)
    assert len(set(many.tolist())) > 32
    assert (replay_sim.start_positions(np.full(64, 128), seed=0) == many).all()      # seeded
    assert (replay_sim.start_positions(np.full(64, 128), seed=1) != many).any()
    with pytest.raises(ValueError, match="at least one output token"):
        replay_sim.start_positions(np.array([3, 0]), seed=0)


def test_fixed_eagle_pays_verified_tokens_and_draft_steps():
    bank = replay_drafts.DraftBank(one_request_trace(L=30, k=4, eagle_right=False), k=4)
    cost = linear_cost(base=1.0, per_token=0.1, draft=0.05)
    res = replay_sim.simulate(P.EagleFixed(3), bank, [0], batch=1, cost=cost, lockstep_start=True)
    # every draft is wrong: 1 token per step, each step verifies 1 + 3 tokens and runs 3 draft forwards (SGLang: the
    # draft-extend + 2 draft decodes)
    assert res.accepted == 0 and res.steps == 60
    assert res.seconds == pytest.approx(60 * ((1.0 + 0.1 * 4) + 3 * 0.05))
    assert res.verified_per_step == 3.0


def test_greedy_tree_accept_takes_deepest_path_and_respects_parents():
    # root children: node0 'a' (wrong), node1 'x' (right); node2 'y' under node1 (right); node3 'z' under node0
    tokens = np.array([[7, 1, 2, 3, -1]])
    parents = np.array([[-1, -1, 1, 0, -1]])
    targets = np.array([[1, 2, 3, 9, 9]])
    assert replay_sim.greedy_tree_accept(tokens, parents, targets).tolist() == [2]
    # a correct token under a rejected parent is not accepted
    tokens2 = np.array([[7, 2, -1]])
    parents2 = np.array([[-1, 0, -1]])
    assert replay_sim.greedy_tree_accept(tokens2, parents2, np.array([[1, 2, 3]])).tolist() == [0]
    with pytest.raises(ValueError, match="parents"):
        replay_sim.greedy_tree_accept(np.array([[1, 2]]), np.array([[-1, 1]]), np.array([[1, 2]]))


def test_greedy_tree_accept_equals_brute_force_on_random_chains_and_trees():
    """Chains take a shortcut (the run of leading matches); trees walk node by node: both equal a brute force that
    follows every drafted node's path to the root and keeps the deepest whose tokens all equal the targets."""
    def brute(tokens, parents, targets):
        out = []
        for tok, par, tgt in zip(tokens, parents, targets):
            best = 0
            for i in range(len(tok)):
                path, j = [], i
                while j >= 0:
                    path.append(j)
                    j = par[j]
                path.reverse()
                if all(tok[k] >= 0 and tok[k] == tgt[d] for d, k in enumerate(path)):
                    best = max(best, len(path))
            out.append(best)
        return out

    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(3000):
        b, n = int(rng.integers(1, 5)), int(rng.integers(1, 10))
        targets = rng.integers(0, 3, (b, n + 2))
        tokens = rng.integers(0, 3, (b, n))
        tokens[np.arange(n)[None] >= rng.integers(0, n + 1, b)[:, None]] = -1        # chains of any length
        parents = np.tile(np.arange(-1, n - 1), (b, 1))
        if rng.random() < 0.4:                                                      # a tree instead
            for i in range(1, n):
                parents[:, i] = rng.integers(-1, i, b)
        kinds.add(bool(((parents == np.arange(-1, n - 1)) | (tokens < 0)).all()))
        assert replay_sim.greedy_tree_accept(tokens, parents, targets).tolist() == brute(tokens, parents, targets)
    assert kinds == {True, False}


def _fake(policy, tok_s):
    return replay_sim.RunResult(policy, policy, "w", 4, "c", 1, int(tok_s), 1.0, 1, 0, 0, 1, 0, 0.0, 0.0)


def test_paper_layout_marks_targets_met_and_missed():
    res = {}
    for (w, b), (ch, me) in {("code", 4): (1.70, 1.80), ("code", 128): (1.10, 1.20),
                             ("chat", 4): (1.00, 1.02), ("chat", 128): (0.99, 1.00)}.items():
        res[("gpu", w, 0.0, b, "model_adaptive")] = _fake("model_adaptive", 1000)
        res[("gpu", w, 0.0, b, "hybrid_choose")] = _fake("hybrid_choose", 1000 * ch)
        res[("gpu", w, 0.0, b, "hybrid_merge")] = _fake("hybrid_merge", 1000 * me)
    text, verdicts = replay_report.paper_layout(res, "gpu", [0.0], [4, 128])
    got = {name.split(": ", 1)[1]: met for name, met, _ in verdicts}
    assert got["code editing, batch 4: HYBRID choose / model-only >= 1.62x"] is True      # 1.70
    assert got["code editing, batch 4: HYBRID merge / model-only >= 1.62x"] is True       # 1.80
    assert got["code editing, batch 128: HYBRID choose / model-only >= 1.27x"] is False   # 1.10
    assert got["code editing, batch 128: HYBRID merge / model-only >= 1.27x"] is False    # 1.20
    assert got["chat, temperature 0: HYBRID choose / model-only >= 1.00x"] is False       # worst batch 0.99
    assert got["chat, temperature 0: HYBRID merge / model-only >= 1.00x"] is True         # 1.02, 1.00
    assert "1.10-1.62x" in text and "MISSED" in text
    mc = replay_report.merge_vs_choose(res, "gpu")
    assert mc[1] is True
    res[("gpu", "chat", 0.0, 4, "hybrid_merge")] = _fake("hybrid_merge", 990)
    mc = replay_report.merge_vs_choose(res, "gpu")
    assert mc[1] is False and "B=4" in mc[2] and "0.990" in mc[2]


def test_prompt_lookup_longest_ngram_earliest_occurrence():
    ctx = np.array([5, 1, 2, 9, 1, 2, 3, 8, 1, 2, 3, 4, 0, 1, 2, 3])
    # suffix [1,2,3] (n=3) first occurs at index 4 -> copy [8, 1, 2]; n=2 would have matched earlier (index 1)
    assert replay_drafts.prompt_lookup(ctx, 2, 5, 3).tolist() == [8, 1, 2]
    assert replay_drafts.prompt_lookup(np.array([1, 2, 3, 4]), 2, 5, 3).tolist() == []
    assert replay_drafts.prompt_lookup(np.array([1, 2, 7, 1, 2]), 2, 5, 8).tolist() == [7, 1, 2]


def test_trace_roundtrip_and_bad_input(tmp_path):
    tr = replay_traces.synthetic_trace(n_code=2, n_chat=1, k=3, out_len=12, seed=3)
    path = tmp_path / "t.jsonl"
    replay_traces.write_trace(tr, path)
    back = replay_traces.read_trace(path)
    assert back.eagle_k == 3 and len(back.requests) == 3
    for a, b in zip(tr.requests, back.requests):
        assert np.array_equal(a.output, b.output) and np.array_equal(a.eagle_tokens, b.eagle_tokens)
        assert np.allclose(a.eagle_probs, b.eagle_probs, atol=1e-5)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["eagle_tokens"] = bad["eagle_tokens"][:-1]
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(replay_traces.TraceError, match="eagle_tokens"):
        replay_traces.read_trace(tmp_path / "bad.jsonl")
    (tmp_path / "hdr.jsonl").write_text(json.dumps({"format": "other", "version": 1}) + "\n")
    with pytest.raises(replay_traces.TraceError, match="format"):
        replay_traces.read_trace(tmp_path / "hdr.jsonl")
    with pytest.raises(FileNotFoundError):
        replay_traces.read_trace(tmp_path / "missing.jsonl")
    # recorded EAGLE alternatives ([L, k, M] per request) survive the round trip as arrays of that shape
    rng = np.random.default_rng(0)
    reqs = [dataclasses.replace(r, eagle_alt_tokens=rng.integers(0, 500, (len(r.output), 3, 2)).astype(np.int32),
                                eagle_alt_probs=rng.random((len(r.output), 3, 2)).astype(np.float32))
            for r in tr.requests]
    alt = replay_traces.Trace(dataclasses.replace(tr.header, eagle_alternatives=2), reqs)
    replay_traces.write_trace(alt, tmp_path / "alt.jsonl")
    back = replay_traces.read_trace(tmp_path / "alt.jsonl")
    assert back.eagle_alternatives == 2
    for a, b in zip(reqs, back.requests):
        assert b.eagle_alt_tokens.shape == (len(a.output), 3, 2)
        assert np.array_equal(a.eagle_alt_tokens, b.eagle_alt_tokens)
        assert np.allclose(a.eagle_alt_probs, b.eagle_alt_probs, atol=1e-5)


def test_roofline_is_memory_bound_then_compute_bound_and_states_assumptions():
    hard = roofline.Roofline(knee_p=None)
    t4 = [hard.target_step_s(n, 4) for n in (4, 8, 36)]
    assert t4[0] == t4[1] == t4[2]  # hard max, small batch: weights dominate, extra verified tokens are free
    roof = roofline.Roofline()
    t128 = [roof.target_step_s(n, 128) for n in (128, 640, 1152, 2176)]
    assert all(a <= b for a, b in zip(t128, t128[1:])) and t128[-1] > 1.5 * t128[0]
    text = "\n".join(roof.assumptions())
    for needle in ("4.8 TB/s", "989 TFLOP/s", "16.06 GB", str(roof.context_tokens), "CUDA-graph"):
        assert needle in text
    with pytest.raises(ValueError):
        roof.target_step_s(3, 4)


def test_roofline_smooth_knee_charges_every_token_and_stays_between_max_and_sum():
    smooth, hard = roofline.Roofline(), roofline.Roofline(knee_p=None)
    assert smooth.knee_p == 3.0     # the default: the smooth knee
    t = [smooth.target_step_s(n, 4) for n in range(4, 200, 8)]
    assert all(a < b for a, b in zip(t, t[1:]))   # no verified token is free, even at batch 4
    # the figure the review quoted: a 29-token verify per request at batch 4 costs about 1.14x a plain step
    assert smooth.target_step_s(4 * 29, 4) / smooth.target_step_s(4, 4) == pytest.approx(1.136, abs=0.002)
    for n, r in ((4, 4), (116, 4), (640, 128), (2176, 128)):
        t_mem_flop_sum = hard.target_step_s(n, r) - hard.step_overhead_s
        got = smooth.target_step_s(n, r) - smooth.step_overhead_s
        assert t_mem_flop_sum - 1e-12 <= got <= 2 * t_mem_flop_sum   # max <= p-norm <= sum (<= 2 max)
    assert "smooth knee, p-norm p=3" in "\n".join(smooth.assumptions())
    assert "hard max" in "\n".join(hard.assumptions())


def test_roofline_charges_the_batch_real_contexts():
    roof = roofline.Roofline()
    base = roof.target_step_s(32, 4)
    assert roof.target_step_s(32, 4, 4 * roof.context_tokens) == pytest.approx(base)
    longer = roof.target_step_s(32, 4, 4 * 4042)      # the code prompts' median context
    assert longer > base
    # the KV bytes it adds: 4 x (4042 - 2048) tokens of 128 KiB at the achieved bandwidth (memory-bound regime)
    extra = 4 * (4042 - 2048) * roof.kv_bytes_per_token / (roof.hbm_bytes_per_s * roof.hbm_efficiency)
    assert extra * 0.9 < longer - base < extra * 1.1
    assert roof.draft_step_s(4, 4 * 4042) > roof.draft_step_s(4)
    spec = replay_costs.gpu_cost_spec((4,), roof.context_tokens, max_width=3)
    cost = spec.for_batch(4)
    assert cost.step_time(8) == pytest.approx(roof.target_step_s(8, 4))
    assert cost.step_time(8, 4 * 4042) == pytest.approx(roof.target_step_s(8, 4, 4 * 4042))
    assert cost.draft_time(4 * 4042) == pytest.approx(roof.draft_step_s(4, 4 * 4042))
    assert [s.name for s in replay_costs.cost_specs(["gpu", "gpu-hardmax", "gpu-unpadded"], (4,), 2048)] == [
        "gpu", "gpu-hardmax", "gpu-unpadded"]
    with pytest.raises(ValueError, match="unknown GPU cost variant"):
        replay_costs.gpu_cost_spec((4,), 2048, "gpu-smooth")


def test_cost_spec_loading(tmp_path):
    doc = roofline.build_tables(roofline.Roofline(), (4,), max_width=3)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    spec = replay_costs.load_cost_spec(p)
    assert spec.for_batch(4).step_time(4) == pytest.approx(roofline.Roofline().target_step_s(4, 4))
    with pytest.raises(ValueError, match="no table for batch 32"):
        spec.for_batch(32)
    (tmp_path / "x.json").write_text(json.dumps({"format": "nope"}))
    with pytest.raises(ValueError, match="unknown format"):
        replay_costs.load_cost_spec(tmp_path / "x.json")


def test_model_only_adaptive_at_zero_price_verifies_the_whole_chain():
    core = P._Core()
    trace = replay_traces.synthetic_trace(n_code=1, n_chat=2, k=4, out_len=40, seed=5)
    bank = replay_drafts.DraftBank(trace.requests, k=4)
    flat = linear_cost(base=1.0, per_token=0.0, draft=0.0)  # flat cost: the price is 0, verify everything useful
    rng = np.random.default_rng(0)
    req = np.array([0, 1, 2])
    for _ in range(5):
        pos = rng.integers(0, 39, size=3)
        view = P.StepView(req, pos, bank.roots(req, pos), bank, flat.tables, 3)
        ad = P.ModelOnlyAdaptive(4, core).propose(view)
        fx = P.EagleFixed(4).propose(view)
        assert ad.model_steps == 4
        assert core.torch.allclose(core.torch.tensor(ad.tokens), core.torch.tensor(fx.tokens))


def test_hybrid_policies_call_the_core_and_merge_at_zero_price_contains_both_chains():
    core = P._Core()
    assert core.ngram_cal is not None    # the shipped n-gram calibration loads
    trace = replay_traces.synthetic_trace(n_code=2, n_chat=2, k=4, out_len=40, seed=7)
    bank = replay_drafts.DraftBank(trace.requests, k=4)
    flat = linear_cost(base=1.0, per_token=0.0, draft=0.0)
    choose, merge = P.Hybrid("choose", 4, 4, core), P.Hybrid("merge", 4, 8, core)
    rng = np.random.default_rng(1)
    req = np.array([0, 1, 2, 3])
    for _ in range(6):
        pos = rng.integers(0, 39, size=4)
        view = P.StepView(req, pos, bank.roots(req, pos), bank, flat.tables, 4)
        c, m = choose.propose(view), merge.propose(view)
        assert c.model_steps == m.model_steps == 4  # both run the EAGLE drafter every step (k forwards)
        tgt = bank.targets(req, pos, 8)
        acc_c = replay_sim.greedy_tree_accept(c.tokens, c.parents, tgt)
        acc_m = replay_sim.greedy_tree_accept(m.tokens, m.parents, tgt)
        # at price 0 with room for both chains, the merged tree holds both candidates, so it accepts at least as much
        assert (acc_m >= acc_c).all()
        ng_toks, ng_len = bank.chain("ngram", req, pos, 4)
        e_toks, _ = bank.eagle(req, pos, 4)
        for b in range(4):
            got = set(map(int, m.tokens[b][m.tokens[b] >= 0]))
            assert set(map(int, ng_toks[b][: ng_len[b]])) <= got and set(map(int, e_toks[b])) <= got


def test_code_edit_prompts_extend_without_changing_the_first_ones():
    """Trace recording's code prompts: asking for more appends (the outputs cache and the split into training and
    held-out requests key on the first ones), ids are unique, and every stdlib file is a held-out one (every 10th
    file, which the EAGLE head's training excludes)."""
    from bench.replay.record import code_edit_prompts
    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference.corpus import stdlib_python_files

    many = code_edit_prompts(40)
    assert len(many) > 10
    for k in (1, 3, 10, len(many) - 1):
        assert [(p.id, p.text) for p in code_edit_prompts(k)] == [(p.id, p.text) for p in many[:k]]
    assert len({p.id for p in many}) == len(many)
    assert [p.id for p in many[:len(PR.CODE_EDITS)]] == [p.id for p in PR.CODE_EDITS]
    held = {f.name for f in stdlib_python_files()[::10]}
    for p in many[len(PR.CODE_EDITS):]:
        assert p.workload == "code" and p.text.split("`")[1] in held, p.id


def test_changed_line_starts_names_the_inserted_and_replaced_lines():
    from bench.data import changed_line_starts

    old = "a = 1\nb = 2\nc = 3\n"
    new = "a = 1\nb = 20\nc = 3\nd = 4\n\n"
    starts = changed_line_starts(old, new)
    assert [new[s:].split("\n", 1)[0] for s in starts] == ["b = 20", "d = 4"]   # blank lines are not edits


def test_edit_dense_windows_each_hold_a_changed_line_and_copy_heavy_ones_mostly_do_not():
    """The edit-dense workload (releases further apart): every window's output holds the first token of a line that
    changed between the releases, so few are verbatim runs of their prompt (a moved line can still be one); the
    copy-heavy workload's windows mostly are. The workload measures what the copy-heavy one hides."""
    from bench import data
    from bench.replay import synth as replay_synth

    dense = data.code_edit_windows(12, seed=3, out_tokens=64, edit_dense=True)
    pairs = {f"code:{p[0]}:{p[3]}": p for p in data.code_edit_pairs(releases=tuple(data.EDIT_DENSE_RELEASES))}
    for r in dense:
        assert r.workload == "code-edit"
        key, cut = r.id.rsplit("@", 1)
        _, _, _, _, a, b = pairs[key]
        firsts = {len(data.encode(b[:c])) for c in data.changed_line_starts(a, b)}
        assert any(int(cut) <= t < int(cut) + len(r.output) for t in firsts), r.id
    assert sum(replay_synth.verbatim_in_prompt(r.prompt, r.output) for r in dense) <= 3
    copy = data.code_edit_windows(12, seed=3, out_tokens=64)
    assert sum(replay_synth.verbatim_in_prompt(r.prompt, r.output) for r in copy) >= 6


def test_measured_table_prices_tree_draft_forwards_as_a_wider_batch():
    """A per-batch table (the device kit's H200 measurement) prices an EAGLE tree's draft forward over ``topk`` beams
    per request as its own draft step at ``requests x topk`` sequences, interpolated between its batch sizes and along
    the last segment past them; a one-table file (the core's format) has no draft step by batch and refuses."""
    path = Path(__file__).resolve().parents[2] / "bench" / "cost_tables" / "h200_measured_compact.json"
    doc = json.loads(path.read_text())
    draft = {int(b): t["draft_step_seconds"] for b, t in doc["tables"].items()}
    spec = replay_costs.load_cost_spec(path)
    assert spec.kind == "measured"
    assert spec.for_batch(32).draft_time(branches=4) == pytest.approx(draft[128])
    assert spec.for_batch(16).draft_time(branches=2) == pytest.approx(draft[32])
    assert spec.for_batch(4).draft_time(branches=2) == pytest.approx(draft[4] + (draft[16] - draft[4]) * 4 / 12)
    slope = (draft[128] - draft[64]) / 64
    assert spec.for_batch(128).draft_time(branches=8) == pytest.approx(draft[128] + slope * (1024 - 128))
    assert spec.for_batch(32).draft_time() == pytest.approx(draft[32])
    one = replay_costs.CostSpec("one", "user", [], {0: replay_costs._batch_cost([1, 64], [0.01, 0.02], 1e-3)})
    with pytest.raises(ValueError, match="topk > 1"):
        one.for_batch(4).draft_time(branches=2)


def test_launch_cost_defaults_are_the_committed_h200_measurement():
    """The replay's per-launch decision costs are read off the device kit's committed H200 run
    (``docs/device_run/selection*.json``, the runs that timed the host by wall clock): host = the median eager host time
    per call over every measured shape and run, GPU = the median graph replay of the widest configuration, each over
    the fused step's 7 launches. A new device run committed without updating ``LaunchCost`` fails here."""
    import json
    import statistics

    from bench.replay.host import LaunchCost

    runs = sorted((Path(__file__).resolve().parents[2] / "docs" / "device_run").glob("selection*.json"))
    rows = [r for f in runs for r in json.loads(f.read_text())["results"] if "eager_host_ms" in r]
    assert rows and all(r["replay_vs_eager_cpu"] == "equal" for r in rows)
    widest = max(r["W"] for r in rows)
    host_us = statistics.median(r["eager_host_ms"] for r in rows) / 7 * 1e3
    gpu_us = statistics.median(r["graph_ms"] for r in rows if r["W"] == widest) / 7 * 1e3
    assert LaunchCost().host_us == pytest.approx(host_us, abs=1.0)
    assert LaunchCost().gpu_us == pytest.approx(gpu_us, abs=0.5)
