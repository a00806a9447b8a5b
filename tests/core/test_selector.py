"""Survival and selector: brute-force checks of expected accepted tokens, choose/merge rules, layout invariants."""
import itertools

import numpy as np
import pytest
import torch

from sglang_hybrid.selector import Candidates, Source, VerifyTree, ancestors_from_parents, select
from sglang_hybrid.survival import chain_parents, chain_survival, tree_survival
from tests.helpers.trees import paths

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------

def two_sources(model_tokens, model_surv, model_len, ngram_tokens, ngram_parents, ngram_surv, ngram_len):
    """The two drafters HYBRID runs: the EAGLE chain first, then the n-gram chain or tree."""
    return [Candidates.chain(model_tokens, model_surv, model_len, Source.MODEL),
            Candidates(ngram_tokens, ngram_parents, ngram_surv, ngram_len, Source.NGRAM)]


def sel(root_tokens, lam, mode, n_nodes, **drafts):
    return select(root_tokens, two_sources(**drafts), lam, mode=mode, n_nodes=n_nodes)


def random_tree(rng, n, vocab, max_children=3):
    """Random topological tree: parents[i] < i (or -1), distinct sibling tokens, sibling a's summing to <= 1."""
    parents, tokens = [], []
    for i in range(n):
        for _ in range(20):
            p = int(rng.integers(-1, i)) if i else -1
            used = {tokens[j] for j in range(i) if parents[j] == p}
            free = [t for t in range(vocab) if t not in used]
            if free and len(used) < max_children:
                parents.append(p)
                tokens.append(int(rng.choice(free)))
                break
        else:
            parents.append(-1)
            tokens.append(int(rng.choice([t for t in range(vocab) if t not in
                                          {tokens[j] for j in range(i) if parents[j] == -1}])))
    a = np.zeros(n)
    for p in set(parents):
        kids = [i for i in range(n) if parents[i] == p]
        w = rng.dirichlet(np.ones(len(kids) + 1))     # leftover mass = "no child accepted"
        a[kids] = w[:len(kids)]
    return np.array(tokens), np.array(parents), a


def brute_survival(a, parents):
    s = np.zeros(len(a))
    for i in range(len(a)):
        s[i] = a[i] * (s[parents[i]] if parents[i] >= 0 else 1.0)
    return s


def brute_expected_accepted(a, parents):
    """Enumerate where the accepted path ends: E = sum_i depth_i * P(end at i)."""
    n = len(a)
    s = brute_survival(a, parents)
    depth = [0] * n
    for i in range(n):
        depth[i] = 1 + (depth[parents[i]] if parents[i] >= 0 else 0)
    exp = 0.0
    for i in range(n):
        p_stop = 1.0 - sum(a[j] for j in range(n) if parents[j] == i)
        exp += depth[i] * s[i] * p_stop
    return exp


def make_batch(rng, b, km, kn, vocab=6, tree=True, overlap=0.5):
    root = torch.tensor(rng.integers(0, vocab, b))
    mt = rng.integers(0, vocab, (b, km))
    ma = rng.uniform(0.3, 1.0, (b, km))
    ml = rng.integers(0, km + 1, b)
    nt = np.full((b, kn), -1)
    npar = np.full((b, kn), -1)
    na = np.zeros((b, kn))
    nl = rng.integers(0, kn + 1, b)
    for r in range(b):
        if tree:
            t, p, a = random_tree(rng, int(nl[r]), vocab)
        else:
            t = rng.integers(0, vocab, nl[r])
            p = np.arange(nl[r]) - 1
            a = rng.uniform(0.3, 1.0, nl[r])
        # copy the model chain prefix sometimes so that merge has something to fold
        if rng.random() < overlap:
            for i in range(len(t)):
                d, j = 0, i
                while j >= 0:
                    d, j = d + 1, p[j]
                if d <= km and (p[i] < 0 or t[p[i]] == mt[r, d - 2]) and rng.random() < 0.7:
                    used = {t[q] for q in range(i) if p[q] == p[i]}
                    if mt[r, d - 1] not in used:
                        t[i] = mt[r, d - 1]
        nt[r, :len(t)], npar[r, :len(t)], na[r, :len(t)] = t, p, a
    ms = chain_survival(torch.tensor(ma, dtype=torch.float32), torch.tensor(ml))
    ns = tree_survival(torch.tensor(na, dtype=torch.float32), torch.tensor(npar), torch.tensor(nl))
    return dict(root_tokens=root, model_tokens=torch.tensor(mt), model_surv=ms, model_len=torch.tensor(ml),
                ngram_tokens=torch.tensor(nt), ngram_parents=torch.tensor(npar), ngram_surv=ns,
                ngram_len=torch.tensor(nl))


