"""Verify-width buckets (``sglang_hybrid.widths``) against brute force, and the padded decision step built on them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.cost import CostModel
from sglang_hybrid.selector import Candidates, Source, select
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_parents
from sglang_hybrid.widths import (MIN_CUT_SAVING, check_buckets, choose_width, default_buckets, default_depths,
                                  measured_table_buckets, paying_extras, start_width,
                                  truncate, widen)

torch.set_num_threads(1)


def _random_tree(seed: int, b: int = 4, n_nodes: int = 12):
    """A selector output over a random model chain and n-gram tree (merge), nodes in rank order."""
    g = torch.Generator().manual_seed(seed)
    km, kn = 5, 8
    s_m = torch.sort(torch.rand((b, km), generator=g), 1, descending=True).values
    s_n = torch.rand((b, kn), generator=g) * 0.9
    par = (torch.arange(kn) // 2 - 1).expand(b, kn).contiguous()
    model = Candidates.chain(torch.randint(0, 20, (b, km), generator=g), s_m, torch.randint(0, km + 1, (b,),
                             generator=g), Source.MODEL)
    ngram = Candidates(torch.randint(0, 20, (b, kn), generator=g), par, s_n,
                       torch.randint(0, kn + 1, (b,), generator=g), Source.NGRAM)
    return select(torch.randint(0, 20, (b,), generator=g), [model, ngram], 0.0, mode="merge", n_nodes=n_nodes)


def _brute_force(tree, buckets, cost):
    """G(W) = (R + sum_r sum of the survivals of nodes 1..W-1) / T(R * W), by loops over plain floats."""
    surv = tree.survival.tolist()
    valid = tree.valid.tolist()
    r = len(surv)
    out = []
    for w in buckets:
        e = r + sum(surv[i][j] for i in range(r) for j in range(1, w) if valid[i][j])
        out.append(e / float(cost.step_time_np(r * w)) if cost is not None else e)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_choose_width_maximises_padded_goodput(seed):
    tree = _random_tree(seed)
    buckets = (2, 4, 8, 13)
    for cost in (CostModel.linear(0.01, 0.0002), CostModel.linear(0.002, 0.001), CostModel([1, 32, 64], [1, 1, 3])):
        choice = choose_width(tree, torch.tensor(buckets), cost.to())
        g = _brute_force(tree, buckets, cost)
        assert np.allclose(choice.goodput.numpy(), g, rtol=1e-5)
        best = buckets[int(np.argmax(g))]                            # first maximum: the smallest width
        assert int(choice.width) == best
        assert int(choice.b_star) == tree.tokens.shape[0] * (best - 1)
        j = buckets.index(best)
        if j + 1 < len(buckets):                                     # the price of the next bucket's extra slots
            r, nxt = tree.tokens.shape[0], buckets[j + 1]
            t = cost.step_time_np
            want = g[j] * (t(r * nxt) - t(r * best)) / (r * (nxt - best))
            assert float(choice.lam) == pytest.approx(float(want), rel=1e-4)
        else:
            assert float(choice.lam) == 0.0


def test_choose_width_without_cost_holds_every_useful_node():
    tree = _random_tree(3)
    useful = int(((tree.survival > 0) & tree.valid).sum(1).max())     # root included
    choice = choose_width(tree, torch.tensor([2, 4, 8, 13]), None)
    assert int(choice.width) == min(w for w in (2, 4, 8, 13) if w >= useful)
    assert float(choice.lam) == 0.0


def test_truncate_keeps_a_prefix_closed_tree_of_the_best_nodes():
    tree = _random_tree(1)
    for w in (1, 2, 5, 13):
        t = truncate(tree, w)
        assert t.tokens.shape == (4, w) and t.ancestors.shape == (4, w, w)
        assert (t.parents[t.valid] < w).all() and (t.parents[:, 1:][t.valid[:, 1:]] >= 0).all()
        assert torch.equal(t.ancestors, tree.ancestors[:, :w, :w])
        kept = torch.where(t.valid[:, 1:], t.survival[:, 1:], 0.0)
        assert torch.allclose(t.expected_accepted, kept.sum(1))
        # the kept drafts are the best-ranked ones: none dropped beats any kept
        if w < 13:
            dropped = torch.where(tree.valid[:, w:], tree.survival[:, w:], 0.0).amax(1)
            worst_kept = torch.where(t.valid[:, 1:], t.survival[:, 1:], 2.0).amin(1) if w > 1 else None
            if worst_kept is not None:
                assert (dropped <= worst_kept + 1e-6).all()
    with pytest.raises(ValueError, match=r"width must be an int in \[1, 13\]"):
        truncate(tree, 14)


def test_widen_pads_with_absent_nodes_and_inverts_truncate():
    """A ragged verify step holds every tree at the full width: ``widen`` adds absent nodes only (the contract of
    docs/ARCHITECTURE.md for invalid nodes), so the widened tree verifies the same nodes, and ``truncate`` undoes it."""
    tree = truncate(_random_tree(2), 5)
    wide = widen(tree, 13)
    assert wide.tokens.shape == (4, 13) and wide.ancestors.shape == (4, 13, 13)
    for a, b in zip(truncate(wide, 5), tree):
        assert torch.equal(a, b)
    assert not wide.valid[:, 5:].any() and (wide.tokens[:, 5:] == -1).all() and (wide.parents[:, 5:] == -1).all()
    assert (wide.source[:, 5:] == -1).all() and (wide.survival[:, 5:] == 0).all() and (wide.depth[:, 5:] == 0).all()
    assert not wide.ancestors[:, 5:].any() and not wide.ancestors[:, :, 5:].any()
    assert torch.equal(wide.expected_accepted, tree.expected_accepted)
    assert widen(tree, 5) is tree
    with pytest.raises(ValueError, match="width must be an int >= the tree's 5"):
        widen(tree, 4)


def test_bucket_settings_are_checked():
    assert default_buckets(13) == (2, 4, 6, 7, 8, 13) and default_buckets(2) == (2,)
    assert default_buckets(9) == (2, 4, 6, 7, 8, 9) and default_buckets(20) == (2, 4, 6, 7, 8, 16, 20)
    assert default_buckets(7) == (2, 4, 6, 7)


def test_default_depths_every_small_depth_then_half_and_full():
    assert [default_depths(n) for n in (1, 2, 3, 4, 6, 8)] == [
        (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 4, 6), (1, 2, 3, 4, 8)]
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="num_steps must be a positive int"):
            default_depths(bad)


def test_measured_table_buckets_by_hand():
    """The default launch's widths: EAGLE's (steps + 1) and the full tree required; extras the rounded geometric middle
    of the two, then one narrower than EAGLE's, each only where it is a new width in [2, full)."""
    assert measured_table_buckets(4, 13) == ((5, 13), (8, 4))             # sqrt(65) = 8.06
    assert measured_table_buckets(3, 12) == ((4, 12), (7, 3))             # sqrt(48) = 6.93
    assert measured_table_buckets(6, 25) == ((7, 25), (13, 6))            # sqrt(175) = 13.2
    assert measured_table_buckets(1, 9) == ((2, 9), (4,))                  # no width 1: narrower than 2 is left out
    assert measured_table_buckets(4, 5) == ((5,), (4,))                    # EAGLE's width is the full tree
    assert measured_table_buckets(8, 5) == ((5,), ())                      # steps beyond the tree: capped at it
    assert measured_table_buckets(1, 2) == ((2,), ())
    for bad in ((0, 13), (True, 13), (4, 1), (4, 2.0)):
        with pytest.raises(ValueError):
            measured_table_buckets(*bad)


