"""Per-request draft selection under the goodput price -> fixed-width ``VerifyTree``.

The selector is generic over drafters: it takes one ``Candidates`` record per source (the EAGLE chain, the n-gram
chain or tree, any further drafter), each with its nodes' tokens, parents, survivals and lengths, and a ``Source``
value naming who drafted it. Both modes work on one *pool* of candidate nodes per request: every source's nodes in
the order given, then ``n_nodes`` always-invalid filler nodes (so the pool is never narrower than the output and empty
sources need no special case). A node is *eligible* iff it is valid, its survival is positive and at least ``lam``.
Because a child's survival never exceeds its parent's, eligible sets are prefix-closed, and ranking by survival with
ties broken by depth keeps every parent ahead of its children: the first ``n_nodes`` ranked nodes form a prefix-closed
tree in topological order, which is exactly the output layout (node 0 = root, then nodes in rank order).

* ``choose`` (the published rule): per request the source with the largest ``sum_{eligible}(s - lam)`` (ties -> the
  earlier source, so the model when it comes first) supplies all its eligible nodes; the others are masked out.
* ``merge``: nodes whose whole token path equals the path of a node of an earlier source (or an earlier node) are
  folded into that node (its survival becomes the maximum of the estimates; its source ``Source.SHARED`` when the
  folded nodes came from different drafters); the rest hang off their (possibly folded) parents. The top ``n_nodes``
  eligible nodes of the union are kept, so ``merge`` never expects fewer accepted tokens than ``choose``.

Everything is gathers, sorts and pointer jumping over static shapes: no host sync, CUDA-graph and
``torch.compile(fullgraph=True)`` safe.
"""
from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple, Optional, Sequence, Union

import torch

from . import _checks
from .survival import chain_parents, check_parents, path_min, path_sum


class Source(IntEnum):
    """Who drafted a verify-tree node (``VerifyTree.source``, int8). One vocabulary for the core, the engines and
    the reports. A new drafter takes the next free value; ``SHARED`` marks a node that several drafters proposed."""

    NONE = -1      # the root and padding nodes
    MODEL = 0      # the EAGLE draft head
    NGRAM = 1      # the suffix-automaton n-gram drafter
    SHARED = 2     # proposed by more than one source (merge folded identical paths)

    @property
    def label(self) -> str:
        return self.name.lower()


class VerifyTree(NamedTuple):
    """Fixed-width verify tree, ``W = n_nodes + 1``; layout in docs/ARCHITECTURE.md (node 0 = root)."""

    tokens: torch.Tensor            # [B, W] int64, -1 invalid
    parents: torch.Tensor           # [B, W] int64, -1 root/invalid, parents[i] < i
    ancestors: torch.Tensor         # [B, W, W] bool, ancestors[b, i, j]: j on path root..i (inclusive)
    depth: torch.Tensor             # [B, W] int64, root 0
    valid: torch.Tensor             # [B, W] bool, prefix of the row, root always valid
    source: torch.Tensor            # [B, W] int8, Source values (-1 root/invalid)
    survival: torch.Tensor          # [B, W] float32, root 1, invalid 0
    expected_accepted: torch.Tensor  # [B] float32


class Candidates(NamedTuple):
    """One drafter's proposals for a batch: ``K`` nodes per request, a chain or a tree.

    ``tokens [B, K]`` (ignored past ``length``), ``parents [B, K]`` (``-1`` = child of the root, else an earlier
    index: ``parents[b, i] < i``), ``survival [B, K]`` (calibrated probability that the node is accepted),
    ``length [B]`` (valid nodes are the first ``length``), ``source`` (a ``Source`` value).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    survival: torch.Tensor
    length: torch.Tensor
    source: int

    @classmethod
    def chain(cls, tokens: torch.Tensor, survival: torch.Tensor, length: torch.Tensor, source: int) -> "Candidates":
        """A chain: node ``j``'s parent is ``j - 1``."""
        b, k = tokens.shape
        return cls(tokens, chain_parents(b, k, tokens.device), survival, length, source)

    @classmethod
    def empty(cls, batch: int, source: int, device=None) -> "Candidates":
        """No proposals (a drafter that is off, or has nothing this step)."""
        z = torch.zeros((batch, 0), dtype=torch.int64, device=device)
        return cls(z, z, torch.zeros((batch, 0), dtype=torch.float32, device=device),
                   torch.zeros(batch, dtype=torch.int64, device=device), source)


