"""The realistic replay's engine mechanics (bench/replay/engine.py, replay_synth.py, replay_realistic.py) against
hand-computed cases: width lag, padded verify width, draft-forward count, late n-gram alignment, the simulated
drafter's calibration, the bootstrap."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch
import pytest

from bench.replay import policies as P
from bench.replay import (
    costs as replay_costs,
    drafts as replay_drafts,
    engine as replay_engine,
    realistic as replay_realistic,
    sim as replay_sim,
    synth as replay_synth,
)
from tests.helpers.replay_traces import linear_cost, one_request_trace


def test_draft_forwards_as_sglang_runs_them():
    assert [P.draft_forwards(k) for k in (0, 1, 3, 4, 8)] == [0, 1, 3, 4, 8]


@pytest.mark.parametrize("lag,expected", [(1, 1.5 + 19 * 1.2), (2, 2 * 1.5 + 18 * 1.2)])
def test_as_built_width_lag_and_padded_verify_cost_by_hand(lag, expected):
    """Model-only adaptive K=4 in the as-built engine: buckets (2, 4, 5), the first `lag` steps verify at the start
    width 5 (the narrowest bucket holding a 4-token chain and its root), then at the width the previous decision
    chose. Every draft is wrong with confidence 0.1, so with T(n) = 1 + 0.1 n the padded goodput
    (1 + sum of survivals) / T(W) is highest at W = 2:
    G(2) = 1.1 / 1.2 > G(4) = 1.111 / 1.4 > G(5). One request of 10 tokens, streamed twice: 20 steps of 1 token.
    Seconds = (lag steps x T(5)) + (rest x T(2)) + 20 steps x 4 draft forwards x 0.05 (no n-gram: no host time)."""
    core = P._Core()
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=4, eagle_right=False), k=4)
    eng = replay_engine.EngineConfig(width_lag=lag)
    pol = replay_engine.EnginePolicy("m", "choose", 4, 4, core, eng, ngram=False)
    assert pol.widths == (2, 4, 5)
    res = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=0.05),
                              lockstep_start=True)
    assert res.steps == 20 and res.tokens == 20
    assert res.model_steps == 20 * 4
    assert res.seconds == pytest.approx(expected + 20 * 4 * 0.05)
    assert res.stats["width_counts"] == {5: lag, 2: 20 - lag}


def test_ideal_engine_verifies_ragged_and_has_no_lag():
    """Same case, ideal engine: ragged verify, the price keeps the nodes that raise goodput: the first (survival 0.1:
    1.1 / T(2) = 0.917 > 1 / T(1) = 0.909) but not the second (1.11 / T(3) = 0.854), so every step verifies the root
    + 1 node from step 0 on: 20 x (T(2) + 4 x 0.05)."""
    core = P._Core()
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=4, eagle_right=False), k=4)
    pol = replay_engine.EnginePolicy("m", "choose", 4, 4, core, replay_engine.EngineConfig.ideal(), ngram=False)
    res = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=0.05),
                              lockstep_start=True)
    assert res.steps == 20
    assert res.seconds == pytest.approx(20 * (1.2 + 4 * 0.05))
    assert res.verified_per_step == 1.0


@pytest.mark.parametrize("eagle_right,draft_s,depth", [(False, 0.5, 1), (True, 0.001, 4)])
def test_adaptive_depth_drafts_what_the_previous_step_chose(eagle_right, draft_s, depth):
    """HYBRID merge in the as-built engine with adaptive drafting (depths 1, 2, 3, 4): the first step drafts the full 4
    (nothing chosen yet), every later step the depth the previous decision chose, and is charged that many draft
    forwards. A wrong EAGLE chain (confidence 0.1) under dear draft forwards (0.5 s each, T(n) = 1 + 0.1 n) is cut to
    depth 1; a right one (0.9) under cheap forwards (1 ms) keeps depth 4."""
    core = P._Core()
    eng = replay_engine.EngineConfig(num_steps=4, ngram_k=4, n_nodes=8, width_lag=1)
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=4, eagle_right=eagle_right), k=4,
                                   ngram_width=eng.proposal_width)
    assert eng.depths == (1, 2, 3, 4) and eng.depth_lag == 1
    pol = replay_engine.EnginePolicy("h", "merge", 4, 8, core, eng)
    res = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=draft_s))
    counts = res.stats["depth_counts"]
    assert counts == ({4: 1, depth: res.steps - 1} if depth != 4 else {4: res.steps}), counts
    assert res.model_steps == 4 + depth * (res.steps - 1)
    fixed = replay_engine.EnginePolicy("h", "merge", 4, 8, core,
                                       replay_engine.EngineConfig(num_steps=4, ngram_k=4, n_nodes=8, width_lag=1,
                                                                  adaptive_depth=False))
    res_fixed = replay_sim.simulate(fixed, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1,
                                                                              draft=draft_s))
    assert res_fixed.model_steps == 4 * res_fixed.steps


@pytest.mark.parametrize("width_lag,overlap,per_step", [(1, None, 1.2 + 0.05 + 0.2), (2, None, 1.25),
                                                        (2, False, 1.2 + 0.05 + 0.2), (1, True, 1.25)])
def test_host_time_adds_without_overlap_and_hides_under_the_device_with_it(monkeypatch, width_lag, overlap, per_step):
    """n-gram-only HYBRID (no model draft: depth-1 chains that are always wrong), host path 0.2 s per step, device
    T(2) + 1 draft forward = 1.2 + 0.05: without overlap scheduling (lag 1) a step costs the sum 1.45, with it (lag 2)
    max(1.25, 0.2) = 1.25; ``host_overlap`` overrides the default. Every step after the start plan verifies width 2."""
    core = P._Core()
    monkeypatch.setattr(replay_engine, "host_seconds", lambda b: 0.2)
    eng = replay_engine.EngineConfig(num_steps=1, ngram_k=1, n_nodes=1, width_lag=width_lag, ngram_lag=width_lag - 1,
                                     host_overlap=overlap, adaptive_depth=False)
    assert eng.host_overlaps == (per_step == 1.25)
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=1, eagle_right=False), k=1,
                                   ngram_width=eng.proposal_width)
    pol = replay_engine.EnginePolicy("h", "merge", 1, 1, core, eng)
    assert pol.widths == (2,)
    res = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=0.05))
    assert res.seconds == pytest.approx(res.steps * per_step)
    # the same run charged alike for every drafter, wherever this engine puts its host work
    assert res.host_seconds["overlapped"].sum() == pytest.approx(res.steps * 1.25)
    assert res.host_seconds["added"].sum() == pytest.approx(res.steps * (1.2 + 0.05 + 0.2))


@pytest.mark.parametrize("width_lag,host_us", [(1, 1000.0), (2, 1000.0), (2, 2000.0)])
def test_decision_launches_are_charged_by_hand(monkeypatch, width_lag, host_us):
    """The as-built HYBRID step is charged the worker's count (``bench.step_launches``, counted for this
    configuration: no width or depth plan; counted once at ``LAUNCH_COUNT_BATCH`` requests, which the comparisons
    below check against counts at 1 or 2, for each path): fused launches at ``gpu_us`` on the device and ``host_us``
    on the host, the torch path's eager operators at ``op_gpu_us`` and ``op_host_us``; summed without overlap
    scheduling, max(device, host) with it (the torch path host-bound at 2 ms an operator, device-bound at 1 ms)."""
    from bench import step_launches
    from bench.replay.host import LaunchCost

    core = P._Core()
    monkeypatch.setattr(replay_engine, "host_seconds", lambda b: 0.2)
    eng = replay_engine.EngineConfig(num_steps=1, ngram_k=1, n_nodes=1, width_lag=width_lag,
                                     ngram_lag=width_lag - 1, adaptive_depth=False)
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=1, eagle_right=False), k=1,
                                   ngram_width=eng.proposal_width)
    pol = replay_engine.EnginePolicy("h", "merge", 1, 1, core, eng)
    n = step_launches.hybrid_launches(1, "merge", 1, 1, width_plan=False, depth_plan=False)
    # the fused path, the worker's default; counted at LAUNCH_COUNT_BATCH (4) requests, the same at 1
    assert pol.launches() == n <= step_launches.TARGET
    torch_eng = dataclasses.replace(eng, decision_kernels="torch")
    n_torch = replay_engine.EnginePolicy("t", "merge", 1, 1, core, torch_eng).launches()
    assert n_torch == step_launches.hybrid_launches(1, "merge", 1, 1, width_plan=False, depth_plan=False,
                                                    kernels="torch") > 100    # the torch path: hundreds of operators
    # the torch path is charged per eager operator, the fused path per launch, each at its own cost
    launch = LaunchCost(host_us=50 * host_us, gpu_us=3000.0, op_host_us=host_us, op_gpu_us=100.0)
    cost = linear_cost(base=1.0, per_token=0.1, draft=0.05, launch=launch)
    fused_pol = replay_engine.EnginePolicy("h", "merge", 1, 1, core, eng)
    for p, ops, launches in ((replay_engine.EnginePolicy("t", "merge", 1, 1, core, torch_eng), n_torch, 0),
                             (fused_pol, 0, n)):
        assert p.counts_eager_ops == (ops > 0)
        res = replay_sim.simulate(p, bank, [0], batch=1, cost=cost)
        device = 1.2 + 0.05 + ops * 100e-6 + launches * 3000e-6
        host = 0.2 + ops * host_us * 1e-6 + launches * 50 * host_us * 1e-6
        per_step = max(device, host) if width_lag == 2 else device + host
        assert res.seconds == pytest.approx(res.steps * per_step)
    # the ideal engine charges the fused step, whatever the policy; the as-built model-only baseline its own count
    ideal = replay_engine.EngineConfig.ideal(num_steps=1, ngram_k=1, n_nodes=1)
    fused = step_launches.hybrid_launches(1, "merge", 1, 1)
    assert replay_engine.EnginePolicy("i", "merge", 1, 1, core, ideal).launches() == fused <= step_launches.TARGET
    assert replay_engine.EnginePolicy("i", "choose", 1, 1, core, ideal, ngram=False).launches() == fused
    mo = replay_engine.EnginePolicy("m", "choose", 4, 4, core, replay_engine.EngineConfig(), ngram=False)
    # from 2 requests on (at 1 a `contiguous` finds its tensor contiguous and dispatches nothing: one operator fewer)
    assert mo.launches() == step_launches.model_only_launches(2, 4) < step_launches.hybrid_launches(1,
                                                                                                     kernels="torch")


def test_fused_launch_counter_serves_many_counts_and_names_a_failed_one():
    """The fused counts come from one interpreter subprocess (``step_launches._FusedCounter``): two counts in a row from
    the same process, a count that fails raises with the subprocess's own error and does not hang, and the next
    count starts a fresh counter."""
    from bench import step_launches

    counter = step_launches._FusedCounter()
    args = (1, "merge", 1, 1, False, False, 256, False, 0)      # hybrid_launches' arguments, kernels left out
    assert counter.count(args) == counter.count(args) == step_launches.hybrid_launches(*args[:-1], alternatives=0)
    first = counter.proc.pid
    with pytest.raises(RuntimeError, match="counting the fused step .*mode"):
        counter.count((1, "no-such-mode", 1, 1, False, False, 256, False, 0))
    assert counter.count(args) == step_launches.hybrid_launches(*args[:-1]) and counter.proc.pid != first


def test_model_free_baselines_pay_their_host_scan():
    """Our n-gram drafter alone pays the worker's measured host path (overlapped, as HYBRID's); vLLM's prompt lookup
    and Arctic's suffix decoding their measured per-request cost at each request's context, not overlapped
    (bench.replay.host)."""
    from bench.replay.host import PROMPT_LOOKUP_MEASURED, host_seconds, prompt_lookup_seconds

    assert prompt_lookup_seconds([1024, 8192]) == pytest.approx(11.7e-6 + 18.9e-6)
    assert prompt_lookup_seconds([4608]) == pytest.approx((11.7e-6 + 18.9e-6) / 2)
    assert prompt_lookup_seconds([10]) == pytest.approx(PROMPT_LOOKUP_MEASURED[0][1])
    bank = replay_drafts.DraftBank(one_request_trace(L=12, k=4), k=4)
    ctx = np.array([4000, 100])
    view = P.StepView(np.array([0, 0]), np.array([0, 3]), bank.roots(np.array([0, 0]), np.array([0, 3])), bank,
                      None, 2, context=ctx)
    ours = P.NgramOurs(4).propose(view)
    assert (ours.host_s, ours.host_overlaps) == (host_seconds(2), True)
    pld = P.PromptLookup(4, 2, 5).propose(view)
    assert (pld.host_s, pld.host_overlaps) == (pytest.approx(prompt_lookup_seconds(ctx)), False)
    from bench.replay.host import suffix_seconds

    assert suffix_seconds([1024, 8192]) == pytest.approx(8.0e-6 + 11.8e-6)
    assert P.SuffixDecoding(4).host(view) == (pytest.approx(suffix_seconds(ctx)), False)
    # vLLM's proposer charged after the step, as vLLM runs it, and also hidden under it, as HYBRID's host work is
    run = replay_sim.simulate(P.PromptLookup(4, 2, 5), bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1))
    assert run.seconds == pytest.approx(run.host_seconds["added"].sum())
    assert run.host_seconds["overlapped"].sum() < run.seconds
    blind = P.StepView(view.req, view.pos, view.root, bank, None, 2)      # no contexts: refused, never charged 0
    with pytest.raises(ValueError, match="StepView.context"):
        P.PromptLookup(4, 2, 5).propose(blind)


def test_host_time_interpolates_the_measured_host_path():
    assert replay_engine.host_seconds(1) == pytest.approx(0.114e-3)
    assert replay_engine.host_seconds(32) == pytest.approx(0.359e-3)
    assert replay_engine.host_seconds(128) == pytest.approx(0.819e-3)
    assert replay_engine.host_seconds(80) == pytest.approx(0.359e-3 + (0.819e-3 - 0.359e-3) * 48 / 96)
    eng = replay_engine.EngineConfig()
    assert (eng.max_depth, eng.proposal_width, eng.buckets()) == (8, 17, (2, 4, 6, 7, 8, 13))


def test_host_path_bench_measures_the_asked_proposal_width(capsys):
    """``bench.host_path --proposal-width`` feeds the drafter and buffers at that width (the worker's
    ``ngram_k + max_depth + 1``; the shipped 17 by default, the one the replay charges), and refuses a width < 1."""
    from bench import host_path

    assert host_path.SHIPPED_WIDTH == replay_engine.EngineConfig().proposal_width
    assert host_path.main(["--batches", "2", "--contexts", "256", "--steps", "4", "--proposal-width", "33"]) == 0
    out = capsys.readouterr().out
    assert "33 tokens proposed" in out and "not measured at these sizes" in out
    from bench.data import long_context_stream

    stream = long_context_stream(4 * 1024 + 40, seed=0)       # copy-heavy real text: proposals fill the width
    assert [host_path.measure(stream, 2, 1024, 4, 3, w)["longest_proposal"] for w in (17, 33)] == [17, 33]
    with pytest.raises(SystemExit):
        host_path.main(["--steps", "3"])
    with pytest.raises(SystemExit):
        host_path.main(["--proposal-width", "0"])


class _Bank:
    """Fake bank: output = 100, 101, ...; the n-gram proposal computed at position q is output[q : q + width]
    (a perfect copy) unless a row is overridden in `props` (tokens, length)."""

    def __init__(self, n_out=200, prompt_len=7, props=None):
        self.out = np.arange(100, 100 + n_out, dtype=np.int64)
        self.requests = [type("R", (), {"prompt": np.zeros(prompt_len, np.int32)})()] * 4
        self.props = props or {}

    def ngram_features(self, req, pos, k):
        b = len(req)
        toks = np.full((b, k), -1, np.int64)
        lens = np.zeros(b, np.int64)
        for i, p in enumerate(pos):
            t, n = self.props.get(int(p), (self.out[p:p + k], k))
            toks[i, :len(t)] = t[:k]
            lens[i] = min(n, k)
        f = {"tokens": toks, "lengths": lens, "depth": np.tile(np.arange(1, k + 1), (b, 1))}
        for name in ("match_len", "count", "total", "source"):
            f[name] = np.tile(np.arange(k), (b, 1)) + 1000 * (name == "count")
        return f

    def targets(self, req, pos, width):
        return np.stack([self.out[p:p + width] for p in pos])


def test_late_ngram_shift_keeps_a_full_chain_after_a_long_acceptance():
    """Proposal width 17, k = 8, lag 1. Step 0 at position 0 (admission): the fresh proposal, 8 tokens. Step 1 at
    position 13 (12 accepted + bonus): the proposal computed at 0, shifted by 13: 17 - 13 = 4 tokens left, starting at
    output[13]; its features shifted with it, depth renumbered from 1."""
    late = replay_engine.LateNgram(width=17, k=8, lag=1, context_lookup=False)
    late.reset(1)
    bank = _Bank()
    req = np.array([0])
    a0 = late.aligned(bank, req, np.array([0]))
    assert a0["lengths"].tolist() == [8] and a0["tokens"][0].tolist() == list(range(100, 108))
    a1 = late.aligned(bank, req, np.array([13]))
    assert a1["lengths"].tolist() == [4]
    assert a1["tokens"][0, :4].tolist() == [113, 114, 115, 116] and (a1["tokens"][0, 4:] == -1).all()
    assert a1["depth"][0, :4].tolist() == [1, 2, 3, 4]
    assert a1["match_len"][0, :4].tolist() == [13, 14, 15, 16]        # feature j of the shifted proposal = j + 13
    a2 = late.aligned(bank, req, np.array([18]))                      # proposal from 13, shift 5: 12 left, 8 used
    assert a2["lengths"].tolist() == [8] and a2["tokens"][0].tolist() == list(range(118, 126))
    assert late.stats["steps_with_match"] == 3 and late.stats["steps_with_aligned"] == 3
    assert late.stats["steps_with_full_chain"] == 2


def test_late_ngram_drops_a_proposal_whose_overlap_disagrees_or_is_used_up():
    out = np.arange(100, 300, dtype=np.int64)
    wrong = out[0:17].copy()
    wrong[2] = 7                                                      # the text did not follow the proposal
    bank = _Bank(props={0: (wrong, 17), 10: (out[10:13], 3)})
    late = replay_engine.LateNgram(width=17, k=8, lag=1, context_lookup=False)
    late.reset(1)
    req = np.array([0])
    late.aligned(bank, req, np.array([0]))
    assert late.aligned(bank, req, np.array([5]))["lengths"].tolist() == [0]     # overlap token 2 disagrees
    # a proposal shifted by 2 (overlap [102, 103] matches: token 2 of the wrong proposal lies past the overlap)
    late.reset(1)
    late.aligned(bank, req, np.array([0]))
    a = late.aligned(bank, req, np.array([2]))
    assert a["lengths"].tolist() == [8] and a["tokens"][0, 0] == 7
    # a 3-token proposal at 10 shifted by 3: nothing left
    late.reset(1)
    late.aligned(bank, req, np.array([10]))
    assert late.aligned(bank, req, np.array([13]))["lengths"].tolist() == [0]


def test_rows_without_an_aligned_proposal_take_the_device_prompt_lookup():
    """The output repeats a 4-token motif after 10 fresh tokens; the late proposal computed at 0 disagrees with the
    text, so alignment drops it, and the device prompt lookup (``context_lookup.lookup``, as the worker) copies from
    the earlier occurrence: at position 16 the committed tail is motif[0:2] (second occurrence), whose continuation
    after the first occurrence is out[12:16], the committed tokens, then the same again (the copy wraps at the root:
    k = 8 tokens)."""
    motif = [500, 501, 502, 503]
    out = np.concatenate([np.arange(100, 110), motif, motif, np.arange(200, 260)]).astype(np.int64)
    bank = _Bank(props={0: (np.full(17, 7), 17)})
    bank.out = out
    bank.requests = [type("R", (), {"prompt": np.zeros(7, np.int32), "output": out})()]
    req = np.array([0])
    for lookup, want in ((False, []), (True, [502, 503, 500, 501] * 2)):
        late = replay_engine.LateNgram(width=17, k=8, lag=1, context_lookup=lookup)
        late.reset(1)
        late.aligned(bank, req, np.array([0]))
        got = late.aligned(bank, req, np.array([16]))
        assert got["tokens"][0, :got["lengths"][0]].tolist() == want, lookup
    assert late.stats["steps_from_context"] == 1


def test_late_ngram_positions_follow_the_lag_and_restart_at_admission():
    late = replay_engine.LateNgram(width=17, k=8, lag=2)
    late.reset(2)
    req = np.array([0, 1])
    assert late.proposal_positions(req, np.array([0, 0])).tolist() == [0, 0]
    assert late.proposal_positions(req, np.array([3, 1])).tolist() == [0, 0]
    assert late.proposal_positions(req, np.array([5, 4])).tolist() == [0, 0]    # two steps ago
    assert late.proposal_positions(req, np.array([9, 6])).tolist() == [3, 1]
    # slot 1 gets a new request (same bank request again, position 0): its proposal is the one from admission
    assert late.proposal_positions(req, np.array([12, 0])).tolist() == [5, 0]
    assert late.proposal_positions(req, np.array([13, 2])).tolist() == [9, 0]
    assert late.proposal_positions(req, np.array([15, 5])).tolist() == [12, 0]
    assert late.proposal_positions(req, np.array([16, 6])).tolist() == [13, 2]


def test_simulated_drafter_is_flat_and_calibrated():
    rng = np.random.default_rng(0)
    reqs = one_request_trace(L=4000, k=6, output=rng.integers(0, 5000, 4000))
    bank = replay_drafts.DraftBank(reqs, k=6)
    flags = np.zeros(4000, bool)
    flags[::2] = True
    toks, probs = replay_synth.simulated_eagle(bank, flags, 0.6, 0.9, 6, seed=3)
    truth = bank.targets(np.zeros(4000, np.int64), np.arange(4000), 6)
    right = toks == truth
    inside = truth >= 0
    # conditional acceptance at each depth j (given tokens < j right), on non-copy / copy target positions
    q = np.arange(4000)[:, None] + np.arange(6)[None, :]
    copy = np.where(inside, flags[np.minimum(q, 3999)], False)
    prev_ok = np.concatenate([np.ones((4000, 1), bool), np.cumprod(right, axis=1)[:, :-1].astype(bool)], axis=1)
    for j in range(6):
        m = prev_ok[:, j] & inside[:, j]
        assert right[m & ~copy[:, j], j].mean() == pytest.approx(0.6, abs=0.04)
        assert right[m & copy[:, j], j].mean() == pytest.approx(0.9, abs=0.04)
    # calibrated: within confidence bins, the hit rate matches the mean confidence
    c, r = probs[inside], right[inside]
    for lo in (0.2, 0.5, 0.8):
        m = (c >= lo) & (c < lo + 0.1)
        assert r[m].mean() == pytest.approx(c[m].mean(), abs=0.04)


def _tree_bank(L=3000, alpha=0.6, alpha_copy=0.6, seed=3, pad=64, k=8):
    """One long request with a simulated drafter (chains of 8) and its simulated EAGLE trees; ``k``: the n-gram
    proposals' width (an as-built engine aligns proposals of ``ngram_k + max_depth + 1`` tokens)."""
    rng = np.random.default_rng(0)
    bank = replay_drafts.DraftBank(one_request_trace(L=L, k=k, output=rng.integers(0, 5000, L)), k=k, pad=pad)
    flags = np.zeros(L, bool)
    toks, probs = replay_synth.simulated_eagle(bank, flags, alpha, alpha_copy, 8, seed=seed)
    trees = replay_synth.SimulatedEagleTrees(bank, flags, alpha, alpha_copy, toks, probs, seed)
    return replay_synth.with_eagle(bank, toks, probs, trees), toks


