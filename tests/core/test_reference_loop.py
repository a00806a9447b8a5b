"""CPU reference loop on a tiny random Llama: every mode is lossless (greedy: token for token; sampling: same
distribution), traces follow the documented format and agree with what the loop drafted."""

import collections

import pytest
import torch

from sglang_hybrid.cost import CostModel
from sglang_hybrid.reference import eagle, trace
from sglang_hybrid.reference.loop import MODES, ReferenceLoop, plain_greedy
from sglang_hybrid.reference.models import tiny_target

torch.set_num_threads(1)
COST = CostModel.linear(0.01, 0.0005)  # fixed synthetic cost: tests must not depend on timing


@pytest.fixture(scope="module")
def pair():
    lm = tiny_target(0)
    return lm.model, eagle.new_head(lm.model.config, seed=1)


def _prompts(n_tokens=(5, 9, 1, 14, 30), vocab=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in n_tokens]
    out[-1] = out[-1][:10] * 3  # a repetitive prompt: the n-gram drafter gets long matches
    return out


@pytest.mark.parametrize("mode", MODES)
def test_greedy_equals_plain_decoding(pair, mode):
    model, head = pair
    prompts = _prompts()
    ref = [plain_greedy(model, p, 40, eos_token_id=-1) for p in prompts]
    loop = ReferenceLoop(model, mode=mode, head=head, cost=COST, eos_token_id=-1, n_nodes=10)
    res = loop.generate(prompts, 40)
    for r, x in zip(res, ref):
        assert r.output == x
        assert r.finished_by == "length"
        assert sum(s.accepted + 1 for s in r.steps) >= len(r.output)
    if mode != "none":  # speculation actually happened somewhere (otherwise the test proves little)
        assert sum(s.accepted for r in res for s in r.steps) > 0
        assert sum(len(r.steps) for r in res) < sum(len(r.output) for r in res)


@pytest.mark.parametrize("mode", ["choose", "merge"])
def test_adaptive_drafting_is_lossless_and_changes_the_depth(pair, mode):
    """With a draft cost the HYBRID modes decide each step how deep the next EAGLE chain is (the core's rule, as in
    the SGLang worker): outputs stay equal to plain greedy decoding, and the chains drafted vary in depth, from the
    full eagle_k at the first step down to shallower ones where the (random) head's chain cannot pay for its
    forwards."""
    model, head = pair
    prompts = _prompts()
    ref = [plain_greedy(model, p, 40, eos_token_id=-1) for p in prompts]
    loop = ReferenceLoop(model, mode=mode, head=head, cost=COST, eos_token_id=-1, n_nodes=10, eagle_k=4,
                         draft_cost=CostModel.linear(0.004, 0.0005), draft_depths=(1, 2, 3, 4))
    assert loop.depths == (1, 2, 3, 4)                         # SGLang's (its floor is 1); skipping: see below
    assert ReferenceLoop(model, mode=mode, head=head, cost=COST, eagle_k=4,
                         draft_cost=CostModel.linear(0.004, 0.0005)).depths == (0, 1, 2, 3, 4)   # this loop can skip
    res = loop.generate(prompts, 40)
    assert [r.output for r in res] == ref
    drafted = collections.Counter(s.eagle_len for r in res for s in r.steps)
    assert max(drafted) <= 4 and any(d < 4 for d in drafted if d > 0), drafted
    with pytest.raises(ValueError, match="draft_depths needs draft_cost"):
        ReferenceLoop(model, mode=mode, head=head, cost=COST, draft_depths=(1, 2))
    with pytest.raises(ValueError, match="model_bias_eta must be a learning rate > 0 or None"):
        ReferenceLoop(model, mode=mode, head=head, cost=COST, model_bias_eta=0.0)
    assert ReferenceLoop(model, mode=mode, head=head, cost=COST).model_bias_eta == 0.1
    assert ReferenceLoop(model, mode="eagle", head=head, cost=COST).model_bias_eta is None   # unpriced baseline
    with pytest.raises(ValueError, match=r"draft_depths must be in \[0, eagle_k=4\]"):
        ReferenceLoop(model, mode=mode, head=head, cost=COST, eagle_k=4, draft_depths=(1, 5),
                      draft_cost=CostModel.linear(0.004, 0.0005))


