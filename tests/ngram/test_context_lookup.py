"""Device prompt lookup (``sglang_plugin.context_lookup``) against a brute-force oracle written from its rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.sglang_plugin import context_lookup as CL
from tests.helpers.context_lookup import B_BIG, L_BIG, LOOKUP_BYTES_BOUND, big_batch, bytes_allocated


def _oracle(c, k, n_min, n_max):
    """The module docstring's rule, by loops: (tokens, match_len features, count, total)."""
    t = len(c)
    m = []
    for e in range(t - 1):
        n = 0
        while n < n_max and e - n >= 0 and c[e - n] == c[t - 1 - n]:
            n += 1
        m.append(n)
    if not m or max(m) < n_min:
        return [], [], 0, 0
    best = max(m)
    e_star = max(e for e in range(t - 1) if m[e] == best)
    dist = t - 1 - e_star                     # past the root the copy continues over its own tokens
    toks = [c[e_star + 1 + j % dist] for j in range(k)]
    strong = [e for e in range(t - 1) if m[e] >= best]
    feature = best
    if best >= n_max:                        # the chosen occurrence's whole match, up to N_LONG
        feature = 0
        while feature < CL.N_LONG and e_star - feature >= 0 and c[e_star - feature] == c[t - 1 - feature]:
            feature += 1
    return toks, [feature + j % dist for j in range(k)], sum(c[e + 1] == toks[0] for e in strong), len(strong)


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
        assert got.match_len[b, :n].tolist() == best[:n]
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
    assert got.tokens[0].tolist() == [2, 3, 1, 2] and int(got.length[1]) == 0      # the copy wraps at the root


def _lookup_before(table, slots, seq_lens, cur_gen, k, n_min=CL.N_MIN, n_max=CL.N_MAX):
    """The lookup as shipped before it took a span (whole table, unreversed windows, cumulative products; its copy
    since given the wrap at the root), kept here as the exactness reference for the bounded one: same inputs, same
    outputs, bit for bit."""
    ctx = table.tokens
    b, width = slots.shape[0], ctx.shape[1]
    big = width - 1
    rows = ctx.index_select(0, slots.to(torch.int64))
    t = seq_lens.to(torch.int64) + 1
    fits = (t <= big) & (table.gen.index_select(0, slots.to(torch.int64)) == cur_gen.to(torch.int64))
    tc = t.clamp(max=big)
    i = torch.arange(n_max)
    pat_pos = tc[:, None] - 1 - i[None, :]
    pat = torch.where(pat_pos >= 0, torch.gather(rows, 1, pat_pos.clamp(min=0)), -2)
    e = torch.arange(width)[None, :]
    windows = torch.nn.functional.pad(rows, (n_max - 1, 0), value=-3).unfold(1, n_max, 1).flip(-1)
    m = (windows == pat[:, None, :]).to(torch.uint8).cumprod(-1, dtype=torch.uint8).sum(-1, dtype=torch.int64)
    m = torch.where(e <= tc[:, None] - 2, m, 0)
    best = m.amax(1)
    e_star = torch.argmax(m * width + e, 1)
    i_long = torch.arange(CL.N_LONG)[None, :]
    at_e, at_t = e_star[:, None] - i_long, tc[:, None] - 1 - i_long
    same = (torch.gather(rows, 1, at_e.clamp(min=0)) == torch.gather(rows, 1, at_t.clamp(min=0))) & (at_e >= 0)
    match = torch.where(best >= n_max, same.to(torch.uint8).cumprod(1, dtype=torch.uint8).sum(1, dtype=torch.int64),
                        best)
    ok = fits & (best >= n_min)
    j = torch.arange(k)[None, :]
    length = torch.where(ok, k, 0)
    keep = j < length[:, None]
    jj = j % (tc - 1 - e_star).clamp(min=1)[:, None]
    tokens = torch.where(keep, torch.gather(rows, 1, (e_star[:, None] + 1 + jj).clamp(max=width - 1)).to(torch.int64),
                         -1)
    nxt = torch.nn.functional.pad(rows[:, 1:], (0, 1), value=-3)
    strong = (m >= best[:, None]) & (m > 0)
    total, count = strong.sum(1), (strong & (nxt == tokens[:, :1])).sum(1)
    return CL.LookupProposals(
        tokens=tokens, length=length, depth=torch.where(keep, j + 1, 0),
        match_len=torch.where(keep, match[:, None] + jj, 0), count=torch.where(keep, count[:, None], 0),
        total=torch.where(keep, total[:, None], 0), source=torch.zeros((b, k), dtype=torch.int64))


