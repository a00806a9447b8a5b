"""The model side's online temperature (``sglang_hybrid.online_calibration``, setting ``model_calibration_eta``):
one step against a numpy oracle, what it must not learn from, its in-place and graph-safe update, recovering a head
distorted by a temperature in 0.5..2 (the tests named ``miscalibrated_head``), the worker's ``HybridStep`` learning it
after verify on the torch and the fused path, and the replay engine learning and recording it."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_hybrid import online_calibration as oc
from sglang_hybrid.calibration import CAL_EPS, ModelCalibration
from sglang_hybrid.calibration_metrics import ece
from sglang_hybrid.request_bias import chain_outcome
from sglang_hybrid.sglang_plugin.config import MODEL_CALIBRATION_ETA as DEFAULT_ETA
from tests.helpers.online_steps import drive as _drive, hybrid_step as _hybrid_step

ROOT = Path(__file__).resolve().parents[2]
KAPPA = 6.0          # the replay's simulated drafter's Beta concentration (bench.replay.synth.KAPPA)


def _chain_case(rng, b: int, s: int):
    """Random draft probabilities and a chain's outcome: tested up to and including the first miss."""
    prob = torch.as_tensor(rng.random((b, s)), dtype=torch.float32)
    right = rng.random((b, s)) < rng.random((b, s))
    tested = torch.as_tensor(np.cumprod(np.concatenate([np.ones((b, 1), bool), right[:, :-1]], 1), 1) > 0)
    hit = tested & torch.as_tensor(right)
    acceptance = torch.as_tensor(rng.random((b, s)), dtype=torch.float32)
    return prob, tested, hit, acceptance


def _oracle_step(temps, sq, prob, tested, hit, acceptance, eta):
    """One step by the module docstring's formula, element by element in float64."""
    temps = np.asarray(temps, np.float64)
    p_n = temps.size
    g = np.zeros(p_n)
    for i in range(prob.shape[0]):
        for j in range(prob.shape[1]):
            if not tested[i, j]:
                continue
            d = min(j, p_n - 1)
            # clamped in float32, as the calibration reads a probability
            p = float(np.clip(np.float32(prob[i, j]), np.float32(CAL_EPS), np.float32(1 - CAL_EPS)))
            z = math.log(p) - math.log1p(-p)
            a = float(acceptance[i, j]) if acceptance is not None else 1 / (1 + math.exp(-z / temps[d]))
            g[d] += (a - float(hit[i, j])) * z
    g = g + oc.POOL * g.sum()
    g2 = oc.DECAY * np.asarray(sq, np.float64) + g * g
    w = np.clip(1 / temps - eta * g / (np.sqrt(g2) + oc.NORM_EPS), oc.W_MIN, oc.W_MAX)
    return 1 / w, g2, g


@pytest.mark.parametrize("with_acceptance", [True, False])
def test_online_temperature_step_matches_numpy_oracle(with_acceptance):
    """Gradient and step against the formula: 5 chain columns on 3 temperatures (columns 2..4 share the last, as the
    calibration reads them), the priced acceptances or the calibration's own, from temperatures not all 1."""
    rng = np.random.default_rng(0)
    prob, tested, hit, acceptance = _chain_case(rng, 6, 5)
    prob[0, 0], prob[1, 0] = 0.0, 1.0                     # clamped into (CAL_EPS, 1 - CAL_EPS) as the calibration does
    tested[0, 0] = tested[1, 0] = True
    acc = acceptance if with_acceptance else None
    temps = torch.tensor([0.8, 1.3, 2.0])
    sq = torch.tensor([0.5, 0.0, 3.0])
    want_t, want_sq, want_g = _oracle_step(temps.numpy(), sq.numpy(), prob.numpy(), tested.numpy(), hit.numpy(),
                                           None if acc is None else acc.numpy(), 0.1)
    g = oc.temperature_gradient(temps, prob, tested, hit, acc)
    np.testing.assert_allclose(g.numpy(), want_g, rtol=1e-9)
    oc.update_temperatures(temps, sq, prob, tested, hit, 0.1, acc)
    np.testing.assert_allclose(temps.numpy(), want_t, rtol=1e-6)
    np.testing.assert_allclose(sq.numpy(), want_sq, rtol=1e-6)


