"""The realistic replay (``python -m bench.replay --realistic``): the benchmark's headline run.

What it runs, and what is measured vs simulated:

* **Text: real** (measured inputs). Code-edit windows between consecutive package releases, ShareGPT assistant
  turns, and a mixed stream (half of each), ``--requests`` per workload (default 100), several seeds (each seed
  draws its own requests and stream order); `bench.data`, tokenised with cl100k.
* **Model drafter: SIMULATED** (`bench.replay.synth`): flat per-position acceptance ``alpha``, ``alpha_copy`` where a
  long n-gram match predicts the next token, calibrated by construction; swept over alpha in {0.5, 0.6, 0.7, 0.8}
  x alpha_copy in {alpha, 0.9, 0.95}. The real SmolLM2 trace (real outputs, real EAGLE-head chains; small) is the
  "real, small" row when its file exists.
* **n-gram drafters: real code** (ours, the Rust suffix automaton; vLLM prompt lookup's rule at 5/5 and 2/5; Arctic
  Inference's suffix decoding when it is installed).
* **Step times: SIMULATED** (the GPU roofline of `bench.cost_tables.roofline`: an 8B target on an H200-class GPU);
  the headline contenders are also rerun under a table MEASURED on an H200 (the device kit's compact decoder, not
  SGLang: ``Config.measured_table``), and the decision's launch costs are the H200's (`bench.replay.host`).
* **Engine: modelled** (`bench.replay.engine`): HYBRID and model-only adaptive call the worker's
  ``DecisionStep``; "as built" models the plugin as the README launches it (no cost table given: the verify table
  measured at start, plain EAGLE's width or the full tree, a fixed EAGLE depth; ``Config.cost_tables``) with the
  width's lag, late n-gram proposals through the plugin's own alignment and device prompt-lookup code and the
  measured host path; "ideal" is ragged verify with fresh proposals.

Ratios: HYBRID (merge, the deployed configuration) over the best model-only policy (fixed EAGLE at its best k,
model-only adaptive at its best K, or, on the simulated drafter, an EAGLE tree at its best shape, all picked per
cell on the first seed, same calibration as HYBRID's model side) and over the best single drafter (that, or the best
model-free n-gram policy). Throughputs pool the evaluation seeds (every seed but the first, which tunes); 95 %
confidence intervals come from a paired percentile bootstrap over source files (a code file's windows, a chat
conversation; each step's time split evenly over its batch slots). Targets are printed MET / MISSED; missing one is
not an error.
"""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import re
import time
import types
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np

from bench import step_launches
from bench.replay import policies as P
from bench.replay import costs as replay_costs, synth as replay_synth
from bench.replay.drafts import DraftBank
from bench.replay.engine import RAGGED_SYNC_US, EngineConfig, engine_policies
from bench.replay.host import LaunchCost
from bench.replay.sim import HOST_ACCOUNTINGS, simulate

HEADLINE = (0.7, 0.9)
#: the workloads, in report order: copy-heavy code windows, edit-dense code windows, chat, mixed (code + chat)
WORKLOADS = ("code", "code-edit", "chat", "mixed")
ALPHAS = (0.5, 0.6, 0.7, 0.8)
MODES = ("as built", "ideal")
#: the as-built engine launched with ``ragged_verify=on`` (the worker's blocking read of the node counts, verify in
#: token-tier graphs; both tables measured at start as in the README's launch): run beside ``MODES`` on the headline
#: point and the real trace (``Config.ragged_mode``), the engine the gap target is stated for
RAGGED = "as built, ragged"
#: the worker's setting ``eagle_alternatives`` (``Config.eagle_alternatives``; ``EngineConfig.eagle_alternatives``):
#: the EAGLE side's next-best tokens at each chain position hung as leaves, a tree that costs no draft forward, in the
#: launch with ``ragged_verify=on`` (``RAGGED``) and the ideal engine, on the headline point and on a real trace that
#: records the head's alternatives (``Runner.alternatives_modes``); the README's padded launch with them is left out of
#: the default run, for its time budget (docs/benchmarks.md, "EAGLE alternatives", has its last figures)
RAGGED_ALTERNATIVES = "as built, ragged, EAGLE alternatives"
ALTERNATIVES = "ideal, EAGLE alternatives"
ROOT = Path(__file__).resolve().parents[2]
#: the real-drafter traces (``python -m bench.replay --record-real DIR`` records and assembles them here)
REAL_TRACES = ROOT / "bench" / "traces"
#: the device kit's step-time table from an H200 (``bash bench/device_run.sh``): a compact PyTorch
#: Llama-3.1-8B-shaped decoder at 2,048 context tokens per request, MEASURED, not SGLang (docs/benchmarks.md, section 4)
MEASURED_TABLE = ROOT / "bench" / "cost_tables" / "h200_measured_compact.json"


def sweep_points() -> list:
    pts = []
    for a in ALPHAS:
        for ac in (a, 0.9, 0.95):
            if (a, ac) not in pts:
                pts.append((a, ac))
    return pts


def label(point) -> str:
    """A source's name in the printout: the real drafters, a sweep point, or either with its head made miscalibrated
    (a third element / second for "real": ``T<t>`` or ``bursty``, `bench.replay.calibration_sweep`)."""
    if point == "real":
        return "real drafters (SmolLM2 + its EAGLE head, held out)"
    if point[0] == "real":
        return f"real drafters, head {_knob(point[1])}"
    base = f"SIM alpha={point[0]:.1f} copy={point[1]:.2f}"
    return base if len(point) == 2 else f"{base} {_knob(point[2])}"


def _knob(tag: str) -> str:
    return "bursty" if tag == "bursty" else f"T={tag[1:]}"


# ---------------------------------------------------------------------------------------------------------------------
# bootstrap


def cluster_of(request_id: str) -> str:
    """The bootstrap's unit of a request: its source file for a code-edit window (``code:pkg:path@cut``: every window
    of one file shares the file's text, so they are not independent draws), else the request itself."""
    return request_id.rsplit("@", 1)[0] if request_id.startswith("code:") else request_id


def free_source(source) -> str:
    """The key under which a source's model-free runs (no speculation, the n-gram baselines) are stored: the simulated
    drafter's sweep points share one text, so they share those runs ("text"); the real trace has its own ("real")."""
    return "real" if source == "real" or source[0] == "real" else "text"


def pooled(runs, keys=None) -> tuple:
    """(clusters, tokens per cluster, seconds per cluster) summed over the runs (seeds) by `cluster_of`; ``keys``
    fixes the clusters' order (missing ones count 0)."""
    tot: dict = {}
    for r in runs:
        for rid, t, sec in zip(r.request_ids, *r.per_request):
            acc = tot.setdefault(cluster_of(rid), [0.0, 0.0])
            acc[0] += t
            acc[1] += sec
    keys = sorted(tot) if keys is None else keys
    return keys, np.array([tot.get(k, (0.0, 0.0))[0] for k in keys]), np.array([tot.get(k, (0.0, 0.0))[1]
                                                                                for k in keys])


def ratio_ci(num_runs, den_runs, reps: int = 2000, seed: int = 0) -> tuple:
    """(ratio, lo, hi): pooled throughput ratio and its paired percentile-bootstrap 95 % interval, resampling source
    files (`cluster_of`) with both contenders' tokens and seconds on each."""
    keys = sorted(set(pooled(num_runs)[0]) | set(pooled(den_runs)[0]))
    _, tn, sn = pooled(num_runs, keys)
    _, td, sd = pooled(den_runs, keys)
    keep = (sn > 0) | (sd > 0)
    tn, sn, td, sd = tn[keep], sn[keep], td[keep], sd[keep]
    point = (tn.sum() / sn.sum()) / (td.sum() / sd.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tn), size=(reps, len(tn)))
    w = np.zeros((reps, len(tn)))
    np.add.at(w, (np.arange(reps)[:, None], idx), 1.0)
    r = (w @ tn / (w @ sn)) / (w @ td / (w @ sd))
    lo, hi = np.percentile(r, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def simulated_depth(cfg: "Config") -> int:
    """How deep the simulated drafter drafts its chains: the deepest any policy reads (a fixed EAGLE chain, model-only
    adaptive's K, an EAGLE tree's steps, HYBRID's steps)."""
    return max(*cfg.eagle_ks, *cfg.model_ks, *(t[0] for t in cfg.eagle_trees), *cfg.hybrid_steps,
               EngineConfig.num_steps)


def charged_alike(runs, how: str) -> list:
    """The runs as `ratio_ci` reads them, with every policy's host work charged the same way (``how`` in
    ``sim.HOST_ACCOUNTINGS``: overlapped with the device step, or added to it) instead of where its engine puts it."""
    return [types.SimpleNamespace(request_ids=r.request_ids, per_request=(r.per_request[0], r.host_seconds[how]))
            for r in runs]


def evaluation_seeds(seeds) -> list:
    """The seeds ratios are computed on: every seed but the first, which tunes (the first alone when it is all)."""
    return list(seeds[1:] or seeds[:1])


def tok_s(runs) -> float:
    return sum(r.tokens for r in runs) / max(1e-12, sum(r.seconds for r in runs))


# ---------------------------------------------------------------------------------------------------------------------
# running


@dataclasses.dataclass
class Config:
    requests: int = 100
    out_tokens: int = 128
    seeds: tuple = (0, 1, 2)
    batches: tuple = (4, 32, 128)
    sweep_cells: tuple = (("code", 4), ("code", 128), ("chat", 32))
    sweep_modes: tuple = ("as built",)
    #: model-only adaptive's K (its draft depth and node budget), tuned per cell on the first seed; the simulated
    #: drafter drafts chains as deep as the deepest baseline's, a recorded trace stops the range at its depth
    model_ks: tuple = (2, 4, 8, 16, 24)
    #: EAGLE step counts HYBRID also runs with besides the deployed one (``EngineConfig.num_steps``, 4); the best per
    #: cell is chosen on the first seed, as the baselines' k is (fixed EAGLE over ``eagle_ks``, model-only adaptive
    #: over ``model_ks``): the user's ``--speculative-num-steps``, fewer on a busy server of weak drafts
    hybrid_steps: tuple = (2, 6)
    #: n-gram chain lengths HYBRID also runs with besides the deployed one (``EngineConfig.ngram_k``, 8), each
    #: combined with each step count; the best per cell is chosen on the first seed, as the baselines' k is
    hybrid_ngram_ks: tuple = (24, 32)
    #: chain lengths every model-free n-gram baseline (ours, vLLM's prompt-lookup rule at 5/5 and 2/5) is tuned over per
    #: cell on the first seed (vLLM's ``num_speculative_tokens``; our drafter's ``k``)
    ngram_ks: tuple = (8, 16, 24, 32, 48)
    #: fixed EAGLE chain lengths (``--speculative-num-steps``), tuned per cell on the first seed (to the depth a
    #: recorded trace holds)
    eagle_ks: tuple = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24)
    #: EAGLE trees (SGLang's --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens) the
    #: model-only baseline is also tuned over, on the simulated drafter: SGLang's default (5, 4, 8), a small tree and
    #: three wide ones, the widest the last (`edge_choices`)
    eagle_trees: tuple = ((3, 2, 6), (5, 4, 8), (5, 8, 16), (6, 8, 32), (8, 8, 64))
    width_lag: int = 2
    ngram_lag: int = 1
    #: the first wave of every run starts at token 0 together (``sim.simulate(lockstep_start=True)``), as the runs up to
    #: earlier runs did; default: at seeded uniform positions of their outputs (``sim.start_positions``)
    lockstep_start: bool = False
    #: the as-built launch's cost tables (``engine.COST_TABLES``): "measured" = the README's launch (the default);
    #: "given" = both tables, every width bucket and adaptive drafting, a launch that does not start on an H200 at
    #: batch 128 (bench.memory_budget), kept as a decomposition row
    cost_tables: str = "measured"
    #: adaptive drafting (the worker with a draft table, measured at start in the README's launch)
    adaptive_depth: bool = True
    #: HYBRID's online EAGLE offset (``EngineConfig.model_bias_eta``; None: off)
    model_bias_eta: Optional[float] = EngineConfig.model_bias_eta
    #: HYBRID's online n-gram offset (``EngineConfig.ngram_bias_eta``: "auto", a rate, or None: off)
    ngram_bias_eta: object = EngineConfig.ngram_bias_eta
    #: the n-gram calibration every core-decided policy prices with (the worker's setting ``ngram_calibration``;
    #: None: the shipped table)
    ngram_calibration: Optional[Path] = None
    #: a what-if: that table's every cell moved by this much on the logit (``policies.shift_logit``; 0: as it is)
    ngram_logit_shift: float = 0.0
    gpu_context: int = 2048
    #: what one eagerly launched kernel of an engine's own per-step work costs (bench.replay.host)
    launch: LaunchCost = LaunchCost()
    #: a per-batch step-time table measured on a GPU (the device kit's ``cost_tables.json``): the headline contenders
    #: are rerun under it beside the hard-max roofline; None or a missing file: not shown (said so)
    measured_table: Optional[Path] = MEASURED_TABLE
    #: the decomposition's ragged verify with a blocking read: the device's idle time per step, in us
    ragged_sync_us: float = RAGGED_SYNC_US
    #: also run HYBRID as launched with ``ragged_verify=on`` (``RAGGED``) on the headline point and the real trace
    ragged_mode: bool = True
    #: the setting ``eagle_alternatives`` the modes ``RAGGED_ALTERNATIVES`` and ``ALTERNATIVES`` run at (the
    #: next-best EAGLE tokens per chain position hung as leaves); 0 leaves them out
    eagle_alternatives: int = 3
    #: the real-drafter traces' folder (`REAL_TRACES`); None or absent: those rows are not run (said so)
    real_traces: Optional[Path] = None
    #: processes the cells run in (forked from the run, each a whole cell: results do not depend on it)
    jobs: int = 1
    sweep: bool = True
    decompose: bool = True
    #: the real SmolLM2 trace's cells the decomposition also runs (HYBRID at each cell's tuned settings): the cells
    #: where its as-built engine trails the ideal one most
    real_decompose_cells: tuple = (("chat", 32), ("chat", 128))
    out: Path = Path("out/replay_realistic")
    #: the frozen results file this run writes its section into (`bench.replay.results`); None: not written
    results: Optional[Path] = None
    plot: Optional[Path] = ROOT / "docs" / "replay_alpha.png"