def check_layout(tree: VerifyTree, n_nodes):
    b, w = tree.tokens.shape
    assert w == n_nodes + 1
    assert tree.ancestors.shape == (b, w, w)
    assert tree.valid[:, 0].all()
    idx = torch.arange(w)
    for r in range(b):
        v = tree.valid[r]
        n = int(v.sum())
        assert v[:n].all() and not v[n:].any(), "valid nodes must be a prefix"
        assert tree.parents[r, 0] == -1 and tree.depth[r, 0] == 0 and tree.survival[r, 0] == 1
        for i in range(1, n):
            p = int(tree.parents[r, i])
            assert 0 <= p < i
            assert tree.depth[r, i] == tree.depth[r, p] + 1
            assert tree.survival[r, i] <= tree.survival[r, p] + 1e-6
        for i in range(n, w):
            assert tree.tokens[r, i] == -1 and tree.parents[r, i] == -1 and tree.source[r, i] == -1
            assert tree.survival[r, i] == 0 and tree.depth[r, i] == 0
            assert torch.equal(tree.ancestors[r, i], idx == i)
        # ancestors from parents, by walking
        for i in range(n):
            want = torch.zeros(w, dtype=torch.bool)
            j = i
            while j >= 0:
                want[j] = True
                j = int(tree.parents[r, j])
            assert torch.equal(tree.ancestors[r, i], want)
        draft = tree.survival[r, 1:n].sum()
        assert torch.isclose(tree.expected_accepted[r], draft, atol=1e-5)


def candidate_paths(batch, r):
    """path -> list of survivals for every valid candidate node of request r (model chain, n-gram tree)."""
    out = {}
    ml = int(batch["model_len"][r])
    for j in range(ml):
        out.setdefault(tuple(batch["model_tokens"][r, :j + 1].tolist()), []).append(
            ("m", float(batch["model_surv"][r, j])))
    nl = int(batch["ngram_len"][r])
    for i in range(nl):
        p, j = [], i
        while j >= 0:
            p.append(int(batch["ngram_tokens"][r, j]))
            j = int(batch["ngram_parents"][r, j])
        out.setdefault(tuple(reversed(p)), []).append(("n", float(batch["ngram_surv"][r, i])))
    return out


# ---------------------------------------------------------------------------------------------------------------
# survival
# ---------------------------------------------------------------------------------------------------------------

def test_chain_survival_is_cumprod_and_zero_past_length():
    a = torch.tensor([[0.9, 0.5, 0.5, 0.5], [1.0, 0.2, 0.3, 0.4]])
    s = chain_survival(a, torch.tensor([2, 4]))
    assert torch.allclose(s, torch.tensor([[0.9, 0.45, 0, 0], [1.0, 0.2, 0.06, 0.024]]))


def test_tree_survival_matches_brute_force():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 9, 17, 33):
        t, p, a = random_tree(rng, n, vocab=50)
        pad = 3
        ap = torch.tensor(np.concatenate([a, rng.random(pad)]), dtype=torch.float32)[None]
        pp = torch.tensor(np.concatenate([p, -np.ones(pad, int)]))[None]
        s = tree_survival(ap, pp, torch.tensor([n]))
        assert torch.allclose(s[0, :n], torch.tensor(brute_survival(a, p), dtype=torch.float32), atol=1e-6)
        assert (s[0, n:] == 0).all()


