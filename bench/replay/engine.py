"""The replay's engine mechanics: HYBRID (and the model-only baseline) run as the SGLang plugin runs them, or ideally.

Why a separate module: `bench.replay.policies` states *what* each policy drafts; this module states *how the engine we
ship executes it*, so the gap between the two modes is exactly the engine's to-do list. Both modes call the core's
``sglang_hybrid.step.DecisionStep`` (the worker's decision code); they differ only in the mechanics around it:

=================  =====================================================  ============================================
mechanic           as built (``EngineConfig()``, the default)             ideal (``EngineConfig.ideal()``)
=================  =====================================================  ============================================
cost tables        ``cost_tables``: "given" (the default here: both       --
                   tables, every width bucket, adaptive drafting) or
                   "measured" (the README's launch, the realistic run's
                   headline: ``COST_TABLES``)
verify width       padded: every request verifies ``W`` tokens, ``W``     ragged: each request its root + the nodes
                   from the width buckets ``default_buckets(n_nodes+1)``  the price keeps; cost ``T(sum)``
                   (``DecisionStep(widths=...)``); cost ``T(B * W)``.
                   ``verify=`` one of two ragged layouts for a GPU
                   (``VERIFY_LAYOUTS``: a blocking read, built, opt-in;
                   a late read, a design)
width lag          the bucket chosen at step t is verified at t + lag     --
                   (1: CPU engine; 2: GPU with overlap scheduling)
n-gram proposals   computed on the host ``ngram_lag`` steps late, ``k +   fresh, at the exact position, ``k`` tokens
                   max_depth + 1`` wide, shifted and kept only if the
                   tokens committed since match (the plugin's
                   ``alignment.align``, called here), first ``k`` used
host time          the worker's measured host path per step plus the      the decision's dispatch only, overlapped
                   decision's dispatch (below), overlapping the
                   device's previous step when the lags are overlap
                   scheduling's (``width_lag >= 2``)
decision launches  the worker's launches per step, counted by             the fused step's count (every policy,
                   ``bench.step_launches`` for the policy's               the model-only one included)
                   configuration: its fused Triton path by default
                   (``decision_kernels``: "torch" charges the reference
                   operators instead); GPU time on the device, dispatch
                   on the host (``bench.replay.host.LaunchCost``)
draft forwards     ``d`` per step (``policies.draft_forwards``), ``d``    same
                   the EAGLE depth the core chose (adaptive drafting,
                   ``DecisionStep(depths=...)`` with the cost model's
                   draft step as ``draft_cost``) one step before (the
                   width lag; at least 1: a depth is chosen from the
                   previous step's survivals); ``num_steps`` when
                   ``adaptive_depth`` is off
model offset       each HYBRID request's online offset on the EAGLE       same
                   side's calibrated logit (the worker's setting
                   ``model_bias_eta``, ``request_bias``), learned from
                   its chain against the tokens committed since, before
                   the next decision (the worker updates it after each
                   verify, on the device)
n-gram offset      the same on the n-gram side (the worker's setting       same
                   ``ngram_bias_eta``), learned from the request's last
                   n-gram chain
model temperature  HYBRID's per-depth temperature of the model side's     same
                   calibration, one for the whole engine (the worker's
                   setting ``model_calibration_eta``, on by default,
                   ``online_calibration``), learned from every
                   request's chain against the tokens committed since
price context      the README's launch: its two start-up probes' tables   same (the launch's tables)
                   blended at each step's mean context by the worker's
                   ``ContextCostTables.follow``; a user's tables: at
                   one context (``price_at``, ``PRICE_CONTEXTS``)
=================  =====================================================  ============================================

Host time and launches: what each costs, and where it was measured, is in ``bench.replay.host``. The worker runs its
n-gram host path at the start of ``forward_batch_generation``, before launching the step's kernels, and then launches
its device step: seven Triton kernels on the fused path it runs wherever Triton does (eight where its tables are the
ones measured at start: their blend at the batch's context), several hundred eager operators
on the torch path (``bench.step_launches`` counts either for the policy's configuration, once: see
``LAUNCH_COUNT_BATCH``). Without
overlap scheduling (the CPU engine, ``width_lag`` 1) the device is idle while the host works, so the step costs
device time + host time. With overlap scheduling (``width_lag`` 2, the GPU default) the scheduler launches step t + 1
while the device still runs step t, so the host work runs under step t and the step costs max(device time, host
time); the decision's kernels still add their GPU time to the device. That assumes SGLang's own per-step scheduling
work leaves the host room under the device step (its overlap scheduler exists to hide that work);
``EngineConfig(host_overlap=False)`` charges the sum instead. The ideal engine charges no host time and the fused
step's launches.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import numpy as np

from bench import step_launches
from bench.replay import policies as P
from bench.replay.host import LaunchCost, host_seconds
from sglang_hybrid.online_calibration import OnlineTemperature, OutcomeBins
from sglang_hybrid.request_bias import update_bias
from sglang_hybrid.sglang_plugin.ragged.tiers import token_tier
from sglang_hybrid.widths import default_depths, start_width


#: verify layouts of an as-built engine. The host must know how many rows each request's verify takes before it can
#: plan the attention and pick the captured graph; the node counts are decided on the device. The padded layout
#: sidesteps that with a width read late; the ragged ones answer it in the two ways the ragged design names.
VERIFY_LAYOUTS = {
    "padded": "every request verifies W tokens, W the width bucket chosen {width_lag} step(s) before; cost T(B W)",
    "ragged_sync": ("ragged verify (built on Triton and FlashInfer at TP 1, opt-in on a GPU, not run there): each "
                    "request its root + the nodes the price keeps, the counts read by the host after the decision, "
                    "{sync_us:g} us per step for that read and the layout work the verify waits on (RAGGED_SYNC_US, "
                    "Triton's: FlashInfer's plan adds host work after the read, not charged); verify graphs keyed by "
                    "token tiers (token_tier), cost T(token tier of the sum)"),
    "ragged_late": ("ragged verify (a design, not built): each request at most the rows it chose {width_lag} step(s) "
                    "before (its own width, read late without blocking, as the bucket is), laid out whether used or "
                    "not; verify graphs keyed by token tiers (token_tier), cost T(token tier of the sum of those "
                    "widths)"),
}
#: the batch size a policy's decision launches are counted at, charged at every batch size: a step's launches do not
#: depend on its batch (static shapes, one grid per kernel, whatever the rows: what CUDA graphs capture), as
#: ``python -m bench.step_launches`` checks at 1, 32 and 128 and ``tests/bench/test_replay_engine.py`` for the replay's
#: policies (one exception: the model-only torch path dispatches one operator fewer at 1 request, a `contiguous` of
#: an already contiguous tensor, which launches nothing). Why once: a fused count runs the step under Triton's
#: interpreter, 0.7 s at 4 requests and 2.4 s at 128; counted at each batch size, the realistic run's engine
#: policies (25 distinct counts) took 102 s of counting (18, 25 and 59 s at 4, 32 and 128), its decomposition's
#: variants more
LAUNCH_COUNT_BATCH = 4
#: the context the price's step-time tables are at (``EngineConfig.price_context``)
PRICE_CONTEXTS = {
    "start": "one table, every request at one context (a user's table; an earlier README launch "
             "measured its tables at the probe's context only: the worker's PROFILE_CONTEXT, the replay's "
             "--gpu-context), whatever the batch holds",
    "blend": "the README's launch: the tables of its two start-up probes, at an eighth of the probe's context and "
             "at the probe's context, blended each step at the batch's mean context by the worker's own "
             "ContextCostTables.follow (extrapolated past the longer probe, then raised to its running maximum; the "
             "shorter probe's below it)",
    "batch": "a design, not built: the tables at the batch's own mean context, each step (the charge's roofline at "
             "that context, rounded to PRICE_CONTEXT_QUANTUM tokens)",
}
#: tokens the "batch" price context is rounded to (one table per rounded context, built once per run)
PRICE_CONTEXT_QUANTUM = 64
#: the cost tables an as-built launch has (``EngineConfig.cost_tables``)
COST_TABLES = {
    "given": "both cost tables given by the user: every width bucket and adaptive drafting (does not start on an "
             "H200 at 128 requests: bench.memory_budget)",
    "measured": "none given, the README's launch: both tables measured at start, widths = plain EAGLE's, the "
                "full tree and the extras that pay at the batch by the verify table and whose runtime states fit the "
                "H200's free memory, the EAGLE depth chosen by the draft table (adaptive drafting)",
}
#: the "ragged_sync" stall's parts. The device idle of one blocking read of the counts between two graphs: MEASURED on
#: an H200 (the device kit's ragged job, 16 counts: ``blocking_read_stall_us`` in docs/device_run/ragged.json)
RAGGED_READ_US = 41.1
#: what the host launches between that read and the verify graph's replay, as built: ATen operators and Triton
#: launches, a MEASURED count (``python -m bench.ragged_sync_ops``, SGLang's CPU engine; the live suite
#: checks every step launches exactly these), each charged its host dispatch (``host.LaunchCost``: the published
#: per-operator figure, the measured per-Triton-launch one) with the device idle. None now: the KV write
#: ids, the graph's static buffers and the attention plan are queued before the read (``graph_runner.load_ahead``);
#: until then 22 operators and 1 Triton launch
RAGGED_SYNC_OPS, RAGGED_SYNC_TRITON = 0, 0
#: what ragged verify queues on the device between the decision and that read (the worker's layout build, the
#: compaction, the KV write ids, the static buffers, the attention plan), MEASURED alike: their host dispatch hides
#: under the device's draft and decision, their device time does not (the verify waits on them), each charged its GPU
#: time (``host.LaunchCost``: 2 us an operator, published; 15 us a Triton launch, measured). Not charged before
#: 82 operators and 1 Triton launch until the layout and the compaction became one Triton launch each
#: (``kernels.ragged_layout``), writing the request padding and the graphs' static inputs themselves
RAGGED_AHEAD_OPS, RAGGED_AHEAD_TRITON = 16, 3
RAGGED_SYNC_US = round((RAGGED_READ_US * 1e-6 + LaunchCost().host_s(RAGGED_SYNC_TRITON, RAGGED_SYNC_OPS)
                        + LaunchCost().device_s(RAGGED_AHEAD_TRITON, RAGGED_AHEAD_OPS)) * 1e6, 1)


def _setting_default(name: str):
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    return HybridSettings.model_fields[name].default


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Engine mechanics of one replay mode (module docstring). ``num_steps``, ``ngram_k``, ``n_nodes`` default to the
    deployed configuration (4 EAGLE steps, n-gram chain of 8, merge with 12 nodes, full width 13)."""

    as_built: bool = True
    #: the GPU engine's lags: with SGLang's overlap scheduling the host runs one step ahead, so n-gram proposals are
    #: one step late and a chosen width (and depth) applies two steps later; without overlap (the CPU engine) they
    #: are 0 and 1
    width_lag: int = 2
    ngram_lag: int = 1
    host_time: bool = True
    #: with overlap scheduling the host path runs while the device executes the previous step (module docstring);
    #: None: overlapped exactly when the lags are overlap scheduling's (width_lag >= 2)
    host_overlap: Optional[bool] = None
    #: rows whose late proposal did not align take the device prompt lookup's (the worker's ``context_lookup``)
    context_lookup: bool = True
    num_steps: int = 4
    ngram_k: int = 8
    n_nodes: int = 12
    widths: Optional[tuple] = None      # None: sglang_hybrid.widths.default_buckets(n_nodes + 1)
    #: adaptive drafting (the worker with a draft table, given or measured at start): its default depths,
    #: ``widths.default_depths``; False: a fixed depth (the worker with ``draft_depths = []``, or an earlier worker
    #: the README's launch, which measured the verify table only)
    adaptive_depth: bool = True
    #: HYBRID's online offset on the EAGLE side's calibrated logit: the worker's setting ``model_bias_eta`` and its
    #: default (None: off); the model-only baselines run without it, as the reference loop's do
    model_bias_eta: Optional[float] = None
    #: HYBRID's online per-depth temperature of the model side's calibration, one for the engine: the worker's
    #: setting ``model_calibration_eta`` and its default (on; None: off); the model-only baselines run without it
    model_calibration_eta: Optional[float] = _setting_default("model_calibration_eta")
    #: the model side's calibration is recorded (``EnginePolicy.stats``: ``model_ece``) over the tested chain tokens
    #: of the steps after the engine's first ``calibration_after_steps``: what the online temperature left
    calibration_after_steps: int = 2000
    #: HYBRID's online offset on the n-gram side's calibrated logit: the worker's setting ``ngram_bias_eta`` and its
    #: default, "auto" (learned where verify runs ragged, the ideal engine's included, off where padded:
    #: ``ngram_eta``); a rate; None: off
    ngram_bias_eta: object = "auto"
    #: kernel launches of the decision per step; None: counted from the worker's code for the policy's configuration
    #: (``bench.step_launches``, at ``LAUNCH_COUNT_BATCH``)
    launches: Optional[int] = None
    #: the worker's decision path whose launches are counted (its setting ``decision_kernels``): "fused" (the
    #: default wherever Triton runs) or "torch"
    decision_kernels: str = "fused"
    #: which cost tables the launch has (``COST_TABLES``): "given" = both, the user's (every width bucket and
    #: adaptive drafting); "measured" = the README's launch, none given: both measured at start, the worker's widths
    #: for the verify table (``HybridSettings.resolved_verify_widths``: plain EAGLE's, the full tree and the extras
    #: of ``widths.measured_table_buckets`` that fit the memory at the batch, ``verify_widths``) and its default
    #: depths for the draft table; ``widths`` applies to "given" only
    cost_tables: str = "given"
    #: the verify layout (``VERIFY_LAYOUTS``): "padded" is what the GPU worker runs by default; "ragged_sync" is its
    #: ragged verify (setting ``ragged_verify=on``: built on Triton and FlashInfer at TP 1, not run on a GPU yet);
    #: "ragged_late" a design, not built. docs/sglang.md ("Ragged verify") chooses between them with the
    #: decomposition's rows
    verify: str = "padded"
    #: "ragged_sync" only: how long the device idles per step while the host reads the node counts and launches what
    #: follows up to the verify graph (``RAGGED_SYNC_US``: the measured read plus the counted launches' dispatch)
    sync_us: float = RAGGED_SYNC_US
    #: the context the price's tables are at (``PRICE_CONTEXTS``); None: the launch's own, ``price_at``. "blend" and
    #: "batch" need the charge's roofline (a GPU cost spec) to stand in for the probes
    price_context: Optional[str] = None
    #: the worker's setting ``eagle_alternatives`` (the simulated drafter only): the EAGLE side as a chain with its
    #: ``M`` next-best tokens at each position hung as leaves (``step.ModelDraft.alt_tokens``; their draws in
    #: ``synth.SimulatedEagleTrees.alternatives``), no draft forward beyond the chain's, the worker's launches for
    #: them counted with the decision's (``bench.step_launches``); 0: the chain alone
    eagle_alternatives: int = 0

    def __post_init__(self):
        if isinstance(self.eagle_alternatives, bool) or not isinstance(self.eagle_alternatives, int) \
                or self.eagle_alternatives < 0:
            raise ValueError(f"eagle_alternatives must be an int >= 0, got {self.eagle_alternatives!r}")
        if self.cost_tables not in COST_TABLES:
            raise ValueError(f"cost_tables must be one of {tuple(COST_TABLES)}, got {self.cost_tables!r}")
        if self.price_context is not None and self.price_context not in PRICE_CONTEXTS:
            raise ValueError(f"price_context must be one of {tuple(PRICE_CONTEXTS)}, got {self.price_context!r}")
        if self.verify not in VERIFY_LAYOUTS:
            raise ValueError(f"verify must be one of {tuple(VERIFY_LAYOUTS)}, got {self.verify!r}")
        if self.verify != "padded" and not self.as_built:
            raise ValueError("the ideal engine verifies ragged by definition; verify layouts are for as-built engines")
        if self.sync_us < 0:
            raise ValueError(f"sync_us must be >= 0, got {self.sync_us!r}")
        if self.model_calibration_eta is not None and not self.model_calibration_eta > 0:
            raise ValueError(f"model_calibration_eta must be > 0 or None, got {self.model_calibration_eta!r}")
        if self.calibration_after_steps < 0:
            raise ValueError(f"calibration_after_steps must be >= 0, got {self.calibration_after_steps!r}")

    @property
    def depths(self) -> Optional[tuple]:
        """EAGLE depths the core picks from (the worker's default ``draft_depths``), or None (always ``num_steps``)."""
        if not self.adaptive_depth:
            return None
        return default_depths(self.num_steps)

    @property
    def host_overlaps(self) -> bool:
        """Whether the host path hides under the device's previous step (``host_overlap``, default by the lags)."""
        return self.width_lag >= 2 if self.host_overlap is None else bool(self.host_overlap)

    @property
    def depth_lag(self) -> int:
        """Steps between choosing a depth and drafting it: the width's lag, and at least 1 (the choice reads the
        survivals of a drafted chain)."""
        return max(1, self.width_lag)

    @property
    def price_at(self) -> str:
        """The price's context (``PRICE_CONTEXTS``): ``price_context``, or by the launch: the tables measured at
        start are blended at each batch's context ("blend"), a user's are at one ("start")."""
        if self.price_context is not None:
            return self.price_context
        return "blend" if self.cost_tables == "measured" else "start"

    @property
    def ngram_eta(self) -> Optional[float]:
        """The n-gram offset's learning rate this engine runs at: ``ngram_bias_eta`` resolved as the worker resolves
        it (``config.resolved_ngram_bias_eta``) for its verify layout (the ideal engine verifies ragged)."""
        from sglang_hybrid.sglang_plugin.config import resolved_ngram_bias_eta

        return resolved_ngram_bias_eta(self.ngram_bias_eta, ragged=self.verify != "padded" or not self.as_built)

    @classmethod
    def ideal(cls, **kw) -> "EngineConfig":
        return cls(as_built=False, width_lag=0, ngram_lag=0, host_time=False, host_overlap=True, **kw)

    @property
    def name(self) -> str:
        return "as built" if self.as_built else "ideal"

    @property
    def max_depth(self) -> int:
        """Deepest draft path (``HybridStep.max_depth``)."""
        return min(self.n_nodes, max(self.num_steps, self.ngram_k))

    @property
    def proposal_width(self) -> int:
        """n-gram tokens proposed and buffered per request (``HybridStep.proposal_width``)."""
        return self.ngram_k + self.max_depth + 1

    def verify_widths(self, mode: str, num_steps: int, n_nodes: int, batch: Optional[int] = None,
                      step_time=None) -> tuple:
        """The padded engine's width buckets for a policy of ``num_steps`` EAGLE steps and ``n_nodes`` nodes: with a
        measured table the worker's own resolution (``HybridSettings.resolved_verify_widths`` on a GPU) trimmed as
        the worker trims it at start, at ``batch`` running requests: the extras that pay by the step-time table
        ``step_time(n)`` (the measurement's stand-in; ``widths.paying_extras``; None: every extra), then those whose
        runtime states fit the replay's H200 deployment (``bench.memory_budget.default_launch_widths``); ``batch``
        None: untrimmed. Else ``buckets``."""
        if self.cost_tables == "measured":
            if batch is not None:
                from bench.memory_budget import default_launch_widths
                from sglang_hybrid.widths import measured_table_buckets, paying_extras

                _, extras = measured_table_buckets(num_steps, n_nodes + 1)
                if step_time is not None:
                    extras = paying_extras(num_steps, n_nodes + 1, extras, step_time, int(batch))
                return default_launch_widths(int(batch), num_steps, self.ngram_k, n_nodes, mode, extras=extras)
            from sglang_hybrid.sglang_plugin.config import HybridSettings

            return HybridSettings(mode=mode, n_nodes=n_nodes).resolved_verify_widths(num_steps, "cuda")
        return self.buckets(n_nodes)

    def buckets(self, n_nodes: Optional[int] = None) -> tuple:
        from sglang_hybrid.widths import check_buckets, default_buckets

        n = self.n_nodes if n_nodes is None else int(n_nodes)
        if self.widths is not None and n == self.n_nodes:
            return check_buckets(list(self.widths), n + 1)
        return default_buckets(n + 1)

    def describe(self) -> str:
        if not self.as_built:
            return ("ideal: ragged verify (price masks nodes, cost = valid nodes), fresh n-gram proposals at the exact "
                    f"position, no host time, the fused step's launches; {self.num_steps} EAGLE steps, "
                    f"n-gram k={self.ngram_k}, "
                    f"n_nodes={self.n_nodes}; {self._depth_text()}{self._alternatives_text()}")
        launches = (f"counted from the worker's {self.decision_kernels} path (bench.step_launches)"
                    if self.launches is None else self.launches)
        return (f"as built: {self._verify_text()}; n-gram proposals {self.ngram_lag} step(s) late, "
                f"{self.proposal_width} tokens wide, aligned by sglang_plugin.alignment.align, first {self.ngram_k} "
                f"used; host path {self._host_text()} "
                f"({host_seconds(4) * 1e3:.3f} ms at B=4, {host_seconds(128) * 1e3:.3f} ms at B=128); decision "
                f"launches {launches}; {self.num_steps} EAGLE steps, n_nodes={self.n_nodes}; {self._depth_text()}"
                f"{self._alternatives_text()}")

    def _alternatives_text(self) -> str:
        if not self.eagle_alternatives:
            return ""
        return (f"; eagle_alternatives={self.eagle_alternatives}: the EAGLE chain with its next "
                f"{self.eagle_alternatives} most likely tokens at each position as leaves (no draft forward beyond the "
                "chain's, the worker's launches for them counted; they compete with the chains' nodes for the "
                "policy's n_nodes, which they do not widen)")

    def _verify_text(self) -> str:
        text = VERIFY_LAYOUTS[self.verify].format(width_lag=self.width_lag, sync_us=self.sync_us)
        if self.verify != "padded":
            return text
        if self.cost_tables == "measured":
            widths = ", ".join(f"{self.verify_widths('merge', self.num_steps, self.n_nodes, b)} at B={b}"
                               for b in (4, 32, 128)) + (
                " by memory, the extras above EAGLE's width only where they pay by the step-time table "
                "(widths.paying_extras)")
        else:
            widths = str(self.verify_widths("merge", self.num_steps, self.n_nodes))
        return (f"{COST_TABLES[self.cost_tables]}; padded verify at width buckets {widths} (for {self.num_steps} EAGLE "
                f"steps, {self.n_nodes} nodes) chosen by DecisionStep: {text}")

    def _host_text(self) -> str:
        if not self.host_time:
            return "not charged"
        return "overlapping the device (step = max)" if self.host_overlaps else "charged (step = device + host)"

    def _depth_text(self) -> str:
        bias = ("; HYBRID's online EAGLE offset off" if self.model_bias_eta is None
                else f"; HYBRID's online EAGLE offset eta={self.model_bias_eta:g}")
        auto = " (ngram_bias_eta=auto)" if self.ngram_bias_eta == "auto" else ""
        bias += (f"; n-gram offset off{auto}" if self.ngram_eta is None
                 else f"; n-gram offset eta={self.ngram_eta:g}{auto}")
        bias += ("; online EAGLE temperature off" if self.model_calibration_eta is None
                 else f"; online EAGLE temperature eta={self.model_calibration_eta:g}")
        if self.depths is None:
            return f"EAGLE depth fixed at {self.num_steps}{bias}"
        return (f"EAGLE depth chosen by DecisionStep among {self.depths}, applied {self.depth_lag} step(s) later "
                f"(adaptive drafting){bias}")


