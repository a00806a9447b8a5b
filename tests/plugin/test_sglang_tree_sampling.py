"""Tree speculative sampling through SGLang's real verify code (``eagle_utils.eagle_sample``) on HYBRID's trees.

On CPU SGLang 0.5.23 verifies greedily whatever the temperature and has no tree-sampling op, so the branch every
request with temperature > 0 takes on a GPU never ran with HYBRID's trees. Here ``sampling_verify_patches()`` lifts
``_verify_uses_greedy``'s CPU gate and installs the CPU stand-in op and renorms
(``sglang_hybrid/cpu_engine/tree_sampling.py``); the trees come from HYBRID's selector (EAGLE chain, n-gram chain,
merged trees with n-gram branches and folded shared prefixes) through HYBRID's verify-input builder. The Monte-Carlo
test checks that what one verify step emits follows the target distribution (temperature, top-k, top-p applied);
two broken variants of the op must fail the same check.
"""
from __future__ import annotations

import json
import types

import pytest
import torch

import scipy.stats as scipy_stats  # noqa: E402

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402
from sglang.srt.speculative import eagle_utils  # noqa: E402

from sglang_hybrid.cpu_engine import tree_sampling  # noqa: E402
from sglang_hybrid.cpu_engine.tree_sampling import (  # noqa: E402
    sampling_verify_patches, top_k_renorm_prob_cpu, top_p_renorm_prob_cpu, tree_speculative_sampling_target_only_cpu)
from sglang_hybrid.selector import Source, VerifyTree  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input  # noqa: E402
from tests.helpers.trees import N_NODES, mixed_batch  # noqa: E402

pytestmark = pytest.mark.sglang
W = N_NODES + 1
MAX_DEPTH = 4
VOCAB = 32
TEMPERATURE, TOP_K, TOP_P = 0.8, 24, 0.9
TRIALS = 20_000  # identical requests per tree, one verify call for all of them
ROW_NAMES = ["eagle chain", "n-gram chain", "merged, folded prefix", "merged, two root branches",
             "merged, padded"]


def hybrid_trees() -> VerifyTree:
    """Five trees from HYBRID's selector, the verify-input tests' batch (``mixed_batch``) less its empty row: an EAGLE
    chain and an n-gram chain (``choose``), and three merged trees (``merge``): model ``1 2 3 4`` and n-gram ``1 2 9``
    folded into ``1 2`` then branching; two disjoint branches at the root; a short tree with padding nodes."""
    tree = mixed_batch()
    keep = torch.tensor([0, 1, 3, 4, 5])
    return VerifyTree(*[getattr(tree, f)[keep] for f in VerifyTree._fields])


def _children(tree: VerifyTree, r: int):
    kids = {i: [] for i in range(W)}
    for i in range(1, W):
        if tree.valid[r, i]:
            kids[int(tree.parents[r, i])].append(i)
    return kids


def test_tree_sampling_trees_cover_hybrid_shapes():
    tree = hybrid_trees()
    src, valid = tree.source, tree.valid
    draft = valid.clone()
    draft[:, 0] = False
    assert ((src == Source.MODEL) | ~draft).all(1)[0] and draft[0].any()
    assert ((src == Source.NGRAM) | ~draft).all(1)[1] and draft[1].any()
    assert ((src == Source.SHARED) & draft).any(1)[2]                      # folded path
    kids = [_children(tree, r) for r in range(5)]
    assert max(len(k) for k in kids[2].values()) == 2                       # n-gram branch below the fold
    assert len(kids[3][0]) == 2 and len(kids[4][0]) == 2                    # branches at the root
    assert (~valid[4]).any()                                                # padding nodes
    for r in range(5):                       # the stand-in's exactness needs distinct sibling tokens (module doc)
        for i, ks in kids[r].items():
            toks = [int(tree.tokens[r, k]) for k in ks]
            assert len(toks) == len(set(toks)), (r, i, toks)


def _target_logits(tree: VerifyTree, seed: int) -> torch.Tensor:
    """Per (tree, node) target logits whose tempered softmax gives the node's children masses .45 (one child) or
    .35 and .25 (two siblings, in sibling order) and spreads the rest unevenly over the other tokens (top-k and top-p
    then cut the smallest): acceptance, sibling fall-through and the residual all carry real mass."""
    g = torch.Generator().manual_seed(seed)
    b = tree.tokens.shape[0]
    probs = torch.rand(b, W, VOCAB, generator=g) ** 3 + 1e-3
    for r in range(b):
        for parent, ks in _children(tree, r).items():
            masses = [.45] if len(ks) == 1 else [.35, .25, .1][: len(ks)]
            toks = [int(tree.tokens[r, k]) for k in ks]
            rest = torch.ones(VOCAB, dtype=torch.bool)
            rest[toks] = False
            probs[r, parent, rest] *= (1 - sum(masses)) / probs[r, parent, rest].sum()
            probs[r, parent, toks] = torch.tensor(masses)
    probs /= probs.sum(-1, keepdim=True)
    return TEMPERATURE * probs.log()


