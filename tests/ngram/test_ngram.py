"""NgramDrafter (Rust suffix automaton via sglang_hybrid._ngram): behaviour against a brute-force reference,
the ARCHITECTURE.md layout, every bad-input case, threads, and lifecycle/memory release."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sglang_hybrid.ngram import NgramDrafter, NgramDrafts, drafter_defaults

# ---------------------------------------------------------------------------------------------------------------
# Brute-force reference (definitions, not algorithms). An occurrence of a pattern ends at the position of its
# last token and is *followed* when that is not the last position of the text. Corpus texts are documents each
# followed by SEP.
# ---------------------------------------------------------------------------------------------------------------

SEP = 2**32 - 1


def end_positions(text, pat):
    m = len(pat)
    return [e for e in range(m - 1, len(text)) if list(text[e - m + 1 : e + 1]) == list(pat)]


def followed(text, pat):
    """(occurrences followed by a token, most recent such end position or None)."""
    ends = [e for e in end_positions(text, pat) if e + 1 < len(text)]
    return len(ends), (ends[-1] if ends else None)


def continuation_count(text, pat, tok):
    return len(end_positions(text, list(pat) + [tok]))


def longest_repeated_suffix(text):
    n = len(text)
    for ln in range(n - 1, 0, -1):
        if len(end_positions(text, text[n - ln :])) >= 2:
            return ln
    return 0


def longest_suffix_in(corpus, ctx):
    n = len(ctx)
    for ln in range(n, 0, -1):
        if end_positions(corpus, ctx[n - ln :]):
            return ln
    return 0


def chain(text, pat, k):
    """[(token, match_len, count, total)] copying after the most recent followed occurrence, step by step; a
    pattern without one (the copy reached the text's end) first drops leading tokens down to its longest suffix
    that has one."""
    u = list(pat)
    out = []
    for _ in range(k):
        total, last = followed(text, u)
        while last is None and len(u) > 1:
            u = u[1:]
            total, last = followed(text, u)
        if last is None:
            break
        tok = text[last + 1]
        if tok == SEP:
            break
        out.append((tok, len(u), continuation_count(text, u, tok), total))
        u.append(tok)
    return out


def corpus_text(docs):
    t = []
    for d in docs:
        t.extend(d)
        t.append(SEP)
    return t


def expected_chain(ctx, k, corpus_docs=(), min_match=1):
    """Expected (source, [(token, match_len, count, total)]) for a request context and one corpus generation."""
    ctx = list(ctx)
    own = longest_repeated_suffix(ctx)
    if corpus_docs:
        ct = corpus_text(corpus_docs)
        lc = longest_suffix_in(ct, ctx)
        if lc > own and lc >= min_match:
            return 1, chain(ct, ctx[len(ctx) - lc :], k)
    if own >= min_match:
        return 0, chain(ctx, ctx[len(ctx) - own :], k)
    return 0, []


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------

FIELDS = ("tokens", "parents", "depth", "match_len", "count", "total", "source")


def random_context(rng, n, vocab):
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def row_features(dr: NgramDrafts, b: int):
    n = int(dr.lengths[b])
    return [
        (int(dr.tokens[b, j]), int(dr.match_len[b, j]), int(dr.count[b, j]), int(dr.total[b, j]))
        for j in range(n)
    ]


def check_layout(dr: NgramDrafts, batch: int, width: int, chain: bool):
    assert dr.lengths.shape == (batch,) and dr.lengths.dtype == np.int32
    for f in FIELDS:
        a = getattr(dr, f)
        assert a.shape == (batch, width), f
        assert a.dtype == (np.int8 if f == "source" else np.int32), f
        assert a.flags.c_contiguous, f
    for b in range(batch):
        n = int(dr.lengths[b])
        assert 0 <= n <= width
        assert (dr.tokens[b, n:] == -1).all() and (dr.parents[b, n:] == -1).all()
        for f in ("depth", "match_len", "count", "total", "source"):
            assert (getattr(dr, f)[b, n:] == 0).all(), f
        assert (dr.tokens[b, :n] >= 0).all()
        assert (dr.count[b, :n] >= 1).all() and (dr.count[b, :n] <= dr.total[b, :n]).all()
        assert (dr.match_len[b, :n] >= 1).all()
        assert np.isin(dr.source[b, :n], (0, 1)).all()
        if chain:
            assert dr.parents[b, :n].tolist() == list(range(-1, n - 1))
            assert dr.depth[b, :n].tolist() == list(range(1, n + 1))
        else:
            for j in range(n):
                p = int(dr.parents[b, j])
                assert -1 <= p < j
                assert dr.depth[b, j] == (1 if p < 0 else dr.depth[b, p] + 1)


# ---------------------------------------------------------------------------------------------------------------
# behaviour vs the reference
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [2, 3, 5])
def test_chain_matches_reference(vocab):
    rng = np.random.default_rng(vocab)
    d = NgramDrafter(max_draft=8, use_corpus=False)
    contexts = {}
    for rid in range(12):
        ctx = random_context(rng, int(rng.integers(0, 40)), vocab)
        d.start(rid, np.asarray(ctx, dtype=np.int64))
        contexts[rid] = ctx
    for step in range(6):
        ids = np.array(list(contexts) + [3, 3], dtype=np.int64)  # repeats allowed
        k = int(rng.integers(1, 9))
        dr = d.propose(ids, k)
        check_layout(dr, len(ids), k, chain=True)
        for b, rid in enumerate(ids):
            src, want = expected_chain(contexts[int(rid)], k)
            assert row_features(dr, b) == want, (contexts[int(rid)], k)
            assert (dr.source[b, : len(want)] == 0).all()
        for rid in contexts:
            new = random_context(rng, int(rng.integers(0, 4)), vocab)
            d.extend(rid, np.asarray(new, dtype=np.int32))
            contexts[rid] += new
            assert d.context_len(rid) == len(contexts[rid])


def test_most_recent_occurrence_is_copied():
    d = NgramDrafter(max_draft=4, use_corpus=False)
    # "1 2" occurs followed by 3, later by 4; the draft copies after the later one.
    d.start(0, [1, 2, 3, 9, 1, 2, 4, 8, 1, 2])
    dr = d.propose([0], 2)
    assert dr.tokens[0].tolist() == [4, 8]
    assert dr.match_len[0].tolist() == [2, 3]
    assert dr.count[0].tolist() == [1, 1] and dr.total[0].tolist() == [2, 1]


def test_a_copy_that_reaches_the_end_continues_as_the_loop_it_is():
    """A context ending in a loop ("5 6 7" twice): the copy after the earlier "5 6 7" reaches the end of the text after
    3 tokens; the chain goes on over its own drafted tokens (the match falls back to "5 6 7"), k tokens in all."""
    d = NgramDrafter(max_draft=8, use_corpus=False)
    d.start(0, [1, 2, 5, 6, 7, 5, 6, 7])
    dr = d.propose([0], 8)
    assert int(dr.lengths[0]) == 8 and dr.tokens[0].tolist() == [5, 6, 7] * 2 + [5, 6]
    assert dr.match_len[0].tolist() == [3, 4, 5, 3, 4, 5, 3, 4]
    # a copy that does not reach the end is unchanged: "1 2" then the text after it
    d.start(1, [1, 2, 5, 6, 7, 9, 9, 1, 2])
    assert d.propose([1], 4).tokens[0].tolist() == [5, 6, 7, 9]


def test_long_match_has_no_cap():
    rng = np.random.default_rng(0)
    doc = random_context(rng, 3000, 50_000)
    d = NgramDrafter(max_draft=8, use_corpus=False)
    d.start(1, doc + [7, 7, 7] + doc[:2500])
    dr = d.propose([1], 8)
    assert dr.match_len[0, 0] >= 2500  # the whole copied prefix is matched
    assert dr.tokens[0].tolist() == doc[2500:2508]


def test_corpus_donation_is_used_when_longer():
    d = NgramDrafter(max_draft=6, corpus_cap_tokens=10_000, donate_prompts=False)  # responses only
    response = [20, 21, 22, 23, 24, 25, 26, 27]
    d.start(1, [1, 2, 3])
    d.extend(1, response)
    d.finish(1, donate=True)
    d.remove(1)
    assert d.corpus_stats()["donated_tokens"] == len(response) + 1  # + separator
    ctx = [5, 6, 20, 21, 22]
    d.start(2, ctx)
    dr = d.propose([2], 6)
    src, want = expected_chain(ctx, 6, corpus_docs=[response])
    assert src == 1
    assert row_features(dr, 0) == want
    assert dr.tokens[0, : len(want)].tolist() == [23, 24, 25, 26, 27]  # stops at the end of the document
    assert (dr.source[0, : len(want)] == 1).all()
    # Tokens appended after the donation keep the corpus match up to date.
    d.extend(2, [23, 24])
    dr = d.propose([2], 3)
    assert dr.tokens[0].tolist() == [25, 26, 27] and dr.match_len[0, 0] == 5


def test_prompt_donation_switch_and_own_prompt_guard():
    assert drafter_defaults()["donate_prompts"] is True
    prompt, response = [1, 2, 3, 4, 5], [20, 21, 22]
    for donate_prompts in (False, True):
        d = NgramDrafter(max_draft=6, corpus_cap_tokens=10_000, donate_prompts=donate_prompts)
        d.start(1, prompt)
        # Request 1 never sees its own prompt in the corpus: nothing is donated before it finishes.
        assert d.corpus_stats()["donated_tokens"] == 0
        d.extend(1, response)
        assert d.propose([1], 6).lengths[0] == 0  # no repeat in its own context, no corpus match
        d.finish(1, donate=True)
        doc = prompt + response if donate_prompts else response
        assert d.corpus_stats()["donated_tokens"] == len(doc) + 1
        assert d.propose([1], 6).lengths[0] == 0  # finished: drafts nothing, even with its text in the corpus
        # A later request quoting the prompt copies it (and on into the response) only with prompt donation.
        ctx = [9, 1, 2]
        d.start(2, ctx)
        dr = d.propose([2], 6)
        src, want = expected_chain(ctx, 6, corpus_docs=[doc])
        assert row_features(dr, 0) == want
        if donate_prompts:
            assert src == 1 and dr.tokens[0, :6].tolist() == [3, 4, 5, 20, 21, 22]
        else:
            assert dr.lengths[0] == 0


def test_own_context_wins_ties_and_longer_matches():
    d = NgramDrafter(max_draft=4, corpus_cap_tokens=10_000)
    d.add_corpus([1, 2, 3, 4])
    d.start(1, [9, 1, 2, 7, 9, 1, 2])  # own match "9 1 2" (3) beats corpus "1 2" (2)
    dr = d.propose([1], 2)
    assert dr.source[0, 0] == 0 and dr.tokens[0, 0] == 7
    d.start(2, [5, 1, 2, 3])  # no own repeat; static corpus "1 2 3" -> 4
    dr = d.propose([2], 2)
    assert dr.source[0, 0] == 1 and dr.tokens[0, 0] == 4 and dr.lengths[0] == 1


def test_corpus_requests_started_before_donation_see_it():
    d = NgramDrafter(max_draft=3, corpus_cap_tokens=10_000)
    d.start(1, [40, 41, 42])
    d.start(2, [0])
    d.extend(2, [40, 41, 42, 43, 44, 45])
    d.finish(2, donate=True)
    dr = d.propose([1], 3)
    assert dr.tokens[0].tolist() == [43, 44, 45] and (dr.source[0] == 1).all()


def test_tree_features_match_reference():
    rng = np.random.default_rng(3)
    d = NgramDrafter(max_draft=8, max_nodes=16, use_corpus=False)
    for rid in range(10):
        ctx = random_context(rng, int(rng.integers(5, 60)), int(rng.integers(2, 6)))
        d.start(rid, ctx)
        for n in (1, 4, 16):
            tr = d.propose_tree([rid], n)
            check_layout(tr, 1, n, chain=False)
            m = int(tr.lengths[0])
            if longest_repeated_suffix(ctx) > 0:
                assert m >= 1
            for j in range(m):
                path, a = [], int(tr.parents[0, j])
                while a >= 0:
                    path.append(int(tr.tokens[0, a]))
                    a = int(tr.parents[0, a])
                x = ctx + path[::-1]
                ml = int(tr.match_len[0, j])
                u = x[len(x) - ml :]
                tok = int(tr.tokens[0, j])
                assert tr.count[0, j] == continuation_count(ctx, u, tok) >= 1
                assert tr.total[0, j] == followed(ctx, u)[0]
                sib = [int(tr.tokens[0, s]) for s in range(j) if tr.parents[0, s] == tr.parents[0, j]]
                assert tok not in sib


def test_tree_offers_alternatives_on_prose_like_text():
    # After "9 1" the context saw 3 and 4 (the longest match); after "1" alone also 2 (a shorter context).
    d = NgramDrafter(max_nodes=32, use_corpus=False)
    d.start(0, [1, 2, 9, 1, 3, 9, 1, 4, 9, 1])
    tr = d.propose_tree([0], 2)
    assert tr.tokens[0].tolist() in ([4, 3], [4, 9])  # the most recent continuation ranks first
    tr = d.propose_tree([0], 16)
    roots = tr.parents[0] == -1
    assert sorted(tr.tokens[0][roots].tolist()) == [2, 3, 4]
    # 3 and 4 come from the longest context (match 2), 2 from the suffix-link backoff (match 1).
    assert dict(zip(tr.tokens[0][roots].tolist(), tr.match_len[0][roots].tolist())) == {4: 2, 3: 2, 2: 1}
    chain = d.propose([0], 8)
    assert tr.tokens[0, 0] == chain.tokens[0, 0]


def test_extend_batch_equals_single_extends():
    rng = np.random.default_rng(5)
    a = NgramDrafter(use_corpus=False)
    b = NgramDrafter(use_corpus=False)
    for rid in range(6):
        p = random_context(rng, 10, 4)
        a.start(rid, p)
        b.start(rid, p)
    for _ in range(5):
        ids = np.array([4, 0, 5, 2], dtype=np.int64)
        lens = rng.integers(0, 4, size=4)
        padded = np.full((4, 3), -1, dtype=np.int64)
        for i, ln in enumerate(lens):
            padded[i, :ln] = rng.integers(0, 4, size=ln)
        a.extend_batch(ids, padded, lens)
        for i, rid in enumerate(ids):
            b.extend(int(rid), padded[i, : lens[i]])
        flat = np.concatenate([padded[i, : lens[i]] for i in range(4)])
        a.extend_batch(ids, flat, lens)
        for i, rid in enumerate(ids):
            b.extend(int(rid), padded[i, : lens[i]])
    allids = np.arange(6)
    ra, rb = a.propose(allids, 8), b.propose(allids, 8)
    for f in FIELDS + ("lengths",):
        assert np.array_equal(getattr(ra, f), getattr(rb, f)), f


# ---------------------------------------------------------------------------------------------------------------
# input conversion policy and bad input
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "prompt",
    [
        [1, 2, 1, 2],
        (1, 2, 1, 2),
        np.array([1, 2, 1, 2], dtype=np.int32),
        np.array([1, 2, 1, 2], dtype=np.int64),
        np.array([1, 2, 1, 2], dtype=np.uint16),
        np.array([1, 2, 1, 2], dtype=np.uint64),
    ],
)
def test_accepted_inputs(prompt):
    d = NgramDrafter(use_corpus=False)
    d.start(np.int64(1), prompt)
    assert d.propose([1], 2).tokens[0].tolist() == [1, 2]


def _snapshot(d, ids):
    dr = d.propose(np.asarray(ids), d.max_draft)
    return [getattr(dr, f).copy() for f in FIELDS + ("lengths",)], [d.context_len(i) for i in ids]


def _same(s1, s2):
    return all(np.array_equal(a, b) for a, b in zip(s1[0], s2[0])) and s1[1] == s2[1]


BAD_CALLS = [
    # (description, callable, exception type, message fragment)
    ("unknown id extend", lambda d: d.extend(99, [1]), KeyError, "unknown request id 99"),
    ("unknown id propose", lambda d: d.propose([0, 99], 2), KeyError, "99"),
    ("unknown id finish", lambda d: d.finish(99), KeyError, "99"),
    ("unknown id remove", lambda d: d.remove(99), KeyError, "99"),
    ("unknown id context_len", lambda d: d.context_len(99), KeyError, "99"),
    ("duplicate start", lambda d: d.start(0, [1]), ValueError, "already started"),
    ("negative token", lambda d: d.extend(0, [1, -1]), ValueError, "-1 out of range"),
    ("negative token int32", lambda d: d.extend(0, np.array([-5], dtype=np.int32)), ValueError, "negative"),
    ("token >= vocab", lambda d: d.extend(0, [3, 100]), ValueError, "out of range"),
    ("token >= vocab in start", lambda d: d.start(5, [100]), ValueError, "out of range"),
    ("token >= 2^31", lambda d: d.extend(0, [2**31]), ValueError, "out of range"),
    ("token in corpus out of range", lambda d: d.add_corpus([1, 100]), ValueError, "out of range"),
    ("k = 0", lambda d: d.propose([0], 0), ValueError, "k = 0"),
    ("k > max_draft", lambda d: d.propose([0], 9), ValueError, "max_draft"),
    ("n_nodes = 0", lambda d: d.propose_tree([0], 0), ValueError, "n_nodes"),
    ("n_nodes > max", lambda d: d.propose_tree([0], 17), ValueError, "max_nodes"),
    ("float tokens", lambda d: d.extend(0, np.array([1.0, 2.0])), TypeError, "integer dtype"),
    ("float list", lambda d: d.extend(0, [1, 2.5]), TypeError, "only ints"),
    ("bool tokens", lambda d: d.extend(0, np.array([True])), TypeError, "integer dtype"),
    ("string tokens", lambda d: d.extend(0, "abc"), TypeError, ""),
    ("2-D tokens", lambda d: d.extend(0, np.zeros((2, 2), dtype=np.int64)), ValueError, "1-D"),
    ("float ids", lambda d: d.propose(np.array([0.0]), 2), TypeError, "integer dtype"),
    ("req_id float", lambda d: d.extend(0.0, [1]), TypeError, "req_id"),
    ("req_id str", lambda d: d.start("a", [1]), TypeError, "req_id"),
    ("req_id huge", lambda d: d.start(2**70, [1]), ValueError, "int64"),
    ("k float", lambda d: d.propose([0], 2.0), TypeError, "k"),
    ("batch duplicate ids", lambda d: d.extend_batch([0, 0], [1, 2], [1, 1]), ValueError, "twice"),
    ("batch lengths mismatch", lambda d: d.extend_batch([0, 1], [1, 2], [1]), ValueError, "lengths"),
    ("batch sum mismatch", lambda d: d.extend_batch([0, 1], [1, 2, 3], [1, 1]), ValueError, "sum(lengths)"),
    ("batch bad token", lambda d: d.extend_batch([0, 1], [1, 200], [1, 1]), ValueError, "out of range"),
    ("batch unknown id", lambda d: d.extend_batch([0, 42], [1, 2], [1, 1]), KeyError, "42"),
    ("extend finished", lambda d: d.extend(2, [1]), ValueError, "finished"),
    ("finish twice", lambda d: d.finish(2), ValueError, "finished"),
]


@pytest.mark.parametrize("desc,call,exc,frag", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_and_leaves_state_intact(desc, call, exc, frag):
    d = NgramDrafter(max_draft=8, max_nodes=16, vocab_size=50, corpus_cap_tokens=1000)
    d.start(0, [1, 2, 3, 1, 2])
    d.start(1, [4, 5, 4])
    d.start(2, [7, 8])
    d.extend(2, [7, 8])
    d.finish(2, donate=True)
    before = _snapshot(d, [0, 1])
    corpus_before = d.corpus_stats()
    with pytest.raises(exc) as ei:
        call(d)
    assert frag in str(ei.value)
    assert _same(before, _snapshot(d, [0, 1]))
    assert d.corpus_stats() == corpus_before
    assert len(d) == 3


def test_constructor_validation():
    with pytest.raises(ValueError, match="max_draft"):
        NgramDrafter(max_draft=0)
    with pytest.raises(ValueError, match="min_match"):
        NgramDrafter(min_match=0)
    with pytest.raises(ValueError, match="vocab_size"):
        NgramDrafter(vocab_size=0)
    with pytest.raises(TypeError, match="max_nodes"):
        NgramDrafter(max_nodes=1.5)


def test_drafter_defaults_have_one_owner():
    """The defaults are written once, in Rust (``DrafterConfig::default()``, exposed as ``_ngram.drafter_defaults()``):
    every remaining copy (the facade's signature, the core's signature, the stub) must agree with it."""
    import ast
    import inspect
    import pathlib

    from sglang_hybrid import _ngram
    from sglang_hybrid import ngram as ngram_mod

    rust = _ngram.drafter_defaults()
    names = list(rust)
    assert "max_draft" in names and "vocab_size" in names
    assert ngram_mod.drafter_defaults() == rust
    ngram_mod.drafter_defaults()["max_draft"] = -1  # a new dict each call: callers cannot corrupt the defaults
    assert _ngram.drafter_defaults() == rust

    # The facade: same arguments, in the same order, with the very same defaults (bool stays bool, None stays None).
    params = list(inspect.signature(NgramDrafter.__init__).parameters.values())[1:]
    assert [p.name for p in params] == names
    for p in params:
        assert p.default == rust[p.name] and type(p.default) is type(rust[p.name]), p

    # The core: built with no argument it holds the defaults; its signature names every field.
    core = _ngram.NgramCore()
    assert core.config == rust
    assert (core.max_draft, core.max_nodes) == (rust["max_draft"], rust["max_nodes"])
    assert list(inspect.signature(_ngram.NgramCore).parameters) == names
    assert NgramDrafter()._core.config == rust

    # The facade passes every setting through to the core (none falls back to a default of its own).
    changed = {}
    for n, v in rust.items():
        changed[n] = (not v) if isinstance(v, bool) else 1000 if v is None else v + 1
    assert NgramDrafter(**changed)._core.config == changed

    # The stub: the same arguments, and no default value other than `...` or the Rust one.
    stub = ast.parse(pathlib.Path(ngram_mod.__file__).with_name("_ngram.pyi").read_text())
    classes = {c.name: c for c in stub.body if isinstance(c, ast.ClassDef)}
    init = next(f for f in classes["NgramCore"].body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    args = init.args.args[1:] + init.args.kwonlyargs
    assert [a.arg for a in args] == names
    defaults = dict(zip([a.arg for a in init.args.args[1:]][-len(init.args.defaults) :], init.args.defaults))
    defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults) if d is not None})
    assert set(defaults) == set(names)
    for n, d in defaults.items():
        if not (isinstance(d, ast.Constant) and d.value is Ellipsis):
            assert eval(ast.unparse(d), {}) == rust[n], f"_ngram.pyi: {n} = {ast.unparse(d)} but Rust says {rust[n]!r}"
    typed = [s.target.id for s in classes["_DrafterConfig"].body if isinstance(s, ast.AnnAssign)]
    assert typed == names
    assert any(isinstance(f, ast.FunctionDef) and f.name == "drafter_defaults" for f in stub.body)


def test_strided_views_are_copied_not_rejected():
    """A column of a 2-D batch (a strided view) works like the same tokens in a contiguous array."""
    batch = np.array([[5, 100], [6, 101], [7, 102], [5, 103], [6, 104]], dtype=np.int64)
    col = batch[:, 0]
    assert not col.flags.c_contiguous
    a, b = NgramDrafter(max_draft=4), NgramDrafter(max_draft=4)
    a.start(0, col)
    b.start(0, np.ascontiguousarray(col))
    ids = np.array([0, 7, 0], dtype=np.int64)[::2]                    # strided ids too
    assert not ids.flags.c_contiguous
    got, want = a.propose(ids, 2), b.propose([0, 0], 2)
    assert got.tokens.tolist() == want.tokens.tolist() == [[7, 5], [7, 5]]
    a.extend(0, batch[:2, 1].astype(np.int32)[::-1])                  # negative stride, other dtype
    b.extend(0, [101, 100])
    assert a.propose([0], 4).tokens.tolist() == b.propose([0], 4).tokens.tolist()


def test_core_rejects_wrong_arrays_directly():
    """The compiled core is safe on its own too (the facade is not the only guard)."""
    from sglang_hybrid import _ngram

    core = _ngram.NgramCore(max_draft=4)
    with pytest.raises(TypeError, match="int32 or int64"):
        core.start(1, np.array([1.0]))
    with pytest.raises(TypeError, match="int32 or int64"):
        core.start(1, [1, 2])
    with pytest.raises(ValueError, match="C-contiguous"):
        core.start(1, np.arange(6, dtype=np.int32)[::2])
    with pytest.raises(ValueError, match="out of range"):
        core.start(1, np.array([2**40], dtype=np.int64))
    core.start(1, np.array([1, 2, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="k = 5"):
        core.propose(np.array([1], dtype=np.int64), 5)


# ---------------------------------------------------------------------------------------------------------------
# lifecycle, memory, threads
# ---------------------------------------------------------------------------------------------------------------

def test_lifecycle_and_memory_release():
    d = NgramDrafter(use_corpus=False)
    base = d.memory_bytes()
    rng = np.random.default_rng(1)
    d.start(1, rng.integers(0, 1000, size=5000))
    assert 1 in d and 2 not in d and "x" not in d and len(d) == d.num_requests == 1
    per_req = d.memory_bytes(1)
    assert per_req > 5000 * 20
    assert d.memory_bytes() >= base + per_req
    d.extend(1, [])  # no-op
    assert d.context_len(1) == 5000
    d.finish(1, donate=False)
    assert d.memory_bytes(1) < 1024 and d.context_len(1) == 0
    assert d.propose([1], 4).lengths.tolist() == [0]  # finished requests answer with empty rows
    assert d.propose_tree([1], 4).lengths.tolist() == [0]
    d.remove(1)
    assert 1 not in d and len(d) == 0
    assert d.memory_bytes() < base + 4096
    d.start(1, [1, 2])  # the id can be reused after remove
    assert d.context_len(1) == 2


def test_memory_per_token_within_target():
    """At most 200 bytes of heap per context token (its memory target), for a prompt and for token-by-token growth."""
    rng = np.random.default_rng(2)
    # Zipf-like ids over a 50k vocabulary: many distinct continuations, the heavier case for transitions.
    toks = np.minimum((50_000 ** rng.random(32_000)).astype(np.int64) - 1, 49_999)
    d = NgramDrafter(use_corpus=False)
    d.start(1, toks)
    assert d.memory_bytes(1) / len(toks) <= 200
    d.start(2, toks[:16])
    for i in range(16, len(toks), 7):
        d.extend(2, toks[i : i + 7])
    assert d.context_len(2) == len(toks)
    assert d.memory_bytes(2) / len(toks) <= 200


def test_threads_share_one_drafter_safely():
    """8 threads drive disjoint requests of one drafter at once; results equal a single-threaded run."""
    rng = np.random.default_rng(9)
    plans = {
        t: [(rid, random_context(rng, 30, 4), [random_context(rng, 3, 4) for _ in range(15)])
            for rid in range(t * 10, t * 10 + 10)]
        for t in range(8)
    }

    def run(d, plan, out):
        for rid, prompt, steps in plan:
            d.start(rid, prompt)
            for s in steps:
                dr = d.propose([rid], 6)
                t = d.propose_tree([rid], 6)
                out.append((rid, dr.tokens.tolist(), dr.count.tolist(), t.tokens.tolist()))
                d.extend(rid, s)
            d.finish(rid, donate=False)
            d.remove(rid)

    shared = NgramDrafter(max_draft=6, max_nodes=8, use_corpus=False)
    results = {t: [] for t in plans}
    errors = []

    def worker(t):
        try:
            run(shared, plans[t], results[t])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in plans]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(shared) == 0
    for t, plan in plans.items():
        solo = []
        run(NgramDrafter(max_draft=6, max_nodes=8, use_corpus=False), plan, solo)
        assert results[t] == solo


def test_threads_with_shared_corpus_and_errors():
    """Concurrent donations, proposals and rejected calls keep the drafter consistent."""
    d = NgramDrafter(max_draft=4, corpus_cap_tokens=500, vocab_size=10)
    errors = []

    def worker(t):
        rng = np.random.default_rng(t)
        try:
            for i in range(60):
                rid = t * 1000 + i
                d.start(rid, rng.integers(0, 10, size=20))
                with pytest.raises(ValueError):
                    d.extend(rid, [10])
                d.extend(rid, rng.integers(0, 10, size=10))
                d.propose([rid], 4)
                d.propose_tree([rid], 5)
                d.finish(rid, donate=True)
                d.remove(rid)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(d) == 0
    st = d.corpus_stats()
    assert 0 < st["donated_tokens"] <= 502 and st["rotations"] > 0
