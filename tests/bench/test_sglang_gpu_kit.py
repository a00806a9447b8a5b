"""``bench/sglang_gpu.sh --dry-run``: the GPU kit's plan, printed without a GPU. Losslessness first (the self-check on
FlashInfer and Triton, CUDA graphs on and off, overlap scheduling on; the server greedy checks), every timing after it,
every command under ``SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1``; each printed self-check parses with the
self-check's own argument parser."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from sglang_hybrid.check import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_kit_dry_run_checks_losslessness_before_any_timing(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "bench" / "sglang_gpu.sh"), "--dry-run", "org/target", "org/eagle-head",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1 for every command" in proc.stdout
    checks = [shlex.split(line[2:]) for line in lines if "-m sglang_hybrid.check" in line]
    parsed = [build_parser().parse_args(argv[argv.index("sglang_hybrid.check") + 1:]) for argv in checks]
    assert {(a.attention_backend, a.disable_cuda_graph) for a in parsed} == {
        ("flashinfer", False), ("flashinfer", True), ("triton", False), ("triton", True)}
    assert all(a.overlap == "on" and a.modes == "none,choose,merge" and a.model_path == "org/target"
               and a.draft_model_path == "org/eagle-head" for a in parsed)
    timings = [i for i, line in enumerate(lines) if "sglang.bench_serving" in line]
    last_check = max(i for i, line in enumerate(lines) if "sglang_hybrid.check" in line or "greedy outputs" in line
                     or "compare the greedy outputs" in line)
    assert timings and last_check < min(timings)                     # every check before the first timing
    assert len(timings) == 4 * 4                                      # 4 algorithms x 2 datasets x 2 concurrencies
    launches = [line for line in lines if "sglang.launch_server" in line]
    assert launches and all("--max-running-requests 128" in line for line in launches)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("+ summary")
