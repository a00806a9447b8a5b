"""Lift SGLang's CPU gate on KV window planning in a CPU engine's processes (a test switch, not a deployment one).

Why: on a GPU, an EAGLE chain draft plans the whole write window of its decode iteration once (``prepare_for_draft``
in ``sglang.srt.speculative.eagle_worker_common``: the ``num_draft_tokens`` KV slots past each request that the draft,
the verify and the draft extend all write), and the verify and the draft extend then write through that plan
(``KVLocPlan``). SGLang turns this off on CPU (``and not _is_cpu``), so HYBRID's branch for it -- the plan handed
from its draft to its verify input, and the ragged verify selecting its compact rows of the window -- never ran here.
With ``KV_WINDOW_ENV`` set, the stand-in ``sgl_kernel`` (imported by every CPU engine process) calls
``install_when_imported``, which sets that module's ``_is_cpu`` to False: the planning branch, and nothing else of
that module, then runs as on a GPU (``_is_cpu`` has no other use there in SGLang 0.5.23; a test pins it). Nothing in
the plugin imports this module.
"""
from __future__ import annotations

import os

from .import_hook import patch_after_import

#: set (to any non-empty value) in a CPU engine's environment to plan KV windows there
KV_WINDOW_ENV = "HYBRID_CPU_ENGINE_KV_WINDOW"
EAGLE_WORKER_COMMON = "sglang.srt.speculative.eagle_worker_common"


def lift_gate(module) -> None:
    """Let ``prepare_for_draft`` of SGLang's ``eagle_worker_common`` plan KV windows on this CPU."""
    module._is_cpu = False


def install_when_imported() -> bool:
    """If ``KV_WINDOW_ENV`` is set in this process: lift the gate now (module imported) or right after its import.
    Returns whether it is set. Called by the stand-in ``sgl_kernel`` at import."""
    if not os.environ.get(KV_WINDOW_ENV):
        return False
    patch_after_import(EAGLE_WORKER_COMMON, lift_gate)
    return True


__all__ = ["EAGLE_WORKER_COMMON", "KV_WINDOW_ENV", "install_when_imported", "lift_gate"]
