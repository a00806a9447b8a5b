"""SIMULATED model drafter on real text, and the real-text workloads of the realistic replay.

Why simulated: the only real EAGLE head here (SmolLM2-135M's) accepts ~0.4 tokens per step, far from the EAGLE-3
heads the paper measured on 8B models; the result then says little about the regime we ship for. So the realistic
replay runs real text (code edits between package releases, ShareGPT assistant turns, a mixed stream; `bench.data`)
with a model drafter whose strength is a stated parameter, and keeps the real SmolLM2 trace as the "real, small" row.

The simulated drafter (writes ordinary trace rows ``eagle_tokens`` / ``eagle_probs``, row p = the chain drafted
after output[:p]):

* token j of row p predicts output[p + j]; given that tokens 0..j-1 were right, it is right with probability
  ``c[p, j]``, its reported draft probability (so the confidence is calibrated by construction: P(right | c) = c);
* ``c`` is drawn from Beta(a * kappa, (1 - a) * kappa): mean ``a``, the same at every depth (flat per-position
  acceptance, as EAGLE-3 reports), informative but noisy (kappa = `KAPPA`);
* ``a = alpha`` except where a long n-gram match predicts the next token (our n-gram drafter, fresh at position
  q = p + j, has a match of at least `COPY_MATCH` tokens and its first token is output[q]): there ``a = alpha_copy``
  (real heads copy well from context);
* a wrong token is a different real-vocabulary token (never accepted); past the end of the output tokens are 0.
"""
from __future__ import annotations

import copy
import functools
from typing import List

import numpy as np

from bench import data
from bench.replay.traces import TraceRequest

KAPPA = 6.0          # Beta concentration of the simulated confidences
COPY_MATCH = 4       # "long" n-gram match: at least this many context tokens matched
VOCAB = 100_277      # cl100k
#: P(the target's token is the EAGLE head's r-th candidate | none of its r - 1 better ones is), r = 2..8: MEASURED on
#: the only real EAGLE head here (SmolLM2-135M's, its first draft token at the 4,058 output positions of the real
#: trace; ``python -m bench.replay.eagle_ranks``). The simulated trees' later candidates use them
#: (`SimulatedEagleTrees`); rank 1 is the simulated chain's own draw.
RANK_HIT = (0.230, 0.155, 0.116, 0.090, 0.069, 0.067, 0.054)


