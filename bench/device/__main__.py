"""Run every device job in order and write a summary: ``python -m bench.device`` (``bash bench/device_run.sh`` wraps
it: installs the carried wheels first and keeps the log)."""
from __future__ import annotations

import sys
import time

import torch

from bench.device import _env


def main() -> int:
    t0 = time.perf_counter()
    on_gpu = _env.gpu()
    out = _env.out_dir()
    if not on_gpu:
        torch.set_num_threads(1)   # small CPU jobs on a shared machine: more threads only spin
    env = _env.environment()
    env["rust_extension"] = _env.use_carried_extension()
    print(f"bench/device: {env}")
    print(f"GPU: {env['gpu']}" if on_gpu else _env.NO_GPU, flush=True)
    summary = {"on_gpu": on_gpu, "environment": env, "jobs": {}}

    def job(name, fn):
        t = time.perf_counter()
        try:
            res = fn()
            failures = int(res.get("failures", 0)) if isinstance(res, dict) else 0
            status = "ok" if failures == 0 else f"{failures} FAILED"
        except Exception as e:  # keep going: later jobs still report
            res, status = None, f"FAILED: {_env.failure(e)}"
            print(f"[{name}] {status}", flush=True)
        summary["jobs"][name] = {"status": status, "seconds": round(time.perf_counter() - t, 1)}
        return res

    from bench.device import cost_table, lossless, ragged, selection

    cost_doc = job("cost_table", cost_table.run)
    job("selection", lambda: selection.run(cost_doc))
    job("ragged", ragged.run)
    job("lossless", lossless.run)
    if on_gpu and time.perf_counter() - t0 < 360:
        from bench import gpu_check

        print("[gpu_check] the core's step (both modes, verification included) captured at batch 4/32/128",
              flush=True)
        job("gpu_check", lambda: {"failures": gpu_check.check_gpu([4, 32, 128], 20)})
    sel = _load(out / "selection.json")
    summary["verdicts"] = sel.get("verdicts", []) if sel else []
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    bad = [n for n, j in summary["jobs"].items() if j["status"] != "ok"]
    summary["result"] = "all checks passed" if not bad else f"FAILED: {', '.join(bad)}"
    _env.write_json("summary.json", summary)
    print("\nSUMMARY" + ("" if on_gpu else " (CPU mode: no GPU was present; no GPU number was measured)"))
    for n, j in summary["jobs"].items():
        print(f"  {n:<11} {j['status']:<10} {j['seconds']:>6.1f} s")
    for v in summary["verdicts"]:
        print(f"  {v}")
    print(f"  {summary['result']} in {summary['seconds']} s; outputs in {out}/")
    return 0 if not bad else 1


def _load(path):
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(main())
