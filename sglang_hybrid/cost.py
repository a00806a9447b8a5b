"""Step-time cost model ``T(n)``: seconds for one target forward verifying ``n`` tokens in the whole batch.

The price of a verified slot is the goodput its marginal step time would earn elsewhere, so everything hinges on
``T``. We do not model it; we profile it (``profile``, or ``cost_from_one_batch`` from SGLang's one-batch benchmark)
and interpolate the table piecewise linearly. The table must be positive and essentially non-decreasing: a decreasing
``T`` would make the marginal cost -- and the price -- negative. Small decreases (timing noise) are smoothed into a
running maximum; large ones are rejected as a broken profile.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from . import _checks

FORMAT = "hybrid-spark-cost"
VERSION = 1
#: a drop larger than this fraction of the previous entry is treated as a broken profile, not noise
MAX_NOISE_DROP = 0.10


class CostFileError(ValueError):
    """A cost table (file or arguments) is malformed."""


def _validate(sizes: Sequence, seconds: Sequence) -> tuple[np.ndarray, np.ndarray]:
    try:
        s = np.asarray(sizes, dtype=np.float64)
        t = np.asarray(seconds, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise CostFileError(f"cost table sizes/seconds must be numbers: {e}") from None
    if s.ndim != 1 or t.ndim != 1:
        raise CostFileError("cost table sizes and seconds must be flat lists")
    if s.size == 0:
        raise CostFileError("cost table is empty: need at least one (size, seconds) entry")
    if s.size != t.size:
        raise CostFileError(f"cost table has {s.size} sizes but {t.size} seconds")
    if not np.all(np.isfinite(s)) or np.any(s != np.round(s)) or np.any(s < 1):
        raise CostFileError("cost table sizes must be positive integers (batch tokens)")
    if np.any(np.diff(s) <= 0):
        raise CostFileError("cost table sizes must be strictly increasing")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise CostFileError("cost table seconds must be finite and positive")
    run = np.maximum.accumulate(t)
    drop = (run - t) / run
    if np.any(drop > MAX_NOISE_DROP):
        i = int(np.argmax(drop > MAX_NOISE_DROP))
        raise CostFileError(
            f"cost table is not monotone: T({int(s[i])}) = {t[i]:.6g}s is {100 * drop[i]:.1f}% below an earlier "
            f"entry ({run[i]:.6g}s); more than the {100 * MAX_NOISE_DROP:.0f}% allowed as timing noise")
    return s.astype(np.int64), run


@dataclass
class CostModel:
    """Host-side cost table. ``sizes`` strictly increasing batch-token counts, ``seconds`` step times."""

    sizes: np.ndarray
    seconds: np.ndarray
    meta: dict = field(default_factory=dict)

    def __init__(self, sizes, seconds, meta: Optional[dict] = None):
        self.sizes, self.seconds = _validate(sizes, seconds)
        self.meta = dict(meta or {})

    # -- host evaluation -------------------------------------------------------------------------------------------
    def step_time_np(self, n) -> np.ndarray:
        """Piecewise-linear ``T(n)``; clamped below ``sizes[0]``, last slope extrapolated past ``sizes[-1]``."""
        n = np.asarray(n, dtype=np.float64)
        x, y = self.sizes.astype(np.float64), self.seconds
        out = np.interp(n, x, y)
        if x.size >= 2:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out = np.where(n > x[-1], y[-1] + slope * (n - x[-1]), out)
        return out

    def step_time_at(self, n: int) -> float:
        """``T(n)`` seconds at one batch-token count (``step_time_np`` for a single host int)."""
        return float(self.step_time_np(n))

    # -- device ----------------------------------------------------------------------------------------------------
    def to(self, device=None) -> "CostTables":
        return CostTables(torch.as_tensor(self.sizes, dtype=torch.float32, device=device),
                          torch.as_tensor(self.seconds, dtype=torch.float32, device=device))

    # -- files -----------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta,
                "sizes": [int(v) for v in self.sizes], "seconds": [float(v) for v in self.seconds]}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, obj, where: str = "cost table") -> "CostModel":
        """The table in ``obj`` (``to_json``'s form); a ``ContextCostModel`` where it has the fields of one
        (``short_context``, ``long_context``, ``short_seconds``)."""
        _checks.file_header(obj, FORMAT, VERSION, where, CostFileError)
        for k in ("sizes", "seconds"):
            if not isinstance(obj.get(k), list):
                raise CostFileError(f"{where}: missing list field {k!r}")
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise CostFileError(f"{where}: 'meta' must be an object")
        two = [k for k in ContextCostModel.FIELDS if k in obj]
        try:
            if not two:
                return cls(obj["sizes"], obj["seconds"], meta)
            if len(two) < len(ContextCostModel.FIELDS):
                missing = sorted(set(ContextCostModel.FIELDS) - set(two))
                raise CostFileError(f"a table at two contexts needs {list(ContextCostModel.FIELDS)}, missing "
                                    f"{missing}")
            return ContextCostModel(obj["sizes"], obj["seconds"], obj["short_seconds"], obj["short_context"],
                                    obj["long_context"], meta)
        except CostFileError as e:
            raise CostFileError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path) -> "CostModel":
        obj = _checks.read_json(path, CostFileError)
        return cls.from_json(obj, where=str(path))

    @classmethod
    def linear(cls, base: float, per_token: float, max_tokens: int = 4096, meta: Optional[dict] = None) -> "CostModel":
        """``T(n) = base + per_token * n`` (tests and synthetic benchmarks)."""
        return cls([1, max_tokens], [base + per_token, base + per_token * max_tokens], meta)


class ContextCostModel(CostModel):
    """Two step-time tables over the same batch-token sizes, measured with every request at ``short_context`` and at
    ``long_context`` tokens; priced each step at the batch's own mean context (``ContextCostTables.follow``).

    Why: verify attention grows with the context, so a table measured at one context misprices a batch that holds
    another: measured at start with every request at 2,048 tokens, it priced the real SmolLM2 chat trace's batch of
    128 requests (about 310 tokens each) as if each slot cost what it costs at 2,048, chose a wider verify than pays,
    and fell below no speculation there (SIMULATED, docs/benchmarks.md section 1, "The price's context"). Two probes
    and a linear blend by context (attention's cost is linear in the tokens it reads) follow any batch; extrapolated
    past ``long_context`` (raised to its running maximum, so the price never meets a negative marginal cost), flat at
    ``short_context`` below it (the weights' reads, which every context pays, dominate there).

    As a ``CostModel`` it is the table at ``long_context`` (``sizes``, ``seconds``): what start-up choices read
    (which width buckets pay, ``widths.paying_extras``), as they did before a second probe. Contract: a longer
    context never costs less, so ``seconds`` is raised to ``short_seconds`` where timing noise put it below."""

    #: the fields a cost file holds for a table at two contexts, beside ``sizes`` and ``seconds``
    FIELDS = ("short_context", "long_context", "short_seconds")

    def __init__(self, sizes, seconds, short_seconds, short_context: int, long_context: int,
                 meta: Optional[dict] = None):
        super().__init__(sizes, seconds, meta)
        _, self.short_seconds = _validate(sizes, short_seconds)
        for name, c in (("short_context", short_context), ("long_context", long_context)):
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
                raise CostFileError(f"{name} must be a positive int (tokens a request), got {c!r}")
        if not short_context < long_context:
            raise CostFileError(f"short_context ({short_context}) must be below long_context ({long_context})")
        self.short_context, self.long_context = int(short_context), int(long_context)
        self.seconds = np.maximum(self.seconds, self.short_seconds)

    def at(self, context: float) -> CostModel:
        """The host table at ``context`` tokens a request (``ContextCostTables.follow``'s rule, in float64)."""
        w = max(0.0, (float(context) - self.short_context) / (self.long_context - self.short_context))
        blended = self.short_seconds + w * (self.seconds - self.short_seconds)
        return CostModel(self.sizes, np.maximum.accumulate(blended), self.meta)

    def to(self, device=None) -> "ContextCostTables":
        f32 = torch.float32
        return ContextCostTables(torch.as_tensor(self.sizes, dtype=f32, device=device),
                                 torch.as_tensor(self.short_seconds, dtype=f32, device=device),
                                 torch.as_tensor(self.seconds, dtype=f32, device=device),
                                 self.short_context, self.long_context)

    def to_json(self) -> dict:
        return {**super().to_json(), "short_context": self.short_context, "long_context": self.long_context,
                "short_seconds": [float(v) for v in self.short_seconds]}


class CostTables:
    """Device copy of a ``CostModel``: ``step_time(n)`` with bucketize + gathers only."""

    def __init__(self, sizes: torch.Tensor, seconds: torch.Tensor):
        self.sizes = sizes
        self.seconds = seconds
        # slope used per segment index 0..n: segment 0 (below sizes[0]) is flat, segment n extrapolates the last
        zero = torch.zeros(1, dtype=torch.float32, device=sizes.device)
        if sizes.numel() >= 2:
            slopes = (seconds[1:] - seconds[:-1]) / (sizes[1:] - sizes[:-1])
            self._seg_slope = torch.cat([zero, slopes, slopes[-1:]])
        else:
            self._seg_slope = torch.zeros(2, dtype=torch.float32, device=sizes.device)

    @property
    def device(self):
        return self.sizes.device

    def step_time(self, n: torch.Tensor) -> torch.Tensor:
        """``T(n)`` in seconds, float32, same shape as ``n``."""
        nf = n.to(torch.float32)
        seg = torch.bucketize(nf, self.sizes, right=True)  # 0 = below first size, len = at/after last
        left = (seg - 1).clamp(min=0)
        x0 = torch.take(self.sizes, left)           # take (not []) so 0-dim indices stay tensor ops
        y0 = torch.take(self.seconds, left)
        slope = torch.take(self._seg_slope, seg)
        return y0 + slope * (nf - x0).clamp(min=0.0)


def _timed_call(fn: Callable[[int], object], n: int, sync: Optional[Callable[[], None]]) -> float:
    """Seconds of one ``fn(n)``, ``sync`` (when given) called before the clock is read, so asynchronous work counts;
    the caller has already synchronised whatever ran before."""
    t0 = time.perf_counter()
    fn(n)
    if sync:
        sync()
    return time.perf_counter() - t0


def profile(fn: Callable[[int], object], sizes: Sequence[int], warmup: int = 2, repeats: int = 5,
            sync: Optional[Callable[[], None]] = None, meta: Optional[dict] = None) -> CostModel:
    """Time ``fn(n)`` (one forward verifying ``n`` batch tokens) at each probe size; median of ``repeats``.

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before reading the clock so asynchronous work is counted.
    """
    sizes = sorted(int(n) for n in sizes)
    if not sizes:
        raise ValueError("profile: need at least one probe size")
    if warmup < 0 or repeats < 1:
        raise ValueError("profile: warmup must be >= 0 and repeats >= 1")
    secs = []
    for n in sizes:
        for _ in range(warmup):
            fn(n)
        if sync:
            sync()
        secs.append(statistics.median(_timed_call(fn, n, sync) for _ in range(repeats)))
    m = dict(meta or {})
    m.setdefault("warmup", warmup)
    m.setdefault("repeats", repeats)
    m.setdefault("statistic", "median")
    return CostModel(sizes, secs, m)


def profile_interleaved(fn: Callable[[int], object], sizes: Sequence[int], rounds: int = 2,
                        sync: Optional[Callable[[], None]] = None, meta: Optional[dict] = None,
                        monotone: bool = False, warmup: bool = True,
                        more: Optional[Callable[[float], bool]] = None) -> CostModel:
    """Time ``fn(n)`` at each probe size in ``rounds`` round-robin passes over the sizes, after one warm-up call at
    the smallest; the minimum per size.

    For a budget of a few calls (a server's start-up): one warm-up, at the cheapest size, pays the first call's
    one-time costs (lazy initialisation) once, not per size; a cost that comes once per size (a kernel chosen per
    shape) lands in the first round and the minimum over the rounds drops it; round robin spreads any drift of the
    machine over every size; the minimum is the standard estimate of a call's cost from few samples (noise only ever
    adds time).
    ``sync`` as in ``profile``. ``monotone``: each size's time is raised to the largest time of the sizes below it
    (a running maximum), so that a noisy sample can never make the table decrease (which ``CostModel`` refuses beyond
    ``MAX_NOISE_DROP``): for a table measured where no one can rerun it by hand. ``warmup`` False: no warm-up call,
    for a second table timed right after a first at the same sizes, whose calls already paid those costs. ``more``:
    asked after each round but the last, with that round's seconds, whether to run another (a start-up's time budget,
    ``startup_costs.StartBudget``); the first round always runs, so every size has a time. ``meta["rounds"]`` is the
    number of rounds run."""
    sizes = sorted(int(n) for n in sizes)
    if not sizes:
        raise ValueError("profile_interleaved: need at least one probe size")
    if rounds < 1:
        raise ValueError("profile_interleaved: rounds must be >= 1")
    if warmup:
        fn(sizes[0])
    times: dict = {n: [] for n in sizes}
    for run in range(1, rounds + 1):
        for n in sizes:
            if sync:
                sync()                      # the warm-up's asynchronous work is not this call's
            times[n].append(_timed_call(fn, n, sync))
        if run < rounds and more is not None and not more(sum(t[-1] for t in times.values())):
            break
    m = dict(meta or {})
    m.setdefault("warmup", "one call at the smallest size" if warmup else "none (the sizes' calls were warm)")
    m.setdefault("rounds", run)
    m.setdefault("statistic", "minimum over interleaved rounds" + (", then running maximum" if monotone else ""))
    secs = np.array([min(times[n]) for n in sizes])
    return CostModel(sizes, np.maximum.accumulate(secs) if monotone else secs, m)


def cost_from_one_batch(path) -> CostModel:
    """``CostModel`` from SGLang's own one-batch benchmark (``sglang.benchmark.one_batch_server --result-filename``
    JSONL, one line per batch size; the median of repeated batch sizes is used).

    At batch size ``b`` each decode step runs ``b`` tokens and the server reports its decode throughput
    ``last_gen_throughput`` (tokens/s), so ``T(b) = b / last_gen_throughput`` on *this* GPU, model, attention backend
    and CUDA-graph buckets. A verify step of ``R`` requests x ``W`` tokens runs ``R * W`` tokens with ``R`` KV contexts
    rather than ``R * W``, so this slightly overstates attention cost at long context; it keeps the shape that matters
    (flat while memory-bound, rising once compute-bound, steps at graph buckets). The command that writes a table from
    such a file: ``python -m sglang_hybrid.tools.cost_profile``.
    """
    by_bs: dict = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            bs, thr = int(rec["batch_size"]), float(rec["last_gen_throughput"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a one_batch_server result line ({e})") from None
        if thr <= 0:
            raise ValueError(f"{path}:{n}: last_gen_throughput {thr} (the server reported no decode throughput; "
                             "use a longer --output-len)")
        by_bs.setdefault(bs, []).append(bs / thr)
    if not by_bs:
        raise ValueError(f"{path}: no result lines")
    sizes = sorted(by_bs)
    secs = [sorted(by_bs[b])[len(by_bs[b]) // 2] for b in sizes]
    return CostModel(sizes, secs, {"source": "sglang.benchmark.one_batch_server", "file": str(path),
                                   "rule": "T(b) = b / last_gen_throughput"})


class ContextCostTables(CostTables):
    """Device copy of a ``ContextCostModel``: ``step_time`` reads the table blended at the context of the batch last
    given to ``follow`` (at ``long_context`` until then).

    The blend is written in place into ``seconds`` and the segment slopes, so whatever reads them (``step_time``, the
    fused decision's kernels) sees it without new tensors: fixed addresses, no allocation, no host sync per step."""

    def __init__(self, sizes: torch.Tensor, short_seconds: torch.Tensor, long_seconds: torch.Tensor,
                 short_context: int, long_context: int):
        super().__init__(sizes, long_seconds.clone())
        self.short_seconds = short_seconds
        self.long_seconds = long_seconds
        self.short_context, self.long_context = int(short_context), int(long_context)
        f32 = torch.float32
        #: the blend's constants as float32 tensors, so the torch rule and the kernel (``kernels.cost_context``)
        #: compute the same float32 operations on the same values
        self._c_short = torch.tensor(float(short_context), dtype=f32, device=sizes.device)
        self._c_span = torch.tensor(float(long_context - short_context), dtype=f32, device=sizes.device)

    def follow(self, seq_lens: torch.Tensor) -> None:
        """Price at the mean of ``seq_lens`` (committed tokens per request, the batch's rows): with
        ``w = max(0, (mean - short_context) / (long_context - short_context))``, ``seconds`` becomes the running
        maximum of ``short + w * (long - short)``, and the slopes follow. Device operators only (static shapes, no
        sync); ``kernels.follow_context`` is the same rule in one launch."""
        mean = seq_lens.sum().to(torch.float32) / seq_lens.numel()
        w = ((mean - self._c_short) / self._c_span).clamp(min=0.0)
        blended = torch.cummax(self.short_seconds + w * (self.long_seconds - self.short_seconds), 0).values
        self.seconds.copy_(blended)
        if self.sizes.numel() >= 2:
            slopes = (blended[1:] - blended[:-1]) / (self.sizes[1:] - self.sizes[:-1])
            self._seg_slope[1:-1].copy_(slopes)
            self._seg_slope[-1:].copy_(slopes[-1:])