def test_simulated_eagle_tree_of_topk_1_is_the_chain_and_runs_like_fixed_eagle():
    """A tree with one child per node (topk = 1) is the simulated chain, node for node; through the replay it runs
    step for step like fixed EAGLE of the same length (same tokens, verified nodes, draft forwards and time)."""
    bank, toks = _tree_bank(L=400)
    req, pos = np.zeros(400, np.int64), np.arange(400)
    for steps in (1, 3, 5):
        t, par = bank.eagle_trees.rows(req, pos, steps, 1, steps + 1)
        assert np.array_equal(t, toks[:, :steps])
        assert np.array_equal(par, np.broadcast_to(np.arange(steps) - 1, (400, steps)))
        cost = linear_cost(base=1.0, per_token=0.1, draft=0.05)
        tree = replay_sim.simulate(P.EagleTree(steps, 1, steps + 1), bank, [0], batch=1, cost=cost)
        chain = replay_sim.simulate(P.EagleFixed(steps), bank, [0], batch=1, cost=cost)
        assert (tree.steps, tree.tokens, tree.verified_nodes, tree.model_steps) == \
            (chain.steps, chain.tokens, chain.verified_nodes, chain.model_steps)
        assert tree.seconds == pytest.approx(chain.seconds)


def test_simulated_eagle_tree_follows_sglangs_shape_and_its_measured_later_candidates():
    """Every tree has num_draft_tokens - 1 nodes in topological order, at most topk children per node and steps
    levels; siblings carry distinct tokens. With one step every one of the root's topk children is verified, and how
    often one of them is the output's token is the chain's first-token rate plus, when that one is wrong, the chance
    that a later candidate is (1 - prod(1 - RANK_HIT[:topk - 1])). Asking in another order gives the same trees."""
    L = 3000
    bank, toks = _tree_bank(L=L)
    req, pos = np.zeros(L, np.int64), np.arange(L)
    truth = bank.targets(req, pos, 8)
    inside = truth[:, 0] >= 0
    for steps, topk, n in ((5, 4, 8), (6, 8, 32), (3, 2, 6)):
        t, par = bank.eagle_trees.rows(req, pos, steps, topk, n)
        assert t.shape == par.shape == (L, n - 1)
        assert (par < np.arange(n - 1)).all() and (par >= -1).all()
        depth = np.zeros((L, n - 1), np.int64)
        for i in range(n - 1):
            up = np.take_along_axis(depth, np.maximum(par[:, i:i + 1], 0), 1)[:, 0]
            depth[:, i] = np.where(par[:, i] < 0, 1, up + 1)
        assert depth.max() <= steps
        for row in range(0, L, 97):
            kids = {}
            for i, p in enumerate(par[row]):
                kids.setdefault(int(p), []).append(int(t[row, i]))
            assert all(len(v) <= topk and len(set(v)) == len(v) for v in kids.values())
        shuffled = np.random.default_rng(1).permutation(L)
        t2, par2 = bank.eagle_trees.rows(req[shuffled], pos[shuffled], steps, topk, n)
        assert np.array_equal(t2, t[shuffled]) and np.array_equal(par2, par[shuffled])
    for topk in (2, 8):
        t, par = bank.eagle_trees.rows(req, pos, 1, topk, topk + 1)
        assert (par == -1).all()
        hit = (t == truth[:, :1]).any(axis=1)[inside]
        first = (toks[:, 0] == truth[:, 0])[inside].mean()
        later = 1 - np.prod(1 - np.asarray(replay_synth.RANK_HIT[:topk - 1]))
        assert hit.mean() == pytest.approx(first + (1 - first) * later, abs=0.03)
        assert (t[:, 0] == toks[:, 0]).all()          # the first child is the chain's token