class LateNgram:
    """n-gram proposals as the worker sees them: computed on the host ``lag`` steps ago (at the slot's position
    then; a request admitted fewer than ``lag`` steps ago has the one computed at admission), published into the
    plugin's slot buffers and aligned on the device by ``sglang_plugin.alignment.align`` (the shipped code).

    Positions: a request at output position p has ``P + p`` committed tokens (prompt ``P``), its root at position
    ``P + p - 1`` = the decode ``seq_len``. A proposal computed at position q is the bank's proposal row q, tagged
    ``at = P + q``; the ring holds the committed tokens output[q:p] (the plugin writes them from each verify)."""

    def __init__(self, width: int, k: int, lag: int, context_lookup: bool = True):
        self.width, self.k, self.lag = int(width), int(k), int(lag)
        self.context_lookup = bool(context_lookup)
        self.hist = None
        self.stats = collections.Counter()

    def reset(self, batch: int):
        self.hist = collections.deque(maxlen=self.lag + 1)
        self.prev = None                                   # (req, pos) of the previous step
        self.occ = np.zeros(batch, np.int64)               # occupancy id of each slot (a new one per admission)
        self.first_pos = np.zeros(batch, np.int64)
        self.next_occ = 0
        self.stats = collections.Counter()

    @staticmethod
    def _context_lookup(bank, req: np.ndarray, pos: np.ndarray, prompt_len: np.ndarray, width: int,
                        need: np.ndarray):
        """The device prompt lookup (``context_lookup.lookup``, the shipped code) over each row's committed tokens
        ``prompt + output[:p]``, as the worker's table holds them, for the rows ``need`` (bool ``[B]``); the others
        get an empty proposal (``fill_missing`` does not read them; looking them up would only cost replay time)."""
        import torch

        from sglang_hybrid.sglang_plugin import context_lookup

        b = len(req)
        z = lambda: torch.zeros((b, width), dtype=torch.int64)  # noqa: E731
        out = context_lookup.LookupProposals(torch.full((b, width), -1, dtype=torch.int64),
                                             torch.zeros(b, dtype=torch.int64), z(), z(), z(), z(), z())
        idx = np.nonzero(need)[0]
        if not len(idx):
            return out
        committed = prompt_len[idx] + pos[idx]
        table = np.full((len(idx), int(committed.max()) + 2), -1, np.int32)
        for row, i in enumerate(idx):
            r = bank.requests[int(req[i])]
            table[row, :prompt_len[i]] = r.prompt
            table[row, prompt_len[i]:committed[row]] = r.output[:pos[i]]
        rows = torch.arange(len(idx))
        zeros = torch.zeros_like(rows)
        got = context_lookup.lookup(context_lookup.ContextTable(torch.from_numpy(table), zeros), rows,
                                    torch.from_numpy(committed - 1), zeros, width)
        at = torch.from_numpy(idx)
        for dst, src in zip(out, got):
            dst.index_copy_(0, at, src)
        return out

    def proposal_positions(self, req: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The position each slot's proposal was computed at: ``lag`` steps ago, or at admission if later."""
        b = len(req)
        if self.prev is None:
            new = np.ones(b, bool)
        else:
            new = (req != self.prev[0]) | (pos < self.prev[1])   # a refilled slot restarts at position 0
        self.prev = (req.copy(), pos.copy())
        self.occ = np.where(new, self.next_occ + np.arange(b), self.occ)
        self.next_occ += b
        self.first_pos = np.where(new, pos, self.first_pos)
        self.hist.append((self.occ.copy(), pos.copy()))
        if len(self.hist) <= self.lag:
            return self.first_pos.copy()
        old_occ, old_pos = self.hist[0]
        return np.where(old_occ == self.occ, old_pos, self.first_pos)

    def aligned(self, bank, req: np.ndarray, pos: np.ndarray) -> dict:
        """The n-gram features the worker's selector sees this step (first ``k`` of the aligned proposal)."""
        import torch

        from sglang_hybrid.sglang_plugin import alignment, context_lookup

        q = self.proposal_positions(req, pos)
        d = pos - q
        feats = bank.ngram_features(req, q, self.width)
        b, w = len(req), self.width
        prompt_len = np.array([len(bank.requests[i].prompt) for i in req], np.int64)
        t = lambda x: torch.as_tensor(np.ascontiguousarray(x), dtype=torch.int64)  # noqa: E731
        buf = alignment.alloc_buffers(b, w, max(2 * w, 16), "cpu")
        slots = torch.arange(b, dtype=torch.int64)
        gen = torch.zeros(b, dtype=torch.int64)
        alignment.publish(buf, slots, t(feats["tokens"]), t(feats["lengths"]), t(prompt_len + q), gen,
                          t(feats["match_len"]), t(feats["count"]), t(feats["total"]), t(feats["source"]))
        dmax = int(max(1, d.max(initial=0)))
        committed = bank.targets(req, q, dmax)                     # output[q : q + dmax]
        alignment.ring_write_emitted(buf, slots, t(prompt_len + q - 1), t(committed), t(d))
        al = alignment.align(buf, slots, gen, t(prompt_len + pos - 1))
        k = self.k
        host_len = al.length.clamp(max=k).numpy()
        if self.context_lookup:
            # rows without an aligned proposal take the device prompt lookup's, merged as the worker merges them
            got = self._context_lookup(bank, req, pos, prompt_len, w, (al.length == 0).numpy())
            al, from_lookup = context_lookup.fill_missing(al, got)
            self.stats["steps_from_context"] += int(from_lookup.sum())
        out = {"tokens": al.tokens[:, :k].numpy(), "lengths": al.length.clamp(max=k).numpy(),
               "match_len": al.match_len[:, :k].numpy(), "count": al.count[:, :k].numpy(),
               "total": al.total[:, :k].numpy(), "depth": al.depth[:, :k].numpy(),
               "source": al.source[:, :k].numpy()}
        fresh_len = bank.ngram_features(req, pos, k)["lengths"]     # what a proposal at this position would hold
        fresh = fresh_len > 0
        self.stats["steps_with_match"] += int(fresh.sum())
        self.stats["steps_with_host_aligned"] += int((fresh & (host_len > 0)).sum())
        self.stats["steps_with_aligned"] += int((fresh & (out["lengths"] > 0)).sum())
        self.stats["steps_with_full_chain"] += int((fresh & (out["lengths"] >= np.minimum(fresh_len, k))).sum())
        return out


class EnginePolicy(P.Policy):
    """A core-decided policy (HYBRID merge/choose, or model-only adaptive when ``ngram`` is False) under one engine
    mode. Keeps the engine's state across steps of a run (`reset` is called by `replay_sim.simulate`)."""

    def __init__(self, name: str, mode: str, num_steps: int, n_nodes: int, core, engine: EngineConfig,
                 ngram: bool = True, label: str = ""):
        self.name, self.mode, self.num_steps, self.n_nodes = name, mode, int(num_steps), int(n_nodes)
        self.core, self.engine, self.use_ngram = core, engine, bool(ngram)
        self.needs = ("eagle", "ngram") if ngram else ("eagle",)
        self.label = label or name
        self.last_lambda = 0.0
        self.widths = (engine.verify_widths(mode, num_steps, n_nodes) if engine.as_built and engine.verify == "padded"
                       else None)
        #: "ragged_late": a request's rows before its first choice lands (the padded engine's start width)
        self.start_rows = start_width(engine.buckets(n_nodes), self.num_steps)
        #: adaptive drafting only where the n-gram side competes: HYBRID (model-only adaptive keeps its tuned K)
        self.depths = tuple(d for d in engine.depths if d <= self.num_steps) if (
            ngram and engine.depths is not None) else None
        if self.depths is not None and self.num_steps not in self.depths:
            self.depths = self.depths + (self.num_steps,)
        #: this engine's own model calibration (the core's is shared by every policy): the online temperature
        #: (``model_calibration_eta``, HYBRID only) learns it in place, from the core's at every ``reset``
        self.model_cal = type(core.model_cal)(core.model_cal.temperatures.clone())
        cal_eta = engine.model_calibration_eta if ngram else None
        self.online_temperature = OnlineTemperature(self.model_cal, cal_eta) if cal_eta is not None else None
        self.decide = core.step.DecisionStep(mode=mode, n_nodes=self.n_nodes, model_calibration=self.model_cal,
                                             ngram_calibration=core.ngram_cal if ngram else None,
                                             widths=self.widths, depths=self.depths)
        self._draft_tables: dict = {}
        self.bias_eta = engine.model_bias_eta if ngram else None
        self.ngram_bias_eta = engine.ngram_eta if ngram else None
        self.late = LateNgram(engine.proposal_width, engine.ngram_k, engine.ngram_lag, engine.context_lookup) if (
            ngram and engine.as_built) else None
        self.stats: dict = {}
        self.reset(1)

    @property
    def counts_eager_ops(self) -> bool:
        """Whether `launches` counts eager ATen operators (the torch decision path, the model-only step) rather than
        fused Triton launches: the two are charged at different costs (``bench.replay.host.LaunchCost``)."""
        if self.engine.launches is not None or not self.engine.as_built:
            return False
        return not self.use_ngram or self.engine.decision_kernels == "torch"

    def launches(self) -> int:
        """Kernel launches of this policy's decision per step (``EngineConfig.launches``); eager ATen operators where
        `counts_eager_ops`. Counted at ``LAUNCH_COUNT_BATCH`` requests and charged at every batch size."""
        if self.engine.launches is not None:
            return int(self.engine.launches)
        count, kwargs = self.launch_count()
        return count(**kwargs)

    def launch_count(self) -> tuple:
        """(``bench.step_launches`` function, its keyword arguments) that count this policy's decision launches in
        its configuration as reset (the width and depth plans it has at its batch size)."""
        common = dict(b=LAUNCH_COUNT_BATCH, num_steps=self.num_steps, measured=self.engine.price_at == "blend")
        if not self.engine.as_built:
            # the ideal engine: the worker's fused step, whatever the policy (a fused model-only decision would
            # launch no more kernels than HYBRID's)
            return step_launches.hybrid_launches, dict(common, mode="merge", ngram_k=self.engine.ngram_k,
                                                       width_plan=True, depth_plan=True, kernels="fused",
                                                       alternatives=self.engine.eagle_alternatives)
        if not self.use_ngram:
            return step_launches.model_only_launches, dict(b=LAUNCH_COUNT_BATCH, k=self.num_steps,
                                                           measured=common["measured"])
        return step_launches.hybrid_launches, dict(common, mode=self.mode, ngram_k=self.engine.ngram_k,
                                                   width_plan=self.widths is not None and len(self.widths) > 1,
                                                   depth_plan=self.depths is not None,
                                                   kernels=self.engine.decision_kernels,
                                                   alternatives=self.engine.eagle_alternatives)

    def reset(self, batch: int, cost=None):
        """A fresh engine at ``batch`` requests; ``cost`` (``costs.BatchCost``): the step times the run is charged,
        whose table stands in for the one the default launch measures at start."""
        self.batch = batch
        #: the roofline the run is charged with, and the price's tables built from it ("blend": the two probes', as
        #: ``ContextCostTables``; "batch": one per rounded context)
        self._roof = getattr(cost, "roof", None)
        self._price_tables: dict = {}
        #: the price's context this run (``EngineConfig.price_at``): a run charged with a measured or a user's table
        #: (no roofline to stand in for the probes at other contexts) prices the launch's blend with that table, at
        #: its one context
        self._price_at = self.engine.price_at
        if self._price_at != "start" and cost is not None and self._roof is None:
            if self.engine.price_context is not None:
                raise ValueError(f"price_context={self.engine.price_context!r} prices at the batch's context with "
                                 f"the charge's roofline: use a GPU cost spec (--cost gpu), not a measured or user "
                                 f"table")
            self._price_at = "start"
        if self.widths is not None and self.engine.cost_tables == "measured":
            # the default launch's widths depend on what pays and what fits at this batch
            widths = self.engine.verify_widths(self.mode, self.num_steps, self.n_nodes, batch,
                                               cost.step_time if cost is not None else None)
            if widths != self.widths:
                self.widths = widths
                self.decide = self.decide.with_widths(widths)
        start = start_width(self.widths, self.num_steps) if self.widths is not None else self.n_nodes + 1
        self.pending = collections.deque([start] * max(1, self.engine.width_lag))   # the worker's start plan
        self.depth_pending = collections.deque([self.num_steps] * self.engine.depth_lag)
        self.width_counts = collections.Counter()
        self.depth_counts = collections.Counter()
        #: "ragged_late": (request, position, rows chosen) per step, the last ``width_lag`` steps
        self.rows_chosen = collections.deque(maxlen=max(1, self.engine.width_lag))
        self.ragged = collections.Counter()      # rows laid out and used, ragged layouts
        if self.late is not None:
            self.late.reset(batch)
        self.stats = {}
        #: per batch slot: the request's online model offset, and what the last step drafted (to learn from and to
        #: record the model side's calibration on)
        self.model_bias = self.core.torch.zeros(batch, dtype=self.core.torch.float32)
        self._last_model = None
        if self.online_temperature is not None:
            self.online_temperature.reset()
        #: steps run, and the model side's (acceptance priced, hit) over the tested chain tokens of the steps after
        #: the first ``calibration_after_steps``
        self.steps_run = 0
        self.model_bins = OutcomeBins()
        #: the same for the n-gram side (``ngram_bias_eta``)
        self.ngram_bias = self.core.torch.zeros(batch, dtype=self.core.torch.float32)
        self._last_ngram = None

    def _learn_model(self, view) -> None:
        """From the last model chain's outcome against the tokens committed since (the trace's, ``view.pos - pos_then``
        of them, bonus included): move each continuing request's offset (``model_bias_eta``; a slot holding a new
        request starts at 0), take the online temperature's step (``model_calibration_eta``), and record the tested
        tokens' priced acceptance and outcome once the engine has run ``calibration_after_steps`` steps."""
        if self._last_model is None:
            return
        req0, pos0, draft, acceptance, bias, step = self._last_model
        cont, tested, hit = self._outcome(req0, pos0, draft, view)
        if bias is not None:
            self.model_bias = self.core.torch.where(cont, update_bias(bias, acceptance, tested, hit, self.bias_eta),
                                                    0.0)
        if self.online_temperature is not None:
            self.online_temperature.update(draft.confidence, tested, hit, acceptance)
        if step >= self.engine.calibration_after_steps:
            m = tested.numpy()
            self.model_bins.add(acceptance.numpy()[m], hit.numpy()[m])

    def _learn_ngram_bias(self, view) -> None:
        """`_learn_model_bias` for the n-gram side: each continuing request's n-gram offset moves by how its last
        n-gram chain fared (``ngram_bias_eta``)."""
        if self._last_ngram is not None:
            self.ngram_bias = self._learned(self._last_ngram, view, self.ngram_bias_eta)

    def _learned(self, last: tuple, view, eta: float):
        """The offsets after one ``request_bias.update_bias`` step on ``last`` = (requests, positions, the chain
        drafted, its acceptances, the offsets used) against the trace tokens committed since; 0 for a slot that
        holds a new request."""
        req0, pos0, draft, acceptance, bias = last
        cont, tested, hit = self._outcome(req0, pos0, draft, view)
        return self.core.torch.where(cont, update_bias(bias, acceptance, tested, hit, eta), 0.0)

    def _outcome(self, req0: np.ndarray, pos0: np.ndarray, draft, view) -> tuple:
        """(continuing [B], tested [B, S], hit [B, S]) of a chain drafted at (``req0``, ``pos0``) against the trace
        tokens committed since (``request_bias.chain_outcome``); a slot that holds a new request tested nothing."""
        from sglang_hybrid.request_bias import chain_outcome

        t = self.core.torch
        cont = (np.asarray(view.req) == req0) & (np.asarray(view.pos) > pos0)
        n = t.as_tensor(np.where(cont, np.asarray(view.pos) - pos0, 0), dtype=t.int64)
        committed = t.as_tensor(view.drafts.targets(req0, pos0, max(1, draft.tokens.shape[1])), dtype=t.int64)
        tested, hit = chain_outcome(draft.tokens, draft.length, committed, n)
        return t.as_tensor(cont), tested, hit

    def _price_inputs(self, view) -> tuple:
        """(verify step-time tables, one draft forward's tables or None) the price reads this step: the run's tables
        ("start"); the two probes' (an eighth of the roofline's context and its context, the worker's
        ``startup_costs.profile_contexts``) as the worker's ``ContextCostTables``, blended at the batch's context by
        its own ``follow`` ("blend"); or the roofline's at the batch's mean context rounded to
        ``PRICE_CONTEXT_QUANTUM`` tokens ("batch")."""
        if self._price_at == "start" or view.context is None:
            return view.cost, self._draft_cost(float(view.draft_step_s))
        from sglang_hybrid.cost import ContextCostModel, CostModel

        r = len(view.req)
        ns = np.arange(r, int(view.cost.sizes[-1]) + 1)
        if self._price_at == "blend":
            if "blend" not in self._price_tables:
                from sglang_hybrid.sglang_plugin.startup_costs import SHORT_CONTEXT_FRACTION

                hi = self._roof.context_tokens
                lo = max(1, hi // SHORT_CONTEXT_FRACTION)
                (s_lo, d_lo), (s_hi, d_hi) = self._roofline_at(ns, r, lo), self._roofline_at(ns, r, hi)
                draft = (ContextCostModel([1, 1 << 20], [d_hi] * 2, [d_lo] * 2, lo, hi).to("cpu") if d_hi > 0
                         else None)
                self._price_tables["blend"] = (ContextCostModel(ns, s_hi, s_lo, lo, hi).to("cpu"), draft)
            tables, draft = self._price_tables["blend"]
            context = self.core.torch.as_tensor(np.asarray(view.context), dtype=self.core.torch.int64)
            for t in (tables, draft):
                if t is not None:
                    t.follow(context)
            return tables, draft
        q = PRICE_CONTEXT_QUANTUM
        ctx = max(q, int(round(float(np.mean(view.context)) / q)) * q)
        if ctx not in self._price_tables:
            seconds, draft = self._roofline_at(ns, r, ctx)
            self._price_tables[ctx] = (CostModel(ns, seconds).to("cpu"), self._draft_cost(float(draft)))
        return self._price_tables[ctx]

    def _roofline_at(self, ns: np.ndarray, r: int, ctx: int) -> tuple:
        """The charge's roofline at ``ctx`` tokens a request for ``r`` requests: (``T(n)`` for ``ns``, one draft
        forward), cached per context."""
        key = ("roof", ctx)
        if key not in self._price_tables:
            self._price_tables[key] = (np.array([self._roof.target_step_s(int(n), r, r * ctx) for n in ns]),
                                       self._roof.draft_step_s(r, r * ctx))
        return self._price_tables[key]

    def _draft_cost(self, seconds: float):
        """One EAGLE draft forward at this batch size as the core's cost tables (constant in the batch: the replay
        runs one batch size at a time)."""
        if seconds not in self._draft_tables:
            from sglang_hybrid.cost import CostModel

            self._draft_tables[seconds] = CostModel([1, 1 << 20], [seconds, seconds]).to("cpu") if seconds > 0 \
                else None
        return self._draft_tables[seconds]

    def _lay_out_ragged(self, prop, rows: np.ndarray, view) -> None:
        """Charge ``prop`` (this step's ragged selection, ``rows`` = root + kept nodes per request) as the engine's
        ragged layout runs it (``VERIFY_LAYOUTS``): a blocking read, or each request capped by its own choice
        ``width_lag`` steps before (the rows past a request's cap dropped: nodes are in rank order, so what is left
        is prefix-closed, as ``widths.truncate`` keeps it)."""
        req, pos = np.asarray(view.req), np.asarray(view.pos)
        if self.engine.verify == "ragged_sync":
            laid_out = rows
            prop.stall_s = self.engine.sync_us * 1e-6
        else:
            if self.engine.width_lag == 0:      # a what-if: the choice lands in its own step
                laid_out = rows
            elif len(self.rows_chosen) < self.rows_chosen.maxlen:
                laid_out = np.full(len(req), self.start_rows, np.int64)
            else:
                req0, pos0, rows0 = self.rows_chosen[0]
                same = (req0 == req) & (pos0 < pos)          # the slot still holds the request that chose them
                laid_out = np.where(same, rows0, self.start_rows)
            self.rows_chosen.append((req.copy(), pos.copy(), rows.copy()))
            keep = np.arange(prop.tokens.shape[1])[None, :] < (laid_out - 1)[:, None]
            prop.tokens = np.where(keep, prop.tokens, -1)
            prop.parents = np.where(keep, prop.parents, -1)
        used = np.minimum(rows, laid_out)
        prop.verify_tokens = token_tier(int(laid_out.sum()))
        self.ragged["steps"] += 1
        self.ragged["verified"] += int(prop.verify_tokens)
        self.ragged["laid_out"] += int(laid_out.sum())
        self.ragged["used"] += int(used.sum())

    def propose(self, view):
        c = self.core
        depth = self.depth_pending.popleft() if self.depths is not None else self.num_steps
        self.depth_counts[depth] += 1
        etoks, eprobs = view.drafts.eagle(view.req, view.pos, depth)
        alternatives = None
        if self.engine.eagle_alternatives:
            alternatives = P.eagle_alternatives(view, depth, self.engine.eagle_alternatives)
        cost, draft_cost = self._price_inputs(view)
        draft_cost = draft_cost if self.depths is not None else None
        ngram = None
        if self.use_ngram:
            if self.late is not None:
                ng = self.late.aligned(view.drafts, view.req, view.pos)
            else:
                ng = view.drafts.ngram_features(view.req, view.pos, self.engine.ngram_k)
            ngram = c.ngram_draft(ng, False)
        root = c.torch.as_tensor(view.root)
        model = c.model_draft(etoks, eprobs, alternatives)
        b = len(view.req)
        bias = ngram_bias = None
        self._learn_model(view)
        if self.bias_eta is not None:
            bias = self.model_bias
        if self.ngram_bias_eta is not None and ngram is not None:
            self._learn_ngram_bias(view)
            ngram_bias = self.ngram_bias
        if self.widths is None:
            d = self.decide(root, model, ngram, cost=cost, check_values=False, draft_cost=draft_cost,
                            model_bias=bias, ngram_bias=ngram_bias)
            prop = P._tree_to_proposal(d.tree, P.draft_forwards(depth))
            if self.engine.as_built:
                self._lay_out_ragged(prop, d.tree.valid.sum(1).numpy(), view)
        else:
            width = self.pending.popleft() if self.engine.width_lag > 0 else None
            if width is None:   # lag 0 (a what-if): decide at full width, verify the chosen bucket this step
                full = self.decide(root, model, ngram, cost=cost, check_values=False, draft_cost=draft_cost,
                                   model_bias=bias, ngram_bias=ngram_bias)
                width = int(full.next_width)
            d = self.decide(root, model, ngram, cost=cost, check_values=False, width=width,
                            draft_cost=draft_cost, model_bias=bias, ngram_bias=ngram_bias)
            if self.engine.width_lag > 0:
                self.pending.append(int(d.next_width))
            self.width_counts[width] += 1
            prop = P._tree_to_proposal(d.tree, P.draft_forwards(depth))
            prop.verify_tokens = b * width
        if self.engine.host_time and self.use_ngram:
            prop.host_s = host_seconds(b)
        # the host work (n-gram path, the decision's dispatch) overlaps the device as the engine's scheduling allows
        prop.host_overlaps = self.engine.host_overlaps
        if self.counts_eager_ops:
            prop.eager_ops = self.launches()
        else:
            prop.launches = self.launches()
        if self.depths is not None:
            self.depth_pending.append(int(d.next_depth))
        self._last_model = (np.array(view.req), np.array(view.pos), model, d.model_acceptance, bias, self.steps_run)
        self.steps_run += 1
        if ngram_bias is not None:
            self._last_ngram = (np.array(view.req), np.array(view.pos), ngram, d.ngram_acceptance, ngram_bias)
        self.last_lambda = float(d.lam)
        st = dict(self.late.stats) if self.late is not None else {}
        st["width_counts"] = dict(self.width_counts)
        if self.ragged:
            st["ragged_rows"] = dict(self.ragged)
        st["depth_counts"] = dict(self.depth_counts)
        # the model side's calibration after the engine's first calibration_after_steps steps (None before), and
        # where the online temperature stands (the drafted depths')
        st["model_ece"] = self.model_bins.ece
        st["model_ece_tokens"] = self.model_bins.count
        # the bins' sums, so runs pool exactly (ECE = sum over bins of |predicted - hit| / tokens)
        st["model_calibration"] = {"pred": self.model_bins.pred.tolist(), "label": self.model_bins.label.tolist(),
                                   "count": self.model_bins.count}
        st["model_temperatures"] = ([round(float(x), 4) for x in self.model_cal.temperatures[:self.num_steps]]
                                    if self.online_temperature is not None else None)
        self.stats = st
        return prop


def engine_policies(core, engine: EngineConfig, model_ks=(2, 4, 6, 8), hybrid_modes=("merge",),
                    hybrid_steps=(), ngram_ks=()) -> list:
    """HYBRID (deployed configuration) and model-only adaptive at each K in ``model_ks``, under ``engine``.
    ``hybrid_steps`` and ``ngram_ks``: further EAGLE step counts (``--speculative-num-steps``) and n-gram chain
    lengths (the worker's setting ``ngram_k``) for HYBRID, launch settings a deployment tunes like a baseline's k; every
    combination is a policy, named ``hybrid_<mode>[_s<steps>][_k<ngram_k>]`` (the deployed values keep the plain
    name). Each has the node budget the worker resolves for it (``HybridSettings.resolved_n_nodes``: steps + ngram_k
    in merge mode) and the width buckets and n-gram proposal width that follow from it."""
    from sglang_hybrid.sglang_plugin.config import MAX_NODES, HybridSettings

    out = []
    for mode in hybrid_modes:
        for steps in (engine.num_steps, *[s for s in hybrid_steps if s != engine.num_steps]):
            for k in (engine.ngram_k, *[k for k in ngram_ks if k != engine.ngram_k]):
                n_nodes = HybridSettings(mode=mode, ngram_k=k).resolved_n_nodes(steps)
                if engine.as_built:
                    # the worker's limit: a launch whose default is above it sets n_nodes to it, as its start-up
                    # error says (server_args), and the price keeps the best nodes
                    n_nodes = min(n_nodes, MAX_NODES)
                eng = engine if k == engine.ngram_k else dataclasses.replace(engine, ngram_k=k, n_nodes=n_nodes)
                name = (f"hybrid_{mode}" + (f"_s{steps}" if steps != engine.num_steps else "")
                        + (f"_k{k}" if k != engine.ngram_k else ""))
                out.append(EnginePolicy(name, mode, steps, n_nodes, core, eng,
                                        label=f"HYBRID {mode} ({steps} EAGLE steps + n-gram k={k}, {n_nodes} nodes, "
                                              f"{engine.name})"))
    for k in model_ks:
        out.append(EnginePolicy(f"model_adaptive_k{k}", "choose", k, k, core, engine, ngram=False,
                                label=f"model-only adaptive K={k} ({engine.name})"))
    return out
