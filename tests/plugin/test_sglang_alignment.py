"""n-gram proposal alignment (late, stale, reused slot), the host feeder, and one HYBRID decode step on CPU."""
from __future__ import annotations

import json

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_hybrid.selector import Source
from sglang_hybrid.sglang_plugin import alignment  # noqa: E402
from sglang_hybrid.sglang_plugin.config import HybridSettings  # noqa: E402
from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep  # noqa: E402
from sglang_hybrid.sglang_plugin.ngram_host import NgramFeeder  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input  # noqa: E402
from sglang_hybrid.verify import greedy_accept  # noqa: E402
from tests.helpers.context_lookup import LOOKUP_BYTES_BOUND, big_batch, bytes_allocated
from tests.helpers.sglang_requests import real_req

pytestmark = pytest.mark.sglang
K = 4
RING = 8


def _publish(buf, slot, tokens, at, gen):
    k = buf.tokens.shape[1]
    row = torch.full((1, k), -1, dtype=torch.int64)
    row[0, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
    feat = torch.where(row >= 0, 3, 0)
    alignment.publish(buf, torch.tensor([slot]), row, torch.tensor([len(tokens)]), torch.tensor([at]),
                      torch.tensor([gen]), feat, feat, feat + 1, torch.zeros_like(row))


def _commit(buf, slot, history):
    """Write a request's committed tokens (positions 0..len-1) into the ring the way a decode step does."""
    n = len(history)
    seq = torch.tensor([n - 1])
    alignment.ring_write_root(buf, torch.tensor([slot]), seq, torch.tensor([history[-1]]))


def _align(buf, slot, gen, committed):
    return alignment.align(buf, torch.tensor([slot]), torch.tensor([gen]), torch.tensor([committed - 1]))


def test_exact_and_late_proposals_shift():
    buf = alignment.alloc_buffers(4, K, RING, "cpu")
    hist = [10, 11, 12, 13, 14]                 # committed: 5 tokens, root 14 at position 4
    _commit(buf, 1, hist)
    _publish(buf, 1, [20, 21, 22], at=5, gen=7)   # computed now: d = 0
    a = _align(buf, 1, 7, 5)
    assert a.length.tolist() == [3] and a.tokens[0, :3].tolist() == [20, 21, 22] and a.shift.tolist() == [0]
    assert a.depth[0].tolist() == [1, 2, 3, 0]
    # Computed at 4 committed tokens, predicting [14, 20, 21]; 14 was accepted since: shift by one.
    _publish(buf, 1, [14, 20, 21], at=4, gen=7)
    a = _align(buf, 1, 7, 5)
    assert a.length.tolist() == [2] and a.tokens[0].tolist() == [20, 21, -1, -1] and a.shift.tolist() == [1]
    assert a.match_len[0].tolist() == [3, 3, 0, 0]


def test_misaligned_stale_and_reused_slot_give_nothing():
    buf = alignment.alloc_buffers(4, K, RING, "cpu")
    hist = [10, 11, 12, 13, 14]
    _commit(buf, 2, hist)
    _publish(buf, 2, [99, 20, 21], at=4, gen=3)   # predicted 99 where 14 was accepted: misaligned
    assert _align(buf, 2, 3, 5).length.tolist() == [0]
    _publish(buf, 2, [14, 20], at=4, gen=3)       # correct but fully consumed... d=1 < 2 -> one token left
    assert _align(buf, 2, 3, 5).tokens[0, 0].tolist() == 20
    assert _align(buf, 2, 3, 6).length.tolist() == [0]   # one more token committed: d=2 >= length
    _publish(buf, 2, [30, 31], at=5, gen=3)
    assert _align(buf, 2, 4, 5).length.tolist() == [0]   # slot reused by a new request (generation 4)
    assert _align(buf, 2, 3, 4).length.tolist() == [0]   # proposal from the future (d < 0)
    fresh = alignment.alloc_buffers(4, K, RING, "cpu")
    _commit(fresh, 0, [1, 2])
    assert _align(fresh, 0, 0, 2).length.tolist() == [0]  # never published (generation -1)


def test_ring_records_emitted_tokens_and_wraps():
    buf = alignment.alloc_buffers(2, K, RING, "cpu")
    hist = list(range(100, 103))
    _commit(buf, 0, hist)                          # root 102 at position 2
    emitted = torch.tensor([[103, 104, 105, 0, 0]])
    alignment.ring_write_emitted(buf, torch.tensor([0]), torch.tensor([2]), emitted, torch.tensor([3]))
    ring = buf.ring[0]
    assert [int(ring[p % RING]) for p in (2, 3, 4, 5)] == [102, 103, 104, 105]
    assert int(ring[6 % RING]) == -1               # past emit_len: nothing written there
    # many steps later the ring wraps; alignment still checks the latest positions
    seq = 2
    tok = 105
    for _ in range(5):
        e = torch.tensor([[tok + 1, tok + 2, 0, 0, 0]])
        alignment.ring_write_emitted(buf, torch.tensor([0]), torch.tensor([seq + 3]), e, torch.tensor([2]))
        seq += 2
        tok += 2
    committed = seq + 3 + 1
    _publish(buf, 0, [tok - 1, tok, 500], at=committed - 2, gen=1)
    a = _align(buf, 0, 1, committed)
    assert a.tokens[0, 0].item() == 500 and a.length.item() == 1


def test_randomized_alignment_never_wrong():
    """Random histories, proposals computed at random older lengths, some true continuations, some corrupted, some
    for a previous occupant of the slot: every n-gram token handed out equals what an up-to-date proposal predicts,
    and every proposal whose overlap matches reality (right request, 0 <= d < length) is used."""
    rng = random.Random(0)
    P = 6
    buf = alignment.alloc_buffers(P, K, RING, "cpu")
    gens = [0] * P
    hists = {s: [] for s in range(P)}
    plens = [0] * P
    outcomes = {True: 0, False: 0}
    shifted = 0
    for step in range(300):
        s = rng.randrange(P)
        if rng.random() < 0.08 or not hists[s]:
            gens[s] += 1                              # slot (re)allocated: new request, new prompt
            hists[s] = [rng.randrange(50) for _ in range(rng.randint(1, 6))]
            plens[s] = len(hists[s])
            hists[s].append(rng.randrange(50))        # prefill's first output token (the first decode's root)
        h = hists[s]
        # the host saw an older prefix (never shorter than the prompt): at = len(h) - lag
        lag = rng.randint(0, 3)
        at = max(plens[s], len(h) - lag)
        future = [rng.randrange(50) for _ in range(K)]
        truth = h[at:] + future                       # what really follows position `at` (known part + guesses)
        prop = truth[: rng.randint(1, K)]
        if rng.random() < 0.3 and prop:
            prop = list(prop)
            prop[rng.randrange(len(prop))] = 99       # corrupted
        pub_gen = gens[s] if rng.random() > 0.1 else gens[s] - 1
        _publish(buf, s, prop, at=at, gen=pub_gen)
        # device commits the request's tokens (one decode step: root + emitted)
        root_pos = len(h) - 1
        alignment.ring_write_root(buf, torch.tensor([s]), torch.tensor([root_pos]), torch.tensor([h[-1]]))
        a = _align(buf, s, gens[s], len(h))
        d = len(h) - at
        overlap_ok = prop[:d] == h[at:at + d]
        expect_ok = pub_gen == gens[s] and 0 <= d < len(prop) and overlap_ok
        n = int(a.length)
        outcomes[expect_ok] += 1
        shifted += int(expect_ok and d > 0)
        if expect_ok:
            assert n == len(prop) - d and a.tokens[0, :n].tolist() == prop[d:]
        else:
            assert n == 0 and (a.tokens[0] == -1).all()
        # then the step accepts a few tokens
        acc = [rng.randrange(50) for _ in range(rng.randint(1, 3))]
        e = torch.tensor([acc + [0] * (5 - len(acc))])
        alignment.ring_write_emitted(buf, torch.tensor([s]), torch.tensor([root_pos]), e, torch.tensor([len(acc)]))
        h.extend(acc)
    assert outcomes[True] > 30 and outcomes[False] > 30 and shifted > 10, (outcomes, shifted)


def test_align_compiles_fullgraph():
    buf = alignment.alloc_buffers(4, K, RING, "cpu")
    _commit(buf, 1, [10, 11, 12])
    _publish(buf, 1, [12, 20, 21], at=2, gen=1)
    args = (buf, torch.tensor([1, 3]), torch.tensor([1, 0]), torch.tensor([2, 5]))
    compiled = torch.compile(alignment.align, fullgraph=True, backend="eager")
    for x, y in zip(compiled(*args), alignment.align(*args)):
        assert torch.equal(x, y)


class FakeDrafter:
    """Records the lifecycle calls; proposes the request's last token + 1, +2, ... (deterministic)."""

    def __init__(self):
        self.ctx, self.calls = {}, []

    def start(self, rid, prompt):
        assert rid not in self.ctx
        self.ctx[rid] = list(prompt)
        self.calls.append(("start", rid, len(prompt)))

    def extend_batch(self, rids, tokens, lengths):
        off = 0
        for rid, n in zip(rids.tolist(), lengths.tolist()):
            self.ctx[rid].extend(tokens[off:off + n].tolist())
            self.calls.append(("extend", rid, n))
            off += n

    def propose(self, ids, k):
        toks = np.array([[self.ctx[int(i)][-1] + j + 1 for j in range(k)] for i in ids], dtype=np.int32)
        z = np.ones_like(toks)
        return SimpleNamespace(tokens=toks, lengths=np.full(len(ids), k, dtype=np.int32), match_len=z, count=z,
                               total=z * 2)

    def finish(self, rid, donate):
        self.calls.append(("finish", rid, donate))

    def remove(self, rid):
        del self.ctx[rid]
        self.calls.append(("remove", rid))


def test_feeder_lifecycle_and_publish():
    d = FakeDrafter()
    feeder = NgramFeeder(d, K, "cpu", max_bs=4, donate=True)
    buf = alignment.alloc_buffers(4, K, RING, "cpu")
    a, b = real_req("a", [1, 2, 3], [4], 0), real_req("b", [7], [8, 9], 2)
    staged = feeder.stage_batch([a, b], [5, 6])
    gen = feeder.publish(staged, torch.tensor([0, 2]), buf)
    assert gen.tolist() == [5, 6]
    assert buf.tokens[0].tolist() == [5, 6, 7, 8] and buf.at[0].item() == 4 and buf.gen[2].item() == 6
    assert buf.total[2].tolist() == [2, 2, 2, 2]
    a.output_ids = [4, 5, 6]
    feeder.stage_batch([a, b], [5, 6])
    assert d.ctx[1] == [1, 2, 3, 4, 5, 6] and ("extend", 1, 2) in d.calls
    feeder.finish("a", natural_stop=True)
    feeder.drop_absent({"c"})                       # b left the batch without finishing (retracted)
    assert ("finish", 1, True) in d.calls and ("remove", 1) in d.calls and ("remove", 2) in d.calls
    assert not d.ctx
    c = real_req("c", [1], [2, 3], 1)
    feeder.stage_batch([c], [1])
    c.output_ids = []                               # retraction shrank it: start over
    feeder.stage_batch([c], [1])
    assert [x[0] for x in d.calls[-3:]] == ["start", "remove", "start"]
    feeder2 = NgramFeeder(FakeDrafter(), K, "cpu", max_bs=4, donate=False)
    feeder2.stage_batch([real_req("x", [1], [2], 0)], [1])
    feeder2.finish("x", natural_stop=True)
    assert ("finish", 1, False) in feeder2.drafter.calls
    with pytest.raises(ValueError, match="capacity"):
        feeder.stage_batch([real_req(str(i), [1], [], i) for i in range(5)], [0] * 5)


def test_hybrid_step_decode_on_cpu():
    """Two decode steps of the device logic between EAGLE's draft and the verify forward, for 3 requests: proposals
    published one step late are aligned, drafts selected, the verify input built, verified greedily, and the emitted
    tokens recorded for the next step's alignment."""
    torch.manual_seed(0)
    settings = HybridSettings(mode="merge", ngram_k=K)
    step = HybridStep(settings, num_steps=3, pool_size=8, device="cpu")
    assert step.n_nodes == 3 + K and step.max_depth == K
    w = step.n_nodes + 1
    d = FakeDrafter()
    feeder = NgramFeeder(d, step.proposal_width, "cpu", max_bs=8)
    slots = torch.tensor([5, 1, 3])
    reqs = [real_req("r0", [10, 11], [12], 5), real_req("r1", [20], [21], 1), real_req("r2", [30, 31, 32], [33], 3)]
    seq_lens = torch.tensor([2, 1, 3])               # committed = seq_len + 1 (root = last output token)
    roots = torch.tensor([12, 21, 33])
    cur_gen = feeder.publish(feeder.stage_batch(reqs, [1, 1, 1]), slots, step.buffers)
    # EAGLE chain: row 0 agrees with the n-gram proposal's first token, others differ
    model_tokens = torch.tensor([[13, 40, 41], [50, 51, 52], [60, 61, 62]])
    conf = torch.tensor([[0.9, 0.5, 0.4], [0.2, 0.1, 0.1], [0.95, 0.9, 0.9]])
    tree = step.select(roots, model_tokens, conf, slots, cur_gen, seq_lens).tree
    assert tree.tokens.shape == (3, w)
    ngram_first = tree.tokens[tree.source >= 1]
    assert 22 in ngram_first.tolist() or 34 in ngram_first.tolist()   # n-gram proposals made it into trees
    build_verify_input(tree, seq_lens, num_steps=3, max_depth=step.max_depth, mask_mode=TreeMaskMode.QLEN_ONLY)
    # target: follows the n-gram branch for row 1 for two tokens
    logits = torch.randn(3, w, 128)
    path_nodes = [i for i in range(w) if tree.valid[1, i] and int(tree.source[1, i]) in (1, 2)][:2]
    prev = 0
    for i in path_nodes:
        logits[1, prev] = -9
        logits[1, prev, int(tree.tokens[1, i])] = 9
        prev = i
    res = greedy_accept(tree, logits)
    assert int(res.accept_len[1]) == len(path_nodes)
    emitted = torch.full((3, w), -1, dtype=torch.int64)
    for r in range(3):
        n = int(res.accept_len[r])
        emitted[r, :n] = tree.tokens[r, res.accepted_nodes[r, 1:1 + n]]
        emitted[r, n] = res.bonus[r]
    step.after_verify(tree, slots, seq_lens, emitted, res.accept_len + 1)
    snap = step.counters.snapshot()
    assert snap["steps"] == 1 and snap["requests"] == 3
    assert sum(snap[f"chosen_{c}"] for c in ("none", "model", "ngram", "mixed")) == 3
    # Step 2: the host has NOT seen step 1's tokens (one step late); its old proposal stays published.
    new_seq = seq_lens + res.accept_len + 1
    new_roots = emitted.gather(1, res.accept_len[:, None])[:, 0]
    a = alignment.align(step.buffers, slots, cur_gen, new_seq)
    for r in range(3):
        dshift = int(new_seq[r] + 1 - step.buffers.at[slots[r]])
        prop = step.buffers.tokens[slots[r]].tolist()
        committed_since = emitted[r, : int(res.accept_len[r]) + 1].tolist()
        if dshift < K and prop[:dshift] == committed_since[:dshift]:
            assert a.tokens[r, : K - dshift].tolist() == prop[dshift:]
        else:
            assert int(a.length[r]) == 0
    # row 1 followed the proposal for two tokens then took the bonus: alignment accepts iff the bonus matches it
    tree2 = step.select(new_roots, model_tokens, conf, slots, cur_gen, new_seq).tree
    assert tree2.valid[:, 0].all()


def test_counters_log_without_blocking(caplog, tmp_path):
    from sglang_hybrid.sglang_plugin.metrics import HybridCounters, tree_class

    settings = HybridSettings(mode="choose", ngram_k=K)
    counters = HybridCounters("cpu", log_interval=2)
    step = HybridStep(settings, num_steps=3, pool_size=4, device="cpu", counters=counters)
    slots, seq = torch.tensor([0, 1]), torch.tensor([3, 3])
    model = torch.tensor([[1, 2, 3], [4, 5, 6]])
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.9, 0.9]])
    tree = step.select(torch.tensor([7, 8]), model, conf, slots, torch.tensor([0, 0]), seq).tree
    assert tree_class(tree.source, tree.valid).tolist() == [1, 1]        # no n-gram proposal published: EAGLE
    step.after_verify(tree, slots, seq, torch.tensor([[1, 2, 9, 0], [7, 0, 0, 0]]), torch.tensor([3, 1]))
    snap = tmp_path / "counters.json"
    counters.snapshot_path = str(snap)
    with caplog.at_level("INFO", logger="sglang_hybrid"):
        assert counters.maybe_log() is None           # step 1
        out = counters.maybe_log()                    # step 2: copy taken (on CPU it lands at once) -> logged
    assert out["chosen_model"] == 2 and out["mean_accepted_model"] == pytest.approx(1.0)
    assert out["steps"] == 1 and "HYBRID steps=1" in caplog.text
    # 3 model nodes per request verified in a width of 5 (root + 4): one slot in five is padding
    assert out["mean_nodes"] == 3 and out["padded_fraction"] == pytest.approx(0.2) and "padded=0.20" in caplog.text
    assert json.loads(snap.read_text()) == out        # cumulative snapshot for the self-check
    assert counters.maybe_log() is None               # step 3: between log lines