def test_eagle_tree_draft_forwards_run_topk_beams_and_only_the_roofline_prices_them():
    """A tree's draft forwards after the first run topk sequences per request, each reading its request's KV: on the
    roofline each costs a draft step of B x topk requests at topk times the KV; a table cannot price them."""
    from bench.cost_tables import roofline

    spec = replay_costs.gpu_cost_spec([4], 2048, "gpu", max_width=33)
    c = spec.for_batch(4)
    ctx = 4 * 3000.0
    assert c.draft_time(ctx, branches=8) == pytest.approx(roofline.Roofline(context_tokens=2048).draft_step_s(
        32, 8 * ctx))
    assert c.draft_time(ctx, branches=8) > c.draft_time(ctx)
    bank, _ = _tree_bank(L=200)
    res = replay_sim.simulate(P.EagleTree(5, 4, 8), bank, [0], batch=1, cost=spec.for_batch(4))
    assert res.verified_nodes == 7 * res.request_steps
    with pytest.raises(ValueError, match="roofline"):
        replay_sim.simulate(P.EagleTree(5, 4, 8), bank, [0], batch=1, cost=linear_cost())
    with pytest.raises(ValueError, match="num_draft_tokens"):
        bank.eagle_trees.rows(np.zeros(1, np.int64), np.zeros(1, np.int64), 2, 2, 8)
    plain = replay_drafts.DraftBank(one_request_trace(L=20, k=8), k=8)
    with pytest.raises(replay_drafts.DrafterUnavailable, match="not its trees"):
        replay_sim.simulate(P.EagleTree(5, 4, 8), plain, [0], batch=1, cost=spec.for_batch(4))


def _run(tokens, seconds, ids):
    r = replay_sim.RunResult("a", "a", "w", 4, "c", 1, int(sum(tokens)), float(sum(seconds)), 1, 0, 0, 1, 0, 0.0,
                             0.0)
    r.per_request = (np.array(tokens, float), np.array(seconds, float))
    r.request_ids = list(ids)
    return r


def test_bootstrap_ratio_is_exact_for_identical_runs_and_brackets_the_point():
    ids = ["chat:1", "chat:2", "chat:3"]
    r = _run([10, 10, 10], [1, 1, 1], ids)
    assert replay_realistic.ratio_ci([r], [r]) == (1.0, 1.0, 1.0)
    s = _run([10, 10, 10], [1, 2, 3], ids)
    pt, lo, hi = replay_realistic.ratio_ci([r], [s])
    assert pt == pytest.approx(2.0) and lo <= pt <= hi


def test_bootstrap_resamples_source_files_not_windows():
    """Windows of one code file (``code:pkg:path@cut``) are one cluster, pooled across seeds: two files, one where
    the contender is 3x faster, one where it is level. Resampling whole files, the interval spans what the two files
    give alone (about 1x to 3x); had the windows been independent it would be much narrower."""
    assert replay_realistic.cluster_of("code:flask:flask/app.py@120") == "code:flask:flask/app.py"
    assert replay_realistic.cluster_of("chat:abc") == "chat:abc"
    ids = [f"code:p:a.py@{i}" for i in range(20)] + [f"code:p:b.py@{i}" for i in range(20)]
    fast = _run([10] * 40, [1] * 20 + [1] * 20, ids)
    slow = _run([10] * 40, [3] * 20 + [1] * 20, ids)
    keys, tok, sec = replay_realistic.pooled([slow, slow])      # two seeds drawing the same files
    assert keys == ["code:p:a.py", "code:p:b.py"] and tok.tolist() == [400, 400] and sec.tolist() == [120, 40]
    pt, lo, hi = replay_realistic.ratio_ci([fast], [slow])
    assert pt == pytest.approx(2.0)
    assert lo < 1.1 and hi > 2.9                  # two clusters: the interval reaches both files' own ratios


def test_prompt_lookup_index_matches_the_scan():
    rng = np.random.default_rng(0)
    for trial in range(60):
        ctx = rng.integers(0, 4, int(rng.integers(2, 50)))
        lo, hi = [(2, 5), (5, 5)][trial % 2]
        ix = replay_drafts.PromptLookupIndex(ctx[:1], lo, hi)
        for t in range(2, len(ctx) + 1):
            ix.extend(ctx[t - 1:t])
            assert ix.propose(6).tolist() == replay_drafts.prompt_lookup(ctx[:t], lo, hi, 6).tolist()