#: (runner, work) for the processes `Runner.in_processes` forks: set before the fork, inherited by the children
_FORKED = None
_ABSENT = object()


def _forked_item(item) -> tuple:
    """In a forked child: run one item of `Runner.in_processes`; return the runs and choices it added, and its value."""
    runner, work = _FORKED
    runs_before, best_before, counts_before = set(runner.runs), dict(runner.best), set(step_launches.COUNTS)
    value = work(item)
    return ({k: r for k, r in runner.runs.items() if k not in runs_before},
            {k: v for k, v in runner.best.items() if best_before.get(k, _ABSENT) != v},
            {k: n for k, n in step_launches.COUNTS.items() if k not in counts_before}, value)


def _one_thread() -> None:
    """A forked child's first act: torch on one thread. The parent's OpenMP pool does not survive a fork, and GNU
    OpenMP waits forever for it in the child's first parallel region (seen: the pytest process's pool, then a forked
    cell's ``torch.logit``). The cells' tensors are small, so one thread is also what they run best on."""
    import torch

    torch.set_num_threads(1)


class Runner:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.runs: dict = {}      # (source, mode, workload, batch, policy, seed) -> RunResult
        self.best: dict = {}      # (source, mode, workload, batch, what) -> the choice tuned for it (policy name, ...)
        #: source -> the source whose banks hold the same tokens, its probabilities alone differing (the miscalibration
        #: sweep's temperatures of one head): a policy that reads no probability runs once for all of them (`sim`)
        self.token_twins: dict = {}
        self.engines = {"as built": EngineConfig(width_lag=cfg.width_lag, ngram_lag=cfg.ngram_lag,
                                                 cost_tables=cfg.cost_tables, adaptive_depth=cfg.adaptive_depth,
                                                 model_bias_eta=cfg.model_bias_eta,
                                                 ngram_bias_eta=cfg.ngram_bias_eta),
                        # the launch's tables (cost_tables), so the ideal prices as the as-built does
                        "ideal": EngineConfig.ideal(adaptive_depth=cfg.adaptive_depth, cost_tables=cfg.cost_tables,
                                                    model_bias_eta=cfg.model_bias_eta,
                                                    ngram_bias_eta=cfg.ngram_bias_eta)}
        if cfg.ragged_mode:
            self.engines[RAGGED] = dataclasses.replace(self.engines["as built"], verify="ragged_sync",
                                                       sync_us=cfg.ragged_sync_us)
        if cfg.eagle_alternatives:
            if RAGGED in self.engines:
                self.engines[RAGGED_ALTERNATIVES] = dataclasses.replace(self.engines[RAGGED],
                                                                        eagle_alternatives=cfg.eagle_alternatives)
            self.engines[ALTERNATIVES] = dataclasses.replace(self.engines["ideal"],
                                                             eagle_alternatives=cfg.eagle_alternatives)
        self.core = P._Core(None, cfg.ngram_calibration, ngram_logit_shift=cfg.ngram_logit_shift)
        self.free = [P.NoSpeculation()]
        self.suffix_note = self._suffix_available()
        for k in cfg.ngram_ks:
            tag = "" if k == self.engines["as built"].ngram_k else f"_k{k}"     # the deployed k keeps the plain name
            ours = P.NgramOurs(k)
            ours.name = "ngram_ours" + tag
            self.free += [ours, P.PromptLookup(k, 5, 5, name="vllm_ngram_5_5" + tag),
                          P.PromptLookup(k, 2, 5, name="vllm_ngram_2_5" + tag)]
            if self.suffix_note is None:
                suffix = P.SuffixDecoding(k)
                suffix.name = "suffix" + tag
                self.free.append(suffix)
        self.eagle = []
        for k in cfg.eagle_ks:
            p = P.EagleFixed(k)
            p.name = f"eagle_fixed_k{k}"
            self.eagle.append(p)
        self.trees = [P.EagleTree(*t) for t in cfg.eagle_trees]
        self.engine_pols = {m: {p.name: p for p in engine_policies(self.core, e, (), hybrid_steps=cfg.hybrid_steps,
                                                                   ngram_ks=cfg.hybrid_ngram_ks)}
                            for m, e in self.engines.items()}
        #: model-only adaptive, verified ragged with fresh chains as SGLang runs chains (the ideal engine's
        #: mechanics, a fused decision's launches): the baseline at its best, whatever HYBRID's engine mode
        self.adaptive = {p.name: p for p in engine_policies(self.core, self.engines["ideal"], cfg.model_ks,
                                                            hybrid_modes=())}
        pols = [p for ps in self.engine_pols.values() for p in ps.values()] + list(self.adaptive.values())
        #: chain length of the model-free drafts in the banks (every baseline's k fits)
        self.bank_k = max(cfg.ngram_ks)
        #: n-gram tokens proposed per request, the widest HYBRID's or the longest baseline chain (the draft banks are
        #: computed at this width, and every n-gram baseline reads its chain from them)
        self.pw = max([p.engine.proposal_width for p in pols if p.use_ngram] + [self.bank_k])
        #: the widest verify of any policy per request (root included): the step-time tables reach B x this, so no
        #: step is charged an extrapolated time
        self.max_width = max([p.n_nodes + 1 for p in pols] + [k + 1 for k in (*cfg.ngram_ks, *cfg.eagle_ks)]
                             + [t.num_draft_tokens for t in self.trees])
        #: the draft banks' output padding: every verify tree's node count fits (``DraftBank.pad``)
        self.bank_pad = max(64, self.max_width)
        sizes = sorted(set(cfg.batches) | {b for _, b in cfg.sweep_cells})
        self.specs = replay_costs.gpu_cost_spec(sizes, cfg.gpu_context, "gpu", max_width=self.max_width
                                                ).with_launch_cost(cfg.launch)
        #: the other step-time models the headline contenders are rerun under: the hard-max roofline, and the
        #: GPU-measured table when there is one covering the batches
        self.alt_specs = {"hardmax": replay_costs.gpu_cost_spec(sizes, cfg.gpu_context, "gpu-hardmax",
                                                                max_width=self.max_width).with_launch_cost(cfg.launch)}
        self.measured_note = self._measured_table(sizes)

    def _measured_table(self, sizes) -> Optional[str]:
        """Load ``cfg.measured_table`` into ``alt_specs["measured"]``; returns why not when it is not used."""
        path = self.cfg.measured_table
        if path is None:
            return "no measured table (Config.measured_table = None)"
        if not Path(path).is_file():
            return f"no measured table: {path} is absent (bash bench/device_run.sh on a GPU writes one)"
        spec = replay_costs.load_cost_spec(path, name="measured")
        missing = [b for b in sizes if b not in spec.per_batch]
        if missing:
            return f"measured table {path} lacks batch sizes {missing}: not used"
        self.alt_specs["measured"] = spec.with_launch_cost(self.cfg.launch)
        return None

    @staticmethod
    def _suffix_available() -> Optional[str]:
        """None when Arctic Inference's suffix decoding imports (it then runs as a model-free baseline), else the
        NOT RUN line naming why."""
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return (f"NOT RUN: suffix decoding (Arctic Inference): arctic-inference is not importable here "
                    f"({type(e).__name__}: {e}; scripts/setup.sh builds it with HYBRID_ANCHORS=1)")
        return None

    def free_kinds(self) -> tuple:
        """The model-free draft kinds the baselines read (computed in the banks before the cells fork)."""
        return tuple(dict.fromkeys(k for p in self.free[1:] for k in p.needs))

    def sim(self, pol, bank, idx, b, seed, key, spec=None):
        """``pol``'s run on ``bank`` (``key``: (source, mode, workload, batch, name, seed)), simulated once: a policy
        that reads no draft probability (``reads_confidence``) takes the run of the source's token twin, if any."""
        if key in self.runs:
            return self.runs[key]
        twin = self.token_twins.get(key[0]) if not getattr(pol, "reads_confidence", True) else None
        twin_key = None if twin is None else (twin,) + tuple(key[1:])
        if twin_key is not None and twin_key in self.runs:
            self.runs[key] = self.runs[twin_key]
            return self.runs[key]
        spec = spec or self.specs
        r = simulate(pol, bank, idx, b, spec.for_batch(b), seed=seed * 1000 + b, workload=key[2],
                     cost_name=spec.name, lockstep_start=self.cfg.lockstep_start)
        self.runs[key] = r
        if twin_key is not None:
            self.runs[twin_key] = r
        return r

    @property
    def head_modes(self) -> tuple:
        """The engine modes HYBRID runs in on the headline point and the real trace: ``MODES`` and ``RAGGED``."""
        return MODES + ((RAGGED,) if RAGGED in self.engines else ())

    @property
    def alternatives_modes(self) -> tuple:
        """The modes with EAGLE alternatives HYBRID also runs in on the headline point and on a real trace that
        records the head's alternatives: ``RAGGED_ALTERNATIVES`` and ``ALTERNATIVES`` (the two targets
        compare)."""
        return tuple(m for m in (RAGGED_ALTERNATIVES, ALTERNATIVES) if m in self.engines)

    def hybrid_candidates(self, mode) -> list:
        """Names of the HYBRID merge policies tuned per cell in ``mode`` (the deployed EAGLE steps first)."""
        return [n for n in self.engine_pols[mode] if n == "hybrid_merge" or n.startswith("hybrid_merge_")]

    def tuned_free(self, free_src, w, b, family: str) -> Optional[str]:
        """The chain length variant of one model-free baseline family (``ngram_ours``, ``vllm_ngram_5_5``, ...) that was
        fastest on the cell's tuning seed."""
        got = {p.name: r.tok_per_s for p in self.free[1:] if p.name == family or p.name.startswith(family + "_k")
               for r in [self.runs.get((free_src, "-", w, b, p.name, self.cfg.seeds[0]))] if r is not None}
        return max(got, key=got.get) if got else None              # first maximum: the shortest chain on a tie

    def adaptive_k(self, source, w, b) -> Optional[str]:
        """The model-only adaptive K that did best on (source, w, b)'s tuning seed."""
        got = [(r.tok_per_s, k[4]) for k, r in self.runs.items()
               if k[:4] == (source, "-", w, b) and k[4].startswith("model_adaptive")]
        return max(got)[1] if got else None

    def run_source(self, source, banks: dict, groups: dict, cells, seeds, modes, log, adaptive_from=None):
        """Every policy on every cell of one model-drafter source (a sweep point or the real trace): each choice
        (a baseline's k, HYBRID's EAGLE steps and n-gram chain length) is tuned on ``seeds[0]``, and every policy
        compared runs on ``seeds[1:]``, the evaluation seeds (the tuning seed's text never enters a ratio).

        ``adaptive_from``: a source whose tuned model-only adaptive K, EAGLE tree shape and HYBRID n-gram chain length
        are reused here (the sweep points reuse the headline point's per cell and mode, to fit the default run's time
        budget: the text, which decides how far copies run, is the same at every point; fixed EAGLE's k and HYBRID's
        EAGLE steps, which follow the simulated drafter's strength, are tuned at every point). A mode with EAGLE
        alternatives is tuned over the same (steps, chain) pairs as every HYBRID mode."""
        tune = seeds[0]
        todo = [(w, b) for w, b in cells if w in groups[tune]]
        # every bank's model-free drafts before the cells fork: the children then share them, and none runs a drafter
        # in a forked process (with vLLM installed, a child that first ran its numba-compiled prompt lookup died, and
        # the pool waited for that cell forever)
        for bank in {id(bank): bank for bank in banks.values()}.values():
            for kind in ("ngram",) + self.free_kinds():
                bank.ensure(kind)
        self.count_launches(sorted({b for _, b in todo}))

        def work(cell) -> float:          # a cell's relative cost: the steps its runs take, a larger batch's dearer
            w, b = cell
            n = len(groups[tune][w])
            stream = math.ceil(max(2 * b, n) / n) * n
            mean_len = float(np.mean([banks[tune].lengths[i] for i in groups[tune][w]]))
            return stream * mean_len / b * (1 + b / 32)

        for line in self.in_processes(lambda cell: self._run_cell(source, banks, groups, cell, seeds, modes,
                                                                  adaptive_from), todo, cost=work):
            log(line)

    def count_launches(self, batches) -> None:
        """Count the decision launches every engine policy is charged at these batch sizes, before the cells fork:
        each distinct count once (``engine.LAUNCH_COUNT_BATCH``: a configuration's count is the same at every batch
        size; a new fused count runs the step in a Triton-interpreter subprocess, about a second), shared among the
        processes instead of made again in every cell (`in_processes` hands the counts back to this process)."""
        calls = {}
        for b in batches:
            cost = self.specs.for_batch(b)
            for pol in [*(p for ps in self.engine_pols.values() for p in ps.values()), *self.adaptive.values()]:
                if pol.engine.launches is None:
                    pol.reset(b, cost)              # the width and depth plans the policy has at this batch size
                    count, kwargs = pol.launch_count()
                    calls.setdefault((count.__name__, tuple(sorted(kwargs.items()))), (count, kwargs))
        todo = list(calls.values())
        self.in_processes(lambda i: todo[i][0](**todo[i][1]), list(range(len(todo))))

    def model_ranges(self, bank) -> tuple:
        """(fixed EAGLE policies, model-only adaptive names) whose chains fit the EAGLE depth ``bank`` holds: the
        simulated drafter's reaches every configured one, a recorded trace's stops at what its head drafted."""
        depth = int(bank.eagle_tokens.shape[1])
        return ([p for p in self.eagle if p.k <= depth],
                [n for n, p in self.adaptive.items() if p.num_steps <= depth])

    def _run_cell(self, source, banks: dict, groups: dict, cell, seeds, modes, adaptive_from) -> str:
        """`run_source` on one (workload, batch) cell; returns its log line."""
        (w, b), tune, evals = cell, seeds[0], evaluation_seeds(seeds)
        t0 = time.perf_counter()
        free_src = free_source(source)
        eagle, ks = self.model_ranges(banks[tune])
        depth = max(p.k for p in eagle)

        def run(pol, src, mode, name, ss):
            for s in ss:
                self.sim(pol, banks[s], groups[s][w], b, s, (src, mode, w, b, name, s))

        for pol in self.free:
            run(pol, free_src, "-", pol.name, seeds)
        ng_best = max((p.name for p in self.free[1:]),
                      key=lambda n: self.runs[(free_src, "-", w, b, n, tune)].tok_per_s)
        for pol in eagle:
            run(pol, source, "-", pol.name, [tune])
        if adaptive_from is not None:
            ks = [self.adaptive_k(adaptive_from, w, b) or ks[-1]]
        for name in ks:
            run(self.adaptive[name], source, "-", name, [tune])
        cands = {p.name: p for p in eagle}
        cands.update({n: self.adaptive[n] for n in ks})
        if getattr(banks[tune], "eagle_trees", None) is not None and self.trees:    # the simulated drafter only
            trees = self.trees
            if adaptive_from is not None and (adaptive_from, "-", w, b, "tree") in self.best:
                trees = [p for p in trees if p.name == self.best[(adaptive_from, "-", w, b, "tree")]]
            for pol in trees:
                run(pol, source, "-", pol.name, [tune])
            self.best[(source, "-", w, b, "tree")] = max(
                (p.name for p in trees), key=lambda n: self.runs[(source, "-", w, b, n, tune)].tok_per_s)
            cands.update({p.name: p for p in trees})
        best = max(cands, key=lambda n: self.runs[(source, "-", w, b, n, tune)].tok_per_s)
        run(cands[best], source, "-", best, evals)
        # the one-line rule "n-gram if it matches, else EAGLE", at the cell's best fixed EAGLE k, tuned over the
        # n-gram chain length; and the chain oracle (the limit of any selector choosing one of the two chains per
        # step; it bounds no tree: an EAGLE tree or a merged tree can beat it), beside its
        # foreknowledge of the EAGLE chain alone
        ke = max(eagle, key=lambda p: self.runs[(source, "-", w, b, p.name, tune)].tok_per_s).k
        rules = {f"ngram_else_eagle_n{k}_e{ke}": P.NgramElseEagle(k, ke) for k in self.cfg.ngram_ks}
        for name, pol in rules.items():
            pol.name = name
            run(pol, source, "-", name, [tune])
        rule = max(rules, key=lambda n: self.runs[(source, "-", w, b, n, tune)].tok_per_s)
        run(rules[rule], source, "-", rule, evals)
        # the oracle's foreknowledge without its choice (EAGLE alone): what part of its lead no selector can learn
        run(P.Oracle(depth, max(self.cfg.ngram_ks)), source, "-", "oracle", evals)
        run(P.Oracle(depth, max(self.cfg.ngram_ks), eagle_only=True), source, "-", "oracle_eagle", evals)
        for m in modes:
            pols = self.engine_pols[m]
            self.best[(source, m, w, b, "model")] = (best, (source, "-", w, b, best))
            self.best[(source, m, w, b, "ngram")] = (ng_best, (free_src, "-", w, b, ng_best))
            self.best[(source, m, w, b, "rule")] = (rule, (source, "-", w, b, rule))
            # HYBRID's EAGLE steps and n-gram chain length, tuned like the baselines (the chosen one is stored as
            # "hybrid_merge")
            hy = self.hybrid_candidates(m)
            if adaptive_from is not None and (adaptive_from, m, w, b, "hybrid") in self.best:
                k_head = self.best[(adaptive_from, m, w, b, "hybrid")][1]
                hy = [n for n in hy if pols[n].engine.ngram_k == k_head]
            for n in hy:
                run(pols[n], source, m, "tune:" + n, [tune])
            hy_best = max(hy, key=lambda n: self.runs[(source, m, w, b, "tune:" + n, tune)].tok_per_s)
            self.best[(source, m, w, b, "hybrid")] = (pols[hy_best].num_steps, pols[hy_best].engine.ngram_k)
            run(pols[hy_best], source, m, "hybrid_merge", evals)
        return f"  {label(source)} | {w} B={b}: {time.perf_counter() - t0:.1f} s"

    def in_processes(self, work, items, cost=None) -> list:
        """``work(item)`` for each item, in ``cfg.jobs`` processes forked from this one (each inherits the runner as
        it is: banks, policies, the choices made so far); the runs and choices each item adds come back and join this
        runner in the items' order, as they would run one after another, and the launch counts it made join this
        process's (``bench.step_launches.COUNTS``), so that later forks do not count them again. Returns ``work``'s
        values in that order.

        Why processes and not threads: a cell is pure Python and torch on small tensors, bound by the interpreter; why
        fork: the draft banks (and the Rust drafter objects behind them) are not picklable, and forked children share
        them copy-on-write. Every simulated run is a function of its inputs and seed (no clock, no shared random
        state), so the results are the same at any ``jobs`` (``tests/bench/test_replay.py`` runs both and compares).

        ``cost(item)``: an estimate of an item's run time; the processes take the items dearest first (so that a long
        item does not start last and run alone at the end), and what they return still joins in the items' order."""
        jobs = min(self.cfg.jobs, len(items))
        if jobs <= 1:
            return [work(item) for item in items]
        order = sorted(range(len(items)), key=lambda i: -cost(items[i])) if cost else list(range(len(items)))
        global _FORKED
        _FORKED = (self, work)
        got = {}
        try:
            with multiprocessing.get_context("fork").Pool(jobs, initializer=_one_thread) as pool:
                for i, result in zip(order, pool.imap(_forked_item, [items[i] for i in order])):
                    got[i] = result
        finally:
            _FORKED = None
        values = []
        for i in range(len(items)):
            runs, best, counts, value = got[i]
            self.runs.update(runs)
            self.best.update(best)
            step_launches.COUNTS.update(counts)      # the next fork inherits them: counted once per run
            values.append(value)
        return values

    def tuned_policy(self, source, mode, w, b, what: str):
        """The policy object a cell compares: ``what`` in "model", "ngram", "hybrid" (its tuned choice)."""
        if what == "hybrid":
            steps, k = self.best[(source, mode, w, b, "hybrid")]
            pols = [self.engine_pols[mode][n] for n in self.hybrid_candidates(mode)]
            return next(p for p in pols if (p.num_steps, p.engine.ngram_k) == (steps, k))
        name = self.best[(source, mode, w, b, what)][0]
        pols = {p.name: p for p in [*self.free, *self.eagle, *self.trees, *self.adaptive.values()]}
        return pols[name]

    def alt_cost_cell(self, kind, source, banks, groups, w, b) -> Optional[dict]:
        """The headline cell's contenders (as tuned under the smooth knee) rerun under another step-time model
        (``alt_specs[kind]``: the hard-max roofline, the GPU-measured table) on the evaluation seeds: HYBRID / best
        model-only, / best single drafter, / no speculation."""
        mode = MODES[0]
        if (source, mode, w, b, "hybrid") not in self.best:
            return None
        evals = evaluation_seeds(self.cfg.seeds)
        got = {}
        for what in ("hybrid", "model", "ngram", "no_spec"):
            pol = self.free[0] if what == "no_spec" else self.tuned_policy(source, mode, w, b, what)
            got[what] = [self.sim(pol, banks[s], groups[s][w], b, s, (source, kind, w, b, what, s),
                                  spec=self.alt_specs[kind]) for s in evals]
        # the single drafter as chosen on the tuning seed under the main step times
        mkey, nkey = self.best[(source, mode, w, b, "model")][1], self.best[(source, mode, w, b, "ngram")][1]
        single = got["model"] if self.model_is_single(mkey, nkey, got["model"], got["ngram"]) else got["ngram"]
        return dict(vs_model=ratio_ci(got["hybrid"], got["model"]), vs_single=ratio_ci(got["hybrid"], single),
                    vs_nospec=ratio_ci(got["hybrid"], got["no_spec"]))

    def model_is_single(self, mkey, nkey, mo, ng) -> bool:
        """Whether the best model-only policy, rather than the best n-gram one, is the cell's best single drafter:
        decided on the tuning seed's runs (as every other choice is), the evaluation runs only where those are
        missing."""
        tune = [self.cfg.seeds[0]]
        mo_t, ng_t = self.seeds_of(mkey, tune), self.seeds_of(nkey, tune)
        if mo_t and ng_t:
            return tok_s(mo_t) >= tok_s(ng_t)
        return tok_s(mo) >= tok_s(ng)

    # -- aggregation --------------------------------------------------------------------------------------------
    def seeds_of(self, key5, seeds=None) -> list:
        keys = [k for k in self.runs if k[:5] == key5 and (seeds is None or k[5] in seeds)]
        return [self.runs[k] for k in sorted(keys, key=lambda k: k[5])]

    def cell(self, source, mode, w, b) -> Optional[dict]:
        """Ratios of one cell over its evaluation seeds (None if not run)."""
        hk = (source, mode, w, b, "hybrid_merge")
        seeds = sorted({k[5] for k in self.runs if k[:5] == hk})
        seeds = [s for s in seeds if s != self.cfg.seeds[0]] or seeds     # the tuning seed only when it is all
        hy = self.seeds_of(hk, seeds)
        if not hy or (source, mode, w, b, "model") not in self.best:
            return None
        mname, mkey = self.best[(source, mode, w, b, "model")]
        nname, nkey = self.best[(source, mode, w, b, "ngram")]
        rname, rkey = self.best[(source, mode, w, b, "rule")]
        mo, ng, rule = self.seeds_of(mkey, seeds), self.seeds_of(nkey, seeds), self.seeds_of(rkey, seeds)
        oracle = self.seeds_of((source, "-", w, b, "oracle"), seeds)
        oracle_eagle = self.seeds_of((source, "-", w, b, "oracle_eagle"), seeds)
        ns = self.seeds_of(((nkey[0],) + ("-", w, b, "no_spec")), seeds)
        single = mo if self.model_is_single(mkey, nkey, mo, ng) else ng
        steps, ngram_k = self.best.get((source, mode, w, b, "hybrid"), (None, None))
        return dict(hybrid=tok_s(hy), hybrid_steps=steps, hybrid_ngram_k=ngram_k,
                    model=tok_s(mo), model_name=mname, ngram=tok_s(ng), ngram_name=nname,
                    single_name=mname if single is mo else nname, no_spec=tok_s(ns), rule_name=rname,
                    rule=tok_s(rule), oracle=tok_s(oracle), oracle_eagle=tok_s(oracle_eagle),
                    vs_model=ratio_ci(hy, mo), vs_single=ratio_ci(hy, single), vs_nospec=ratio_ci(hy, ns),
                    vs_rule=ratio_ci(hy, rule), vs_oracle=ratio_ci(hy, oracle),
                    **{f"vs_single_host_{how}": ratio_ci(charged_alike(hy, how), charged_alike(single, how))
                       for how in HOST_ACCOUNTINGS},
                    seeds=len(hy), stats=[r.stats for r in hy])