def test_real_drafter_through_feeder_and_step():
    """The Rust drafter behind the feeder: a request repeating a phrase gets the phrase's continuation proposed,
    published one step late, shifted by what was accepted since, and chosen in the verify tree."""
    from sglang_hybrid.ngram import NgramDrafter

    step = HybridStep(HybridSettings(mode="choose", ngram_k=K), num_steps=3, pool_size=4, device="cpu")
    feeder = NgramFeeder(NgramDrafter(max_draft=step.proposal_width), step.proposal_width, "cpu", max_bs=4)
    phrase = [101, 102, 103, 104, 105, 106, 107, 108]
    req = real_req("p", phrase * 3, phrase[:2], 2)        # committed: ... 101 102 -> the phrase continues 103 104 ...
    cur_gen = feeder.publish(feeder.stage_batch([req], [9]), torch.tensor([2]), step.buffers)
    assert step.buffers.tokens[2, :4].tolist() == [103, 104, 105, 106]
    committed = len(phrase) * 3 + 2
    # the device has since accepted 103 (one step ahead of the host): the proposal shifts by one
    a = alignment.align(step.buffers, torch.tensor([2]), cur_gen, torch.tensor([committed]))
    assert int(a.length) == 0                             # ring does not know 103 yet: no candidate, not a guess
    alignment.ring_write_emitted(step.buffers, torch.tensor([2]), torch.tensor([committed - 1]),
                                 torch.tensor([[103, 0]]), torch.tensor([1]))
    alignment.ring_write_root(step.buffers, torch.tensor([2]), torch.tensor([committed - 1]), torch.tensor([102]))
    tree = step.select(torch.tensor([103]), torch.tensor([[7, 8, 9]]), torch.tensor([[0.1, 0.1, 0.1]]),
                       torch.tensor([2]), cur_gen, torch.tensor([committed])).tree
    assert tree.tokens[0, 1:4].tolist() == [104, 105, 106] and (tree.source[0, 1:4] == 1).all()
    feeder.finish("p", natural_stop=True)
    assert len(feeder.drafter) == 0


