"""``sglang_hybrid.request_bias``: which model-chain tokens a step tested (against a brute force), the corrected
acceptance, the online update, the decision step that prices with it, and graph safety."""

import random

import pytest
import torch

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.request_bias import corrected_acceptance, chain_outcome, update_bias
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_parents


def _brute(model, length, committed, n):
    tested, hit = [], []
    for j in range(len(model)):
        ok = j < length and j < n and all(model[i] == committed[i] for i in range(j))
        tested.append(ok)
        hit.append(ok and model[j] == committed[j])
    return tested, hit


@pytest.mark.parametrize("seed", range(5))
def test_chain_outcome_match_a_brute_force(seed):
    rng = random.Random(seed)
    b, s, c = 6, 5, 4
    model = [[rng.randint(0, 2) for _ in range(s)] for _ in range(b)]
    length = [rng.randint(0, s) for _ in range(b)]
    n = [rng.randint(1, c) for _ in range(b)]
    committed = [[rng.randint(0, 2) if j < n[i] else -1 for j in range(c)] for i in range(b)]
    tested, hit = chain_outcome(torch.tensor(model), torch.tensor(length), torch.tensor(committed), torch.tensor(n))
    for i in range(b):
        want_t, want_h = _brute(model[i], length[i], committed[i] + [-1] * (s - c), n[i])
        assert tested[i].tolist() == want_t and hit[i].tolist() == want_h, (model[i], length[i], committed[i], n[i])


def test_an_empty_chain_tests_nothing():
    tested, hit = chain_outcome(torch.zeros((2, 0), dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                                torch.tensor([[4], [5]]), torch.tensor([1, 1]))
    assert tested.shape == (2, 0) and hit.shape == (2, 0)


def test_corrected_acceptance_and_update_move_toward_what_the_request_shows():
    a = torch.tensor([[0.2, 0.5, 0.9]])
    assert torch.allclose(corrected_acceptance(a, torch.zeros(1)), a)
    up, down = corrected_acceptance(a, torch.tensor([1.0])), corrected_acceptance(a, torch.tensor([-1.0]))
    assert (up > a).all() and (down < a).all()
    tested = torch.tensor([[True, True, False]])
    hits = torch.tensor([[True, True, False]])
    b1 = update_bias(torch.zeros(1), a, tested, hits, 0.5)
    assert b1.item() == pytest.approx(0.5 * ((1 - 0.2) + (1 - 0.5)))
    misses = torch.tensor([[False, False, False]])
    assert update_bias(torch.zeros(1), a, tested, misses, 0.5).item() == pytest.approx(-0.5 * (0.2 + 0.5))
    assert update_bias(torch.tensor([0.3]), a, torch.zeros_like(tested), hits, 0.5).item() == pytest.approx(0.3)


def test_decision_step_prices_the_model_chain_with_the_corrected_acceptance():
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=8, **cal)
    conf = torch.tensor([[0.4, 0.3, 0.2], [0.6, 0.5, 0.4]])
    model = ModelDraft(torch.tensor([[1, 2, 3], [4, 5, 6]]), conf, torch.tensor([3, 2]))
    root = torch.tensor([0, 0])
    plain = step(root, model)
    assert torch.allclose(plain.model_acceptance, conf)
    bias = torch.tensor([1.5, -1.0])
    d = step(root, model, model_bias=bias)
    a = corrected_acceptance(conf, bias)
    assert torch.allclose(d.model_acceptance, a)
    assert torch.allclose(d.model_survival, torch.cumprod(a, 1) * torch.tensor([[1, 1, 1], [1, 1, 0]]))
    with pytest.raises(ValueError, match=r"model_bias must have shape \(2,\)"):
        step(root, model, model_bias=torch.zeros(3))