def test_online_temperature_learns_nothing_from_untested_tokens():
    """A step that tested nothing moves no temperature (the squared gradients only decay); what untested positions
    hold (probability, hit, acceptance) changes nothing."""
    rng = np.random.default_rng(1)
    prob, tested, hit, acceptance = _chain_case(rng, 8, 4)
    temps, sq = torch.tensor([1.2, 0.7, 1.0, 1.5]), torch.tensor([1.0, 2.0, 0.0, 4.0])
    t0, s0 = temps.clone(), sq.clone()
    none = torch.zeros_like(tested)
    oc.update_temperatures(temps, sq, prob, none, hit & none, 0.1, acceptance)
    assert torch.equal(temps, t0)
    assert torch.allclose(sq, s0 * oc.DECAY)
    # the same tested tokens with everything else scrambled where nothing was tested: the same step
    steps = []
    for k in range(2):
        t, s = t0.clone(), s0.clone()
        p2, a2, h2 = prob.clone(), acceptance.clone(), hit.clone()
        if k:
            p2[~tested] = torch.rand(int((~tested).sum()))
            a2[~tested] = torch.rand(int((~tested).sum()))
            h2[~tested] = True
        oc.update_temperatures(t, s, p2, tested, h2 & tested, 0.1, a2)
        steps.append((t, s))
    assert torch.equal(steps[0][0], steps[1][0]) and torch.equal(steps[0][1], steps[1][1])
    assert not torch.equal(steps[0][0], t0)


def test_online_temperature_updates_the_tables_in_place():
    """The step writes into the tables' own tensor (same storage), so a decision holding them prices with the new
    temperatures at its next step; ``reset`` returns to the starting ones (a calibration file's)."""
    from sglang_hybrid.step import DecisionStep, ModelDraft

    tables = ModelCalibration(np.array([0.9, 1.1, 1.0])).to("cpu")
    ptr = tables.temperatures.data_ptr()
    step = DecisionStep(mode="choose", n_nodes=3, model_calibration=tables)
    draft = ModelDraft(torch.tensor([[5, 6, 7]]), torch.tensor([[0.8, 0.6, 0.4]]), torch.tensor([3]))
    before = step.model_acceptance(draft)
    online = oc.OnlineTemperature(tables, 0.5)
    tested = torch.tensor([[True, True, True]])
    online.update(draft.confidence, tested, torch.tensor([[True, True, True]]))   # all hit: more confident
    assert tables.temperatures.data_ptr() == ptr and online.temperatures is tables.temperatures
    after = step.model_acceptance(draft)
    assert (after > before).all()
    online.reset()
    assert torch.allclose(tables.temperatures, torch.tensor([0.9, 1.1, 1.0]))
    assert torch.equal(online.sq_grad, torch.zeros(3))


def test_online_temperature_step_compiles_fullgraph():
    """No host read, no data-dependent branch: ``torch.compile(fullgraph=True)`` traces the chain outcome and the
    step, and its in-place writes equal eager ones."""
    rng = np.random.default_rng(2)
    prob, _, _, acceptance = _chain_case(rng, 3, 4)
    tokens = torch.tensor([[1, 2, 3, 4], [4, 5, 6, 7], [7, 8, 9, 1]])
    committed = torch.tensor([[1, 2, 9, 0, 0], [4, 5, 6, 7, 3], [2, 0, 0, 0, 0]])
    n = torch.tensor([3, 5, 1])

    def run(temps, sq, prob, acceptance, tokens, committed, n):
        tested, hit = chain_outcome(tokens, torch.full_like(n, tokens.shape[1]), committed, n)
        oc.update_temperatures(temps, sq, prob, tested, hit, 0.1, acceptance)
        return temps, sq

    eager = run(torch.ones(4), torch.zeros(4), prob, acceptance, tokens, committed, n)
    torch._dynamo.reset()
    t, s = torch.ones(4), torch.zeros(4)
    ptr = t.data_ptr()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")(t, s, prob, acceptance, tokens, committed, n)
    assert torch.allclose(eager[0], compiled[0]) and torch.allclose(eager[1], compiled[1])
    assert torch.allclose(t, eager[0]) and t.data_ptr() == ptr                      # written in place
    assert not torch.equal(eager[0], torch.ones(4))