def test_proposals_survive_a_step_that_accepted_everything():
    """The host proposes one step late. After a step that accepted ``k`` drafts (plus the bonus), a proposal only
    ``k`` long would be used up by the shift; HYBRID buffers ``k + max_depth + 1`` tokens, so while the text keeps
    copying the next step still has a full ``k``-token n-gram chain."""
    from sglang_hybrid.ngram import NgramDrafter

    step = HybridStep(HybridSettings(mode="choose", ngram_k=K), num_steps=3, pool_size=4, device="cpu")
    width = step.proposal_width
    assert width == K + step.max_depth + 1
    feeder = NgramFeeder(NgramDrafter(max_draft=width), width, "cpu", max_bs=4)
    phrase = list(range(200, 200 + 3 * width))            # long and distinct: the copy continues for many steps
    req = real_req("p", phrase * 2, phrase[:2], 1)             # committed: ..., phrase[0], phrase[1] (the root)
    slots = torch.tensor([1])
    cur_gen = feeder.publish(feeder.stage_batch([req], [3]), slots, step.buffers)
    at = 2 * len(phrase) + 2                               # committed tokens the proposal was computed at
    # meanwhile the device ran a step from root phrase[1] (position at - 1) that accepted K drafts + the bonus
    alignment.ring_write_root(step.buffers, slots, torch.tensor([at - 1]), torch.tensor([phrase[1]]))
    emitted = torch.tensor([phrase[2:2 + K + 1]])
    alignment.ring_write_emitted(step.buffers, slots, torch.tensor([at - 1]), emitted, torch.tensor([K + 1]))
    new_seq = torch.tensor([at - 1 + K + 1])
    a = alignment.align(step.buffers, slots, cur_gen, new_seq)
    assert int(a.shift) == K + 1 and int(a.length) >= K
    tree = step.select(torch.tensor([phrase[2 + K]]), torch.tensor([[7, 8, 9]]), torch.tensor([[0.1, 0.1, 0.1]]),
                       slots, cur_gen, new_seq).tree
    assert tree.tokens[0, 1:1 + K].tolist() == phrase[3 + K:3 + 2 * K]
    assert (tree.source[0, 1:1 + K] == Source.NGRAM).all()