def test_ngram_offset_is_lossless_and_moves_the_n_gram_price(pair):
    """``ngram_bias_eta``: each request's n-gram offset starts at 0 (the first step prices as without it) and is
    learned from its own n-gram tree's outcome (``request_bias.tree_outcome``), so later steps price differently;
    greedy output stays equal to plain decoding, and a bad rate names the setting."""
    model, head = pair
    prompts = _prompts()
    ref = [plain_greedy(model, p, 40, eos_token_id=-1) for p in prompts]
    runs = {}
    for eta in (None, 2.0):
        loop = ReferenceLoop(model, mode="merge", head=head, cost=COST, eos_token_id=-1, n_nodes=10,
                             ngram_bias_eta=eta)
        assert loop.ngram_bias_eta == eta
        runs[eta] = loop.generate(prompts, 40)
        assert [r.output for r in runs[eta]] == ref
    # sigmoid(logit(a) + 0) rounds to within 1e-6 of a
    for off, on in zip(runs[None], runs[2.0]):
        assert on.steps[0].n_nodes == off.steps[0].n_nodes
        assert on.steps[0].expected == pytest.approx(off.steps[0].expected, rel=1e-5)
    expected = {eta: [s.expected for r in res for s in r.steps] for eta, res in runs.items()}
    assert len(expected[None]) != len(expected[2.0]) or expected[None] != pytest.approx(expected[2.0], rel=1e-3)
    with pytest.raises(ValueError, match="ngram_bias_eta must be a learning rate > 0 or None"):
        ReferenceLoop(model, mode="merge", head=head, cost=COST, ngram_bias_eta=-1.0)
    assert ReferenceLoop(model, mode="ngram", cost=COST, ngram_bias_eta=0.3).ngram_bias_eta is None  # unpriced


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_skipping_the_model_draft_is_lossless(pair, temperature):
    """Depth 0: when a model chain cannot pay for its draft forwards (the random head, drafting priced at a third of
    a verify forward) the loop skips the EAGLE draft, and those steps verify n-gram drafts or the root alone. Greedy
    output stays equal to plain decoding; sampled output to the same run without adaptive drafting (the seed fixes
    the uniforms, and skipping changes only the proposals, which exact verification makes irrelevant to the
    distribution, not to the draws: so this checks determinism and validity, the distribution tests cover the
    rest)."""
    model, head = pair
    prompts = _prompts()
    loop = ReferenceLoop(model, mode="merge", head=head, cost=COST, eos_token_id=-1, n_nodes=10, eagle_k=4,
                         temperature=temperature, draft_cost=CostModel.linear(0.004, 0.0), draft_depths=(0, 1, 2, 4))
    assert loop.depths == (0, 1, 2, 4)
    res = loop.generate(prompts, 40)
    steps = [s for r in res for s in r.steps]
    skipped = [s for s in steps if s.eagle_len == 0]
    assert skipped and len(skipped) < len(steps), collections.Counter(s.eagle_len for s in steps)
    assert all(s.source in ("none", "ngram") for s in skipped)
    if temperature == 0.0:
        assert [r.output for r in res] == [plain_greedy(model, p, 40, eos_token_id=-1) for p in prompts]
    else:
        assert [r.output for r in res] == [r.output for r in loop.generate(prompts, 40)]
        assert all(len(r.output) == 40 for r in res)


def test_eos_stops_and_is_emitted(pair):
    model, head = pair
    p = _prompts()[0]
    ref = plain_greedy(model, p, 40, eos_token_id=-1)
    eos = ref[7]
    res = ReferenceLoop(model, mode="merge", head=head, cost=COST, eos_token_id=eos).generate([p], 40)[0]
    assert res.output == ref[:ref.index(eos) + 1] and res.finished_by == "eos"


def _joint_counts(results, n):
    return collections.Counter(tuple(r.output[:n]) for r in results)


