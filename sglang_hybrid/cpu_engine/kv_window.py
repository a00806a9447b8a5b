"""Lift SGLang's CPU gates on KV window planning and on the fused commit path in a CPU engine's processes (a test
switch, not a deployment one).

Why: on a GPU, an EAGLE chain draft plans the whole write window of its decode iteration once (``prepare_for_draft``
in ``sglang.srt.speculative.eagle_worker_common``: the ``num_draft_tokens`` KV slots past each request that the draft,
the verify and the draft extend all write), and the verify and the draft extend then write through that plan
(``KVLocPlan``). SGLang turns this off on CPU (``and not _is_cpu``), so HYBRID's branch for it -- the plan handed
from its draft to its verify input, and the ragged verify selecting its compact rows of the window -- never ran here.
With ``KV_WINDOW_ENV`` set, the stand-in ``sgl_kernel`` (imported by every CPU engine process) calls
``install_when_imported``, which sets that module's ``_is_cpu`` to False: the planning branch, and nothing else of
that module, then runs as on a GPU (``_is_cpu`` has no other use there in SGLang 0.5.23; a test pins it).

The same switch opens the verify's fused commit path: after sampling, ``run_eagle_verify`` computes the new sequence
lengths and bonus tokens with the Triton kernel ``prepare_verify_commit_outputs`` when the predictions are a CUDA
tensor (``predict.is_cuda``), and with torch ops otherwise. A tensor property is no flag to lift, so
``claim_cuda_predictions`` wraps the module's ``eagle_sample``: its ``predict`` is returned as ``CudaClaim``, a view
whose ``is_cuda`` answers True and whose operations give plain tensors (torch functions disabled on the subclass), so
the claim reaches that one test and nothing computed from it; ``_finalize_accept_tree_path`` (HYBRID verifies with
``topk > 1``) replaces ``predict`` with a plain compacted copy before anything else reads it. The kernel, which runs
in Triton's interpreter here, is wrapped to log its first call (``COMMIT_LOG``): a live run shows the branch ran.
Nothing in the plugin imports this module.
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from .import_hook import patch_after_import

#: set (to any non-empty value) in a CPU engine's environment to plan KV windows there
KV_WINDOW_ENV = "HYBRID_CPU_ENGINE_KV_WINDOW"
EAGLE_WORKER_COMMON = "sglang.srt.speculative.eagle_worker_common"
#: logged once per process at the first fused commit (``claim_cuda_predictions``)
COMMIT_LOG = "CPU engine: SGLang's fused verify commit ran (prepare_verify_commit_outputs, the GPU branch)"
logger = logging.getLogger(__name__)


class CudaClaim(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` with True; every operation on it returns a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self) -> bool:
        return True


def claim_cuda_predictions(module) -> None:
    """Make ``run_eagle_verify`` of SGLang's ``eagle_worker_common`` take its fused commit branch on this CPU: wrap
    ``eagle_sample`` so that its predictions claim CUDA, and ``prepare_verify_commit_outputs`` so that its first call
    is logged."""
    sample, commit = module.eagle_sample, module.prepare_verify_commit_outputs
    if getattr(sample, "claims_cuda", False):
        return                                                   # installed already

    @functools.wraps(sample)
    def sample_claiming_cuda(*args, **kwargs):
        predict, accept_lens, accept_index = sample(*args, **kwargs)
        return predict.as_subclass(CudaClaim), accept_lens, accept_index

    @functools.wraps(commit)
    def commit_logged(*args, **kwargs):
        if not commit_logged.ran:
            commit_logged.ran = True
            logger.warning(COMMIT_LOG)
        return commit(*args, **kwargs)

    commit_logged.ran = False
    sample_claiming_cuda.claims_cuda = True
    module.eagle_sample, module.prepare_verify_commit_outputs = sample_claiming_cuda, commit_logged


def lift_gate(module) -> None:
    """Let SGLang's ``eagle_worker_common`` plan KV windows (``prepare_for_draft``) and commit verify outputs through
    its fused kernel (``run_eagle_verify``) on this CPU."""
    module._is_cpu = False
    claim_cuda_predictions(module)


def install_when_imported() -> bool:
    """If ``KV_WINDOW_ENV`` is set in this process: lift the gate now (module imported) or right after its import.
    Returns whether it is set. Called by the stand-in ``sgl_kernel`` at import."""
    if not os.environ.get(KV_WINDOW_ENV):
        return False
    patch_after_import(EAGLE_WORKER_COMMON, lift_gate)
    return True


__all__ = ["COMMIT_LOG", "EAGLE_WORKER_COMMON", "KV_WINDOW_ENV", "CudaClaim", "claim_cuda_predictions",
           "install_when_imported", "lift_gate"]