def ancestors_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """``[B, W, W]`` bool ancestor matrix (reflexive) from parents (``-1`` = none), by pointer jumping."""
    b, w = parents.shape
    eye = torch.eye(w, dtype=torch.bool, device=parents.device).expand(b, w, w)
    anc = eye
    up = parents.to(torch.int64)
    for _ in range(max(0, (w - 1).bit_length())):
        has = up >= 0
        idx = up.clamp(min=0)
        rows = torch.gather(anc, 1, idx[:, :, None].expand(b, w, w))
        anc = anc | (rows & has[:, :, None])
        up = torch.where(has, torch.gather(up, 1, idx), up)
    return anc


def _source_name(c: Candidates, idx: int) -> str:
    try:
        return Source(int(c.source)).label
    except ValueError:
        return f"candidates[{idx}]"


def _check_inputs(root_tokens, candidates, lam, mode, n_nodes, check_values):
    _checks.tensor(root_tokens, "root_tokens")
    if mode not in ("choose", "merge"):
        raise ValueError(f"mode must be 'choose' or 'merge', got {mode!r}")
    if not isinstance(n_nodes, int) or isinstance(n_nodes, bool) or n_nodes < 1:
        raise ValueError(f"n_nodes must be a positive int, got {n_nodes!r}")
    if isinstance(candidates, Candidates) or not all(isinstance(c, Candidates) for c in candidates):
        raise TypeError("candidates must be a sequence of Candidates records (one per drafter)")
    if not candidates:
        raise ValueError("candidates must name at least one drafter (use Candidates.empty for one that is off)")
    _checks.int_tensor(root_tokens, "root_tokens", 1)
    b = root_tokens.shape[0]
    _checks.non_empty_batch(b, "root_tokens")
    names, ts = ["root_tokens"], [root_tokens]
    seen = set()
    for idx, c in enumerate(candidates):
        src = int(c.source)
        if src < 0 or src == Source.SHARED:
            raise ValueError(f"candidates[{idx}].source = {src}: a drafter's source must be MODEL, NGRAM or a new "
                             f"value above {int(Source.SHARED)} (NONE and SHARED are reserved)")
        if src in seen:
            raise ValueError(f"candidates[{idx}].source = {src} appears twice: one Candidates record per drafter")
        seen.add(src)
        n = _source_name(c, idx)
        _checks.int_tensor(c.tokens, f"{n}.tokens", 2)
        _checks.int_tensor(c.parents, f"{n}.parents", 2)
        _checks.float_tensor(c.survival, f"{n}.survival", 2)
        _checks.int_tensor(c.length, f"{n}.length", 1)
        _checks.shape(c.tokens, f"{n}.tokens", (b, c.tokens.shape[1]))
        _checks.shape(c.parents, f"{n}.parents", tuple(c.tokens.shape))
        _checks.shape(c.survival, f"{n}.survival", tuple(c.tokens.shape))
        _checks.shape(c.length, f"{n}.length", (b,))
        names += [f"{n}.tokens", f"{n}.parents", f"{n}.survival", f"{n}.length"]
        ts += [c.tokens, c.parents, c.survival, c.length]
    if isinstance(lam, torch.Tensor):
        if lam.dim() != 0 and tuple(lam.shape) != (b,):
            raise ValueError(f"lam must be a 0-dim tensor, a [{b}] tensor (one price per request) or a float, got "
                             f"shape {tuple(lam.shape)}")
        names.append("lam")
        ts.append(lam)
    elif not isinstance(lam, (int, float)):
        raise TypeError(f"lam must be a 0-dim tensor, a [B] tensor or a float, got {type(lam).__name__}")
    _checks.same_device(names, ts)
    if _checks.want_values(check_values, *ts):
        lam_all = lam.reshape(-1).tolist() if isinstance(lam, torch.Tensor) else [float(lam)]
        if any(v != v or v < 0 for v in lam_all):
            raise ValueError(f"lam must be non-negative numbers, got {lam_all}")
        if bool((root_tokens < 0).any()):
            raise ValueError("root_tokens must be non-negative token ids")
        for idx, c in enumerate(candidates):
            n = _source_name(c, idx)
            k = c.tokens.shape[1]
            _checks.lengths(c.length, f"{n}.length", k)
            _checks.probabilities(c.survival, f"{n}.survival")
            v = torch.arange(k, device=c.length.device)[None] < c.length[:, None]
            if bool((v & (c.tokens < 0)).any()):
                raise ValueError(f"{n}.tokens has a negative token id inside {n}.length")
            check_parents(c.parents, v, f"{n}.parents")


