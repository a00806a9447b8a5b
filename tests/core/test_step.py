"""The decode step is composed in one place (``sglang_hybrid.step.DecisionStep``) and every engine calls it."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.cost import CostModel
from sglang_hybrid.selector import Source
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_parents, chain_survival
from tests.helpers.trees import paths

ROOT = Path(__file__).resolve().parents[2]
B, S, K = 3, 4, 5


def _drafts(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = ModelDraft(torch.randint(0, 50, (B, S), generator=g), torch.rand((B, S), generator=g),
                       torch.tensor([S, S, S]))
    tokens = torch.randint(0, 50, (B, K), generator=g)
    tokens[0, :2] = model.tokens[0, :2]                      # shared prefix: merge folds it
    length = torch.tensor([K, 2, 0])
    j = torch.arange(K)[None]
    valid = j < length[:, None]
    feats = dict(match_len=torch.where(valid, torch.randint(1, 40, (B, K), generator=g), 0),
                 count=torch.where(valid, torch.randint(1, 4, (B, K), generator=g), 0),
                 total=torch.where(valid, torch.full((B, K), 4), 0), depth=torch.where(valid, j + 1, 0),
                 source=torch.zeros((B, K), dtype=torch.int64))
    ngram = NgramDraft(torch.where(valid, tokens, -1), chain_parents(B, K), length, **feats)
    return torch.tensor([7, 8, 9]), model, ngram


def _calls(tree: ast.AST, names) -> list[str]:
    """Calls of the core functions ``names``: bare (``select(...)``) or through their module
    (``selector.select(...)``, ``price.price_device(...)``, ``core.selector.select(...)``)."""
    modules = {"select": "selector", "price_device": "price"}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in names:
            out.append(f.id)
        elif isinstance(f, ast.Attribute) and f.attr in names:
            owner = f.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if owner_name == modules[f.attr]:
                out.append(f.attr)
    return out


def test_only_the_core_step_composes_price_and_selection():
    """No engine, tool or benchmark prices and selects on its own: ``price_device`` and ``select`` are called in
    ``step.py`` and nowhere else (their own modules and tests aside)."""
    component_benchmarks = {"bench/step_cost.py": ["select"]}     # times the selector alone, beside the step
    offenders = {}
    files = list((ROOT / "sglang_hybrid").rglob("*.py")) + list((ROOT / "bench").rglob("*.py"))
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("sglang_hybrid/step.py", "sglang_hybrid/price.py", "sglang_hybrid/selector.py"):
            continue
        calls = _calls(ast.parse(path.read_text()), {"price_device", "select"})
        if calls and calls != component_benchmarks.get(rel):
            offenders[rel] = calls
    assert not offenders, f"compose the decode step through sglang_hybrid.step.DecisionStep: {offenders}"


@pytest.mark.parametrize("mode", ["choose", "merge"])
def test_worker_reference_loop_and_replay_decide_the_same_tree(mode, tmp_path):
    """The SGLang worker's ``HybridStep`` (n-gram proposal published and aligned on the device first), the CPU
    reference loop and the replay's HYBRID policy core give the same tree, budget and price as the core step for the
    same drafts (the worker with its verify width buckets, the others ragged)."""
    from sglang_hybrid.reference.loop import ReferenceLoop
    from sglang_hybrid.reference.models import tiny_target
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    root, model, ngram = _drafts()
    cost = CostModel([1, 16, 64, 256], [1.0, 1.1, 1.6, 4.0])
    cost_file = tmp_path / "cost.json"
    cost.save(cost_file)
    core = DecisionStep(mode=mode, n_nodes=8, model_calibration=ModelCalibration.identity().to(),
                        ngram_calibration=NgramCalibration.load().to())
    want = core(root, model, ngram, cost=cost.to("cpu"))

    settings = HybridSettings(mode=mode, ngram_k=K, n_nodes=8, cost_table=str(cost_file))
    worker = HybridStep(settings, num_steps=S, pool_size=4, device="cpu")
    slots, seq_lens, gen = torch.tensor([0, 2, 3]), torch.tensor([10, 20, 30]), torch.tensor([1, 1, 1])
    pad = worker.proposal_width - K        # the worker buffers longer proposals; the extra columns stay empty

    def wide(x, fill=0):
        return torch.cat([x, torch.full((B, pad), fill, dtype=x.dtype)], 1)

    alignment.publish(worker.buffers, slots, wide(ngram.tokens, -1), ngram.length, seq_lens + 1, gen,
                      wide(ngram.match_len), wide(ngram.count), wide(ngram.total), wide(ngram.source))
    got = worker.select(root, model.tokens, model.confidence, slots, gen, seq_lens)
    # the worker verifies padded to a width bucket: the core step with the worker's widths decides the same
    padded = DecisionStep(mode=mode, n_nodes=8, model_calibration=ModelCalibration.identity().to(),
                          ngram_calibration=NgramCalibration.load().to(), widths=worker.widths)
    want_padded = padded(root, model, ngram, cost=cost.to("cpu"))
    for name in want_padded.tree._fields:
        a, b = getattr(want_padded.tree, name), getattr(got.tree, name)
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name
    for name in ("b_star", "lam", "next_width"):
        assert torch.equal(getattr(got, name), getattr(want_padded, name)), name

    loop = ReferenceLoop(tiny_target().model, mode=mode, head=object(), n_nodes=8, ngram_k=K, ngram_tree=False)
    assert isinstance(loop.decide, DecisionStep)
    loop_d = loop.decide(root, model, ngram, cost=cost.to("cpu"))

    from bench.replay.policies import _Core

    core = _Core()
    feats = {k: getattr(ngram, k).numpy() for k in ("tokens", "match_len", "count", "total", "depth", "source")}
    replay_d = core.decide(root.numpy(), mode, 8, cost.to("cpu"),
                           model=core.model_draft(model.tokens.numpy(), model.confidence.numpy()),
                           ngram=core.ngram_draft(dict(feats, lengths=ngram.length.numpy()), tree=False))

    for got in (loop_d.tree, replay_d.tree):               # ragged verify: the price masks nodes
        for name in want.tree._fields:
            a, b = getattr(want.tree, name), getattr(got, name)
            assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name
    for d in (loop_d, replay_d):
        assert torch.equal(d.b_star, want.b_star) and torch.equal(d.lam, want.lam)
    if mode == "merge":
        assert (want.tree.source == Source.SHARED).any()          # the shared prefix was folded


def test_absent_drafters_enter_as_empty_sources():
    root, model, ngram = _drafts(1)
    step = DecisionStep(mode="choose", n_nodes=6, ngram_calibration=NgramCalibration.load().to())
    only_model = step(root, model, None)
    assert set(only_model.tree.source[only_model.tree.valid].tolist()) <= {-1, int(Source.MODEL)}
    assert only_model.ngram_survival.shape == (B, 0) and float(only_model.lam) == 0.0
    assert int(only_model.b_star) == B * S                       # no cost table: the whole pool
    only_ngram = step(root, None, ngram)
    assert set(only_ngram.tree.source[only_ngram.tree.valid].tolist()) <= {-1, int(Source.NGRAM)}
    with pytest.raises(ValueError, match="no n-gram calibration"):
        DecisionStep(mode="merge", n_nodes=4)(root, model, ngram)
    with pytest.raises(ValueError, match="mode"):
        DecisionStep(mode="best", n_nodes=4)


def test_step_compiles_fullgraph():
    root, model, ngram = _drafts(2)
    step = DecisionStep(mode="merge", n_nodes=8, ngram_calibration=NgramCalibration.load().to())
    cost = CostModel([1, 16, 64, 256], [1.0, 1.1, 1.6, 4.0]).to("cpu")
    want = step(root, model, ngram, cost=cost, check_values=False)
    torch._dynamo.reset()
    fn = torch.compile(lambda: step(root, model, ngram, cost=cost, check_values=False), fullgraph=True,
                       backend="aot_eager")
    got = fn()
    assert torch.equal(got.tree.tokens, want.tree.tokens) and torch.equal(got.b_star, want.b_star)
    assert np.isclose(float(got.lam), float(want.lam))


def test_step_cost_times_adaptive_drafting():
    """``bench.step_cost --depths`` times the decision as the reference loop runs it (every candidate depth scored,
    the full-width tree of the drafted chain returned); malformed depths are refused before any timing."""
    from bench import step_cost

    x = step_cost.make_step_inputs(4, 8, 16, True, 16, with_logits=False)
    b_star, lam, tree = step_cost.decide(x, "merge", 16, True, depths=(0, 1, 2, 3, 4, 8))
    assert tree.tokens.shape == (4, 17) and b_star.dim() == 0 and lam.dim() == 0
    for bad in ("1,2", "a,8", "-1,8"):
        with pytest.raises(SystemExit):
            step_cost.main(["--no-model", "--batches", "1", "--depths", bad])


def test_with_widths_keeps_every_setting_but_the_buckets():
    """``DecisionStep.with_widths``: a copy choosing among other widths (the full width always added), with the same
    mode, node budget, calibrations, depths and probing; the original is untouched; a ragged step (no widths)
    refuses."""
    base = DecisionStep(mode="merge", n_nodes=12, ngram_calibration=NgramCalibration.load().to(),
                        widths=(4, 5, 8, 13), depths=(1, 4), probe_half_life=3.0)
    base._constant("widths", base.widths, "cpu")
    narrow = base.with_widths([8, 5])
    assert narrow.widths == (5, 8, 13) and base.widths == (4, 5, 8, 13)
    assert (narrow.mode, narrow.n_nodes, narrow.depths, narrow.probe_keep) == ("merge", 12, (1, 4), base.probe_keep)
    assert narrow.model_cal is base.model_cal and narrow.ngram_cal is base.ngram_cal
    assert narrow._constant("widths", narrow.widths, "cpu").tolist() == [5, 8, 13]      # no stale bucket constant
    assert base._constant("widths", base.widths, "cpu").tolist() == [4, 5, 8, 13]
    with pytest.raises(ValueError, match="outside"):
        base.with_widths([14])
    with pytest.raises(ValueError, match="ragged"):
        DecisionStep(mode="merge", n_nodes=12).with_widths([5])


def _alternatives(model: ModelDraft, m: int, seed: int, scale: float = 0.3) -> ModelDraft:
    g = torch.Generator().manual_seed(seed)
    b, s = model.tokens.shape
    return model._replace(alt_tokens=torch.randint(50, 400, (b, s, m), generator=g),
                          alt_confidence=torch.rand((b, s, m), generator=g) * scale)


def _paths(tree, row: int) -> dict:
    """{token path from the root: survival} of a verify tree's valid nodes (root excluded)."""
    return {path: float(tree.survival[row, i]) for i, path in paths(tree, row).items()}


