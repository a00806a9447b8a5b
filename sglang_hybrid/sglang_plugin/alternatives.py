"""The EAGLE side's alternatives (setting ``eagle_alternatives``): the draft model's next ``M`` most likely tokens at
each chain position, hung as leaves beside the chain's own token (``step.ModelDraft.alt_tokens``).

Why: a chain drafted with ``topk = 1`` is wrong at some position on most steps, and where it is, the draft model's
second or third choice is often right (docs/benchmarks.md measures the rates); an EAGLE tree's edge over a chain at
small batches comes from those candidates. Here they cost no draft forward: each forward that yields a chain token
already holds the distribution they come from. The price decides which are verified.

Where they come from, per position of a step's chain:

* position 0: the previous step's draft extend (its logits give the next step's first token). Those rows are the
  previous batch's, and the batch may change in between (requests finish, join, are retracted), so they are kept per
  request slot, tagged with the slot's generation (``FirstAlternatives``): a row whose tag is not the request's has
  none this step (its probabilities read 0, so the decision never selects them), as after the request's prefill;
* positions 1 and up: the chain's own draft forwards, recorded inside the draft (``HybridDraftWorker._record``, so
  the draft's CUDA graph captures it).

Each row holds the top ``M + 1`` of the distribution; the chain's own token is taken out (``exclude_chain``), which
leaves ``M`` tokens distinct from each other and from the chain's, as the fused decision assumes. Static shapes and
no host read: capturable, and free of data-dependent branches.
"""
from __future__ import annotations

from typing import Optional

import torch


def top_tokens(probs: torch.Tensor, m: int, hot_token_id: Optional[torch.Tensor] = None):
    """The ``m + 1`` most likely tokens of each row of ``probs [N, V]`` (a softmax the caller already takes for the
    chain's own confidence, so it is taken once): ``(probabilities [N, m + 1] float32, tokens [N, m + 1] int64)``,
    most likely first. ``hot_token_id``: the draft's reduced-vocabulary map (EAGLE-3, or a token map), through which
    SGLang turns a draft index into a target token id."""
    p, i = probs.float().topk(m + 1, dim=-1)
    if hot_token_id is not None:
        i = hot_token_id[i]
    return p, i.to(torch.int64)


def exclude_chain(top_p: torch.Tensor, top_i: torch.Tensor, chain: torch.Tensor, m: int):
    """The ``m`` alternatives at each chain position: ``top_p`` / ``top_i`` ``[B, S, m + 1]`` without the chain's own
    token (``chain [B, S]``), in their order. Where the chain's token is not among them (a tie at the top broken the
    other way, or a position with none recorded) the last is dropped instead. Returns ``(tokens [B, S, m] int64,
    probabilities [B, S, m] float32)``."""
    other = (top_i != chain.to(top_i.dtype)[:, :, None]).to(torch.int8)
    keep = torch.sort(other, dim=-1, descending=True, stable=True).indices[:, :, :m]
    return top_i.gather(-1, keep).to(torch.int64), top_p.gather(-1, keep).to(torch.float32)


class FirstAlternatives:
    """Position 0's top tokens per request slot, from the draft extend that produced the next step's first token,
    tagged with the slot generation they belong to (-1: none)."""

    def __init__(self, pool_size: int, m: int, device):
        self.m = m
        self.probs = torch.zeros((pool_size, m + 1), dtype=torch.float32, device=device)
        # distinct placeholders in rows never written (probability 0, so never selected): the fused decision assumes
        # a row's alternatives distinct
        self.tokens = torch.arange(m + 1, dtype=torch.int64, device=device).repeat(pool_size, 1)
        self.gen = torch.full((pool_size,), -1, dtype=torch.int64, device=device)

    def record(self, slots: torch.Tensor, gens: torch.Tensor, probs: torch.Tensor, tokens: torch.Tensor) -> None:
        """Keep each row's top tokens (``top_tokens``) under its slot, for the request of generation ``gens``."""
        idx = slots.to(torch.int64)
        self.probs.index_copy_(0, idx, probs.to(torch.float32))
        self.tokens.index_copy_(0, idx, tokens.to(torch.int64))
        self.gen.index_copy_(0, idx, gens.to(torch.int64))

    def read(self, slots: torch.Tensor, gens: torch.Tensor):
        """Each row's kept top tokens ``(probabilities [B, m + 1], tokens [B, m + 1])``; probabilities 0 where the
        slot holds none for the request of generation ``gens``."""
        idx = slots.to(torch.int64)
        mine = (self.gen[idx] == gens.to(torch.int64))[:, None]
        return torch.where(mine, self.probs[idx], 0.0), self.tokens[idx]


def step_alternatives(first: FirstAlternatives, slots: torch.Tensor, gens: torch.Tensor, recorded_p: torch.Tensor,
                      recorded_i: torch.Tensor, chain: torch.Tensor):
    """A step's alternatives ``(tokens, probabilities)`` ``[B, S, M]`` for the chain ``chain [B, S]``: position 0 from
    ``first``, positions 1 and up from the draft's records ``recorded_p`` / ``recorded_i`` ``[B, >= S, M + 1]``."""
    s = chain.shape[1]
    p0, i0 = first.read(slots, gens)
    top_p = torch.cat([p0[:, None], recorded_p[:, 1:s]], 1)
    top_i = torch.cat([i0[:, None], recorded_i[:, 1:s]], 1)
    return exclude_chain(top_p, top_i, chain, first.m)


def alternatives_outcome(tree, chain: torch.Tensor, emitted: torch.Tensor, accept_lens: torch.Tensor):
    """What the counters report of the alternatives: the verified tree's alternative nodes (a model or shared node
    whose token is not the chain's at its depth) and, per request, whether the accepted path went through one (it left
    the chain where a verified alternative of that depth carried the emitted token). Returns two 0-dim float64
    tensors: nodes verified, requests whose accepted path took one."""
    from sglang_hybrid.selector import Source

    b, w = tree.tokens.shape
    s = chain.shape[1]
    d = tree.depth.clamp(min=1, max=s) - 1
    chain_tok = chain.to(torch.int64).gather(1, d)
    modelish = (tree.source == int(Source.MODEL)) | (tree.source == int(Source.SHARED))
    alt = tree.valid & (tree.depth >= 1) & (tree.depth <= s) & modelish & (tree.tokens != chain_tok)
    alt[:, 0] = False
    # where the accepted path left the chain: the first position whose emitted token is not the chain's
    c = emitted.shape[1]
    n = min(s, c)
    same = (emitted[:, :n].to(torch.int64) == chain[:, :n].to(torch.int64)).to(torch.int64)
    h = torch.cumprod(same, 1).sum(1)                                       # chain tokens accepted
    drafts = (accept_lens.to(torch.int64) - 1).clamp(min=0)
    left = h < torch.minimum(drafts, torch.full_like(drafts, n))           # the path went on past the chain
    tok = emitted.to(torch.int64).gather(1, h.clamp(max=c - 1)[:, None])
    took = (alt & (tree.depth == (h + 1)[:, None]) & (tree.tokens == tok)).any(1) & left
    return alt.sum().to(torch.float64), took.sum().to(torch.float64)


__all__ = ["FirstAlternatives", "alternatives_outcome", "exclude_chain", "step_alternatives", "top_tokens"]