def test_vllm_compare_asks_for_eagle3_with_an_eagle3_head(tmp_path):
    import json
    from types import SimpleNamespace

    from bench import vllm_compare as V

    e3 = tmp_path / "e3"
    e3.mkdir()
    (e3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                                "draft_vocab_size": 32000}))
    e1 = tmp_path / "e1"
    e1.mkdir()
    (e1 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"]}))
    assert V.eagle_method(e3) == "eagle3" and V.eagle_method(e1) == "eagle"
    assert V.eagle_method(tmp_path / "missing") == "eagle"
    cfgs = {(e, m): a for e, m, a in V.engine_configs(SimpleNamespace(k=4, draft=str(e3), eagle_method=None))}
    assert json.loads(cfgs[("vllm", "eagle")][1])["method"] == "eagle3"


def test_realistic_runner_tunes_hybrids_launch_settings_like_the_baselines():
    """The realistic replay runs HYBRID at the deployed 4 EAGLE steps and n-gram chain of 8 and at every combination
    with the extra step counts and chain lengths on the tuning seed, keeps the fastest per cell (as it keeps the best
    k of fixed EAGLE and of each n-gram baseline), and runs that one on every seed: the reported HYBRID run is
    exactly the chosen policy's, with the node budget the worker resolves (steps + ngram_k in merge mode)."""
    rng = np.random.default_rng(0)
    reqs = [dataclasses.replace(one_request_trace(L=60, k=8, output=rng.integers(0, 50, 60), workload=w)[0],
                                id=f"{w}{i}") for i, w in enumerate(["code", "code", "chat", "chat"])]
    cfg = replay_realistic.Config(requests=2, out_tokens=60, seeds=(0, 1), batches=(4,), eagle_ks=(2, 4),
                                  model_ks=(2,), hybrid_steps=(6,), hybrid_ngram_ks=(16,), ngram_ks=(8, 16),
                                  sweep=False, decompose=False, plot=None)
    runner = replay_realistic.Runner(cfg)
    assert runner.pw == 16 + 16 + 1 and runner.bank_k == 16
    bank = replay_drafts.DraftBank(reqs, runner.bank_k, ngram_width=runner.pw)
    groups = {"code": [0, 1], "chat": [2, 3]}
    src = (0.7, 0.9)                                   # a sweep point names the source
    runner.run_source(src, {0: bank, 1: bank}, {0: groups, 1: groups}, [("code", 4)], [0, 1], ("as built",),
                      lambda *_: None)
    names = ("hybrid_merge", "hybrid_merge_k16", "hybrid_merge_s6", "hybrid_merge_s6_k16")
    pols = runner.engine_pols["as built"]
    assert [(pols[n].num_steps, pols[n].engine.ngram_k, pols[n].n_nodes) for n in names] == [
        (4, 8, 12), (4, 16, 20), (6, 8, 14), (6, 16, 22)]
    tuned = {n: runner.runs[(src, "as built", "code", 4, "tune:" + n, 0)].tok_per_s for n in names}
    best = max(tuned, key=tuned.get)
    assert runner.best[(src, "as built", "code", 4, "hybrid")] == (pols[best].num_steps, pols[best].engine.ngram_k)
    # the chosen one runs on the evaluation seed only: the tuning seed never enters a ratio
    assert (src, "as built", "code", 4, "hybrid_merge", 0) not in runner.runs
    other = runner.sim(pols[best], bank, groups["code"], 4, 1, ("check", "-", "code", 4, best, 1))
    assert runner.runs[(src, "as built", "code", 4, "hybrid_merge", 1)].tok_per_s == other.tok_per_s
    cell = runner.cell(src, "as built", "code", 4)
    assert (cell["hybrid_steps"], cell["hybrid_ngram_k"]) == (pols[best].num_steps, pols[best].engine.ngram_k)
    assert cell["seeds"] == 1 and cell["oracle"] == runner.runs[(src, "-", "code", 4, "oracle", 1)].tok_per_s
    # the rule "n-gram if it matches, else EAGLE" runs at the cell's best fixed EAGLE k, tuned over the chain length
    ke = max(runner.eagle, key=lambda p: runner.runs[(src, "-", "code", 4, p.name, 0)].tok_per_s).k
    rules = {f"ngram_else_eagle_n{k}_e{ke}": runner.runs[(src, "-", "code", 4, f"ngram_else_eagle_n{k}_e{ke}", 0)]
             for k in (8, 16)}
    assert cell["rule_name"] == max(rules, key=lambda n: rules[n].tok_per_s)
    # HYBRID / the best single drafter also with every drafter's host work charged the same way, both ways
    single = runner.seeds_of(runner.best[(src, "as built", "code", 4, "model" if cell["single_name"] == cell[
        "model_name"] else "ngram")][1], [1])
    for how in ("overlapped", "added"):
        hy = runner.runs[(src, "as built", "code", 4, "hybrid_merge", 1)]
        want = (hy.tokens / hy.host_seconds[how].sum()) / (single[0].tokens / single[0].host_seconds[how].sum())
        assert cell[f"vs_single_host_{how}"][0] == pytest.approx(want)
    # a tuned baseline at the top of the range it was tuned over is named (fixed EAGLE over 2, 4; n-gram k over 8,
    # 16; model-only adaptive tried one K: no range)
    tops = {cell["model_name"]} & {"eagle_fixed_k4"} | {cell["ngram_name"]} & {
        n + "_k16" for n in ("ngram_ours", "vllm_ngram_5_5", "vllm_ngram_2_5", "suffix")}
    assert {e[3] for e in replay_realistic.edge_choices(runner)} == tops
    # model-only adaptive runs ragged with fresh chains (the ideal engine), whatever HYBRID's mode
    assert all(not p.engine.as_built for p in runner.adaptive.values())
    # each n-gram baseline family is tuned over its chain lengths on the same seed
    ours = {n: runner.runs[("text", "-", "code", 4, n, 0)].tok_per_s for n in ("ngram_ours", "ngram_ours_k16")}
    assert runner.tuned_free("text", "code", 4, "ngram_ours") == max(ours, key=ours.get)
    # the headline contenders rerun under the GPU-measured table (the device kit's), charged by it
    assert runner.measured_note is None and set(runner.alt_specs) == {"hardmax", "measured"}
    banks, grps = {0: bank, 1: bank}, {0: groups, 1: groups}
    got = runner.alt_cost_cell("measured", src, banks, grps, "code", 4)
    assert set(got) == {"vs_model", "vs_single", "vs_nospec"}
    redo = replay_sim.simulate(pols[best], bank, groups["code"], 4, runner.alt_specs["measured"].for_batch(4),
                               seed=1 * 1000 + 4, workload="code")
    assert runner.runs[(src, "measured", "code", 4, "hybrid", 1)].seconds == pytest.approx(redo.seconds)
    assert runner.runs[(src, "measured", "code", 4, "hybrid", 1)].seconds != pytest.approx(
        runner.runs[(src, "as built", "code", 4, "hybrid_merge", 1)].seconds)


def test_realistic_ragged_mode_is_the_readme_launch_with_ragged_verify_on():
    """Beside the README's launch (padded verify) the headline point and the real trace run HYBRID as launched with
    ``ragged_verify=on`` (``RAGGED``): the same engine but for the verify layout, the worker's blocking read at the
    configured stall, tuned and evaluated like the other modes; ``ragged_mode=False`` leaves it out."""
    rng = np.random.default_rng(1)
    reqs = [dataclasses.replace(one_request_trace(L=40, k=8, output=rng.integers(0, 50, 40), workload="code")[0],
                                id=f"code{i}") for i in range(4)]
    cfg = replay_realistic.Config(requests=4, out_tokens=40, seeds=(0, 1), batches=(4,), eagle_ks=(2,), model_ks=(2,),
                                  hybrid_steps=(), hybrid_ngram_ks=(), ngram_ks=(8,), sweep=False, decompose=False,
                                  plot=None, ragged_sync_us=123.0)
    runner = replay_realistic.Runner(cfg)
    ragged, padded = runner.engines[replay_realistic.RAGGED], runner.engines["as built"]
    assert runner.head_modes == ("as built", "ideal", replay_realistic.RAGGED)
    assert (ragged.verify, ragged.sync_us, padded.verify) == ("ragged_sync", 123.0, "padded")
    assert dataclasses.replace(ragged, verify="padded", sync_us=padded.sync_us) == padded
    bank = replay_drafts.DraftBank(reqs, runner.bank_k, ngram_width=runner.pw)
    groups = {"code": [0, 1, 2, 3]}
    src = (0.7, 0.9)                                   # a sweep point names the source
    runner.run_source(src, {0: bank, 1: bank}, {0: groups, 1: groups}, [("code", 4)], [0, 1], runner.head_modes,
                      lambda *_: None)
    cells = {m: runner.cell(src, m, "code", 4) for m in runner.head_modes}
    assert all(c is not None and c["hybrid"] > 0 for c in cells.values())
    assert cells[replay_realistic.RAGGED]["hybrid"] != cells["as built"]["hybrid"]
    assert replay_realistic.RAGGED not in replay_realistic.Runner(
        dataclasses.replace(cfg, ragged_mode=False)).engines


def test_realistic_cells_in_forked_processes_give_the_runs_of_one_process(monkeypatch):
    """``--jobs``: the cells of a source run in forked processes and their runs and choices join the runner in the
    cells' order, equal to the same cells run one after another (every run a function of its inputs and seed); the
    launch counts the children made come back too, so that the next fork does not count them again."""
    from bench import step_launches
    rng = np.random.default_rng(1)
    reqs = [dataclasses.replace(one_request_trace(L=50, k=8, output=rng.integers(0, 40, 50), workload=w)[0],
                                id=f"{w}{i}") for i, w in enumerate(["code", "code", "chat", "chat"])]
    groups = {"code": [0, 1], "chat": [2, 3]}
    got = []
    for jobs in (1, 2):
        monkeypatch.setattr(step_launches, "COUNTS", {})
        cfg = replay_realistic.Config(requests=2, out_tokens=50, seeds=(0, 1), batches=(2,), eagle_ks=(2,),
                                      model_ks=(2,), hybrid_steps=(), hybrid_ngram_ks=(), ngram_ks=(8,),
                                      sweep=False, decompose=False, plot=None, jobs=jobs)
        runner = replay_realistic.Runner(cfg)
        bank = replay_drafts.DraftBank(reqs, runner.bank_k, ngram_width=runner.pw)
        lines = []
        runner.run_source((0.7, 0.9), {0: bank, 1: bank}, {0: groups, 1: groups}, [("code", 2), ("chat", 2)],
                          [0, 1], ("as built", "ideal"), lines.append)
        assert [line.split(":")[0] for line in lines] == ["  SIM alpha=0.7 copy=0.90 | code B=2",
                                                          "  SIM alpha=0.7 copy=0.90 | chat B=2"]
        got.append((runner.runs, runner.best))
        assert any(key[0] == "hybrid_launches" for key in step_launches.COUNTS)   # counted here, or handed back
        pids = runner.in_processes(lambda _: os.getpid(), [0, 1, 2])
        assert (set(pids) == {os.getpid()}) == (jobs == 1), pids         # jobs 2: forked children ran them
    (runs1, best1), (runs2, best2) = got
    assert list(runs1) == list(runs2) and best1 == best2
    for key, r in runs1.items():
        other = runs2[key]
        assert dataclasses.asdict(r) == dataclasses.asdict(other), key
        assert all(np.array_equal(a, b) for a, b in zip(r.per_request, other.per_request)), key


def test_forked_cells_survive_the_parents_openmp_pool():
    """A parent that has run torch on its OpenMP threads (as pytest's process has, by the time the replay's tests
    fork) forks ``--jobs`` children whose torch still runs: GNU OpenMP's pool does not survive a fork, and a child's
    first parallel region waited for it forever (a ``torch.logit`` of a cell's decision hung this suite). Run in a
    fresh interpreter so that the parent's pool is certain (``tests/bench/_scripts/forked_cells.py``), with a timeout so
    that a hang fails instead of waiting."""
    import signal
    import subprocess
    import sys
    from pathlib import Path
    run = subprocess.Popen([sys.executable, "-m", "tests.bench._scripts.forked_cells"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                           start_new_session=True)
    try:
        out, err = run.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)       # the hung children too
        run.communicate()
        pytest.fail("a forked child hung in its first parallel region (180 s)")
    assert run.returncode == 0, err
    assert [float(v.strip("[],")) for v in out.split()] == pytest.approx([96 * np.log(1 / 3)] * 3)


@pytest.mark.parametrize("eagle_right", [True, False])
def test_oracle_verifies_exactly_the_accepted_tokens_of_the_better_drafter(eagle_right):
    """The oracle's proposal holds the better chain's accepted prefix and nothing else (every node it verifies is
    accepted), drafts EAGLE only as deep as that prefix, and no policy over the same drafts emits more per step
    at a lower cost: it beats fixed EAGLE and n-gram alone under a cost that charges every verified token."""
    trace = one_request_trace(L=40, k=8, eagle_right=eagle_right, output=np.tile(np.arange(10, 20), 4))
    bank = replay_drafts.DraftBank(trace, k=8)
    oracle = P.Oracle(8, 8)
    for p in range(0, 30, 3):
        req, pos = np.array([0]), np.array([p])
        view = P.StepView(req, pos, bank.roots(req, pos), bank, None, 1)
        prop = oracle.propose(view)
        targets = bank.targets(req, pos, 8)[0]
        etoks, _ = bank.eagle(req, pos, 8)
        ntoks, nlens = bank.chain("ngram", req, pos, 8)
        acc_e = P.accepted_prefix(etoks, targets[None])[0]
        acc_n = P.accepted_prefix(P.mask_chain(ntoks, nlens), targets[None])[0]
        n = (prop.tokens[0] >= 0).sum()
        assert n == max(acc_e, acc_n)
        assert prop.tokens[0, :n].tolist() == targets[:n].tolist()
        assert prop.model_steps == (acc_e if acc_e > acc_n else 0)
        assert prop.verify_tokens is None and prop.launches == 0
    cost = linear_cost(base=1.0, per_token=0.1, draft=0.05)
    got = {pol.name: replay_sim.simulate(pol, bank, [0], 1, cost).tok_per_s
           for pol in (oracle, P.EagleFixed(4), P.NgramOurs(8))}
    assert got["oracle"] >= max(got["eagle_fixed"], got["ngram_ours"])


@pytest.mark.parametrize("eagle_right", [True, False])
def test_eagle_foreknowledge_verifies_exactly_the_eagle_chains_accepted_tokens(eagle_right):
    """``Oracle(eagle_only=True)`` knows the EAGLE chain's accepted length and nothing of the n-gram drafter: it
    verifies that prefix alone (none where EAGLE misses, however long the n-gram copy), drafts as deep, pays no n-gram
    host path, and under a cost that charges every verified token beats fixed EAGLE, which has no foreknowledge, and
    never beats the oracle that also chooses."""
    trace = one_request_trace(L=40, k=8, eagle_right=eagle_right, output=np.tile(np.arange(10, 20), 4))
    bank = replay_drafts.DraftBank(trace, k=8)
    fore = P.Oracle(8, 8, eagle_only=True)
    assert fore.name == "oracle_eagle" and fore.needs == ("eagle",)
    for p in range(0, 30, 3):
        req, pos = np.array([0]), np.array([p])
        prop = fore.propose(P.StepView(req, pos, bank.roots(req, pos), bank, None, 1))
        targets = bank.targets(req, pos, 8)[0]
        acc_e = P.accepted_prefix(bank.eagle(req, pos, 8)[0], targets[None])[0]
        assert (prop.tokens[0] >= 0).sum() == acc_e
        assert prop.tokens[0, :acc_e].tolist() == targets[:acc_e].tolist()
        assert prop.model_steps == acc_e and prop.host_s == 0.0
        assert (prop.source[0] == P.Source.MODEL).all()
    cost = linear_cost(base=1.0, per_token=0.1, draft=0.05)
    got = {pol.name: replay_sim.simulate(pol, bank, [0], 1, cost).tok_per_s
           for pol in (fore, P.Oracle(8, 8), P.EagleFixed(4))}
    assert got["eagle_fixed"] < got["oracle_eagle"] <= got["oracle"]


def test_realistic_step_times_cover_every_policys_widest_verify():
    """Every policy's widest verify (HYBRID's n_nodes + 1, a model-free chain of k + 1, EAGLE k + 1, an EAGLE tree's
    num_draft_tokens) lies inside the step-time table of each batch, so no step is charged the cost model's
    extrapolation (flat past the end of a CUDA-graph bucket: a wider step would be charged too little; the old fixed
    17-wide table stopped short of HYBRID with a 24-token n-gram chain)."""
    cfg = replay_realistic.Config(batches=(4, 32), sweep_cells=(("code", 4),), hybrid_ngram_ks=(24,),
                                  ngram_ks=(8, 24), sweep=False, decompose=False, plot=None)
    runner = replay_realistic.Runner(cfg)
    widest = max(p.n_nodes + 1 for ps in runner.engine_pols.values() for p in ps.values())
    chains = max(p.n_nodes + 1 for m, ps in runner.engine_pols.items() for p in ps.values()
                 if not runner.engines[m].eagle_alternatives)
    assert widest == chains == 6 + 24 + 1           # the EAGLE alternatives compete for the chains' nodes
    assert runner.max_width == max(widest, *(t[2] for t in cfg.eagle_trees)) == 64      # the EAGLE tree 8/8/64
    assert runner.bank_pad == max(64, runner.max_width)    # every step's targets reach the deepest a tree can be
    wide = replay_realistic.Runner(dataclasses.replace(cfg, eagle_alternatives=7))
    assert wide.max_width == runner.max_width            # however many alternatives: no wider verify
    for b in (4, 32):
        sizes = runner.specs.for_batch(b).model.sizes
        assert int(sizes[-1]) >= b * runner.max_width
    old = replay_costs.gpu_cost_spec([32], 2048)       # the default 17-wide table
    assert int(old.for_batch(32).model.sizes[-1]) < 32 * widest


def _record_steps(pol, bank, record) -> list:
    """Replay request 0 of ``bank`` alone through ``pol`` and return ``record(position, model, ngram, decide's
    keywords, Decision)`` of every decision it made."""
    seen = []
    decide, propose, current = pol.decide, pol.propose, {}

    def decide_recording(root, model, ngram, **kw):
        d = decide(root, model, ngram, **kw)
        seen.append(record(int(current["view"].pos[0]), model, ngram, kw, d))
        return d

    def propose_recording(view):
        current["view"] = view
        return propose(view)

    pol.decide, pol.propose = decide_recording, propose_recording
    replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=0.05))
    return seen