# ---------------------------------------------------------------------------------------------------------------------
# report


def fmt_ci(t) -> str:
    return f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"


def columns(batches) -> tuple:
    """The headline tables' columns: (title, workload, batch sizes; the worst of several is shown)."""
    return (("code B=4", "code", [4]), ("code B=128", "code", [128]), ("code-edit B=4", "code-edit", [4]),
            ("code-edit B=128", "code-edit", [128]), ("chat (worst B)", "chat", list(batches)))


def layout_rows(runner: Runner, sources, batches) -> list:
    """(source, {col: {mode: cell}}) for the headline columns (`columns`)."""
    rows = []
    for src in sources:
        cols = {}
        for col, w, bs in columns(batches):
            by_mode = {}
            # the worst batch is picked on the as-built ratio; ideal is shown at the same batch
            cells = [(b, runner.cell(src, MODES[0], w, b)) for b in bs]
            cells = [(b, c) for b, c in cells if c is not None]
            if cells:
                b, c = min(cells, key=lambda bc: bc[1]["vs_model"][0])
                by_mode[MODES[0]] = dict(c, batch=b)
                i = runner.cell(src, MODES[1], w, b)
                if i is not None:
                    by_mode[MODES[1]] = dict(i, batch=b)
            cols[col] = by_mode
        rows.append((src, cols))
    return rows


