"""Every Triton kernel of HYBRID's per-step path, compiled for NVIDIA GPUs by Triton's real CUDA backend, on a CPU.

    python -m bench.gpu_compile [--arch 90 80] [--batches 40] [--episodes 4] [--ragged 20]

Why: on this CPU (and in CI) the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), which executes the
kernel's Python with numpy and accepts much that the compiler refuses: a dtype that does not promote, a shape that is
not a power of two, an operation with no lowering, more shared memory than the device has. No GPU is lent; without
this check a kernel written since the last device run would meet the compiler for the first time on a user's GPU.
Triton compiles without a GPU: the CUDA backend lowers to PTX in-process and assembles it with the ``ptxas`` its
wheel ships, and the target is only a name (``GPUTarget("cuda", arch, 32)``). Nothing is launched.

How: two processes. The first (under the interpreter, with the GPU's rows per program, ``kernels.GPU_TILES_ENV``, so
that each launch has the block shapes a GPU would compile) runs the fused path's exactness harnesses
(``bench.fused_exactness``: random and adversarial decision batches, the worker's whole step over evolving batches
with cost tables at one and at two contexts, ragged verify's layout and compaction on random trees) and records every
launch: the kernel, each argument's kind (a tensor's dtype and whether its address is 16-byte aligned, which Triton
specialises on; an int's value, which it specialises on being 1 or a multiple of 16; the constexprs). The second
(compiled mode, a compile-only stand-in for the CUDA driver that names the target) rebuilds each distinct
specialisation with tensors of the same dtypes and alignment and compiles it with ``JITFunction.warmup`` for every
``--arch``, then checks what the driver would check at load: shared memory within the architecture's limit and
``num_warps x 32`` threads within 1,024. It also checks coverage: every ``@triton.jit`` kernel of
``sglang_hybrid.kernels`` (helpers called from kernels aside) was launched and compiled.

What it does not show: that the compiled kernels compute the right values (the interpreter's exactness runs and the
device kit's CUDA comparison do: ``bench/device_run.sh``), their speed, or a launch's resource failure that depends on
the device rather than the architecture. MEASURED: compile success and resource use per kernel, on this CPU.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the architectures compiled by default: Hopper (H100, H200; ``sm_90a``) and Ampere (A100, ``sm_80``)
DEFAULT_ARCHS = (90, 80)
#: the largest dynamic shared memory a block may use per architecture (CUDA's opt-in maximum), bytes
MAX_SHARED = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
MAX_THREADS = 1024
#: the module whose ``@triton.jit`` entry kernels (names ending in ``_kernel``) must all be compiled
KERNELS_PACKAGE = "sglang_hybrid.kernels"


# ---------------------------------------------------------------------------------------------------------------------
# phase 1: record launches under the interpreter


def _describe(value):
    """A launch argument as JSON: what Triton specialises a compile on, and nothing else."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"a kernel argument of type {type(value).__name__} ({value!r}) cannot be recorded")


