"""``HybridSpecAlgo``: the ``spec_class`` registered for HYBRID.

Why a subclass: SGLang dispatches on ``is_eagle()`` (verify CUDA-graph capture, KV reservation, the FutureMap relay of
``topk_p``/``topk_index``/hidden states, draft-extend graphs). HYBRID drafts with an EAGLE head, so it answers
``is_eagle() == True`` and rides those branches; ``is_eagle3()`` follows the draft model's architecture. The base
``CustomSpecAlgo`` also lacks four methods the scheduler and FutureMap call on every algorithm
(``carries_draft_hidden_states``, ``create_future_map``, ``need_topk``, ``get_platform_worker_cls``): defined here.
Features keyed to the literal names EAGLE/EAGLE3 (adaptive steps, watermark, unified memory) stay off by construction.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .config import ENV_EAGLE3
from .draft_arch import draft_is_eagle3
from .server_args import handle_server_args as _handle_server_args

logger = logging.getLogger(__name__)
#: why ``HybridSpecAlgo.is_eagle3`` could not read the draft's config, in this process (the worker counts them)
EAGLE3_PROBE_FAILURES: list[str] = []


class HybridSpecAlgo(CustomSpecAlgo):
    """HYBRID = EAGLE chain + suffix-automaton n-gram drafts, verified as the better chain or a merged tree."""

    _eagle3: Optional[bool] = None

    # --- routing through the EAGLE branches -------------------------------------------------------------------
    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        """From ``config.ENV_EAGLE3`` (the launcher's answer), else the draft's config once SGLang has published its
        speculative settings (before that: False, not cached). A draft config that cannot be read answers False
        (EAGLE), counted in ``EAGLE3_PROBE_FAILURES`` (the worker's ``fallback_eagle3_probe``) and logged once."""
        if self._eagle3 is None:
            env = os.environ.get(ENV_EAGLE3)
            if env is not None:
                self._eagle3 = env == "1"
            else:
                from sglang.srt.runtime_context import get_context, get_spec

                if not get_context().is_config_namespace_published("spec"):
                    return False
                path = get_spec().speculative_draft_model_path
                try:
                    self._eagle3 = draft_is_eagle3(path)
                except Exception as e:  # noqa: BLE001 -- counted and logged; SGLang asks from many places
                    EAGLE3_PROBE_FAILURES.append(repr(e))
                    if len(EAGLE3_PROBE_FAILURES) == 1:
                        logger.warning(
                            "HYBRID fallback eagle3_probe: the draft model %s's config could not be read (%r), so the "
                            "draft is taken for EAGLE, not EAGLE-3; an EAGLE-3 head would then draft without the "
                            "target's auxiliary hidden states. Set %s=1 (EAGLE-3) or 0 (EAGLE) in the environment "
                            "(counted as fallback_eagle3_probe; logged once)", path, e, ENV_EAGLE3)
                    self._eagle3 = False
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
