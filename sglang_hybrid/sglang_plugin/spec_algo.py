"""``HybridSpecAlgo``: the ``spec_class`` registered for HYBRID.

Why a subclass: SGLang dispatches on ``is_eagle()`` (verify CUDA-graph capture, KV reservation, the FutureMap relay of
``topk_p``/``topk_index``/hidden states, draft-extend graphs). HYBRID drafts with an EAGLE head, so it answers
``is_eagle() == True`` and rides those branches; ``is_eagle3()`` follows the draft model's architecture. The base
``CustomSpecAlgo`` also lacks four methods the scheduler and FutureMap call on every algorithm
(``carries_draft_hidden_states``, ``create_future_map``, ``need_topk``, ``get_platform_worker_cls``): defined here.
Features keyed to the literal names EAGLE/EAGLE3 (adaptive steps, watermark, unified memory) stay off by construction.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

ENV_EAGLE3 = "SGLANG_HYBRID_DRAFT_IS_EAGLE3"


def draft_is_eagle3(draft_model_path: Optional[str], trust_remote_code: bool = False) -> bool:
    """True when the draft's config names an EAGLE-3 architecture.

    Local directories are read directly; anything else goes through SGLang's own ``get_config`` (the loader its
    EAGLE alias resolution uses, honouring the HF cache / offline settings).
    """
    if not draft_model_path:
        return False
    cfg = Path(draft_model_path) / "config.json"
    if cfg.is_file():
        try:
            archs = json.loads(cfg.read_text()).get("architectures") or []
        except (OSError, json.JSONDecodeError):
            archs = []
    else:
        from sglang.srt.utils.hf_transformers_utils import get_config

        archs = getattr(get_config(draft_model_path, trust_remote_code=trust_remote_code), "architectures", None) or []
    return any("eagle3" in str(a).lower() for a in archs)


class HybridSpecAlgo(CustomSpecAlgo):
    """HYBRID = EAGLE chain + suffix-automaton n-gram drafts, verified as the better chain or a merged tree."""

    _eagle3: Optional[bool] = None

    # --- routing through the EAGLE branches -------------------------------------------------------------------
    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        if self._eagle3 is None:
            env = os.environ.get(ENV_EAGLE3)
            if env is not None:
                self._eagle3 = env == "1"
            else:
                try:
                    from sglang.srt.runtime_context import get_spec

                    self._eagle3 = draft_is_eagle3(get_spec().speculative_draft_model_path)
                except Exception:  # runtime context not published yet: answer without caching
                    return False
        return self._eagle3

    def supports_grammar_overlap(self) -> bool:
        # Our verify runs SGLang's verify body, but grammar + irregular trees is not exercised: keep grammar batches
        # on the synchronous path.
        return False

    # --- what CustomSpecAlgo lacks --------------------------------------------------------------------------
    def carries_draft_hidden_states(self) -> bool:
        return True

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True,
                          needs_confidence_relay: bool = False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def need_topk(self) -> bool:
        # The FutureMap relays topk_p (our step-0 draft confidence) and topk_index between overlapped steps.
        return True

    def get_platform_worker_cls(self) -> Optional[type]:
        # HybridWorkerV2 is the worker on every platform; out-of-tree platforms have no HYBRID replacement.
        return None

    # --- argument handling ------------------------------------------------------------------------------------
    def handle_server_args(self, server_args) -> None:
        from .server_args import handle_server_args

        handle_server_args(server_args)