def test_model_alternatives_hang_as_leaves_beside_the_chain_against_a_brute_force():
    """``ModelDraft.alt_tokens``: each position's next-best tokens join the tree as leaves beside the chain token,
    children of the chain's previous token, at the parent's survival times their (identity-calibrated) probability;
    none past the chain's length. Brute force: every candidate path and its survival written out by hand, the n-gram
    chain's folded in by path (merge keeps the larger estimate), all kept at price 0 with room for every node."""
    root, model, ngram = _drafts(3)
    model = _alternatives(model._replace(length=torch.tensor([S, 2, 0])), 2, seed=4)
    step = DecisionStep(mode="merge", n_nodes=S * 3 + K, ngram_calibration=NgramCalibration.load().to())
    got = step(root, model, ngram, check_values=True)
    s_n = step.ngram_survival(ngram)
    for row in range(B):
        want: dict = {}
        n = int(model.length[row])
        surv, prefix = 1.0, ()
        for j in range(n):
            for r in range(2):
                p = surv * float(model.alt_confidence[row, j, r])
                key = prefix + (int(model.alt_tokens[row, j, r]),)
                want[key] = max(want.get(key, 0.0), p)
            surv *= float(model.confidence[row, j])
            prefix += (int(model.tokens[row, j]),)
            want[prefix] = max(want.get(prefix, 0.0), surv)
        for j in range(int(ngram.length[row])):
            key = tuple(int(t) for t in ngram.tokens[row, :j + 1])
            want[key] = max(want.get(key, 0.0), float(s_n[row, j]))
        have = _paths(got.tree, row)
        assert set(have) == {k for k, v in want.items() if v > 0}
        assert all(have[k] == pytest.approx(want[k], rel=1e-5) for k in have)
        assert float(got.tree.expected_accepted[row]) == pytest.approx(sum(want.values()), rel=1e-5)
    # no alternatives where the chain has no token: row 2 drafted nothing, so its tree is the n-gram chain's alone
    assert set(got.tree.source[2][got.tree.valid[2]].tolist()) <= {-1, int(Source.NGRAM)}


