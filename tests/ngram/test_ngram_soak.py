"""Soak: thousands of request lifecycles (start, extend, propose, finish with donation, remove) through one
NgramDrafter, checking that memory stays bounded by the live requests plus the shared-corpus cap and returns to
the corpus alone once every request is gone."""

from __future__ import annotations

import numpy as np

from sglang_hybrid.ngram import NgramDrafter

CAP = 20_000  # donated-corpus cap (tokens)
BYTES_PER_TOKEN = 200  # memory target per context token


def test_soak_lifecycles_memory_returns_under_cap():
    rng = np.random.default_rng(1234)
    vocab = 2000
    templates = [rng.integers(0, vocab, size=int(rng.integers(50, 300))) for _ in range(20)]
    d = NgramDrafter(max_draft=8, max_nodes=8, corpus_cap_tokens=CAP, vocab_size=vocab)
    live: dict[int, list] = {}  # rid -> [steps left, context length]
    next_id = 0
    finished = 0
    peak_live_tokens = 0
    max_ctx = 0
    corpus_seen = 0
    total_lifecycles = 4000
    while finished < total_lifecycles:
        while len(live) < 48 and next_id < total_lifecycles:
            t = templates[int(rng.integers(len(templates)))]
            prompt = np.concatenate([t[: int(rng.integers(10, len(t)))], rng.integers(0, vocab, size=5)])
            d.start(next_id, prompt)
            live[next_id] = [int(rng.integers(2, 10)), len(prompt)]
            next_id += 1
        ids = np.fromiter(live, dtype=np.int64, count=len(live))
        drafts = d.propose(ids, 8)
        assert drafts.tokens.shape == (len(ids), 8)
        if rng.random() < 0.2:
            d.propose_tree(ids, 8)
        # Accept a prefix of each draft plus one "bonus" token, as a verifier would.
        lens = []
        chunks = []
        for b, rid in enumerate(ids):
            acc = int(rng.integers(0, int(drafts.lengths[b]) + 1))
            new = np.concatenate([drafts.tokens[b, :acc], rng.integers(0, vocab, size=1)]).astype(np.int64)
            chunks.append(new)
            lens.append(len(new))
            live[int(rid)][1] += len(new)
        d.extend_batch(ids, np.concatenate(chunks), np.array(lens))
        peak_live_tokens = max(peak_live_tokens, sum(v[1] for v in live.values()))
        max_ctx = max(max_ctx, max(v[1] for v in live.values()))
        for rid in list(live):
            live[rid][0] -= 1
            if live[rid][0] <= 0:
                assert d.context_len(rid) == live[rid][1]
                d.finish(rid, donate=True)
                d.remove(rid)
                del live[rid]
                finished += 1
        st = d.corpus_stats()
        assert st["donated_tokens"] <= CAP + 2
        corpus_seen = max(corpus_seen, st["bytes"])
        # Bounded: live automata (<= 200 B/token, plus small per-request overhead) + corpus (<= 2 generations).
        bound = (BYTES_PER_TOKEN * sum(v[1] for v in live.values()) + 2048 * len(live)
                 + BYTES_PER_TOKEN * 2 * (CAP + 2) + (1 << 16))
        assert d.memory_bytes() <= bound
    assert len(d) == 0 and next_id == total_lifecycles
    st = d.corpus_stats()
    assert st["rotations"] >= 2  # generations were evicted, not just filled
    # Everything but the corpus is gone: what is left is the corpus plus the (empty) request table.
    assert d.memory_bytes() - st["bytes"] < 64 * 1024
    assert st["bytes"] <= BYTES_PER_TOKEN * 2 * (CAP + 2)
