"""What measuring the cost tables at start adds to a HYBRID engine's start-up, on SGLang's CPU engine.

    python -m bench.startup_profile [--rounds 3]

Starts the real HYBRID engine (``sglang.Engine``, SGLang's CPU engine, the embedded SmolLM2-135M and the shipped
EAGLE head, the live suite's settings: 4 running requests, a 1,024-token context, 3 EAGLE steps) with the setting
``measure_cost_table`` on and off, alternately, ``--rounds`` times each, every start in a fresh process. Start-up is
the wall time of the ``sglang.Engine(...)`` call (until the engine serves); after it, one 2-token request makes the
worker write its counters, whose ``cost_table`` says what the measurement found and how long it took. Prints per
start the time, the first request's time (a start without the measurement would pay its first forward's one-time
costs there, which the measurement's warm-up pays during the start) and, for ``on``, the measured tables (the
verify's and the draft forward's, ``draft_cost_table``, which also turns on adaptive drafting and so builds the
shallower depths' runtime states) with the rounds the start's budget afforded (``startup_costs.StartBudget``); then
the median start-up per setting, their ratio, the median of the rounds' paired differences, the medians of start
plus first request, and the target: start-up grows by at most 10 % with the measurement (MET / MISSED).

Both run extend and decode attention, and the draft plan's KV-index kernel, with the torch twins of SGLang's Triton
kernels (``HYBRID_CPU_ENGINE_TORCH_ATTENTION``): in Triton's interpreter, the CPU engine's default, one verify probe
forward at this context takes longer than the whole start (the reason ``measure_cost_table = auto`` does not measure
on the CPU engine), and the draft probe, all decode attention and its plan, took 5.2-5.6 s of a 26-28 s start with
both kernels interpreted, 0.5-0.7 s with the decode twin, about 0.2 s with the KV-index twin too.
Start-up times on a shared 2-core machine swing by several seconds: compare the medians of one run, interleaved, not
single starts; the line "the measurements themselves" (the tables' own ``seconds_spent``) is the part of the growth
that noise does not move.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_GROWTH = 0.10


def one_start(measure: str) -> dict:
    """In this (fresh) process: start the engine with ``measure_cost_table = measure``, time it, serve one request."""
    from sglang_hybrid.cpu_engine import prepare_environment
    from sglang_hybrid.cpu_engine.torch_attention import TORCH_ATTENTION_ENV

    prepare_environment()
    os.environ[TORCH_ATTENTION_ENV] = "1"
    import sglang

    from sglang_hybrid.cpu_engine import engine_kwargs
    from sglang_hybrid.reference.models import ensure_converted
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    counters = Path(tempfile.mkdtemp(prefix="hybrid_startup_")) / "counters.json"
    os.environ.update({ENV_PREFIX + "MEASURE_COST_TABLE": measure, ENV_PREFIX + "COUNTERS_FILE": str(counters),
                       ENV_PREFIX + "LOG_INTERVAL": "1"})
    head = ROOT / "sglang_hybrid" / "data" / "eagle_smollm2"
    kw = engine_kwargs(str(ensure_converted()), speculative=dict(
        speculative_algorithm="HYBRID", speculative_draft_model_path=str(head), speculative_num_steps=3))
    t0 = time.perf_counter()
    eng = sglang.Engine(**kw)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        eng.generate(["def add(a, b):\n    return a + b\n"], {"temperature": 0, "max_new_tokens": 2})
        first_s = time.perf_counter() - t0
    finally:
        eng.shutdown()
    got = json.loads(counters.read_text()) if counters.exists() else {}
    return {"measure": measure, "start_s": start_s, "first_request_s": first_s, "cost_table": got.get("cost_table"),
            "draft_cost_table": got.get("draft_cost_table")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="starts per setting, alternating (default 3)")
    ap.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)    # the child process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_start(args.one)), flush=True)
        return 0
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HYBRID_")}
    runs: dict = {"on": [], "off": []}
    print("HYBRID start-up on SGLang's CPU engine (SmolLM2-135M, torch-twin extend and decode attention), "
          f"measure_cost_table on vs off, {args.rounds} alternating starts each; MEASURED wall time of "
          "sglang.Engine(...)", flush=True)
    for r in range(args.rounds):
        for measure in (("on", "off") if r % 2 == 0 else ("off", "on")):
            proc = subprocess.run([sys.executable, "-m", "bench.startup_profile", "--one", measure], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[measure].append(res)
            line = (f"  round {r + 1} {measure:>3}: start {res['start_s']:6.1f} s, first request "
                    f"{res['first_request_s']:4.1f} s")
            tables = {"verify": res["cost_table"], "draft": res["draft_cost_table"]}
            if measure == "on":
                for what, table in tables.items():
                    if not table or table.get("source") != "measured":
                        print(f"{line}: the engine reported no measured {what} table ({table})", file=sys.stderr)
                        return 1
                    pairs = ", ".join(f"T({n})={1e3 * t:.0f} ms" for n, t in zip(table["sizes"], table["seconds"]))
                    meta = table["meta"]
                    line += (f"; {what} measured in {meta['seconds_spent']:.1f} s ({meta['rounds']} round(s), budget "
                             f"{meta['start_budget_s']:.2f} s): {pairs}")
            elif any(t is not None for t in tables.values()):
                print(f"{line}: a table was set with the measurement off ({tables})", file=sys.stderr)
                return 1
            print(line, flush=True)
    on = statistics.median(r["start_s"] for r in runs["on"])
    off = statistics.median(r["start_s"] for r in runs["off"])
    spent = statistics.median(r["cost_table"]["meta"]["seconds_spent"] + r["draft_cost_table"]["meta"]["seconds_spent"]
                              for r in runs["on"])
    growth = on / off - 1
    paired = statistics.median(a["start_s"] - b["start_s"] for a, b in zip(runs["on"], runs["off"]))
    print(f"median start-up: measure on {on:.1f} s, off {off:.1f} s: {100 * growth:+.1f} % "
          f"(the median of the rounds' on-minus-off: {paired:+.1f} s, {100 * paired / off:+.1f} %; the measurements "
          f"themselves: median {spent:.1f} s, {100 * spent / off:.1f} % of the start without it)")
    first_on = statistics.median(r["start_s"] + r["first_request_s"] for r in runs["on"])
    first_off = statistics.median(r["start_s"] + r["first_request_s"] for r in runs["off"])
    print(f"median start-up and first request (one-time costs a start without the measurement pays in its first "
          f"forward): on {first_on:.1f} s, off {first_off:.1f} s: {100 * (first_on / first_off - 1):+.1f} % "
          "(not the target's figure, for context)")
    print(f"target: start-up grows by <= {100 * TARGET_GROWTH:.0f} % with the measurement: "
          f"{'MET' if growth <= TARGET_GROWTH else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
