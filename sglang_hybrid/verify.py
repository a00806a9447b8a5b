"""Lossless acceptance rules over a ``VerifyTree`` (reference implementations, pure PyTorch).

Greedy: a node is accepted iff every node on its path equals the target argmax at its parent; the longest such path
wins and the target argmax after it is the bonus.

Sampling: tree speculative sampling with deterministic drafts (each node's draft distribution is one-hot). At a node
with target distribution ``p`` the children are tried in index order; child token ``x`` is accepted with probability
``p_res(x)`` (the usual ``min(1, p/q)`` with ``q`` one-hot), where ``p_res`` starts at ``p`` and after each rejection
has the rejected token zeroed and is renormalised. When no child is accepted the bonus is drawn from ``p_res``. The
emitted token is then distributed exactly as ``p`` (accept ``x`` with prob ``p(x)``, else draw from ``p`` restricted to
the other tokens), so the output distribution equals plain sampling from the target (checked by
``tests/core/test_verify.py``).

Vectorised without a walk: with the residual mass ``S`` of the earlier siblings, child ``i`` passes its test iff
``u_i (1 - S_i) < p(x_i)``; it *wins* iff it passes and no earlier sibling passed (the walk would have stopped there).
A node is on the accepted path iff every node on its path wins; the deepest such node ends the path. All of it is
gathers and masked reductions over static shapes (no host sync).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from . import _checks
from .selector import VerifyTree


class AcceptResult(NamedTuple):
    accepted_nodes: torch.Tensor  # [B, W] int64: node indices along the accepted path, root first, -1 padded
    accept_len: torch.Tensor      # [B] int64: accepted draft tokens (root and bonus excluded)
    bonus: torch.Tensor           # [B] int64: token emitted after the accepted path


def _check_tree_logits(tree: VerifyTree, target_logits: torch.Tensor) -> None:
    if not isinstance(tree, VerifyTree):
        raise TypeError(f"tree must be a VerifyTree, got {type(tree).__name__}")
    _checks.float_tensor(target_logits, "target_logits", 3)
    b, w = tree.tokens.shape
    _checks.non_empty_batch(b, "tree")
    if target_logits.shape[0] != b or target_logits.shape[1] != w:
        raise ValueError(f"target_logits has shape {tuple(target_logits.shape)}, expected [B={b}, W={w}, V]")
    if target_logits.shape[2] == 0:
        raise ValueError("target_logits has an empty vocabulary dimension")
    if target_logits.device != tree.tokens.device:
        raise ValueError(f"target_logits is on {target_logits.device} but the tree is on {tree.tokens.device}")


def _check_token_range(tree: VerifyTree, vocab: int) -> None:
    bad = tree.valid & ((tree.tokens < 0) | (tree.tokens >= vocab))
    if bool(bad.any()):
        raise ValueError(f"tree has valid node tokens outside the vocabulary [0, {vocab})")


def _path_result(tree: VerifyTree, wins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From per-node "wins" (root counts as won) -> (leaf, accepted_nodes, accept_len)."""
    b, w = tree.tokens.shape
    ok = wins | (torch.arange(w, device=wins.device) == 0)[None, :]
    # node i is reachable iff no node on its path failed
    path_ok = tree.valid & ~(tree.ancestors & ~ok[:, None, :]).any(2)
    score = torch.where(path_ok, tree.depth, torch.full_like(tree.depth, -1))
    leaf = torch.argmax(score, dim=1)                                      # deepest, lowest index on ties
    accept_len = torch.gather(tree.depth, 1, leaf[:, None])[:, 0]
    on_path = torch.gather(tree.ancestors, 1, leaf[:, None, None].expand(b, 1, w))[:, 0, :]   # [B, W]
    slot = torch.arange(w, device=wins.device)
    at = on_path[:, None, :] & (tree.depth[:, None, :] == slot[None, :, None])                # [B, d, j]
    nodes = torch.where(at.any(2), torch.argmax(at.to(torch.int8), dim=2), torch.full_like(tree.depth, -1))
    return leaf, nodes, accept_len


def _parent_gather(values: torch.Tensor, tree: VerifyTree) -> torch.Tensor:
    """``values[b, parents[b, i], tokens[b, i]]`` for every node (garbage for root/invalid; mask afterwards)."""
    b, w, v = values.shape
    idx = tree.parents.clamp(min=0) * v + tree.tokens.clamp(min=0)
    return torch.gather(values.reshape(b, w * v), 1, idx)


def greedy_accept(tree: VerifyTree, target_logits: torch.Tensor,
                  check_values: Optional[bool] = None) -> AcceptResult:
    """Longest path whose tokens equal the target argmax; bonus = target argmax after it."""
    _check_tree_logits(tree, target_logits)
    if _checks.want_values(check_values, target_logits):
        _check_token_range(tree, target_logits.shape[2])
    g = torch.argmax(target_logits, dim=2)                                 # [B, W]
    draft = tree.valid & (tree.parents >= 0)
    wins = draft & (tree.tokens == torch.gather(g, 1, tree.parents.clamp(min=0)))
    leaf, nodes, accept_len = _path_result(tree, wins)
    bonus = torch.gather(g, 1, leaf[:, None])[:, 0]
    return AcceptResult(nodes, accept_len, bonus)


