"""Graph safety: every per-step function traces as ONE graph (``torch.compile(fullgraph=True)``: no graph break, no
``.item()``/host sync, no data-dependent Python control flow) and the compiled result equals eager.

Compilation is slow on the 2-core CI machine, so the per-function checks use the ``aot_eager`` backend (full Dynamo +
AOTAutograd tracing with fake tensors -- exactly where host syncs and data-dependent shapes are caught -- without C++
code generation), and one small end-to-end check uses ``inductor`` for real generated kernels.
"""
import numpy as np
import pytest
import torch

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.calibration_records import NgramRecords
from sglang_hybrid.cost import CostModel
from sglang_hybrid.price import price_device
from sglang_hybrid.selector import Candidates, Source, select
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_survival, tree_survival
from sglang_hybrid.verify import greedy_accept, sample_accept

torch.set_num_threads(1)
B, KM, KN, N_NODES, VOCAB = 4, 5, 6, 8, 32


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    n = 4000
    rec = NgramRecords(rng.integers(0, 30, n), rng.integers(1, 5, n), rng.integers(5, 9, n), rng.integers(1, 9, n),
                       rng.integers(0, 2, n), rng.integers(0, 2, n))
    ngram_cal = NgramCalibration.fit(rec).to()
    model_cal = ModelCalibration(np.linspace(0.8, 1.6, 8)).to()
    cost = CostModel([1, 8, 32, 128], [1.0, 1.05, 1.4, 3.0]).to()
    # n-gram tree: node i has parent i//2 - 1 -> a binary tree in topological order
    par = (torch.arange(KN) // 2 - 1).expand(B, KN).contiguous()
    feats = dict(match_len=torch.randint(0, 40, (B, KN), generator=g), count=torch.randint(1, 4, (B, KN), generator=g),
                 total=torch.randint(4, 8, (B, KN), generator=g), depth=torch.randint(1, 5, (B, KN), generator=g),
                 source=torch.randint(0, 2, (B, KN), generator=g))
    model_tokens = torch.randint(0, VOCAB, (B, KM), generator=g)
    ngram_tokens = torch.randint(0, VOCAB, (B, KN), generator=g)
    ngram_tokens[:, 0] = model_tokens[:, 0]          # something to merge
    return dict(ngram_cal=ngram_cal, model_cal=model_cal, cost=cost, feats=feats, par=par,
                prob=torch.rand((B, KM), generator=g), mdepth=torch.arange(1, KM + 1).expand(B, KM).contiguous(),
                model_tokens=model_tokens, ngram_tokens=ngram_tokens,
                model_len=torch.tensor([KM, 3, 0, 2]), ngram_len=torch.tensor([KN, 2, 4, 0]),
                root=torch.randint(0, VOCAB, (B,), generator=g),
                logits=torch.randn((B, N_NODES + 1, VOCAB), generator=g),
                uniforms=torch.rand((B, N_NODES + 1), generator=g), temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]))


def drafts(x):
    model = ModelDraft(x["model_tokens"], x["prob"], x["model_len"])
    ngram = NgramDraft(x["ngram_tokens"], x["par"], x["ngram_len"], tree=True, **x["feats"])
    return model, ngram


def candidates(m_tok, s_m, m_len, n_tok, n_par, s_ng, n_len):
    return [Candidates.chain(m_tok, s_m, m_len, Source.MODEL), Candidates(n_tok, n_par, s_ng, n_len, Source.NGRAM)]


def step(x, mode):
    """One decode step of the hybrid core, as an engine runs it: the core's DecisionStep, then both verify rules."""
    decide = DecisionStep(mode=mode, n_nodes=N_NODES, model_calibration=x["model_cal"],
                          ngram_calibration=x["ngram_cal"])
    d = decide(x["root"], *drafts(x), cost=x["cost"], batch=B)
    g = greedy_accept(d.tree, x["logits"])
    s = sample_accept(d.tree, x["logits"], x["temperature"], x["uniforms"])
    return (d.model_survival, d.ngram_survival, d.b_star, d.lam) + tuple(d.tree) + tuple(g) + tuple(s)


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        if x.is_floating_point():
            assert torch.allclose(x, y, atol=1e-6), i
        else:
            assert torch.equal(x, y), i


def compiled(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)


