"""Compile, at start, every Triton kernel variant the worker's launch can take; count what still compiles after.

Why: Triton compiles a kernel on the first launch of each specialisation (``kernels.variants``). Left to the first
steps, every new batch bucket, verify width or draft depth stalls a decode step for a fraction of a second to seconds
while the compiler runs (``bench.gpu_compile`` counted 266 specialisations of the 10 entry kernels over its harness).
``warm_up_step`` enumerates the variants of the worker's configuration (``variants.launch_variants``) and compiles
each with ``JITFunction.warmup(..., grid=(1,))`` (nothing is launched), after the runtime states are built; one log
line says how many and how long.

What still compiles after start is counted: ``triton_compiles_after_start`` (0 expected), with a warning per kernel
and key the first time. On a GPU the count comes from Triton's own compile hook (``knobs.runtime.
jit_post_compile_hook``, called on a compile-cache miss only): nothing runs per launch. Under Triton's interpreter
nothing compiles; there (and on a GPU when ``RECORD_LAUNCHES_ENV`` is set) every launch's specialisation is keyed on
the host (``variants.key_of`` of its arguments, no device read) and checked against the warmed set: under the
interpreter the distinct launches outside it are the count (each is what would compile on a GPU). The per-launch key
costs tens of microseconds of host time, hence opt-in on a GPU.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterable, Optional

import torch

from sglang_hybrid.sglang_plugin.config import ENV_RECORD_LAUNCHES

from . import variants as kv

logger = logging.getLogger(__name__)

#: the variable that turns the per-launch recorder on for a GPU (``sglang_plugin.config.ENV_RECORD_LAUNCHES``)
RECORD_LAUNCHES_ENV = ENV_RECORD_LAUNCHES
#: distinct out-of-set specialisations kept for the warnings and ``recorded`` (the count goes on past it)
MAX_KEPT = 256


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        #: ``variants.key_of`` of every variant warmed (or, under the interpreter, registered) at start
        self.warmed: set = set()
        #: whether ``warm_up`` ran: compiles and launches outside the set count from then on
        self.started = False
        self.variants = 0
        self.seconds = 0.0
        self.failed = 0
        #: compiles of HYBRID's kernels after start (GPU: Triton's compile hook)
        self.compiles = 0
        #: distinct launch specialisations outside the warmed set (the host-side recorder)
        self.outside: dict = {}
        #: launches whose specialisation was outside the warmed set (the recorder; every one, not distinct)
        self.launches_outside = 0
        #: every launch's record by key, when ``record_launches(True)``
        self.recorded: Optional[dict] = None
        self.interpreted = False
        self.hook_installed = False
        self.previous_hook = None
        self.wrapped: list = []


_STATE = _State()


def _is_interpreted(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


def warm_up(device, variants: Iterable[dict]) -> tuple:
    """Compile every record of ``variants`` (``variants.launch_variants``) for ``device`` and register their keys as
    warmed; returns ``(count, seconds)``: the distinct variants and the time their compiles took.

    On a CUDA device each is compiled by ``JITFunction.warmup`` with stand-in arguments of the recorded dtypes and
    alignment (``variants.rebuild``; nothing is launched or allocated on the device); a variant that fails to compile
    is logged and left to its first launch (which would fail the same way), not fatal at start. Under Triton's
    interpreter (the CPU engine) nothing compiles: the variants are registered, the count returned with 0 s, and the
    host-side recorder is installed so launches outside them are still counted."""
    dev = torch.device(device)
    records: dict = {}
    for rec in variants:
        records.setdefault(kv.key_of(rec), rec)
    t0 = time.perf_counter()
    failed = 0
    interpreted = any(_is_interpreted(kv.kernel(r["module"], r["kernel"])) for r in records.values())
    if not interpreted and dev.type == "cuda":
        ctx = torch.cuda.device(dev) if torch.cuda.is_available() else contextlib.nullcontext()
        with ctx:
            for key, rec in records.items():
                fn = kv.kernel(rec["module"], rec["kernel"])
                try:
                    fn.warmup(*[kv.rebuild(a) for a in rec["args"]], grid=(1,),
                              **{k: kv.rebuild(v) for k, v in rec.get("kwargs", {}).items()})
                except Exception as e:     # noqa: BLE001 -- logged, the launch meets it later as it would have
                    failed += 1
                    logger.error("HYBRID: Triton kernel %s failed to compile at start (%s: %s); it compiles at its "
                                 "first launch instead", rec["kernel"], type(e).__name__,
                                 (str(e).strip().splitlines() or [""])[-1][:300])
    seconds = time.perf_counter() - t0 if not interpreted else 0.0
    with _STATE.lock:
        _STATE.warmed |= set(records)
        _STATE.variants = len(_STATE.warmed)
        _STATE.seconds += seconds
        _STATE.failed += failed
        _STATE.interpreted = interpreted
        _STATE.started = True
    _install_compile_hook()
    if interpreted or os.environ.get(RECORD_LAUNCHES_ENV, "0") not in ("", "0"):
        install_recorder()
    return len(records), seconds


def warm_up_step(step, *, max_batch: int, ragged: bool = False, attn_backend=None) -> tuple:
    """``warm_up`` of every variant the worker's launches can take with ``step`` (a ``HybridStep`` after the runtime
    states are built: depths, widths and cost tables final) serving up to ``max_batch`` requests, ``ragged`` verify or
    not, on ``attn_backend`` (the target's, for its verify-mask dtype and ragged layout; None: both possibilities
    compiled). Logs one INFO line with the count and the seconds; ``(0, 0.0)`` without a step or when it runs the
    torch operators (no fused kernels). Returns ``(count, seconds)``."""
    if step is None or getattr(step, "fused", None) is None:
        return 0, 0.0
    cfg = kv.LaunchConfig.from_step(step, max_batch=max_batch, ragged=ragged, attn_backend=attn_backend)
    count, seconds = warm_up(step.device, kv.launch_variants(cfg))
    if _STATE.interpreted:
        logger.info("HYBRID: %d Triton kernel variants known at start (Triton's interpreter: nothing to compile; "
                    "launches outside them counted as triton_compiles_after_start)", count)
    else:
        logger.info("HYBRID: %d Triton kernel variants compiled at start in %.1f s%s", count, seconds,
                    f" ({_STATE.failed} failed to compile)" if _STATE.failed else "")
    return count, seconds


# ---------------------------------------------------------------------------------------------------------------------
# what compiles after start


def _post_compile_hook(**kw):
    """Triton's ``jit_post_compile_hook``: called after each compile (a cache miss), never per launch. Counts HYBRID's
    kernels compiled after ``warm_up`` other than by a warm-up, then calls any hook installed before this one."""
    fn = kw.get("fn")
    module = str(getattr(fn, "module", ""))
    if _STATE.started and module.startswith(kv.KERNELS_PACKAGE) and not kw.get("is_manual_warmup"):
        with _STATE.lock:
            _STATE.compiles += 1
            n = _STATE.compiles
        logger.warning("HYBRID: Triton compiled %s after start (%d so far; a variant the start-up enumeration "
                       "missed, kernels.variants): %s", getattr(fn, "name", "?"), n, str(kw.get("repr", ""))[:500])
    prev = _STATE.previous_hook
    return prev(**kw) if prev is not None else None


def _install_compile_hook() -> None:
    from triton import knobs

    with _STATE.lock:
        if _STATE.hook_installed:
            return
        _STATE.previous_hook = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = _post_compile_hook
        _STATE.hook_installed = True


def _observe(fn, args: tuple, kwargs: dict) -> None:
    rec = kv.record_of(fn, args, kwargs)
    key = kv.key_of(rec)
    st = _STATE
    if st.recorded is not None:
        st.recorded.setdefault(key, rec)
    if key in st.warmed or not st.started:
        return
    with st.lock:
        st.launches_outside += 1
        new = key not in st.outside
        if new and len(st.outside) < MAX_KEPT:
            st.outside[key] = rec
        if new and st.interpreted:
            st.compiles += 1
    if new:
        logger.warning("HYBRID: kernel %s launched with a specialisation outside the variants warmed at start%s: %s",
                       rec["kernel"], " (it compiles now)" if not st.interpreted else "", key[2])


def install_recorder() -> None:
    """Key every launch of HYBRID's entry kernels on the host (``variants.key_of`` of its arguments) and check it
    against the warmed set: each kernel object's ``run`` is wrapped (a launch's ``kernel[grid](...)`` calls it; a
    warm-up's ``warmup=True`` is passed through unobserved). Idempotent; ``uninstall_recorder`` undoes it."""
    with _STATE.lock:
        done = {id(k) for k in _STATE.wrapped}
    for name in kv.entry_kernels():
        module, attr = name.rsplit(".", 1)
        fn = kv.kernel(module, attr)
        if id(fn) in done:
            continue
        def recording(*args, grid, warmup, _fn=fn, **kwargs):
            if not warmup:
                _observe(_fn, args, kwargs)
            # the class's run at call time (bench.gpu_compile's recorder patches the interpreter's class)
            return type(_fn).run(_fn, *args, grid=grid, warmup=warmup, **kwargs)

        fn.run = recording
        with _STATE.lock:
            _STATE.wrapped.append(fn)