def test_decode_step_compiles_fullgraph(tmp_path):
    """The whole per-step device path (align, the device prompt lookup over the span the host chose, calibrate with
    the online EAGLE and n-gram offsets, price with a cost table, select, counters, mask, ring and context updates,
    the offsets' updates) traces as one graph: no host sync or data-dependent Python branching. The cost table is
    one measured at two contexts, as at start, so the blend at the batch's context is traced too."""
    from sglang_hybrid.cost import ContextCostModel
    from sglang_hybrid.sglang_plugin import context_lookup
    from sglang_hybrid.sglang_plugin.verify_input import full_mask, tree_links_torch

    cost = tmp_path / "cost.json"
    ContextCostModel([1, 4096], [0.0101, 0.4196], [0.0101, 0.2], 4, 64).save(cost)
    step = HybridStep(HybridSettings(mode="merge", ngram_k=K, cost_table=str(cost), model_bias_eta=0.1,
                                     ngram_bias_eta=0.3), num_steps=3, pool_size=8, device="cpu",
                      max_context_len=4096)
    _publish(step.buffers, 3, [5, 6, 7], at=9, gen=0)
    context_lookup.write_context(step.context, torch.ones(5, dtype=torch.int64), torch.arange(5),
                                 torch.tensor([4, 7, 2, 3, 9]), torch.tensor([1]), torch.tensor([0]))
    span = step.lookup_span(9 + 1)
    assert span == context_lookup.SPAN_MIN

    def decode_step(root, chain, conf, slots, gen, seq, emitted, accept_lens):
        tree = step.select(root, chain, conf, slots, gen, seq, lookup_span=span).tree
        mask = full_mask(tree.ancestors, seq, 64)
        links = tree_links_torch(tree.ancestors, seq)
        step.after_verify(tree, slots, seq, emitted, accept_lens)
        return tree.tokens, mask, links[0]

    args = (torch.tensor([7, 8]), torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.full((2, 3), 0.9), torch.tensor([1, 3]),
            torch.tensor([0, 0]), torch.tensor([5, 8]), torch.tensor([[1, 2, 0, 0, 0], [5, 6, 7, 9, 0]]),
            torch.tensor([2, 4]))
    compiled = torch.compile(decode_step, fullgraph=True, backend="eager")
    got = compiled(*args)
    assert (got[0][1] >= 0).sum() > 3          # the n-gram proposal made it into request 1's tree
    assert 9 in got[0][0].tolist()             # request 0 (no aligned proposal) copied 2 3 9 after its root 7
    assert (step.ngram_bias[torch.tensor([1, 3])] != 0).all()        # both requests' n-gram chains were tested
    w = (6.5 - 4) / (64 - 4)                                          # mean context 6.5 tokens a request
    assert torch.allclose(step.cost.seconds, torch.tensor([0.0101, 0.2 + w * (0.4196 - 0.2)]))   # blended there