@pytest.mark.parametrize("mode", ["choose", "merge"])
def test_each_per_step_function_is_one_graph(inputs, mode):
    x = inputs
    a_ng = x["ngram_cal"].acceptance(**x["feats"])
    s_ng = tree_survival(a_ng, x["par"], x["ngram_len"])
    s_m = chain_survival(x["model_cal"].acceptance(x["prob"], x["mdepth"]), x["model_len"])
    lam = price_device(torch.cat([s_m, s_ng], 1), B, x["cost"])[1]
    tree = select(x["root"], candidates(x["model_tokens"], s_m, x["model_len"], x["ngram_tokens"], x["par"], s_ng,
                                        x["ngram_len"]), lam, mode=mode, n_nodes=N_NODES)
    cases = [
        (lambda f: x["ngram_cal"].acceptance(**f), (x["feats"],)),
        (lambda p, d: x["model_cal"].acceptance(p, d), (x["prob"], x["mdepth"])),
        (chain_survival, (s_m, x["model_len"])),
        (tree_survival, (a_ng, x["par"], x["ngram_len"])),
        (lambda s: price_device(s, B, x["cost"]), (torch.cat([s_m, s_ng], 1),)),
        (lambda root, lam_, *a: select(root, candidates(*a), lam_, mode=mode, n_nodes=N_NODES),
         (x["root"], lam, x["model_tokens"], s_m, x["model_len"], x["ngram_tokens"], x["par"], s_ng, x["ngram_len"])),
        (greedy_accept, (tree, x["logits"])),
        (sample_accept, (tree, x["logits"], x["temperature"], x["uniforms"])),
    ]
    for fn, args in cases:
        want = fn(*args)
        got = compiled(fn, "aot_eager")(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert_same(got, want)


def test_whole_step_compiles_with_inductor(inputs):
    """The full step (acceptance -> survival -> price -> merge -> both verify rules) through inductor."""
    want = step(inputs, "merge")
    got = compiled(lambda: step(inputs, "merge"), "inductor")()
    assert_same(got, want)


def test_eagle_alternatives_path_is_one_graph(inputs):
    """The worker's EAGLE alternatives on the torch path (setting ``eagle_alternatives``): the position-0 table's
    update and read, the step's alternatives, a padded decision with them as leaves, and their counters after verify,
    each one graph equal to eager."""
    from sglang_hybrid.sglang_plugin import alternatives as alt

    x = inputs
    m, pool = 2, 8
    g = torch.Generator().manual_seed(1)
    slots, gens = torch.tensor([5, 1, 6, 2]), torch.tensor([0, 3, 0, 1])
    chain = x["model_tokens"]
    rec_p = torch.sort(torch.rand((B, KM, m + 1), generator=g), -1, descending=True).values
    rec_i = torch.stack([torch.randperm(VOCAB, generator=g)[:m + 1] for _ in range(B * KM)]).reshape(B, KM, m + 1)
    logits = torch.randn((B, VOCAB), generator=g)
    decide = DecisionStep(mode="merge", n_nodes=N_NODES + KM * m, model_calibration=x["model_cal"],
                          ngram_calibration=x["ngram_cal"], widths=[4, N_NODES + KM * m + 1])
    _, ngram = drafts(x)
    ngram = ngram._replace(parents=torch.arange(-1, KN - 1).expand(B, KN).contiguous(), tree=False)

    def run(first_p, first_i, first_g):
        first = alt.FirstAlternatives(pool, m, "cpu")
        first.probs, first.tokens, first.gen = first_p.clone(), first_i.clone(), first_g.clone()
        first.record(slots, gens, *alt.top_tokens(torch.softmax(logits, -1), m))
        tokens, probs = alt.step_alternatives(first, slots, gens, rec_p, rec_i, chain)
        d = decide(x["root"], ModelDraft(chain, x["prob"], torch.full((B,), KM), tokens, probs), ngram,
                   cost=x["cost"], width=4)
        emitted = torch.cat([chain[:, :1], tokens[:, 1, :1], chain[:, 2:]], 1)
        nodes, taken = alt.alternatives_outcome(d.tree, chain, emitted, torch.full((B,), 3))
        return tuple(d.tree) + (tokens, probs, nodes, taken, first.probs, first.tokens, first.gen)

    empty = alt.FirstAlternatives(pool, m, "cpu")
    args = (empty.probs, empty.tokens, empty.gen)
    assert_same(compiled(run, "aot_eager")(*args), run(*args))
