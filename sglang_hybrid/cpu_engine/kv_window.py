"""Lift SGLang's CPU gates on KV window planning, the fused verify commit and the draft extend's kernel-prepared
inputs in a CPU engine's processes (a test switch, not a deployment one).

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

And the draft extend's: ``EagleDraftWorker._draft_extend_for_decode`` (``eagle_worker_v2``) prepares its inputs
(correct drafts, the row of each request's last accepted token, the next token ids) with the Triton kernel
``prepare_draft_extend_inputs`` when ``accept_lens`` is a CUDA tensor, with torch ops otherwise. That tensor goes on
to the scheduler, so rather than claim CUDA for it, ``prepare_extend_inputs_on_device`` calls the same kernel with
the same arguments before the method runs and hands the result in ``prepared_draft_extend_inputs``, which the method
takes first (``EXTEND_LOG`` at the first call). Nothing in the plugin imports this module.
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from .import_hook import patch_after_import

from sglang_hybrid.sglang_plugin.config import KV_WINDOW_ENV

EAGLE_WORKER_COMMON = "sglang.srt.speculative.eagle_worker_common"
EAGLE_WORKER_V2 = "sglang.srt.speculative.eagle_worker_v2"
#: logged once per process at the first fused commit (``claim_cuda_predictions``)
COMMIT_LOG = "CPU engine: SGLang's fused verify commit ran (prepare_verify_commit_outputs, the GPU branch)"
#: logged once per process at the first draft extend prepared by the kernel (``prepare_extend_inputs_on_device``)
EXTEND_LOG = ("CPU engine: SGLang's draft-extend inputs prepared by its kernel (prepare_draft_extend_inputs, the GPU "
              "branch)")
logger = logging.getLogger(__name__)


class CudaClaim(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` with True; every operation on it returns a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self) -> bool:
        return True


def _log_once(message: str):
    """A callable that logs ``message`` (a warning) at its first call only: a live run's log shows a lifted branch
    ran, once per process."""
    logged = []

    def log() -> None:
        if not logged:
            logged.append(True)
            logger.warning(message)

    return log


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

    log = _log_once(COMMIT_LOG)

    @functools.wraps(commit)
    def commit_logged(*args, **kwargs):
        log()
        return commit(*args, **kwargs)

    sample_claiming_cuda.claims_cuda = True
    module.eagle_sample, module.prepare_verify_commit_outputs = sample_claiming_cuda, commit_logged


def prepare_extend_inputs_on_device(module) -> None:
    """Make ``EagleDraftWorker._draft_extend_for_decode`` of SGLang's ``eagle_worker_v2`` use the inputs its GPU
    branch computes (``prepare_draft_extend_inputs`` on ``accept_lens``, the predictions and the state's width)."""
    from sglang.kernels.ops.speculative.eagle import prepare_draft_extend_inputs

    cls = module.EagleDraftWorker
    original = cls._draft_extend_for_decode
    if getattr(original, "prepares_on_device", False):
        return                                                   # installed already

    log = _log_once(EXTEND_LOG)

    @functools.wraps(original)
    def draft_extend(self, batch, batch_result, *args, **kwargs):
        if batch_result.prepared_draft_extend_inputs is None and not batch.forward_mode.is_idle():
            batch_result.prepared_draft_extend_inputs = prepare_draft_extend_inputs(
                batch_result.accept_lens, batch_result.next_token_ids, self.speculative_num_draft_tokens)
            log()
        return original(self, batch, batch_result, *args, **kwargs)

    draft_extend.prepares_on_device = True
    cls._draft_extend_for_decode = draft_extend


def lift_gate(module) -> None:
    """Let SGLang's ``eagle_worker_common`` plan KV windows (``prepare_for_draft``) and commit verify outputs through
    its fused kernel (``run_eagle_verify``) on this CPU."""
    module._is_cpu = False
    claim_cuda_predictions(module)


def install_when_imported() -> bool:
    """If ``KV_WINDOW_ENV`` is set in this process: lift the gates now (modules imported) or right after their
    imports. Returns whether it is set. Called by the stand-in ``sgl_kernel`` at import."""
    if not os.environ.get(KV_WINDOW_ENV):
        return False
    patch_after_import(EAGLE_WORKER_COMMON, lift_gate)
    patch_after_import(EAGLE_WORKER_V2, prepare_extend_inputs_on_device)
    return True


__all__ = ["COMMIT_LOG", "EAGLE_WORKER_COMMON", "EAGLE_WORKER_V2", "EXTEND_LOG", "KV_WINDOW_ENV", "CudaClaim",
           "claim_cuda_predictions", "install_when_imported", "lift_gate", "prepare_extend_inputs_on_device"]