def test_outcome_bins_ece_equals_calibration_metrics():
    rng = np.random.default_rng(3)
    bins = oc.OutcomeBins()
    assert bins.ece is None
    p, y = rng.random(1000), rng.random(1000) < 0.6
    for lo in range(0, 1000, 137):
        bins.add(p[lo:lo + 137], y[lo:lo + 137])
    assert bins.count == 1000 and bins.ece == pytest.approx(ece(p, y), rel=1e-12)
    # two runs' recorded bins pooled: the ECE of all their pairs together; bins of another size refused
    first, second = oc.OutcomeBins(), oc.OutcomeBins()
    first.add(p[:400], y[:400])
    second.add(p[400:], y[400:])
    first.merge(second.pred.tolist(), second.label.tolist(), second.count)
    assert first.count == 1000 and first.ece == pytest.approx(ece(p, y), rel=1e-12)
    with pytest.raises(ValueError, match="bins of another size"):
        first.merge([0.0] * 5, [0.0] * 5, 3)


def _distort(p, t):
    q = np.clip(p, 1e-6, 1 - 1e-6)
    return 1 / (1 + np.exp(-(np.log(q) - np.log1p(-q)) / t))


def _simulate(head_t: float, eta, batch: int = 8, steps: int = 1200, after: int = 600, depth: int = 4, seed: int = 0):
    """The replay's simulated drafter (true confidence ~ Beta around 0.7 or 0.9, each chain token right with its
    confidence given the earlier ones were), its reported probability distorted at ``head_t``, priced by the
    identity calibration learned online at ``eta`` (None: off). Returns (ECE of the tested tokens' priced acceptance
    over the steps after ``after``, the temperatures)."""
    rng = np.random.default_rng(seed)
    tables = ModelCalibration.identity(8).to("cpu")
    online = oc.OnlineTemperature(tables, eta) if eta is not None else None
    bins = oc.OutcomeBins()
    pos = torch.arange(1, depth + 1).expand(batch, depth)
    for t in range(steps):
        mean = np.where(rng.random((batch, 1)) < 0.3, 0.9, 0.7)
        c = rng.beta(mean * KAPPA, (1 - mean) * KAPPA, size=(batch, depth))
        right = rng.random((batch, depth)) < c
        p = torch.as_tensor(_distort(c, head_t), dtype=torch.float32)
        a = tables.acceptance(p, pos)
        tested = torch.as_tensor(np.cumprod(np.concatenate([np.ones((batch, 1), bool), right[:, :-1]], 1), 1) > 0)
        hit = tested & torch.as_tensor(right)
        if t >= after:
            bins.add(a[tested].numpy(), hit[tested].numpy())
        if online is not None:
            online.update(p, tested, hit, a)
    return bins.ece, tables.temperatures.numpy().copy()