def test_an_alternative_as_likely_as_the_chains_token_ties_with_it_exactly():
    """A chain token and an alternative beside it with the same draft probability get bit-equal survivals (the
    alternative's is the chain's expression: the parent's float64 product times its acceptance, rounded once), under a
    calibration and an online offset whose acceptances are not exact in float32. A float32 parent times the acceptance
    gave an ulp of difference in some of these, and which of the two came first then hung on the last bits of the
    acceptance: the fused kernels and this reference ordered such a pair differently (``bench.fused_exactness``).
    With the tie exact, both order it by the tie-break (depth, then pool index: the chain's token first)."""
    g = torch.Generator().manual_seed(9)
    b, s, m = 64, 7, 2
    conf = torch.rand((b, s), generator=g)
    tokens = torch.randint(0, 50, (b, s), generator=g)
    model = ModelDraft(tokens, conf, torch.full((b,), s), alt_tokens=tokens[:, :, None] + 100 + torch.arange(m),
                       alt_confidence=torch.stack([conf, torch.rand((b, s), generator=g)], -1))
    step = DecisionStep(mode="choose", n_nodes=s * (1 + m),
                        model_calibration=ModelCalibration(np.array([1.37, 0.61, 1.9])).to("cpu"))
    bias = torch.randn(b, generator=g)
    a = step.model_acceptance(model, bias=bias)
    chain = chain_survival(a, model.length)
    leaves = step.alternatives_survival(model, a, bias=bias)
    assert torch.equal(leaves[:, :, 0], chain)
    float32_parent = torch.cat([torch.ones((b, 1)), chain[:, :-1]], 1) * a
    assert not torch.equal(float32_parent, chain)          # the expression the tie needs: not a float32 product
    tree = step(tokens[:, 0], model, None, model_bias=bias).tree
    for row in range(b):
        order = [(int(tree.depth[row, i]), int(tree.tokens[row, i])) for i in range(1, tree.tokens.shape[1])
                 if tree.valid[row, i]]
        for j in range(s):      # equal survivals: the chain's token (first in the pool) ahead of its twin leaf
            mine, twin = (j + 1, int(tokens[row, j])), (j + 1, int(tokens[row, j]) + 100)
            if mine in order and twin in order:
                assert order.index(mine) < order.index(twin)


