"""A greedy HYBRID decode on the device, token for token against plain greedy decoding of the same model.

The reference loop (``sglang_hybrid.reference.loop``) is a CPU loop. This one runs every per-step piece the worker
runs on the device -- ``HybridStep.select`` (ring write, alignment of published n-gram proposals, calibration, price,
selection), ``verify_nodes`` / ``tree_links_torch`` / ``full_mask`` (the verify input: the forward reads its positions
and each request's FULL_MASK block as the attention mask), ``verify.greedy_accept``, ``HybridStep.after_verify`` --
around a small random-weight decoder (``bench.device.decoder.Target``, fp32), one verify forward per request over its
own KV cache, accepted nodes compacted into the cache. Plain greedy decoding (one token per forward, the same model)
is the oracle; the output must be equal token for token.

With ``ragged=True`` the verify takes the ragged path instead: ``ragged.layout.build_ragged_layout`` packs
each request's own nodes and tree mask, the forward reads the compact rows (``gather_rows`` of the node tokens and
positions; request ``i``'s rows ``qo_indptr[i]..qo_indptr[i+1]``, its mask block at ``mask_indptr[i]``), and the logits
go back to their padded rows (``scatter_rows``) for ``greedy_accept``: a wrong count, offset or scatter changes the
output.

Drafts: losslessness must hold whatever is drafted, but a check where nothing is accepted proves little. So both
drafts are the oracle's continuation with tokens replaced at random (EAGLE chain: 25 %, n-gram proposal: 15 % and a
random length), giving accepted paths of every length, wrong branches, and rows without an n-gram proposal.
"""
from __future__ import annotations

import torch

from bench.device.decoder import Dims, Target

DIMS = Dims(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=96)


class _Req:
    def __init__(self, model: Target, prompt: list, max_len: int, dev):
        shape = (1, model.dims.kv_heads, max_len, model.dims.head_dim)
        self.k = [torch.zeros(shape, device=dev) for _ in range(model.dims.layers)]
        self.v = [torch.zeros(shape, device=dev) for _ in range(model.dims.layers)]
        self.length = 0            # tokens in the KV cache (the root is not)
        self.root = prompt[-1]
        self.out: list = []

    def forward(self, model: Target, tokens, positions, mask):
        """Verify ``tokens [n]`` at ``positions [n]`` with ``mask [n, length + n]``; their K/V land at ``length..``."""
        model.k, model.v = self.k, self.v
        return model.verify(tokens[None], positions[None], mask[None, None], self.length)[0]

    def keep(self, nodes: torch.Tensor) -> None:
        """Keep tree nodes ``nodes`` (root first, increasing) of the last forward: cache positions length + nodes."""
        src = self.length + nodes
        dst = torch.arange(self.length, self.length + nodes.numel(), device=nodes.device)
        for kv in self.k + self.v:
            kv[:, :, dst] = kv[:, :, src]
        self.length += nodes.numel()


def _model(dev) -> Target:
    return Target(DIMS, dev, torch.float32, max_batch=1, max_len=1, seed=5)


def _prefill(model: Target, prompt: list, max_len: int, dev) -> _Req:
    r = _Req(model, prompt, max_len, dev)
    n = len(prompt) - 1
    if n:
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        r.forward(model, torch.tensor(prompt[:-1], device=dev), torch.arange(n, device=dev), causal)
        r.length = n
    return r


@torch.inference_mode()
def plain_greedy(model: Target, prompt: list, new_tokens: int, dev) -> list:
    r = _prefill(model, prompt, len(prompt) + new_tokens + 1, dev)
    one = torch.ones(1, 1, dtype=torch.bool, device=dev)
    while len(r.out) < new_tokens:
        mask = one.expand(1, r.length + 1)
        logits = r.forward(model, torch.tensor([r.root], device=dev), torch.tensor([r.length], device=dev), mask)
        r.keep(torch.zeros(1, dtype=torch.int64, device=dev))
        r.root = int(logits[0].argmax())
        r.out.append(r.root)
    return r.out


def _corrupt(tokens: list, rate: float, g: torch.Generator) -> list:
    return [t if float(torch.rand(1, generator=g)) >= rate else int(torch.randint(0, DIMS.vocab, (1,), generator=g))
            for t in tokens]


