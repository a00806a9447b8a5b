"""Shared plumbing of the device jobs: where outputs go, which device runs, the carried Rust extension, timing."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

#: set by bench/device_run.sh on the device: a folder holding ``sglang_hybrid/_ngram.abi3.so`` unpacked from the wheel
EXT_DIR_ENV = "HYBRID_DEVICE_EXT_DIR"
NO_GPU = ("NO GPU PRESENT: torch.cuda.is_available() is False. This is the CPU mode: the same checks at small sizes, "
          "eager only; no CUDA graph, no host-sync check, no GPU timing. Nothing below is a GPU number.")


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or "out/device")
    path.mkdir(parents=True, exist_ok=True)
    return path


def gpu() -> bool:
    return torch.cuda.is_available() and os.environ.get("HYBRID_DEVICE_FORCE_CPU", "") not in ("1", "true")


def use_carried_extension() -> str:
    """Make ``sglang_hybrid._ngram`` importable from the carried abi3 build; returns how it was found."""
    import sglang_hybrid

    ext = os.environ.get(EXT_DIR_ENV)
    if ext:
        pkg = Path(ext) / "sglang_hybrid"
        if pkg.is_dir() and str(pkg) not in sglang_hybrid.__path__:
            sglang_hybrid.__path__.append(str(pkg))   # submodule lookup searches the package path in order
    try:
        from sglang_hybrid import _ngram
    except ImportError as e:
        return f"missing ({e})"
    return f"ok ({Path(_ngram.__file__).name})"


@contextlib.contextmanager
def no_host_sync(active: bool = True):
    """Run the block under ``torch.cuda.set_sync_debug_mode("error")`` (any host sync raises), restored after it
    whatever happens; ``active`` False (the CPU mode): the block runs unchecked."""
    if not active:
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def environment() -> dict:
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "machine": platform.machine(),
           "gpu": torch.cuda.get_device_name(0) if gpu() else None, "cpu_threads": torch.get_num_threads()}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    return env


def cuda_ms(fn, iters: int, warmup: int = 3) -> list:
    """Per-call times (ms) of ``fn`` with CUDA events, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for a, b in zip(starts, ends):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends)]


def median(xs) -> float:
    return float(statistics.median(xs))


def write_json(name: str, obj) -> Path:
    path = out_dir() / name
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path


def capture(fn, warmup: int = 2):
    """Warm ``fn`` up on a side stream, then capture it in a CUDA graph; returns ``(graph, static outputs)``. The
    plugin's own capture (``ragged.graph_capture.CudaGraphCapture``, what its token-tier verify graphs use), so every
    graph of the device run also checks it."""
    from sglang_hybrid.sglang_plugin.ragged.graph_capture import CudaGraphCapture

    cap = CudaGraphCapture(warmup=warmup)
    out = cap.capture(0, fn)
    return cap.graph(0), out


def failure(e: BaseException, frames: int = 4) -> str:
    """``Type: message [at file:line in fn <- ...]``: the innermost frames, so one run on a lent machine says where."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(tb))
    return f"{type(e).__name__}: {str(e)[:300]} [at {where}]"