def test_expected_accepted_matches_enumeration():
    """sum of survivals == E[accepted tokens] by enumerating where the accepted path ends."""
    rng = np.random.default_rng(2)
    for trial in range(30):
        n = int(rng.integers(1, 9))
        t, p, a = random_tree(rng, n, vocab=5)
        batch = {
            "root_tokens": torch.tensor([0]), "model_tokens": torch.zeros((1, 0), dtype=torch.int64),
            "model_surv": torch.zeros((1, 0)), "model_len": torch.tensor([0]),
            "ngram_tokens": torch.tensor(t)[None], "ngram_parents": torch.tensor(p)[None],
            "ngram_surv": tree_survival(torch.tensor(a, dtype=torch.float32)[None], torch.tensor(p)[None],
                                        torch.tensor([n])),
            "ngram_len": torch.tensor([n])}
        tree = sel(**batch, lam=0.0, mode="merge", n_nodes=n)
        want = brute_expected_accepted(a, p)
        assert abs(float(tree.expected_accepted[0]) - want) < 1e-5, (trial, want)


# ---------------------------------------------------------------------------------------------------------------
# selector
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["choose", "merge"])
@pytest.mark.parametrize("tree_shape", [True, False])
def test_layout_invariants_and_paths_come_from_candidates(mode, tree_shape):
    rng = np.random.default_rng(3)
    for lam in (0.0, 0.2, 0.5):
        batch = make_batch(rng, 16, 5, 6, tree=tree_shape)
        out = sel(**batch, lam=torch.tensor(lam), mode=mode, n_nodes=6)
        check_layout(out, 6)
        for r in range(16):
            cands = candidate_paths(batch, r)
            for i, path in paths(out, r).items():
                assert path in cands, "every verified path must be drafted by some source"
                src = int(out.source[r, i])
                kinds = {k for k, _ in cands[path]}
                s = float(out.survival[r, i])
                assert s >= lam - 1e-7 and s > 0
                if mode == "choose":
                    assert src in (0, 1)
                    want = [v for k, v in cands[path] if k == "mn"[src]]
                    assert want and abs(s - want[0]) < 1e-6
                else:
                    assert src == (2 if kinds == {"m", "n"} else (0 if kinds == {"m"} else 1))
                    assert abs(s - max(v for _, v in cands[path])) < 1e-6
            if mode == "choose":
                srcs = set(out.source[r, 1:int(out.valid[r].sum())].tolist())
                assert len(srcs) <= 1, "choose verifies one source per request"


def brute_best(cands, lam, n_nodes):
    """Best prefix-closed subset (<= n_nodes paths, all s >= lam, s > 0) of a candidate trie: max sum of s."""
    items = [(p, max(v for _, v in vs)) for p, vs in cands.items()]
    items = [(p, s) for p, s in items if s >= lam and s > 0]
    best = 0.0
    for k in range(min(n_nodes, len(items)) + 1):
        for sub in itertools.combinations(items, k):
            ps = {p for p, _ in sub}
            if all(len(p) == 1 or p[:-1] in ps for p in ps):
                best = max(best, sum(s for _, s in sub))
    return best


def test_merge_is_the_best_prefix_closed_tree_and_never_below_choose():
    rng = np.random.default_rng(4)
    for trial in range(8):
        batch = make_batch(rng, 6, 4, 5, vocab=3, tree=True, overlap=0.8)
        lam = float(rng.choice([0.0, 0.1, 0.3]))
        n_nodes = int(rng.integers(1, 6))
        m = sel(**batch, lam=lam, mode="merge", n_nodes=n_nodes)
        c = sel(**batch, lam=lam, mode="choose", n_nodes=n_nodes)
        assert (m.expected_accepted >= c.expected_accepted - 1e-6).all()
        for r in range(6):
            want = brute_best(candidate_paths(batch, r), lam, n_nodes)
            assert abs(float(m.expected_accepted[r]) - want) < 1e-5, (trial, r)


