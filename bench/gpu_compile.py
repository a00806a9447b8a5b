"""Every Triton kernel of HYBRID's per-step path, compiled for NVIDIA GPUs by Triton's real CUDA backend, on a CPU.

    python -m bench.gpu_compile [--arch 90 80] [--batches 40] [--episodes 4] [--ragged 20]
    python -m bench.gpu_compile --variants      # the README launch's variants compiled at start (kernels.warmup)

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
specialises on; an int's value, which it specialises on being 1 or a multiple of 16; the constexprs), one record per
specialisation Triton would compile (``kernels.variants.key_of``: the kernels' ``do_not_specialize`` applied). The
second (compiled mode, a compile-only stand-in for the CUDA driver that names the target) rebuilds each distinct
specialisation with tensors of the same dtypes and alignment and compiles it with ``JITFunction.warmup`` for every
``--arch``, then checks what the driver would check at load: shared memory within the architecture's limit and
``num_warps x 32`` threads within 1,024. It also checks coverage: every ``@triton.jit`` kernel of
``sglang_hybrid.kernels`` (helpers called from kernels aside) was launched and compiled.

What it does not show: that the compiled kernels compute the right values (the interpreter's exactness runs and the
device kit's CUDA comparison do: ``bench/device_run.sh``), their speed, or a launch's resource failure that depends on
the device rather than the architecture. MEASURED: compile success and resource use per kernel, on this CPU.

The worker compiles its kernels at start (``kernels.warmup``, from ``kernels.variants.launch_variants`` of its
configuration); ``record_worker`` runs the worker's step for one configuration and checks every launch against that
set (``tests/kernels/test_compile_warm.py``; with ``"device": "cuda"`` in its spec, on a GPU, where Triton's compile
hook counts what compiles after the warm-up), and ``--variants`` prints the README launch's set.
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

from sglang_hybrid.kernels.variants import describe as _describe
from sglang_hybrid.kernels.variants import entry_kernels, key_of
from sglang_hybrid.kernels.variants import rebuild as _rebuild

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


def record_launches(batches: int, episodes: int, ragged: int, seed: int = 0) -> list:
    """Run the exactness harnesses under the interpreter (``TRITON_INTERPRET=1`` set by the caller before Triton's
    import) and return one record per distinct launch specialisation (``kernels.variants.key_of``: what Triton keys its
    compile cache on, the kernels' ``do_not_specialize`` applied): ``{"module", "kernel", "args", "kwargs"}``."""
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
        seen.setdefault(key_of(rec), rec)      # one per specialisation Triton would compile
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
# the worker's launches for one configuration (tests/kernels/test_compile_warm.py): each inside the start-up set?

#: the README launch (docs: mode merge, 4 EAGLE steps, n-gram chains of 8, both cost tables measured at start: depths
#: 1-4, widths 4, 5, 8, 13 if all fit) at a running limit of 48 requests: the configuration ``--variants`` reports
README_LAUNCH = dict(mode="merge", depths=(1, 2, 3, 4), widths=(4, 5, 8, 13), n_nodes=12, ngram_k=8,
                     proposal_width=21, ring=42, context_len=4096, cost=7, cost_follows=True, draft_cost=7,
                     draft_cost_follows=True, max_batch=48)


def _worker_step(spec: dict, tmp: str):
    """A ``HybridStep`` on the CPU as the worker builds it for ``spec`` (settings, EAGLE steps, request slots, context
    length, tables measured at two contexts or given at one; ``ngram_bias_eta`` resolved for the verify layout)."""
    import numpy as np

    from bench.fused_exactness import _table
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.config import HybridSettings, resolved_ngram_bias_eta
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    rng = np.random.default_rng(spec.get("seed", 0))
    kw = dict(spec.get("settings", {}))
    for name, kind in (("cost_table", spec.get("cost")), ("draft_cost_table", spec.get("draft_cost"))):
        if kind is None:
            continue
        path = f"{tmp}/{name}.json"
        table = (_table(rng, 0.01, 2e-4, measured=True) if kind == "context"
                 else CostModel.linear(float(rng.uniform(2e-3, 2e-2)), 1e-4))
        table.save(path)
        kw[name] = path
    settings = HybridSettings(decision_kernels="fused", log_interval=0, **kw)
    step = HybridStep(settings, num_steps=spec["num_steps"], pool_size=spec["pool"], device=spec.get("device", "cpu"),
                      max_context_len=spec.get("max_ctx", 300))
    step.set_ngram_bias_eta(resolved_ngram_bias_eta(settings.ngram_bias_eta, bool(spec.get("ragged"))))
    return step


def record_worker(spec: dict, steps: int = 6, seed: int = 0) -> dict:
    """Run the worker's per-step device work for one configuration as ``HybridWorkerV2`` calls it, on the CPU under
    the interpreter (``TRITON_INTERPRET=1`` and ``kernels.GPU_TILES_ENV`` set by the caller) or, with ``spec["device"]
    = "cuda"``, compiled on a GPU (the warm-up then compiles, and Triton's own compile hook counts what compiles
    after it): the step's EAGLE alternatives, the
    decision (``HybridStep.select`` at a depth and width bucket drawn each step, the bonus tokens int32 or int64 as
    SGLang hands them), the verify input (``build_verify_input``, fused, the tree widened to the runtime state's width:
    the full one under ragged verify), ragged verify's layout and compaction (Triton backend), ``after_verify`` (the
    accept lengths int32) and the next step's position-0 alternatives; every launch recorded
    (``kernels.warmup.record_launches``) after the start-up set was registered (``warm_up``, which compiles nothing
    under the interpreter). ``spec``: ``settings`` (``HybridSettings`` keywords), ``num_steps``, ``pool`` (request
    slots = the running limit), ``max_ctx``, ``ragged``, ``mask`` ("bool": HYBRID's own mask, FlashInfer; "uint8": the
    Triton backend's buffer), ``cost`` / ``draft_cost`` ("context": measured at start, "plain": a user's, None).
    Returns the configuration (``LaunchConfig`` fields), the variants' count, the records and those outside."""
    import dataclasses
    import tempfile

    import numpy as np
    import torch

    from sglang_hybrid.kernels import warmup
    from sglang_hybrid.kernels.ragged_layout import pending_layout
    from sglang_hybrid.kernels.variants import LaunchConfig, launch_variants
    from sglang_hybrid.sglang_plugin import alignment, context_lookup
    from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input
    from sglang_hybrid.widths import widen

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        step = _worker_step(spec, tmp)
    pool, s_max, ragged = spec["pool"], spec["num_steps"], bool(spec.get("ragged"))
    mask = spec.get("mask", "bool")
    cfg = LaunchConfig.from_step(step, max_batch=pool, ragged=ragged, mask_dtypes=(mask,),
                                 layout_mask_dtypes=("uint8",))
    warmup.reset()
    dev = step.device
    count, warm_seconds = warmup.warm_up(dev, launch_variants(cfg))
    warmup.record_launches(True)
    m, full = step.alternatives, step.n_nodes + 1
    i64 = torch.int64
    t = lambda x, dt=i64: torch.as_tensor(np.asarray(x), dtype=dt, device=dev)  # noqa: E731
    vocab = max(8, m + 3)
    step_conf = torch.rand(pool, s_max, device=dev)                      # HybridDraftWorker.step_conf
    top_p = torch.zeros(pool, s_max, m + 1, device=dev)                  # ... top_p / top_i
    top_i = torch.zeros(pool, s_max, m + 1, dtype=i64, device=dev)
    graph_ids = torch.zeros(pool * full, dtype=i64, device=dev)          # the token-tier graphs' static inputs
    graph_pos = torch.zeros(pool * full, dtype=i64, device=dev)
    committed = {sl: list(rng.integers(0, vocab, size=int(rng.integers(1, 40)))) for sl in range(pool)}
    gens = {sl: 0 for sl in range(pool)}
    for _ in range(steps):
        b = int(rng.integers(1, pool + 1))
        slots = np.sort(rng.choice(pool, size=b, replace=False))
        for sl in slots:
            if rng.random() < 0.1:
                gens[sl] += 1
                committed[sl] = list(rng.integers(0, vocab, size=int(rng.integers(1, 40))))
        pw = step.proposal_width
        props, lens = np.full((b, pw), -1), rng.integers(0, pw + 1, size=b)
        for r, sl in enumerate(slots):
            props[r, :lens[r]] = rng.integers(0, vocab, size=lens[r])
        sl_t, gen_t = t(slots), t([gens[sl] for sl in slots])
        alignment.publish(step.buffers, sl_t, t(props), t(lens), t([len(committed[sl]) for sl in slots]), gen_t,
                          *(t(rng.integers(0, 30, size=(b, pw))) for _ in range(3)), t(rng.integers(0, 2, (b, pw))))
        if step.context is not None:
            for sl in slots:
                if int(step.context.gen[sl]) != gens[sl]:
                    c = committed[sl][:-1]
                    context_lookup.write_context(step.context, t([sl] * len(c)), t(range(len(c))), t(c), t([sl]),
                                                 t([gens[sl]]))
        depth, width = int(rng.choice(step.depths)), int(rng.choice(step.widths))
        seq = t([len(committed[sl]) - 1 for sl in slots])
        root = t([committed[sl][-1] for sl in slots], torch.int32 if rng.random() < 0.5 else i64)
        chain = t(rng.integers(0, vocab, size=(b, depth)))
        conf = step_conf[:b, :depth]
        span = step.lookup_span(int(seq.max()) + 1) if rng.random() < 0.8 else None
        alt_tokens = alt_conf = None
        if m:
            top_i[:b] = t(np.stack([np.stack([rng.choice(vocab, m + 1, replace=False) for _ in range(s_max)])
                                    for _ in range(b)]))
            top_p[:b] = t(-np.sort(-rng.random((b, s_max, m + 1))), torch.float32)
            alt_tokens, alt_conf = step.step_alternatives(sl_t, gen_t, top_p[:b], top_i[:b], chain)
        d = step.select(root, chain, conf, sl_t, gen_t, seq, width=width, lookup_span=span, alt_tokens=alt_tokens,
                        alt_conf=alt_conf)
        w = full if ragged else width
        tree = widen(d.tree, w)
        seq_sum = int(seq.sum()) + int(rng.integers(0, 20))
        mask_buf = None if mask == "bool" else torch.zeros(seq_sum * w + w * w * b, dtype=torch.uint8, device=dev)
        vi = build_verify_input(tree, seq, num_steps=depth, max_depth=step.max_depth_at(w),
                                mask_mode=TreeMaskMode.FULL_MASK, seq_lens_sum=seq_sum, mask_buf=mask_buf, fused=True,
                                workspace=step.workspace)
        if ragged:
            row_bound = int(seq.max()) + w + 4
            layout = pending_layout(tree.valid, tree.ancestors, seq, seq_sum, mask_out=torch.ones(
                pool * w * row_bound + 1, dtype=torch.uint8, device=dev), row_bound=row_bound, max_rows=pool * w,
                slots=pool)
            layout.compact_ahead(vi.draft_token, vi.positions,
                                 out=(graph_ids, graph_pos) if rng.random() < 0.5 else None)
        # SGLang's verify output: int32 tokens viewed [B, W] and made int64 (the worker), int32 accept lengths
        emitted = torch.randint(0, vocab, (b * w,), dtype=torch.int32, device=dev).view(b, w).to(i64)
        accept = t(rng.integers(1, min(w, step.max_depth + 1) + 1, size=b), torch.int32)
        step.after_verify(tree, sl_t, seq, emitted, accept)
        if m:
            step.keep_first_alternatives(sl_t, gen_t, torch.softmax(torch.rand(b, vocab, device=dev), dim=-1))
        for r, sl in enumerate(slots):
            committed[sl] = committed[sl] + [int(x) for x in emitted[r, :int(accept[r])]]
    out = {"config": dataclasses.asdict(cfg), "variants": count, "warm_up_seconds": warm_seconds,
           "records": warmup.recorded(), "outside": warmup.outside(),
           "compiles_after_start": warmup.compiles_after_start()}
    warmup.reset()
    return out


def variant_counts(**overrides) -> dict:
    """The README launch's variants (``README_LAUNCH``, ``overrides`` applied) per kernel, their total, and the count
    before the kernels marked what they need not specialise on (``variants.count_before``)."""
    from sglang_hybrid.kernels.variants import LaunchConfig, by_kernel, count_before, launch_variants

    cfg = LaunchConfig(**{**README_LAUNCH, **overrides})
    v = launch_variants(cfg)
    return {"after": len(v), "before": count_before(cfg), "by_kernel": by_kernel(v)}


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
    ap.add_argument("--variants", action="store_true",
                    help="print the README launch's kernel variants compiled at start (before/after do_not_specialize) "
                         "and exit")
    ap.add_argument("--worker-spec", help=argparse.SUPPRESS)      # record_worker's configuration (JSON list)
    ap.add_argument("--steps", type=int, default=6, help=argparse.SUPPRESS)
    ap.add_argument("--record-to", help=argparse.SUPPRESS)        # phase 1 (under the interpreter)
    ap.add_argument("--compile-from", help=argparse.SUPPRESS)     # phase 2 (compiled mode)
    ap.add_argument("--results-to", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bad = [x for x in a.arch if x not in MAX_SHARED]
    if bad:
        ap.error(f"--arch {bad}: known architectures are {sorted(MAX_SHARED)}")
    if a.variants:
        c = variant_counts()
        print(f"README launch ({README_LAUNCH}): {c['after']} kernel variants compiled at start (before "
              f"do_not_specialize: {c['before']}); per kernel: {c['by_kernel']}")
        return 0
    if a.record_to and a.worker_spec:
        specs = json.loads(a.worker_spec)
        Path(a.record_to).write_text(json.dumps([record_worker(sp, a.steps, a.seed + i)
                                                 for i, sp in enumerate(specs)]))
        return 0
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
