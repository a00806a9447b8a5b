"""bench/device_run.sh in its CPU mode (what CI can run), the carry-size check, and the device path's imports.

The GPU mode runs only on a lent GPU machine (docs/benchmarks.md, "Device run"); here the same script must pass
without a GPU, say so plainly, and print no GPU verdict.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device")
    env = dict(os.environ, OUT=str(out), HYBRID_DEVICE_WHEELS=str(out / "no-wheels"))
    proc = subprocess.run(["bash", "bench/device_run.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=170)
    return proc, out


def test_cpu_mode_passes_and_says_no_gpu(cpu_run):
    proc, out = cpu_run
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "NO GPU PRESENT" in text
    assert "CPU mode: no GPU was present" in text
    assert not re.search(r"\b(MET|MISSED)\b", text), "a verdict was printed without a GPU measurement"
    assert not re.search(r"\d+(\.\d+)? ?ms\b", text), "the CPU mode printed a millisecond timing"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["on_gpu"] is False and summary["result"] == "all checks passed"
    assert set(summary["jobs"]) == {"cost_table", "selection", "ragged", "lossless"}
    assert (out / "device_run.log").read_text().strip().endswith(f"outputs in {out}/")


def test_cpu_mode_outputs(cpu_run):
    from bench.replay.costs import load_cost_spec

    _, out = cpu_run
    spec = load_cost_spec(out / "cost_tables.json")
    assert spec.kind != "measured"                       # the smoke table never passes for a measurement
    doc = json.loads((out / "cost_tables.json").read_text())
    assert doc["source"].startswith("CPU smoke") and "NOT a GPU table" in doc["source"]
    sel = json.loads((out / "selection.json").read_text())
    assert sel["failures"] == 0 and sel["verdicts"] == [], sel
    assert {(r["config"], r["W"]) for r in sel["results"]} == {("S4/K8", 13), ("S2/K24", 27), ("S6/K24", 31)}
    assert all(r["compiled_vs_eager_cpu"] == "equal" for r in sel["results"])
    rag = json.loads((out / "ragged.json").read_text())
    assert rag["failures"] == 0 and rag["on_gpu"] is False and "graph_ms" not in rag, rag
    assert rag["T"] == sum(rag["counts_batch1"]) == sum(rag["counts_batch2"])
    assert rag["counts_batch1"] != rag["counts_batch2"] and rag["max_nodes"] == rag["W"] == 29
    assert all(rag[k] == "equal" for k in ("batch1_eager_vs_cpu_and_reference", "batch1_compiled_vs_eager",
                                           "batch2_compiled_vs_eager", "batch2_compiled_vs_cpu_and_reference"))
    assert rag["negative_control_differs"].startswith("differs")
    if os.environ.get("TRITON_INTERPRET") == "1":            # the layout kernels run only where Triton does
        assert rag["ahead_kernels_vs_torch"] == "equal", rag
    else:
        assert rag["ahead_kernels"].startswith("not run: Triton cannot run here"), rag
    loss = json.loads((out / "lossless.json").read_text())
    assert loss["failures"] == 0 and loss["verify"]["cuda_vs_cpu"] == "skipped: no GPU", loss
    assert loss["decode"]["device"] == "cpu"
    assert all(m["equal_to_plain_greedy"] and m["accepted"] > 0 for m in loss["decode"]["modes"].values())
    assert set(loss["decode"]["modes"]) == {"merge", "choose", "merge ragged"}
    if loss["reference_loop"].get("status") != "skipped":   # skipped only without the Rust extension
        assert all(m["equal_to_plain_greedy"] for m in loss["reference_loop"]["modes"].values())


def test_core_table_extraction(cpu_run, tmp_path):
    from sglang_hybrid.cost import CostModel

    _, out = cpu_run
    dst = tmp_path / "core.json"
    subprocess.run([sys.executable, "-m", "bench.device.cost_table", "--core-table", "4", str(out / "cost_tables.json"),
                    str(dst)], cwd=ROOT, check=True, capture_output=True)
    m = CostModel.load(dst)
    assert list(m.sizes) == [4, 16, 52] and m.meta["requests"] == 4
    draft = tmp_path / "draft.json"
    subprocess.run([sys.executable, "-m", "bench.device.cost_table", "--draft-table", str(out / "cost_tables.json"),
                    str(draft)], cwd=ROOT, check=True, capture_output=True)
    doc = json.loads((out / "cost_tables.json").read_text())
    d = CostModel.load(draft)                  # one draft forward by batch: the worker's draft_cost_table
    assert list(d.sizes) == sorted(int(b) for b in doc["tables"])
    assert d.seconds[0] == doc["tables"][str(d.sizes[0])]["draft_step_seconds"]


def test_carry_check(tmp_path):
    from bench.device import carry

    wheels = tmp_path / "w"
    wheels.mkdir()
    names = ["pydantic-2.13.4-py3-none-any.whl",
             "pydantic_core-2.46.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "annotated_types-0.7.0-py3-none-any.whl", "typing_inspection-0.4.2-py3-none-any.whl",
             "typing_extensions-4.16.0-py3-none-any.whl"]
    for n in names:
        (wheels / n).write_bytes(b"x" * 1000)
    lines = []
    assert carry.check(ROOT, wheels, lines.append) == 0
    assert any("fits" in s for s in lines) and any("SKIPPED" in s for s in lines)   # no abi3 wheel: said so
    (wheels / names[1]).unlink()
    assert carry.check(ROOT, wheels, lines.append) == 1                                # a required wheel missing
    (wheels / names[1]).write_bytes(b"x")
    (wheels / "big.bin").write_bytes(b"\0" * (carry.LIMIT + 1))
    lines.clear()
    assert carry.check(ROOT, wheels, lines.append) == 1 and any("OVER THE LIMIT" in s for s in lines)


def test_device_path_imports_no_sglang():
    """Everything the device run imports must load on a machine without SGLang."""
    subprocess.run([sys.executable, "-m", "tests.bench._scripts.device_imports"], cwd=ROOT, check=True)