def test_one_probability_gets_one_acceptance_wherever_it_sits():
    """The calibration and the online offset give a probability the same acceptance whatever the tensor's size and
    the element's place in it: 200 probabilities priced in one ``[200, 1]`` tensor and one at a time. torch's CPU
    kernels take a vectorised path or a scalar one by both, and in float32 the two differ in the last bit (12 and 14
    of these 200 did): the EAGLE chain (``[B, S]``) and its alternatives (``[B, S x M]``) then priced one probability
    two ways, and an equally likely chain token and alternative were no longer tied."""
    from sglang_hybrid.request_bias import corrected_acceptance

    cal = ModelCalibration(np.array([1.0761874040083432, 0.61])).to("cpu")
    probs = torch.rand(200, generator=torch.Generator().manual_seed(3))
    ones = torch.ones((200, 1), dtype=torch.int64)
    together = cal.acceptance(probs[:, None], ones)
    alone = torch.cat([cal.acceptance(probs[i].view(1, 1), ones[:1]) for i in range(200)])
    assert torch.equal(together, alone)
    bias = torch.full((200,), -0.0554)
    assert torch.equal(corrected_acceptance(together, bias),
                       torch.cat([corrected_acceptance(alone[i:i + 1], bias[:1]) for i in range(200)]))


