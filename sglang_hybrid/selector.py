"""Per-request draft selection under the goodput price -> fixed-width ``VerifyTree``.

Both modes work on one *pool* of candidate nodes per request: the model chain (``Km`` nodes), the n-gram chain or tree
(``Kn`` nodes) and ``n_nodes`` always-invalid filler nodes (so the pool is never narrower than the output and empty
sources need no special case). A node is *eligible* iff it is valid, its survival is positive and at least ``lam``.
Because a child's survival never exceeds its parent's, eligible sets are prefix-closed, and ranking by survival with
ties broken by depth keeps every parent ahead of its children: the first ``n_nodes`` ranked nodes form a prefix-closed
tree in topological order, which is exactly the output layout (node 0 = root, then nodes in rank order).

* ``choose`` (the published rule): per request the source with the larger ``sum_{eligible}(s - lam)`` (ties -> the
  model) supplies all eligible nodes; the other source is masked out.
* ``merge``: n-gram nodes whose token path equals a prefix of the model chain are folded into that model node
  (``source = 2``, survival = max of the estimates); the rest hang off the model chain or the root. The top
  ``n_nodes`` eligible nodes of the union are kept, so ``merge`` never expects fewer accepted tokens than ``choose``.

Everything is gathers, sorts and pointer jumping over static shapes: no host sync, CUDA-graph and
``torch.compile(fullgraph=True)`` safe.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from . import _checks
from .survival import check_parents, path_min, path_product, path_sum

SOURCE_MODEL = 0
SOURCE_NGRAM = 1
SOURCE_BOTH = 2


class VerifyTree(NamedTuple):
    """Fixed-width verify tree, ``W = n_nodes + 1``; layout in docs/ARCHITECTURE.md (node 0 = root)."""

    tokens: torch.Tensor            # [B, W] int64, -1 invalid
    parents: torch.Tensor           # [B, W] int64, -1 root/invalid, parents[i] < i
    ancestors: torch.Tensor         # [B, W, W] bool, ancestors[b, i, j]: j on path root..i (inclusive)
    depth: torch.Tensor             # [B, W] int64, root 0
    valid: torch.Tensor             # [B, W] bool, prefix of the row, root always valid
    source: torch.Tensor            # [B, W] int8, -1 root/invalid, 0 model, 1 n-gram, 2 both
    survival: torch.Tensor          # [B, W] float32, root 1, invalid 0
    expected_accepted: torch.Tensor  # [B] float32


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


def _check_inputs(root_tokens, model_tokens, model_surv, model_len, ngram_tokens, ngram_parents, ngram_surv,
                  ngram_len, lam, mode, n_nodes, check_values):
    names = ["root_tokens", "model_tokens", "model_surv", "model_len", "ngram_tokens", "ngram_parents",
             "ngram_surv", "ngram_len"]
    ts = [root_tokens, model_tokens, model_surv, model_len, ngram_tokens, ngram_parents, ngram_surv, ngram_len]
    for n, t in zip(names, ts):
        _checks.tensor(t, n)
    if mode not in ("choose", "merge"):
        raise ValueError(f"mode must be 'choose' or 'merge', got {mode!r}")
    if not isinstance(n_nodes, int) or isinstance(n_nodes, bool) or n_nodes < 1:
        raise ValueError(f"n_nodes must be a positive int, got {n_nodes!r}")
    _checks.int_tensor(root_tokens, "root_tokens", 1)
    _checks.int_tensor(model_tokens, "model_tokens", 2)
    _checks.float_tensor(model_surv, "model_surv", 2)
    _checks.int_tensor(model_len, "model_len", 1)
    _checks.int_tensor(ngram_tokens, "ngram_tokens", 2)
    _checks.int_tensor(ngram_parents, "ngram_parents", 2)
    _checks.float_tensor(ngram_surv, "ngram_surv", 2)
    _checks.int_tensor(ngram_len, "ngram_len", 1)
    b = root_tokens.shape[0]
    _checks.non_empty_batch(b, "root_tokens")
    _checks.shape(model_tokens, "model_tokens", (b, model_tokens.shape[1]))
    _checks.shape(model_surv, "model_surv", tuple(model_tokens.shape))
    _checks.shape(model_len, "model_len", (b,))
    _checks.shape(ngram_tokens, "ngram_tokens", (b, ngram_tokens.shape[1]))
    _checks.shape(ngram_parents, "ngram_parents", tuple(ngram_tokens.shape))
    _checks.shape(ngram_surv, "ngram_surv", tuple(ngram_tokens.shape))
    _checks.shape(ngram_len, "ngram_len", (b,))
    if isinstance(lam, torch.Tensor):
        if lam.dim() != 0:
            raise ValueError(f"lam must be a 0-dim tensor or a float, got shape {tuple(lam.shape)}")
        names.append("lam")
        ts.append(lam)
    elif not isinstance(lam, (int, float)):
        raise TypeError(f"lam must be a 0-dim tensor or a float, got {type(lam).__name__}")
    _checks.same_device(names, ts)
    if _checks.want_values(check_values, *ts):
        km, kn = model_tokens.shape[1], ngram_tokens.shape[1]
        _checks.lengths(model_len, "model_len", km)
        _checks.lengths(ngram_len, "ngram_len", kn)
        _checks.probabilities(model_surv, "model_surv")
        _checks.probabilities(ngram_surv, "ngram_surv")
        lam_v = float(lam)
        if lam_v != lam_v or lam_v < 0:
            raise ValueError(f"lam must be a non-negative number, got {lam_v}")
        if bool((root_tokens < 0).any()):
            raise ValueError("root_tokens must be non-negative token ids")
        mv = torch.arange(km, device=model_len.device)[None] < model_len[:, None]
        nv = torch.arange(kn, device=ngram_len.device)[None] < ngram_len[:, None]
        if bool((mv & (model_tokens < 0)).any()):
            raise ValueError("model_tokens has a negative token id inside model_len")
        if bool((nv & (ngram_tokens < 0)).any()):
            raise ValueError("ngram_tokens has a negative token id inside ngram_len")
        check_parents(ngram_parents, nv, "ngram_parents")


def select(root_tokens: torch.Tensor, model_tokens: torch.Tensor, model_surv: torch.Tensor, model_len: torch.Tensor,
           ngram_tokens: torch.Tensor, ngram_parents: torch.Tensor, ngram_surv: torch.Tensor,
           ngram_len: torch.Tensor, lam: Union[torch.Tensor, float], mode: str = "choose", n_nodes: int = 8,
           check_values: Optional[bool] = None) -> VerifyTree:
    """Build the verify tree of each request (see module docstring and docs/core.md)."""
    _check_inputs(root_tokens, model_tokens, model_surv, model_len, ngram_tokens, ngram_parents, ngram_surv,
                  ngram_len, lam, mode, n_nodes, check_values)
    dev = root_tokens.device
    b = root_tokens.shape[0]
    km, kn = model_tokens.shape[1], ngram_tokens.shape[1]
    f32, i64 = torch.float32, torch.int64
    lam_t = lam.to(f32) if isinstance(lam, torch.Tensor) else torch.full((), float(lam), dtype=f32, device=dev)

    # ---- model chain ----
    jm = torch.arange(km, device=dev, dtype=i64)
    mv = jm[None, :] < model_len.to(i64)[:, None]
    m_tok = torch.where(mv, model_tokens.to(i64), torch.full_like(mv, -1, dtype=i64))
    # survivals never grow along a path; enforcing it (running minimum) keeps every selection prefix-closed even if a
    # caller's estimates are inconsistent
    m_surv = torch.cummin(torch.where(mv, model_surv.to(f32), torch.zeros_like(mv, dtype=f32)), dim=1).values
    m_par = (jm - 1).expand(b, km)
    m_depth = (jm + 1).expand(b, km)

    # ---- n-gram chain / tree ----
    jn = torch.arange(kn, device=dev, dtype=i64)
    nv = jn[None, :] < ngram_len.to(i64)[:, None]
    n_tok = torch.where(nv, ngram_tokens.to(i64), torch.full_like(nv, -1, dtype=i64))
    n_par = torch.where(nv, ngram_parents.to(i64), torch.full_like(nv, -1, dtype=i64))
    n_surv = path_min(torch.where(nv, ngram_surv.to(f32), torch.zeros_like(nv, dtype=f32)), n_par)
    n_depth = path_sum(nv.to(i64), n_par)  # 1-based depth of valid nodes

    m_src = torch.full((b, km), SOURCE_MODEL, dtype=torch.int8, device=dev)
    n_src = torch.full((b, kn), SOURCE_NGRAM, dtype=torch.int8, device=dev)
    m_valid, n_valid = mv, nv
    n_pool_par = torch.where(n_par >= 0, n_par + km, n_par)

    if mode == "merge" and km > 0 and kn > 0:
        # n-gram node i equals model node d_i - 1 iff its whole token path equals the model chain's prefix
        midx = (n_depth - 1).clamp(min=0, max=km - 1)
        same = nv & (n_depth <= model_len.to(i64)[:, None]) & (n_tok == torch.gather(m_tok, 1, midx))
        on_chain = path_product(same.to(f32), n_par) > 0.5
        onehot = on_chain[:, :, None] & (midx[:, :, None] == jm[None, None, :])       # [B, Kn, Km]
        folded = onehot.any(1)                                                         # model nodes also drafted
        m_surv = torch.maximum(m_surv, (onehot.to(f32) * n_surv[:, :, None]).amax(1))
        m_src = torch.where(folded, torch.full_like(m_src, SOURCE_BOTH), m_src)
        n_valid = nv & ~on_chain
        # an n-gram node whose parent was folded hangs off that model node (index d_parent - 1 = d_i - 2)
        par_folded = torch.gather(on_chain, 1, n_par.clamp(min=0)) & (n_par >= 0)
        n_pool_par = torch.where(par_folded, n_depth - 2, n_pool_par)

    m_elig = m_valid & (m_surv > 0) & (m_surv >= lam_t)
    n_elig = n_valid & (n_surv > 0) & (n_surv >= lam_t)
    if mode == "choose":
        v_m = torch.where(m_elig, m_surv - lam_t, torch.zeros_like(m_surv)).sum(1)
        v_n = torch.where(n_elig, n_surv - lam_t, torch.zeros_like(n_surv)).sum(1)
        use_ng = (v_n > v_m)[:, None]
        m_elig = m_elig & ~use_ng
        n_elig = n_elig & use_ng

    # ---- pool: model | n-gram | filler ----
    fill_i = torch.full((b, n_nodes), -1, dtype=i64, device=dev)
    p_tok = torch.cat([m_tok, n_tok, fill_i], 1)
    p_par = torch.cat([m_par, n_pool_par, fill_i], 1)
    p_surv = torch.cat([m_surv, n_surv, torch.zeros((b, n_nodes), dtype=f32, device=dev)], 1)
    p_src = torch.cat([m_src, n_src, torch.full((b, n_nodes), -1, dtype=torch.int8, device=dev)], 1)
    p_depth = torch.cat([m_depth, n_depth, torch.zeros((b, n_nodes), dtype=i64, device=dev)], 1)
    p_elig = torch.cat([m_elig, n_elig, torch.zeros((b, n_nodes), dtype=torch.bool, device=dev)], 1)

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


def tree_value(tree: VerifyTree, lam: float = 0.0) -> torch.Tensor:
    """``sum over valid draft nodes of (survival - lam)`` per request (the selector's objective)."""
    draft = tree.valid.clone()
    draft[:, 0] = False
    return torch.where(draft, tree.survival - lam, torch.zeros_like(tree.survival)).sum(1)


__all__ = ["VerifyTree", "select", "ancestors_from_parents", "tree_value", "SOURCE_MODEL", "SOURCE_NGRAM",
           "SOURCE_BOTH"]
