"""Lossless verification: greedy equals the target's greedy continuation; tree speculative sampling keeps the target
distribution (chi-square on the joint law of the first three emitted tokens, many seeded trials)."""
import numpy as np
import pytest
import torch
from scipy import stats

from sglang_hybrid.selector import VerifyTree, ancestors_from_parents
from sglang_hybrid.verify import emitted_tokens, greedy_accept, sample_accept, sample_uniforms

torch.set_num_threads(1)
V = 4          # vocabulary
PRE = 3        # token before the root (the target is a 2nd-order Markov chain)
P_MIN = 1e-3   # chi-square p-value below which the test fails (seeded: deterministic)


def make_tree(root, tokens, parents, width):
    """VerifyTree from node lists (draft nodes 1..n; parents in tree indices, 0 = root)."""
    n = len(tokens)
    tok = torch.full((1, width), -1, dtype=torch.int64)
    par = torch.full((1, width), -1, dtype=torch.int64)
    tok[0, 0] = root
    tok[0, 1:n + 1] = torch.tensor(tokens, dtype=torch.int64)
    par[0, 1:n + 1] = torch.tensor(parents, dtype=torch.int64)
    valid = torch.arange(width)[None] <= n
    anc = ancestors_from_parents(par)
    depth = torch.where(valid, anc.sum(2) - 1, torch.zeros_like(par))
    src = torch.where(valid, torch.ones_like(par), -torch.ones_like(par)).to(torch.int8)
    src[0, 0] = -1
    surv = valid.to(torch.float32)
    return VerifyTree(tok, par, anc, depth, valid, src, surv, surv[:, 1:].sum(1))


def repeat_tree(t: VerifyTree, b):
    return VerifyTree(*[x.expand(b, *x.shape[1:]).contiguous() for x in t])


def target_logits(tree: VerifyTree, table):
    """logits[b, i] = table[token before node i, token of node i] (root: PRE, root token)."""
    tok = tree.tokens.clamp(min=0)
    prev = torch.where(tree.parents >= 0, torch.gather(tok, 1, tree.parents.clamp(min=0)), torch.full_like(tok, PRE))
    return table[prev, tok]


def exact_joint(table, root, temperature, length=3):
    p = torch.softmax(table.double() / temperature, dim=-1).numpy()
    out = np.zeros((V,) * length)
    for seq in np.ndindex(*(V,) * length):
        ctx = [PRE, root] + list(seq)
        out[seq] = np.prod([p[ctx[i], ctx[i + 1], ctx[i + 2]] for i in range(length)])
    return out


def complete(emitted, table, root, temperature, rng, length=3):
    """Extend each emitted prefix to ``length`` tokens by plain sampling from the target (vectorised)."""
    p = torch.softmax(table.double() / temperature, dim=-1).numpy()
    cdf = np.cumsum(p, axis=-1)
    seq = np.full((len(emitted), length + 2), -1, dtype=np.int64)
    seq[:, 0], seq[:, 1] = PRE, root
    have = np.zeros(len(emitted), dtype=np.int64)
    for r, e in enumerate(emitted):
        e = e[:length]
        seq[r, 2:2 + len(e)] = e
        have[r] = len(e)
    for pos in range(2, length + 2):
        need = have < pos - 1
        c = cdf[seq[need, pos - 2], seq[need, pos - 1]]
        u = rng.random(int(need.sum()))[:, None] * c[:, -1:]
        seq[need, pos] = np.minimum((c <= u).sum(1), V - 1)
    return seq[:, 2:]


def chi_square(samples, joint):
    counts = np.zeros(joint.size)
    np.add.at(counts, np.ravel_multi_index(samples.T, joint.shape), 1)
    exp = joint.reshape(-1) * len(samples)
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    tv = 0.5 * np.abs(counts / len(samples) - joint.reshape(-1)).sum()
    return stats.chisquare(obs, ex).pvalue, tv