@torch.inference_mode()
def hybrid_greedy(model: Target, prompts: list, new_tokens: int, oracle: list, dev, mode: str = "merge",
                  seed: int = 0, ragged: bool = False) -> tuple[list, dict]:
    """HYBRID greedy decoding of ``prompts`` (all requests in one batch until each has ``new_tokens``); ``ragged``:
    verify through the ragged layout (module docstring)."""
    from bench.device.selection import NUM_STEPS, NGRAM_K
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep
    from sglang_hybrid.sglang_plugin.tree_mask import full_mask, tree_links_torch, verify_nodes
    from sglang_hybrid.verify import greedy_accept

    b = len(prompts)
    step = HybridStep(HybridSettings(mode=mode, ngram_k=NGRAM_K), num_steps=NUM_STEPS, pool_size=b, device=dev)
    w, pw = step.n_nodes + 1, step.proposal_width
    g = torch.Generator().manual_seed(seed)
    max_len = max(len(p) for p in prompts) + (w + 1) * new_tokens + w
    reqs = [_prefill(model, p, max_len, dev) for p in prompts]
    slots = torch.arange(b, device=dev)
    gen = torch.ones(b, dtype=torch.int64, device=dev)
    stats = {"steps": 0, "accepted": 0, "max_accepted": 0, "width": w}

    def ahead(i, n):  # the oracle's next n tokens after what request i has emitted (random past its end)
        t = oracle[i][len(reqs[i].out):len(reqs[i].out) + n]
        return t + torch.randint(0, DIMS.vocab, (n - len(t),), generator=g).tolist()

    while any(len(r.out) < new_tokens for r in reqs):
        seq_lens = torch.tensor([r.length for r in reqs], device=dev)
        root = torch.tensor([r.root for r in reqs], device=dev)
        model_tokens = torch.tensor([_corrupt(ahead(i, NUM_STEPS), 0.25, g) for i in range(b)], device=dev)
        model_conf = torch.rand((b, NUM_STEPS), generator=g).to(dev)
        # n-gram proposals published for this step (computed at the current length: no shift)
        tok = torch.tensor([_corrupt(ahead(i, pw), 0.15, g) for i in range(b)], device=dev)
        length = torch.randint(0, pw + 1, (b,), generator=g).to(dev)
        feats = [torch.randint(lo, hi, (b, pw), generator=g).to(dev) for lo, hi in ((0, 40), (1, 4), (4, 8), (0, 2))]
        alignment.publish(step.buffers, slots, tok, length, seq_lens + 1, gen, *feats)
        out = step.select(root, model_tokens, model_conf, slots, gen, seq_lens)
        tree = out.tree if hasattr(out, "tree") else out
        draft_token, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
        positions, _, _, _ = tree_links_torch(anc, seq_lens)
        lens = [r.length for r in reqs]
        if ragged:
            logits = _ragged_verify(model, reqs, tree.valid, anc, draft_token, positions, seq_lens, lens, w)
        else:
            nvalid = tree.valid.sum(1).tolist()
            mask = full_mask(anc, seq_lens, sum(lens))
            logits = torch.zeros(b, w, DIMS.vocab, device=dev)
            start = 0
            for i, r in enumerate(reqs):
                n, L = nvalid[i], lens[i]
                block = mask[start:start + w * (L + w)].view(w, L + w)
                start += w * (L + w)
                logits[i, :n] = r.forward(model, draft_token.view(b, w)[i, :n], positions.view(b, w)[i, :n],
                                          block[:n, :L + n])
        acc = greedy_accept(tree, logits)
        accept_len, bonus = acc.accept_len.tolist(), acc.bonus.tolist()
        d = step.max_depth + 1
        emitted = torch.full((b, d), -1, dtype=torch.int64, device=dev)
        for i, r in enumerate(reqs):
            m = accept_len[i]
            path = acc.accepted_nodes[i, :1 + m]
            toks = tree.tokens[i, path[1:]].tolist() + [bonus[i]]
            emitted[i, :len(toks)] = torch.tensor(toks, device=dev)
            r.out.extend(toks)
            r.keep(path)
            r.root = bonus[i]
            stats["accepted"] += m
            stats["max_accepted"] = max(stats["max_accepted"], m)
        step.after_verify(tree, slots, seq_lens, emitted, acc.accept_len + 1)
        stats["steps"] += 1
    return [r.out[:new_tokens] for r in reqs], stats


def _ragged_verify(model: Target, reqs: list, valid, anc, draft_token, positions, seq_lens, lens: list, w: int):
    """The verify forward over the ragged layout: compact rows in, padded ``[B, W, V]`` logits out."""
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, gather_rows, node_counts, scatter_rows

    b = len(reqs)
    counts = node_counts(valid)
    total, max_nodes = (int(v) for v in torch.stack([counts.sum(), counts.max()]).tolist())
    lay = build_ragged_layout(valid, anc, seq_lens, sum(lens), counts, total, max_nodes)
    tokens, pos = gather_rows(draft_token.reshape(-1), lay), gather_rows(positions.reshape(-1), lay)
    qo, mi = lay.qo_indptr.tolist(), lay.mask_indptr.tolist()
    compact = torch.zeros(total, DIMS.vocab, device=valid.device)
    for i, r in enumerate(reqs):
        n, L = qo[i + 1] - qo[i], lens[i]
        block = lay.custom_mask[mi[i]:mi[i] + n * (L + n)].view(n, L + n).bool()
        compact[qo[i]:qo[i + 1]] = r.forward(model, tokens[qo[i]:qo[i + 1]], pos[qo[i]:qo[i + 1]], block)
    return scatter_rows(compact, lay).view(b, w, DIMS.vocab)


def check(dev, n_prompts: int, new_tokens: int, log) -> dict:
    """Both HYBRID modes against plain greedy on ``dev``."""
    dev = torch.device(dev)
    model = _model(dev)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, DIMS.vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 20, (n_prompts,), generator=g)]
    oracle = [plain_greedy(model, p, new_tokens, dev) for p in prompts]
    rec = {"device": str(dev), "prompts": n_prompts, "new_tokens": new_tokens, "modes": {}}
    for name, mode, ragged in (("merge", "merge", False), ("choose", "choose", False), ("merge ragged", "merge", True)):
        outs, stats = hybrid_greedy(model, prompts, new_tokens, oracle, dev, mode=mode, ragged=ragged)
        first = [next((j for j, (a, c) in enumerate(zip(o, x)) if a != c), None) for o, x in zip(outs, oracle)]
        equal = all(o == x for o, x in zip(outs, oracle))
        rec["modes"][name] = dict(stats, equal_to_plain_greedy=equal,
                                  first_difference=[f for f in first if f is not None][:3])
        log(f"  {dev.type} decode {name:<12} W={stats['width']:<2}: "
            f"{'== plain greedy' if equal else 'DIFFERS from plain greedy at ' + str(first)} ({n_prompts} requests x "
            f"{new_tokens} tokens in {stats['steps']} steps, {stats['accepted']} draft tokens accepted, up to "
            f"{stats['max_accepted']} per step)")
    return rec