def record_launches(batches: int, episodes: int, ragged: int, seed: int = 0) -> list:
    """Run the exactness harnesses under the interpreter (``TRITON_INTERPRET=1`` set by the caller before Triton's
    import) and return one record per distinct launch specialisation: ``{"module", "kernel", "args", "kwargs"}``."""
    from triton.runtime.interpreter import InterpretedFunction

    from bench import fused_exactness as fx
    from sglang_hybrid.kernels import GPU_TILES_ENV

    if not os.environ.get(GPU_TILES_ENV):
        raise RuntimeError(f"record with {GPU_TILES_ENV}=1: without it the interpreter's block shapes are recorded, "
                           "not the GPU's")

    seen: dict = {}
    run = InterpretedFunction.run

    def recording(fn_self, *args, grid, warmup, **kwargs):
        rec = {"module": fn_self.fn.__module__, "kernel": fn_self.fn.__name__,
               "args": [_describe(a) for a in args], "kwargs": {k: _describe(v) for k, v in kwargs.items()}}
        seen.setdefault(json.dumps(rec, sort_keys=True), rec)
        return run(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording
    try:
        checks = {"decision": fx.run(batches, seed=seed, progress=False)}
        if episodes:
            checks["steps"] = fx.run_steps(episodes, seed=seed, progress=False)
        if ragged:
            checks["ragged"] = fx.run_ragged(ragged, seed=seed, progress=False)
    finally:
        InterpretedFunction.run = run
    bad = {k: v["failed"] for k, v in checks.items() if v["failed"]}
    if bad:    # the harness compares with the torch path: a mismatch here is a bug, not a compile question
        raise RuntimeError(f"the fused path differs from the torch path while recording: {bad}")
    return list(seen.values())


# ---------------------------------------------------------------------------------------------------------------------
# phase 2: compile each recorded specialisation for each architecture


class CompileOnlyDriver:
    """What Triton's JIT asks of the active driver before a compile, for a GPU that is not there: the target names the
    architecture; device and stream are placeholders (a warm-up compile launches nothing)."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True


def _rebuild(desc: dict):
    """A stand-in argument with what the compile depends on: a tensor of the dtype, aligned or not as recorded."""
    import torch

    if "value" in desc:
        return desc["value"]
    t = torch.zeros(32, dtype=getattr(torch, desc["tensor"]))     # CPU allocations are 64-byte aligned
    return t if desc["aligned"] else t[1:]                         # every dtype here is narrower than 16 bytes


def _jit_function(module: str, name: str):
    from triton.runtime.jit import JITFunction

    fn = getattr(importlib.import_module(module), name)
    if not isinstance(fn, JITFunction):
        raise TypeError(f"{module}.{name} is {type(fn).__name__}, not a compiled Triton kernel (is TRITON_INTERPRET "
                        "set in the compiling process?)")
    return fn


def compile_records(records: list, archs) -> list:
    """Compile every record for every ``archs`` entry (keys of ``MAX_SHARED``); one result per (record, arch):
    ``{"kernel", "arch", "ok", "error", "shared", "num_warps", "seconds"}``."""
    from triton.runtime import driver

    out = []
    for arch in archs:
        # left active afterwards: this runs in a process of its own, and without a GPU Triton has no driver to restore
        driver.set_active(CompileOnlyDriver(arch))
        reset: set = set()
        for rec in records:
            t0 = time.perf_counter()
            res = {"kernel": f"{rec['module']}.{rec['kernel']}", "arch": arch, "ok": False, "error": None,
                   "shared": None, "num_warps": None}
            try:
                fn = _jit_function(rec["module"], rec["kernel"])
                if fn not in reset:     # its binder holds the target it was first built for
                    fn.device_caches.clear()
                    reset.add(fn)
                compiled = fn.warmup(*[_rebuild(a) for a in rec["args"]], grid=(1,),
                                     **{k: _rebuild(v) for k, v in rec["kwargs"].items()})
                md = compiled.metadata
                res.update(shared=int(md.shared), num_warps=int(md.num_warps))
                if md.shared > MAX_SHARED[arch]:
                    res["error"] = f"shared memory {md.shared} B over sm_{arch}'s {MAX_SHARED[arch]} B"
                elif md.num_warps * 32 > MAX_THREADS:
                    res["error"] = f"{md.num_warps} warps: {md.num_warps * 32} threads over {MAX_THREADS}"
                else:
                    res["ok"] = True
            except Exception as e:     # noqa: BLE001 -- every compiler error is a finding to report, not a crash
                lines = str(e).strip().splitlines()
                res["error"] = f"{type(e).__name__}: {lines[-1][:400] if lines else ''}"
            res["seconds"] = round(time.perf_counter() - t0, 2)
            out.append(res)
    return out


def entry_kernels() -> list:
    """``module.name`` of every ``@triton.jit`` function in ``KERNELS_PACKAGE`` whose name ends in ``_kernel`` (the
    ones launched from the host; the others are device helpers that compile inside them)."""
    import pkgutil

    from triton.runtime.jit import JITFunction

    pkg = importlib.import_module(KERNELS_PACKAGE)
    names = []
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{KERNELS_PACKAGE}.{info.name}")
        for attr, value in vars(mod).items():
            if isinstance(value, JITFunction) and value.fn.__module__ == mod.__name__ and attr.endswith("_kernel"):
                names.append(f"{mod.__name__}.{attr}")
    return sorted(names)


def summarize(results: list, expected: list) -> dict:
    """Per kernel and architecture: specialisations compiled, failures (with the first error), largest shared memory;
    ``missing``: expected kernels never compiled (not launched by the harnesses)."""
    by: dict = {}
    for r in results:
        k = by.setdefault((r["kernel"], r["arch"]), {"compiled": 0, "failed": 0, "error": None, "max_shared": 0,
                                                     "seconds": 0.0})
        k["seconds"] += r["seconds"]
        if r["ok"]:
            k["compiled"] += 1
            k["max_shared"] = max(k["max_shared"], r["shared"])
        else:
            k["failed"] += 1
            k["error"] = k["error"] or r["error"]
    archs = sorted({r["arch"] for r in results})
    compiled = {kern for (kern, _), v in by.items() if v["compiled"]}
    return {"kernels": {f"{kern} sm_{arch}": v for (kern, arch), v in sorted(by.items())},
            "failed": sum(v["failed"] for v in by.values()), "specialisations": len(results) // max(1, len(archs)),
            "missing": [k for k in expected if k not in compiled], "archs": archs}


# ---------------------------------------------------------------------------------------------------------------------
# driver


def _phase(args: list, interpret: bool) -> subprocess.CompletedProcess:
    from sglang_hybrid.kernels import GPU_TILES_ENV

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", GPU_TILES_ENV)}
    if interpret:      # the launches as a GPU makes them: its rows per program, so its block shapes
        env.update({"TRITON_INTERPRET": "1", GPU_TILES_ENV: "1"})
    return subprocess.run([sys.executable, "-m", "bench.gpu_compile", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)


def run(archs=DEFAULT_ARCHS, batches: int = 40, episodes: int = 4, ragged: int = 20, seed: int = 0) -> dict:
    """Both phases, each in a fresh process (the interpreter is chosen when Triton is imported); the summary."""
    with tempfile.TemporaryDirectory() as tmp:
        rec_path, res_path = Path(tmp) / "records.json", Path(tmp) / "results.json"
        p = _phase(["--record-to", str(rec_path), "--batches", str(batches), "--episodes", str(episodes),
                    "--ragged", str(ragged), "--seed", str(seed)], interpret=True)
        if p.returncode:
            raise RuntimeError(f"recording the launches failed:\n{p.stderr[-3000:]}")
        p = _phase(["--compile-from", str(rec_path), "--results-to", str(res_path),
                    "--arch", *map(str, archs)], interpret=False)
        if p.returncode:
            raise RuntimeError(f"compiling failed:\n{p.stderr[-3000:]}")
        got = json.loads(res_path.read_text())
    return summarize(got["results"], got["expected"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=list(DEFAULT_ARCHS),
                    help="compute capabilities x10 to compile for (default 90 80: H100/H200, A100)")
    ap.add_argument("--batches", type=int, default=40, help="random decision batches recorded (default 40)")
    ap.add_argument("--episodes", type=int, default=4, help="worker-step episodes of 6 steps recorded (default 4)")
    ap.add_argument("--ragged", type=int, default=20, help="random ragged-layout trees recorded (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record-to", help=argparse.SUPPRESS)        # phase 1 (under the interpreter)
    ap.add_argument("--compile-from", help=argparse.SUPPRESS)     # phase 2 (compiled mode)
    ap.add_argument("--results-to", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bad = [x for x in a.arch if x not in MAX_SHARED]
    if bad:
        ap.error(f"--arch {bad}: known architectures are {sorted(MAX_SHARED)}")
    if a.record_to:
        Path(a.record_to).write_text(json.dumps(record_launches(a.batches, a.episodes, a.ragged, a.seed)))
        return 0
    if a.compile_from:
        results = compile_records(json.loads(Path(a.compile_from).read_text()), a.arch)
        Path(a.results_to).write_text(json.dumps({"results": results, "expected": entry_kernels()}))
        return 0
    t0 = time.perf_counter()
    s = run(a.arch, a.batches, a.episodes, a.ragged, a.seed)
    print(f"Triton kernels of HYBRID's per-step path compiled for {', '.join(f'sm_{x}' for x in s['archs'])} by "
          f"Triton's CUDA backend on this CPU (nothing launched; {s['specialisations']} specialisations recorded from "
          f"the exactness harnesses under the interpreter), {time.perf_counter() - t0:.0f} s:")
    for name, v in s["kernels"].items():
        print(f"  {name}: {v['compiled']} compiled, {v['failed']} failed, shared memory up to {v['max_shared']} B, "
              f"{v['seconds']:.1f} s" + (f"; first error: {v['error']}" if v["error"] else ""))
    ok = not s["failed"] and not s["missing"]
    print(f"[{'MET' if ok else 'MISSED'}] every entry kernel of {KERNELS_PACKAGE} compiles for every architecture "
          f"and fits its limits: {s['failed']} failed; not launched by the harnesses: {s['missing'] or 'none'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
