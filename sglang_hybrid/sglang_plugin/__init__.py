"""SGLang 0.5.23 plugin: ``--speculative-algorithm HYBRID``.

SGLang calls ``register()`` in every process through the ``sglang.srt.plugins`` entry point declared in
``pyproject.toml``. It registers HYBRID once (a second call is a no-op: SGLang's registry refuses duplicates, and
``load_plugins`` may run more than once per process under some launchers).

Why registration failures are re-routed: SGLang's plugin loader catches and only logs an exception raised by
``register()``, so a broken install (say, a missing Rust extension) used to surface as "Unknown speculative algorithm
name: HYBRID", far from its cause. When registering fails, ``register()`` instead registers a placeholder HYBRID whose
argument validation raises ``HybridPluginError`` carrying the original error: a server launched with HYBRID stops at
start with the cause, and servers that do not ask for HYBRID are unaffected.

Version guard: the plugin subclasses and overrides SGLang internals (``compat``), which change between releases, so
``register()`` refuses any SGLang other than ``config.SUPPORTED_SGLANG`` the same way (a launch asking for HYBRID
stops at start, naming both versions and the fix). ``SGLANG_HYBRID_ACCEPT_SGLANG_VERSION=<installed version>``
runs it anyway, logged at warning level.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from importlib import metadata

ALGORITHM = "HYBRID"
_lock = threading.Lock()
logger = logging.getLogger(__name__)


class HybridPluginError(RuntimeError):
    """The HYBRID plugin could not register; the message carries the original error and its traceback."""


class SGLangVersionError(HybridPluginError):
    """The installed SGLang is not the version HYBRID supports; the message names both and the fix."""


def check_sglang_version(installed: str) -> None:
    """Refuse an SGLang other than the supported one unless the user accepted that exact version (logged)."""
    from .config import ENV_ACCEPT_SGLANG, SUPPORTED_SGLANG

    if installed == SUPPORTED_SGLANG:
        return
    if os.environ.get(ENV_ACCEPT_SGLANG) == installed:
        logger.warning("HYBRID runs on SGLang %s, not the supported %s (%s=%s): the SGLang internals it overrides "
                       "(sglang_hybrid/sglang_plugin/compat.py) are unchecked on this version", installed,
                       SUPPORTED_SGLANG, ENV_ACCEPT_SGLANG, installed)
        return
    raise SGLangVersionError(
        f"HYBRID supports SGLang {SUPPORTED_SGLANG}, and SGLang {installed} is installed: install the supported one "
        f"(pip install 'sglang=={SUPPORTED_SGLANG}', or pip install -e '.[sglang]' in the Hybrid Spark checkout), or "
        f"accept the risk with {ENV_ACCEPT_SGLANG}={installed} (the plugin overrides SGLang internals that change "
        "between releases; sglang_hybrid/sglang_plugin/compat.py lists them)")


def _register_hybrid() -> None:
    check_sglang_version(metadata.version("sglang"))
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

    if isinstance(error, SGLangVersionError):
        message = str(error)
    else:
        detail = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
        message = (f"the HYBRID speculative-decoding plugin (sglang_hybrid) failed to register: {error!r}. Reinstall "
                   f"it with `pip install -e .` in the Hybrid Spark checkout (builds the Rust extension) and check "
                   f"that sglang==0.5.23 is installed.\nOriginal error:\n{detail}")

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


__all__ = ["ALGORITHM", "HybridPluginError", "SGLangVersionError", "check_sglang_version", "register"]