def _oracle_gradient(chain: list, committed: list, acc: list) -> float:
    """``sum (hit_j - acc_j)`` over the chain's tokens the verify tested, in plain Python: token ``j`` is tested while
    ``j`` is within the tokens committed and every earlier token hit."""
    g = 0.0
    for j, tok in enumerate(chain):
        if j >= len(committed):
            break
        g += (tok == committed[j]) - acc[j]
        if tok != committed[j]:
            break
    return g


@pytest.mark.parametrize("eagle_right", [True, False])
def test_hybrid_learns_the_workers_online_model_offset(eagle_right):
    """HYBRID's online EAGLE offset in the replay, against a plain-Python oracle: each step of a continuing request
    prices its chain with the offset the previous step left, ``b + eta * sum (hit - a')`` over the chain tokens up
    to the first that differs from the trace's committed tokens (``view.pos`` moved by the emitted count, bonus
    included); a request admitted to the slot starts at 0 (the one-request stream admits it twice). A right chain
    under-priced at 0.3 is raised, a wrong one lowered; the model-only baseline has no offset."""
    import torch

    from sglang_hybrid.request_bias import corrected_acceptance

    core = P._Core()
    trace = one_request_trace(L=12, k=4, eagle_right=eagle_right)
    trace[0].eagle_probs[:] = 0.3
    # the per-request offset alone: the engine-wide online temperature (on by default) also moves the acceptance
    eng = replay_engine.EngineConfig.ideal(num_steps=4, ngram_k=4, n_nodes=8, model_bias_eta=0.1,
                                           model_calibration_eta=None)
    bank = replay_drafts.DraftBank(trace, k=4, ngram_width=eng.proposal_width)
    pol = replay_engine.EnginePolicy("h", "merge", 4, 8, core, eng)
    assert pol.bias_eta == 0.1
    # per step: (output position, chain, offset priced with, acceptances priced)
    seen = _record_steps(pol, bank, lambda pos, model, ngram, kw, d: (
        pos, model.tokens[0].tolist(), float(kw["model_bias"][0]), d.model_acceptance[0].tolist()))
    out = trace[0].output.tolist()
    calibrated = core.model_cal.acceptance
    assert seen[0][2] == 0.0
    for (pos, chain, bias, acc), (pos_next, _, bias_next, _) in zip(seen, seen[1:]):
        if pos_next <= pos:                            # the request was admitted again: a fresh offset
            assert bias_next == 0.0
            continue
        g = _oracle_gradient(chain, out[pos:pos_next], acc)
        assert bias_next == pytest.approx(bias + 0.1 * g, abs=1e-6)
        conf = torch.full((1, len(chain)), 0.3)
        depth = torch.arange(1, len(chain) + 1)[None]
        want = corrected_acceptance(calibrated(conf, depth, check_values=False), torch.tensor([bias]))
        assert acc == pytest.approx(want[0].tolist(), abs=1e-6)
    biases = [b for _, _, b, _ in seen]
    assert (max(biases) > 0.1) if eagle_right else (min(biases) < -0.1)
    baseline = replay_engine.EnginePolicy("m", "choose", 4, 4, core, eng, ngram=False)
    assert baseline.bias_eta is None


def test_hybrid_learns_the_workers_online_ngram_offset():
    """HYBRID's online n-gram offset in the replay (``ngram_bias_eta``), against a plain-Python oracle as the model
    side's: each step of a continuing request prices its n-gram chain with the offset the previous step left,
    ``b + eta * sum (hit - a')`` over the chain's tokens up to the first that differs from the trace's committed ones
    (within the chain's length); a request admitted again starts at 0; the n-gram acceptances priced are the table's,
    shifted by that offset."""
    import torch

    from sglang_hybrid.request_bias import corrected_acceptance

    core = P._Core()
    trace = one_request_trace(L=24, k=4, eagle_right=False)
    eng = replay_engine.EngineConfig.ideal(num_steps=4, ngram_k=4, n_nodes=8, ngram_bias_eta=0.3)
    bank = replay_drafts.DraftBank(trace, k=4, ngram_width=eng.proposal_width)
    pol = replay_engine.EnginePolicy("h", "merge", 4, 8, core, eng)
    assert pol.ngram_bias_eta == 0.3 and pol.bias_eta is None
    # per step: (output position, chain, its length, offset priced with, acceptances priced, the table's)
    seen = _record_steps(pol, bank, lambda pos, model, ngram, kw, d: (
        pos, ngram.tokens[0].tolist(), int(ngram.length[0]), float(kw["ngram_bias"][0]),
        d.ngram_acceptance[0].tolist(),
        core.ngram_cal.acceptance(ngram.match_len, ngram.count, ngram.total, ngram.depth, ngram.source)[0]))
    out = trace[0].output.tolist()
    assert seen[0][3] == 0.0
    moved = 0
    for (pos, chain, length, bias, acc, table), (pos_next, _, _, bias_next, _, _) in zip(seen, seen[1:]):
        want = corrected_acceptance(table[None], torch.tensor([bias]))[0]
        assert acc[:length] == pytest.approx(want[:length].tolist(), abs=1e-6) and not any(acc[length:])
        if pos_next <= pos:
            assert bias_next == 0.0
            continue
        g = _oracle_gradient(chain[:length], out[pos:pos_next], acc)
        assert bias_next == pytest.approx(bias + 0.3 * g, abs=1e-6)
        moved += bias_next != bias
    assert moved >= 3