def _exact_joint(model, prompt, temperature):
    """Exact distribution of the first two sampled tokens: p(x1) p(x2 | x1)."""
    with torch.no_grad():
        p1 = (model(torch.tensor([prompt])).logits[0, -1] / temperature).softmax(-1)
        V = p1.shape[0]
        seqs = torch.tensor([prompt + [v] for v in range(V)])
        p2 = (model(seqs).logits[:, -1] / temperature).softmax(-1)
    return {(a, b): float(p1[a] * p2[a, b]) for a in range(V) for b in range(V)}


@pytest.mark.parametrize("mode", ["eagle", "merge"])
def test_sampling_keeps_the_target_distribution(mode):
    """Chi-square goodness of fit of the first two sampled tokens against the exact joint distribution, with 1500
    independent requests; reject at p < 1e-3 (cells with expected count < 5 pooled). A positive control shows the
    test rejects a slightly wrong sampler (temperature 0.8 instead of 1.0)."""
    from scipy.stats import chisquare

    lm = tiny_target(2, vocab_size=12, hidden_size=32)
    model = lm.model
    head = eagle.new_head(model.config, seed=2)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    N = 1500
    loop = ReferenceLoop(model, mode=mode, head=head, cost=COST, temperature=1.0, seed=11, eos_token_id=-1,
                         eagle_k=3, n_nodes=6)
    res = loop.generate([prompt] * N, 2)
    assert sum(s.accepted for r in res for s in r.steps) > 50  # drafts were accepted (and others rejected)
    counts = _joint_counts(res, 2)
    exact = _exact_joint(model, prompt, 1.0)

    def pvalue(exact):
        keys = sorted(exact, key=lambda k: -exact[k])
        obs, exp, rest_o, rest_e = [], [], 0, 0.0
        for k in keys:
            e = exact[k] * N
            if e >= 5:
                obs.append(counts.get(k, 0))
                exp.append(e)
            else:
                rest_o += counts.get(k, 0)
                rest_e += e
        obs.append(rest_o)
        exp.append(rest_e)
        exp = [e * N / sum(exp) for e in exp]  # float rounding of the exact probabilities
        return chisquare(obs, exp).pvalue

    assert pvalue(exact) > 1e-3
    assert pvalue(_exact_joint(model, prompt, 0.8)) < 1e-3  # positive control: the test has power


def test_trace_rows_match_the_loop_drafts_and_round_trip(pair, tmp_path):
    model, head = pair
    prompts = _prompts()[:3]
    k = 5
    res = ReferenceLoop(model, mode="eagle", head=head, cost=COST, eagle_k=k, eos_token_id=-1).generate(prompts, 25)
    recs = trace.records_from_results(model, head, res, k)
    for r, rec in zip(res, recs):
        assert rec.output == r.output and len(rec.eagle_tokens) == len(r.output)
        pos = 0
        for s in r.steps:  # at every step boundary the loop drafted exactly the trace row for that position
            if s.eagle_draft and pos < len(rec.eagle_tokens):
                assert rec.eagle_tokens[pos][:len(s.eagle_draft)] == s.eagle_draft
            pos += s.accepted + 1
    hdr = trace.TraceHeader(model="tiny", draft_model="tiny-head", temperature=0.0, eagle_k=k)
    path = trace.write_trace(tmp_path / "t.jsonl", hdr, recs)
    h2, recs2 = trace.read_trace(path)
    assert h2.to_json() == hdr.to_json()
    assert [r.to_json() for r in recs2] == [r.to_json() for r in recs]


def test_trace_reader_rejects_malformed_files(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"format": "other", "version": 1}\n')
    with pytest.raises(trace.TraceFormatError, match="format"):
        trace.read_trace(p)
    hdr = trace.TraceHeader(model="m", draft_model="d", temperature=0.0, eagle_k=2)
    rec = trace.TraceRecord("a", "code", [1, 2], [3, 4], [[3, 4]], [[0.5, 0.5]])
    with pytest.raises(trace.TraceFormatError, match="one row per output position"):
        trace.write_trace(tmp_path / "x.jsonl", hdr, [rec])
    rec = trace.TraceRecord("a", "code", [1, 2], [3], [[3, 4]], [[0.5, 1.5]])
    with pytest.raises(trace.TraceFormatError, match=r"\[0, 1\]"):
        trace.write_trace(tmp_path / "x.jsonl", hdr, [rec])