def _temperature(temperature, b: int, device) -> torch.Tensor:
    if isinstance(temperature, torch.Tensor):
        _checks.float_tensor(temperature, "temperature")
        if temperature.device != device:
            raise ValueError(f"temperature is on {temperature.device} but the tree is on {device}")
        if temperature.dim() == 0:
            return temperature.to(torch.float32).expand(b)
        if tuple(temperature.shape) != (b,):
            raise ValueError(f"temperature has shape {tuple(temperature.shape)}, expected [] or [{b}]")
        return temperature.to(torch.float32)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature must be a float or a tensor, got {type(temperature).__name__}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return torch.full((b,), float(temperature), dtype=torch.float32, device=device)


def target_probs(target_logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Softmax at per-request temperature ``[B]``; temperature 0 -> one-hot argmax (greedy)."""
    logits = target_logits.to(torch.float32)
    t = temperature[:, None, None]
    soft = torch.softmax(logits / torch.where(t > 0, t, torch.ones_like(t)), dim=2)
    # comparison instead of F.one_hot, whose range checks may read values back to the host
    vocab = torch.arange(logits.shape[2], device=logits.device)
    hard = (vocab[None, None, :] == torch.argmax(logits, dim=2)[:, :, None]).to(torch.float32)
    return torch.where(t > 0, soft, hard)


def sample_uniforms(batch: int, width: int, generator: Optional[torch.Generator] = None,
                    device=None) -> torch.Tensor:
    """``[B, W]`` uniforms in ``[0, 1)`` for ``sample_accept`` (column 0 draws the bonus)."""
    return torch.rand((batch, width), generator=generator, device=device, dtype=torch.float32)


def sample_accept(tree: VerifyTree, target_logits: torch.Tensor, temperature: Union[float, torch.Tensor],
                  uniforms: torch.Tensor, check_values: Optional[bool] = None) -> AcceptResult:
    """Exact tree speculative sampling for one-hot drafts (see module docstring).

    ``uniforms [B, W]`` in ``[0, 1)``: column ``i >= 1`` decides node ``i``'s acceptance test, column 0 draws the bonus
    by inverse CDF. Given independent uniforms the result is an exact sample of the target's continuation.
    """
    _check_tree_logits(tree, target_logits)
    b, w, v = target_logits.shape
    _checks.float_tensor(uniforms, "uniforms", 2)
    _checks.shape(uniforms, "uniforms", (b, w))
    if uniforms.device != tree.tokens.device:
        raise ValueError(f"uniforms is on {uniforms.device} but the tree is on {tree.tokens.device}")
    temp = _temperature(temperature, b, tree.tokens.device)
    if _checks.want_values(check_values, target_logits, uniforms, temp):
        _check_token_range(tree, v)
        if not bool(torch.isfinite(uniforms).all()) or bool((uniforms < 0).any()) or bool((uniforms >= 1).any()):
            raise ValueError("uniforms must lie in [0, 1)")
        if not bool(torch.isfinite(temp).all()) or bool((temp < 0).any()):
            raise ValueError("temperature must be finite and >= 0")
        if bool(torch.isnan(target_logits).any()):
            raise ValueError("target_logits contains NaN")
    u = uniforms.to(torch.float32)
    probs = target_probs(target_logits, temp)                               # [B, W, V]

    idx = torch.arange(w, device=u.device)
    draft = tree.valid & (tree.parents >= 0)
    # earlier siblings: same parent, lower index, both draft nodes
    sib = (tree.parents[:, :, None] == tree.parents[:, None, :]) & (idx[None, None, :] < idx[None, :, None])
    sib = sib & draft[:, :, None] & draft[:, None, :]                      # [B, i, j]
    dup = (sib & (tree.tokens[:, :, None] == tree.tokens[:, None, :])).any(2)
    q = torch.where(draft & ~dup, _parent_gather(probs, tree), torch.zeros_like(u))   # p_parent(x_i), 0 if repeat
    s_before = (sib.to(torch.float32) * q[:, None, :]).sum(2)
    passed = draft & (u * (1.0 - s_before) < q)
    wins = passed & ~(sib & passed[:, None, :]).any(2)
    leaf, nodes, accept_len = _path_result(tree, wins)

    # bonus from the leaf's residual: its target distribution minus every (rejected) child token
    p_leaf = torch.gather(probs, 1, leaf[:, None, None].expand(b, 1, v))[:, 0, :]      # [B, V]
    child = draft & (tree.parents == leaf[:, None])
    cidx = torch.where(child, tree.tokens, torch.full_like(tree.tokens, v))
    removed = torch.zeros((b, v + 1), dtype=torch.float32, device=u.device).scatter(
        1, cidx, torch.ones_like(u))[:, :v]
    res = p_leaf * (1.0 - removed)
    mass = res.sum(1, keepdim=True)
    res = torch.where(mass > 0, res, p_leaf)      # only reachable through rounding: fall back to the target
    cdf = torch.cumsum(res, dim=1)
    target = u[:, :1] * cdf[:, -1:]
    bonus = torch.searchsorted(cdf, target, right=True)[:, 0]
    last_pos = (v - 1) - torch.argmax(torch.flip(res > 0, dims=[1]).to(torch.int8), dim=1)
    bonus = torch.minimum(bonus, last_pos)
    return AcceptResult(nodes, accept_len, bonus)


def emitted_tokens(tree: VerifyTree, result: AcceptResult) -> list[list[int]]:
    """Host helper (tests, reference loop): per request, accepted draft tokens followed by the bonus."""
    toks = tree.tokens.cpu()
    nodes = result.accepted_nodes.cpu()
    lens = result.accept_len.cpu()
    bonus = result.bonus.cpu()
    out = []
    for bi in range(toks.shape[0]):
        n = int(lens[bi])
        out.append([int(toks[bi, int(j)]) for j in nodes[bi, 1:1 + n]] + [int(bonus[bi])])
    return out