def _reference_probs(logits: torch.Tensor) -> torch.Tensor:
    """Target distribution written independently of the code under test: softmax at TEMPERATURE, the TOP_K most
    probable tokens, then the fewest most probable tokens whose mass reaches TOP_P; renormalised."""
    p = torch.softmax(logits.double() / TEMPERATURE, -1)
    out = torch.zeros_like(p)
    flat, fout = p.reshape(-1, VOCAB), out.view(-1, VOCAB)
    for i in range(flat.shape[0]):
        order = torch.argsort(flat[i], descending=True)[:TOP_K]
        kept = flat[i, order] / flat[i, order].sum()
        n = int((torch.cumsum(kept, 0) < TOP_P).sum()) + 1
        fout[i, order[:n]] = flat[i, order[:n]]
    return out / out.sum(-1, keepdim=True)


def _expected_sequences(tree: VerifyTree, q: torch.Tensor, r: int) -> dict:
    """Probability of each token sequence one verify step emits for tree ``r`` when every emitted token follows the
    target ``q`` given the tokens before it: accepted drafts walk down the tree, the first token that is not a child
    (or the bonus below a leaf) ends the step."""
    kids = _children(tree, r)
    out = {}

    def walk(node, prefix, prob):
        child_tok = {int(tree.tokens[r, k]): k for k in kids[node]}
        for v in range(VOCAB):
            pv = float(q[r, node, v])
            if pv <= 0:
                continue
            if v in child_tok:
                walk(child_tok[v], prefix + (v,), prob * pv)
            else:
                out[prefix + (v,)] = prob * pv

    walk(0, (), 1.0)
    return out


def _marginal(dist: dict, n: int) -> dict:
    out = {}
    for seq, p in dist.items():
        out[seq[:n]] = out.get(seq[:n], 0.0) + p
    return out


def _chisquare_p(samples: list, expected: dict) -> float:
    """Chi-square p-value of ``samples`` (hashable outcomes) against ``expected`` (outcome -> probability); outcomes
    expected fewer than 5 times are pooled. An outcome of probability zero gives p = 0."""
    n = len(samples)
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    if set(counts) - set(expected):
        return 0.0
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for k, p in expected.items():
        if p * n >= 5:
            obs.append(counts.get(k, 0))
            exp.append(p * n)
        else:
            pool_o += counts.get(k, 0)
            pool_e += p * n
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)          # the expected table sums to one up to float rounding
    return float(scipy_stats.chisquare(obs, [e * scale for e in exp]).pvalue)


def _run_verify(tree: VerifyTree, logits: torch.Tensor, trials: int, seed: int):
    """One ``eagle_sample`` call over ``trials`` identical requests per tree; returns each request's emitted tokens
    (tuples, tree-major)."""
    b = tree.tokens.shape[0]
    rep = torch.arange(b).repeat_interleave(trials)
    big = VerifyTree(*[getattr(tree, f)[rep] for f in VerifyTree._fields])
    bs = big.tokens.shape[0]
    seq_lens = torch.full((bs,), 11, dtype=torch.int64)
    vi = build_verify_input(big, seq_lens, num_steps=MAX_DEPTH, max_depth=MAX_DEPTH,
                            mask_mode=TreeMaskMode.QLEN_ONLY)
    sampling_info = SamplingBatchInfo(
        temperatures=torch.full((bs, 1), TEMPERATURE), top_ps=torch.full((bs,), TOP_P),
        top_ks=torch.full((bs,), TOP_K, dtype=torch.int32), min_ps=torch.zeros(bs), is_all_greedy=False,
        is_any_greedy=False, need_top_p_sampling=True, need_top_k_sampling=True, need_min_p_sampling=False,
        vocab_size=VOCAB)
    batch = types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens, device="cpu",
                                  sampling_info=sampling_info, return_logprob=False)
    logits_output = types.SimpleNamespace(next_token_logits=logits[rep].reshape(bs * W, VOCAB).clone())
    torch.manual_seed(seed)
    predict, accept_lens, accept_index = eagle_utils.eagle_sample(vi, batch, logits_output)
    assert accept_index.shape == (bs, MAX_DEPTH + 1)
    idx = accept_index.long().clamp_min(0)
    toks = predict.long()[idx]
    n = accept_lens.tolist()
    return [tuple(row[:k]) for row, k in zip(toks.tolist(), n)]