def test_paying_extras_by_hand():
    """An extra above plain EAGLE's width pays only where ``T(B full) >= 1.25 T(B w)`` at the running limit ``B``; one
    below EAGLE's always. On a table linear in the batch tokens, ``T(n) = 1 + c n``: at 4 requests, full 13 against
    8, ``(1 + 52 c) / (1 + 32 c) >= 1.25`` iff ``c >= 1 / 48``."""
    from sglang_hybrid.cost import CostModel

    assert MIN_CUT_SAVING == 1.25
    for c, kept in ((1 / 48 + 1e-9, (8, 4)), (1 / 48 - 1e-3, (4,)), (1e-4, (4,)), (1.0, (8, 4))):
        assert paying_extras(4, 13, (8, 4), lambda n, c=c: 1 + c * n, 4) == kept, c
    assert paying_extras(4, 13, (4, 8), lambda n: 1.0, 4) == (4,)              # order kept; a flat table: no cut pays
    # a real table through the host CostModel, as the worker passes it: 1 ms + 0.1 ms per token
    table = CostModel.linear(1e-3, 1e-4)
    assert table.step_time_at(52) == pytest.approx(1e-3 + 52e-4)
    assert paying_extras(4, 13, (8, 4), table.step_time_at, 4) == (8, 4)       # 6.2 / 4.2 ms = 1.48
    assert paying_extras(4, 13, (8, 4), table.step_time_at, 1) == (8, 4)       # one request: 2.3 / 1.8 ms = 1.28
    fixed_heavy = CostModel.linear(1e-2, 1e-4)                                   # a 10 ms step: the tokens barely count
    assert paying_extras(4, 13, (8, 4), fixed_heavy.step_time_at, 4) == (4,)    # 15.2 / 13.2 ms = 1.15
    assert paying_extras(4, 29, (12, 4), lambda n: 1.0 + 0.001 * n, 4) == (4,)