def test_model_offset_option_reaches_both_engines_and_bad_values_are_refused(monkeypatch):
    """``--model-bias-eta`` (and ``--ngram-bias-eta``) sets the offset's learning rate of the realistic engines
    ('none': off; default: the worker's shipped setting, for the n-gram side "auto"); anything else not > 0 is a
    usage error before any work."""
    from bench.replay import cli as replay
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    assert replay_engine.EngineConfig().model_bias_eta == HybridSettings().model_bias_eta   # what the worker ships
    assert replay_engine.EngineConfig().ngram_bias_eta == HybridSettings().ngram_bias_eta
    seen = {}
    monkeypatch.setattr(replay_realistic, "run", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    for value, want in (("none", None), ("0.3", 0.3)):
        for flag, field in (("--model-bias-eta", "model_bias_eta"), ("--ngram-bias-eta", "ngram_bias_eta")):
            seen.clear()
            replay.main(["--realistic", flag, value])
            runner = replay_realistic.Runner(seen["cfg"])
            assert {getattr(e, field) for e in runner.engines.values()} == {want}, flag
    seen.clear()
    replay.main(["--realistic"])
    assert seen["cfg"].model_bias_eta is None
    # the n-gram offset's default, "auto", resolves as the worker resolves it: learned where verify runs ragged (the
    # ragged launch and the ideal engine), off where it runs padded (the README's launch)
    assert seen["cfg"].ngram_bias_eta == "auto"
    etas = {name: e.ngram_eta for name, e in replay_realistic.Runner(seen["cfg"]).engines.items()}
    assert etas == {"as built": None, "ideal": 0.3, replay_realistic.RAGGED: 0.3,
                    replay_realistic.RAGGED_ALTERNATIVES: 0.3,
                    replay_realistic.ALTERNATIVES: 0.3}, etas
    seen.clear()
    replay.main(["--realistic", "--ngram-bias-eta", "auto"])
    assert seen["cfg"].ngram_bias_eta == "auto"
    assert seen["cfg"].jobs == len(os.sched_getaffinity(0))      # the cells run on every usable core by default
    for bad in ("0", "-1", "fast"):
        for flag in ("--model-bias-eta", "--ngram-bias-eta"):
            with pytest.raises(SystemExit):
                replay.main(["--realistic", flag, bad])
    with pytest.raises(SystemExit):
        replay.main(["--realistic", "--jobs", "0"])


def test_suffix_decoding_joins_the_model_free_baselines_where_arctic_imports():
    """Arctic's suffix decoding is one more model-free baseline, tuned over the same chain lengths, wherever its
    package imports (``HYBRID_ANCHORS=1 bash scripts/setup.sh``); elsewhere (CI) the run says NOT RUN and why."""
    runner = replay_realistic.Runner(replay_realistic.Config(batches=(4,), ngram_ks=(8, 16), sweep=False,
                                                             decompose=False, plot=None))
    suffix = [p.name for p in runner.free if isinstance(p, P.SuffixDecoding)]
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        assert runner.suffix_note.startswith("NOT RUN: suffix decoding") and "HYBRID_ANCHORS=1" in runner.suffix_note
        assert suffix == [] and "suffix" not in runner.free_kinds()
        return
    assert runner.suffix_note is None
    assert suffix == ["suffix", "suffix_k16"] and "suffix" in runner.free_kinds()


def test_realistic_command_line_defaults_are_the_configs_and_eagle_trees_parse(monkeypatch):
    """The realistic replay's command-line defaults are `Config`'s own (one place to change them); ``--eagle-trees``
    takes SGLang's three settings per tree and refuses a tree SGLang's rule cannot grow."""
    from bench.replay import cli as replay

    seen = {}
    monkeypatch.setattr(replay_realistic, "run", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    replay.main(["--realistic"])
    want = replay_realistic.Config()
    for field in ("requests", "out_tokens", "seeds", "batches", "width_lag", "ngram_lag", "cost_tables",
                  "hybrid_steps", "hybrid_ngram_ks", "ngram_ks", "eagle_trees", "measured_table", "ragged_mode",
                  "eagle_alternatives"):
        assert getattr(seen["cfg"], field) == getattr(want, field), field
    seen.clear()
    replay.main(["--realistic", "--no-ragged-mode"])
    assert seen["cfg"].ragged_mode is False
    seen.clear()
    replay.main(["--realistic", "--eagle-alternatives", "0"])
    assert seen["cfg"].eagle_alternatives == 0
    assert replay_realistic.Runner(dataclasses.replace(seen["cfg"], batches=(4,),
                                                       sweep=False)).alternatives_modes == ()
    for bad in ("8", "-1", "x"):                # the simulated drafter's measured ranks stop at 8
        with pytest.raises(SystemExit):
            replay.main(["--realistic", "--eagle-alternatives", bad])
    seen.clear()
    replay.main(["--realistic", "--measured-table", "none"])
    assert seen["cfg"].measured_table is None
    assert replay_realistic.Runner(dataclasses.replace(seen["cfg"], batches=(4,), sweep=False)).measured_note == (
        "no measured table (Config.measured_table = None)")
    # the draft banks hold the longest baseline chain even where HYBRID's own proposals are narrower
    narrow = replay_realistic.Runner(dataclasses.replace(seen["cfg"], batches=(4,), sweep=False, hybrid_steps=(),
                                                         hybrid_ngram_ks=(), ngram_ks=(8, 24)))
    assert narrow.bank_k == 24 and narrow.pw == 24 > replay_engine.EngineConfig().proposal_width
    assert seen["cfg"].real_traces == replay_realistic.REAL_TRACES and seen["cfg"].results is None
    seen.clear()
    replay.main(["--realistic", "--ngram-logit-shift", "0.5"])
    assert seen["cfg"].ngram_logit_shift == 0.5 and seen["cfg"].ngram_calibration is None
    core = replay_realistic.Runner(dataclasses.replace(seen["cfg"], batches=(4,), sweep=False)).core
    assert core.ngram_logit_shift == 0.5 and "+0.5 (a what-if" in core.ngram_cal_name
    with pytest.raises(SystemExit):         # the realistic replay's model side is identity by construction
        replay.main(["--realistic", "--model-calibration", "model.json"])
    seen.clear()
    replay.main(["--realistic", "--eagle-trees", "5,4,8", "2,2,7"])
    assert seen["cfg"].eagle_trees == ((5, 4, 8), (2, 2, 7))
    for bad in ("5,4", "5,1,6", "2,2,8", "0,2,6", "a,b,c"):
        with pytest.raises(SystemExit):
            replay.main(["--realistic", "--eagle-trees", bad])
    # the baselines' n-gram chains may run past the worker's ngram_k range (32); HYBRID's may not
    seen.clear()
    replay.main(["--realistic", "--ngram-ks", "8", "48"])
    assert seen["cfg"].ngram_ks == (8, 48)
    for opt, bad in (("--ngram-ks", "0"), ("--hybrid-ngram-ks", "33")):
        with pytest.raises(SystemExit):
            replay.main(["--realistic", opt, bad])


def test_ngram_logit_shift_moves_every_cell_and_keeps_the_table_valid(tmp_path):
    """The replay's what-if n-gram table (``policies.shift_logit``): each cell's logit moves by the shift (so the
    order of cells, and every sample count, is kept), 0 returns the table itself, the provenance records the shift;
    a realistic run prices with a file given as ``ngram_calibration`` (the worker's setting), shifted or not."""
    from sglang_hybrid.calibration import NgramCalibration

    cal = NgramCalibration.load()
    assert P.shift_logit(cal, 0.0) is cal
    up, down = P.shift_logit(cal, 1.0), P.shift_logit(cal, -1.0)
    a = np.clip(cal.table, 1e-6, 1 - 1e-6)
    logit = np.log(a / (1 - a))
    assert np.allclose(np.log(up.table / (1 - up.table)), logit + 1.0, atol=1e-9)
    assert (up.table >= cal.table).all() and (down.table <= cal.table).all() and (up.table > cal.table).any()
    assert np.array_equal(up.samples, cal.samples) and up.fit_params["replay_logit_shift"] == 1.0
    path = tmp_path / "ngram.json"
    up.save(path)
    core = replay_realistic.Runner(replay_realistic.Config(batches=(4,), sweep=False, decompose=False, plot=None,
                                                           ngram_calibration=path)).core
    assert core.ngram_cal_name == str(path)
    assert np.allclose(core.ngram_cal.table.numpy(), up.table.reshape(-1).astype(np.float32))


def test_ragged_token_tiers_by_hand():
    """Verify graphs keyed by total tokens: multiples of 8 up to 128, then 8 tiers per doubling; every count maps to
    the smallest tier holding it, 48 tiers up to 2,048 tokens, padding under 12.5 % above 64 tokens."""
    tier = replay_engine.token_tier
    assert [tier(n) for n in (1, 8, 9, 64, 65, 128, 129, 144, 145, 256, 257, 1000, 2048)] == [
        8, 8, 16, 64, 72, 128, 144, 144, 160, 256, 288, 1024, 2048]
    tiers = [tier(n) for n in range(1, 2049)]
    assert len(set(tiers)) == 48
    assert all(t >= n and tier(t) == t for n, t in enumerate(tiers, 1))
    assert max((t - n) / n for n, t in enumerate(tiers, 1) if n > 64) < 0.125
    for bad in (0, -3):
        with pytest.raises(ValueError, match="tokens must be >= 1"):
            tier(bad)


def test_ragged_verify_layouts_are_refused_where_they_mean_nothing():
    with pytest.raises(ValueError, match="verify must be one of"):
        replay_engine.EngineConfig(verify="ragged")
    with pytest.raises(ValueError, match="ideal engine verifies ragged"):
        replay_engine.EngineConfig.ideal(verify="ragged_sync")
    with pytest.raises(ValueError, match="sync_us must be >= 0"):
        replay_engine.EngineConfig(verify="ragged_sync", sync_us=-1.0)


def test_ragged_sync_stall_is_the_measured_read_plus_the_counted_launches():
    """The blocking read's default charge: the device kit's measured read (docs/device_run/ragged.json), the host
    dispatch of what the host launches after it before the verify graph, and the device time of what it queues ahead
    of it (``bench.ragged_sync_ops``'s counts; the live suite pins them), each at the replay's launch costs."""
    import json
    from pathlib import Path

    from bench.replay.host import LaunchCost

    run = json.loads((Path(__file__).resolve().parents[2] / "docs" / "device_run" / "ragged.json").read_text())
    assert run["on_gpu"] and round(run["blocking_read_stall_us"], 1) == replay_engine.RAGGED_READ_US
    cost = LaunchCost()
    want = (replay_engine.RAGGED_READ_US + replay_engine.RAGGED_SYNC_OPS * cost.op_host_us
            + replay_engine.RAGGED_SYNC_TRITON * cost.host_us + replay_engine.RAGGED_AHEAD_OPS * cost.op_gpu_us
            + replay_engine.RAGGED_AHEAD_TRITON * cost.gpu_us)
    assert replay_engine.RAGGED_SYNC_US == pytest.approx(want, abs=0.05)
    assert replay_engine.EngineConfig().sync_us == replay_engine.RAGGED_SYNC_US


def test_ragged_sync_charges_the_token_tier_and_the_stall_by_hand():
    """The ideal engine's case (every step the root + 1 node, from step 0 on: the same decisions, no lag) under the
    blocking-read design: each step runs the 8-token graph (token_tier(2)) and the device idles sync_us = 1 ms:
    20 x (T(8) + 4 x 0.05 + 0.001)."""
    core = P._Core()
    bank = replay_drafts.DraftBank(one_request_trace(L=10, k=4, eagle_right=False), k=4)
    eng = replay_engine.EngineConfig(verify="ragged_sync", sync_us=1000.0)
    pol = replay_engine.EnginePolicy("m", "choose", 4, 4, core, eng, ngram=False)
    assert pol.widths is None
    res = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.1, draft=0.05),
                              lockstep_start=True)
    assert res.steps == 20 and res.tokens == 20
    assert res.verified_per_step == 1.0
    assert res.seconds == pytest.approx(20 * (1.8 + 4 * 0.05 + 0.001))
    assert res.stats["ragged_rows"] == {"steps": 20, "verified": 160, "laid_out": 40, "used": 40}


def test_ragged_late_caps_each_request_by_its_own_choice_two_steps_before():
    """The late-read design by hand, two requests (4 nodes each at most, start rows 5 = the padded engine's start
    width): the first two steps lay out 5 rows each; step 2 lays out what each request chose at step 0 (5 and 2
    rows), dropping the second request's nodes past its cap; step 3 finds slot 0 refilled by a new request, which
    starts at 5 rows again, and slot 1 capped by its step-1 choice (4 rows)."""
    core = P._Core()
    eng = replay_engine.EngineConfig(verify="ragged_late")
    pol = replay_engine.EnginePolicy("h", "merge", 4, 4, core, eng)
    pol.reset(2)
    assert pol.start_rows == 5

    def step(req, pos, rows):
        toks = np.tile(np.arange(4), (2, 1))
        prop = P.Proposal(toks.copy(), P.chain_parents_np(2, 4))
        view = P.StepView(req=np.array(req), pos=np.array(pos), root=np.zeros(2, np.int64), drafts=None, cost=None,
                          requests=2, draft_step_s=0.0, context=np.zeros(2))
        pol._lay_out_ragged(prop, np.array(rows), view)
        return prop

    for req, pos, rows in (([0, 1], [0, 0], [5, 2]), ([0, 1], [3, 1], [3, 4])):
        prop = step(req, pos, rows)
        assert (prop.tokens >= 0).sum(1).tolist() == [4, 4] and prop.verify_tokens == replay_engine.token_tier(10)
    prop = step([0, 1], [5, 3], [1, 5])
    assert (prop.tokens >= 0).sum(1).tolist() == [4, 1]
    assert prop.parents[1].tolist() == [-1, -1, -1, -1]
    assert prop.verify_tokens == replay_engine.token_tier(7)
    prop = step([2, 1], [0, 4], [5, 5])
    assert (prop.tokens >= 0).sum(1).tolist() == [4, 3]
    assert prop.verify_tokens == replay_engine.token_tier(9) and prop.stall_s == 0.0
    assert pol.ragged == {"steps": 4, "verified": 16 + 16 + 8 + 16, "laid_out": 10 + 10 + 7 + 9,
                          "used": 7 + 7 + 3 + 9}