def _p_values(tree, logits, trials, seed):
    q = _reference_probs(logits)
    emitted = _run_verify(tree, logits, trials, seed)
    out = []
    for r in range(tree.tokens.shape[0]):
        seqs = emitted[r * trials:(r + 1) * trials]
        full = _expected_sequences(tree, q, r)
        out.append({
            "first": _chisquare_p([s[:1] for s in seqs], _marginal(full, 1)),
            "first two": _chisquare_p([s[:2] for s in seqs], _marginal(full, 2)),
            "sequence": _chisquare_p(seqs, full),
            "mean emitted": sum(len(s) for s in seqs) / trials,
        })
    return out


def test_tree_sampling_keeps_the_target_distribution(sampling_verify):
    """20,000 verify steps per tree through SGLang's ``eagle_sample``: the first emitted token, the first two and the
    whole emitted sequence follow the target distribution (temperature 0.8, top-k 24, top-p 0.9)."""
    tree = hybrid_trees()
    logits = _target_logits(tree, seed=1)
    for name, res in zip(ROW_NAMES, _p_values(tree, logits, TRIALS, seed=2)):
        assert res["mean emitted"] > 1.4, (name, res)     # drafts are accepted, not only the bonus token
        for key in ("first", "first two", "sequence"):
            assert res[key] > 1e-3, (name, key, res)


def _coin_ignored(*args, uniform_samples, **kwargs):
    """Broken: accepts the first child with target mass whatever the coin."""
    tree_speculative_sampling_target_only_cpu(*args, uniform_samples=torch.zeros_like(uniform_samples), **kwargs)


def _residual_keeps_rejected(q, p, coin):
    """Broken: samples the residual from the full target, so a rejected sibling can come out after all."""
    return _BASE_RESIDUAL(q, torch.zeros_like(p), coin)


_BASE_RESIDUAL = tree_sampling._residual_sample


def _sibling_mass_forgotten(coin, prob_acc, q, thr_acc, thr_single):
    """Broken: each sibling is tested against its own probability, not the mass of the siblings tried so far."""
    return _BASE_ACCEPTS(coin, q, q, thr_acc, thr_single)


_BASE_ACCEPTS = tree_sampling._accepts
#: broken op -> (the check that must fail, the trees it must fail on). A chain has no siblings, so forgetting their
#: mass changes nothing there; the folded tree branches below its root, so only the step's whole output shows it.
CONTROLS = {"coin ignored": ("first", ROW_NAMES), "rejected siblings kept in the residual": ("first", ROW_NAMES),
            "sibling mass forgotten": ("sequence", [n for n in ROW_NAMES if n.startswith("merged")])}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_tree_sampling_positive_controls_fail(sampling_verify, control):
    """The same checks reject three broken ops (chi-square p < 1e-6 on every tree where the breakage matters: the
    first emitted token, or the whole emitted sequence where the breakage sits below the root) and pass the trees
    where it does not."""
    if control == "coin ignored":
        sampling_verify.setattr(eagle_utils, "tree_speculative_sampling_target_only", _coin_ignored)
    elif control == "rejected siblings kept in the residual":
        sampling_verify.setattr(tree_sampling, "_residual_sample", _residual_keeps_rejected)
    else:
        sampling_verify.setattr(tree_sampling, "_accepts", _sibling_mass_forgotten)
    tree = hybrid_trees()
    logits = _target_logits(tree, seed=1)
    key, broken = CONTROLS[control]
    for name, res in zip(ROW_NAMES, _p_values(tree, logits, TRIALS, seed=2)):
        if name in broken:
            assert res[key] < 1e-6, (name, res)
        else:
            assert min(res[k] for k in ("first", "first two", "sequence")) > 1e-3, (name, res)


def test_tree_sampling_stand_in_follows_the_kernel_rule():
    """Hand-checked walk: root children 7, 8 (siblings), 7's child 9. Target at the root: q(7)=.2, q(8)=.3, so coin
    .1 accepts 7, coin .4 falls through 7 to accept 8, coin .6 rejects both and the residual (q minus both) is sampled;
    the rejected siblings' mass lands in ``draft_probs`` as the kernel writes it."""
    vocab = 10
    cand = torch.tensor([[0, 7, 8, 9]] * 3)
    ri = torch.arange(12).view(3, 4)
    nxt = torch.tensor([[1, 3, -1, -1]] * 3)
    sib = torch.tensor([[-1, 2, -1, -1]] * 3)
    q = torch.zeros(3, 4, vocab)
    q[:, 0, 7], q[:, 0, 8], q[:, 0, 1], q[:, 0, 2] = .2, .3, .25, .25
    q[:, 1, 9], q[:, 1, 4] = .5, .5
    q[:, 2, 5] = q[:, 3, 6] = 1.0
    coins = torch.tensor([[.1, .7, 0, 0], [.4, 0, 0, 0], [.6, 0, 0, 0]])
    final = torch.tensor([.3, .5, .9])
    predicts = torch.full((12,), -1, dtype=torch.int32)
    acc_idx = torch.full((3, 3), -1, dtype=torch.int32)
    acc_num = torch.empty(3, dtype=torch.int32)
    draft = torch.zeros_like(q)
    tree_speculative_sampling_target_only_cpu(predicts, acc_idx, acc_num, cand, ri, nxt, sib, coins, final, q, draft)
    assert acc_num.tolist() == [1, 1, 0]
    assert acc_idx.tolist() == [[0, 1, -1], [4, 6, -1], [8, -1, -1]]
    # row 0: 7 accepted, then 9 rejected by coin .7 (q=.5), residual at node 1 is {4: .5}: 4
    assert predicts[0].item() == 7 and predicts[1].item() == 4
    assert draft[0, 1, 9].item() == pytest.approx(.5)
    # row 1: 8 accepted after 7 fell through; node 2's row is a point mass on 5
    assert predicts[4].item() == 8 and predicts[6].item() == 5 and draft[1, 0, 7].item() == pytest.approx(.2)
    # row 2: both rejected; residual {1: .25, 2: .25}, coin .9 -> token 2
    assert predicts[8].item() == 2
    assert draft[2, 0, 7].item() == pytest.approx(.2) and draft[2, 0, 8].item() == pytest.approx(.3)