def test_decision_step_prices_the_ngram_chain_with_the_corrected_acceptance():
    """``ngram_bias``: the n-gram nodes are priced with the calibrated acceptance shifted on the logit (0 past the
    draft's length), so a positive offset raises every survival of the chain; a zero offset is the table itself."""
    cal = dict(model_calibration=ModelCalibration.identity().to(), ngram_calibration=NgramCalibration.load().to())
    step = DecisionStep(mode="merge", n_nodes=8, **cal)
    k = 4
    feats = torch.tensor([[12, 9, 3, 1], [2, 2, 0, 0]])
    ngram = NgramDraft(torch.tensor([[1, 2, 3, 4], [5, 6, -1, -1]]), chain_parents(2, k), torch.tensor([4, 2]),
                       feats, feats, feats + 1, torch.arange(1, k + 1).expand(2, k),
                       torch.zeros(2, k, dtype=torch.int64))
    root = torch.tensor([0, 0])
    plain = step(root, None, ngram)
    table = step.ngram_cal.acceptance(ngram.match_len, ngram.count, ngram.total, ngram.depth, ngram.source)
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    assert torch.allclose(plain.ngram_acceptance, torch.where(valid, table, 0.0))
    bias = torch.tensor([1.5, -1.0])
    d = step(root, None, ngram, ngram_bias=bias)
    a = torch.where(valid, corrected_acceptance(table, bias), 0.0)
    assert torch.allclose(d.ngram_acceptance, a)
    assert torch.allclose(d.ngram_survival, torch.cumprod(a, 1))
    assert (d.ngram_survival[0] > plain.ngram_survival[0]).all()
    assert (d.ngram_survival[1, :2] < plain.ngram_survival[1, :2]).all()
    assert torch.allclose(step(root, None, ngram, ngram_bias=torch.zeros(2)).ngram_survival, plain.ngram_survival)
    with pytest.raises(ValueError, match=r"ngram_bias must have shape \(2,\)"):
        step(root, None, ngram, ngram_bias=torch.zeros(3))


def test_the_update_compiles_fullgraph():
    def run(tokens, length, committed, n, bias, a):
        tested, hit = chain_outcome(tokens, length, committed, n)
        return update_bias(bias, corrected_acceptance(a, bias), tested, hit, 0.1)

    args = (torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([3, 2]), torch.tensor([[1, 2, 9, 7], [4, 0, -1, -1]]),
            torch.tensor([4, 2]), torch.tensor([0.0, 0.5]), torch.tensor([[0.5, 0.5, 0.5], [0.7, 0.6, 0.5]]))
    want = run(*args)
    torch._dynamo.reset()
    got = torch.compile(run, fullgraph=True, backend="aot_eager")(*args)
    assert torch.allclose(want, got)
    # request 0 tested 1, 2 (hits) and 3 (miss); request 1 tested 4 (hit) and 5 (miss)
    assert torch.allclose(want, torch.tensor([0.1 * (0.5 + 0.5 - 0.5), 0.5 + 0.1 * (
        1 - float(corrected_acceptance(torch.tensor([[0.7]]), torch.tensor([0.5]))) - float(
            corrected_acceptance(torch.tensor([[0.6]]), torch.tensor([0.5]))))]))


def _brute_tree(tokens, parents, length, committed, n):
    """Node j is tested when its whole path from the root, but itself, equals the committed tokens (and fits in
    ``n``); it hits when the node equals the committed token at its depth too."""
    tested, hit = [], []
    for j in range(len(tokens)):
        path = [j]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        d = len(path)
        ok = j < length and d <= n and all(tokens[q] == committed[i] for i, q in enumerate(path[:-1]))
        tested.append(ok)
        hit.append(ok and tokens[j] == committed[d - 1])
    return tested, hit


@pytest.mark.parametrize("seed", range(8))
def test_tree_outcome_matches_a_brute_force_and_chain_outcome_on_chains(seed):
    from sglang_hybrid.request_bias import tree_outcome

    rng = random.Random(seed)
    b, k, c = 7, 6, 5
    parents = [[-1] + [rng.randint(-1, j - 1) for j in range(1, k)] for _ in range(b)]
    tokens = [[rng.randint(0, 2) for _ in range(k)] for _ in range(b)]
    length = [rng.randint(0, k) for _ in range(b)]
    n = [rng.randint(1, c) for _ in range(b)]
    committed = [[rng.randint(0, 2) if j < n[i] else -1 for j in range(c)] for i in range(b)]
    args = (torch.tensor(length), torch.tensor(committed), torch.tensor(n))
    tested, hit = tree_outcome(torch.tensor(tokens), torch.tensor(parents), *args)
    for i in range(b):
        want_t, want_h = _brute_tree(tokens[i], parents[i], length[i], committed[i] + [-1] * k, n[i])
        assert tested[i].tolist() == want_t and hit[i].tolist() == want_h, (tokens[i], parents[i], committed[i])
    chain = tree_outcome(torch.tensor(tokens), chain_parents(b, k), *args)
    want = chain_outcome(torch.tensor(tokens), *args)
    assert torch.equal(chain[0], want[0]) and torch.equal(chain[1], want[1])
