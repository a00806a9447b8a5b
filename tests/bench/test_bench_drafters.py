"""Smoke tests of the drafter benchmark's metric, replay loop, adapters and workloads (bench/drafters.py).

Why: the benchmark's numbers are only worth printing if the acceptance metric is exactly what greedy verification
accepts and the replay feeds each drafter exactly the emitted tokens. These tests check that on a few hundred tokens:
the metric against a brute-force count, the replay's bookkeeping, and that a perfectly repeated text is drafted in
full by our drafter. Anchors are optional: their adapter checks skip when the package is not installed.
"""

import importlib.util

import numpy as np
import pytest

from bench import anchors, drafters

rng = np.random.default_rng(0)


def _brute_chain(draft, truth):
    n = 0
    for d, t in zip(list(draft), list(truth)):
        if d != t:
            break
        n += 1
    return n


def _brute_tree(tokens, parents, truth):
    """Deepest node whose whole root path equals truth's prefix, by enumerating every node's path."""
    best = 0
    for i in range(len(tokens)):
        path = []
        j = i
        while j != -1:
            path.append(int(tokens[j]))
            j = int(parents[j])
        path.reverse()
        if len(path) <= len(truth) and path == [int(t) for t in truth[: len(path)]]:
            best = max(best, len(path))
    return best


def test_accepted_chain_matches_brute_force():
    for _ in range(300):
        truth = rng.integers(0, 3, size=rng.integers(0, 9)).astype(np.int32)
        draft = rng.integers(0, 3, size=rng.integers(0, 9)).astype(np.int32)
        assert drafters.accepted_chain(draft, truth) == _brute_chain(draft, truth)


def test_accepted_tree_matches_brute_force():
    for _ in range(300):
        n = int(rng.integers(0, 9))
        tokens, parents = [], []
        for i in range(n):
            p = int(rng.integers(-1, i)) if i else -1
            # distinct siblings, as every drafter here produces
            used = {tokens[j] for j in range(i) if parents[j] == p}
            choices = [t for t in range(3) if t not in used]
            if not choices:
                break
            tokens.append(int(rng.choice(choices)))
            parents.append(p)
        truth = rng.integers(0, 3, size=8).astype(np.int32)
        t, p = np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32)
        assert drafters.accepted_tree(t, p, truth) == _brute_tree(t, p, truth)


class ScriptedDrafter(anchors.DrafterAdapter):
    """Proposes the true continuation with one wrong token at a chosen depth; records what it is given."""

    name = "scripted"

    def __init__(self, output, wrong_at):
        self.output = output
        self.wrong_at = wrong_at  # step -> index of the wrong token (or None: all right)
        self.step = 0
        self.ctx = None
        self.received = []

    def start(self, rid, prompt):
        self.ctx = list(prompt)
        self.plen = len(prompt)

    def extend(self, rid, tokens):
        self.received.append(list(tokens))
        self.ctx.extend(int(t) for t in tokens)

    def propose(self, rid, k):
        pos = len(self.ctx) - self.plen
        d = list(self.output[pos : pos + k])
        w = self.wrong_at(self.step)
        if w is not None and w < len(d):
            d[w] = -7
        self.step += 1
        return np.array(d, dtype=np.int32)

    def finish(self, rid):
        pass


def test_replay_bookkeeping_against_brute_force():
    out = rng.integers(0, 50, size=301).astype(np.int32)
    req = drafters.data.Request("t", "t", np.arange(5, dtype=np.int32), out)
    wrong = lambda s: (s * 7) % 11 if s % 3 else None  # noqa: E731
    d = ScriptedDrafter(out, wrong)
    trace = []
    st = drafters.replay(d, [req], 8, tree=False, trace=trace)
    # the drafter received exactly the output, in order, and each step emitted accepted + 1 (capped at the end)
    assert sum(d.received, []) == out.tolist()
    assert st.tokens == len(out) and st.steps == len(trace) == len(d.received)
    # brute-force recount of every step from the recorded drafts
    total = 0
    for pos, draft, acc in trace:
        truth = out[pos : pos + 8]
        b = _brute_chain(draft, truth)
        assert acc == b
        total += b
    assert st.accepted == total
    # the scripted errors bound each step: wrong index w -> exactly w accepted when w < draft length
    for s, (pos, draft, acc) in enumerate(trace):
        w = wrong(s)
        assert acc == (w if w is not None and w < len(draft) else len(draft))


def _repeated_request(n=200):
    """A real-ish text seen twice in the prompt, then a third time as the output: a perfect copy task."""
    text = rng.integers(0, 5000, size=n).astype(np.int32)
    return drafters.data.Request("rep", "rep", np.concatenate([text, text]), text.copy())


def test_ours_drafts_repeated_text_in_full():
    req = _repeated_request()
    for k in (1, 4, 8):
        trace = []
        st = drafters.replay(anchors.OursAdapter(), [req], k, tree=False, trace=trace)
        n = len(req.output)
        for pos, draft, acc in trace:
            assert acc == min(k, n - pos), (k, pos, draft)
        assert st.accepted == sum(min(k, n - p) for p, _, _ in trace)
        assert st.tokens == n
        # trees of k nodes contain the chain
        st_tree = drafters.replay(anchors.OursAdapter(), [req], k, tree=True)
        assert st_tree.tokens == n and st_tree.mean >= st.mean - 1e-9