def test_choose_picks_larger_net_value_and_truncates_below_lam():
    # model: 0.9, 0.6, 0.3 ; n-gram chain: 0.95, 0.5, 0.45, 0.4
    batch = dict(root_tokens=torch.tensor([7]), model_tokens=torch.tensor([[1, 2, 3]]),
                 model_surv=torch.tensor([[0.9, 0.6, 0.3]]), model_len=torch.tensor([3]),
                 ngram_tokens=torch.tensor([[4, 5, 6, 8]]), ngram_parents=chain_parents(1, 4),
                 ngram_surv=torch.tensor([[0.95, 0.5, 0.45, 0.4]]), ngram_len=torch.tensor([4]))
    # lam = 0.35: V_model = 0.55 + 0.25 = 0.8 ; V_ngram = 0.6 + 0.15 + 0.1 + 0.05 = 0.9 -> n-gram, all 4 nodes
    t = sel(**batch, lam=0.35, mode="choose", n_nodes=8)
    assert t.tokens[0, :5].tolist() == [7, 4, 5, 6, 8] and (t.source[0, 1:5] == 1).all()
    # lam = 0.45: V_model = 0.45 + 0.15 = 0.6 ; V_ngram = 0.5 + 0.05 + 0 = 0.55 -> model, truncated before 0.3
    t = sel(**batch, lam=0.45, mode="choose", n_nodes=8)
    assert t.tokens[0, :4].tolist() == [7, 1, 2, -1] and int(t.valid.sum()) == 3
    # node budget of 2 truncates the chosen chain
    t = sel(**batch, lam=0.35, mode="choose", n_nodes=2)
    assert t.tokens[0].tolist() == [7, 4, 5]


def test_lambda_zero_keeps_everything_positive_and_huge_lambda_keeps_only_root():
    rng = np.random.default_rng(5)
    batch = make_batch(rng, 8, 4, 4, tree=True, overlap=0.0)
    for mode in ("choose", "merge"):
        big = sel(**batch, lam=torch.tensor(1e9), mode=mode, n_nodes=16)
        assert big.valid[:, 1:].sum() == 0 and (big.expected_accepted == 0).all()
        assert (big.tokens[:, 0] == batch["root_tokens"]).all()
    zero = sel(**batch, lam=0.0, mode="merge", n_nodes=16)
    for r in range(8):   # every distinct drafted path with positive survival is verified
        want = sum(max(v for _, v in vs) > 0 for vs in candidate_paths(batch, r).values())
        assert int(zero.valid[r, 1:].sum()) == want
    zero_c = sel(**batch, lam=0.0, mode="choose", n_nodes=16)
    use_ng = batch["ngram_surv"].sum(1) > batch["model_surv"].sum(1)   # lam = 0: V = sum of survivals
    want = torch.where(use_ng, (batch["ngram_surv"] > 0).sum(1), (batch["model_surv"] > 0).sum(1))
    assert torch.equal(zero_c.valid[:, 1:].sum(1), want)


def test_merge_folds_shared_prefix():
    batch = dict(root_tokens=torch.tensor([0]), model_tokens=torch.tensor([[1, 2, 3]]),
                 model_surv=torch.tensor([[0.8, 0.5, 0.2]]), model_len=torch.tensor([3]),
                 ngram_tokens=torch.tensor([[1, 2, 9, 4]]), ngram_parents=torch.tensor([[-1, 0, 1, 0]]),
                 ngram_surv=torch.tensor([[0.9, 0.7, 0.6, 0.1]]), ngram_len=torch.tensor([4]))
    t = sel(**batch, lam=0.0, mode="merge", n_nodes=8)
    check_layout(t, 8)
    got = {paths(t, 0)[i]: (int(t.source[0, i]), round(float(t.survival[0, i]), 4)) for i in paths(t, 0)}
    assert got == {(1,): (2, 0.9), (1, 2): (2, 0.7), (1, 2, 9): (1, 0.6), (1, 2, 3): (0, 0.2), (1, 4): (1, 0.1)}
    assert abs(float(t.expected_accepted[0]) - 2.5) < 1e-6