def print_layout(rows, key: str, title: str, batches) -> list:
    cols = [c[0] for c in columns(batches)]
    out = [title, f"{'row':<30}" + "".join(f"{c:>32}" for c in cols)]
    out.append(f"{'':<30}" + "".join(f"{'as built [95% CI] / ideal / gap':>32}" for _ in cols))
    for src, by_col in rows:
        line = f"{label(src):<30}"
        for col in cols:
            bm = by_col[col]
            a, i = bm.get("as built"), bm.get("ideal")
            txt = fmt_ci(a[key]) if a else "-"
            if i:
                txt += f" / {i[key][0]:.2f}"
            if a and i:
                txt += f" / {1 - a['hybrid'] / i['hybrid']:+.0%}"
            if a and col.startswith("chat"):
                txt += f" B={a['batch']}"
            line += f"{txt:>32}"
        out.append(line)
    return out


def all_cells(runner: Runner, mode: str) -> list:
    keys = sorted({k[:4] for k in runner.runs if k[4] == "hybrid_merge" and k[1] == mode}, key=str)
    return [(k, runner.cell(*k)) for k in keys]


def reach_note(runner: Runner, source, w: str, b: int, cell: dict) -> str:
    """What the same cell reads for the ragged launch and for the oracle, against the same best model-only policy:
    where a target sits above the oracle's ratio, no selector over these two chain drafters reaches it in this
    simulation, and the verdict's reader should see that beside the miss."""
    parts = []
    ragged = runner.cell(source, RAGGED, w, b) if RAGGED in runner.engines else None
    if ragged is not None:
        parts.append(f"ragged_verify=on {ragged['vs_model'][0]:.2f}")
    parts.append(f"the chain oracle {cell['oracle'] / cell['model']:.2f}")
    return "; " + ", ".join(parts)


def setting_of(name: str, deployed_ngram_k: int) -> Optional[tuple]:
    """(family, size) of a tuned baseline's policy name: fixed EAGLE's and model-only adaptive's chain length, an EAGLE
    tree's node count, an n-gram drafter's k (a name without ``_k`` runs the deployed one); None for anything else."""
    if m := re.fullmatch(r"(eagle_fixed|model_adaptive)_k(\d+)", name):
        return m[1], int(m[2])
    if m := re.fullmatch(r"eagle_tree_s\d+_t\d+_n(\d+)", name):
        return "eagle_tree", int(m[1])
    if m := re.fullmatch(r"(ngram_ours|vllm_ngram_\d_\d|suffix)(?:_k(\d+))?", name):
        return m[1], int(m[2]) if m[2] else deployed_ngram_k
    return None


