"""What the replay charges each engine for its own per-step work beyond the cost table: host time and kernel launches.

Why a module of its own: a step's price in the replay is the target forward and the draft forwards (the cost table),
plus whatever each engine does around them. That work differs by policy and decides close calls (half a millisecond a
step moves code batch 4 by 10 %), so every number sits here, with where it was measured:

* **Our n-gram drafter's host path** (HYBRID, and our n-gram drafter alone): feed the committed tokens, batched Rust
  propose, publish. `bench.host_path` measured the worker's whole path on this 2-core machine,
  context 1k tokens (docs/benchmarks.md section 3): 0.114 ms at batch 1, 0.359 ms at 32, 0.819 ms at 128;
  `host_seconds` interpolates linearly in the batch size. It runs before the step's launches; with overlap scheduling
  it hides under the device's previous step (the engine's ``host_overlaps``).
* **vLLM's prompt lookup** (the n-gram proposer of vLLM v1: a numba scan of each request's tokens on the CPU), from
  `bench.drafters` (docs/bench_drafters.md, per-step cost of one request at k = 8, median of propose + update:
  11.7 us at a 1,024-token context, 18.9 us at 8,192, 39.7 us at 32,768); `prompt_lookup_seconds` sums it over the
  batch, interpolated in each request's context. vLLM runs the proposer after the sampled tokens reach the host, so
  it does not overlap the device (charged device + host).
* **Arctic Inference's suffix decoding** (vLLM's suffix proposer, on the CPU), from `bench.drafters` likewise: 8.0 us at
  1,024 tokens, 11.8 us at 8,192, 8.6 us at 32,768 per request and step (`suffix_seconds`), not overlapped.
* **Kernel launches of the decision** (`LaunchCost`): HYBRID's worker runs its decision eagerly between the EAGLE
  draft and the verify forward; `bench.step_launches` counts its launches (7 on the fused Triton path). Each launch
  costs ``host_us`` of host dispatch and ``gpu_us`` of GPU time, MEASURED on an H200 (the device kit's selection job,
  `bash bench/device_run.sh`, `docs/device_run/selection.json` and `selection_fourth.json`: the fused step
  at the replay's configurations S4/K8, S2/K24 and S6/K24, batch 1-128, two runs). GPU: the step captured in a CUDA
  graph replays in 0.045-0.063 ms at S4/K8 and 0.080-0.121 ms at the K24 configurations (W 27 and 31); ``gpu_us`` =
  15 us per launch is the widest configuration's median (0.105 ms / 7), charged to every configuration (S4/K8 alone
  would be 7.1 us). Host: run eagerly as the worker runs it, the step takes 0.29-0.76 ms of host time per call by the
  wall clock over the 24 shapes and runs, median 0.36 ms: ``host_us`` = 51 us per launch (Triton's Python launcher
  and the step's argument handling; before the workspace cached its views, three earlier runs gave 0.48-1.01 ms
  by CUDA events). Published figures for a small eagerly dispatched operator (about 5-10 us of host time, 2-3 us of
  GPU time: NVIDIA Technical Blog, "Getting Started with CUDA Graphs", 2019) would favour HYBRID on both. The GPU time
  lies on the critical path between draft and verify; the host dispatch runs on the host with the rest of the step's
  host work (overlapping the device's previous step where the engine overlaps: the step costs max(device, host)).
  The torch path (888-1108 eager ATen operators) is charged per operator at the published figures, 5 us host and
  2 us GPU each (``op_host_us``, ``op_gpu_us``): the device kit did not time it.
  SGLang's own EAGLE per-step work (its tree build and verify kernels) is inside the cost table's fixed per-step
  overhead, for EAGLE and HYBRID alike: HYBRID's count includes its own tree links and mask, so it pays twice for
  that part (a few launches; against HYBRID).
"""
from __future__ import annotations

import dataclasses

import numpy as np

#: (batch, seconds per decode step) of the worker's n-gram host path, measured by bench.host_path (context 1k)
HOST_PATH_MEASURED = ((1, 0.114e-3), (32, 0.359e-3), (128, 0.819e-3))
#: (context tokens, seconds per request and step) of vLLM's prompt lookup at k = 8, measured by bench.drafters
PROMPT_LOOKUP_MEASURED = ((1024, 11.7e-6), (8192, 18.9e-6), (32768, 39.7e-6))
#: the same for Arctic Inference's suffix decoding cache, measured by bench.drafters
SUFFIX_MEASURED = ((1024, 8.0e-6), (8192, 11.8e-6), (32768, 8.6e-6))


def interp_extend(x: float, xs, ys) -> float:
    """``ys`` at ``x``: linear between the points ``xs`` (increasing), held below the first, along the last segment
    past the last one."""
    if x <= xs[-1] or len(xs) < 2:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(ys[-1] + slope * (x - xs[-1]))


def host_seconds(batch: int) -> float:
    """The n-gram host path's seconds per decode step at ``batch`` requests (linear in the measured points, extended
    linearly past 128)."""
    return interp_extend(batch, *zip(*HOST_PATH_MEASURED))


def _per_request(measured, context) -> float:
    """Host seconds of one step over requests with these context lengths (tokens each), from per-request
    measurements (context, seconds) interpolated in the context and held at the ends."""
    cs, ts = zip(*measured)
    return float(np.interp(np.asarray(context, np.float64), cs, ts).sum())


def prompt_lookup_seconds(context) -> float:
    """vLLM prompt lookup's host seconds for one step over requests with these context lengths."""
    return _per_request(PROMPT_LOOKUP_MEASURED, context)


def suffix_seconds(context) -> float:
    """Arctic suffix decoding's host seconds for one step over requests with these context lengths."""
    return _per_request(SUFFIX_MEASURED, context)


@dataclasses.dataclass(frozen=True)
class LaunchCost:
    """Cost of the work an engine launches eagerly each step (module docstring), in microseconds: a launch of the
    fused Triton decision (``host_us``, ``gpu_us``: measured on an H200) and one eager ATen operator of the torch
    path (``op_host_us``, ``op_gpu_us``: published figures; the torch path was not timed on a GPU)."""

    host_us: float = 51.0
    gpu_us: float = 15.0
    op_host_us: float = 5.0
    op_gpu_us: float = 2.0

    def device_s(self, launches: int, ops: int = 0) -> float:
        return (launches * self.gpu_us + ops * self.op_gpu_us) * 1e-6

    def host_s(self, launches: int, ops: int = 0) -> float:
        return (launches * self.host_us + ops * self.op_host_us) * 1e-6

    def describe(self) -> str:
        return (f"decision: {self.host_us:g} us host dispatch + {self.gpu_us:g} us GPU per fused launch (measured on "
                f"an H200, docs/device_run/), {self.op_host_us:g} + {self.op_gpu_us:g} us per eager ATen operator "
                "(published; bench.replay.host; counts from bench.step_launches)")