def _fold_identical_paths(tok, par, depth, valid, max_depth: int):
    """Merge: fold every node whose token path equals an earlier pool node's path into that node.

    Pool arrays ``[B, P]`` (``par`` = pool index of the parent, ``-1`` for children of the root; ``depth`` = the
    parent's + 1, 1 under the root; no node deeper than ``max_depth``). Returns ``(rep, same)``: ``rep [B, P]`` the
    lowest pool index with the same path (the node itself when unique or invalid) and ``same [B, P, P]`` the
    path-equality relation.

    Two nodes have the same path when they are equal (valid, same token, same depth) at every level from themselves
    up to the root. Built by pointer doubling (why: the decision step's per-step cost is mostly small tensor ops, and
    this takes ``ceil(log2(max_depth))`` rounds where walking up one level per round took ``max_depth``): after round
    ``r``, ``same[i, j]`` says the nodes are equal on their ``2^r`` lowest levels (levels above the root count as
    equal; equal depths mean both run out together), and ``up`` holds each node's ``2^r``-th ancestor. A static
    round count: graph safe.
    """
    b, p = tok.shape
    dev = tok.device
    same = valid[:, :, None] & valid[:, None, :] & (tok[:, :, None] == tok[:, None, :]) & \
        (depth[:, :, None] == depth[:, None, :])
    up = par.to(torch.int64)
    for _ in range(max(0, max_depth - 1).bit_length()):
        has = up >= 0
        ui = up.clamp(min=0)
        # the 2^r-th ancestors' relation, above[i, j] = same[up[i], up[j]], as two gathers (rows, then columns): the
        # same values as one advanced index in 0.8-0.95x its time on the CPU replay's shapes (4-128 rows, 30-48 nodes)
        rows = torch.gather(same, 1, ui[:, :, None].expand(b, p, p))
        above = torch.gather(rows, 2, ui[:, None, :].expand(b, p, p))
        same = same & (above | ~(has[:, :, None] & has[:, None, :]))
        up = torch.where(has, torch.gather(up, 1, ui), up)
    idx = torch.arange(p, device=dev)
    big = torch.full((), p, dtype=torch.int64, device=dev)
    rep = torch.where(same, idx[None, None, :], big).amin(-1)
    rep = torch.where(valid, rep, idx[None, :].expand(b, p))
    return rep, same