def test_hybrid_step_drafts_adaptively_with_a_draft_cost_table(tmp_path):
    """With a draft cost table the worker's step decides the next EAGLE depth too: a long aligned n-gram copy and a
    weak EAGLE chain make depth 1 enough; the step accepts a chain drafted at any of its depths."""
    from sglang_hybrid.cost import CostModel

    CostModel.linear(0.01, 0.0001).save(tmp_path / "cost.json")
    CostModel.linear(0.004, 0.0).save(tmp_path / "draft.json")
    settings = HybridSettings(mode="merge", ngram_k=K, cost_table=str(tmp_path / "cost.json"),
                              draft_cost_table=str(tmp_path / "draft.json"))
    step = HybridStep(settings, num_steps=4, pool_size=4, device="cpu")
    assert step.depths == (1, 2, 3, 4) and step.widths[-1] == 4 + K + 1
    slots, seq = torch.tensor([0, 1]), torch.tensor([20, 20])
    for r in range(2):
        _publish(step.buffers, int(slots[r]), [100 + i for i in range(K)], at=21, gen=0)
    for depth in (4, 1):
        d = step.select(torch.tensor([7, 8]), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])[:, :depth],
                        torch.full((2, depth), 0.2), slots, torch.tensor([0, 0]), seq, width=step.widths[-1])
        assert int(d.next_depth) == 1, depth
        assert (d.tree.source[:, 1:1 + K] == Source.NGRAM).any()
    assert step.counters.depth_steps == {4: 1, 1: 1}