@pytest.mark.parametrize("max_depth", [1, 2, 3, 5, 8, 17])
def test_identical_paths_fold_like_comparing_the_paths(max_depth):
    """Merge's path folding (pointer doubling) against comparing each pool node's whole token path in Python, on
    random pools of two to three sources: chains and trees over a small vocabulary (so that paths repeat), depths up
    to ``max_depth``, some invalid nodes."""
    from sglang_hybrid.selector import _fold_identical_paths

    rng = np.random.default_rng(max_depth)
    for _ in range(30):
        b, tok, par, valid = 3, [], [], []
        for _row in range(b):
            t_row, p_row, v_row, d_row = [], [], [], []
            # the first source: a chain or a tree within max_depth; the others copy it with at most one token changed
            # at a random node (deep near-identical paths, as drafters that agree on a long prefix produce)
            n, chain = int(rng.integers(1, max_depth + 1)), rng.random() < 0.5
            shape, first = [], []
            for i in range(n):
                parent = i - 1 if chain else int(rng.integers(-1, i))
                if parent >= 0 and d_row[parent] >= max_depth:
                    parent = -1                                  # keep every node within max_depth
                d_row.append(1 + (d_row[parent] if parent >= 0 else 0))
                shape.append(parent)
                first.append(int(rng.integers(0, 3)))
            for src in range(int(rng.integers(2, 4))):
                base, toks = len(t_row), list(first)
                if src and rng.random() < 0.8:
                    toks[int(rng.integers(0, n))] += 1
                length = int(rng.integers(0, n + 1))
                for i in range(n):
                    t_row.append(toks[i])
                    p_row.append(base + shape[i] if shape[i] >= 0 else -1)
                    v_row.append(i < length)
            tok.append(t_row)
            par.append(p_row)
            valid.append(v_row)
        width = max(len(r) for r in tok)
        for rows, fill in ((tok, -1), (par, -1), (valid, False)):
            for r in rows:
                r.extend([fill] * (width - len(r)))
        tok_t, par_t, valid_t = torch.tensor(tok), torch.tensor(par), torch.tensor(valid)

        def path(row, i):
            out = []
            while i >= 0:
                out.append(tok[row][i])
                i = par[row][i]
            return tuple(reversed(out))

        depth = torch.tensor([[len(path(r, i)) if valid[r][i] else 0 for i in range(width)] for r in range(b)])
        rep, same = _fold_identical_paths(tok_t, par_t, depth, valid_t, max_depth)
        for r in range(b):
            for i in range(width):
                for j in range(width):
                    # a valid node's ancestors are valid (prefix-valid sources), so its path is all valid nodes
                    want = bool(valid[r][i] and valid[r][j] and path(r, i) == path(r, j))
                    assert bool(same[r, i, j]) == want, (r, i, j)
                first = min([j for j in range(width) if bool(same[r, i, j])], default=i)
                assert int(rep[r, i]) == (first if valid[r][i] else i)


def test_ancestors_from_parents_matches_walk():
    par = torch.tensor([[-1, 0, 1, 0, 3, -1], [-1, 0, 0, 2, 3, 4]])
    anc = ancestors_from_parents(par)
    for r in range(2):
        for i in range(6):
            want, j = set(), i
            while j >= 0:
                want.add(j)
                j = int(par[r, j])
            assert set(anc[r, i].nonzero().flatten().tolist()) == want


# ---------------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------------

def good_batch():
    return dict(root_tokens=torch.tensor([0, 1]), model_tokens=torch.tensor([[1, 2], [3, 4]]),
                model_surv=torch.tensor([[0.5, 0.2], [0.4, 0.1]]), model_len=torch.tensor([2, 2]),
                ngram_tokens=torch.tensor([[5, 6], [7, -1]]), ngram_parents=torch.tensor([[-1, 0], [-1, -1]]),
                ngram_surv=torch.tensor([[0.9, 0.1], [0.3, 0.0]]), ngram_len=torch.tensor([2, 1]))