def edge_choices(runner: Runner, mode: str = MODES[0]) -> list:
    """The cells whose tuned baselines (best model-only, best n-gram) sit at the top of the range they were tuned
    over, as (source, workload, batch, policy name): a choice there says the range may stop short of the best
    setting, so the baseline may be stronger than the run shows. The range is what the cell's tuning seed ran (a
    recorded trace's EAGLE range stops at its depth; a sweep point that reuses the headline's K tried one)."""
    tune, deployed = runner.cfg.seeds[0], runner.engines[MODES[0]].ngram_k
    out = []
    for (src, m, w, b, what), choice in sorted(runner.best.items(), key=lambda kv: str(kv[0])):
        if m != mode or what not in ("model", "ngram") or (got := setting_of(choice[0], deployed)) is None:
            continue
        tried = [setting_of(k[4], deployed) for k in runner.runs if k[:4] == choice[1][:4] and k[5] == tune]
        sizes = [size for fam, size in filter(None, tried) if fam == got[0]]
        if len(sizes) > 1 and got[1] == max(sizes):
            out.append((src, w, b, choice[0]))
    return out


def oracle_note(runner: Runner, heads) -> str:
    """Beside the oracle target: how many of the same cells the best single drafter and the ideal engine with EAGLE
    alternatives leave below 0.85x the oracle, and how much of the oracle's lead is foreknowledge alone (the best
    model-only policy against the EAGLE chain that knows its accepted length): a lead no policy that verifies to
    find out can close, whatever it selects."""
    single = [max(c["model"], c["ngram"]) / c["oracle"] for _, c in heads]
    parts = [f"the best single drafter below 0.85 in {sum(x < 0.85 for x in single)} of {len(heads)}"]
    ideal = [i["hybrid"] / i["oracle"] for k, _ in heads
             if ALTERNATIVES in runner.engines and (i := runner.cell(k[0], ALTERNATIVES, k[2], k[3])) is not None]
    if ideal:
        parts.append(f"the ideal engine with EAGLE alternatives in {sum(x < 0.85 for x in ideal)} of {len(ideal)}")
    waste = [c["model"] / c["oracle_eagle"] for _, c in heads if c["oracle_eagle"] > 0]
    if waste:
        parts.append(f"the best model-only policy reaches {min(waste):.2f}-{max(waste):.2f} of EAGLE with "
                     "foreknowledge")
    return "; " + ", ".join(parts)


def verdicts(runner: Runner, cfg: Config, wall_s: float) -> list:
    """The targets (the selector's, and the engine's that this run measures), each (name, met, detail)."""
    v = []
    head = HEADLINE
    tag = "SIM alpha=0.7 copy=0.9, as built"

    def worst(w, bs, key):
        cells = [(b, runner.cell(head, "as built", w, b)) for b in bs]
        cells = [(b, c) for b, c in cells if c is not None]
        return min(cells, key=lambda bc: bc[1][key][0]) if cells else (None, None)

    def ran(mode) -> list:
        """The cells ``mode``'s HYBRID ran: (key, ratios)."""
        return [(k, c) for k, c in all_cells(runner, mode) if c is not None]

    def ideal_gap(got, ideal, title):
        """The HYBRID of the cells ``got`` against ``ideal``'s in every cell both ran: gap <= 5 %."""
        gaps = [(1 - c["hybrid"] / i["hybrid"], k) for k, c in got
                if (i := runner.cell(k[0], ideal, k[2], k[3])) is not None]
        if gaps:
            g, k = max(gaps, key=lambda gk: gk[0])      # keys mix sources (tuples, "real"): never compare them
            over = sum(1 for gg, _ in gaps if gg > 0.05)
            v.append((title, over == 0, f"worst gap {g:.1%} at {label(k[0])} {k[2]} B={k[3]}; {over} of "
                                        f"{len(gaps)} cells over 5 %"))

    def best_single(got, title):
        """The HYBRID of the cells ``got`` >= 0.97x the best single drafter in every one."""
        if got:
            low = min(got, key=lambda kc: kc[1]["vs_single"][0])
            bad = [kc for kc in got if kc[1]["vs_single"][0] < 0.97]
            v.append((title, not bad, f"worst {fmt_ci(low[1]['vs_single'])} vs {low[1]['single_name']} at "
                                      f"{label(low[0][0])} {low[0][2]} B={low[0][3]}; {len(bad)} of {len(got)} "
                                      "cells below 0.97"))

    for name, w, bs, tgt in (("code-edit B=4", "code-edit", [4], 1.62), ("code-edit B=128", "code-edit", [128], 1.27),
                             ("chat, every batch", "chat", list(cfg.batches), 1.00)):
        b, c = worst(w, bs, "vs_model")
        v.append((f"selector: {name}: HYBRID / best model-only >= {tgt:.2f} ({tag})", c is not None and
                  c["vs_model"][0] >= tgt, "not run" if c is None else
                  f"{fmt_ci(c['vs_model'])} vs {c['model_name']}" + (f" (worst B={b})" if len(bs) > 1 else "")
                  + reach_note(runner, head, w, b, c)))
    rule_cells = [(w, b) for w in ("code", "code-edit", "mixed") for b in (4, 32) if b in cfg.batches]
    got = [(w, b, runner.cell(head, "as built", w, b)) for w, b in rule_cells]
    got = [(w, b, c) for w, b, c in got if c is not None]
    bad = [(w, b, c) for w, b, c in got if c["vs_rule"][0] < 1.05]
    v.append((f"selector: HYBRID >= 1.05x 'n-gram if it matches, else EAGLE' on code, code-edit and mixed at B=4 and "
              f"32 ({tag})", bool(got) and not bad,
              "; ".join(f"{w} B={b} {c['vs_rule'][0]:.2f}" for w, b, c in got) or "not run"))
    cells = ran("as built")
    if cells:
        best_single(cells, "selector: HYBRID >= 0.97x the best single drafter in every cell (sweep + real trace, as "
                           "built)")
        heads = [(k, c) for k, c in cells if k[0] == head]
        low = min(heads, key=lambda kc: kc[1]["vs_oracle"][0])
        bad = [kc for kc in heads if kc[1]["vs_oracle"][0] < 0.85]
        v.append((f"selector: HYBRID >= 0.85x the chain oracle in every headline cell ({tag})", not bad,
                  f"worst {fmt_ci(low[1]['vs_oracle'])} at {low[0][2]} B={low[0][3]}; {len(bad)} of {len(heads)} "
                  "cells below 0.85" + oracle_note(runner, heads)))
        below = [kc for kc in cells if kc[1]["vs_nospec"][0] < 1.0]
        low = min(cells, key=lambda kc: kc[1]["vs_nospec"][0])
        v.append(("HYBRID never below 1.00x no speculation, every cell (as built)", not below,
                  f"worst {fmt_ci(low[1]['vs_nospec'])} at {label(low[0][0])} {low[0][2]} B={low[0][3]}; "
                  f"{len(below)} of {len(cells)} cells below 1.00"))
        edges = edge_choices(runner)
        v.append(("baselines: every tuned choice inside its search range (fixed EAGLE k, adaptive K, EAGLE tree, "
                  "n-gram k; as built)", not edges, f"{len(edges)} at the top of their range"
                  + (": " + ", ".join(f"{label(s_)} {w} B={b} {n}" for s_, w, b, n in edges) if edges else "")
                  + ("; a recorded trace's EAGLE range stops at the depth its head drafted"
                     if any(free_source(e[0]) == "real" for e in edges) else "")))
        ragged = ran(RAGGED)
        ideal_gap(cells, "ideal", "the README's launch (padded verify): as-built / ideal gap <= 5 % in every cell")
        ideal_gap(ragged, "ideal", "engine: as built with ragged_verify=on: as-built / ideal gap <= 5 % in every "
                                   "cell")
        best_single(ragged, "engine: HYBRID as built with ragged_verify=on >= 0.97x the best single drafter in "
                            "every cell (headline + real trace)")
        alt = ran(RAGGED_ALTERNATIVES)
        if alt:
            m = runner.engines[RAGGED_ALTERNATIVES].eagle_alternatives
            where = ("headline + real trace" if any(k[0] == "real" for k, _ in alt) else
                     "headline cells; no real-trace rows: the trace records no alternatives")
            best_single(alt, f"engine: HYBRID launched with ragged_verify=on, eagle_alternatives={m} >= 0.97x the "
                             f"best single drafter in every cell ({where})")
            ideal_gap(alt, ALTERNATIVES, "engine: that launch / the ideal engine with the same alternatives: gap "
                                         f"<= 5 % in every cell ({where.split(';')[0]})")
    st = {"m": 0, "a": 0, "h": 0}
    for k, r in runner.runs.items():
        if k[1] == "as built" and k[2] == "code" and k[4] == "hybrid_merge" and k[0] == head:
            st["m"] += r.stats.get("steps_with_match", 0)
            st["a"] += r.stats.get("steps_with_aligned", 0)
            st["h"] += r.stats.get("steps_with_host_aligned", 0)
    if st["m"]:
        av = st["a"] / st["m"]
        v.append(("n-gram availability >= 0.95 on code (as built)", av >= 0.95,
                  f"{av:.3f} = request-steps with an n-gram proposal (the host's, aligned, or the device prompt "
                  f"lookup's) / request-steps where the drafter has a match ({st['a']} / {st['m']}; the host's "
                  f"aligned proposals alone {st['h'] / st['m']:.3f}; {tag}, all batches, evaluation seeds)"))
    real = [(k, c) for k, c in ran("as built") if k[0] == "real"]
    if real:
        for w in ("code", "chat"):
            c = runner.cell("real", "as built", w, 4)
            v.append((f"real drafters, held-out requests: HYBRID >= 1.00x the best single drafter at {w} B=4 (as "
                      "built)", c is not None and c["vs_single"][0] >= 1.0,
                      "not run" if c is None else f"{fmt_ci(c['vs_single'])} vs {c['single_name']}"
                      + ci_note(c["vs_single"], 1.0)))
        best_single(real, "real drafters, held-out requests: HYBRID >= 0.97x the best single drafter in every cell "
                          "(as built)")
    v.append(("the default run takes <= 30 minutes on this machine", wall_s <= 30 * 60, f"{wall_s / 60:.1f} min"))
    return v


def ci_note(ci, line: float) -> str:
    """Where a ratio's 95 % interval crosses the target's line (a target is MET on its point estimate)."""
    return f"; its 95 % interval crosses {line:.2f}" if ci[1] < line <= ci[2] or ci[1] <= line < ci[2] else ""


def model_tag(name: str) -> str:
    """A model-only policy's short name in the tables: E<k>, A<K> or T<steps>/<topk>/<tokens>."""
    if name.startswith("eagle_tree_s"):
        return "T" + "/".join(part[1:] for part in name[len("eagle_tree_"):].split("_"))
    return name.replace("eagle_fixed_k", "E").replace("model_adaptive_k", "A")