def random_table(seed, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((V, V, V), generator=g) * scale


def greedy_path(table, root, n):
    ctx = [PRE, root]
    for _ in range(n):
        ctx.append(int(torch.argmax(table[ctx[-2], ctx[-1]])))
    return ctx[2:]


# trees: (tokens, parents) built from the greedy path g and its ranking so they contain right and wrong drafts
def trees_for(table, root):
    g = greedy_path(table, root, 4)
    worst = int(torch.argmin(table[PRE, root]))
    second = int(torch.argsort(table[PRE, root], descending=True)[1])
    return {
        "chain_right": (g[:4], [0, 1, 2, 3]),
        "chain_wrong": ([worst, g[1], g[2]], [0, 1, 2]),
        "chain_half": (g[:2] + [(g[2] + 1) % V, g[3]], [0, 1, 2, 3]),
        "tree_mixed": ([worst, g[0], second, g[1], (g[1] + 1) % V, g[2]], [0, 0, 0, 2, 2, 4]),
        "tree_dup_siblings": ([g[0], g[0], (g[0] + 2) % V, g[1]], [0, 0, 0, 1]),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_target_greedy_continuation(seed):
    table = random_table(seed)
    root = seed % V
    for name, (toks, pars) in trees_for(table, root).items():
        t = make_tree(root, toks, pars, width=8)
        res = greedy_accept(t, target_logits(t, table))
        n = int(res.accept_len[0])
        assert emitted_tokens(t, res)[0] == greedy_path(table, root, n + 1), name
        # longest tree path that equals the greedy continuation (brute force over nodes)
        best = 0
        for i in range(1, len(toks) + 1):
            path, j = [], i
            while j > 0:
                path.append(int(t.tokens[0, j]))
                j = int(t.parents[0, j])
            path = path[::-1]
            if path == greedy_path(table, root, len(path)):
                best = max(best, len(path))
        assert n == best, name
        # temperature 0 sampling is greedy whatever the uniforms
        u = sample_uniforms(1, 8, torch.Generator().manual_seed(seed))
        res0 = sample_accept(t, target_logits(t, table), 0.0, u)
        assert emitted_tokens(t, res0) == emitted_tokens(t, res), name


@pytest.mark.parametrize("name", ["chain_right", "chain_wrong", "chain_half", "tree_mixed", "tree_dup_siblings"])
def test_sampling_keeps_target_distribution(name):
    """Joint law of the first 3 emitted tokens (step output completed by plain target sampling) == target's.

    Tolerance: chi-square p-value >= 1e-3 over 30k seeded trials (deterministic); TV distance printed on failure.
    """
    trials = 30000
    seed = 11 + ["chain_right", "chain_wrong", "chain_half", "tree_mixed", "tree_dup_siblings"].index(name)
    table = random_table(seed)
    root = 1
    temperature = 0.8
    toks, pars = trees_for(table, root)[name]
    t = repeat_tree(make_tree(root, toks, pars, width=8), trials)
    logits = target_logits(t, table)
    u = sample_uniforms(trials, 8, torch.Generator().manual_seed(seed))
    res = sample_accept(t, logits, temperature, u)
    em = emitted_tokens(t, res)
    samples = complete(em, table, root, temperature, np.random.default_rng(seed))
    pval, tv = chi_square(samples, exact_joint(table, root, temperature))
    assert pval >= P_MIN, f"{name}: chi-square p={pval:.2e}, TV={tv:.4f}"
    # accepted length: E = sum over nodes of path products of p(token) (duplicate siblings contribute nothing)
    probs = torch.softmax(logits[:1] / temperature, dim=-1)[0]
    exp_len, s = 0.0, {0: 1.0}
    seen = set()
    for i in range(1, len(toks) + 1):
        p = int(t.parents[0, i])
        key = (p, int(t.tokens[0, i]))
        a = 0.0 if key in seen else float(probs[p, int(t.tokens[0, i])])
        seen.add(key)
        s[i] = s[p] * a
        exp_len += s[i]
    mean_len = float(res.accept_len.double().mean())
    se = float(res.accept_len.double().std()) / trials ** 0.5
    assert abs(mean_len - exp_len) < 5 * se + 1e-9, (mean_len, exp_len)


def test_sampling_with_per_request_temperature():
    trials = 20000
    table = random_table(5)
    root = 2
    toks, pars = trees_for(table, root)["tree_mixed"]
    t = repeat_tree(make_tree(root, toks, pars, width=8), trials)
    temp = torch.where(torch.arange(trials) % 2 == 0, torch.tensor(0.5), torch.tensor(1.3))
    res = sample_accept(t, target_logits(t, table), temp, sample_uniforms(trials, 8, torch.Generator().manual_seed(3)))
    em = emitted_tokens(t, res)
    for parity, tv_temp in ((0, 0.5), (1, 1.3)):
        rows = [e for r, e in enumerate(em) if r % 2 == parity]
        samples = complete(rows, table, root, tv_temp, np.random.default_rng(parity))
        pval, tv = chi_square(samples, exact_joint(table, root, tv_temp))
        assert pval >= P_MIN, f"T={tv_temp}: p={pval:.2e}, TV={tv:.4f}"


def test_result_layout():
    table = random_table(0)
    t = make_tree(0, *trees_for(table, 0)["tree_mixed"], width=8)
    res = greedy_accept(t, target_logits(t, table))
    assert res.accepted_nodes.shape == (1, 8) and res.accepted_nodes.dtype == torch.int64
    n = int(res.accept_len[0])
    nodes = res.accepted_nodes[0].tolist()
    assert nodes[0] == 0 and all(x == -1 for x in nodes[n + 1:])
    for d in range(1, n + 1):
        assert int(t.parents[0, nodes[d]]) == nodes[d - 1] and int(t.depth[0, nodes[d]]) == d


def test_bad_input():
    table = random_table(0)
    t = make_tree(0, [1, 2], [0, 1], width=4)
    logits = target_logits(t, table)
    with pytest.raises(ValueError, match="target_logits has shape"):
        greedy_accept(t, logits[:, :3])
    with pytest.raises(TypeError, match="target_logits must have a floating dtype"):
        greedy_accept(t, logits.long())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy_accept(t, logits[:, :, :2])
    with pytest.raises(ValueError, match="uniforms must lie"):
        sample_accept(t, logits, 1.0, torch.full((1, 4), 1.0))
    with pytest.raises(ValueError, match="uniforms has shape"):
        sample_accept(t, logits, 1.0, torch.rand(1, 3))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        sample_accept(t, logits, -1.0, torch.rand(1, 4))
    with pytest.raises(ValueError, match="temperature must be finite"):
        sample_accept(t, logits, torch.tensor([float("nan")]), torch.rand(1, 4))
    with pytest.raises(ValueError, match="temperature has shape"):
        sample_accept(t, logits, torch.tensor([1.0, 1.0]), torch.rand(1, 4))
    with pytest.raises(ValueError, match="NaN"):
        sample_accept(t, logits * float("nan"), 1.0, torch.rand(1, 4))
    with pytest.raises(TypeError, match="VerifyTree"):
        greedy_accept(tuple(t), logits)
    empty = VerifyTree(*[x[:0] for x in t])
    with pytest.raises(ValueError, match="empty batch"):
        greedy_accept(empty, logits[:0])
