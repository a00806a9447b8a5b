"""A torch twin of SGLang's Triton greedy tree verification for the CPU engine (the try-out server's switch,
``TORCH_KERNELS_ENV``, set by ``python -m sglang_hybrid.serve --cpu --torch-kernels``; never on a GPU).

Why: SGLang verifies a greedy tree on the CPU through ``sgl_kernel.verify_tree_greedy_cpu``, which the stand-in
``sgl_kernel`` answers with SGLang's Triton kernel ``verify_tree_greedy_kernel_triton`` (its XPU path) in Triton's
interpreter: tens of milliseconds a verify step on two cores, for a walk over at most ``draft tokens x depth`` host
values. With the switch set, the stand-in's op is this twin instead (``swap_tree_verify``, called at the stand-in's
import), and says so in the process's log (``TREE_VERIFY_SWAP_LOG``); the live suite, which does not set it, keeps
running the kernel.

What it computes, exactly as the kernel, for each request ``b``: from the root (``retrive_index[b, 0]``, written to
``accept_index[b, 0]``), level by level, the first child (``retrive_next_token``) and then its siblings
(``retrive_next_sibling``) until one's draft token (``candidates``) equals the target's token at the last accepted
node (``target_predict``, addressed by that node's flat index); a match writes the target token to ``predicts`` at the
parent's flat index and the child's index to ``accept_index``, and the walk goes on from the child, for at most
``accept_index.shape[1] - 1`` levels; no match ends it. Then ``accept_token_num[b]`` is the count accepted, and the
last accepted node's ``predicts`` entry its target token (the bonus). Checked against the kernel (interpreter) in
``tests/plugin/test_cpu_tryout.py``. Refuses by name a non-contiguous buffer (the kernel addresses each as one flat
array).
"""
from __future__ import annotations

import logging

import torch

from sglang_hybrid.cpu_engine.torch_kv_indices import flat_view
from sglang_hybrid.sglang_plugin.ragged.graph_capture import kernel_launch

#: logged once per process when the twin replaces the stand-in's op
TREE_VERIFY_SWAP_LOG = ("CPU engine: greedy tree verification runs the torch twin of SGLang's Triton kernel "
                        "verify_tree_greedy_kernel_triton (sglang_hybrid/cpu_engine/torch_tree_verify.py)")
logger = logging.getLogger(__name__)


def _flat(name: str, t: torch.Tensor) -> torch.Tensor:
    return flat_view("verify_tree_greedy_torch", name, t)


def verify_tree_greedy_torch(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """``sgl_kernel.verify_tree_greedy_cpu``'s call (the op schema's ``retrive_*`` names), in torch, writing
    ``predicts``, ``accept_index`` and ``accept_token_num`` in place as SGLang's Triton kernel does (the module
    docstring says what). Stands in for one kernel launch (``kernel_launch``), as the attention twins."""
    with kernel_launch("verify_tree_greedy_torch", kwargs=dict(locals())):
        bs, width = candidates.shape[0], candidates.shape[1]
        levels = accept_index.shape[1]
        flat = {name: _flat(name, t).tolist() for name, t in (
            ("candidates", candidates), ("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
            ("retrive_next_sibling", retrive_next_sibling), ("target_predict", target_predict))}
        cand, index, first_child, sibling = (flat[k] for k in ("candidates", "retrive_index", "retrive_next_token",
                                                               "retrive_next_sibling"))
        target = flat["target_predict"]
        out_predicts, out_accept = _flat("predicts", predicts), _flat("accept_index", accept_index)
        writes_predicts: dict = {}
        accepted = []
        for b in range(bs):
            row = b * width
            last = index[row]
            out_accept[b * levels] = last
            count, cur = 0, 0
            for _ in range(1, levels):
                cur = first_child[row + cur]
                token = target[last]
                matched = False
                for _ in range(width):          # the kernel's sibling walk, at most ``width`` long
                    if cur == -1:
                        break
                    if cand[row + cur] == token:
                        writes_predicts[last] = token
                        count += 1
                        out_accept[b * levels + count] = index[row + cur]
                        last = index[row + cur]
                        matched = True
                        break
                    cur = sibling[row + cur]
                if not matched:
                    break
            accepted.append(count)
            writes_predicts[last] = target[last]
        for at, token in writes_predicts.items():
            out_predicts[at] = token
        accept_token_num[:bs] = torch.tensor(accepted, dtype=accept_token_num.dtype)


def swap_tree_verify(module) -> None:
    """Replace ``verify_tree_greedy_cpu`` in the stand-in ``sgl_kernel`` module (before SGLang's ``spec_tree``
    imports it by name) with the twin, and say so in the process's log (``TREE_VERIFY_SWAP_LOG``)."""
    module.verify_tree_greedy_cpu = verify_tree_greedy_torch
    logger.warning(TREE_VERIFY_SWAP_LOG)


__all__ = ["TREE_VERIFY_SWAP_LOG", "swap_tree_verify", "verify_tree_greedy_torch"]