def test_trace_alternatives_are_each_forwards_next_ranks_and_round_trip(pair, tmp_path):
    """``eagle_rows(..., alternatives=M)``: the chains are those recorded without alternatives, and at chain position 0
    of every row the M alternatives are ranks 2 to M + 1 of the head's distribution after the loop's own drafter
    extends the committed prefix pair by pair (an independent path: `EagleDrafter.extend`, not the teacher-forced
    pass), the chain's token excluded; at every position they are distinct, never the chain token, ordered and below
    it. The file round-trips them, and the reader refuses them misshapen or without the header's count."""
    from sglang_hybrid.reference.drafters import EagleDrafter

    model, head = pair
    prompt, output, k, m = _prompts()[3], _prompts(seed=4)[4][:20], 4, 3
    chain_t, chain_p = trace.eagle_rows(model, head, prompt, output, k)
    toks, probs, alt_t, alt_p = trace.eagle_rows(model, head, prompt, output, k, alternatives=m)
    assert toks == chain_t and probs == chain_p
    tokens = torch.tensor(prompt + output)
    feats = model.model(input_ids=tokens[None]).last_hidden_state[0]
    for pos in range(len(output)):
        n = len(prompt) + pos
        dr = EagleDrafter(head, model)
        dr.start(0)
        dr.extend(0, feats[:n - 1], tokens[1:n])
        dist = torch.nn.functional.linear(dr.states[0].g_last, dr.lm_w).float().softmax(-1)
        order = [t for t in dist.argsort(descending=True).tolist() if t != toks[pos][0]][:m]
        assert alt_t[pos][0] == order
        assert alt_p[pos][0] == pytest.approx(dist[order].tolist(), abs=2e-6)
        for j in range(k):
            assert len(set(alt_t[pos][j])) == m and toks[pos][j] not in alt_t[pos][j]
            assert alt_p[pos][j] == sorted(alt_p[pos][j], reverse=True) and max(alt_p[pos][j]) <= probs[pos][j]
    rec = trace.TraceRecord("r", "code", prompt, output, toks, probs, eagle_alt_tokens=alt_t, eagle_alt_probs=alt_p)
    hdr = trace.TraceHeader(model="tiny", draft_model="tiny-head", temperature=0.0, eagle_k=k, eagle_alternatives=m)
    h2, (rec2,) = trace.read_trace(trace.write_trace(tmp_path / "t.jsonl", hdr, [rec]))
    assert h2.eagle_alternatives == m and rec2.to_json() == rec.to_json()
    with pytest.raises(trace.TraceFormatError, match=r"eagle_alt_tokens.*\[eagle_alternatives=2\]"):
        trace.write_trace(tmp_path / "x.jsonl", trace.TraceHeader("t", "h", 0.0, k, eagle_alternatives=2), [rec])
    with pytest.raises(trace.TraceFormatError, match="eagle_alternatives is 0"):
        trace.write_trace(tmp_path / "x.jsonl", trace.TraceHeader("t", "h", 0.0, k), [rec])
    bad = trace.TraceRecord("r", "code", prompt, output, toks, probs, eagle_alt_tokens=alt_t,
                            eagle_alt_probs=[[[1.5] * m] * k] * len(output))
    with pytest.raises(trace.TraceFormatError, match=r"eagle_alt_probs row 0 .*\[0, 1\]"):
        trace.write_trace(tmp_path / "x.jsonl", hdr, [bad])


def test_bad_arguments_raise_clear_errors(pair):
    model, head = pair
    with pytest.raises(ValueError, match="mode"):
        ReferenceLoop(model, mode="fast")
    with pytest.raises(ValueError, match="EAGLE head"):
        ReferenceLoop(model, mode="eagle", head=None)
    with pytest.raises(ValueError, match="temperature"):
        ReferenceLoop(model, mode="none", temperature=-1.0)
    loop = ReferenceLoop(model, mode="none", cost=COST)
    with pytest.raises(ValueError, match="at least one token"):
        loop.generate([[]], 4)
    with pytest.raises(ValueError, match="token ids"):
        loop.generate([[1, 10_000]], 4)