def test_tree_sampling_renorms_and_gate():
    """The renorms keep FlashInfer's supports (ties kept) and sum to one; the lifted gate opens only for sampled
    batches, and the CPU gate it lifts is really closed."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, VOCAB, generator=g), -1)
    k = top_k_renorm_prob_cpu(probs, torch.full((64,), 5))
    assert ((k > 0).sum(-1) == 5).all() and torch.allclose(k.sum(-1), torch.ones(64))
    p = top_p_renorm_prob_cpu(probs, torch.full((64,), 0.6))
    for i in range(64):
        order = torch.argsort(probs[i], descending=True)
        n = int((torch.cumsum(probs[i, order], 0) < 0.6).sum()) + 1
        assert set(torch.nonzero(p[i]).flatten().tolist()) == set(order[:n].tolist())
    ties = torch.tensor([[.25, .25, .25, .25]])
    assert torch.equal(top_k_renorm_prob_cpu(ties, 2), ties)
    flags = dict(is_hip=False, is_xpu=False, use_rejection_sampling=False)
    assert eagle_utils._verify_uses_greedy(is_all_greedy=False, is_cpu=True, **flags)
    (module, name, lifted), = [t for t in sampling_verify_patches() if t[1] == "_verify_uses_greedy"]
    assert module is eagle_utils
    assert not lifted(is_all_greedy=False, is_cpu=True, **flags)
    assert lifted(is_all_greedy=True, is_cpu=True, **flags)


def test_tree_sampling_installs_from_the_environment(monkeypatch, tmp_path):
    """What a live CPU engine process does at ``sgl_kernel`` import when ``prepare_environment(tree_sampling_counts=)``
    asked for it: the patches land in SGLang's ``eagle_utils`` and the op counts its calls into the file."""
    from sglang_hybrid.cpu_engine import TREE_SAMPLING_ENV

    for module, name, _ in sampling_verify_patches():
        monkeypatch.setattr(module, name, getattr(module, name))      # restored after the test
    counts = tmp_path / "counts.json"
    monkeypatch.delenv(TREE_SAMPLING_ENV, raising=False)
    assert tree_sampling.install_when_imported() is False
    assert eagle_utils.tree_speculative_sampling_target_only is None
    monkeypatch.setenv(TREE_SAMPLING_ENV, str(counts))
    assert tree_sampling.install_when_imported() is True
    op = eagle_utils.tree_speculative_sampling_target_only
    assert eagle_utils.top_p_renorm_prob is top_p_renorm_prob_cpu
    assert not eagle_utils._verify_uses_greedy(is_all_greedy=False, is_cpu=True, is_hip=False, is_xpu=False,
                                               use_rejection_sampling=False)
    q = torch.zeros(2, 2, 4)
    q[:, 0, 3] = q[:, 1, 1] = 1.0
    op(predicts=torch.zeros(4, dtype=torch.int32), accept_index=torch.full((2, 2), -1, dtype=torch.int32),
       accept_token_num=torch.zeros(2, dtype=torch.int32), candidates=torch.tensor([[0, 3], [0, 2]]),
       retrive_index=torch.arange(4).view(2, 2), retrive_next_token=torch.tensor([[1, -1], [1, -1]]),
       retrive_next_sibling=torch.full((2, 2), -1), uniform_samples=torch.rand(2, 2),
       uniform_samples_for_final_sampling=torch.rand(2), target_probs=q, draft_probs=torch.zeros_like(q))
    got = json.loads(counts.read_text())
    assert (got["calls"], got["requests"], got["accepted_drafts"]) == (1, 2, 1)
