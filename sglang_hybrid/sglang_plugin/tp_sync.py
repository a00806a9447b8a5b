"""Make every tensor-parallel rank verify the same tree: broadcast rank 0's ``VerifyTree`` to its group.

Why: each rank runs its own n-gram drafter on the host and its own selection on its device. Identical inputs give
identical trees, but nothing guarantees identical inputs (host state after a restart of one rank, float ties in the
price or the survivals computed on different devices). Ranks that verify different trees write different KV entries
and emit different tokens: corrupted output, or a hang when the collectives inside the forward see different shapes.
SGLang broadcasts its own data-dependent speculative decisions from rank 0 for the same reason (``spec_tp_sync.py``);
HYBRID's decision is the whole tree and the draft depth and verify width it picked for a later step, so all travel.

The group is SGLang's ``get_dp_tp_group()``: the ranks that run one DP rank's batch (the attention-TP group under DP
attention), the same group DSpark's ``SpecTpSync`` uses. The tree is packed into one int64 tensor (the float survivals
by their bit pattern, so they arrive exact) and broadcast with the group's ``broadcast`` (pynccl on GPUs, gloo on
CPU); one collective per decode step, static shapes, no host sync on the device path.
"""
from __future__ import annotations

import torch

from sglang_hybrid.selector import VerifyTree


def pack_tree(tree: VerifyTree) -> torch.Tensor:
    """``[B, 6W + W*W + 1]`` int64: tokens, parents, depth, valid, source, survival bits, ancestors, expected bits."""
    b, w = tree.tokens.shape
    as_bits = lambda x: x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)  # noqa: E731
    return torch.cat([tree.tokens.to(torch.int64), tree.parents.to(torch.int64), tree.depth.to(torch.int64),
                      tree.valid.to(torch.int64), tree.source.to(torch.int64), as_bits(tree.survival),
                      tree.ancestors.reshape(b, w * w).to(torch.int64), as_bits(tree.expected_accepted)[:, None]], 1)


def unpack_tree(packed: torch.Tensor, w: int) -> VerifyTree:
    """Inverse of ``pack_tree`` (exact, dtypes restored)."""
    b = packed.shape[0]
    cols = [packed[:, i * w:(i + 1) * w] for i in range(6)]
    from_bits = lambda x: x.to(torch.int32).view(torch.float32)  # noqa: E731
    return VerifyTree(tokens=cols[0], parents=cols[1], ancestors=packed[:, 6 * w:6 * w + w * w].reshape(b, w, w)
                      .to(torch.bool), depth=cols[2], valid=cols[3].to(torch.bool), source=cols[4].to(torch.int8),
                      survival=from_bits(cols[5].contiguous()),
                      expected_accepted=from_bits(packed[:, 6 * w + w * w].contiguous()))


class TreeBroadcast:
    """Broadcast a ``VerifyTree`` from the group's rank 0; a no-op for a group of one (or no group)."""

    def __init__(self, group):
        self.group = group if group is not None and getattr(group, "world_size", 1) > 1 else None

    @property
    def enabled(self) -> bool:
        return self.group is not None

    def __call__(self, tree: VerifyTree, plan: torch.Tensor) -> tuple[VerifyTree, torch.Tensor]:
        """Rank 0's tree and its plan for a later step (``[P]`` int64: the EAGLE depth and verify width chosen):
        every rank must switch alike, since the draft and verify forwards' shapes meet in the TP collectives."""
        if self.group is None:
            return tree, plan
        b, p = tree.tokens.shape[0], plan.shape[0]
        packed = torch.cat([pack_tree(tree), plan.to(torch.int64)[None, :].expand(b, p)], 1)
        self.group.broadcast(packed, src=0)
        return unpack_tree(packed[:, :-p], tree.tokens.shape[1]), packed[0, -p:]