def test_start_width_is_the_narrowest_bucket_holding_a_plain_eagle_chain():
    """Brute force: the smallest bucket >= num_steps + 1, else the widest."""
    for buckets in [(2, 4, 6, 8, 13), (2,), (3, 5), (2, 4, 8, 9)]:
        for steps in range(1, 12):
            fits = [w for w in buckets if w >= steps + 1]
            assert start_width(buckets, steps) == (min(fits) if fits else max(buckets))
    assert start_width(default_buckets(13), 4) == 6 and start_width(default_buckets(13), 3) == 4
    assert check_buckets([8, 2, 8], 13) == (2, 8, 13)
    with pytest.raises(ValueError, match="bucket 14 is outside"):
        check_buckets([14], 13)
    with pytest.raises(ValueError, match="must be ints"):
        check_buckets([2.5], 13)


def _drafts(b=3, s=4, k=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = ModelDraft(torch.randint(0, 50, (b, s), generator=g), torch.rand((b, s), generator=g),
                       torch.full((b,), s))
    length = torch.tensor([k, 3, 0])[:b]
    j = torch.arange(k)[None]
    valid = j < length[:, None]
    ngram = NgramDraft(torch.where(valid, torch.randint(0, 50, (b, k), generator=g), -1), chain_parents(b, k),
                       length, match_len=torch.where(valid, 12, 0), count=torch.where(valid, 3, 0),
                       total=torch.where(valid, 4, 0), depth=torch.where(valid, j + 1, 0),
                       source=torch.zeros((b, k), dtype=torch.int64))
    return torch.tensor([1, 2, 3])[:b], model, ngram


@pytest.mark.parametrize("mode", ["choose", "merge"])
def test_padded_step_verifies_the_best_nodes_at_the_given_width(mode):
    root, model, ngram = _drafts()
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode=mode, n_nodes=12, widths=[2, 4, 8], **cal)
    cost = CostModel.linear(0.01, 0.0005).to()
    full = step(root, model, ngram, cost=cost)
    assert full.tree.tokens.shape == (3, 13)
    # price 0 inside the width: every positive-survival candidate competes (up to the chosen source in choose mode)
    ragged = DecisionStep(mode=mode, n_nodes=12, **cal)(root, model, ngram, cost=None)
    for name in full.tree._fields:
        a, b = getattr(full.tree, name), getattr(ragged.tree, name)
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name
    assert torch.equal(full.next_width, choose_width(full.tree, torch.tensor([2, 4, 8, 13]), cost).width)
    for w in (2, 4, 8):
        d = step(root, model, ngram, cost=cost, width=w)
        want = truncate(full.tree, w)
        for name in want._fields:
            assert torch.equal(getattr(d.tree, name), getattr(want, name)), name
        assert torch.equal(d.next_width, full.next_width)          # the next width never depends on this one
    with pytest.raises(ValueError, match="width 5 is not one of the verify width buckets"):
        step(root, model, ngram, cost=cost, width=5)
    with pytest.raises(ValueError, match="construct the DecisionStep with widths"):
        DecisionStep(mode=mode, n_nodes=12, **cal)(root, model, ngram, width=4)


