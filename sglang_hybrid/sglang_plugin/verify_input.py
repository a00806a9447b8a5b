"""``VerifyTree`` (the selector's output) -> SGLang's ``EagleVerifyInput``.

Why a builder of our own: SGLang's ``build_eagle_verify_input`` only knows EAGLE's top-k trees (``parent_list`` +
``top_scores_index``). HYBRID verifies an EAGLE chain, an n-gram chain, or both merged into one irregular tree, so we
start from the ancestor matrix, which describes any tree:

* ``draft_token [bs*W]``: node tokens, node 0 the root (last committed token). Invalid (padding) nodes carry the root
  token so the embedding lookup stays in range; they are unreachable (below), so their outputs are never read.
* ``positions``, ``retrieve_index``, ``retrieve_next_token``, ``retrieve_next_sibling``: from the ancestor matrix by
  SGLang's ``reconstruct_indices_from_tree_mask`` on CUDA, by ``tree_links_torch`` (same contract, checked against
  SGLang's Triton twin in the tests) elsewhere. An invalid node's mask row holds only itself: no parent, no children,
  no siblings, so ``verify_tree_greedy`` / tree sampling (which walk ``next_token``/``next_sibling`` from the root) can
  never reach, let alone accept, it.
* ``custom_mask``: FULL_MASK (GPU attention backends: per request ``W x (seq_len + W)``, prefix visible, last ``W``
  columns the ancestor matrix) or QLEN_ONLY (``W x W`` per request), written with one scatter: no host sync.
* ``max_tree_depth`` = deepest possible path + 1 (the ``accept_index`` width); ``tree_topk = -1`` (irregular tree).

Everything is static-shape tensor code (CUDA-graph and ``torch.compile`` safe) given the host integers
``seq_lens_sum`` (an upper bound suffices) and the configured widths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.eagle_info import EagleVerifyInput

from sglang_hybrid.selector import VerifyTree
from sglang_hybrid.sglang_plugin.tree_mask import full_mask, tree_links_torch, verify_nodes

try:  # TreeMaskMode lives next to SGLang's tree kernels; importing it needs no GPU.
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode
except ImportError:  # pragma: no cover - layout changed in another SGLang release
    from enum import IntEnum

    class TreeMaskMode(IntEnum):
        FULL_MASK = 0
        QLEN_ONLY = 1
        QLEN_ONLY_BITPACKING = 2


@dataclass
class HybridVerifyInput(EagleVerifyInput):
    """``EagleVerifyInput`` for an irregular tree of static maximum depth ``hybrid_max_depth``."""

    hybrid_max_depth: int = 0
    #: the step's ragged layout (``ragged.layout.RaggedLayout``) when the verify forward runs ragged, else None
    ragged: Optional[object] = None

    @property
    def max_tree_depth(self) -> int:
        return self.hybrid_max_depth + 1

    def generate_attn_arg_prefill(self, **kwargs):
        """The FlashInfer backend's verify plan arguments: SGLang's at the padded width, or the ragged layout's when
        the step is ragged (``ragged.flashinfer_plan``)."""
        if self.ragged is None:
            return super().generate_attn_arg_prefill(**kwargs)
        from .ragged.flashinfer_plan import paged_verify_args

        return paged_verify_args(self.ragged, **kwargs)

    @property
    def tree_topk(self) -> int:
        return -1


def _reconstruct_sglang(tree_mask_flat: torch.Tensor, seq_lens: torch.Tensor, bs: int, w: int):
    """SGLang's CUDA kernel (JIT-compiled on first use)."""
    from sglang.kernels.ops.speculative.tree import reconstruct_indices_from_tree_mask

    positions = torch.empty(bs * w, dtype=torch.int64, device=seq_lens.device)
    retrieve = torch.empty((3, bs, w), dtype=torch.int64, device=seq_lens.device)
    reconstruct_indices_from_tree_mask(tree_mask_flat, seq_lens, positions, retrieve[0], retrieve[1], retrieve[2],
                                       bs, w)
    return positions, retrieve[0], retrieve[1], retrieve[2]


