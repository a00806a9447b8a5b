"""The SGLang-free half of HYBRID's verify input: node tokens, ancestor matrix, tree links and the FULL_MASK layout.

Kept apart from ``verify_input`` (which imports SGLang to build its ``EagleVerifyInput``) so that code which must run
without SGLang -- the CPU tests, the device benchmark ``bench/device`` on a bare GPU machine -- runs exactly the
tensor code the worker ships. ``verify_input`` re-exports every name here. Pure PyTorch, static shapes, no host sync.
"""
from __future__ import annotations

from typing import Optional

import torch


def verify_nodes(tokens: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor):
    """``(draft_token [B*W], ancestors [B, W, W] bool)`` as the verify forward sees them.

    Padding nodes see only themselves (unreachable from the root in the retrieve lists) and carry the root token so
    the embedding lookup stays in range.
    """
    w = tokens.shape[1]
    eye = torch.eye(w, dtype=torch.bool, device=ancestors.device)[None]
    anc = ((ancestors.to(torch.bool) & valid[:, :, None] & valid[:, None, :]) | eye).contiguous()
    draft_token = torch.where(valid, tokens, tokens[:, :1]).reshape(-1)
    return draft_token, anc


def tree_links_torch(ancestors: torch.Tensor, seq_lens: torch.Tensor):
    """Torch twin of ``reconstruct_indices_from_tree_mask`` for ``ancestors [bs, W, W]`` (reflexive or not).

    Returns ``positions [bs*W]``, ``retrieve_index``, ``retrieve_next_token``, ``retrieve_next_sibling`` ``[bs, W]``
    (int64): position = seq_len + number of strict ancestors; parent = deepest strict ancestor; next_token = first
    child; next_sibling = next node with the same parent (``-1`` when none or when the node has no parent).
    """
    bs, w, _ = ancestors.shape
    dev = ancestors.device
    idx = torch.arange(w, device=dev)
    strict = ancestors.to(torch.bool) & (idx[None, :] < idx[:, None])[None]          # [bs, i, j]: j < i ancestor
    depth = strict.sum(-1)
    positions = (depth + seq_lens.to(torch.int64)[:, None]).reshape(-1)
    retrieve_index = (torch.arange(bs, device=dev)[:, None] * w + idx[None, :]).to(torch.int64)
    parent = torch.where(strict, idx[None, None, :], -1).amax(-1)                       # [bs, W]
    big = torch.full((), w, device=dev, dtype=torch.int64)
    child_of = parent[:, :, None] == idx[None, None, :]                                 # [bs, k, tid]: k child of tid
    first_child = torch.where(child_of, idx[None, :, None], big).amin(1)
    next_token = torch.where(first_child < w, first_child, -1)
    same_parent = (parent[:, :, None] == parent[:, None, :]) & (idx[:, None] > idx[None, :])[None]   # [bs, k, tid]
    first_sib = torch.where(same_parent, idx[None, :, None], big).amin(1)
    next_sibling = torch.where((parent >= 0) & (first_sib < w), first_sib, -1)
    return positions, retrieve_index, next_token.to(torch.int64), next_sibling.to(torch.int64)


def full_mask(ancestors: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """FULL_MASK layout: request ``b`` owns rows ``W x (seq_len_b + W)`` starting at ``W*sum(seq_lens[:b]) + W*W*b``.

    ``seq_lens_sum`` is a host int ``>= sum(seq_lens)`` (over-size is harmless: the tail stays True, unread).
    """
    bs, w, _ = ancestors.shape
    dev = ancestors.device
    numel = seq_lens_sum * w + w * w * bs
    if out is None:
        out = torch.ones(numel, dtype=torch.bool, device=dev)
    else:
        if out.numel() < numel:
            raise ValueError(f"custom mask buffer holds {out.numel()} entries, FULL_MASK needs {numel}")
        if out.dtype not in (torch.bool, torch.uint8):
            raise ValueError(f"custom mask buffer must be bool or uint8 (Triton's), got {out.dtype}")
        out.fill_(1)
    sl = seq_lens.to(torch.int64)
    start = w * (torch.cumsum(sl, 0) - sl) + w * w * torch.arange(bs, device=dev)      # [bs]
    i = torch.arange(w, device=dev)
    index = (start[:, None, None] + i[None, :, None] * (sl[:, None, None] + w) + sl[:, None, None]
             + i[None, None, :])
    out.scatter_(0, index.reshape(-1), ancestors.reshape(-1).to(out.dtype))   # Triton's buffer is uint8
    return out


__all__ = ["full_mask", "tree_links_torch", "verify_nodes"]