@pytest.mark.parametrize("change,match", [
    (dict(model_surv=torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.1, 0.1]])), "model.survival has shape"),
    (dict(ngram_len=torch.tensor([2])), "ngram.length has shape"),
    (dict(model_surv=torch.tensor([[1, 0], [0, 0]])), "model.survival must have a floating dtype"),
    (dict(ngram_tokens=torch.tensor([[5.0, 6.0], [7.0, 0.0]])), "ngram.tokens must have an integer dtype"),
    (dict(ngram_surv=torch.tensor([[float("nan"), 0.1], [0.3, 0.0]])), "ngram.survival contains NaN"),
    (dict(model_surv=torch.tensor([[1.5, 0.2], [0.4, 0.1]])), r"model.survival must lie in \[0, 1\]"),
    (dict(model_len=torch.tensor([3, 2])), "model.length must lie in"),
    (dict(ngram_parents=torch.tensor([[-1, 1], [-1, -1]])), "parents must satisfy"),
    (dict(ngram_tokens=torch.tensor([[5, -1], [7, -1]])), "negative token id"),
    (dict(model_tokens=torch.zeros((2, 2), dtype=torch.int64, device="meta")), "must share one device"),
])
def test_bad_input_is_named(change, match):
    b = good_batch()
    b.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        sel(**b, lam=0.1, mode="merge", n_nodes=4)