@pytest.mark.parametrize("head_t", [0.5, 0.7, 1.0, 1.5, 2.0])
def test_miscalibrated_head_temperature_recovered(head_t):
    """A head whose probability is ``sigmoid(logit(q) / T)`` of the true acceptance ``q``: the learned temperature of
    every drafted depth comes back to within 10 % of ``T`` (the distortion's inverse temperature ``1 / T_learned``;
    depths never drafted, which follow the pooled gradient, within 15 %) and the priced acceptance's
    ECE after learning is at most 0.05, where without the correction it is above 0.05 away from T = 1 (and learning
    leaves an honest head's within 0.01 of off)."""
    on, temps = _simulate(head_t, DEFAULT_ETA)
    off, _ = _simulate(head_t, None)
    w = 1 / temps[:4]
    assert np.all(np.abs(w - head_t) <= 0.1 * head_t), (head_t, w)
    assert on <= 0.05, (head_t, on)
    if head_t in (0.5, 2.0):
        assert off > 0.05, (head_t, off)
    if head_t == 1.0:
        assert on <= off + 0.01, (on, off)
    # depths never drafted follow the pooled gradient: they head the same way, where a deeper draft would start
    assert np.all(np.abs(1 / temps[4:] - head_t) <= 0.15 * head_t), (head_t, 1 / temps[4:])


def test_miscalibrated_head_learning_starts_from_a_calibration_file():
    """Learning starts from the tables it is given (a user's calibration file's): a file already right for the head
    stays there, one that is wrong is corrected."""
    rng_t = 1.6
    for start in (1 / rng_t, 1.0):
        tables = ModelCalibration(np.full(4, start)).to("cpu")
        online = oc.OnlineTemperature(tables, DEFAULT_ETA)
        assert torch.allclose(online.start, torch.full((4,), start))
        rng = np.random.default_rng(4)
        pos = torch.arange(1, 5).expand(16, 4)
        for _ in range(400):
            c = rng.beta(0.7 * KAPPA, 0.3 * KAPPA, size=(16, 4))
            right = rng.random((16, 4)) < c
            p = torch.as_tensor(_distort(c, rng_t), dtype=torch.float32)
            tested = torch.as_tensor(np.cumprod(np.concatenate([np.ones((16, 1), bool), right[:, :-1]], 1), 1) > 0)
            online.update(p, tested, tested & torch.as_tensor(right), tables.acceptance(p, pos))
        assert np.allclose(1 / tables.temperatures.numpy(), rng_t, rtol=0.1), tables.temperatures


def test_hybrid_step_after_verify_learns_the_temperatures_torch_path(tmp_path):
    """The worker's step (torch path), default settings: after every verify the decision's own temperature tensor
    moves by ``update_temperatures`` of the step's chain outcome (``chain_outcome`` against the emitted tokens) and
    the acceptances it priced; with the setting off nothing learns; a calibration file's temperatures are where it
    starts."""
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    assert HybridSettings().model_calibration_eta == DEFAULT_ETA
    st = _hybrid_step("torch")
    assert st.online_temperature is not None and st.online_temperature.tables is st.decide.model_cal
    temps, sq = torch.ones(16), torch.zeros(16)
    for (slots, gen, chain, bias, acceptance, conf), emitted, acc in _drive(st):
        tested, hit = chain_outcome(chain, torch.full_like(acc, 4), emitted, acc)
        oc.update_temperatures(temps, sq, conf, tested, hit, DEFAULT_ETA, acceptance)
    assert not torch.equal(temps, torch.ones(16))
    assert torch.allclose(st.decide.model_cal.temperatures, temps, rtol=1e-6)

    off = _hybrid_step("torch", model_calibration_eta=None)
    assert off.online_temperature is None
    assert all(k[0][5] is None for k in _drive(off))
    assert torch.equal(off.decide.model_cal.temperatures, torch.ones(16))

    path = tmp_path / "model_cal.json"
    ModelCalibration(np.array([1.3, 0.8, 1.1, 0.9])).save(path)
    user = _hybrid_step("torch", model_calibration=str(path))
    assert torch.allclose(user.online_temperature.start, torch.tensor([1.3, 0.8, 1.1, 0.9]))
    _drive(user, 1)
    moved = user.decide.model_cal.temperatures
    assert not torch.allclose(moved, torch.tensor([1.3, 0.8, 1.1, 0.9]))
    assert (moved - torch.tensor([1.3, 0.8, 1.1, 0.9])).abs().max() < 0.5       # a step from the file's, not from 1


