"""Device prompt lookup (``sglang_plugin.context_lookup``) against a brute-force oracle written from its rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.sglang_plugin import context_lookup as CL


def _oracle(c, k, n_min, n_max):
    """The module docstring's rule, by loops: (tokens, match_len feature of token 0, count, total)."""
    t = len(c)
    m = []
    for e in range(t - 1):
        n = 0
        while n < n_max and e - n >= 0 and c[e - n] == c[t - 1 - n]:
            n += 1
        m.append(n)
    if not m or max(m) < n_min:
        return [], 0, 0, 0
    best = max(m)
    e_star = max(e for e in range(t - 1) if m[e] == best)
    toks = list(c[e_star + 1:min(e_star + 1 + k, t)])
    strong = [e for e in range(t - 1) if m[e] >= best]
    feature = best
    if best >= n_max:                        # the chosen occurrence's whole match, up to N_LONG
        feature = 0
        while feature < CL.N_LONG and e_star - feature >= 0 and c[e_star - feature] == c[t - 1 - feature]:
            feature += 1
    return toks, feature, sum(c[e + 1] == toks[0] for e in strong), len(strong)


@pytest.mark.parametrize("seed", range(40))
def test_lookup_matches_the_brute_force_rule(seed):
    rng = np.random.default_rng(seed)
    pool, max_len, k = 6, 40, 5
    n_min, n_max = int(rng.integers(1, 3)), int(rng.integers(3, 7))
    ctx = CL.alloc_context(pool, max_len, "cpu")
    slots = torch.as_tensor(rng.permutation(pool)[:4])
    gens = torch.as_tensor(rng.integers(0, 3, 4))
    contexts = []
    for s, g in zip(slots.tolist(), gens.tolist()):
        t = int(rng.integers(1, max_len + 1))
        c = rng.integers(0, int(rng.integers(2, 6)), t)        # small vocabularies: many repeats
        contexts.append(c)
        CL.write_context(ctx, torch.full((t,), s), torch.arange(t), torch.as_tensor(c), torch.as_tensor([s]),
                         torch.as_tensor([g]))
    seq_lens = torch.as_tensor([len(c) - 1 for c in contexts])
    got = CL.lookup(ctx, slots, seq_lens, gens, k, n_min, n_max)
    for b, c in enumerate(contexts):
        toks, best, count, total = _oracle(c.tolist(), k, n_min, n_max)
        n = len(toks)
        assert int(got.length[b]) == n
        assert got.tokens[b, :n].tolist() == toks and (got.tokens[b, n:] == -1).all()
        assert got.depth[b].tolist() == list(range(1, n + 1)) + [0] * (k - n)
        assert got.match_len[b, :n].tolist() == [best + j for j in range(n)]
        assert got.count[b, :n].tolist() == [count] * n and got.total[b, :n].tolist() == [total] * n
        assert (got.source[b] == 0).all()


def test_device_writes_extend_the_context_and_a_copy_continues():
    """Prompt 'a b c d e ... a b' written by the host; the lookup copies 'c d e'; after the device records the root
    and an emitted 'c', the next lookup continues with 'd e'."""
    ctx = CL.alloc_context(2, 32, "cpu")
    prompt = torch.as_tensor([10, 11, 12, 13, 14, 15, 10, 11])
    slots, gen = torch.as_tensor([1]), torch.as_tensor([4])
    CL.write_context(ctx, torch.ones(8, dtype=torch.int64), torch.arange(8), prompt, slots, gen)
    got = CL.lookup(ctx, slots, torch.as_tensor([7]), gen, k=3)
    assert got.tokens.tolist() == [[12, 13, 14]] and got.match_len.tolist() == [[2, 3, 4]]
    CL.write_rows(ctx, slots, torch.as_tensor([8]), torch.as_tensor([[12, 99]]), torch.as_tensor([1]))
    got = CL.lookup(ctx, slots, torch.as_tensor([8]), gen, k=3)
    assert got.tokens.tolist() == [[13, 14, 15]] and int(got.match_len[0, 0]) == 3
    assert int(ctx.tokens[1, 9]) == -1 and int(ctx.tokens[1, -1]) == 99          # past n: the trash column
    # the slot reused by a new request (generation 5) the host has not written yet: no proposal from old tokens
    assert int(CL.lookup(ctx, slots, torch.as_tensor([8]), torch.as_tensor([5]), k=3).length[0]) == 0


def test_rows_past_the_table_and_bad_settings():
    ctx = CL.alloc_context(1, 4, "cpu")
    z = torch.zeros(1, dtype=torch.int64)
    CL.write_context(ctx, torch.zeros(6, dtype=torch.int64), torch.arange(6), torch.as_tensor([1, 2, 1, 2, 1, 2]), z,
                     z)
    assert ctx.tokens[0].tolist() == [1, 2, 1, 2, 2]                     # positions 4, 5 went to the trash column
    assert CL.lookup(ctx, z, torch.as_tensor([3]), z, k=2).tokens.tolist() == [[1, 2]]   # T = 4 fits
    assert int(CL.lookup(ctx, z, torch.as_tensor([5]), z, k=2).length[0]) == 0           # T = 6 does not
    with pytest.raises(ValueError, match="n_min <= n_max"):
        CL.lookup(ctx, z, torch.as_tensor([3]), z, k=2, n_min=3, n_max=2)
    with pytest.raises(ValueError, match="max_len >= 2"):
        CL.alloc_context(1, 1, "cpu")


def test_lookup_compiles_without_graph_breaks():
    ctx = CL.alloc_context(3, 16, "cpu")
    CL.write_context(ctx, torch.zeros(10, dtype=torch.int64), torch.arange(10), torch.as_tensor([1, 2, 3] * 3 + [1]),
                     torch.as_tensor([0, 1]), torch.as_tensor([0, 0]))
    fn = torch.compile(lambda c, s, L, g: CL.lookup(c, s, L, g, 4), fullgraph=True, backend="eager")
    got = fn(ctx, torch.as_tensor([0, 1]), torch.as_tensor([9, 0]), torch.as_tensor([0, 0]))
    assert got.tokens[0].tolist() == [2, 3, 1, -1] and int(got.length[1]) == 0
