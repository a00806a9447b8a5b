"""SGLang 0.5.23 plugin: ``--speculative-algorithm HYBRID``.

SGLang calls ``register()`` in every process through the ``sglang.srt.plugins`` entry point declared in
``pyproject.toml``. It registers HYBRID once (a second call is a no-op: SGLang's registry refuses duplicates, and
``load_plugins`` may run more than once per process under some launchers).

Why registration failures are re-routed: SGLang's plugin loader catches and only logs an exception raised by
``register()``, so a broken install (say, a missing Rust extension) used to surface as "Unknown speculative algorithm
name: HYBRID", far from its cause. When registering fails, ``register()`` instead registers a placeholder HYBRID whose
argument validation raises ``HybridPluginError`` carrying the original error: a server launched with HYBRID stops at
start with the cause, and servers that do not ask for HYBRID are unaffected.
"""
from __future__ import annotations

import logging
import sys
import threading
import traceback

ALGORITHM = "HYBRID"
_lock = threading.Lock()
logger = logging.getLogger(__name__)


class HybridPluginError(RuntimeError):
    """The HYBRID plugin could not register; the message carries the original error and its traceback."""


def _register_hybrid() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from .server_args import validate_server_args
    from .spec_algo import HybridSpecAlgo

    @SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=True, validate_server_args=validate_server_args,
                                   spec_class=HybridSpecAlgo)
    def _hybrid_worker_factory(server_args):
        from .worker import HybridWorkerV2

        return HybridWorkerV2


def _register_failure(error: BaseException) -> None:
    """Register a placeholder HYBRID that stops any launch asking for it with ``error`` as the cause."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    detail = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    message = (f"the HYBRID speculative-decoding plugin (sglang_hybrid) failed to register: {error!r}. Reinstall it "
               f"with `pip install -e .` in the Hybrid Spark checkout (builds the Rust extension) and check that "
               f"sglang==0.5.23 is installed.\nOriginal error:\n{detail}")

    def refuse(_server_args):
        raise HybridPluginError(message)

    SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=False, validate_server_args=refuse,
                                  spec_class=CustomSpecAlgo)(refuse)


def register() -> None:
    """Register HYBRID with SGLang's speculative-algorithm registry (idempotent)."""
    with _lock:
        try:
            from sglang.srt.speculative.spec_registry import get_spec

            if get_spec(ALGORITHM) is not None:
                return
            _register_hybrid()
        except Exception as error:  # noqa: BLE001 - any failure must reach the user who asked for HYBRID
            logger.error("HYBRID plugin failed to register: %r", error)
            try:
                _register_failure(error)
            except Exception:
                # SGLang's own registry is unusable: its loader would only log this. A command line asking for
                # HYBRID must still stop with the cause.
                if any(ALGORITHM in arg for arg in sys.argv):
                    raise SystemExit(f"HYBRID plugin failed to register: {error!r}") from error
                raise error from None


__all__ = ["ALGORITHM", "HybridPluginError", "register"]
