"""The replay's head of unknown calibration: the confidence temperature and bursty acceptance knobs
(`bench.replay.miscalibration`), and the simulated drafter with them (`bench.replay.synth.simulated_eagle`)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bench.replay import miscalibration as MC
from bench.replay import synth
from bench.replay.drafts import DraftBank
from bench.replay.traces import synthetic_trace


def _ece(p, y, bins: int = 10) -> float:
    idx = np.minimum((np.asarray(p) * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == i].mean() - y[idx == i].mean()) * (idx == i).sum()
                     for i in range(bins) if (idx == i).any()) / len(p))


@pytest.fixture(scope="module")
def bank():
    tr = synthetic_trace(n_code=4, n_chat=4, out_len=200, seed=3)
    b = DraftBank(tr.requests, 8)
    b.ensure("ngram")
    return b


def test_miscalibrated_head_distortion_is_a_logit_temperature():
    p = np.array([0.0, 0.1, 0.3, 0.5, 0.8, 0.95, 1.0])
    assert np.allclose(MC.distort(p, 1.0), p, atol=1e-6)
    hot, cold = MC.distort(p, 0.5), MC.distort(p, 2.0)
    inner = slice(1, -1)
    # over-confident below T = 1: further from 1/2 on both sides; under-confident above; 0, 1/2 and 1 fixed
    assert np.all(np.abs(hot[inner] - 0.5) >= np.abs(p[inner] - 0.5) - 1e-7)
    assert np.all(np.abs(cold[inner] - 0.5) <= np.abs(p[inner] - 0.5) + 1e-7)
    assert hot[0] == cold[0] == 0.0 and hot[-1] == cold[-1] == 1.0 and abs(hot[3] - 0.5) < 1e-6
    logit = lambda x: np.log(x) - np.log1p(-x)  # noqa: E731
    assert np.allclose(logit(hot[inner]), 2 * logit(p[inner]), atol=1e-4)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        MC.distort(p, 0.0)


def test_miscalibrated_head_bank_view_distorts_probabilities_only(bank):
    flags = synth.copy_flags(bank)
    toks, probs = synth.simulated_eagle(bank, flags, 0.7, 0.9, 8, seed=1)
    trees = synth.SimulatedEagleTrees(bank, flags, 0.7, 0.9, toks, probs, 1)
    honest = synth.with_eagle(bank, toks, probs, trees)
    assert MC.distorted(honest, 1.0) is honest
    hot = MC.distorted(honest, 0.5)
    req, pos = np.array([0, 1, 5]), np.array([0, 10, 30])
    t0, p0 = honest.eagle(req, pos, 8)
    t1, p1 = hot.eagle(req, pos, 8)
    assert np.array_equal(t0, t1) and np.allclose(p1, MC.distort(p0, 0.5))
    a0, ap0 = honest.eagle_alt.alternatives(req, pos, 4, 3)
    a1, ap1 = hot.eagle_alt.alternatives(req, pos, 4, 3)
    assert np.array_equal(a0, a1) and np.allclose(ap1, MC.distort(ap0, 0.5))
    # the honest head is calibrated, the distorted one is not: ECE over first chain tokens against the truth
    truth = bank.out_pad[bank.out_off.repeat(bank.lengths) + np.concatenate([np.arange(n) for n in bank.lengths])]
    right = (toks[:, 0] == truth).astype(float)
    assert _ece(probs[:, 0], right) < 0.03 < 0.06 < _ece(MC.distort(probs[:, 0], 0.5), right)
    assert honest.eagle_probs is probs              # the view leaves the bank it came from untouched


def test_bursty_draws_stay_uniform_and_correlate():
    rng = np.random.default_rng(0)
    lengths = [400] * 30
    u = MC.bursty_uniforms(rng, lengths, 8, rho=MC.BURST_RHO)
    assert u.shape == (12000, 8)
    assert stats.kstest(u[:, 3], "uniform").pvalue > 1e-3          # each draw is still uniform: the mean is kept
    g = stats.norm.ppf(u)
    along = np.corrcoef(g[:, 0], g[:, 5])[0, 1]                       # two tokens of one chain
    across = np.corrcoef(g[:-1, 0], g[1:, 0])[0, 1]                   # the same depth at consecutive positions
    assert 0.35 < along < 0.65 and 0.3 < across < 0.65
    flat = stats.norm.ppf(MC.bursty_uniforms(np.random.default_rng(0), lengths, 8, rho=0.0))
    assert abs(np.corrcoef(flat[:, 0], flat[:, 5])[0, 1]) < 0.05
    with pytest.raises(ValueError, match="rho must be in"):
        MC.bursty_uniforms(rng, lengths, 8, rho=1.0)


def test_bursty_simulated_drafter_keeps_the_acceptance_mean(bank):
    flags = synth.copy_flags(bank)
    truth = bank.out_pad[bank.out_off.repeat(bank.lengths) + np.concatenate([np.arange(n) for n in bank.lengths])]
    got = {}
    for burst in (0.0, MC.BURST_RHO):
        hits = []
        for seed in range(4):
            toks, probs = synth.simulated_eagle(bank, flags, 0.7, 0.9, 8, seed, burst=burst)
            hits.append((toks[:, 0] == truth).astype(float))
        got[burst] = np.concatenate(hits)
    assert abs(got[0.0].mean() - got[MC.BURST_RHO].mean()) < 0.03
    # bursty: consecutive positions' first tokens agree more often than independent draws do
    def agree(h):
        return float(np.mean(h[:-1] == h[1:]))
    assert agree(got[MC.BURST_RHO]) > agree(got[0.0]) + 0.03


def test_miscalibrated_head_token_twins_share_only_runs_that_read_no_probability(bank):
    """A policy that reads no draft probability (``reads_confidence`` False: fixed EAGLE, the trees, the chain
    oracle, the model-free drafters) replays a distorted head exactly as the honest one, so the sweep's temperatures
    share its run (`Runner.token_twins`); a policy that reads them (model-only adaptive) runs again, on its own bank."""
    from bench.replay import policies as P
    from bench.replay import realistic as RR
    from bench.replay.sim import simulate

    flags = synth.copy_flags(bank)
    toks, probs = synth.simulated_eagle(bank, flags, 0.7, 0.9, 8, seed=1)
    honest = synth.with_eagle(bank, toks, probs, synth.SimulatedEagleTrees(bank, flags, 0.7, 0.9, toks, probs, 1))
    hot = MC.distorted(honest, 0.5)
    cfg = RR.Config(requests=2, seeds=(0,), batches=(4,), model_ks=(4,), eagle_ks=(4,), eagle_trees=(),
                    hybrid_steps=(), hybrid_ngram_ks=(), ngram_ks=(8,), sweep=False, decompose=False, plot=None)
    runner = RR.Runner(cfg)
    runner.token_twins[("h", "T0.5")] = ("h", "T1")
    idx = list(range(len(bank.lengths)))
    fixed, adaptive = P.EagleFixed(4), runner.adaptive["model_adaptive_k4"]
    assert not fixed.reads_confidence and adaptive.reads_confidence
    spec = runner.specs.for_batch(4)
    for pol in (fixed, P.Oracle(4, 8)):
        shared = runner.sim(pol, honest, idx, 4, 0, (("h", "T1"), "-", "code", 4, pol.name, 0))
        assert runner.sim(pol, hot, idx, 4, 0, (("h", "T0.5"), "-", "code", 4, pol.name, 0)) is shared
        own = simulate(pol, hot, idx, 4, spec, seed=4, workload="code")
        assert (own.tokens, own.seconds) == (shared.tokens, pytest.approx(shared.seconds))
    one = runner.sim(adaptive, honest, idx, 4, 0, (("h", "T1"), "-", "code", 4, adaptive.name, 0))
    other = runner.sim(adaptive, hot, idx, 4, 0, (("h", "T0.5"), "-", "code", 4, adaptive.name, 0))
    assert other is not one and (("h", "T0.5"), "-", "code", 4, adaptive.name, 0) in runner.runs
    own = simulate(adaptive, hot, idx, 4, spec, seed=4, workload="code")
    assert (own.tokens, own.seconds) == (other.tokens, pytest.approx(other.seconds))


def test_miscalibrated_head_ece_pools_the_evaluation_runs_bins():
    """The sweep's ECE per point pools every evaluation run's recorded bins (one ``OutcomeBins``), skipping runs
    that recorded none; nothing recorded anywhere reads (None, 0)."""
    import types

    from bench.replay import calibration_sweep as CS
    from sglang_hybrid.calibration_metrics import ece
    from sglang_hybrid.online_calibration import OutcomeBins

    rng = np.random.default_rng(5)
    p, y = rng.random(300), rng.random(300) < 0.5
    recorded = []
    for lo, hi in ((0, 120), (120, 300)):
        bins = OutcomeBins()
        bins.add(p[lo:hi], y[lo:hi])
        recorded.append({"pred": bins.pred.tolist(), "label": bins.label.tolist(), "count": bins.count})
    empty = {"pred": [0.0] * 10, "label": [0.0] * 10, "count": 0}
    runs = {("code", 4): [recorded[0], empty], ("chat", 4): [recorded[1]], ("code", 128): [None]}
    runner = types.SimpleNamespace(
        cfg=types.SimpleNamespace(seeds=(0, 1, 2)),
        seeds_of=lambda key, seeds: [types.SimpleNamespace(stats={} if st is None else {"model_calibration": st})
                                     for st in runs[(key[2], key[3])]])
    got, n = CS.pooled_ece(runner, "src", list(runs))
    assert n == 300 and got == pytest.approx(ece(p, y), rel=1e-12)
    assert CS.pooled_ece(runner, "src", [("code", 128)]) == (None, 0)