def test_hybrid_step_after_verify_learns_the_temperatures_fused_path():
    """The fused path (Triton's interpreter): the decision's kernel keeps the chain's probabilities and the
    after-verify kernel takes the same step as the torch path (within float32 rounding of the acceptances the two
    paths price), with no launch of its own, also summing a 40-request batch over a GPU's two loop iterations; off,
    the temperatures stay."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "tests.core._scripts.online_temperature_fused"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["conf_kept"]
    assert res["fused"] != [1.0] * 16
    np.testing.assert_allclose(res["fused"], res["torch"], rtol=1e-5)
    np.testing.assert_allclose(res["fused_sq"], res["torch_sq"], rtol=1e-5)
    assert res["off"] == [1.0] * 16
    assert res["wide"][0] != [1.0] * 16
    np.testing.assert_allclose(res["wide"][0], res["wide"][1], rtol=1e-5)


def test_replay_engine_learns_the_temperature_and_records_the_model_ece():
    """The replay's as-built HYBRID (default engine: the setting's default rate) learns its own copy of the model
    calibration from each step's chain outcome (the core's shared tables untouched), and records the model side's ECE
    over the tested tokens after ``calibration_after_steps``: on a head distorted at T = 2 the learned temperature
    heads to 1/2 and the ECE drops below the uncorrected one; a ``reset`` starts again from the core's."""
    from bench.replay import drafts as replay_drafts, engine as replay_engine, policies as P, sim as replay_sim
    from bench.replay.traces import TraceRequest
    from tests.helpers.replay_traces import linear_cost

    rng = np.random.default_rng(5)
    n, k = 800, 4
    out = rng.integers(0, 50, n).astype(np.int32)
    c = rng.beta(0.7 * KAPPA, 0.3 * KAPPA, size=(n, k))
    right = rng.random((n, k)) < c
    truth = np.stack([np.where(np.arange(n) + j < n, np.roll(out, -j), 0) for j in range(k)], 1)
    toks = np.where(right, truth, truth + 100).astype(np.int32)
    reqs = [TraceRequest("r0", "chat", rng.integers(0, 50, 10).astype(np.int32), out, toks,
                         _distort(c, 2.0).astype(np.float32))]
    bank = replay_drafts.DraftBank(reqs, k=k, ngram_width=replay_engine.EngineConfig(num_steps=k).proposal_width)
    core = P._Core()
    start = core.model_cal.temperatures.clone()
    res = {}
    for eta in (DEFAULT_ETA, None):
        eng = replay_engine.EngineConfig(num_steps=k, calibration_after_steps=100, model_calibration_eta=eta)
        assert replay_engine.EngineConfig().model_calibration_eta == DEFAULT_ETA
        pol = replay_engine.EnginePolicy("h", "merge", k, 8, core, eng)
        r = replay_sim.simulate(pol, bank, [0], batch=1, cost=linear_cost(), lockstep_start=True)
        res[eta] = (r.stats, pol)
    on, pol = res[DEFAULT_ETA]
    off, _ = res[None]
    assert torch.equal(core.model_cal.temperatures, start)
    assert on["model_ece_tokens"] > 150 and off["model_ece_tokens"] > 150
    assert off["model_temperatures"] is None and on["model_temperatures"] is not None
    assert all(0.35 < t < 0.75 for t in on["model_temperatures"][:2]), on["model_temperatures"]
    assert on["model_ece"] < off["model_ece"] and on["model_ece"] <= 0.06, (on["model_ece"], off["model_ece"])
    pol.reset(1)
    assert torch.equal(pol.model_cal.temperatures, start) and pol.model_bins.count == 0