def test_padded_step_compiles_fullgraph():
    root, model, ngram = _drafts()
    step = DecisionStep(mode="merge", n_nodes=12, widths=[2, 4, 8], model_calibration=ModelCalibration.identity().to(),
                        ngram_calibration=NgramCalibration.load().to())
    cost = CostModel.linear(0.01, 0.0005).to()

    def run(root, model, ngram):
        d = step(root, model, ngram, cost=cost, width=4, check_values=False)
        return d.tree.tokens, d.tree.valid, d.next_width, d.b_star, d.lam

    _assert_compiles(run, root, model, ngram)


def _assert_compiles(run, *args):
    """``run(*args)`` compiled with ``fullgraph=True`` returns what it returns eagerly; returns the eager result."""
    want = run(*args)
    torch._dynamo.reset()
    got = torch.compile(run, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(want, got):
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b)
    return want


def test_skipped_adaptive_step_compiles_fullgraph():
    """Depth 0 with probing (the rate carried in, moved toward 1) stays graph-safe: same decision compiled."""
    root, _, ngram = _drafts()
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=12, widths=[2, 4, 8], depths=[0, 1, 2, 4], probe_half_life=4.0, **cal)
    cost, draft = CostModel.linear(0.01, 0.0005).to(), CostModel.linear(0.002, 0.0001).to()
    skipped = ModelDraft(torch.zeros((3, 0), dtype=torch.int64), torch.zeros((3, 0)), torch.zeros(3, dtype=torch.int64))
    rate = torch.tensor([0.2, 0.5, 0.9])

    def run(root, ngram, rate):
        d = step(root, skipped, ngram, cost=cost, width=4, draft_cost=draft, model_rate=rate, check_values=False)
        return d.tree.tokens, d.tree.valid, d.next_width, d.next_depth, d.model_rate

    want = _assert_compiles(run, root, ngram, rate)
    assert torch.allclose(want[-1], 1.0 - (1.0 - rate) * 0.5 ** 0.25)


def _extended(model: ModelDraft, d: int) -> ModelDraft:
    """``model`` cut to (or extended up to) depth ``d`` as the depth rule scores it: with identity calibration the
    conditional acceptance is the draft probability, so an undrafted position gets the flat-in-depth rate
    ``(prod of the drafted probabilities) ** (1 / s)`` and a token no real vocabulary holds."""
    b, s = model.tokens.shape
    if d <= s:
        return ModelDraft(model.tokens[:, :d], model.confidence[:, :d], model.length.clamp(max=d))
    rate = model.confidence.prod(1, keepdim=True) ** (1.0 / s)
    extra = torch.arange(s, d)[None].expand(b, d - s)
    return ModelDraft(torch.cat([model.tokens, (1 << 40) + extra], 1),
                      torch.cat([model.confidence, rate.expand(b, d - s)], 1), torch.full((b,), d))