def _assert_same(got, want):
    for name, x, y in zip(CL.LookupProposals._fields, got, want):
        assert x.dtype == y.dtype and torch.equal(x, y), name


def _random_context(rng, t: int, kind: str) -> np.ndarray:
    """A committed context of ``t`` tokens: small vocabulary (many matches), all distinct (no match), or distinct with
    the tail repeated just before the end (the match sits at the last end positions)."""
    if kind == "repeats":
        return rng.integers(0, int(rng.integers(2, 6)), t)
    c = rng.permutation(1000)[:t] + 10
    if kind == "tail_near_end" and t >= 6:
        n = int(rng.integers(1, min(CL.N_MAX + 3, t // 2) + 1))
        c[t - 1 - n:t - 1] = c[t - n:]                      # c[T-1-n .. T-2] = tail: end positions T-2, T-3, ...
    return c


@pytest.mark.parametrize("seed", range(60))
def test_lookup_memory_bounded_span_is_exactly_the_whole_table_lookup(seed):
    """Random batches (rows of different lengths, some short; many matches, none, matches at the last end positions;
    stale tokens past each row's committed ones; rows not written for their generation; rows too long for the table):
    the lookup over any span covering the batch's longest context returns exactly what the lookup before spans
    returned over the whole table, field by field, and so does the lookup without a span."""
    rng = np.random.default_rng(1000 + seed)
    pool, max_len, k = 9, 96, int(rng.integers(1, 9))
    n_min, n_max = int(rng.integers(1, 3)), int(rng.integers(2, 10))
    table = CL.alloc_context(pool, max_len, "cpu")
    table.tokens.copy_(torch.as_tensor(rng.integers(-1, 6, table.tokens.shape), dtype=torch.int32))   # stale tokens
    b = int(rng.integers(1, pool + 1))
    slots = torch.as_tensor(rng.permutation(pool)[:b])
    gens = torch.as_tensor(rng.integers(0, 3, b))
    seq_lens = []
    for s, g in zip(slots.tolist(), gens.tolist()):
        t = int(rng.integers(1, max_len + 1)) if rng.random() < 0.6 else int(rng.integers(1, 12))
        c = _random_context(rng, t, str(rng.choice(["repeats", "distinct", "tail_near_end"])))
        CL.write_context(table, torch.full((t,), s), torch.arange(t), torch.as_tensor(c), torch.as_tensor([s]),
                         torch.as_tensor([g if rng.random() < 0.85 else g + 1]))
        seq_lens.append(t - 1 if rng.random() < 0.9 else max_len + int(rng.integers(0, 3)))   # some do not fit
    seq_lens = torch.as_tensor(seq_lens)
    want = _lookup_before(table, slots, seq_lens, gens, k, n_min, n_max)
    longest = int((seq_lens + 1).clamp(max=max_len).max())
    for span in {longest, int(rng.integers(longest, max_len + 1)), CL.context_span(longest, max_len), max_len}:
        _assert_same(CL.lookup(table, slots, seq_lens, gens, k, n_min, n_max, span=span), want)
    _assert_same(CL.lookup(table, slots, seq_lens, gens, k, n_min, n_max), want)


def test_lookup_memory_span_shorter_than_a_row_gives_that_row_nothing():
    """A span that a row's context overruns (a host bound that was too low) costs that row its proposal, never gives it
    one from part of its context; rows within the span are unchanged."""
    table = CL.alloc_context(2, 64, "cpu")
    z = torch.zeros(20, dtype=torch.int64)
    CL.write_context(table, z, torch.arange(20), torch.as_tensor([1, 2, 3, 4] * 5), torch.as_tensor([0]), z[:1])
    CL.write_context(table, z + 1, torch.arange(20), torch.as_tensor([5, 6] * 10), torch.as_tensor([1]), z[:1])
    slots, seq, gens = torch.as_tensor([0, 1]), torch.as_tensor([19, 7]), torch.zeros(2, dtype=torch.int64)
    whole = CL.lookup(table, slots, seq, gens, 3)
    assert whole.length.tolist() == [3, 3] and whole.tokens[1].tolist() == [5, 6, 5]   # row 1: the copy wraps
    short = CL.lookup(table, slots, seq, gens, 3, span=12)
    assert short.length.tolist() == [0, 3] and short.tokens[0].tolist() == [-1, -1, -1]
    _assert_same(CL.LookupProposals(*(x[1:] for x in short)), CL.LookupProposals(*(x[1:] for x in whole)))
    with pytest.raises(ValueError, match="span must be in"):
        CL.lookup(table, slots, seq, gens, 3, span=65)


def test_lookup_memory_span_ladder():
    """Powers of two from SPAN_MIN, capped at the table's context length: few static shapes, within twice the
    context."""
    assert CL.context_span(1, 131072) == CL.SPAN_MIN == 1024
    assert [CL.context_span(n, 131072) for n in (1024, 1025, 2048, 2049, 4096, 100_000)] == [1024, 2048, 2048, 4096,
                                                                                            4096, 131072]
    assert CL.context_span(5000, 3000) == 3000 and CL.context_span(10, 64) == 64
    assert len({CL.context_span(n, 131072) for n in range(1, 131073, 97)}) == 8


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_lookup_memory_span_compiles_without_graph_breaks(backend):
    """The bounded lookup (in-place masks on a view, argmin over bools viewed as uint8) traces as one graph, through
    AOTAutograd, and through inductor's generated kernels (about 10 s here), and returns what the lookup before spans
    returned."""
    rng = np.random.default_rng(5)
    table = CL.alloc_context(6, 3000, "cpu")
    table.tokens[:, :3000] = torch.as_tensor(rng.integers(0, 4, (6, 3000)), dtype=torch.int32)
    table.gen.zero_()
    slots, seq_lens = torch.as_tensor([3, 0, 5, 1]), torch.as_tensor([900, 40, 1022, 3])
    args = (table, slots, seq_lens, torch.zeros(4, dtype=torch.int64))
    span = CL.context_span(int(args[2].max()) + 1, 3000)
    assert span == 1024
    torch._dynamo.reset()
    fn = torch.compile(lambda c, s, L, g: CL.lookup(c, s, L, g, 8, span=span), fullgraph=True, dynamic=False,
                       backend=backend)
    got = fn(*args)
    _assert_same(got, _lookup_before(*args, 8))
    assert got.length.tolist() == [8, 8, 8, 8]


def test_lookup_memory_bound_at_batch_128_and_context_131072():
    """The engine issue's target, measured: at B=128, a 131,072-token table and 2,048-token contexts, one lookup over
    the span the worker passes allocates at most 64 MB (about 23 MB), where the whole-table lookup allocates
    hundreds of MB (3.3 GB before spans); the meter sees a known 8 MiB allocation."""
    assert bytes_allocated(lambda: torch.empty(8 << 20, dtype=torch.uint8))[0] >= 8 << 20
    table, slots, seq_lens, gens = big_batch()
    span = CL.context_span(int(seq_lens.max()) + 1, L_BIG)
    assert span == 4096
    CL.lookup(table, slots, seq_lens, gens, 8, span=span)                            # warm-up (one-time allocations)
    used, got = bytes_allocated(lambda: CL.lookup(table, slots, seq_lens, gens, 8, span=span))
    assert used <= LOOKUP_BYTES_BOUND, f"{used / 1e6:.1f} MB"
    whole, want = bytes_allocated(lambda: CL.lookup(table, slots, seq_lens, gens, 8))
    assert whole > 10 * LOOKUP_BYTES_BOUND, f"{whole / 1e6:.1f} MB"
    _assert_same(got, want)
    assert int((got.length > 0).sum()) == B_BIG
