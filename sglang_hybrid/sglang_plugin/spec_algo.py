"""``HybridSpecAlgo``: the ``spec_class`` registered for HYBRID.

Why a subclass: SGLang dispatches on ``is_eagle()`` (verify CUDA-graph capture, KV reservation, the FutureMap relay of
``topk_p``/``topk_index``/hidden states, draft-extend graphs). HYBRID drafts with an EAGLE head, so it answers
``is_eagle() == True`` and rides those branches; ``is_eagle3()`` follows the draft model's architecture. The base
``CustomSpecAlgo`` also lacks four methods the scheduler and FutureMap call on every algorithm
(``carries_draft_hidden_states``, ``create_future_map``, ``need_topk``, ``get_platform_worker_cls``): defined here.
Features keyed to the literal names EAGLE/EAGLE3 (adaptive steps, watermark, unified memory) stay off by construction.
"""
from __future__ import annotations

import os
from typing import Optional

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .config import ENV_EAGLE3
from .draft_arch import draft_is_eagle3
from .server_args import handle_server_args as _handle_server_args


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
        _handle_server_args(server_args)