@pytest.mark.parametrize("seed", range(4))
def test_draft_depth_and_width_maximise_goodput_by_brute_force(seed):
    """Adaptive drafting: the (depth, width) pair the step picks is the argmax of
    (R + expected accepted) / (T(R W) + depth * t_draft(R)) over every pair, each tree scored by a plain padded step
    run with the model chain at that depth."""
    g = torch.Generator().manual_seed(seed)
    root, model, ngram = _drafts(seed=seed)
    model = ModelDraft(model.tokens[:, :2], 0.3 + 0.7 * torch.rand((3, 2), generator=g), torch.full((3,), 2))
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    widths, depths = (2, 4, 8, 13), (1, 2, 4)
    cost, draft = CostModel.linear(0.01, 0.0004), CostModel.linear(0.002, 0.0001)
    step = DecisionStep(mode="merge", n_nodes=12, widths=widths[:-1], depths=depths, **cal)
    d = step(root, model, ngram, cost=cost.to(), draft_cost=draft.to(), width=4)
    plain = DecisionStep(mode="merge", n_nodes=12, widths=widths[:-1], **cal)
    best, best_g = None, -1.0
    for depth in depths:
        tree = plain(root, _extended(model, depth), ngram, cost=cost.to()).tree
        for w, gw in zip(widths, _brute_force(tree, widths, cost)):
            e = gw * float(cost.step_time_np(3 * w))                    # expected tokens
            gp = e / (float(cost.step_time_np(3 * w)) + depth * float(draft.step_time_np(3)))
            if gp > best_g + 1e-9:
                best, best_g = (depth, w), gp
    assert (int(d.next_depth), int(d.next_width)) == best
    # this step's tree is the drafted depth's: the same as the plain padded step's
    want = plain(root, model, ngram, cost=cost.to(), width=4).tree
    for name in want._fields:
        a, b = getattr(d.tree, name), getattr(want, name)
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name


def test_draft_depth_follows_what_pays():
    """A long confident n-gram copy makes deeper model drafting not worth its forwards (depth 1); without an n-gram
    proposal a confident model chain is drafted to the deepest depth; free drafting always drafts deepest."""
    root, model, ngram = _drafts(b=2)
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=12, widths=[2, 4, 8], depths=[1, 2, 4], **cal)
    cost, draft = CostModel.linear(0.01, 0.0001).to(), CostModel.linear(0.003, 0.0).to()
    weak = ModelDraft(model.tokens, torch.full((2, 4), 0.3), torch.full((2,), 4))
    strong = ModelDraft(model.tokens, torch.full((2, 4), 0.95), torch.full((2,), 4))
    long_copy = ngram._replace(tokens=torch.randint(0, 50, (2, 8)), length=torch.tensor([8, 8]),
                               match_len=torch.full((2, 8), 40), count=torch.full((2, 8), 4),
                               total=torch.full((2, 8), 4), depth=torch.arange(1, 9).expand(2, 8))
    assert int(step(root, weak, long_copy, cost=cost, draft_cost=draft).next_depth) == 1
    none = ngram._replace(length=torch.zeros(2, dtype=torch.int64))
    assert int(step(root, strong, none, cost=cost, draft_cost=draft).next_depth) == 4
    assert int(step(root, weak, long_copy, cost=cost).next_depth) == 4          # no draft cost: deepest
    with pytest.raises(ValueError, match="the model chain has 3 tokens but the draft depths are"):
        step(root, ModelDraft(model.tokens[:, :3], model.confidence[:, :3], torch.full((2,), 3)), none, cost=cost)


@pytest.mark.parametrize("seed", range(3))
def test_ragged_draft_depth_maximises_goodput_by_brute_force(seed):
    """Ragged verify (the reference loop, the replay's ideal engine): each depth is priced and selected on its own
    candidates and scored (R + expected accepted) / (T(R + verified drafts) + depth * t_draft(R)); the step picks the
    best depth and returns the drafted depth's tree, budget and price unchanged."""
    g = torch.Generator().manual_seed(seed)
    root, model, ngram = _drafts(seed=seed)
    model = ModelDraft(model.tokens[:, :2], 0.3 + 0.7 * torch.rand((3, 2), generator=g), torch.full((3,), 2))
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    cost, draft = CostModel.linear(0.01, 0.0004), CostModel.linear(0.002, 0.0001)
    step = DecisionStep(mode="merge", n_nodes=12, depths=(1, 2, 4), **cal)
    d = step(root, model, ngram, cost=cost.to(), draft_cost=draft.to())
    plain = DecisionStep(mode="merge", n_nodes=12, **cal)
    scores = []
    for depth in (1, 2, 4):
        p = plain(root, _extended(model, depth), ngram, cost=cost.to())
        e = float(p.tree.expected_accepted.sum())
        n = int(p.tree.valid.sum()) - 3
        scores.append((3 + e) / (float(cost.step_time_np(3 + n)) + depth * float(draft.step_time_np(3))))
    assert int(d.next_depth) == (1, 2, 4)[int(np.argmax(scores))]
    want = plain(root, model, ngram, cost=cost.to())
    assert torch.equal(d.b_star, want.b_star) and torch.allclose(d.lam, want.lam)
    for name in want.tree._fields:
        a, b = getattr(d.tree, name), getattr(want.tree, name)
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name