def detail_table(runner: Runner, source, cells) -> list:
    """Speedup over no speculation per policy (pooled over the evaluation seeds) for one source's cells."""
    lines = []
    evals = evaluation_seeds(runner.cfg.seeds)
    free_src = free_source(source)
    cols = [(w, b) for w, b in cells if runner.seeds_of((free_src, "-", w, b, "no_spec"), evals)]
    if not cols:
        return lines
    head = f"{'policy':<26}" + "".join(f"{w + ' B=' + str(b):>16}" for w, b in cols)
    lines += [head, "-" * len(head)]
    ns = {c: tok_s(runner.seeds_of((free_src, "-") + c + ("no_spec",), evals)) for c in cols}
    lines.append(f"{'no_spec (tok/s)':<26}" + "".join(f"{ns[c]:>16.0f}" for c in cols))
    families = ("ngram_ours", "vllm_ngram_5_5", "vllm_ngram_2_5") + (("suffix",) if runner.suffix_note is None else ())
    for family in families:
        row = f"{family:<26}"
        for c in cols:
            n = runner.tuned_free(free_src, *c, family)
            k = next(p.k for p in runner.free if p.name == n)
            speedup = tok_s(runner.seeds_of((free_src, "-") + c + (n,), evals)) / ns[c]
            row += f"{f'{speedup:.2f}x K{k}':>16}"
        lines.append(row)
    rows = [("best model-only", MODES[0], "model"), ("n-gram else EAGLE", MODES[0], "rule")] + [
        (f"HYBRID merge ({m})", m, "hybrid") for m in MODES] + [
        ("HYBRID ragged_verify=on", RAGGED, "hybrid")] * (RAGGED in runner.engines) + [
        ("HYBRID ragged+alt", RAGGED_ALTERNATIVES, "hybrid")] * (RAGGED_ALTERNATIVES in runner.engines) + [
        ("HYBRID ideal+alt", ALTERNATIVES, "hybrid")] * (ALTERNATIVES in runner.engines) + [
        ("EAGLE, foreknowledge", MODES[0], "oracle_eagle"), ("oracle", MODES[0], "oracle")]
    for title, m, what in rows:
        row = f"{title:<26}"
        any_ = False
        for c in cols:
            cc = runner.cell(source, m, *c)
            if cc is None:
                row += f"{'-':>16}"
                continue
            any_ = True
            val = {"model": cc["model"], "hybrid": cc["hybrid"], "oracle": cc["oracle"],
                   "oracle_eagle": cc["oracle_eagle"], "rule": cc["rule"]}[what]
            tag = {"hybrid": f" S{cc['hybrid_steps']}/K{cc['hybrid_ngram_k']}",
                   "model": " " + model_tag(cc["model_name"]),
                   "rule": " " + cc["rule_name"].replace("ngram_else_eagle_n", "K").replace("_e", "/E"),
                   "oracle": "", "oracle_eagle": ""}[what]
            row += f"{f'{val / ns[c]:.2f}x{tag}':>16}"
        if any_:
            lines.append(row)
    lines.append("(K<k>: n-gram chain length; best model-only: E<k> = fixed EAGLE chain of k, A<K> = model-only "
                 "adaptive at K (ragged, fresh, fused decision), T<s>/<t>/<n> = EAGLE tree of s steps, topk t, n draft "
                 "tokens (simulated drafter only); n-gram else EAGLE K<k>/E<k>; HYBRID S<n>/K<k>: its EAGLE steps and "
                 "n-gram chain length; all tuned per cell on the first seed; EAGLE, foreknowledge: the EAGLE chain "
                 "alone, drafted and verified exactly as far as it gets accepted, no choice; oracle: the same over "
                 "both drafters, the better one per request)")
    return lines


def alternatives_lines(runner: Runner, cells, source=HEADLINE) -> list:
    """The modes with EAGLE alternatives (``Runner.alternatives_modes``) beside the engines they extend, per cell of
    ``source`` (the headline point, or "real": the recorded head's own alternatives): HYBRID / best single drafter
    and / best model-only, for the launch with ``ragged_verify=on`` and the ideal engine, each
    with the EAGLE chain alone and with its alternatives as leaves; and how many cells of each reach 0.97x the best
    single drafter."""
    pairs = [(m, d) for m, d in ((RAGGED, RAGGED_ALTERNATIVES), ("ideal", ALTERNATIVES)) if d in runner.engines
             and any(runner.cell(source, d, w, b) is not None for w, b in cells)]
    if not pairs:
        return []
    alt = runner.engines[pairs[0][1]].eagle_alternatives
    what = (f"{label(HEADLINE)}; SIMULATED" if source == HEADLINE else
            f"{label(source)}: the recorded head's own next tokens; SIMULATED step times")
    out = [f"EAGLE alternatives (setting eagle_alternatives={alt}): the EAGLE side's next {alt} most likely tokens at "
           f"each chain position hung as leaves (no draft forward beyond the chain's; the worker's launches for them "
           f"counted with the decision's; {what}, decision charged). HYBRID / best single drafter, / best model-only, "
           "chain -> with alternatives [95% CI]:"]
    reach = {d: [0, 0] for _, d in pairs}
    for w, b in cells:
        parts = []
        for m, d in pairs:
            c, a = runner.cell(source, m, w, b), runner.cell(source, d, w, b)
            if c is None or a is None:
                continue
            reach[d][0] += a["vs_single"][0] >= 0.97
            reach[d][1] += 1
            name = "ragged_verify=on" if m == RAGGED else m
            parts.append(f"{name} {c['vs_single'][0]:.2f} -> {fmt_ci(a['vs_single'])}, "
                         f"{c['vs_model'][0]:.2f} -> {a['vs_model'][0]:.2f} (S{a['hybrid_steps']}/K"
                         f"{a['hybrid_ngram_k']})")
        if parts:
            out.append(f"  {w} B={b}: " + "; ".join(parts))
    out.append("  at >= 0.97x the best single drafter: " + ", ".join(
        f"{d} {n} of {t} cells" for d, (n, t) in reach.items()))
    return out


def plot(runner: Runner, cfg: Config, path: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cols = [("code", 4), ("code", 128)] + [c for c in cfg.sweep_cells if c[0] == "chat"][:1]
    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.8), squeeze=False)
    for ax, (w, b) in zip(axes[0], cols):
        for ac, color in (("alpha", "#1f77b4"), (0.9, "#d62728"), (0.95, "#2ca02c")):
            for m, ls in (("as built", "-"), ("ideal", "--")):
                xs, ys = [], []
                for a in ALPHAS:
                    pt = (a, a if ac == "alpha" else ac)
                    c = runner.cell(pt, m, w, b)
                    if c is not None:
                        xs.append(a)
                        ys.append(c["vs_model"][0])
                if xs:
                    ax.plot(xs, ys, ls, color=color, marker="o" if m == "as built" else "x", markersize=7,
                            label=f"copy={'alpha' if ac == 'alpha' else ac}, {m}")
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_title(f"{w} B={b}", fontsize=10)
        ax.set_xlabel("simulated model drafter alpha")
        ax.set_ylabel("HYBRID / best model-only")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Realistic replay: real text, SIMULATED model drafter and SIMULATED GPU step times (roofline)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class DecomposeColumn(NamedTuple):
    """One column of a decomposition: HYBRID at ``steps`` EAGLE steps and n-gram chain ``k`` on the requests ``idx``
    of ``bank``, the cell (``workload``, ``b``) of ``source`` (seed ``seed``; its no-speculation run is the cell's)."""
    title: str
    bank: object
    idx: list
    workload: str
    b: int
    seed: int
    source: object
    steps: int
    k: int


def decompose_variants(runner: Runner, cfg: Config, steps: int, k: int) -> list:
    """The decomposition's rows for HYBRID at ``steps`` EAGLE steps and n-gram chain ``k`` (node budget as the worker
    resolves it): ``(row name, EngineConfig)``, the as-built launch first and the ideal engine last (`decompose`)."""
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    n = HybridSettings(mode="merge", ngram_k=k).resolved_n_nodes(steps)
    base = dataclasses.replace(runner.engines["as built"], num_steps=steps, ngram_k=k, n_nodes=n)
    variants = [("as built", base),
                ("as built, one EAGLE depth (no draft table)", dataclasses.replace(base, adaptive_depth=False)),
                ("as built, no device prompt lookup", dataclasses.replace(base, context_lookup=False)),
                ("as built, host path not overlapped", dataclasses.replace(base, host_overlap=False)),
                ("as built, fresh n-gram, no host path", dataclasses.replace(base, ngram_lag=0, host_time=False)),
                ("as built, torch decision (eager operators)", dataclasses.replace(base, decision_kernels="torch")),
                ("as built, one full width (no price)", dataclasses.replace(
                    base, cost_tables="given", widths=(n + 1,), adaptive_depth=False))]
    if base.cost_tables == "measured":
        variants.append(("as built, no extra widths (EAGLE's, full)", dataclasses.replace(
            base, cost_tables="given", widths=(steps + 1, n + 1), adaptive_depth=False, price_context=base.price_at)))
    if base.cost_tables != "given":
        variants.append(("both cost tables given (does not fit B=128)", dataclasses.replace(
            base, cost_tables="given", adaptive_depth=True)))
    sync = cfg.ragged_sync_us
    variants += [(f"ragged, blocking read ({us:g} us), token tiers", dataclasses.replace(
        base, verify="ragged_sync", sync_us=us)) for us in (sync, 2 * sync)]
    # the blocking read's launch with one of its gaps to the ideal engine closed at a time, then all four: what is
    # left is the token tiers' padding and the n-gram route (proposals through the alignment and the lookup, not the
    # drafter's own k tokens)
    ragged = dataclasses.replace(base, verify="ragged_sync", sync_us=sync)
    closed = {"no stall": dict(sync_us=0.0),
              "depth chosen 1 step ahead": dict(width_lag=1, host_overlap=True),
              "n-gram proposals fresh": dict(ngram_lag=0),
              "no n-gram host path": dict(host_time=False)}
    variants += [(f"blocking read, {what}", dataclasses.replace(ragged, **kw)) for what, kw in closed.items()]
    variants.append(("blocking read, all four closed", dataclasses.replace(
        ragged, **{k: v for kw in closed.values() for k, v in kw.items()})))
    # the price's context, padded and with the blocking read: the launch's blend of two start-up probes against one
    # probe at 2,048 tokens a request (an earlier launch) and, a design, the batch's exact context
    if base.price_at == "blend":
        variants += [(f"{launch}, {how}", dataclasses.replace(eng, price_context=ctx))
                     for launch, eng in (("as built", base), ("blocking read", ragged))
                     for ctx, how in (("start", "price at one probe's context"),
                                      ("batch", "price at the batch's exact context (a design)"))]
    variants += [("ragged, own width read late, token tiers", dataclasses.replace(base, verify="ragged_late")),
                 ("ideal", dataclasses.replace(runner.engines["ideal"], num_steps=steps, ngram_k=k, n_nodes=n))]
    return variants