def test_realistic_as_built_is_the_readme_launch_unless_both_tables_are_given():
    """The headline's as-built HYBRID is the launch the README gives (no cost table: both measured at start, the
    worker's own widths for the verify table, trimmed at each batch to the runtime states that fit the H200's free
    memory, and its default EAGLE depths for the draft table) for every tuned combination of steps and chain length;
    with ``cost_tables="given"`` it is the launch with both tables (every width bucket, adaptive drafting)."""
    from bench.memory_budget import default_launch_widths
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.widths import default_buckets, measured_table_buckets, paying_extras

    def measured_widths(steps, full):
        required, extras = measured_table_buckets(steps, full)
        return tuple(sorted({*required, *extras}))

    # the deployed S4/K8: both extras (8 and 4) fit at 128 requests x 131,072 context and at batch 4 (one verify part
    # per width, memory_budget); at 128 requests no further width would (offered every width, it keeps the same four)
    assert default_launch_widths(128, 4, 8, 12) == (4, 5, 8, 13) == default_launch_widths(4, 4, 8, 12)
    assert default_launch_widths(128, 4, 8, 12, extras=(8, 4, 2, 6, 7, 9, 10, 11, 12)) == (4, 5, 8, 13)
    for tables in ("measured", "given"):
        cfg = replay_realistic.Config(batches=(4,), hybrid_steps=(6,), hybrid_ngram_ks=(24,), cost_tables=tables,
                                      sweep=False, decompose=False, plot=None)
        runner = replay_realistic.Runner(cfg)
        pols = runner.engine_pols["as built"]
        assert len(pols) == 4
        for p in pols.values():
            if tables == "measured":
                resolved = HybridSettings(mode="merge", ngram_k=p.engine.ngram_k).resolved_verify_widths(
                    p.num_steps, "cuda")
                assert resolved == measured_widths(p.num_steps, p.n_nodes + 1)
                for b in (4, 128):              # trimmed per batch to the states that fit, as the worker trims them
                    p.reset(b)
                    assert p.widths == default_launch_widths(b, p.num_steps, p.engine.ngram_k, p.n_nodes)
                    assert {p.num_steps + 1, p.n_nodes + 1} <= set(p.widths) <= set(resolved)
                    assert p.decide.widths == p.widths
                    # charged at the run's step times: first the extras that pay by that table (the stand-in for the
                    # measured one), then memory; at batch 4 the memory-bound verify makes the middle extra not pay
                    cost = runner.specs.for_batch(b)
                    p.reset(b, cost)
                    _, extras = measured_table_buckets(p.num_steps, p.n_nodes + 1)
                    paying = paying_extras(p.num_steps, p.n_nodes + 1, extras, cost.step_time, b)
                    assert p.widths == default_launch_widths(b, p.num_steps, p.engine.ngram_k, p.n_nodes,
                                                             extras=paying) == p.decide.widths
                    assert (extras[0] in paying) == (b != 4)         # at 128 it pays; memory may still not fit it
                # the draft table measured at start too: the worker's default depths (adaptive drafting)
                assert p.depths == HybridSettings(mode="merge", ngram_k=p.engine.ngram_k).resolved_draft_depths(
                    p.num_steps, "cuda") and len(p.depths) > 1
            else:
                assert p.widths == default_buckets(p.n_nodes + 1) and len(p.widths) > 2
                assert p.depths is not None and p.depths[-1] == p.num_steps
    # a fixed depth (--fixed-depth: the worker with draft_depths = [])
    assert replay_engine.EngineConfig(cost_tables="measured", adaptive_depth=False).depths is None
    with pytest.raises(ValueError, match="cost_tables must be one of"):
        replay_engine.EngineConfig(cost_tables="none")


def test_realistic_decomposition_prices_both_ragged_designs_against_the_launch():
    """The decomposition's rows: the as-built launch first, one mechanic switched per row (the launch without its extra
    widths and the launch with one EAGLE depth among them), both cost tables, the two
    ragged designs (the blocking read at the configured stall and at twice it) and the ideal engine last. The blocking
    read's two rows make the same decisions and differ only in the stall, so the longer stall is strictly slower."""
    rng = np.random.default_rng(3)
    reqs = [dataclasses.replace(one_request_trace(L=40, k=8, output=rng.integers(0, 50, 40), workload="code")[0],
                                id=f"code{i}") for i in range(4)]
    cfg = replay_realistic.Config(requests=4, out_tokens=40, seeds=(0, 1), batches=(4,), sweep_cells=(("code", 4),),
                                  eagle_ks=(2,), model_ks=(2,), hybrid_steps=(), hybrid_ngram_ks=(), ngram_ks=(8,),
                                  sweep=False, plot=None, ragged_sync_us=400.0)
    runner = replay_realistic.Runner(cfg)
    bank = replay_drafts.DraftBank(reqs, runner.bank_k, ngram_width=runner.pw)
    cols = [replay_realistic.DecomposeColumn("code B=4", bank, [0, 1, 2, 3], "code", 4, 1, "t", 4, 8),
            replay_realistic.DecomposeColumn("code B=4 S2/K8", bank, [0, 1, 2, 3], "code", 4, 1, "t", 2, 8)]
    lines = replay_realistic.decompose(runner, cfg, "title", cols)
    assert lines[0] == "title" and lines[1].split()[1:] == ["code", "B=4", "code", "B=4", "S2/K8"]
    table = {name: [float(x.rstrip("x")) for x in vals]
             for name, *vals in (line.rsplit(maxsplit=len(cols)) for line in lines[2:])}
    rows = {name: v[0] for name, v in table.items()}
    assert list(rows)[0] == "as built" and list(rows)[-1] == "ideal"
    assert {"both cost tables given (does not fit B=128)", "as built, no extra widths (EAGLE's, full)",
            "as built, one EAGLE depth (no draft table)",
            "ragged, blocking read (400 us), token tiers",
            "ragged, blocking read (800 us), token tiers", "ragged, own width read late, token tiers"} <= set(rows)
    assert all(v > 0 for v in rows.values())
    assert rows["ragged, blocking read (800 us), token tiers"] < rows["ragged, blocking read (400 us), token tiers"]
    # the blocking read with its gaps to the ideal engine closed one at a time, then together; without its stall it
    # makes the same decisions, only faster
    closed = ("no stall", "depth chosen 1 step ahead", "n-gram proposals fresh", "no n-gram host path",
              "all four closed")
    assert {f"blocking read, {what}" for what in closed} <= set(rows)
    assert rows["blocking read, no stall"] > rows["ragged, blocking read (400 us), token tiers"]
    # the second column runs HYBRID at 2 EAGLE steps: its own node budget (10) and widths, not the deployed 12 and 13
    assert replay_realistic.decompose(runner, cfg, "title", []) == []        # no column: no table
    two = {name: v[1] for name, v in table.items()}
    assert two["ragged, blocking read (800 us), token tiers"] < two["ragged, blocking read (400 us), token tiers"]
    assert two != rows
    variants = dict(replay_realistic.decompose_variants(runner, cfg, 2, 8))
    pol = replay_engine.engine_policies(runner.core, variants["as built, one full width (no price)"], ())[0]
    assert (pol.num_steps, pol.n_nodes, pol.widths) == (2, 10, (11,))
    assert variants["as built"].n_nodes == 10 and variants["ideal"].n_nodes == 10
    # the README's launch drafts adaptively (its draft table measured at start); the row without it does not
    assert variants["as built"].depths == (1, 2)
    assert variants["as built, one EAGLE depth (no draft table)"].depths is None
    assert not variants["ideal"].as_built and variants["ideal"].num_steps == 2
    closed = variants["blocking read, all four closed"]
    assert (closed.verify, closed.sync_us, closed.depth_lag, closed.ngram_lag, closed.host_time,
            closed.host_overlaps) == ("ragged_sync", 0.0, 1, 0, False, True)


def test_price_follows_the_batch_context_as_the_worker_blends_it():
    """The price's context (``EngineConfig.price_at``). The README's launch ("measured" tables) prices with the
    worker's own ``ContextCostTables``: two probes' tables (the roofline at 256 and at 2,048 tokens a request, the
    worker's ``profile_contexts``), blended at each step's mean context by its ``follow``. A user's tables ("given")
    are at one context, the run's ("start"). The design "batch" reads the roofline at the batch's mean context rounded
    to 64 tokens. Short contexts make verify tokens dearer relative to the step (less KV to read), which is what
    misled a price at one probe on short chat requests."""
    from sglang_hybrid.cost import ContextCostTables

    core = P._Core()
    spec = replay_costs.gpu_cost_spec([128], 2048, max_width=13)
    cost = spec.for_batch(128)
    roof = cost.roof
    view = P.StepView(req=np.arange(128), pos=np.zeros(128, np.int64), root=np.zeros(128, np.int64), drafts=None,
                      cost=cost.tables, requests=128, draft_step_s=cost.draft_step_s,
                      context=np.tile([100, 200, 300, 424], 32))             # mean 256 tokens a request
    assert replay_engine.EngineConfig().price_at == "start"                              # a user's tables
    assert replay_engine.EngineConfig(cost_tables="measured").price_at == "blend"        # the README's launch
    start = replay_engine.EnginePolicy("h", "merge", 4, 12, core, replay_engine.EngineConfig())
    start.reset(128, cost)
    tables, draft = start._price_inputs(view)
    assert tables is cost.tables and float(draft.step_time(torch.tensor(7))) == pytest.approx(cost.draft_step_s)
    ns = [128, 384, 1152]                                                 # widths 1, 3 and 9 at batch 128
    at = {c: [roof.target_step_s(n, 128, 128 * c) for n in ns] for c in (256, 704, 2048)}
    blend = replay_engine.EnginePolicy("h", "merge", 4, 12, core,
                                       replay_engine.EngineConfig(cost_tables="measured"))
    blend.reset(128, cost)
    tables, draft = blend._price_inputs(view)
    assert isinstance(tables, ContextCostTables) and (tables.short_context, tables.long_context) == (256, 2048)
    assert tables.step_time(torch.as_tensor(ns)).tolist() == pytest.approx(at[256], rel=1e-5)
    assert float(draft.step_time(torch.tensor(3))) == pytest.approx(roof.draft_step_s(128, 128 * 256), rel=1e-5)
    # a quarter of the way (704 tokens): a quarter of the long probe's difference, in the same tables
    again = blend._price_inputs(dataclasses.replace(view, context=np.full(128, 704)))
    assert again[0] is tables
    want = [a + 0.25 * (b - a) for a, b in zip(at[256], at[2048])]
    assert tables.step_time(torch.as_tensor(ns)).tolist() == pytest.approx(want, rel=1e-5)
    assert at[704] == pytest.approx(want, rel=0.05)     # the roofline is near linear in context (its knee is smooth)
    at_start = cost.tables.step_time(torch.as_tensor(ns))
    # at 2,048 tokens a request the KV reads dominate and width 9 costs little more than width 3; at 256 it costs more
    assert at[256][2] / at[256][1] > float(at_start[2] / at_start[1]) + 0.1
    # past the longer probe the blend extrapolates, kept non-decreasing in n (a price needs no negative marginal cost)
    blend._price_inputs(dataclasses.replace(view, context=np.full(128, 8192)))
    assert (tables.seconds[1:] >= tables.seconds[:-1]).all()
    batch = replay_engine.EnginePolicy("h", "merge", 4, 12, core, replay_engine.EngineConfig(price_context="batch"))
    batch.reset(128, cost)
    tables, draft = batch._price_inputs(view)
    assert batch._price_inputs(view)[0] is tables                         # one table per rounded context
    assert tables.step_time(torch.as_tensor(ns)).tolist() == pytest.approx(at[256], rel=1e-6)
    assert float(draft.step_time(torch.tensor(1))) == pytest.approx(roof.draft_step_s(128, 128 * 256), rel=1e-6)
    # the launch's blend needs a roofline to stand in for its probes: with a user's or a measured table it prices
    # with that table; a design asked for by name says what it needs
    linear = linear_cost(base=1.0, per_token=0.1, draft=0.05)
    blend.reset(4, linear)
    assert blend._price_at == "start"
    with pytest.raises(ValueError, match="price_context must be one of"):
        replay_engine.EngineConfig(price_context="now")
    with pytest.raises(ValueError, match="GPU cost spec"):
        batch.reset(4, linear)