def real_text_requests(n: int, seed: int, out_tokens: int, k: int, edit_dense: bool = True) -> tuple:
    """(requests as `TraceRequest` with empty EAGLE rows, {workload: indices}): ``n`` code-edit windows ("code",
    copy-heavy: most are verbatim copies of the old file), ``n`` edit-dense code windows ("code-edit": each holds a
    changed line, from releases further apart; with ``edit_dense``), ``n`` ShareGPT assistant turns (outputs cut at
    ``out_tokens``) and a mixed workload of the first n/2 of the copy-heavy code and of the chats."""
    code = data.code_edit_windows(n, seed=seed, out_tokens=out_tokens)
    dense = data.code_edit_windows(n, seed=seed, out_tokens=out_tokens, edit_dense=True) if edit_dense else []
    chat = data.chat_requests(n, seed=seed, max_output=out_tokens)
    reqs: List[TraceRequest] = []
    for r in code + dense + chat:
        L = len(r.output)
        reqs.append(TraceRequest(r.id, r.workload, np.asarray(r.prompt, np.int32), np.asarray(r.output, np.int32),
                                 np.zeros((L, k), np.int32), np.zeros((L, k), np.float32)))
    nc, nd, nh = len(code), len(dense), len(chat)
    groups = {"code": list(range(nc)), "chat": list(range(nc + nd, nc + nd + nh)),
              "mixed": list(range(nc // 2)) + list(range(nc + nd, nc + nd + nh // 2))}
    if nd:
        groups["code-edit"] = list(range(nc, nc + nd))
    return reqs, groups


def verbatim_in_prompt(prompt: np.ndarray, output: np.ndarray) -> bool:
    """Whether ``output`` occurs as a contiguous run of tokens in ``prompt``."""
    p, o = np.ascontiguousarray(prompt, np.int32).tobytes(), np.ascontiguousarray(output, np.int32).tobytes()
    i = p.find(o)
    while i >= 0 and i % 4:                     # token-aligned matches only
        i = p.find(o, i + 1)
    return i >= 0


def edit_density(bank, flags: np.ndarray, idx) -> tuple:
    """(share of copy positions, share of requests whose whole output is a verbatim run of their prompt) over the
    requests ``idx`` of ``bank`` (`copy_flags` rows): how much of a workload a copying drafter could draft."""
    rows = np.concatenate([np.arange(bank.offset[i], bank.offset[i] + bank.lengths[i]) for i in idx])
    verbatim = np.mean([verbatim_in_prompt(bank.requests[i].prompt, bank.requests[i].output) for i in idx])
    return float(flags[rows].mean()), float(verbatim)


def copy_flags(bank) -> np.ndarray:
    """bool per bank row: a long n-gram match (fresh, at that position) predicts the row's next output token."""
    d = bank.ensure("ngram")
    truth = bank.out_pad[bank.out_off.repeat(bank.lengths) + _positions(bank)]
    return (d["lengths"] > 0) & (d["tokens"][:, 0] == truth) & (d["match_len"][:, 0] >= COPY_MATCH)


def _positions(bank) -> np.ndarray:
    return np.concatenate([np.arange(n) for n in bank.lengths]).astype(np.int64)


def _strength(bank, flags: np.ndarray, alpha: float, alpha_copy: float, k: int, rows=None) -> tuple:
    """(a, inside, truth), each [R, k], for bank rows ``rows`` (default all): the simulated drafter's mean strength
    at depth j (``alpha_copy`` where a long n-gram match predicts that position, else ``alpha``), whether position
    p + j is inside the output, and the output token there (padding past the end)."""
    total = int(bank.lengths.sum())
    rows = np.arange(total) if rows is None else np.asarray(rows, np.int64)
    req = np.searchsorted(bank.offset, rows, side="right") - 1           # the request each row belongs to
    pos = rows - bank.offset[req]
    j = np.arange(k)[None, :]
    q = pos[:, None] + j                                                  # predicted output position
    inside = q < bank.lengths[req][:, None]
    flag_idx = np.minimum(rows[:, None] + j, total - 1)                  # row of position q in the same request
    cf = np.where(inside, flags[flag_idx], False)
    return np.where(cf, alpha_copy, alpha), inside, bank.out_pad[bank.out_off[req][:, None] + q]


_QUANTILES = 4096


@functools.lru_cache(maxsize=None)
def _beta_quantiles(mean: float) -> np.ndarray:
    """The Beta(mean * KAPPA, (1 - mean) * KAPPA) distribution's quantiles at (i + 1/2) / `_QUANTILES`."""
    from scipy import stats

    a, b = max(mean * KAPPA, 1e-3), max((1.0 - mean) * KAPPA, 1e-3)
    return stats.beta.ppf((np.arange(_QUANTILES) + 0.5) / _QUANTILES, a, b)


def _beta(rng, mean, shape) -> np.ndarray:
    """Draws of shape ``shape`` from Beta of mean ``mean`` (broadcast to ``shape``) and concentration `KAPPA`, by
    inverse CDF over a table of quantiles (a tree needs ~10^5 draws per request: numpy's Beta sampler was most of
    the replay's tree time)."""
    if 0 in shape:
        return np.empty(shape)
    means, which = np.unique(np.asarray(mean, np.float64), return_inverse=True)
    table = np.stack([_beta_quantiles(float(m)) for m in means])
    return table[np.broadcast_to(which.reshape(np.shape(mean)), shape), rng.integers(0, _QUANTILES, size=shape)]


def simulated_eagle(bank, flags: np.ndarray, alpha: float, alpha_copy: float, k: int, seed: int,
                    burst: float = 0.0) -> tuple:
    """(eagle_tokens int64 [rows, k], eagle_probs float32 [rows, k]) over every row of ``bank`` (module docstring).
    ``burst`` > 0: outcomes correlated along each chain and across positions with the same means
    (`miscalibration.bursty_uniforms`); 0: independent."""
    from bench.replay.miscalibration import bursty_uniforms

    rng = np.random.default_rng([int(seed), int(round(alpha * 1000)), int(round(alpha_copy * 1000)), 7])
    rows = int(bank.lengths.sum())
    a, inside, truth = _strength(bank, flags, alpha, alpha_copy, k)
    conf = rng.beta(np.maximum(a * KAPPA, 1e-3), np.maximum((1.0 - a) * KAPPA, 1e-3)).astype(np.float32)
    right = bursty_uniforms(rng, bank.lengths, k, burst) < conf
    wrong = (np.maximum(truth, 0) + 1 + rng.integers(0, 1000, size=(rows, k))) % VOCAB
    toks = np.where(inside & right, truth, np.where(inside, wrong, 0)).astype(np.int64)
    return toks, np.clip(conf, 1e-4, 1.0 - 1e-4).astype(np.float32)


def max_draft_tokens(steps: int, topk: int) -> int:
    """The most ``num_draft_tokens`` (root included) SGLang's tree rule can verify: the root, its ``topk`` children and
    ``topk`` x ``topk`` candidates from each later step."""
    return 1 + topk + (steps - 1) * topk * topk


class SimulatedEagleTrees:
    """The simulated drafter's EAGLE trees (SGLang's ``--speculative-eagle-topk`` > 1), consistent with its chains.

    SGLang 0.5.23 drafts a tree in ``steps`` forwards: the first gives the root's ``topk`` most likely children; each
    later forward expands each of the ``topk`` best nodes so far (the beams) by its ``topk`` children, scored by the
    product of draft probabilities along the path, and keeps the ``topk`` best of those as the next beams; the
    ``num_draft_tokens - 1`` best-scored nodes of all candidates are verified (``eagle_utils.organize_draft_results``).
    This class builds that tree per output position with the same rule, over simulated candidates:

    * a node whose path so far equals the output ("on the path") at depth j of row p has as its first child the
      simulated chain's token j of row p, with its probability and right/wrong draw (so a tree of ``topk`` = 1 is the
      chain, node for node);
    * its further children take stick-breaking shares of the probability left: the r-th gets the share ``u_r`` of
      what ranks < r left, ``u_r`` ~ Beta with mean `RANK_HIT` [r - 2] (MEASURED: how often the real SmolLM2 EAGLE
      head's r-th candidate is the target's token when its better ones are not), and is the output's token with
      probability ``u_r`` when no better-ranked sibling was (calibrated: P(right) = its probability);
    * a node off the path has children of the same shape, none of them right; its first child's probability is a
      fresh draw of the chain's strength at that depth.

    The chain's own nodes (first children all the way from the root) carry the chain's tokens; the other wrong
    children carry distinct tokens that never equal the output. Each request's trees are a function of
    (seed, strength, the tree's shape, the request), computed when first asked for and kept, so any order of asking
    (a forked cell, a batch stream) sees the same trees.
    """

    def __init__(self, bank, flags, alpha: float, alpha_copy: float, chain_tokens, chain_probs, seed: int):
        self.bank, self.flags = bank, flags
        self.alpha, self.alpha_copy, self.seed = float(alpha), float(alpha_copy), int(seed)
        self.chain_tokens, self.chain_probs = chain_tokens, chain_probs
        self._cache: dict = {}
        for m in (*RANK_HIT, self.alpha, self.alpha_copy):    # tabulated here, before the replay forks its cells
            _beta_quantiles(float(m))

    def rows(self, req, pos, steps: int, topk: int, n_draft: int) -> tuple:
        """(tokens int64 [B, n_draft - 1], parents int64 [B, n_draft - 1]) of the tree drafted after output[:pos] of
        each request ``req`` (parents: -1 = child of the root)."""
        req, pos = np.asarray(req, np.int64), np.asarray(pos, np.int64)
        shape = (int(steps), int(topk), int(n_draft))
        toks = np.empty((len(req), n_draft - 1), np.int64)
        pars = np.empty((len(req), n_draft - 1), np.int64)
        for r in np.unique(req):
            key = (shape, int(r))
            if key not in self._cache:
                self._cache[key] = self._request(int(r), *shape)
            sel = req == r
            toks[sel], pars[sel] = self._cache[key][0][pos[sel]], self._cache[key][1][pos[sel]]
        return toks, pars

    def alternatives(self, req, pos, depth: int, m: int) -> tuple:
        """(tokens int64 [B, depth, m], probs float32 [B, depth, m]): at each of the first ``depth`` positions of the
        chain drafted after output[:pos] of each request ``req``, the simulated head's candidates of ranks 2 to
        ``m + 1`` there, the leaves of ``step.ModelDraft.alt_tokens`` (the worker's setting ``eagle_alternatives``).

        The same rule as the trees' further children of a chain node: the r-th takes the share ``u_r`` (Beta around
        the MEASURED `RANK_HIT`) of the probability its better ones left, and is the output's token, when no better
        one is (the chain's token included, by the chain's own draw), with that share's probability, so each
        candidate's probability is calibrated. Its wrong tokens are distinct from the output's, from each other and
        from the chain's. The draws are per (seed, strength, m, request), independent of the trees' own."""
        req, pos = np.asarray(req, np.int64), np.asarray(pos, np.int64)
        m, depth = int(m), int(depth)
        if not 1 <= m <= len(RANK_HIT):
            raise ValueError(f"EAGLE alternatives m={m}: the simulated ranks go to {len(RANK_HIT) + 1}, so 1 <= m <= "
                             f"{len(RANK_HIT)}")
        if not 0 <= depth <= self.chain_tokens.shape[1]:
            raise ValueError(f"depth {depth} exceeds the simulated chains' {self.chain_tokens.shape[1]}")
        toks = np.empty((len(req), depth, m), np.int64)
        probs = np.empty((len(req), depth, m), np.float32)
        for r in np.unique(req):
            key = ("alternatives", m, int(r))
            if key not in self._cache:
                self._cache[key] = self._alternatives(int(r), m)
            sel = req == r
            toks[sel] = self._cache[key][0][pos[sel], :depth]
            probs[sel] = self._cache[key][1][pos[sel], :depth]
        return toks, probs

    def _alternatives(self, r: int, m: int) -> tuple:
        bank, d = self.bank, self.chain_tokens.shape[1]
        rng = np.random.default_rng([self.seed, int(round(self.alpha * 1000)), int(round(self.alpha_copy * 1000)),
                                     m, r, 13])
        rows = np.arange(bank.offset[r], bank.offset[r] + bank.lengths[r])
        _, inside, truth = _strength(bank, self.flags, self.alpha, self.alpha_copy, d, rows)
        shape = (len(rows), d, m)
        conf = self.chain_probs[rows, :d].astype(np.float64)
        u = np.clip(_beta(rng, np.asarray(RANK_HIT[:m]), shape), 1e-4, 1 - 1e-4)
        later = rng.random(shape) < u
        q = np.empty(shape)
        left = 1.0 - conf
        miss = inside & (self.chain_tokens[rows, :d] != truth)      # the chain's token is not the output's
        hit = np.zeros(shape, bool)
        for c in range(m):
            q[:, :, c] = left * u[:, :, c]
            left = left * (1.0 - u[:, :, c])
            hit[:, :, c] = miss & later[:, :, c]
            miss &= ~hit[:, :, c]
        wrong = (np.maximum(truth, 0)[:, :, None] + 1001 + np.arange(m)[None, None, :]) % VOCAB
        tok = np.where(hit, truth[:, :, None], wrong)
        return tok.astype(np.int64), q.astype(np.float32)

    def _request(self, r: int, steps: int, topk: int, n_draft: int) -> tuple:
        if steps < 1 or topk < 1 or not 2 <= n_draft <= max_draft_tokens(steps, topk):
            raise ValueError(f"EAGLE tree steps={steps} topk={topk} num_draft_tokens={n_draft}: need steps >= 1, "
                             f"topk >= 1 and 2 <= num_draft_tokens <= 1 + topk + (steps - 1) * topk^2")
        if steps > self.chain_tokens.shape[1]:
            raise ValueError(f"EAGLE tree of {steps} steps exceeds the simulated chains' {self.chain_tokens.shape[1]}")
        bank = self.bank
        rng = np.random.default_rng([self.seed, int(round(self.alpha * 1000)), int(round(self.alpha_copy * 1000)),
                                     steps, topk, n_draft, r, 11])
        rows = np.arange(bank.offset[r], bank.offset[r] + bank.lengths[r])
        R, K = len(rows), topk
        a, inside, truth = _strength(bank, self.flags, self.alpha, self.alpha_copy, steps, rows)
        conf = self.chain_probs[rows, :steps].astype(np.float64)
        right = inside & (self.chain_tokens[rows, :steps] == truth)
        scores, onpath, onchain, parents, depth = [], [], [], [], []
        beam_score, beam_on, beam_idx = np.ones((R, 1)), np.ones((R, 1), bool), np.full((R, 1), -1, np.int64)
        beam_chain = np.ones((R, 1), bool)        # the beam is a node of the simulated chain (or the root)
        n_pool = 0
        for d in range(steps):
            P = beam_score.shape[1]
            q = np.empty((R, P, K))
            q[:, :, 0] = np.where(beam_on, conf[:, d:d + 1], np.clip(_beta(rng, a[:, d:d + 1], (R, P)), 1e-4,
                                                                          1 - 1e-4))
            u = np.clip(_beta(rng, np.asarray(RANK_HIT[:K - 1]), (R, P, K - 1)), 1e-4, 1 - 1e-4)
            left = 1.0 - q[:, :, 0]
            for c in range(1, K):
                q[:, :, c] = left * u[:, :, c - 1]
                left = left * (1.0 - u[:, :, c - 1])
            # which child (if any) is the output's token, for beams on the path: the chain's draw for the first, then
            # each later one with probability u given no better one was
            hit = np.zeros((R, P, K), bool)
            hit[:, :, 0] = right[:, d:d + 1]
            miss = ~hit[:, :, 0]
            later = rng.random((R, P, K - 1)) < u
            for c in range(1, K):
                hit[:, :, c] = miss & later[:, :, c - 1]
                miss &= ~hit[:, :, c]
            hit &= beam_on[:, :, None] & inside[:, d:d + 1, None]
            s = (beam_score[:, :, None] * q).reshape(R, P * K)
            scores.append(s)
            onpath.append(hit.reshape(R, P * K))
            chain = np.zeros((R, P, K), bool)
            chain[:, :, 0] = beam_chain
            onchain.append(chain.reshape(R, P * K))
            parents.append(np.repeat(beam_idx, K, axis=1))
            depth.append(np.full(P * K, d))
            keep = np.argpartition(-s, K - 1, axis=1)[:, :K] if s.shape[1] > K else np.arange(K)[None].repeat(R, 0)
            beam_score = np.take_along_axis(s, keep, 1)
            beam_on = np.take_along_axis(onpath[-1], keep, 1)
            beam_chain = np.take_along_axis(onchain[-1], keep, 1)
            beam_idx = keep + n_pool
            n_pool += P * K
        score, on, parent = np.concatenate(scores, 1), np.concatenate(onpath, 1), np.concatenate(parents, 1)
        chain_node = np.concatenate(onchain, 1)
        dep = np.concatenate(depth)
        # the n_draft - 1 best-scored candidates, in pool order (parents before children: a child's score is below
        # its parent's, so every chosen node's parent is chosen too)
        chosen = np.sort(np.argpartition(-score, n_draft - 2, axis=1)[:, :n_draft - 1], axis=1)
        where = np.full((R, n_pool), -1, np.int64)
        np.put_along_axis(where, chosen, np.arange(n_draft - 1)[None, :].repeat(R, 0), 1)
        par_pool = np.take_along_axis(parent, chosen, 1)
        par = np.where(par_pool < 0, -1, np.take_along_axis(where, np.maximum(par_pool, 0), 1))
        if (par_pool >= 0).any() and (par[par_pool >= 0] < 0).any():
            raise AssertionError("a chosen tree node's parent was not chosen")
        d_of = dep[chosen]
        t_at = np.take_along_axis(truth, d_of, 1)
        # the chain's own nodes keep its tokens (right or wrong); other wrong candidates get tokens outside the range
        # the chain's wrong tokens are drawn from, so siblings never share one
        tok = np.where(np.take_along_axis(on, chosen, 1), t_at, (np.maximum(t_at, 0) + 1001 + chosen) % VOCAB)
        tok = np.where(np.take_along_axis(chain_node, chosen, 1),
                       np.take_along_axis(self.chain_tokens[rows, :steps], d_of, 1), tok)
        return tok.astype(np.int64), par.astype(np.int64)


def with_eagle(bank, tokens: np.ndarray, probs: np.ndarray, trees: "SimulatedEagleTrees | None" = None):
    """A view of ``bank`` (sharing its model-free drafts) with these EAGLE rows (and, when given, these trees)."""
    b = copy.copy(bank)
    b.eagle_tokens, b.eagle_probs = tokens, probs
    b.eagle_trees = trees
    b.eagle_alt = trees         # the simulated head's alternatives belong to its trees, not to the bank's trace
    return b