def test_rows_whose_late_proposal_misaligned_take_the_device_prompt_lookup():
    """A real SGLang ``Req`` fed by the feeder (real Rust drafter) into a step with the context table: the host's
    proposal is replaced by one that disagrees with the text, so alignment drops it; the device prompt lookup over
    the committed tokens (written once by the host, extended by the device) supplies the n-gram branch instead, and
    the verify's emitted tokens extend the table."""
    from sglang_hybrid.ngram import NgramDrafter

    settings = HybridSettings(mode="merge", ngram_k=K)
    step = HybridStep(settings, num_steps=2, pool_size=4, device="cpu", max_context_len=64)
    assert step.context is not None and step.context.tokens.shape == (4, 65)
    assert HybridStep(HybridSettings(mode="merge", ngram_k=K, context_lookup=False), num_steps=2, pool_size=4,
                      device="cpu", max_context_len=64).context is None
    feeder = NgramFeeder(NgramDrafter(max_draft=step.proposal_width), step.proposal_width, "cpu", max_bs=4,
                         context=True)
    prompt = list(range(10, 20)) + [10, 11]
    req = real_req("a", prompt, [12], 1)
    slots = torch.tensor([1])
    staged = feeder.stage_batch([req], [3], [1])
    assert staged["context"]["flat"][2].tolist() == prompt + [12]
    cur = feeder.publish(staged, slots, step.buffers, step.context)
    assert step.context.tokens[1, :13].tolist() == prompt + [12] and int(step.context.gen[1]) == 3
    assert "context" not in feeder.stage_batch([req], [3], [1])          # once per slot occupancy
    _publish(step.buffers, 1, [99, 98, 97], at=12, gen=3)                   # predicted 99 where 12 was committed
    seq = torch.tensor([12])                                                # root 12 at position 12
    d = step.select(torch.tensor([12]), torch.tensor([[50, 51]]), torch.full((1, 2), 0.1), slots, cur, seq)
    ngram_tokens = d.tree.tokens[0][d.tree.source[0] == Source.NGRAM].tolist()
    assert ngram_tokens[:K] == [13, 14, 15, 16]
    assert step.counters.snapshot()["ngram_from_lookup"] == 1.0
    step.after_verify(d.tree, slots, seq, torch.tensor([[13, 14, 0]]), torch.tensor([2]))
    assert step.context.tokens[1, 12:15].tolist() == [12, 13, 14]
    with pytest.raises(ValueError, match="needs the batch's slots"):
        feeder.stage_batch([req], [3])


def test_lookup_memory_bound_through_the_decode_step():
    """The worker's path: ``lookup_span`` from the host-known longest context, then ``select``. At B=128, a
    131,072-token table and 2,048-token contexts the whole selection (the prompt lookup for every row, which all lack
    an aligned proposal, and the decision) allocates at most 64 MB, and decides exactly what the whole-table lookup
    decides."""
    table, slots, seq_lens, gens = big_batch()
    b = slots.shape[0]
    step = HybridStep(HybridSettings(mode="merge", ngram_k=8), num_steps=4, pool_size=b, device="cpu",
                      max_context_len=table.tokens.shape[1] - 1)
    step.context.tokens.copy_(table.tokens)
    step.context.gen.copy_(table.gen)
    root = table.tokens[slots, seq_lens].to(torch.int64)
    chain, conf = torch.randint(0, 50, (b, 4)), torch.full((b, 4), 0.3)
    span = step.lookup_span(int(seq_lens.max()) + 1)               # the host's bound (worker: SGLang's CPU seq lens)
    step.select(root, chain, conf, slots, gens, seq_lens, lookup_span=span)                     # warm-up
    used, d = bytes_allocated(lambda: step.select(root, chain, conf, slots, gens, seq_lens, lookup_span=span))
    assert used <= LOOKUP_BYTES_BOUND, f"{used / 1e6:.1f} MB"
    want = step.select(root, chain, conf, slots, gens, seq_lens)
    for name, x, y in zip(type(d.tree)._fields, d.tree, want.tree):
        assert torch.equal(x, y), name
    assert (d.tree.source == Source.NGRAM).any(1).float().mean() > 0.5
    assert step.lookup_span(None) is None and step.lookup_span(10**9) == table.tokens.shape[1] - 1


