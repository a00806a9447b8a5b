"""Run SGLang 0.5.23's engine on a CPU: the settings it needs and the ``sgl_kernel`` stand-in.

Why a module: SGLang serves on CPU only with a specific set of switches (found by experiment, listed in
docs/sglang.md, "SGLang on CPU"), two of which must be in the environment *before* ``sglang`` or ``triton`` is
imported: ``SGLANG_USE_CPU_ENGINE`` (read once by ``is_cpu()``) and ``TRITON_INTERPRET`` (speculative decoding runs
some of SGLang's Triton kernels, which only Triton's interpreter runs on a CPU). ``prepare_environment()`` sets them
and puts the stand-in ``sgl_kernel`` (``stand_in/sgl_kernel``) on the path of this process and of the engine's
spawned children; ``engine_kwargs()`` gives the ``sglang.Engine`` arguments. The self-check's ``--cpu`` and the live
tests use both; nothing else imports this module, so a GPU deployment never sees the stand-in.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from sglang_hybrid.sglang_plugin.config import TORCH_KERNELS_ENV, TREE_SAMPLING_ENV

STAND_IN_DIR = Path(__file__).resolve().parent / "stand_in"

#: The environment the CPU engine needs (set before importing sglang/triton; inherited by spawned children).
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "TRITON_INTERPRET": "1",
    # PyPI's CUDA torch ships NCCL, so SGLang would turn pynccl on for tp > 1 and fail with "Expected a cuda device";
    # a path that does not exist keeps SGLang on gloo.
    "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def prepare_environment(tp_size: int = 1, tree_sampling_counts: Optional[str] = None,
                        kv_window: bool = False, torch_kernels: bool = False) -> None:
    """Set the CPU engine's environment and path; call before the first ``import sglang`` of the process.

    ``tree_sampling_counts``: a JSON file path: run SGLang's sampling verify (temperature > 0) with the CPU stand-in
    tree-sampling op (``tree_sampling.py``; SGLang verifies greedily on CPU otherwise) and count its calls there.
    ``kv_window``: plan each decode iteration's KV write window as SGLang does on a GPU (``kv_window.py``).
    ``torch_kernels``: run every SGLang Triton kernel of HYBRID's step with its torch twin (``TORCH_KERNELS_ENV``:
    attention, KV indices, greedy tree verify), none in Triton's interpreter (the try-out server)."""
    for name in ("sglang", "triton"):
        if name in sys.modules:
            raise RuntimeError(
                f"sglang_hybrid.cpu_engine.prepare_environment() must run before '{name}' is imported "
                "(SGLang reads SGLANG_USE_CPU_ENGINE and Triton reads TRITON_INTERPRET at import)")
    for key, value in CPU_ENV.items():
        os.environ[key] = value
    # One NUMA node here: SGLang's default binding asserts tp ranks <= NUMA nodes. One thread set per rank.
    cores = os.cpu_count() or 1
    if tp_size > 1:
        per = max(cores // tp_size, 1)
        os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(
            f"{r * per}-{r * per + per - 1}" if per > 1 else str(r * per % cores) for r in range(tp_size))
    if tree_sampling_counts:
        os.environ[TREE_SAMPLING_ENV] = str(tree_sampling_counts)
    if kv_window:
        from .kv_window import KV_WINDOW_ENV

        os.environ[KV_WINDOW_ENV] = "1"
    if torch_kernels:
        os.environ[TORCH_KERNELS_ENV] = "1"
    stand_in = str(STAND_IN_DIR)
    if stand_in not in sys.path:
        sys.path.insert(0, stand_in)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if stand_in not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([stand_in] + parts)


def engine_kwargs(model_path: str, *, speculative: Optional[dict] = None, tp_size: int = 1,
                  max_running_requests: int = 4, overlap: bool = False) -> dict:
    """``sglang.Engine`` arguments for a CPU run (float32: a bf16 run produced garbage on this CPU engine).

    ``speculative``: extra speculative arguments (``speculative_algorithm``, draft path, steps), or None for plain
    decoding, which runs on the much faster ``torch_native`` backend (speculation needs ``triton``: SGLang's EAGLE
    refuses ``torch_native``, and HYBRID needs a backend that applies its tree mask).

    ``overlap``: run SGLang's overlap scheduler (``Scheduler.event_loop_overlap``: step N + 1 is launched before
    step N's results are processed, as on a GPU, where it is SGLang's default). On a CPU nothing runs concurrently
    (``torch.cpu`` streams and events are no-ops), so it gains no time, but every host step runs in the order and at
    the lags it has on a GPU: what HYBRID's one-step-late plans and proposals are built for. Off by default here.
    """
    kw = dict(
        model_path=model_path, device="cpu", dtype="float32", tp_size=tp_size,
        disable_cuda_graph=True, disable_overlap_schedule=not overlap, skip_server_warmup=True,
        context_length=1024, max_total_tokens=8192, max_running_requests=max_running_requests,
        mem_fraction_static=0.5, page_size=1, log_level="warning",
    )
    if tp_size > 1:
        kw["disable_custom_all_reduce"] = True
    if speculative:
        kw.update(attention_backend="triton", triton_attention_num_kv_splits=1)
        kw.update(speculative)
    else:
        kw.update(attention_backend="torch_native")
    return kw
