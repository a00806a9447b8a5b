"""The per-step Triton kernels compiled for a GPU by Triton's real CUDA backend, on this CPU (``bench.gpu_compile``).

The interpreter that runs them everywhere else here accepts what the compiler may refuse; these tests compile every
entry kernel of ``sglang_hybrid.kernels`` for Hopper (sm_90: H100, H200) at the block shapes a GPU launches them with,
recorded while the exactness harnesses run them under the interpreter with the GPU's rows per program (so the
multi-program paths a GPU takes are compared with the torch path too). Nothing is launched: compile success, shared
memory and threads within the architecture's limits are what is checked. The full run (two architectures, more
batches) is ``python -m bench.gpu_compile``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import gpu_compile

ROOT = Path(__file__).resolve().parents[2]


def test_every_step_kernel_compiles_for_hopper_at_the_gpu_block_shapes():
    s = gpu_compile.run(archs=(90,), batches=8, episodes=2, ragged=4, seed=3)
    assert s["failed"] == 0, {k: v["error"] for k, v in s["kernels"].items() if v["failed"]}
    assert s["missing"] == [], s["missing"]
    expected = gpu_compile.entry_kernels()
    assert len(expected) >= 10 and all(f"{k} sm_90" in s["kernels"] for k in expected), sorted(s["kernels"])
    # the decision's ranking is rows x pool x pool per program: at the GPU's 8 rows it fits in a few KiB of shared
    # memory (at the interpreter's 256 rows the same kernel's PTX took ptxas over 20 minutes and 11 GB)
    assert s["kernels"]["sglang_hybrid.kernels.decision._select_kernel sm_90"]["max_shared"] <= 16 * 1024


def test_a_kernel_that_does_not_compile_and_one_never_launched_are_reported(tmp_path):
    records = tmp_path / "records.json"
    # a real kernel given the wrong arguments: the compile fails, and the failure must be counted, not skipped
    records.write_text(json.dumps([{"module": "sglang_hybrid.kernels.ragged_layout", "kernel": "_compact_kernel",
                                    "args": [{"value": 1}], "kwargs": {}}]))
    results = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_compile", "--compile-from", str(records),
                           "--results-to", str(results), "--arch", "90"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(results.read_text())
    s = gpu_compile.summarize(got["results"], got["expected"])
    assert s["failed"] == 1 and s["kernels"]["sglang_hybrid.kernels.ragged_layout._compact_kernel sm_90"]["error"]
    assert set(s["missing"]) == set(got["expected"])        # nothing compiled: every entry kernel is missing