def test_model_offset_is_learned_per_request_and_reset_with_the_slot():
    """Each request's online offset on the EAGLE side (``request_bias``) is learned on the device from the tokens its
    verify committed: a request whose chain was all accepted is priced higher next step, one whose first token was
    rejected lower, by exactly ``request_bias.update_bias``; a new request in a reused slot (new generation) starts
    from the calibration alone, and ``model_bias_eta = None`` turns it off."""
    from sglang_hybrid.request_bias import update_bias
    from sglang_hybrid.step import ModelDraft

    eta = 0.5
    step = HybridStep(HybridSettings(mode="choose", ngram_k=K, model_bias_eta=eta, model_calibration_eta=None),
                      num_steps=3, pool_size=4, device="cpu")
    slots, gen, seq = torch.tensor([0, 2]), torch.tensor([0, 0]), torch.tensor([5, 5])
    chain = torch.tensor([[11, 12, 13], [21, 22, 23]])
    conf = torch.full((2, 3), 0.6)
    calibrated = step.decide.model_acceptance(ModelDraft(chain, conf, torch.tensor([3, 3])))
    d = step.select(torch.tensor([7, 8]), chain, conf, slots, gen, seq)
    assert torch.equal(d.model_acceptance, calibrated)                    # new requests: the calibration alone
    # request 0 committed its whole chain and a bonus token; request 1's first drafted token was not the target's
    emitted = torch.tensor([[11, 12, 13, 14, -1], [99, -1, -1, -1, -1]])
    step.after_verify(d.tree, slots, seq, emitted, torch.tensor([4, 1]))
    tested = torch.tensor([[True, True, True], [True, False, False]])
    hit = torch.tensor([[True, True, True], [False, False, False]])
    want = update_bias(torch.zeros(2), calibrated, tested, hit, eta)
    assert want[0] > 0 > want[1]
    assert torch.allclose(step.model_bias[slots], want) and step.model_bias_gen[slots].tolist() == [0, 0]
    snap = step.counters.snapshot()                       # the calibration seen live: 4 tested tokens, 3 accepted
    assert snap["model_tested"] == 4 and snap["model_accepted"] == pytest.approx(0.75)
    assert snap["model_predicted"] == pytest.approx(float(calibrated[tested].mean()))
    d2 = step.select(torch.tensor([14, 99]), chain, conf, slots, gen, seq + torch.tensor([4, 1]))
    assert (d2.model_acceptance[0] > calibrated[0]).all() and (d2.model_acceptance[1] < calibrated[1]).all()
    # slot 2 taken over by a new request (generation 1): its offset is not inherited
    d3 = step.select(torch.tensor([8]), chain[1:], conf[1:], torch.tensor([2]), torch.tensor([1]), torch.tensor([3]))
    assert torch.equal(d3.model_acceptance, calibrated[1:])
    with pytest.raises(ValueError, match="once per select"):
        step.after_verify(d3.tree, slots, seq, emitted, torch.tensor([4, 1]))
    off = HybridStep(HybridSettings(mode="choose", ngram_k=K, model_bias_eta=None, model_calibration_eta=None),
                     num_steps=3, pool_size=4, device="cpu")
    assert off.model_bias is None
    d_off = off.select(torch.tensor([7, 8]), chain, conf, slots, gen, seq)
    off.after_verify(d_off.tree, slots, seq, emitted, torch.tensor([4, 1]))
    assert torch.equal(off.select(torch.tensor([14, 99]), chain, conf, slots, gen, seq + 1).model_acceptance,
                       calibrated)
    assert off.counters.snapshot()["model_tested"] == 4  # counted with the correction off too