def test_simulated_eagle_alternatives_are_the_trees_later_candidates_of_each_chain_position():
    """``SimulatedEagleTrees.alternatives``: at every chain position, m further candidates with distinct tokens
    (never the chain's own), probabilities that share what the chain token left, calibrated (the hit rate in a bin
    of probability is its mean), and right only where the chain token is wrong, as often as the measured later ranks
    say (1 - prod(1 - RANK_HIT[:m]) of those positions). Asking in another order gives the same draws."""
    L = 3000
    bank, toks = _tree_bank(L=L)
    req, pos = np.zeros(L, np.int64), np.arange(L)
    truth = bank.targets(req, pos, 8)
    t, q = bank.eagle_trees.alternatives(req, pos, 6, 3)
    assert t.shape == q.shape == (L, 6, 3) and t.dtype == np.int64 and q.dtype == np.float32
    assert all(len(set(r)) == 3 for r in t.reshape(-1, 3).tolist())
    assert not (t == toks[:, :6, None]).any()
    assert bool((q.sum(2) < 1 - bank.eagle_probs[:, :6] + 1e-6).all())
    inside = truth[:, :6] >= 0
    hit = t == truth[:, :6, None]
    chain_right = toks[:, :6] == truth[:, :6]
    assert not hit[chain_right].any()
    wrong = inside & ~chain_right
    later = 1 - np.prod(1 - np.asarray(replay_synth.RANK_HIT[:3]))
    assert hit.any(2)[wrong].mean() == pytest.approx(later, abs=0.02)
    qi, hi = q[inside], hit[inside]
    for lo in (0.02, 0.05, 0.1, 0.2):
        m = (qi >= lo) & (qi < lo * 1.5)
        assert hi[m].mean() == pytest.approx(qi[m].mean(), abs=0.02)
    order = np.random.default_rng(2).permutation(L)
    t2, q2 = bank.eagle_trees.alternatives(req[order], pos[order], 4, 3)
    assert np.array_equal(t2, t[order, :4]) and np.array_equal(q2, q[order, :4])
    with pytest.raises(ValueError, match="1 <= m <= 7"):
        bank.eagle_trees.alternatives(req, pos, 4, 8)


def test_ideal_engine_with_eagle_alternatives_verifies_the_leaves_at_no_extra_draft_forward():
    """The worker's setting ``eagle_alternatives`` (``EngineConfig.eagle_alternatives``): the ideal engine's HYBRID
    with the chain's next-best tokens as leaves drafts the same forwards as without them and, the price being 0 at
    batch 1 on a flat step time, commits at least as many tokens per step (a right leaf adds one where the chain
    stopped); the README's launch (padded width buckets) runs them too, charged the worker's launches for them; a
    trace that records none refuses them."""
    core = P._Core()
    bank, _ = _tree_bank(L=600, alpha=0.5, alpha_copy=0.5)
    runs = {}
    for m in (0, 3):
        eng = replay_engine.EngineConfig.ideal(adaptive_depth=False, eagle_alternatives=m)
        pol = replay_engine.engine_policies(core, eng, ())[0]
        assert pol.n_nodes == 12                 # the leaves compete for the chains' 12 nodes
        runs[m] = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.0,
                                                                              draft=0.01))
    assert runs[3].model_steps == 4 * runs[3].steps and runs[0].model_steps == 4 * runs[0].steps
    assert runs[3].tokens / runs[3].steps > 1.05 * runs[0].tokens / runs[0].steps
    chain = replay_engine.engine_policies(core, replay_engine.EngineConfig(adaptive_depth=False), ())[0]
    leaves = replay_engine.engine_policies(core, replay_engine.EngineConfig(adaptive_depth=False,
                                                                            eagle_alternatives=2), ())[0]
    assert leaves.n_nodes == chain.n_nodes       # the leaves compete for the chains' nodes (resolved_n_nodes)
    assert leaves.launches() == chain.launches() + 4       # top-k and three kernels (bench.step_launches)
    wide_bank, _ = _tree_bank(L=600, alpha=0.5, alpha_copy=0.5, k=17)
    padded = replay_sim.simulate(leaves, wide_bank, [0], batch=1,
                                 cost=linear_cost(base=1.0, per_token=0.0, draft=0.01))
    assert padded.steps > 0 and padded.model_steps == 4 * padded.steps
    assert replay_engine.EngineConfig(verify="ragged_sync", eagle_alternatives=2).eagle_alternatives == 2
    # a tree wider than the banks' default padding (n_nodes set to 72: room for 8 steps x (1 + 7) + 8 candidates)
    # runs on a bank padded for it, as the realistic runner pads its banks (Runner.bank_pad), and says why on one that
    # is not
    wide = replay_engine.EnginePolicy("wide", "merge", 8, 72, core, replay_engine.EngineConfig.ideal(
        num_steps=8, ngram_k=8, adaptive_depth=False, eagle_alternatives=7))
    with pytest.raises(ValueError, match="exceeds the replay's padding 64"):
        replay_sim.simulate(wide, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.0, draft=0.01))
    padded, _ = _tree_bank(L=600, alpha=0.5, alpha_copy=0.5, pad=72)
    res = replay_sim.simulate(wide, padded, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.0, draft=0.01))
    assert res.steps > 0 and res.model_steps == 8 * res.steps
    plain = replay_drafts.DraftBank(one_request_trace(L=40, k=8), k=8)
    pol = replay_engine.engine_policies(core, replay_engine.EngineConfig.ideal(eagle_alternatives=2), ())[0]
    with pytest.raises(replay_drafts.DrafterUnavailable, match="simulated drafter"):
        replay_sim.simulate(pol, plain, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.0, draft=0.01))


def _recorded_alternatives_trace(L=60, k=8, m=2, dead_from=None):
    """One request whose EAGLE chain is always wrong, with recorded alternatives (``TraceRequest.eagle_alt_tokens``)
    whose second one at chain position 0 is the output's next token, the others wrong; ``dead_from``: row 0's chain
    stops there (-1 tokens)."""
    rng = np.random.default_rng(5)
    req = one_request_trace(L=L, k=k, eagle_right=False, output=rng.integers(0, 5000, L))[0]
    alt = np.empty((L, k, m), np.int32)
    for j in range(m):
        alt[:, :, j] = req.eagle_tokens + 1000 * (j + 1)              # wrong and distinct: the truth is < 5000
    alt[:, 0, 1] = req.output                                         # position 0's second alternative is right
    probs = np.broadcast_to(np.array([0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01], np.float32)[:m], (L, k, m)).copy()
    if dead_from is not None:
        req.eagle_tokens[0, dead_from:] = -1
    return [dataclasses.replace(req, eagle_alt_tokens=alt, eagle_alt_probs=probs)]


def test_recorded_eagle_alternatives_are_served_and_a_right_one_is_accepted():
    """A recorded trace's alternatives (``drafts.RecordedAlternatives``): served by (request, position) as recorded,
    -1 / probability 0 at and past the chain's end, refused above the recorded count with the command that records
    more; and the ideal engine's HYBRID with ``eagle_alternatives`` verifies them, so a chain that is always wrong
    whose position-0 alternative is right commits that token and the bonus every step, where without the
    alternatives it commits about one."""
    core = P._Core()
    bank = replay_drafts.DraftBank(_recorded_alternatives_trace(dead_from=3), k=8)
    reqs = bank.requests
    t, q = bank.eagle_alt.alternatives(np.array([0, 0]), np.array([0, 5]), 6, 2)
    assert t.shape == (2, 6, 2) and q.dtype == np.float32
    assert (t[0, :3] == reqs[0].eagle_alt_tokens[0, :3]).all() and (t[0, 3:] == -1).all() and (q[0, 3:] == 0).all()
    assert (t[1] == reqs[0].eagle_alt_tokens[5, :6]).all() and (q[1] == reqs[0].eagle_alt_probs[5, :6]).all()
    with pytest.raises(replay_drafts.DrafterUnavailable, match="--trace-alternatives 3"):
        bank.eagle_alt.alternatives(np.array([0]), np.array([0]), 4, 3)
    bank = replay_drafts.DraftBank(_recorded_alternatives_trace(), k=8)
    runs = {}
    for m in (0, 2):
        eng = replay_engine.EngineConfig.ideal(adaptive_depth=False, eagle_alternatives=m)
        pol = replay_engine.engine_policies(core, eng, ())[0]
        runs[m] = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(base=1.0, per_token=0.0,
                                                                              draft=0.01))
    assert runs[0].tokens / runs[0].steps < 1.3
    assert runs[2].tokens >= 2 * runs[2].steps - 1                   # the last step may run out of output


def test_realistic_alternatives_modes_run_on_a_recorded_trace_tuned_like_their_chain_modes():
    """A real trace that records the head's alternatives runs HYBRID with ``eagle_alternatives`` in the launch with
    ``ragged_verify=on`` and the ideal engine (``Runner.alternatives_modes``), each tuned over the same (EAGLE
    steps, n-gram chain) pairs as the chain modes, at the chains' node budget, and ``alternatives_lines`` reports the
    real trace's cells beside the chain modes'."""
    R = replay_realistic
    reqs = [dataclasses.replace(_recorded_alternatives_trace(L=40, m=3)[0], id=f"code{i}") for i in range(4)]
    cfg = R.Config(requests=4, out_tokens=40, seeds=(0, 1), batches=(4,), eagle_ks=(2,), model_ks=(2,),
                   hybrid_steps=(6,), hybrid_ngram_ks=(16,), ngram_ks=(8,), sweep=False, decompose=False, plot=None,
                   eagle_alternatives=3)
    runner = R.Runner(cfg)
    assert runner.alternatives_modes == (R.RAGGED_ALTERNATIVES, R.ALTERNATIVES)
    bank = replay_drafts.DraftBank(reqs, runner.bank_k, ngram_width=runner.pw, pad=runner.bank_pad)
    groups = {"code": [0, 1, 2, 3]}
    runner.run_source("real", {0: bank, 1: bank}, {0: groups, 1: groups}, [("code", 4)], [0, 1],
                      runner.head_modes + runner.alternatives_modes, lambda *_: None)

    def tuned(mode) -> set:
        pols = runner.engine_pols[mode]
        return {(pols[n].num_steps, pols[n].engine.ngram_k, pols[n].n_nodes)
                for n in (k[4][len("tune:"):] for k in runner.runs
                          if k[:4] == ("real", mode, "code", 4) and k[4].startswith("tune:"))}

    for m in runner.alternatives_modes:
        assert tuned(m) == tuned(R.RAGGED) == {(s, k, s + k) for s in (4, 6) for k in (8, 16)}
        assert next(iter(runner.engine_pols[m].values())).engine.eagle_alternatives == 3
        assert runner.cell("real", m, "code", 4)["hybrid"] > 0
    lines = R.alternatives_lines(runner, [("code", 4)], "real")
    assert "real drafters (SmolLM2 + its EAGLE head, held out)" in lines[0]
    assert lines[1].startswith("  code B=4: ragged_verify=on ")
    assert "; ideal " in lines[1] and lines[-1].startswith("  at >= 0.97x the best single drafter: ")