def _at_rate(rate: torch.Tensor, d: int):
    """The model chain a depth-``d`` draft is scored as after a step that drafted nothing: every position at the
    request's carried rate (identity calibration: conditional acceptance = draft probability); depth 0: no model."""
    b = rate.shape[0]
    if d == 0:
        return None
    return ModelDraft((1 << 40) + torch.arange(d)[None].expand(b, d), rate[:, None].expand(b, d).contiguous(),
                      torch.full((b,), d))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("half_life", [None, 4.0])
def test_skipped_model_draft_is_scored_at_the_carried_rate_by_brute_force(seed, padded, half_life):
    """Depth 0 (an engine that can skip the model draft): a step that drafted nothing scores every depth with each
    request's carried rate, moved toward 1 by one step of probing (``1 - (1 - rate) 2^(-1/half_life)``; without
    probing the rate itself), and picks the best (depth, width) pair, as a brute force over plain steps run with the
    model chain at that rate does; its tree is the n-gram-only tree and the scored rate comes back."""
    g = torch.Generator().manual_seed(seed)
    root, _, ngram = _drafts(seed=seed)
    carried = 0.2 + 0.8 * torch.rand(3, generator=g)
    rate = carried if half_life is None else 1.0 - (1.0 - carried) * 0.5 ** (1.0 / half_life)
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    widths, depths = (2, 4, 8, 13), (0, 1, 2, 4)
    cost, draft = CostModel.linear(0.01, 0.0004), CostModel.linear(0.002, 0.0001)
    kw = dict(widths=widths[:-1]) if padded else {}
    step = DecisionStep(mode="merge", n_nodes=12, depths=depths, probe_half_life=half_life, **kw, **cal)
    skipped = ModelDraft(torch.zeros((3, 0), dtype=torch.int64), torch.zeros((3, 0)), torch.zeros(3, dtype=torch.int64))
    d = step(root, skipped, ngram, cost=cost.to(), draft_cost=draft.to(), model_rate=carried,
             **(dict(width=4) if padded else {}))
    plain = DecisionStep(mode="merge", n_nodes=12, **kw, **cal)
    best, best_g = None, -1.0
    for depth in depths:
        p = plain(root, _at_rate(rate, depth), ngram, cost=cost.to())
        t_d = depth * float(draft.step_time_np(3))
        if padded:
            for w, gw in zip(widths, _brute_force(p.tree, widths, cost)):
                e = gw * float(cost.step_time_np(3 * w))
                gp = e / (float(cost.step_time_np(3 * w)) + t_d)
                if gp > best_g + 1e-9:
                    best, best_g = (depth, w), gp
        else:
            n = int(p.tree.valid.sum()) - 3
            gp = (3 + float(p.tree.expected_accepted.sum())) / (float(cost.step_time_np(3 + n)) + t_d)
            if gp > best_g + 1e-9:
                best, best_g = (depth, 13), gp
    assert (int(d.next_depth), int(d.next_width)) == best
    assert torch.allclose(d.model_rate, rate)
    want = plain(root, None, ngram, cost=cost.to(), **(dict(width=4) if padded else {})).tree
    for name in want._fields:
        a, b = getattr(d.tree, name), getattr(want, name)
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b), name