def test_ngram_offset_is_learned_per_request_and_reset_with_the_slot():
    """``ngram_bias_eta``: each request's online offset on the n-gram side is learned on the device from how its own
    n-gram chain fared against the committed tokens, by exactly ``request_bias.update_bias`` over
    ``request_bias.chain_outcome`` of the chain it priced: a request that copied its whole chain is priced higher next
    step, one whose first n-gram token missed lower; a new request in a reused slot starts from the calibration
    alone; off (None), every step prices with the calibration alone."""
    from sglang_hybrid.request_bias import update_bias

    eta = 0.5
    on, off = (HybridStep(HybridSettings(mode="merge", ngram_k=K, ngram_bias_eta=e), num_steps=3, pool_size=4,
                          device="cpu") for e in (eta, None))
    assert off.ngram_bias is None and on.ngram_bias is not None
    chain, conf = torch.tensor([[11, 12, 13], [21, 22, 23]]), torch.full((2, 3), 0.6)
    proposals = {0: list(range(31, 40)), 2: list(range(41, 50))}

    def select(slots, gen, seq, root):
        out = []
        for st in (on, off):
            for r, sl in enumerate(slots.tolist()):
                _publish(st.buffers, sl, proposals[sl], int(seq[r]) + 1, int(gen[r]))
            out.append(st.select(root, chain[:len(slots)], conf[:len(slots)], slots, gen, seq))
        return out

    slots, gen, seq = torch.tensor([0, 2]), torch.tensor([0, 0]), torch.tensor([5, 5])
    d, d_off = select(slots, gen, seq, torch.tensor([7, 8]))
    calibrated = d_off.ngram_acceptance
    assert (calibrated > 0).all() and torch.equal(d.ngram_acceptance, calibrated)     # new requests: the table
    # request 0 committed its n-gram chain's 4 tokens (3 drafts + bonus); request 1's first n-gram token missed
    emitted, acc = torch.tensor([[31, 32, 33, 34, -1], [99, -1, -1, -1, -1]]), torch.tensor([4, 1])
    for st, dd in ((on, d), (off, d_off)):
        st.after_verify(dd.tree, slots, seq, emitted, acc)
    tested = torch.tensor([[True, True, True, True], [True, False, False, False]])
    hit = torch.tensor([[True, True, True, True], [False, False, False, False]])
    want = update_bias(torch.zeros(2), calibrated, tested, hit, eta)
    assert want[0] > 0 > want[1]
    assert torch.allclose(on.ngram_bias[slots], want) and on.ngram_bias_gen[slots].tolist() == [0, 0]
    for st in (on, off):                    # the n-gram table seen live: 5 tested tokens, 4 accepted, learning or not
        snap = st.counters.snapshot()
        assert snap["ngram_tested"] == 5 and snap["ngram_accepted"] == pytest.approx(0.8)
        assert snap["ngram_predicted"] == pytest.approx(float(calibrated[tested].mean()))
    d2, d2_off = select(slots, gen, seq + acc, torch.tensor([34, 99]))
    assert torch.equal(d2_off.ngram_acceptance, calibrated)
    assert (d2.ngram_acceptance[0] > calibrated[0]).all() and (d2.ngram_acceptance[1] < calibrated[1]).all()
    assert (d2.ngram_survival[0] > d2_off.ngram_survival[0]).all()          # the longer copy is priced up
    for st, dd in ((on, d2), (off, d2_off)):
        st.after_verify(dd.tree, slots, seq + acc, emitted, acc)
    # slot 2 taken over by a new request (generation 1): its offset is not inherited
    d3, d3_off = select(torch.tensor([2]), torch.tensor([1]), torch.tensor([3]), torch.tensor([8]))
    assert torch.equal(d3.ngram_acceptance, d3_off.ngram_acceptance)


def test_graph_outputs_poisoned_after_select_change_nothing_after_verify():
    """The EAGLE chain and confidences a step reads come from the draft's CUDA graph, whose outputs SGLang overwrites
    at the next replay (draft-extend replays before ``after_verify``): overwriting ("poisoning") them right after
    ``select`` must leave the counters and each request's learned model offset exactly as without it."""
    def run(poison: bool):
        step = HybridStep(HybridSettings(mode="merge", ngram_k=K, model_bias_eta=0.5), num_steps=3, pool_size=4,
                          device="cpu")
        slots, gen, seq = torch.tensor([0, 2]), torch.tensor([0, 0]), torch.tensor([5, 5])
        root = torch.tensor([7, 8])
        emitted = torch.tensor([[11, 12, 13, 14, -1], [99, -1, -1, -1, -1]])
        for i in range(3):
            chain = torch.tensor([[11, 12, 13], [21, 22, 23]]) + i
            conf = torch.full((2, 3), 0.6)
            d = step.select(root, chain, conf, slots, gen, seq)
            if poison:                                    # the next graph replay writes its own outputs here
                chain.fill_(-7)
                conf.fill_(0.01)
                root.fill_(-3)
            step.after_verify(d.tree, slots, seq, emitted, torch.tensor([4, 1]))
            root = torch.tensor([7, 8])
            seq = seq + torch.tensor([4, 1])
        return step.counters.snapshot(), step.model_bias.clone()

    clean, poisoned = run(False), run(True)
    assert poisoned[0] == clean[0]
    assert torch.equal(poisoned[1], clean[1]) and clean[1].abs().sum() > 0     # the offsets were learned


def test_hybrid_step_prices_at_its_batch_context(tmp_path):
    """With a table measured at two contexts (as at start) the step prices each batch at its own mean context: the
    same drafts verify the whole tree for a batch of short requests, where the probe at 64 tokens found verify slots
    free, and the narrowest width bucket for one of long requests, where the probe at 2,048 found them costly."""
    from sglang_hybrid.cost import ContextCostModel

    ContextCostModel([1, 64, 4096], [0.010, 0.300, 20.0], [0.010, 0.010, 0.011], 64, 2048).save(tmp_path / "c.json")
    step = HybridStep(HybridSettings(mode="merge", ngram_k=K, cost_table=str(tmp_path / "c.json")), num_steps=3,
                      pool_size=4, device="cpu")
    slots = torch.tensor([0, 1])
    chain, conf = torch.tensor([[1, 2, 3], [5, 6, 7]]), torch.full((2, 3), 0.6)
    kept = {}
    for seq in (40, 2048):
        for r in range(2):
            _publish(step.buffers, r, [100 + i for i in range(K)], at=seq + 1, gen=0)
        d = step.select(torch.tensor([7, 8]), chain, conf, slots, torch.tensor([0, 0]), torch.tensor([seq, seq]),
                        width=step.widths[-1])
        kept[seq] = (int(d.next_width), int(d.b_star), float(d.lam))
    assert kept[40] == (step.widths[-1], 2 * (step.widths[-1] - 1), 0.0), kept
    assert kept[2048][:2] == (step.widths[0], 2) and kept[2048][2] > 0.0, kept
