"""Drafter adapters for the CPU reference loop: the EAGLE head with per-request KV state, and the n-gram drafter.

The EAGLE adapter keeps, per request, the head's KV cache over the committed pairs `(f_t, x_{t+1})` and the head
output `g` of the last pair (which approximates the feature of the root token). Drafting runs the head
autoregressively on its own outputs and then rolls its cache back, so only committed pairs persist — the same
protocol as SGLang's EAGLE worker (draft, then draft-extend with the target's features of the accepted tokens).

The n-gram adapter is a thin shim over `sglang_hybrid.ngram.NgramDrafter` (the exact drafter the SGLang worker
uses) that converts its numpy output into the torch tensors the shared core consumes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sglang_hybrid.reference.eagle import EagleHead


@dataclass
class _HeadState:
    cache: tuple[torch.Tensor, torch.Tensor] | None  # (k, v) [1, kvh, P, d]
    n_pairs: int
    g_last: torch.Tensor | None  # [h]


class EagleDrafter:
    """Chain drafts from an EAGLE head sharing the target's embeddings and lm_head.

    `extend(rid, feats [m, h], next_tokens [m])` appends the pairs `(feats[i], next_tokens[i])` (feats are the
    target's post-norm features of committed tokens, next_tokens the committed token after each).
    `propose(rids, k)` -> `(tokens [B, k] int64, probs [B, k] float32, lengths [B] int64)`: greedy (argmax) chain with
    the head's softmax probability of each drafted token; rows of requests without any pair yet have length 0.

    Drafting reads the whole lm_head (vocab x hidden) once per draft step; on a CPU that memory traffic, not the
    one-layer head, is the cost. So a chain step is batched over requests (one lm_head read per step), runs in
    `dtype` (bf16 halves the traffic; drafts are only proposals, so losslessness is unaffected), and a request stops
    drafting once its cumulative draft probability falls below `min_survival` (0 = always `k` tokens).
    """

    def __init__(self, head: EagleHead, target, dtype: torch.dtype | None = None, min_survival: float = 0.0):
        own = next(head.parameters()).dtype
        dtype = dtype or own
        self.head = (head if dtype == own else copy.deepcopy(head).to(dtype)).eval()  # never mutate the caller's
        self.dtype = dtype
        self.embed_w = target.get_input_embeddings().weight.detach().to(dtype)
        self.lm_w = target.get_output_embeddings().weight.detach().to(dtype)
        self.min_survival = float(min_survival)
        self.states: dict[int, _HeadState] = {}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.long(), self.embed_w)

    def start(self, rid: int) -> None:
        if rid in self.states:
            raise KeyError(f"request {rid} already started in the EAGLE drafter")
        self.states[rid] = _HeadState(None, 0, None)

    def remove(self, rid: int) -> None:
        self.states.pop(rid, None)

    @torch.no_grad()
    def extend(self, rid: int, feats: torch.Tensor, next_tokens: torch.Tensor) -> None:
        st = self.states[rid]
        m = feats.shape[0]
        if m == 0:
            return
        pos = torch.arange(st.n_pairs, st.n_pairs + m)[None]
        emb = self.embed(next_tokens[None])
        g, cache = self.head(emb, feats.to(self.dtype)[None], pos, cache=st.cache)
        self.states[rid] = _HeadState(cache, st.n_pairs + m, g[0, -1])

    @torch.no_grad()
    def _chains(self, states: list, k: int, min_survival: float, alternatives: int = 0):
        """Greedy chains for several head states at once: per state a list of tokens and of probabilities, and, when
        ``alternatives`` = M > 0, per state and chain position the same forward's ranks 2 to M + 1 (tokens and
        probabilities: the SGLang worker's setting ``eagle_alternatives`` hangs those as leaves)."""
        A = len(states)
        toks = [[] for _ in range(A)]
        probs = [[] for _ in range(A)]
        alt_toks = [[] for _ in range(A)]
        alt_probs = [[] for _ in range(A)]
        G = torch.stack([st.g_last for st in states])  # [A, h]
        caches = [st.cache for st in states]
        surv = [1.0] * A
        live = list(range(A))
        for i in range(k):
            p = F.linear(G[live], self.lm_w).float().softmax(-1)
            pv, tv = p.max(-1)
            if alternatives:        # the chain's token taken out, the next M remain (distinct, as the worker's)
                av, at = p.scatter(-1, tv[:, None], -1.0).topk(alternatives, dim=-1)
            nxt = []
            for j, a in enumerate(live):
                q = float(pv[j])
                toks[a].append(int(tv[j]))
                probs[a].append(q)
                if alternatives:
                    alt_toks[a].append(at[j].tolist())
                    alt_probs[a].append(av[j].tolist())
                surv[a] *= q
                if surv[a] >= min_survival:
                    nxt.append(a)
            live = nxt
            if i + 1 == k or not live:
                break
            G = G.clone()
            for a in live:
                emb = self.embed(torch.tensor([[toks[a][-1]]]))
                out, caches[a] = self.head(emb, G[a][None, None], torch.tensor([[states[a].n_pairs + i]]),
                                           cache=caches[a])
                G[a] = out[0, -1]
        if alternatives:
            return toks, probs, alt_toks, alt_probs
        return toks, probs

    def propose(self, rids, k: int):
        B = len(rids)
        tokens = torch.full((B, k), -1, dtype=torch.int64)
        probs = torch.zeros((B, k), dtype=torch.float32)
        lengths = torch.zeros(B, dtype=torch.int64)
        rows = [b for b, rid in enumerate(rids) if self.states[rid].g_last is not None]
        if not rows or k == 0:
            return tokens, probs, lengths
        toks, prs = self._chains([self.states[rids[b]] for b in rows], k, self.min_survival)
        for b, t, p in zip(rows, toks, prs):
            tokens[b, :len(t)] = torch.tensor(t)
            probs[b, :len(p)] = torch.tensor(p)
            lengths[b] = len(t)
        return tokens, probs, lengths

    @torch.no_grad()
    def trace_rows(self, feats: torch.Tensor, tokens: torch.Tensor, n_prompt: int, k: int, alternatives: int = 0):
        """EAGLE chains after committing `tokens[:n]` for every `n = n_prompt .. len(tokens)-1` (always `k` long, so
        a replay can simulate any cut-off).

        `feats [L, h]` are the target's teacher-forced features of `tokens [L]` (causal, so they equal the features
        the loop sees incrementally). Row `p` drafts guesses for `tokens[n_prompt + p], ...`.
        Returns `(tok [P, k] int64, prob [P, k] float32)`, and with `alternatives` = M > 0 also
        `(alt_tok [P, k, M] int64, alt_prob [P, k, M] float32)`: at each chain position the same forward's ranks 2 to
        M + 1 (`_chains`). Rows without a committed pair (n < 2) hold -1 tokens and probability 0.
        """
        L = tokens.shape[0]
        m = int(alternatives)
        emb = self.embed(tokens[1:][None])
        g_all, (kc, vc) = self.head(emb, feats.to(self.dtype)[None, :-1], torch.arange(L - 1)[None])
        rows = [[], [], [], []]                 # tokens, probs, alternatives' tokens, alternatives' probs
        blank = ([-1] * k, [0.0] * k, [[-1] * m] * k, [[0.0] * m] * k)
        ns = list(range(n_prompt, L))
        # the positions' chains are independent: draft them `chunk` at a time, so each chain step reads the lm_head
        # once for the whole chunk instead of once per position (the lm_head read is the cost on a CPU)
        chunk = 64
        for c in range(0, len(ns), chunk):
            part = ns[c:c + chunk]
            states = [_HeadState((kc[:, :, :n - 1], vc[:, :, :n - 1]), n - 1, g_all[0, n - 2])
                      for n in part if n >= 2]  # n - 1 pairs committed: (f_t, x_{t+1}) for t < n - 1
            got = self._chains(states, k, 0.0, m) if states else ()
            it = iter(zip(*got))
            for n in part:
                for dst, src in zip(rows, blank if n < 2 else next(it)):
                    dst.append(src)
        tok = torch.tensor(rows[0], dtype=torch.int64).reshape(-1, k)
        prob = torch.tensor(rows[1], dtype=torch.float32).reshape(-1, k)
        if not m:
            return tok, prob
        return tok, prob, torch.tensor(rows[2], dtype=torch.int64).reshape(-1, k, m), \
            torch.tensor(rows[3], dtype=torch.float32).reshape(-1, k, m)


class NgramSource:
    """Shim over `sglang_hybrid.ngram.NgramDrafter`: same lifecycle, torch outputs for the shared core."""

    def __init__(self, max_draft: int = 8, **kwargs):
        from sglang_hybrid.ngram import NgramDrafter

        self.d = NgramDrafter(max_draft=max_draft, **kwargs)

    def start(self, rid: int, prompt) -> None:
        self.d.start(rid, np.ascontiguousarray(np.asarray(prompt, dtype=np.int32)))

    def extend(self, rid: int, tokens) -> None:
        if len(tokens):
            self.d.extend(rid, np.ascontiguousarray(np.asarray(tokens, dtype=np.int32)))

    def finish(self, rid: int, donate: bool = False) -> None:
        self.d.finish(rid, donate=donate)
        self.d.remove(rid)

    def propose(self, rids, k: int, tree: bool = False) -> dict:
        """Chain (`tree=False`, parents `j-1`) or tree of `k` nodes; all fields as int64 torch tensors."""
        ids = np.ascontiguousarray(np.asarray(rids, dtype=np.int64))
        dr = self.d.propose_tree(ids, k) if tree else self.d.propose(ids, k)
        t = lambda a: torch.as_tensor(np.asarray(a)).to(torch.int64)  # noqa: E731
        out = {"tokens": t(dr.tokens), "lengths": t(dr.lengths), "match_len": t(dr.match_len),
               "count": t(dr.count), "total": t(dr.total), "source": t(dr.source)}
        B, K = out["tokens"].shape
        if tree:
            out["parents"] = t(dr.parents)
            out["depth"] = t(dr.depth)
        else:
            j = torch.arange(K, dtype=torch.int64)[None].expand(B, K)
            valid = j < out["lengths"][:, None]
            out["parents"] = torch.where(valid, j - 1, torch.full_like(j, -1))
            out["depth"] = torch.where(valid, j + 1, torch.zeros_like(j))
        return out
