"""What the host launches between ragged verify's blocking read and the verify graph's replay, counted live.

    python -m bench.ragged_sync_ops [--max-new-tokens 12]

Why: under ragged verify the host reads each step's node counts (``ragged.layout.PendingLayout.read``: a blocking
device-to-host read once the draft and the decision have run), because they size the verify forward. Everything the
host launches after that read, up to the replay of the token tier's graph, runs while the device has nothing queued:
the compaction of the batch's rows and KV writes (``RaggedVerifyTarget``), the copies into the graph's static buffers
and the attention plan. (The layout itself and SGLang's verify preparation are queued before the read.) On a GPU
each of those costs host dispatch time with the device idle, so the realistic replay charges ragged verify that count
(``bench.replay.engine``, layout "ragged_sync").

How: a live SGLang CPU engine (``python -m sglang_hybrid.check --cpu``, the embedded SmolLM2 and the shipped EAGLE
head, HYBRID merge, ragged verify through the token-tier graph runner) with a counter installed in its scheduler
process (a ``sitecustomize`` on its ``PYTHONPATH``, which patches the worker's modules once they are imported: the
engine's code is unchanged). From the read (the return of ``PendingLayout.read``) to the graph runner's
``capture.run`` it counts every ATen operator that runs a kernel (allocations and views excepted, as
``bench.step_launches`` counts) and every Triton launch (SGLang's and HYBRID's kernels; the interpreter's own work
inside a launch is not counted). One record per step; the summary prints the median and maximum.

What it cannot show: the CPU engine takes SGLang's CPU branches in places (a GPU build may launch a few more or fewer
operators), and the count is not a time: the replay turns it into one with its per-operator host cost.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_hybrid.cpu_engine.torch_attention import TORCH_ATTENTION_ENV

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sglang_hybrid" / "data" / "check_prompts.jsonl"
#: where the scheduler process appends its per-step records (JSON lines)
RECORDS_ENV = "HYBRID_BENCH_SYNC_OPS_RECORDS"

#: installed in the engine's processes: counts from the read to the graph's replay
_SITECUSTOMIZE = r'''
import json, os, threading
RECORDS = os.environ["HYBRID_BENCH_SYNC_OPS_RECORDS"]

def _install(_module):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from bench.step_launches import NO_KERNEL
    from sglang_hybrid.sglang_plugin import worker
    from sglang_hybrid.sglang_plugin.ragged import graph_capture, layout, target
    state = threading.local()

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.aten, self.triton, self.in_kernel = 0, 0, 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = "aten::" + func.__name__.split(".")[0]
            if not self.in_kernel and name not in NO_KERNEL:
                self.aten += 1
            return func(*args, **(kwargs or {}))

    def start():
        state.count = Count()
        state.count.__enter__()

    def stop():
        c, state.count = state.count, None
        c.__exit__(None, None, None)
        return c

    from triton.runtime.interpreter import InterpretedFunction
    launch = InterpretedFunction.run
    def run(fn_self, *args, **kwargs):
        c = getattr(state, "count", None)
        if c is None:
            return launch(fn_self, *args, **kwargs)
        c.triton += 1
        c.in_kernel += 1
        try:
            return launch(fn_self, *args, **kwargs)
        finally:
            c.in_kernel -= 1
    InterpretedFunction.run = run

    # ahead of the read: the worker's layout build, then the verify forward's work up to the read
    build = worker.HybridWorkerV2._ragged_layout
    def build_counted(self, *a, **k):
        start()
        try:
            return build(self, *a, **k)
        finally:
            c = stop()
            state.ahead = [c.aten, c.triton]
    worker.HybridWorkerV2._ragged_layout = build_counted

    forward = target.RaggedVerifyTarget.forward_batch_generation
    def forward_counted(self, *a, **k):
        if getattr(state, "ahead", None) is None:
            return forward(self, *a, **k)
        start()
        try:
            return forward(self, *a, **k)
        finally:
            if getattr(state, "count", None) is not None and not getattr(state, "after", False):
                stop()                      # no read in this forward: nothing to record
            state.after = False
    target.RaggedVerifyTarget.forward_batch_generation = forward_counted

    read = layout.PendingLayout.read
    def read_then_count(self):
        c = stop() if getattr(state, "count", None) is not None else None
        if c is not None:
            state.ahead = [state.ahead[0] + c.aten, state.ahead[1] + c.triton]
        out = read(self)
        start()
        state.after = True
        return out
    layout.PendingLayout.read = read_then_count

    replay = graph_capture.TracedEagerCapture.run
    def stop_then_run(self, key, forward):
        if getattr(state, "after", False) and getattr(state, "count", None) is not None:
            c = stop()
            ahead, state.ahead = state.ahead, None
            with open(RECORDS, "a") as f:
                f.write(json.dumps({"tier": int(key), "aten": c.aten, "triton": c.triton, "ahead_aten": ahead[0],
                                    "ahead_triton": ahead[1]}) + "\n")
        return replay(self, key, forward)
    graph_capture.TracedEagerCapture.run = stop_then_run

from sglang_hybrid.cpu_engine.import_hook import patch_after_import
patch_after_import("sglang_hybrid.sglang_plugin.worker", _install)
'''


def count(max_new_tokens: int) -> list[dict]:
    """One live run (HYBRID merge, ragged, the torch twin of the extend kernel); its per-step records."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        records = Path(tmp, "records.jsonl")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HYBRID_")}
        env.update({"PYTHONPATH": os.pathsep.join([tmp, str(ROOT), env.get("PYTHONPATH", "")]),
                    RECORDS_ENV: str(records), TORCH_ATTENTION_ENV: "1"})
        cmd = [sys.executable, "-m", "sglang_hybrid.check", "--cpu", "--prompts", str(PROMPTS), "--modes", "merge",
               "--max-new-tokens", str(max_new_tokens), "--allow-unchecked"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the live engine failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        if not records.exists():
            raise SystemExit("no ragged verify step was counted: the run did not verify ragged through the token-tier "
                             "graph runner (see the engine's log)\n" + proc.stderr[-3000:])
        return [json.loads(line) for line in records.read_text().splitlines()]


def summary(records: list[dict]) -> dict:
    """Median and maximum per step of the ATen operators, the Triton launches and their sum, after the read and
    (``ahead_...``) queued before it."""
    out = {"steps": len(records)}
    for pre in ("", "ahead_"):
        for key in ("aten", "triton", "total"):
            vals = [r[pre + "aten"] + r[pre + "triton"] if key == "total" else r[pre + key] for r in records]
            out[pre + key] = {"median": statistics.median(vals), "max": max(vals)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args(argv)
    records = count(args.max_new_tokens)
    s = summary(records)
    for pre, what in (("", "between the blocking read and the graph replay"),
                      ("ahead_", "queued ahead of the read (the layout, the compaction, the static buffers, the "
                                 "attention plan)")):
        print(f"ragged verify, host launches {what} (MEASURED count, SGLang CPU engine, {s['steps']} steps, HYBRID "
              f"merge): ATen operators median {s[pre + 'aten']['median']:g} (max {s[pre + 'aten']['max']}), Triton "
              f"launches median {s[pre + 'triton']['median']:g} (max {s[pre + 'triton']['max']}), total median "
              f"{s[pre + 'total']['median']:g} (max {s[pre + 'total']['max']})")
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