def test_bad_mode_budget_lambda_and_empty_batch():
    with pytest.raises(ValueError, match="mode"):
        sel(**good_batch(), lam=0.1, mode="best", n_nodes=4)
    with pytest.raises(ValueError, match="n_nodes"):
        sel(**good_batch(), lam=0.1, mode="merge", n_nodes=0)
    with pytest.raises(ValueError, match="lam must be a 0-dim"):
        sel(**good_batch(), lam=torch.tensor([0.1]), mode="merge", n_nodes=4)
    with pytest.raises(ValueError, match="lam must be non-negative numbers"):
        sel(**good_batch(), lam=float("nan"), mode="merge", n_nodes=4)
    empty = {k: v[:0] for k, v in good_batch().items()}
    with pytest.raises(ValueError, match="empty batch"):
        sel(**empty, lam=0.1, mode="merge", n_nodes=4)
    with pytest.raises(ValueError, match="a must lie"):
        chain_survival(torch.tensor([[1.2]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="lengths has shape"):
        tree_survival(torch.tensor([[0.2]]), torch.tensor([[-1]]), torch.tensor([1, 1]))


def test_inconsistent_survivals_still_give_a_prefix_closed_tree():
    """A child estimated above its parent (an upstream bug) must not be verified without its parent."""
    batch = dict(root_tokens=torch.tensor([0]), model_tokens=torch.tensor([[1, 2, 3]]),
                 model_surv=torch.tensor([[0.2, 0.9, 0.8]]), model_len=torch.tensor([3]),
                 ngram_tokens=torch.tensor([[4, 5, 6]]), ngram_parents=torch.tensor([[-1, 0, 1]]),
                 ngram_surv=torch.tensor([[0.1, 0.95, 0.9]]), ngram_len=torch.tensor([3]))
    for mode in ("choose", "merge"):
        for n_nodes in (1, 2, 4):
            t = sel(**batch, lam=0.15, mode=mode, n_nodes=n_nodes)
            check_layout(t, n_nodes)
            # running minimum: model chain 0.2 everywhere (>= lam), n-gram 0.1 everywhere (< lam)
            want = [(1,), (1, 2), (1, 2, 3)][:min(n_nodes, 3)]
            assert sorted(paths(t, 0).values()) == want
            assert torch.allclose(t.survival[0, 1:1 + len(want)], torch.tensor(0.2))


# ---------------------------------------------------------------------------------------------------------------
# more than two drafters
# ---------------------------------------------------------------------------------------------------------------

def three_sources(rng, b, vocab=3):
    """EAGLE chain, n-gram tree and a third drafter's chain (value 3), often sharing prefixes."""
    base = make_batch(rng, b, 4, 5, vocab=vocab, tree=True, overlap=0.8)
    k3 = 3
    t3 = rng.integers(0, vocab, (b, k3))
    copy = rng.random(b) < 0.6
    t3[copy] = base["model_tokens"][copy, :k3].numpy()
    l3 = rng.integers(0, k3 + 1, b)
    s3 = chain_survival(torch.tensor(rng.uniform(0.3, 1.0, (b, k3)), dtype=torch.float32), torch.tensor(l3))
    cands = two_sources(**{k: v for k, v in base.items() if k != "root_tokens"})
    cands.append(Candidates.chain(torch.tensor(t3), s3, torch.tensor(l3), 3))
    return base["root_tokens"], cands


def union_paths(cands, r):
    """path -> [(source, survival)] over every valid node of every source (brute force, python loops)."""
    out = {}
    for c in cands:
        for i in range(int(c.length[r])):
            p, j = [], i
            while j >= 0:
                p.append(int(c.tokens[r, j]))
                j = int(c.parents[r, j])
            out.setdefault(tuple(reversed(p)), []).append((int(c.source), float(c.survival[r, i])))
    return out


def test_three_sources_merge_is_the_best_tree_and_choose_the_best_source():
    rng = np.random.default_rng(11)
    for trial in range(8):
        root, cands = three_sources(rng, 6)
        lam = float(rng.choice([0.0, 0.1, 0.3]))
        n_nodes = int(rng.integers(1, 6))
        m = select(root, cands, lam, mode="merge", n_nodes=n_nodes)
        c = select(root, cands, lam, mode="choose", n_nodes=n_nodes)
        check_layout(m, n_nodes)
        check_layout(c, n_nodes)
        assert (m.expected_accepted >= c.expected_accepted - 1e-6).all()
        for r in range(6):
            union = union_paths(cands, r)
            want = brute_best({p: [("x", max(v for _, v in vs))] for p, vs in union.items()}, lam, n_nodes)
            assert abs(float(m.expected_accepted[r]) - want) < 1e-5, (trial, r)
            got = paths(m, r)
            assert len(set(got.values())) == len(got), "merge verifies each drafted path once"
            for i, path in got.items():
                srcs = {s for s, _ in union[path]}
                assert int(m.source[r, i]) == (int(Source.SHARED) if len(srcs) > 1 else srcs.pop())
            # choose: one source, the one with the largest net value (ties to the earlier source)
            values = []
            for cand in cands:       # survivals from chain_survival / tree_survival never grow along a path
                sv = cand.survival[r, :int(cand.length[r])]
                values.append(float(torch.where((sv > 0) & (sv >= lam), sv - lam, torch.zeros_like(sv)).sum()))
            best = int(np.argmax(values))
            srcs = set(c.source[r, 1:int(c.valid[r].sum())].tolist())
            assert srcs <= {int(cands[best].source)}, (values, srcs)


def test_candidates_are_checked_as_a_set():
    root = torch.tensor([0])
    m = Candidates.chain(torch.tensor([[1, 2]]), torch.tensor([[0.5, 0.2]]), torch.tensor([2]), Source.MODEL)
    with pytest.raises(ValueError, match="appears twice"):
        select(root, [m, m], 0.0, mode="merge", n_nodes=4)
    with pytest.raises(ValueError, match="reserved"):
        select(root, [m._replace(source=Source.SHARED)], 0.0, mode="merge", n_nodes=4)
    with pytest.raises(TypeError, match="sequence of Candidates"):
        select(root, m, 0.0, mode="merge", n_nodes=4)
    with pytest.raises(ValueError, match="at least one drafter"):
        select(root, [], 0.0, mode="merge", n_nodes=4)
    t = select(root, [Candidates.empty(1, Source.MODEL), m._replace(source=Source.NGRAM)], 0.0, mode="choose",
               n_nodes=4)
    assert t.tokens[0, :3].tolist() == [0, 1, 2] and t.source[0, 1:3].tolist() == [Source.NGRAM] * 2


def test_one_price_per_request_equals_each_request_priced_alone():
    """``lam`` may be ``[B]`` (rows priced apart, as the adaptive-depth step does for its stacked depths): each row's
    tree equals the tree of that request selected alone at its own price."""
    b = good_batch()
    lams = torch.tensor([0.35, 0.05])
    for mode in ("choose", "merge"):
        both = sel(**b, lam=lams, mode=mode, n_nodes=4)
        for i in range(2):
            one = sel(**{k: v[i:i + 1] for k, v in b.items()}, lam=float(lams[i]), mode=mode, n_nodes=4)
            for name in one._fields:
                assert torch.equal(getattr(both, name)[i:i + 1], getattr(one, name)), (mode, name)