def test_model_alternatives_of_zero_probability_change_nothing_and_bad_shapes_are_refused():
    """Alternatives of probability 0 leave the decision as it was; malformed ones are refused with the reason; a
    padded decision (width buckets) takes them and truncates the tree in rank order, leaves like any node."""
    root, model, ngram = _drafts(5)
    step = DecisionStep(mode="merge", n_nodes=8, ngram_calibration=NgramCalibration.load().to())
    cost = CostModel([1, 16, 64, 256], [1.0, 1.1, 1.6, 4.0]).to("cpu")
    plain = step(root, model, ngram, cost=cost)
    zero = step(root, _alternatives(model, 3, seed=6, scale=0.0), ngram, cost=cost)
    assert torch.equal(zero.tree.tokens, plain.tree.tokens) and torch.equal(zero.tree.parents, plain.tree.parents)
    assert float(zero.lam) == pytest.approx(float(plain.lam)) and int(zero.b_star) == int(plain.b_star)
    alt = _alternatives(model, 3, seed=6)
    with pytest.raises(ValueError, match="both or neither"):
        step(root, alt._replace(alt_confidence=None), ngram)
    with pytest.raises(ValueError, match=r"alt_confidence must have shape \(3, 4, M\)"):
        step(root, alt._replace(alt_confidence=alt.alt_confidence[:, :2]), ngram)
    with pytest.raises(ValueError, match="differ in M"):
        step(root, alt._replace(alt_confidence=alt.alt_confidence[:, :, :2]), ngram)
    padded = DecisionStep(mode="merge", n_nodes=8, ngram_calibration=NgramCalibration.load().to(), widths=[5, 9])
    ragged = step(root, alt, ngram)                                  # no price: the 8 best nodes
    assert bool(((ragged.tree.source == Source.MODEL) & (ragged.tree.depth >= 1)).any())
    for w in (5, 9):
        cut = padded(root, alt, ngram, width=w).tree
        for f in ("tokens", "parents", "depth", "valid", "source"):
            assert torch.equal(getattr(cut, f), getattr(ragged.tree, f)[:, :w]), (w, f)


def test_model_alternatives_under_adaptive_depths_keep_each_depths_own_positions():
    """With candidate depths, the drafted depth's tree is the one a fixed-depth step builds (price 0: every node
    fits), and each depth's block holds only the alternatives of the positions that depth drafts: a block cut to one
    token keeps the first position's alternatives and no others, and no node that does not exist can fold."""
    from sglang_hybrid.selector import Candidates
    from sglang_hybrid.step import _with_alternatives

    root, model, ngram = _drafts(7)
    alt = _alternatives(model, 2, seed=8)
    cal = NgramCalibration.load().to()
    fixed = DecisionStep(mode="merge", n_nodes=S * 3 + K, ngram_calibration=cal)(root, alt, ngram)
    adaptive = DecisionStep(mode="merge", n_nodes=S * 3 + K, ngram_calibration=cal, depths=[1, 2, 4])
    got = adaptive(root, alt, ngram)
    for row in range(B):
        assert _paths(got.tree, row) == pytest.approx(_paths(fixed.tree, row))
    chain = Candidates.chain(model.tokens, torch.full((B, S), 0.5), torch.tensor([1, 3, 0]), Source.MODEL)
    tree = _with_alternatives(chain, alt.alt_tokens, torch.full((B, S, 2), 0.25))
    assert tree.tokens.shape == (B, S + S * 2) and bool((tree.length == S + S * 2).all())
    alive = tree.survival > 0
    assert alive[0].tolist() == [True] + [False] * 3 + [True] * 2 + [False] * 6
    assert alive[1].tolist() == [True] * 3 + [False] + [True] * 6 + [False] * 2
    assert not bool(alive[2].any())
    dead = tree.tokens[~alive]
    assert bool((dead >= 1 << 40).all()) and all(len(set(r[~a].tolist())) == int((~a).sum())
                                                  for r, a in zip(tree.tokens, alive))
    assert tree.parents[0, S:].tolist() == [-1, -1, 0, 0, 1, 1, 2, 2]
