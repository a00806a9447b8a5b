"""Host cost of feeding HYBRID's n-gram drafter per decode step: SGLang request objects -> Rust -> staging buffers.

    python -m bench.host_path [--batches 1,32,128] [--contexts 1024,32768] [--steps 20] [--accepted 3]
                              [--proposal-width 17]

What one decode step costs on the host in the SGLang worker (``NgramFeeder.stage_batch`` + ``publish``): read each
real SGLang ``Req``'s newly committed tokens, extend the Rust automata (one batched call), propose for the batch, and
copy the proposals into the slot-indexed buffers (the device prompt lookup's context table is written at admission
only). Requests hold ``context`` tokens of real text (``bench.data``'s
long stream: code files between releases, then ShareGPT) and commit ``accepted`` new tokens per step (the stream's
continuation). Admission (the first sight of a request, which copies its whole context once) is timed apart.
``--proposal-width`` is the tokens proposed per request (the worker's ``ngram_k + max_depth + 1``: 17 as shipped,
33 with ``ngram_k = 16``, 49 with 24).

Beside it, in the same run, the way the worker fed the drafter before (rebuilding ``origin_input_ids + output_ids``
as Python lists for every request every step): O(context) per request. The two are interleaved in blocks of
``BLOCK`` steps (new path, then as many old-path steps): the old path writes ~100 MB of Python lists at 128 x 32k,
which evicts the drafter's automata from the CPU caches, so the first step of each block runs cache-cold. "step ms"
is the median of the other steps (consecutive decode steps, as a worker runs them); "cold ms" the median of the first
steps, reported beside it (a worker whose scheduler evicts the caches between steps lies between the two).

CPU only (no GPU here): ``publish`` copies to CPU tensors, so pinned-memory transfers are not measured. Medians over
``--steps`` steps; compare ratios within one run, not absolute times (shared 2-core machine).
Target (engine-efficiency issue): the feeding path at batch 128 x 32k context <= 1 ms per step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from array import array

import numpy as np
import torch

from sglang_hybrid.sglang_plugin import alignment, context_lookup
from sglang_hybrid.sglang_plugin.ngram_host import NgramFeeder

# tokens proposed per request per step in the shipped configuration (merge, ngram_k 8, 4 EAGLE steps): the worker
# buffers ngram_k + max_depth + 1 = 8 + 8 + 1 so that a proposal survives a step that accepted everything
SHIPPED_WIDTH = 17
TARGET_MS = 1.0
#: steps per block of the interleave (module docstring)
BLOCK = 5


def _requests(stream: np.ndarray, batch: int, context: int, steps: int, accepted: int):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    span = context + steps * accepted
    stride = max((len(stream) - span) // max(batch, 1), 1)
    reqs, futures = [], []
    for i in range(batch):
        start = (i * stride) % max(len(stream) - span, 1)
        window = stream[start:start + span]
        reqs.append(Req(f"r{i}", "", array("l", window[:context].tolist()), SamplingParams(max_new_tokens=span)))
        futures.append(window[context:].tolist())
    return reqs, futures


def _rebuild_lists(reqs) -> int:
    """What the worker did per step before: the full context as a Python list, per request."""
    n = 0
    for r in reqs:
        n += len(list(r.origin_input_ids) + list(r.output_ids))
    return n


def measure(stream, batch: int, context: int, steps: int, accepted: int, width: int = SHIPPED_WIDTH) -> dict:
    from sglang_hybrid.ngram import NgramDrafter

    reqs, futures = _requests(stream, batch, context, steps, accepted)
    feeder = NgramFeeder(NgramDrafter(max_draft=width), width, "cpu", max_bs=batch, context=True)
    buffers = alignment.alloc_buffers(batch, width, 2 * width, "cpu")
    table = context_lookup.alloc_context(batch, context + steps * accepted + 1, "cpu")
    slots = torch.arange(batch)
    slot_list = slots.tolist()
    gens = torch.zeros(batch, dtype=torch.int64)
    t0 = time.perf_counter()
    # admission: whole contexts, once (into the drafter and the device prompt lookup's table)
    feeder.publish(feeder.stage_batch(reqs, gens, slot_list), slots, buffers, table)
    admit_ms = 1000 * (time.perf_counter() - t0)
    warm_ms, cold_ms, rebuild_ms = [], [], []
    for s in range(steps):
        for r, fut in zip(reqs, futures):
            r.output_ids.extend(fut[s * accepted:(s + 1) * accepted])
        t0 = time.perf_counter()
        feeder.publish(feeder.stage_batch(reqs, gens, slot_list), slots, buffers, table)
        (cold_ms if s % BLOCK == 0 else warm_ms).append(1000 * (time.perf_counter() - t0))
        if s % BLOCK == BLOCK - 1 or s == steps - 1:
            for _ in range(s % BLOCK + 1):      # the old path, as many steps as this block had
                t0 = time.perf_counter()
                _rebuild_lists(reqs)
                rebuild_ms.append(1000 * (time.perf_counter() - t0))
    available = float((buffers.length > 0).float().mean())
    for r in reqs:
        feeder.finish(r.rid, natural_stop=False)
    return {"batch": batch, "context": context, "admit_ms": admit_ms,
            "step_ms": statistics.median(warm_ms or cold_ms), "cold_ms": statistics.median(cold_ms),
            "rebuild_ms": statistics.median(rebuild_ms), "proposal_rate": available,
            "longest_proposal": int(buffers.length.max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--accepted", type=int, default=3, help="tokens committed per request per step")
    ap.add_argument("--proposal-width", type=int, default=SHIPPED_WIDTH,
                    help="n-gram tokens proposed per request (the worker's ngram_k + max_depth + 1; 17 as shipped)")
    args = ap.parse_args(argv)
    if args.proposal_width < 1:
        ap.error(f"--proposal-width must be >= 1, got {args.proposal_width}")
    from bench.data import long_context_stream

    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    stream = long_context_stream(max(contexts) * 4 + args.steps * args.accepted, seed=0)
    print(f"host feeding path per decode step (NgramFeeder.stage_batch + publish, CPU tensors), {args.proposal_width} "
          "tokens proposed, "
          f"{args.accepted} tokens committed per request per step, medians of {args.steps} steps; real text")
    hdr = (f"{'batch':>5} {'context':>8} {'admission ms':>13} {'step ms':>9} {'cold ms':>9} {'old rebuild ms':>15} "
           f"{'proposals':>9}")
    print(hdr)
    print("-" * len(hdr))
    rows = []
    for c in contexts:
        for b in batches:
            r = measure(stream, b, c, args.steps, args.accepted, args.proposal_width)
            rows.append(r)
            print(f"{b:>5} {c:>8} {r['admit_ms']:>13.1f} {r['step_ms']:>9.3f} {r['cold_ms']:>9.3f} "
                  f"{r['rebuild_ms']:>15.3f} {r['proposal_rate']:>9.2f}", flush=True)
    big = [r for r in rows if r["batch"] == 128 and r["context"] == 32768]
    if not big:
        print("target (batch 128 x 32768 context) not measured at these sizes")
    else:
        r = big[0]
        verdict = "MET" if r["step_ms"] <= TARGET_MS else "MISSED"
        print(f"{verdict}: feeding path at batch {r['batch']} x {r['context']} context: {r['step_ms']:.3f} ms per "
              f"step (target <= {TARGET_MS} ms; {r['cold_ms']:.3f} ms cache-cold); the old per-step list rebuild "
              f"alone took {r['rebuild_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