def build_verify_input(tree: VerifyTree, seq_lens: torch.Tensor, *, num_steps: int, max_depth: int,
                       mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK, seq_lens_sum: Optional[int] = None,
                       mask_buf: Optional[torch.Tensor] = None,
                       reconstruct: Optional[Callable] = None, fused: bool = False,
                       workspace=None) -> HybridVerifyInput:
    """Build the verify input for ``tree`` (``[B, W]`` layout of docs/ARCHITECTURE.md) over ``seq_lens [B]``.

    ``num_steps``: EAGLE steps (``spec_steps``); ``max_depth``: the deepest draft path the configuration allows
    (sets ``max_tree_depth`` statically, so CUDA graphs see one shape). ``reconstruct(tree_mask_flat, seq_lens, bs,
    W)``: override for the positions/retrieve computation (default: SGLang's kernel on CUDA, ``tree_links_torch``
    elsewhere). ``fused`` (FULL_MASK only): node tokens, links and mask in one Triton launch
    (``kernels.fused_links_and_mask``, equal to the torch path on the requests' rows) instead; ``workspace``
    (``kernels.Workspace``) holds its outputs (valid until the next step).
    """
    tokens, valid, anc = tree.tokens, tree.valid, tree.ancestors
    if tokens.dim() != 2 or anc.shape != (tokens.shape[0], tokens.shape[1], tokens.shape[1]):
        raise ValueError(f"VerifyTree shapes disagree: tokens {tuple(tokens.shape)}, ancestors {tuple(anc.shape)}")
    bs, w = tokens.shape
    if seq_lens.shape != (bs,):
        raise ValueError(f"seq_lens must be [{bs}], got {tuple(seq_lens.shape)}")
    if max_depth < 1 or max_depth > w - 1:
        raise ValueError(f"max_depth must be in [1, {w - 1}] for verify width {w}, got {max_depth}")
    if fused and mask_mode == TreeMaskMode.FULL_MASK:
        if seq_lens_sum is None:
            raise ValueError("FULL_MASK needs seq_lens_sum (a host int >= sum(seq_lens))")
        from sglang_hybrid import kernels

        draft_token, positions, r_index, r_next, r_sib, custom_mask = kernels.fused_links_and_mask(
            tokens, valid, anc, seq_lens, seq_lens_sum, mask_buf, workspace=workspace)
        return _verify_input(draft_token, custom_mask, positions, r_index, r_next, r_sib, num_steps, w, max_depth)
    # Padding nodes see only themselves: unreachable from the root in the retrieve lists.
    draft_token, anc = verify_nodes(tokens, valid, anc)

    if reconstruct is None and seq_lens.is_cuda:
        reconstruct = _reconstruct_sglang
    if reconstruct is None:
        positions, r_index, r_next, r_sib = tree_links_torch(anc, seq_lens)
    else:
        positions, r_index, r_next, r_sib = reconstruct(anc.reshape(-1), seq_lens, bs, w)

    if mask_mode == TreeMaskMode.FULL_MASK:
        if seq_lens_sum is None:
            raise ValueError("FULL_MASK needs seq_lens_sum (a host int >= sum(seq_lens))")
        custom_mask = full_mask(anc, seq_lens, seq_lens_sum, mask_buf)
    elif mask_mode == TreeMaskMode.QLEN_ONLY:
        if mask_buf is not None:
            custom_mask = mask_buf
            custom_mask[: anc.numel()].copy_(anc.reshape(-1).to(mask_buf.dtype))
        else:
            custom_mask = anc.reshape(-1).clone()
    else:
        raise NotImplementedError(
            f"tree mask mode {TreeMaskMode(mask_mode).name} is not supported by HYBRID; use an attention backend "
            "with FULL_MASK or QLEN_ONLY verify masks (e.g. --attention-backend flashinfer)")

    return _verify_input(draft_token, custom_mask, positions, r_index, r_next, r_sib, num_steps, w, max_depth)


def _verify_input(draft_token, custom_mask, positions, r_index, r_next, r_sib, num_steps: int, w: int,
                  max_depth: int) -> HybridVerifyInput:
    return HybridVerifyInput(
        draft_token=draft_token,
        custom_mask=custom_mask,
        positions=positions,
        retrieve_index=r_index,
        retrieve_next_token=r_next,
        retrieve_next_sibling=r_sib,
        retrieve_cum_len=None,
        spec_steps=num_steps,
        topk=1,
        draft_token_num=w,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
        hybrid_max_depth=max_depth,
    )
