"""SGLang 0.5.23 plugin: ``--speculative-algorithm HYBRID``.

SGLang calls ``register()`` in every process through the ``sglang.srt.plugins`` entry point declared in
``pyproject.toml``. It registers HYBRID once (a second call is a no-op: SGLang's registry refuses duplicates, and
``load_plugins`` may run more than once per process under some launchers).
"""
from __future__ import annotations

import threading

ALGORITHM = "HYBRID"
_lock = threading.Lock()


def register() -> None:
    """Register HYBRID with SGLang's speculative-algorithm registry (idempotent)."""
    from sglang.srt.speculative.spec_registry import get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from .server_args import validate_server_args
    from .spec_algo import HybridSpecAlgo

    with _lock:
        if get_spec(ALGORITHM) is not None:
            return

        @SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=True, validate_server_args=validate_server_args,
                                       spec_class=HybridSpecAlgo)
        def _hybrid_worker_factory(server_args):
            from .worker import HybridWorkerV2

            return HybridWorkerV2


__all__ = ["ALGORITHM", "register"]