def _steps_skipped(half_life, rate: float, steps: int = 200) -> int:
    """Skipped steps in a row, beside a moderately confident n-gram copy, before a model carried at ``rate`` is
    drafted again (``steps`` if never): the engine passes each step's ``model_rate`` back, as the reference loop
    does. (Beside this copy the model pays from a rate of about 0.5; at 0.2 it does not.)"""
    root, _, ngram = _drafts(b=2)
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=12, widths=[2, 4, 8], depths=[0, 1, 2, 4], probe_half_life=half_life,
                        **cal)
    cost, draft = CostModel.linear(0.01, 0.0001).to(), CostModel.linear(0.003, 0.0).to()
    copy = ngram._replace(tokens=torch.arange(16).reshape(2, 8), length=torch.tensor([8, 8]),
                          match_len=torch.full((2, 8), 6), count=torch.full((2, 8), 2), total=torch.full((2, 8), 3),
                          depth=torch.arange(1, 9).expand(2, 8))
    skipped = ModelDraft(torch.zeros((2, 0), dtype=torch.int64), torch.zeros((2, 0)), torch.zeros(2, dtype=torch.int64))
    carried = torch.full((2,), rate)
    for t in range(steps):
        d = step(root, skipped, copy, cost=cost, draft_cost=draft, model_rate=carried)
        if int(d.next_depth) > 0:
            return t
        assert (d.model_rate >= carried).all()                 # unobserved: the rate only moves toward 1
        carried = d.model_rate
    return steps


def test_probing_redrafts_a_skipped_model_sooner_the_shorter_the_half_life():
    """Without probing a weak model beside a strong copy is skipped for good; with probing it is drafted again after
    a number of skipped steps that grows with the half-life and shrinks as the carried rate rises."""
    assert _steps_skipped(None, 0.2) == 200
    n2, n4, n8 = _steps_skipped(2.0, 0.2), _steps_skipped(4.0, 0.2), _steps_skipped(8.0, 0.2)
    assert 0 < n2 < n4 < n8 < 200
    assert _steps_skipped(4.0, 0.4) < n4


def test_skip_rate_comes_from_the_last_drafted_chain_and_skipping_follows_what_pays():
    """A drafted chain reports its per-position rate ``(prod of its acceptances) ** (1 / s)``; carried into a skipped
    step, a weak rate beside a long confident n-gram copy keeps skipping (depth 0), a strong rate with no n-gram
    proposal drafts again (the model is re-priced every step at its carried rate)."""
    root, model, ngram = _drafts(b=2)
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=12, widths=[2, 4, 8], depths=[0, 1, 2, 4], probe_half_life=None, **cal)
    cost, draft = CostModel.linear(0.01, 0.0001).to(), CostModel.linear(0.003, 0.0).to()
    conf = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.5, 0.5, 0.5, 0.5]])
    drafted = step(root, ModelDraft(model.tokens, conf, torch.full((2,), 4)), ngram, cost=cost, draft_cost=draft)
    assert torch.allclose(drafted.model_rate, conf.prod(1) ** 0.25)
    skipped = ModelDraft(torch.zeros((2, 0), dtype=torch.int64), torch.zeros((2, 0)), torch.zeros(2, dtype=torch.int64))
    long_copy = ngram._replace(tokens=torch.randint(0, 50, (2, 8)), length=torch.tensor([8, 8]),
                               match_len=torch.full((2, 8), 40), count=torch.full((2, 8), 4),
                               total=torch.full((2, 8), 4), depth=torch.arange(1, 9).expand(2, 8))
    none = ngram._replace(length=torch.zeros(2, dtype=torch.int64))
    weak, strong = torch.full((2,), 0.2), torch.full((2,), 0.95)
    assert int(step(root, skipped, long_copy, cost=cost, draft_cost=draft, model_rate=weak).next_depth) == 0
    assert int(step(root, skipped, none, cost=cost, draft_cost=draft, model_rate=strong).next_depth) == 4
    with pytest.raises(ValueError, match=r"drafted no model tokens \(depth 0\) needs model_rate \[2\]"):
        step(root, skipped, none, cost=cost, draft_cost=draft)
    with pytest.raises(ValueError, match="never draft the model"):
        DecisionStep(mode="merge", n_nodes=12, depths=[0], **cal)
    for bad in (0, -2.0, True, "8"):
        with pytest.raises(ValueError, match="probe_half_life must be a number of steps > 0 or None"):
            DecisionStep(mode="merge", n_nodes=12, depths=[0, 1], probe_half_life=bad, **cal)
    with pytest.raises(ValueError, match="ints >= 0"):
        DecisionStep(mode="merge", n_nodes=12, depths=[-1, 2], **cal)