def uninstall_recorder() -> None:
    with _STATE.lock:
        wrapped, _STATE.wrapped = _STATE.wrapped, []
    for fn in wrapped:
        fn.__dict__.pop("run", None)


def record_launches(on: bool = True) -> None:
    """Keep every launch's record (one per distinct key) for ``recorded`` (tests, ``bench.gpu_compile``); installs
    the recorder."""
    _STATE.recorded = {} if on else None
    if on:
        install_recorder()


def recorded() -> list:
    """The launches kept since ``record_launches(True)``, one record per distinct specialisation."""
    return list((_STATE.recorded or {}).values())


def compiles_after_start() -> int:
    """``triton_compiles_after_start``: HYBRID kernel compiles after ``warm_up`` (GPU: Triton's compile hook), or under
    the interpreter the distinct launch specialisations outside the warmed set (what would compile on a GPU). 0
    expected."""
    return _STATE.compiles


def counters() -> dict:
    """The warm-up's counters for ``HybridCounters``' summary: ``triton_variants_warmed`` (distinct variants compiled,
    or registered under the interpreter, at start), ``triton_warmup_seconds``, ``triton_warmup_failed``,
    ``triton_compiles_after_start`` (0 expected) and ``triton_launches_outside_warmed`` (launches the host-side recorder
    found outside the set; 0 where it is off)."""
    st = _STATE
    return {"triton_variants_warmed": st.variants, "triton_warmup_seconds": round(st.seconds, 3),
            "triton_warmup_failed": st.failed, "triton_compiles_after_start": st.compiles,
            "triton_launches_outside_warmed": st.launches_outside}


def outside() -> list:
    """Records of the distinct launch specialisations the recorder found outside the warmed set (at most
    ``MAX_KEPT``)."""
    return list(_STATE.outside.values())


def reset() -> None:
    """Forget the warmed set and the counts, remove the recorder and the compile hook (tests)."""
    global _STATE
    uninstall_recorder()
    if _STATE.hook_installed:
        from triton import knobs

        if knobs.runtime.jit_post_compile_hook is _post_compile_hook:
            knobs.runtime.jit_post_compile_hook = _STATE.previous_hook
    _STATE = _State()


__all__ = ["RECORD_LAUNCHES_ENV", "compiles_after_start", "counters", "install_recorder", "outside", "record_launches",
           "recorded", "reset", "uninstall_recorder", "warm_up", "warm_up_step"]
