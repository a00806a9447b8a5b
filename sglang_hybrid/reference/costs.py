"""What the CPU reference loop pays per step, as a table: profiled robustly, shipped as a default, and used to turn a
run's deterministic counts into a cost-model speedup.

Why: on a 2-core CPU that other jobs share, a verify cost profiled once at start-up under load can price every draft
out, and wall-clock speedups of modes run one after another measure the load, not the method. So the demo prices with
a table measured once on an idle machine and shipped inside the package (``DEFAULT_PATH``; ``--reprofile``
measures this machine instead), and prints beside the timed speedup a *cost-model* speedup computed from what the run
did (target forwards and their widths, EAGLE draft steps) and this table -- a number that no load swing can move.

The table (``LoopCosts``):

* ``verify`` -- ``CostModel`` of one request's target forward: ``n`` new tokens over a ``context``-token KV cache
  (the loop runs one forward per request per step, ``n = verified nodes + 1``; a prefill of ``L`` tokens is priced as
  ``verify(L)``). This is the table the loop's price uses (``ReferenceLoop(cost=...)``).
* ``draft_lm`` -- ``CostModel`` of one batched draft read of the lm_head (plus softmax / argmax) over ``A`` rows:
  the EAGLE drafter drafts one chain position for all requests still drafting with one lm_head read (the dominant
  CPU cost, 49k x 576 weights).
* ``draft_head`` -- seconds of one EAGLE head forward (fc + one layer) for one request and one token over its cache;
  a request's chain of ``L`` tokens costs ``L - 1`` of them, and committing the accepted tokens costs one more.

Profiling (``profile_loop_costs``): a warm-up, then ``repeats`` rounds that each time every probe once (interleaved,
so a burst of load hits every probe alike); per probe the minimum over rounds (the least disturbed estimate on a
shared machine); then a monotone fit -- weighted pool-adjacent-violators over the probe sizes, since a wider forward
never really costs less -- instead of the running maximum, which only ever raises noisy points.

The cost-model time of a run (``modeled_seconds``) sums, over steps: one ``verify(nodes + 1)`` per active request,
the draft steps (``draft_lm(A_j)`` for each chain position ``j`` with ``A_j`` requests drafting it, ``L - 1`` head
forwards per chain, one head forward per request to commit), plus one ``verify(len(prompt) - 1)`` prefill per
request. Not modelled: the n-gram drafter (microseconds, in Rust), Python overhead of the decision step, KV
compaction.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sglang_hybrid.cost import CostModel

FORMAT = "hybrid-spark-cpu-loop-costs"
VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "cpu_cost_smollm2.json"
#: one request's forward widths (decode steps use 1..n_nodes + 1; the larger ones price prefill)
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 10, 13, 16, 24, 32, 64, 128, 256, 512)
DRAFT_ROWS = (1, 2, 3, 4, 6, 8)


class CostTableError(ValueError):
    """A loop cost table (file or dict) is malformed."""


def monotone_fit(sizes, seconds, weights=None) -> list[float]:
    """Non-decreasing least-squares fit of ``seconds`` over increasing ``sizes`` (weighted PAV)."""
    from sglang_hybrid.calibration import pav

    y = np.asarray(seconds, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    if y.ndim != 1 or y.size != len(sizes) or w.shape != y.shape:
        raise ValueError("monotone_fit: sizes, seconds and weights must be flat and of equal length")
    return [float(v) for v in pav(y, w)]


@dataclass
class LoopCosts:
    verify: CostModel
    draft_lm: CostModel
    draft_head: float
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (np.isfinite(self.draft_head) and self.draft_head > 0):
            raise CostTableError(f"draft_head must be a positive number of seconds, got {self.draft_head!r}")

    def draft_position(self) -> CostModel:
        """Seconds of one EAGLE chain position for ``R`` requests: one batched lm_head read plus ``R`` head forwards
        (``draft_lm(R) + R * draft_head``), the ``draft_cost`` the loop's adaptive drafting prices depth with."""
        rows = [int(r) for r in self.draft_lm.sizes]
        secs = [float(t) + r * self.draft_head for r, t in zip(rows, self.draft_lm.seconds)]
        return CostModel(rows, secs, {"what": "one EAGLE chain position for R requests (lm_head read + R head steps)"})

    # -- files -----------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta,
                "verify": {"sizes": [int(v) for v in self.verify.sizes],
                           "seconds": [float(v) for v in self.verify.seconds]},
                "draft_lm": {"rows": [int(v) for v in self.draft_lm.sizes],
                             "seconds": [float(v) for v in self.draft_lm.seconds]},
                "draft_head_seconds": float(self.draft_head)}

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, obj, where: str = "loop cost table") -> "LoopCosts":
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise CostTableError(f"{where}: 'format' must be {FORMAT!r}")
        if obj.get("version") != VERSION:
            raise CostTableError(f"{where}: unsupported version {obj.get('version')!r} (expected {VERSION})")
        try:
            v, d = obj["verify"], obj["draft_lm"]
            verify = CostModel(v["sizes"], v["seconds"], {"what": "one request's verify forward"})
            draft = CostModel(d["rows"], d["seconds"], {"what": "one batched lm_head draft read"})
            head = float(obj["draft_head_seconds"])
        except (KeyError, TypeError) as e:
            raise CostTableError(f"{where}: missing or malformed field ({e})") from None
        except ValueError as e:
            raise CostTableError(f"{where}: {e}") from None
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise CostTableError(f"{where}: 'meta' must be an object")
        return cls(verify, draft, head, meta)

    @classmethod
    def load(cls, path=None) -> "LoopCosts":
        """``path=None``: the default table shipped with the package."""
        path = Path(path) if path is not None else DEFAULT_PATH
        try:
            obj = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"loop cost table not found: {path}") from None
        except ValueError as e:
            raise CostTableError(f"{path}: not valid JSON ({e})") from None
        return cls.from_json(obj, where=str(path))


