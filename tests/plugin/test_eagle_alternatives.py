"""The EAGLE side's alternatives in the worker (``sglang_plugin.alternatives``, setting ``eagle_alternatives``): the
top tokens each draft forward yields, the chain's own taken out, position 0 kept per request slot across batch
changes, what the counters report of them, and the settings that size the tree. Against brute force on random data;
the live engine runs them in ``tests/live/test_sglang_live.py``."""
from __future__ import annotations

import pytest
import torch

from sglang_hybrid.selector import Candidates, Source, select
from sglang_hybrid.sglang_plugin import alternatives as alt
from sglang_hybrid.sglang_plugin.config import HybridConfigError, HybridSettings, load_settings


def test_top_tokens_are_the_distributions_ranks_through_the_hot_map():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn((5, 40), generator=g), -1)
    p, i = alt.top_tokens(probs, 3)
    for r in range(5):
        order = sorted(range(40), key=lambda t: -float(probs[r, t]))[:4]
        assert i[r].tolist() == order
        assert torch.allclose(p[r], probs[r, order])
    hot = torch.randperm(40, generator=g) + 1000                   # a reduced vocabulary's map to target ids
    _, mapped = alt.top_tokens(probs, 3, hot)
    assert torch.equal(mapped, hot[i])


def test_exclude_chain_keeps_m_distinct_tokens_in_rank_order():
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        b, s, m = 3, 4, int(torch.randint(1, 5, (1,), generator=g))
        top_i = torch.stack([torch.stack([torch.randperm(12, generator=g)[:m + 1] for _ in range(s)])
                             for _ in range(b)])
        top_p = torch.sort(torch.rand((b, s, m + 1), generator=g), -1, descending=True).values
        # the chain's token is the first rank, another rank (a tie broken the other way) or absent
        pick = torch.randint(0, m + 2, (b, s), generator=g)
        chain = torch.where(pick <= m, top_i.gather(-1, pick.clamp(max=m)[:, :, None])[:, :, 0], 99)
        tokens, probs = alt.exclude_chain(top_p, top_i, chain, m)
        for r in range(b):
            for j in range(s):
                want = [k for k in range(m + 1) if int(top_i[r, j, k]) != int(chain[r, j])][:m]
                assert tokens[r, j].tolist() == top_i[r, j, want].tolist()
                assert probs[r, j].tolist() == top_p[r, j, want].tolist()
                assert int(chain[r, j]) not in tokens[r, j].tolist()


def test_first_alternatives_belong_to_their_request_only():
    first = alt.FirstAlternatives(pool_size=6, m=2, device="cpu")
    p = torch.tensor([[0.5, 0.2, 0.1], [0.6, 0.3, 0.05]])
    t = torch.tensor([[7, 8, 9], [4, 5, 6]])
    first.record(torch.tensor([4, 1]), torch.tensor([3, 0]), p, t)
    # a later batch: slot 1 still holds generation 0's request, slot 4 a new request (generation 4), slot 2 none
    probs, tokens = first.read(torch.tensor([1, 4, 2]), torch.tensor([0, 4, 0]))
    assert torch.equal(tokens[0], t[1]) and torch.equal(probs[0], p[1])
    assert torch.equal(probs[1], torch.zeros(3)) and torch.equal(probs[2], torch.zeros(3))
    # step_alternatives: position 0 from the table, later positions from the draft's records
    rec_p = torch.rand((3, 3, 3))
    rec_i = torch.tensor([[[1, 2, 3]] * 3] * 3)
    chain = torch.tensor([[4, 2, 3], [7, 1, 9], [0, 0, 0]])
    tokens, probs = alt.step_alternatives(first, torch.tensor([1, 4, 2]), torch.tensor([0, 4, 0]), rec_p, rec_i,
                                          chain)
    assert tokens.shape == probs.shape == (3, 3, 2)
    assert tokens[0, 0].tolist() == [5, 6] and probs[0, 0].tolist() == pytest.approx([0.3, 0.05])
    assert tokens[0, 1].tolist() == [1, 3] and tokens[0, 2].tolist() == [1, 2]       # the chain's token taken out
    assert probs[1, 0].tolist() == [0.0, 0.0]                                           # another request's: none