def decompose(runner: Runner, cfg: Config, title: str, columns: list) -> list:
    """Where the as-built engine loses against the ideal one: HYBRID / no speculation in each of ``columns``
    (`DecomposeColumn`: a cell and the HYBRID settings it runs), with one mechanic switched at a time: without the
    device prompt lookup (misaligned rows get no n-gram candidate), with the host work added to the device step instead
    of overlapping it, fresh n-gram proposals and no n-gram host path, the decision on the torch path (its eager
    operators: what fusing it bought), one fixed width n_nodes + 1 (the launch before a price came out of the box),
    the launch without its extra widths (plain EAGLE's and the full tree only, the default before the extras:
    ``widths.measured_table_buckets``), and both cost tables given (every width bucket and adaptive drafting: the
    launch the replay headlined before, which does not start on an H200 at batch 128). The
    as-built engine is ``cfg.cost_tables``' launch: by default the README's, the verify table measured at start (widths
    ``num_steps + 1`` and ``n_nodes + 1``, no draft table so a fixed EAGLE depth; the replay prices it with its own
    step-time table, the measurement's stand-in). Then the two ragged-verify layouts for a GPU
    (``engine.VERIFY_LAYOUTS``): the node counts read by a blocking read after the decision (the worker's, with
    ``ragged_verify=on``: at ``cfg.ragged_sync_us`` of device idle per step, and at twice that), or each request's
    own width read late without blocking (a design, not built); both with verify graphs keyed by token tiers. And the
    blocking read with one of its gaps to the ideal engine closed at a time (its stall, the depth lag of overlap
    scheduling, the n-gram proposal's lag, the n-gram host path), then all four. And, where the launch measures its
    tables at start, the padded launch and the blocking read with the price's tables at one probe's context
    (``price_context`` "start": the launch before its second probe) and, a design, at the batch's exact mean context
    ("batch"; the launch blends two probes').
    docs/sglang.md ("Ragged verify") chooses between them, and between them and the padded verify, with these rows, on
    the simulated drafter's sweep cells and on the real SmolLM2 trace."""
    if not columns:
        return []
    rows = {(c.steps, c.k): decompose_variants(runner, cfg, c.steps, c.k) for c in columns}
    names = [name for name, _ in next(iter(rows.values()))]
    pols = {key: [engine_policies(runner.core, eng, ())[0] for _, eng in vs] for key, vs in rows.items()}

    def speedup(item) -> float:
        row, col = item
        c = columns[col]
        pol = pols[(c.steps, c.k)][row]
        r = runner.sim(pol, c.bank, c.idx, c.b, c.seed,
                       (c.source, "decompose:" + names[row], c.workload, c.b, f"hybrid_merge_s{c.steps}_k{c.k}",
                        c.seed))
        ns = runner.sim(runner.free[0], c.bank, c.idx, c.b, c.seed,
                        (free_source(c.source), "-", c.workload, c.b, "no_spec", c.seed))
        return r.tok_per_s / ns.tok_per_s

    got = iter(runner.in_processes(speedup, [(row, col) for row in range(len(names))
                                             for col in range(len(columns))]))
    width = max(14, *(len(c.title) + 2 for c in columns))
    nw = max(44, *(len(name) + 2 for name in names))
    lines = [title, f"{'engine':<{nw}}" + "".join(f"{c.title:>{width}}" for c in columns)]
    lines += [f"{name:<{nw}}" + "".join(f"{next(got):>{width - 1}.2f}x" for _ in columns) for name in names]
    return lines


def text_banks(runner: Runner, cfg: Config) -> tuple:
    """({seed: bank}, {seed: {workload: indices}}) of the real-text workloads the simulated head drafts on, every
    model-free drafter's proposals computed (before any cell forks, `Runner.run_source`)."""
    banks, groups = {}, {}
    for s in cfg.seeds:
        reqs, groups[s] = replay_synth.real_text_requests(cfg.requests, s, cfg.out_tokens, 8)
        banks[s] = DraftBank(reqs, runner.bank_k, ngram_width=runner.pw, pad=runner.bank_pad)
        for kind in ("ngram",) + runner.free_kinds():
            banks[s].ensure(kind)
    return banks, groups


def results_section(runner: Runner, cfg: Config, command: str, wall_s: float, verdicts_: list) -> dict:
    """A run's section of the results file (`bench.replay.results`): every cell HYBRID ran in every mode and source
    (ratios as [point, low, high]), the targets, and what ran it."""
    import os
    import platform

    cells = []
    for m in runner.engines:
        for k, c in all_cells(runner, m):
            if c is not None:
                cells.append({"source": "real" if k[0] == "real" else label(k[0]), "mode": k[1], "workload": k[2],
                              "batch": k[3], **{kk: vv for kk, vv in c.items() if kk != "stats"}})
    return {"command": command, "wall_s": round(wall_s, 1), "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()} CPU, {len(os.sched_getaffinity(0))} cores, no GPU",
            "config": {k: str(x) for k, x in dataclasses.asdict(cfg).items()}, "cells": cells,
            "targets": [list(t) for t in verdicts_]}