# ------------------------------------------------------------------------------------------------------------------
# profiling
# ------------------------------------------------------------------------------------------------------------------

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _rounds(probes: dict, repeats: int, warmup: int = 1, clock=time.perf_counter) -> dict:
    """``{name: fn}`` -> ``{name: [seconds per round]}``; every round times every probe once (interleaved)."""
    for _ in range(warmup):
        for fn in probes.values():
            fn()
    times = {k: [] for k in probes}
    for _ in range(repeats):
        for k, fn in probes.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return times


@torch.no_grad()
def profile_loop_costs(target, head=None, context: int = 384, verify_sizes=VERIFY_SIZES, draft_rows=DRAFT_ROWS,
                       repeats: int = 5, warmup: int = 1, draft_dtype=None, threads: int | None = None,
                       clock: str = "wall") -> LoopCosts:
    """Measure ``LoopCosts`` for ``target`` (and ``head``, for the draft costs) on this machine.

    Minimum over ``repeats`` interleaved rounds per probe, then a monotone fit (see the module docstring). Without a
    head the draft costs are measured on a freshly initialised one of the same shape (the cost does not depend on the
    weights). ``clock="cpu"`` times the process's CPU time instead of the wall clock: on a machine whose cores other
    jobs time-slice, that is what a forward costs when it runs (it needs ``torch.get_num_threads() == 1``: with more
    threads CPU time adds up across them); it does not see memory-bandwidth contention.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and torch.get_num_threads() != 1:
        raise ValueError("clock='cpu' needs torch.set_num_threads(1) (CPU time sums over threads)")
    from sglang_hybrid.reference.eagle import new_head
    from sglang_hybrid.reference.loop import _clone, cache_kw

    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    t_start = time.perf_counter()
    target = target.eval()
    cfg = target.config
    V = cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    from transformers import DynamicCache

    kw = cache_kw(target)
    base = DynamicCache()
    target.model(input_ids=torch.randint(0, V, (1, context), generator=g), use_cache=True, **{kw: base})

    def verify(n):
        def run():
            out = target.model(input_ids=torch.randint(0, V, (1, n), generator=g), use_cache=True,
                               position_ids=torch.arange(context, context + n)[None], **{kw: _clone(base)})
            target.lm_head(out.last_hidden_state).float()
        return run

    def clone_only():
        _clone(base)

    # drafting, in the dtype the loop drafts in
    head = head if head is not None else new_head(cfg)
    own = next(head.parameters()).dtype
    dd = draft_dtype or own
    hd = head if dd == own else __import__("copy").deepcopy(head).to(dd)
    hd = hd.eval()
    lm_w = target.get_output_embeddings().weight.detach().to(dd)
    emb_w = target.get_input_embeddings().weight.detach().to(dd)
    h = cfg.hidden_size
    feats = torch.randn(1, context, h, generator=g).to(dd)
    _, head_cache = hd(torch.nn.functional.embedding(torch.randint(0, V, (1, context), generator=g), emb_w), feats,
                       torch.arange(context)[None])

    def draft_lm(a):
        G = torch.randn(a, h, generator=g).to(dd)

        def run():
            torch.nn.functional.linear(G, lm_w).float().softmax(-1).max(-1)
        return run

    def draft_head():
        e = torch.nn.functional.embedding(torch.randint(0, V, (1, 1), generator=g), emb_w)
        hd(e, feats[:, :1], torch.tensor([[context]]), cache=head_cache)

    probes = {("verify", n): verify(n) for n in verify_sizes}
    probes[("clone", 0)] = clone_only
    probes.update({("lm", a): draft_lm(a) for a in draft_rows})
    probes[("head", 1)] = draft_head
    times = _rounds(probes, repeats, warmup, CLOCKS[clock])
    best = {k: min(v) for k, v in times.items()}
    clone = best[("clone", 0)]  # the cache copy each verify probe makes is not part of the forward
    v_raw = [max(best[("verify", n)] - clone, 1e-6) for n in verify_sizes]
    lm_raw = [best[("lm", a)] for a in draft_rows]
    verify_cm = CostModel(list(verify_sizes), monotone_fit(verify_sizes, v_raw), {"raw_min_seconds": v_raw})
    lm_cm = CostModel(list(draft_rows), monotone_fit(draft_rows, lm_raw), {"raw_min_seconds": lm_raw})
    import platform

    meta = {"what": "SmolLM2 reference-loop costs on CPU" if getattr(cfg, "vocab_size", 0) == 49152 else
            "reference-loop costs on CPU",
            "context": context, "repeats": repeats, "warmup": warmup,
            "statistic": "minimum over interleaved rounds, then weighted PAV (monotone) fit",
            "clock": "process CPU time (1 thread)" if clock == "cpu" else "wall clock",
            "target_dtype": str(target.dtype).replace("torch.", ""), "draft_dtype": str(dd).replace("torch.", ""),
            "threads": threads if threads is not None else torch.get_num_threads(),
            "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores visible",
            "torch": torch.__version__, "measured": time.strftime("%Y-%m-%d %H:%M"),
            "raw_min_seconds": {"verify": v_raw, "draft_lm": lm_raw},
            "median_seconds": {"verify": [float(np.median(times[("verify", n)]) - clone) for n in verify_sizes],
                               "draft_lm": [float(np.median(times[("lm", a)])) for a in draft_rows]},
            "profile_seconds": round(time.perf_counter() - t_start, 1)}
    return LoopCosts(verify_cm, lm_cm, best[("head", 1)], meta)


# ------------------------------------------------------------------------------------------------------------------
# cost-model time of a run
# ------------------------------------------------------------------------------------------------------------------

def modeled_seconds(results, costs: LoopCosts, prefill: bool = True) -> dict:
    """Cost-model seconds of one ``ReferenceLoop.generate`` call from its ``Result``s (see the module docstring).

    Step ``i`` of every request that has one is global step ``i`` (all requests start together and every active
    request records one step per loop iteration). Returns ``{"verify", "draft", "prefill", "total"}`` in seconds.
    """
    ver = draft = pre = 0.0
    n_steps = max((len(r.steps) for r in results), default=0)
    for i in range(n_steps):
        active = [r.steps[i] for r in results if len(r.steps) > i]
        widths = np.asarray([s.n_nodes + 1 for s in active], dtype=np.float64)
        ver += float(costs.verify.step_time_np(widths).sum())
        lens = np.asarray([s.eagle_len for s in active], dtype=np.int64)
        if lens.size and lens.max() > 0:
            rows = np.asarray([(lens > j).sum() for j in range(int(lens.max()))], dtype=np.float64)
            draft += float(costs.draft_lm.step_time_np(rows).sum())
            draft += costs.draft_head * float(np.clip(lens - 1, 0, None).sum())
    for r in results:  # committing accepted tokens to the head: one head forward per step of an EAGLE-drafting run
        if any(s.eagle_len > 0 for s in r.steps):
            draft += costs.draft_head * len(r.steps)
        if prefill and len(r.prompt) > 1:
            pre += float(costs.verify.step_time_np(len(r.prompt) - 1))
    return {"verify": ver, "draft": draft, "prefill": pre, "total": ver + draft + pre}


def run_counts(results) -> dict:
    """Deterministic figures of a run: target forwards (per-request verify forwards, prefill excluded), verified
    tokens (root + draft nodes, summed over forwards), accepted draft tokens per step, drafted EAGLE tokens."""
    steps = [s for r in results for s in r.steps]
    n = len(steps)
    return {"forwards": n, "verified_tokens": int(sum(s.n_nodes + 1 for s in steps)),
            "accepted_per_step": sum(s.accepted for s in steps) / max(1, n),
            "eagle_drafted": int(sum(s.eagle_len for s in steps)),
            "tokens": int(sum(len(r.output) for r in results))}