def test_hybrid_step_keeps_position_0_alternatives_and_drops_them_where_the_extend_did_not_match():
    """``HybridStep.keep_first_alternatives`` / ``step_alternatives``, the worker's two calls, on the torch path (the
    fused one runs the kernels ``bench/fused_exactness.py`` compares with it, and
    ``tests/kernels/test_fused_decision.py`` runs these two calls under the interpreter with no host read or
    allocation): position 0's alternatives are ranks 2 and 3 of the draft extend's distribution where the chain took the
    argmax; an extend that did not match the batch (None) drops them (read as probability 0, never stale); with the
    setting off, none."""
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    kernels = "torch"
    st = HybridStep(HybridSettings(mode="merge", ngram_k=4, eagle_alternatives=2, decision_kernels=kernels,
                                   log_interval=0), num_steps=3, pool_size=6, device="cpu", max_context_len=64)
    assert st.fused is None
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn((2, 30), generator=g), -1)
    slots, gens = torch.tensor([4, 1]), torch.tensor([3, 0])
    chain = torch.stack([probs.argmax(-1), torch.tensor([5, 6]), torch.tensor([7, 8])], 1)
    rec_p = torch.sort(torch.rand((2, 3, 3), generator=g), -1, descending=True).values
    rec_i = torch.tensor([[[9, 10, 11]] * 3] * 2)
    st.keep_first_alternatives(slots, gens, probs)
    tokens, conf = st.step_alternatives(slots, gens, rec_p, rec_i, chain)
    ranks = probs.topk(3, -1).indices[:, 1:]
    assert torch.equal(tokens[:, 0], ranks) and torch.allclose(conf[:, 0], probs.gather(-1, ranks))
    assert tokens[:, 1:].tolist() == [[[9, 10]] * 2] * 2                  # later positions: the draft's records
    st.keep_first_alternatives(slots, gens, None)
    _, conf = st.step_alternatives(slots, gens, rec_p, rec_i, chain)
    assert torch.equal(conf[:, 0], torch.zeros((2, 2))) and torch.equal(conf[:, 1:], rec_p[:, 1:, :2])
    off = HybridStep(HybridSettings(mode="merge", ngram_k=4, decision_kernels=kernels, log_interval=0), num_steps=3,
                     pool_size=6, device="cpu", max_context_len=64)
    off.keep_first_alternatives(slots, gens, probs)
    assert off.first_alternatives is None and off.step_alternatives(slots, gens, None, None, chain) == (None, None)


def test_alternatives_outcome_counts_verified_leaves_and_paths_through_them():
    """A merged tree: the chain [5, 6, 7], a leaf 9 beside 6 and a leaf 4 beside 5, an n-gram branch [5, 8] (its 8 is
    not an alternative); requests whose accepted path left the chain through the leaf 9, through the n-gram's 8,
    along the chain, and one whose bonus token (not a draft) is 9 after the chain's first token."""
    chain = torch.tensor([[5, 6, 7]] * 4)
    leaves = Candidates(torch.tensor([[5, 6, 7, 9, 4]] * 4), torch.tensor([[-1, 0, 1, 0, -1]] * 4),
                        torch.tensor([[0.9, 0.8, 0.7, 0.5, 0.05]] * 4), torch.full((4,), 5), Source.MODEL)
    ngram = Candidates.chain(torch.tensor([[5, 8]] * 4), torch.tensor([[0.9, 0.6]] * 4), torch.full((4,), 2),
                             Source.NGRAM)
    tree = select(torch.zeros(4, dtype=torch.int64), [leaves, ngram], 0.0, mode="merge", n_nodes=8)
    emitted = torch.tensor([[5, 9, 1, 0], [5, 8, 2, 0], [5, 6, 7, 3], [5, 9, 0, 0]])
    accept = torch.tensor([3, 3, 4, 2])        # drafts accepted + the bonus
    nodes, taken = alt.alternatives_outcome(tree, chain, emitted, accept)
    assert int(nodes) == 4 * 2                 # 9 and 4 in every row; 8 is the n-gram's, 5, 6, 7 the chain's
    assert int(taken) == 1                     # row 0 went through the leaf 9; row 3's 9 was the bonus


def test_the_alternatives_compete_for_the_chains_nodes_and_do_not_widen_the_tree():
    assert HybridSettings().eagle_alternatives == 0
    for mode in ("merge", "choose"):
        assert HybridSettings(mode=mode, eagle_alternatives=3).resolved_n_nodes(4) == \
            HybridSettings(mode=mode).resolved_n_nodes(4)
    assert HybridSettings(eagle_alternatives=3).resolved_n_nodes(4) == 4 + 8
    assert HybridSettings(mode="choose", eagle_alternatives=3).resolved_n_nodes(4) == 8
    assert HybridSettings(n_nodes=20, eagle_alternatives=3).resolved_n_nodes(4) == 20
    for bad in (-1, 8, "3", 1.0, True):
        with pytest.raises(Exception):
            HybridSettings(eagle_alternatives=bad)


def test_settings_from_the_environment_name_the_setting(monkeypatch):
    monkeypatch.setenv("SGLANG_HYBRID_EAGLE_ALTERNATIVES", "9")
    with pytest.raises(HybridConfigError, match="eagle_alternatives"):
        load_settings()
    monkeypatch.setenv("SGLANG_HYBRID_EAGLE_ALTERNATIVES", "2")
    assert load_settings().eagle_alternatives == 2