def real_banks(runner: Runner, cfg: Config, tune_trace, eval_trace, temperature: float = 1.0) -> tuple:
    """({seed: bank}, {seed: {workload: indices}}) of the real-drafter traces: the tuning seed replays the tuning
    trace (other packages, other conversations), every evaluation seed the evaluation trace (seeds vary the stream
    order and start phases); the EAGLE probabilities distorted at ``temperature`` (`miscalibration.distorted`)."""
    from bench.replay.miscalibration import distorted

    banks, groups = {}, {}
    for i, s in enumerate(cfg.seeds):
        trace = tune_trace if i == 0 else eval_trace
        if i <= 1:
            reqs = [r for r in trace.requests if len(r.output)]
            bank = DraftBank(reqs, max(trace.eagle_k, runner.bank_k), ngram_width=runner.pw, pad=runner.bank_pad)
            g = {w: [j for j, r in enumerate(reqs) if r.workload == w] for w in ("code", "code-edit", "chat")}
            g["mixed"] = g["code"][:len(g["code"]) // 2] + g["chat"][:len(g["chat"]) // 2]
            g = {w: idx for w, idx in g.items() if idx}
        banks[s], groups[s] = distorted(bank, temperature), g
    return banks, groups


def run_real(runner: Runner, cfg: Config, head_cells, log) -> Optional[list]:
    """The real-drafter source ("real"): SmolLM2-135M's greedy outputs with its EAGLE head's own chains and
    alternatives, both drafters real, tuned on the tuning trace and evaluated on the held-out one. Returns the
    decomposition's lines, or None when the traces are absent (said so)."""
    from bench.replay import traces as replay_traces

    try:
        tune, evals, manifest = replay_traces.read_real_traces(cfg.real_traces)
    except FileNotFoundError as e:
        log(f"real-drafter rows: NOT RUN: {e}")
        return None
    banks, groups = real_banks(runner, cfg, tune, evals)
    t, e = cfg.seeds[0], cfg.seeds[1] if len(cfg.seeds) > 1 else cfg.seeds[0]
    log(f"real drafters: {cfg.real_traces}: {manifest['model']} writes every output (greedy, "
        f"{manifest['output_tokens']} tokens a request), its EAGLE head ({manifest['draft_model']}) drafts; tuning "
        f"(seed {t}): " + ", ".join(f"{w} {len(i)}" for w, i in groups[t].items()) + "; evaluation (other packages "
        "and conversations, seeds " + ", ".join(map(str, evaluation_seeds(cfg.seeds))) + "): "
        + ", ".join(f"{w} {len(i)}" for w, i in groups[e].items()) + " requests")
    k_needed = max(runner.engines["as built"].num_steps, *cfg.hybrid_steps)
    if evals.eagle_k < k_needed:
        log(f"  skipped: its eagle_k={evals.eagle_k} is below the deepest EAGLE chain HYBRID drafts ({k_needed})")
        return None
    eagle, ks = runner.model_ranges(banks[t])
    log(f"  the model-only baselines' ranges stop at the trace's EAGLE depth ({evals.eagle_k}): fixed EAGLE k in "
        f"{[p.k for p in eagle]}, adaptive K in {[runner.adaptive[n].num_steps for n in ks]}")
    alt_modes = runner.alternatives_modes
    if alt_modes and evals.eagle_alternatives < cfg.eagle_alternatives:
        log(f"  its EAGLE alternatives rows NOT RUN: the traces record {evals.eagle_alternatives} per chain position, "
            f"eagle_alternatives={cfg.eagle_alternatives} needs that many")
        alt_modes = ()
    runner.run_source("real", banks, groups, head_cells, list(cfg.seeds), runner.head_modes + alt_modes, log)
    if not cfg.decompose:
        return []
    s0 = evaluation_seeds(cfg.seeds)[0]
    cols = [DecomposeColumn(f"{w} B={b} S{st}/K{k}", banks[s0], groups[s0][w], w, b, s0, "real", st, k)
            for w, b in cfg.real_decompose_cells if w in groups[s0] and b in cfg.batches
            for st, k in [runner.best[("real", "as built", w, b, "hybrid")]]]
    return decompose(runner, cfg, f"The same on the real drafters (SmolLM2's EAGLE head's own drafts), seed {s0}, "
                     "HYBRID at each cell's tuned settings", cols)


def run(cfg: Config, log=print) -> int:
    import torch

    torch.set_num_threads(1)   # small per-step ops: threads only contend (and the cores are shared)
    t_start = time.perf_counter()
    runner = Runner(cfg)
    log("# Hybrid Spark realistic replay (python -m bench.replay --realistic)")
    log(f"date {time.strftime('%Y-%m-%d %H:%M')}; {cfg.requests} requests per workload, outputs <= {cfg.out_tokens} "
        f"tokens, seeds {list(cfg.seeds)}, batches {list(cfg.batches)}; cells in {cfg.jobs} process(es)")
    log("MEASURED inputs: real text (code edits between package releases, ShareGPT assistant turns, mixed); the "
        "n-gram drafters' real proposals; the worker's host path (bench.host_path). SIMULATED: the model drafter "
        "(swept strength, calibrated by construction) and every step time (GPU roofline below); the engine is "
        "MODELLED (as built / ideal). MEASURED on an H200 (the device kit, docs/device_run/): the decision's launch "
        "costs" + ("" if runner.measured_note else ", and a compact decoder's step-time table the headline contenders "
                   "are rerun under") + "; nothing else ran on a GPU.")
    for e in runner.engines.values():
        log(f"engine {e.describe()}")
    log(f"draft forwards: a k-token EAGLE chain costs {P.draft_forwards(4)} draft steps for k=4 (SGLang 0.5.23: "
        f"draft-extend + k-1 draft decodes), for every EAGLE policy")
    start = ("all at token 0 (--lockstep-start)" if cfg.lockstep_start else
             "at seeded uniform positions of their outputs, a server's steady state (--lockstep-start: all at token 0)")
    log(f"runs: continuous batching at a fixed concurrency B, the first B requests starting {start}; refills from "
        "their first token; measured until a slot cannot be refilled (bench.replay.sim)")
    log(f"cost model {runner.specs.name} (simulated):")
    for a in runner.specs.assumptions:
        log(f"  - {a}")
    log("baselines: " + (runner.suffix_note or (
        "suffix decoding: Arctic Inference's SuffixDecodingCache (vLLM's suffix defaults: depth 24, max_spec_factor "
        "1, min_token_prob 0.1, chain mode), its k tuned like the n-gram baselines; without the global cache of other "
        "responses: the replay's streams repeat requests, and a global cache would copy a request's own earlier "
        "answer")))
    log(f"EAGLE trees (SGLang's --speculative-eagle-topk > 1; (steps, topk, num_draft_tokens) in "
        f"{[tuple(t) for t in cfg.eagle_trees]}, tuned with fixed EAGLE and model-only adaptive as the best model-only "
        f"policy; simulated drafter only): the r-th candidate of a node on the output's path is right, when no better "
        f"one is, with a share of the probability left drawn around {list(replay_synth.RANK_HIT)} (r = 2..8, "
        "MEASURED on the SmolLM2 EAGLE head's first draft token); its draft forwards after the first run topk beams "
        "per request, each reading the request's KV")
    cands = [runner.engine_pols["as built"][n] for n in runner.hybrid_candidates("as built")]
    log(f"HYBRID merge: (EAGLE steps, n-gram chain length) "
        f"{', '.join(f'({p.num_steps}, {p.engine.ngram_k})' for p in cands)} "
        f"(({cands[0].num_steps}, {cands[0].engine.ngram_k}) deployed by default), the fastest per cell on the first "
        "seed, as each baseline's k is tuned (S<n>/K<k> in the per-policy tables; the sweep points reuse the headline "
        "point's n-gram chain length per cell); model-free "
        f"n-gram baselines tuned over k in {list(cfg.ngram_ks)}")
    log("calibration: model side identity for HYBRID and model-only alike (the simulated drafter is calibrated by "
        f"construction); n-gram side: {runner.core.ngram_cal_name}")

    t0 = time.perf_counter()
    banks, groups = text_banks(runner, cfg)
    n_tok = {w: int(sum(banks[cfg.seeds[0]].lengths[i] for i in idx)) for w, idx in groups[cfg.seeds[0]].items()}
    log(f"workloads (seed {cfg.seeds[0]}): " + ", ".join(f"{w} {len(idx)} requests / {n_tok[w]} output tokens"
                                                      for w, idx in groups[cfg.seeds[0]].items())
        + f"; n-gram and prompt-lookup drafts for {len(cfg.seeds)} seeds in {time.perf_counter() - t0:.0f} s; "
        f"prompt lookup: {banks[cfg.seeds[0]].notes.get('pld-5-5', '')}")
    flags = {s: replay_synth.copy_flags(banks[s]) for s in cfg.seeds}
    density = {w: replay_synth.edit_density(banks[s], flags[s], groups[s][w]) for s in evaluation_seeds(cfg.seeds)[:1]
               for w in WORKLOADS if w in groups[s]}
    log("edit density (first evaluation seed): " + "; ".join(
        f"{w}: copy positions {c:.2f} (a long n-gram match predicts the next token), windows verbatim in the prompt "
        f"{v:.2f}" for w, (c, v) in density.items()))

    head_cells = [(w, b) for w in WORKLOADS if w in groups[cfg.seeds[0]] for b in cfg.batches]
    points = [HEADLINE] + ([p for p in sweep_points() if p != HEADLINE] if cfg.sweep else [])
    for pt in points:
        eb = {}
        for s in (cfg.seeds if pt == HEADLINE else cfg.seeds[:2]):
            toks, probs = replay_synth.simulated_eagle(banks[s], flags[s], pt[0], pt[1], simulated_depth(cfg), s)
            trees = replay_synth.SimulatedEagleTrees(banks[s], flags[s], pt[0], pt[1], toks, probs, s)
            eb[s] = replay_synth.with_eagle(banks[s], toks, probs, trees)
        if pt == HEADLINE:
            runner.run_source(pt, eb, groups, head_cells, list(cfg.seeds),
                              runner.head_modes + runner.alternatives_modes,
                              log)
            eb_head = eb
        else:
            runner.run_source(pt, eb, groups, list(cfg.sweep_cells), list(cfg.seeds[:2]), cfg.sweep_modes, log,
                              adaptive_from=HEADLINE)
        log(f"[{time.perf_counter() - t_start:.0f} s] {label(pt)} done")

    decomposition = []
    s0 = evaluation_seeds(cfg.seeds)[0]           # the decompositions' seed
    if cfg.decompose:
        dep = runner.engines["as built"]
        decomposition = decompose(
            runner, cfg, f"Where the as-built gap comes from: HYBRID merge / no speculation, {label(HEADLINE)}, seed "
            f"{s0}, HYBRID at the deployed {dep.num_steps} EAGLE steps and n-gram chain {dep.ngram_k}",
            [DecomposeColumn(f"{w} B={b}", eb_head[s0], groups[s0][w], w, b, s0, HEADLINE, dep.num_steps, dep.ngram_k)
             for w, b in cfg.sweep_cells if w in groups[s0]])
    sources = list(points)
    if cfg.real_traces is not None:
        real_lines = run_real(runner, cfg, head_cells, log)
        if real_lines is not None:
            sources.append("real")
            decomposition += [""] + real_lines if real_lines else []

    rows = layout_rows(runner, sources, cfg.batches)
    log("")
    charged = (f"SIMULATED step times (roofline, smooth knee p=3, real contexts), decision charged "
               f"({cfg.launch.host_us:g} us host + {cfg.launch.gpu_us:g} us GPU per launch)")
    for key, title in (("vs_model", "HYBRID merge / best model-only"),
                       ("vs_single", "HYBRID merge / best single drafter (best of model-only and n-gram-only)"),
                       ("vs_single_host_overlapped", "HYBRID merge / best single drafter, every drafter's host work "
                                                     "overlapped with the device step (vLLM's and Arctic's too)"),
                       ("vs_single_host_added", "HYBRID merge / best single drafter, every drafter's host work added "
                                                "to the device step (HYBRID's and our n-gram drafter's too)"),
                       ("vs_rule", "HYBRID merge / 'n-gram if it matches, else EAGLE' (tuned k)"),
                       ("vs_oracle", "HYBRID merge / chain oracle (the better chain each step, known in advance, "
                                     "ragged, no waste; bounds chain choice, not trees)"),
                       ("vs_nospec", "HYBRID merge / no speculation")):
        for line in print_layout(rows, key, f"{title}; {charged}; evaluation seeds pooled, as built with 95% "
                                 "bootstrap CI over source files / ideal / as-built loss vs ideal", cfg.batches):
            log(line)
        log("")
    log("")
    hard_cells = [(w, b) for _, w, bs in columns(cfg.batches) for b in bs]
    titles = {"hardmax": "the hard-max roofline (max(t_mem, t_flop): verified tokens free up to the ridge point)",
              "measured": f"the step-time table MEASURED on an H200 ({cfg.measured_table}: a compact PyTorch "
                          "Llama-3.1-8B-shaped decoder, random weights, 2,048 context tokens per request, NOT SGLang; "
                          "widths past 16 extrapolate its last slope; trees' draft forwards at requests x topk)"}
    for kind in runner.alt_specs:
        log(f"The same contenders under {titles[kind]}, {label(HEADLINE)}, as built, choices tuned under the smooth "
            "knee; HYBRID / best model-only, / best single drafter, / no speculation:")
        cells = runner.in_processes(
            lambda cell, kind=kind: runner.alt_cost_cell(kind, HEADLINE, eb_head, groups, *cell), hard_cells)
        for (w, b), c in zip(hard_cells, cells):
            if c is not None:
                log(f"  {w} B={b}: {fmt_ci(c['vs_model'])}, {fmt_ci(c['vs_single'])}, {fmt_ci(c['vs_nospec'])}")
        log("")
    if runner.measured_note:
        log(f"Measured step times: {runner.measured_note}")
        log("")
    log(f"Per-policy speedup over no speculation, {label(HEADLINE)} (pooled over evaluation seeds "
        f"{evaluation_seeds(cfg.seeds)}; {charged}):")
    for line in detail_table(runner, HEADLINE, head_cells):
        log(line)
    alt_lines = alternatives_lines(runner, head_cells)
    if alt_lines:
        log("")
        for line in alt_lines:
            log(line)
    if "real" in sources:
        log("")
        log("Per-policy speedup over no speculation, real, small (SmolLM2 trace):")
        for line in detail_table(runner, "real", head_cells):
            log(line)
        real_alt = alternatives_lines(runner, head_cells, "real")
        if real_alt:
            log("")
            for line in real_alt:
                log(line)
    wc: dict = {}
    for k, r in runner.runs.items():
        if k[0] == HEADLINE and k[1] == "as built" and k[4] == "hybrid_merge":
            for w_, n in r.stats.get("width_counts", {}).items():
                wc.setdefault((k[2], k[3]), {}).setdefault(w_, 0)
                wc[(k[2], k[3])][w_] += n
    if wc:
        log("as-built verify width buckets chosen (steps per width), " + label(HEADLINE) + ": " + "; ".join(
            f"{w} B={b}: " + ",".join(f"W{x}:{n}" for x, n in sorted(d.items())) for (w, b), d in sorted(wc.items())))

    if decomposition:
        log("")
        for line in decomposition:
            log(line)
    v = verdicts(runner, cfg, time.perf_counter() - t_start)
    log("")
    log("Targets:")
    for name, ok, detail in v:
        log(f"  [{'MET' if ok else 'MISSED'}] {name}: {detail}")
    pngs = []
    if cfg.plot is not None and cfg.sweep:
        p = plot(runner, cfg, Path(cfg.plot))
        if p:
            pngs.append(str(p))
    cfg.out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter() - t_start
    section = results_section(runner, cfg, "python -m bench.replay --realistic", wall, v)
    section["edit_density"] = {w: list(d) for w, d in density.items()}
    (cfg.out / "realistic_results.json").write_text(json.dumps(section, indent=1, default=str))
    written = [str(cfg.out / "realistic_results.json")]
    if cfg.results is not None:
        from bench.replay import results as replay_results

        written.append(str(replay_results.write_section("realistic", section, cfg.results)))
    log(f"\nwrote {', '.join(written)}" + (f", plot {', '.join(pngs)}" if pngs else ""))
    log(f"realistic replay wall time {time.perf_counter() - t_start:.0f} s")
    return 0