def select(root_tokens: torch.Tensor, candidates: Sequence[Candidates], lam: Union[torch.Tensor, float],
           mode: str = "choose", n_nodes: int = 8, check_values: Optional[bool] = None) -> VerifyTree:
    """Build the verify tree of each request from every drafter's ``Candidates`` (see the module docstring and
    docs/core.md). ``candidates`` order matters only for ties: an earlier source wins ``choose`` ties and keeps its
    node when ``merge`` folds identical paths. ``lam``: the price, one for the batch (float or 0-dim tensor) or one
    per request (``[B]``)."""
    _check_inputs(root_tokens, candidates, lam, mode, n_nodes, check_values)
    dev = root_tokens.device
    b = root_tokens.shape[0]
    f32, i64 = torch.float32, torch.int64
    lam_t = lam.to(f32) if isinstance(lam, torch.Tensor) else torch.full((), float(lam), dtype=f32, device=dev)
    if lam_t.dim() == 1:
        lam_t = lam_t[:, None]                          # one price per request (rows priced apart, e.g. stacked)

    # ---- pool: every source's nodes, then filler ----
    toks, pars, survs, depths, valids, srcs, owner = [], [], [], [], [], [], []
    offset = 0
    for si, c in enumerate(candidates):
        k = c.tokens.shape[1]
        j = torch.arange(k, device=dev, dtype=i64)
        v = j[None, :] < c.length.to(i64)[:, None]
        par = torch.where(v, c.parents.to(i64), torch.full_like(v, -1, dtype=i64))
        toks.append(torch.where(v, c.tokens.to(i64), torch.full_like(v, -1, dtype=i64)))
        # survivals never grow along a path; enforcing it (running minimum) keeps every selection prefix-closed even
        # if a caller's estimates are inconsistent
        survs.append(path_min(torch.where(v, c.survival.to(f32), torch.zeros_like(v, dtype=f32)), par))
        depths.append(path_sum(v.to(i64), par))                     # 1-based depth of valid nodes
        pars.append(torch.where(par >= 0, par + offset, par))
        valids.append(v)
        srcs.append(torch.full((b, k), int(c.source), dtype=torch.int8, device=dev))
        owner.append(torch.full((b, k), si, dtype=i64, device=dev))
        offset += k
    p_tok, p_par, p_surv = torch.cat(toks, 1), torch.cat(pars, 1), torch.cat(survs, 1)
    p_depth, p_valid, p_src, p_owner = torch.cat(depths, 1), torch.cat(valids, 1), torch.cat(srcs, 1), \
        torch.cat(owner, 1)

    if mode == "merge" and len(candidates) > 1 and offset > 0:
        max_depth = max(c.tokens.shape[1] for c in candidates)
        rep, same = _fold_identical_paths(p_tok, p_par, p_depth, p_valid, max_depth)
        # a kept node takes the best estimate of its class, and SHARED when another drafter proposed it too
        p_surv = torch.where(same, p_surv[:, :, None], torch.zeros((), dtype=f32, device=dev)).amax(1)
        shared = (same & (p_src[:, :, None] != p_src[:, None, :])).any(1)
        p_src = torch.where(shared, torch.full_like(p_src, int(Source.SHARED)), p_src)
        idx = torch.arange(offset, device=dev)[None, :]
        p_valid = p_valid & (rep == idx)
        # a node whose parent was folded hangs off the node its parent was folded into
        p_par = torch.where(p_par >= 0, torch.gather(rep, 1, p_par.clamp(min=0)), p_par)

    p_elig = p_valid & (p_surv > 0) & (p_surv >= lam_t)
    if mode == "choose" and len(candidates) > 1:
        # float64 sums: sources whose values differ by a float32 rounding step compare the same in any summing order
        gain = torch.where(p_elig, p_surv - lam_t, torch.zeros_like(p_surv)).to(torch.float64)
        values = torch.stack([torch.where(p_owner == si, gain, torch.zeros_like(gain)).sum(1)
                              for si in range(len(candidates))], 1)           # [B, S]
        best = torch.argmax(values, dim=1)                                    # first maximum: earlier source
        p_elig = p_elig & (p_owner == best[:, None])

    fill_i = torch.full((b, n_nodes), -1, dtype=i64, device=dev)
    p_tok = torch.cat([p_tok, fill_i], 1)
    p_par = torch.cat([p_par, fill_i], 1)
    p_surv = torch.cat([p_surv, torch.zeros((b, n_nodes), dtype=f32, device=dev)], 1)
    p_src = torch.cat([p_src, torch.full((b, n_nodes), -1, dtype=torch.int8, device=dev)], 1)
    p_depth = torch.cat([p_depth, torch.zeros((b, n_nodes), dtype=i64, device=dev)], 1)
    p_elig = torch.cat([p_elig, torch.zeros((b, n_nodes), dtype=torch.bool, device=dev)], 1)

    # rank by (survival desc, depth asc, pool index asc): two stable sorts, the primary key last
    key = torch.where(p_elig, p_surv, torch.full_like(p_surv, -1.0))
    big = torch.iinfo(torch.int64).max // 4
    by_depth = torch.sort(torch.where(p_elig, p_depth, torch.full_like(p_depth, big)), dim=1, stable=True).indices
    by_key = torch.sort(torch.gather(key, 1, by_depth), dim=1, descending=True, stable=True).indices
    order = torch.gather(by_depth, 1, by_key)                       # pool indices in rank order
    rank = torch.argsort(order, dim=1)                               # inverse permutation

    n_sel = p_elig.sum(1).clamp(max=n_nodes)
    r = torch.arange(n_nodes, device=dev, dtype=i64)
    out_valid_d = r[None, :] < n_sel[:, None]
    sel = order[:, :n_nodes]
    s_par = torch.gather(p_par, 1, sel)
    s_par_out = torch.where(s_par >= 0, torch.gather(rank, 1, s_par.clamp(min=0)) + 1, torch.zeros_like(s_par))

    neg = torch.full((b, n_nodes), -1, dtype=i64, device=dev)
    d_tokens = torch.where(out_valid_d, torch.gather(p_tok, 1, sel), neg)
    d_parents = torch.where(out_valid_d, s_par_out, neg)
    d_depth = torch.where(out_valid_d, torch.gather(p_depth, 1, sel), torch.zeros_like(neg))
    d_src = torch.where(out_valid_d, torch.gather(p_src, 1, sel), torch.full_like(neg, -1, dtype=torch.int8))
    d_surv = torch.where(out_valid_d, torch.gather(p_surv, 1, sel), torch.zeros((b, n_nodes), dtype=f32, device=dev))

    ones_b = torch.ones((b, 1), dtype=torch.bool, device=dev)
    tokens = torch.cat([root_tokens.to(i64)[:, None], d_tokens], 1)
    parents = torch.cat([torch.full((b, 1), -1, dtype=i64, device=dev), d_parents], 1)
    depth = torch.cat([torch.zeros((b, 1), dtype=i64, device=dev), d_depth], 1)
    valid = torch.cat([ones_b, out_valid_d], 1)
    source = torch.cat([torch.full((b, 1), -1, dtype=torch.int8, device=dev), d_src], 1)
    survival = torch.cat([torch.ones((b, 1), dtype=f32, device=dev), d_surv], 1)
    return VerifyTree(tokens=tokens, parents=parents, ancestors=ancestors_from_parents(parents), depth=depth,
                      valid=valid, source=source, survival=survival, expected_accepted=d_surv.sum(1))


__all__ = ["Candidates", "Source", "VerifyTree", "select", "ancestors_from_parents"]