def test_ours_batch_step_equals_single_steps():
    reqs = [_repeated_request(120) for _ in range(3)]
    a, b = anchors.OursAdapter(), anchors.OursAdapter()
    for i, r in enumerate(reqs):
        a.start(i, r.prompt)
        b.start(i, r.prompt)
    new = [r.output[:3] for r in reqs]
    batched = a.batch_step([0, 1, 2], new, 8)
    single = []
    for i in range(3):
        b.extend(i, new[i])
        single.append(b.propose(i, 8))
    assert len(batched) == 3
    for x, y in zip(batched, single):
        # batched rows are the [B, k] array: the valid prefix, then -1 padding
        assert x[: len(y)].tolist() == y.tolist() and (x[len(y):] == -1).all()
    assert a.memory_bytes() > 0


def test_sglang_mask_to_parents():
    # root 0; 1 and 2 children of root; 3 child of 1; 4 child of 3
    toks = np.array([9, 1, 2, 3, 4])
    m = np.zeros((5, 5), dtype=np.int64)
    anc = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 3, 4]}
    for i, js in anc.items():
        m[i, js] = 1
    t, p = anchors.sglang_tree_from_mask(toks, m.ravel())
    assert t.tolist() == [1, 2, 3, 4]
    assert p.tolist() == [-1, -1, 0, 2]


@pytest.mark.parametrize("name", ["vllm-ngram", "arctic"])
def test_anchor_adapters_copy_repeated_text(name):
    mod = {"vllm-ngram": "vllm", "arctic": "arctic_inference"}[name]
    if importlib.util.find_spec(mod) is None:
        pytest.skip(f"{mod} not installed (optional anchor)")
    why = anchors.probe(name)
    if why is not None:
        pytest.skip(f"{name} not usable here: {why}")
    req = _repeated_request()
    make = {"vllm-ngram": lambda: anchors.VllmNgramAdapter(k=8, max_model_len=4096),
            "arctic": lambda: anchors.ArcticAdapter()}[name]
    trace = []
    st = drafters.replay(make(), [req], 8, tree=False, trace=trace)
    n = len(req.output)
    assert st.tokens == n
    # Once a long enough match exists both copy the repeat in full (vLLM needs a 5-gram, Arctic's draft length is
    # capped by its match length): all steps after the first few accept min(8, remaining).
    late = [(p, acc) for p, _, acc in trace if p >= 16]
    assert late and all(acc == min(8, n - p) for p, acc in late)


def test_targets_evaluation_uses_the_numbers():
    res = {"acceptance": {"code": {"ours": {"k8": 7.0}, "arctic": {"k8": 6.5}},
                          "chat": {"ours": {"k8": 0.3, "tree8": 0.5}, "arctic": {"k8": 0.4},
                                   "sglang": {"tree8": 0.45}}},
           "latency": {"ours": {1024: {"step_us": 5.0}, 32768: {"step_us": 6.0}},
                       "arctic": {32768: {"step_us": 31.0}}},
           "batch": {"ours": {"median_ms": 0.2}, "vllm-ngram": {"median_ms": 5.0}, "arctic": {"median_ms": 3.0}},
           "build": {"ours": {"build_ms": 3.0}, "arctic": {"build_ms": 10.0}},
           "memory": {"ours": {"bytes_per_token": 150.0, "method": "m"},
                      "ours-corpus": {"bytes_per_token": 210.0, "method": "m"}},
           "meta": {"batch": 128, "batch_ctx": 32768}}
    res["acceptance"]["chat"]["ours[resp-only]"] = {"k8": 0.25, "tree8": 0.5}
    res["acceptance"]["code"]["ours[resp-only]"] = {"k8": 7.1}
    got = {t: met for t, met, _ in drafters.targets(res)}
    assert got["k=8 chain acceptance on code editing above every anchor"] is True
    assert got["k=8 chain acceptance on prose above every anchor"] is False
    assert got["8-node tree acceptance on prose above every anchor"] is True  # ours[...] is not an anchor
    assert got["prose acceptance with prompt donation above responses only"] is False  # tree8 ties
    assert got["code acceptance with prompt donation not lower than responses only"] is False
    assert got["propose+update at 32k <= 1/5 of Arctic's"] is True
    assert got["batch step 128 x 32k <= 0.4 ms"] is True
    assert got["batch step >= 12x faster than the faster of vLLM and Arctic"] is True  # 3.0 / 0.2 = 15x
    assert got["32k prompt build <= 1/4 of Arctic's"] is False
    assert got["memory <= 200 B per context token"] is True
    assert got["memory <= 200 B per token of the shared corpus (donated prompts + responses, default cap)"] is False
    res["batch"] = {"ours": {"median_ms": 0.5}}
    got = {t: (met, nums) for t, met, nums in drafters.targets(res)}
    assert got["batch step 128 x 32k <= 0.4 ms"][0] is False
    assert got["batch step >= 12x faster than the faster of vLLM and Arctic"] == (
        None, "NOT RUN: neither vllm-ngram nor arctic ran")


def test_sharegpt_parsing_and_tokenizer():
    reqs = drafters.data.chat_requests(2, seed=0, scan=200)
    assert len(reqs) == 2
    for r in reqs:
        assert r.prompt.dtype == np.int32 and r.output.dtype == np.int32
        assert len(r.output) >= 64 and len(r.prompt) > 0
    text = "def f(x):\n    return x + 1\n"
    ids = drafters.data.encode(text)
    assert drafters.data.tokenizer().decode(ids.tolist()) == text
