"""Run a test's kernel side in a subprocess under Triton's CPU interpreter.

Why a subprocess: ``TRITON_INTERPRET`` is read when Triton is imported, and the test process has imported Triton
without it (the suite also compiles kernels for GPUs, ``tests/kernels/test_gpu_compile.py``). The tests that compare
SGLang's Triton kernels with a torch twin or a dense reference run their own module (``python -m``, its ``__main__``
block the kernel side) in a child with the interpreter on, one thread (the kernels' numpy emulation gains nothing from
more on two cores), from the repository's root.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_interpreted(module: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m module *args`` (a test module's ``__name__``) from the repository's root with
    ``TRITON_INTERPRET=1``, ``OMP_NUM_THREADS=1`` and the repository first on ``PYTHONPATH``; fails the calling test
    with the child's stderr when it exits non-zero."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def interpreted_outputs(module: str, tmp_path_factory, label: str):
    """What ``python -m module OUT`` (a test module's kernel side) saved to ``OUT`` with ``torch.save``, run under the
    interpreter."""
    import torch

    out = tmp_path_factory.mktemp(label) / "kernel.pt"
    run_interpreted(module, out)
    return torch.load(out)


def enter_interpreter() -> None:
    """First lines of a kernel side run by ``run_interpreted``: check the interpreter is on, keep vLLM (installed
    beside SGLang where the anchors are, ``HYBRID_ANCHORS=1``) out of SGLang's optional imports, as the other kernel
    sides do, one torch thread."""
    import torch

    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.modules.setdefault("vllm", None)
    torch.set_num_threads(1)
