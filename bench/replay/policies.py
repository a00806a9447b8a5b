"""The speculation policies the replay benchmark compares, one small class each.

Why classes over one big switch: each policy states in one place what it drafts, how much it verifies and which
drafting cost it pays, so the replay loop (bench/replay/sim.py) stays policy-agnostic and a reader can check each rule
against its description. Every policy sees the same `StepView` (which requests are active, at which output position,
the precomputed drafts of every drafter at that position) and returns a `Proposal`: the draft nodes to verify as a
tree (chains are trees whose node j has parent j - 1), plus the number of EAGLE draft forwards it ran this step.

The two HYBRID policies and the model-only adaptive baseline call the project's real core code (calibration,
survival, price, selector from `sglang_hybrid`); nothing here re-implements the goodput maths.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from bench.replay.host import host_seconds, prompt_lookup_seconds, suffix_seconds
from sglang_hybrid.selector import Source


@dataclasses.dataclass
class Proposal:
    """Draft nodes to verify, per request.

    tokens  int64 [B, N]: node token, -1 = no node (valid nodes form a prefix of each row)
    parents int64 [B, N]: parent node index in the same row, -1 = child of the last committed token; parents[i] < i
    model_steps: EAGLE draft forwards run this step for the whole batch (charged by the cost model)
    source  int8 [B, N] or None: `Source` values (model, n-gram, shared; for the per-source shares in the report)
    verify_tokens: tokens the verify forward runs for the whole batch; None = ragged verify, every request its root
      plus its valid nodes (the ideal engine). An engine that pads every request to a width W sets B * W.
    host_s: host seconds the step adds that the cost table does not hold (e.g. the n-gram drafter's host path)
    host_overlaps: the host time runs while the device executes the previous step (overlap scheduling), so the step
      takes max(device time, host_s) instead of their sum
    launches: kernel launches the policy's own per-step engine work dispatches eagerly between the draft and the
      verify forward (beyond the engine's fixed per-step work the cost table holds); each costs the cost model's GPU
      time per launch on the device and its host dispatch time on the host (``bench.replay.host.LaunchCost``)
    eager_ops: eager ATen operators of the same work where it runs unfused (the decision's torch path, the model-only
      step's), charged per operator (``LaunchCost.op_host_us``, ``op_gpu_us``)
    stall_s: seconds the device idles inside the step while the host waits on it (a blocking device-to-host read
      between the decision and the verify): added to the step, overlapped with nothing
    draft_topk: sequences each EAGLE draft forward after the first runs per request: SGLang's
      ``--speculative-eagle-topk`` (1 for chains); a tree's later forwards run ``topk`` beams per request, each reading
      the request's KV
    """

    tokens: np.ndarray
    parents: np.ndarray
    model_steps: int = 0
    source: Optional[np.ndarray] = None
    verify_tokens: Optional[int] = None
    host_s: float = 0.0
    host_overlaps: bool = False
    launches: int = 0
    eager_ops: int = 0
    stall_s: float = 0.0
    draft_topk: int = 1


def draft_forwards(k: int) -> int:
    """EAGLE draft-model forwards a step runs for a k-token chain, as SGLang 0.5.23 runs them: the draft-extend over
    the tokens accepted by the previous verify (it yields the first draft token's distribution) plus k - 1 draft
    decode forwards (``eagle_worker_v2.draft_forward`` runs a forward for steps i < num_steps - 1 only): k in all,
    charged at the cost table's draft-step cost. 0 for k = 0 (no model draft)."""
    return max(0, int(k))


@dataclasses.dataclass
class StepView:
    """What a policy may look at in one decode step (all arrays have one row per active request).

    root: last committed token per request (int64 [B]); drafts: the bank of precomputed drafts, queried with
    (req, pos); cost: the core `CostTables` for this batch size (price input); requests: active request count;
    draft_step_s: the cost model's seconds per EAGLE draft forward; context: each request's committed tokens (prompt +
    output so far; the replay's simulation always sets it, a hand-built view may leave it None).
    """

    req: np.ndarray
    pos: np.ndarray
    root: np.ndarray
    drafts: "object"
    cost: "object"
    requests: int
    draft_step_s: float = 0.0      # one EAGLE draft forward at this batch size (the adaptive-depth price input)
    context: Optional[np.ndarray] = None


def chain_parents_np(b: int, k: int) -> np.ndarray:
    """Parents of a chain in tree layout (node j -> j - 1, node 0 -> root)."""
    return np.broadcast_to(np.arange(k, dtype=np.int64) - 1, (b, k)).copy()


def mask_chain(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Chain tokens with everything at or past each row's length set to -1."""
    tokens = np.asarray(tokens, dtype=np.int64).copy()
    tokens[np.arange(tokens.shape[1])[None, :] >= np.asarray(lengths)[:, None]] = -1
    return tokens


class Policy:
    """Base class: `name` (key in tables), `label` (human text), `needs` (draft kinds it reads from the bank)."""

    name = "base"
    label = "base"
    needs: tuple = ()
    #: whether it reads the drafts' probabilities: one that does not runs the same on a bank whose probabilities
    #: alone differ (a miscalibrated head's: `Runner.token_twins` shares its runs)
    reads_confidence: bool = True

    def propose(self, view: StepView) -> Proposal:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        return self.label


class NoSpeculation(Policy):
    """Plain decoding: one token per request per step, nothing drafted."""

    reads_confidence = False
    name = "no_spec"
    label = "no speculation"

    def propose(self, view):
        b = len(view.req)
        return Proposal(np.full((b, 0), -1, np.int64), np.full((b, 0), -1, np.int64), 0)


class EagleFixed(Policy):
    """EAGLE chain of fixed length k, always verified in full (SGLang's EAGLE with topk=1)."""

    reads_confidence = False
    name = "eagle_fixed"
    needs = ("eagle",)

    def __init__(self, k: int):
        self.k = int(k)
        self.label = f"EAGLE chain, fixed k={self.k}"

    def propose(self, view):
        toks, _ = view.drafts.eagle(view.req, view.pos, self.k)
        return Proposal(toks, chain_parents_np(len(view.req), self.k), draft_forwards(self.k),
                        np.zeros(toks.shape, np.int8))


def simulated_trees(view, what: str):
    """The simulated drafter's EAGLE trees (``synth.SimulatedEagleTrees``) behind ``view``'s drafts; a recorded trace
    has none (it holds the head's chain and at most each position's next tokens, not the head's deeper branches), so
    ``what`` needs the simulated drafter: ``DrafterUnavailable``."""
    trees = getattr(view.drafts, "eagle_trees", None)
    if trees is None:
        from bench.replay.drafts import DrafterUnavailable

        raise DrafterUnavailable(f"{what} need the simulated drafter: a recorded trace holds the head's chain "
                                 "(and at most its alternatives), not its trees")
    return trees


def eagle_alternatives(view, depth: int, m: int) -> tuple:
    """Each chain position's next ``m`` EAGLE tokens behind ``view``'s drafts (``ModelDraft.alt_tokens``, the worker's
    setting ``eagle_alternatives``): the simulated head's, or a recorded trace's when it holds them
    (``drafts.RecordedAlternatives``); else ``DrafterUnavailable``."""
    alt = getattr(view.drafts, "eagle_alt", None)
    if alt is None:
        from bench.replay.drafts import DrafterUnavailable

        raise DrafterUnavailable("EAGLE alternatives need the simulated drafter or a trace recorded with them "
                                 "(python -m bench.replay --make-trace FILE --trace-alternatives M)")
    return alt.alternatives(view.req, view.pos, depth, m)


class EagleTree(Policy):
    """SGLang's EAGLE with ``--speculative-eagle-topk`` > 1: a tree of ``num_draft_tokens - 1`` nodes grown in
    ``steps`` draft forwards, ``topk`` children per beam, the best-scored nodes verified, every request the same size
    (bench/replay/synth.py, `SimulatedEagleTrees`). Its draft forwards after the first run ``topk`` beams per request.
    Only a simulated drafter has trees: a recorded trace holds the head's chain."""

    reads_confidence = False
    name = "eagle_tree"
    needs = ("eagle_tree",)

    def __init__(self, steps: int, topk: int, num_draft_tokens: int):
        self.steps, self.topk, self.num_draft_tokens = int(steps), int(topk), int(num_draft_tokens)
        self.name = f"eagle_tree_s{self.steps}_t{self.topk}_n{self.num_draft_tokens}"
        self.label = (f"EAGLE tree (steps={self.steps}, topk={self.topk}, "
                      f"num_draft_tokens={self.num_draft_tokens})")

    def propose(self, view):
        toks, pars = simulated_trees(view, "EAGLE trees").rows(view.req, view.pos, self.steps, self.topk,
                                                               self.num_draft_tokens)
        return Proposal(toks, pars, draft_forwards(self.steps), np.zeros(toks.shape, np.int8),
                        draft_topk=self.topk)


class _ChainDrafter(Policy):
    """Any model-free chain drafter verified in full (up to k tokens, nothing when it has no match)."""

    reads_confidence = False
    kind = ""

    #: the drafter's measured host seconds for one step over requests of these context lengths
    #: (``bench.replay.host``), paid after the step as vLLM runs its proposers (not overlapped); None: not charged
    context_cost: Optional[Callable] = None

    def __init__(self, k: int):
        self.k = int(k)

    def host(self, view) -> tuple:
        """(host seconds of this step's drafting, whether they overlap the device): ``context_cost`` at each
        request's context."""
        if self.context_cost is None:
            return 0.0, False
        if view.context is None:
            raise ValueError(f"{self.name}: its host cost needs each request's context (StepView.context)")
        return self.context_cost(view.context), False

    def propose(self, view):
        toks, lens = view.drafts.chain(self.kind, view.req, view.pos, self.k)
        toks = mask_chain(toks, lens)
        host_s, overlaps = self.host(view)
        return Proposal(toks, chain_parents_np(len(view.req), toks.shape[1]), 0, np.ones(toks.shape, np.int8),
                        host_s=host_s, host_overlaps=overlaps)


class NgramOurs(_ChainDrafter):
    """Our suffix-automaton n-gram drafter (sglang_hybrid.ngram.NgramDrafter), chain of up to k, verified in full."""

    name = "ngram_ours"
    kind = "ngram"
    needs = ("ngram",)

    def __init__(self, k):
        super().__init__(k)
        self.label = f"n-gram only, ours (suffix automaton, k={self.k})"

    def host(self, view):
        """The worker's measured n-gram host path, hidden under the device step as HYBRID's is (bench.replay.host)."""
        return host_seconds(len(view.req)), True


class PromptLookup(_ChainDrafter):
    """vLLM-style prompt lookup: longest suffix n-gram with min_n <= n <= max_n, copy k tokens after its earliest
    occurrence (vLLM's own proposer when bench/anchors.py provides it, else our rendering of that rule)."""

    name = "vllm_ngram"
    kind = "pld"
    needs = ("pld",)
    context_cost = staticmethod(prompt_lookup_seconds)      # vLLM's CPU scan per request

    def __init__(self, k, min_n=2, max_n=5, name=None):
        super().__init__(k)
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.kind = f"pld-{self.min_n}-{self.max_n}"
        self.needs = (self.kind,)
        if name:
            self.name = name
        self.label = f"vLLM-style prompt lookup (min_n={self.min_n}, max_n={self.max_n}, k={self.k})"


class SuffixDecoding(_ChainDrafter):
    """Arctic Inference's SuffixDecodingCache (suffix decoding), chain mode as vLLM uses it, verified in full."""

    name = "suffix"
    kind = "suffix"
    needs = ("suffix",)
    context_cost = staticmethod(suffix_seconds)             # Arctic's CPU cost per request

    def __init__(self, k):
        super().__init__(k)
        self.label = f"suffix decoding (Arctic SuffixDecodingCache, chain, k<={self.k})"


class NgramElseEagle(Policy):
    """vLLM's ngram-eagle rule: the n-gram chain when the drafter has one, else the EAGLE chain of fixed length.

    EAGLE drafting is charged only on steps where at least one request of the batch falls back to it; the n-gram
    drafter's host path every step, as our n-gram drafter alone pays it.
    """

    reads_confidence = False
    name = "ngram_else_eagle"
    needs = ("ngram", "eagle")

    def __init__(self, k_ngram: int, k_eagle: int):
        self.k_ngram, self.k_eagle = int(k_ngram), int(k_eagle)
        self.label = f"n-gram if any, else EAGLE (k={self.k_ngram} / {self.k_eagle})"

    def propose(self, view):
        b = len(view.req)
        ntoks, nlens = view.drafts.chain("ngram", view.req, view.pos, self.k_ngram)
        etoks, _ = view.drafts.eagle(view.req, view.pos, self.k_eagle)
        width = max(self.k_ngram, self.k_eagle)
        toks = np.full((b, width), -1, np.int64)
        src = np.full((b, width), -1, np.int8)
        use_ng = nlens > 0
        toks[use_ng, : self.k_ngram] = mask_chain(ntoks, nlens)[use_ng]
        src[use_ng, : self.k_ngram] = Source.NGRAM
        toks[~use_ng, : self.k_eagle] = etoks[~use_ng]
        src[~use_ng, : self.k_eagle] = Source.MODEL
        steps = draft_forwards(self.k_eagle) if (~use_ng).any() else 0
        # our n-gram drafter's host path, overlapping the device as HYBRID's does (bench.replay.host)
        return Proposal(toks, chain_parents_np(b, width), steps, src, host_s=host_seconds(b), host_overlaps=True)


def accepted_prefix(tokens: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row, how many leading chain tokens equal the targets (-1 tokens never do)."""
    hit = (tokens >= 0) & (tokens == targets[:, : tokens.shape[1]])
    return np.cumprod(hit, axis=1).sum(axis=1)


class Oracle(Policy):
    """The limit of any selector over the two drafters: it knows in advance how many tokens each drafter's proposal
    would get accepted, takes per request the drafter with more (the n-gram one on a tie: it costs no draft forward),
    drafts only what gets accepted and verifies exactly that plus the bonus (ragged, no wasted slot).

    The EAGLE draft runs as deep as the deepest accepted EAGLE prefix it takes this step (none when it takes none);
    the n-gram drafter's host path is paid as HYBRID's is (overlapping the device). No decision launches: the oracle
    decides nothing on the device.

    ``eagle_only``: the same foreknowledge over the EAGLE chain alone (no n-gram drafter, no host path): what
    knowing the accepted length is worth without any choice, so that the oracle's lead splits into foreknowledge,
    which no policy has that verifies to find out, and the choice between drafters, which a selector can learn."""

    reads_confidence = False
    needs = ("eagle", "ngram")

    def __init__(self, k_eagle: int, k_ngram: int, eagle_only: bool = False):
        self.k_eagle, self.k_ngram, self.eagle_only = int(k_eagle), int(k_ngram), bool(eagle_only)
        if self.eagle_only:
            self.name, self.needs = "oracle_eagle", ("eagle",)
            self.label = f"EAGLE with foreknowledge (knows its accepted length; EAGLE <= {self.k_eagle})"
        else:
            self.name = "oracle"
            self.label = (f"oracle (knows each drafter's accepted length; EAGLE <= {self.k_eagle}, "
                          f"n-gram <= {self.k_ngram})")

    def propose(self, view):
        b = len(view.req)
        width = self.k_eagle if self.eagle_only else max(self.k_eagle, self.k_ngram)
        targets = view.drafts.targets(view.req, view.pos, width)
        etoks, _ = view.drafts.eagle(view.req, view.pos, self.k_eagle)
        acc_e = accepted_prefix(etoks, targets)
        if self.eagle_only:
            ntoks, acc_n = np.full((b, width), -1, np.int64), np.full(b, -1)
        else:
            ntoks, nlens = view.drafts.chain("ngram", view.req, view.pos, self.k_ngram)
            ntoks = mask_chain(ntoks, nlens)
            acc_n = accepted_prefix(ntoks, targets)
        use_e = acc_e > acc_n
        acc = np.where(use_e, acc_e, acc_n)
        toks = np.full((b, width), -1, np.int64)
        toks[:, : self.k_eagle][use_e] = etoks[use_e]
        toks[:, : ntoks.shape[1]][~use_e] = ntoks[~use_e]
        toks[np.arange(width)[None, :] >= acc[:, None]] = -1
        src = np.where(use_e[:, None], np.int8(Source.MODEL), np.int8(Source.NGRAM)).repeat(width, axis=1)
        depth = int(acc_e[use_e].max(initial=0))
        return Proposal(toks, chain_parents_np(b, width), draft_forwards(depth), src,
                        host_s=0.0 if self.eagle_only else host_seconds(b), host_overlaps=True)


class _Core:
    """The project's core decision step (``sglang_hybrid.step.DecisionStep``, the one the SGLang worker and the
    reference loop call), fed from the replay's numpy drafts; imported lazily so the fixed policies work without it."""

    def __init__(self, model_calibration=None, ngram_calibration=None, ngram_logit_shift: float = 0.0):
        import torch

        from sglang_hybrid import calibration, step

        self.torch, self.step = torch, step
        self._calibration, self._ngram_path, self._ngram_cal = calibration, ngram_calibration, None
        #: a what-if, not a setting of the worker: every cell of the n-gram table moved by this much on the logit
        #: (``shift_logit``), to ask what a table fit closer to the workload would buy
        self.ngram_logit_shift = float(ngram_logit_shift)
        self._checked_steps = 0
        if model_calibration is None:
            self.model_cal = calibration.ModelCalibration.identity().to("cpu")
            self.model_cal_name = "identity (raw draft probability)"
        else:
            self.model_cal = calibration.ModelCalibration.load(model_calibration).to("cpu")
            self.model_cal_name = str(model_calibration)

    def checks(self) -> bool:
        """Value checks (NaN, ranges, parents) on the first steps only: they cost as much as the decision itself on
        CPU, and the trace's values were validated when it was read."""
        self._checked_steps += 1
        return self._checked_steps <= 20

    @property
    def ngram_cal(self):
        """Loaded on first use: model-only policies do not need the n-gram calibration file."""
        if self._ngram_cal is None:
            cal = self._calibration.NgramCalibration.load(self._ngram_path)
            self._ngram_cal = shift_logit(cal, self.ngram_logit_shift).to("cpu")
        return self._ngram_cal

    @property
    def ngram_cal_name(self) -> str:
        """Which n-gram table the decisions price with, for the run's log."""
        name = str(self._ngram_path) if self._ngram_path else "the shipped NgramCalibration"
        if self.ngram_logit_shift:
            name += f", every cell's logit moved by {self.ngram_logit_shift:+g} (a what-if, --ngram-logit-shift)"
        return name

    def model_draft(self, tokens: np.ndarray, probs: np.ndarray, alternatives: Optional[tuple] = None):
        """The EAGLE chain as the core's ``ModelDraft`` (a chain ends at its first -1 token); ``alternatives``:
        (tokens [B, S, M], probs [B, S, M]), each position's next-best tokens (``ModelDraft.alt_tokens``)."""
        t = self.torch
        lengths = t.as_tensor((np.cumsum(np.asarray(tokens) < 0, axis=1) == 0).sum(axis=1), dtype=t.int64)
        alt = (None, None) if alternatives is None else (t.as_tensor(alternatives[0], dtype=t.int64),
                                                          t.as_tensor(alternatives[1], dtype=t.float32))
        return self.step.ModelDraft(t.as_tensor(tokens), t.as_tensor(probs, dtype=t.float32), lengths, *alt)

    def ngram_draft(self, d: dict, tree: bool):
        """The n-gram proposal (chain or tree) with its features as the core's ``NgramDraft``."""
        t = self.torch
        f = {k: t.as_tensor(np.ascontiguousarray(d[k]), dtype=t.int64)
             for k in ("tokens", "match_len", "count", "total", "depth", "source")}
        lengths = t.as_tensor(d["lengths"], dtype=t.int64)
        b, k = f["tokens"].shape
        parents = (t.as_tensor(np.ascontiguousarray(d["parents"]), dtype=t.int64) if tree
                   else t.arange(-1, k - 1, dtype=t.int64).expand(b, k))
        return self.step.NgramDraft(f["tokens"], parents, lengths, f["match_len"], f["count"], f["total"],
                                    f["depth"], f["source"], tree=tree)

    def decide(self, root, mode: str, n_nodes: int, cost, model=None, ngram=None):
        """One decode step of the core for the batch (``step.DecisionStep``)."""
        decide = self.step.DecisionStep(mode=mode, n_nodes=n_nodes, model_calibration=self.model_cal,
                                        ngram_calibration=self.ngram_cal if ngram is not None else None)
        return decide(self.torch.as_tensor(root), model, ngram, cost=cost, check_values=self.checks())


def shift_logit(cal, shift: float):
    """``cal`` (an ``NgramCalibration``) with every acceptance ``a`` replaced by ``sigmoid(logit(a) + shift)``
    (``a`` clamped into ``[1e-6, 1 - 1e-6]`` first; ``shift = 0`` returns ``cal`` itself). Why: the shipped table is
    fit on general text and is under-confident on code editing (docs/calibration_check.md: it expects 2.04 accepted
    drafts per step where 2.38 are realised); a uniform logit shift is the simplest stand-in for a table fit closer to
    a workload, to measure what the replay's engines would gain from one. It is not a fit, and the worker has no such
    setting: a deployment refits (``python -m sglang_hybrid.tools.calibrate``) and passes ``ngram_calibration``."""
    if not shift:
        return cal
    a = np.clip(cal.table, 1e-6, 1.0 - 1e-6)
    table = 1.0 / (1.0 + np.exp(-(np.log(a / (1.0 - a)) + float(shift))))
    return dataclasses.replace(cal, table=table, fit_params={**cal.fit_params, "replay_logit_shift": float(shift)})


def _tree_to_proposal(tree, model_steps: int) -> Proposal:
    """VerifyTree (node 0 = root) -> Proposal over draft nodes 1.. (parents shifted so the root becomes -1)."""
    toks = tree.tokens[:, 1:].numpy().astype(np.int64)
    par = tree.parents[:, 1:].numpy().astype(np.int64) - 1
    valid = tree.valid[:, 1:].numpy()
    toks = np.where(valid, toks, -1)
    par = np.where(valid, par, -1)
    return Proposal(toks, par, model_steps, tree.source[:, 1:].numpy().astype(np.int8))


class ModelOnlyAdaptive(Policy):
    """DSpark-style adaptive verification over the model drafter alone (the paper's baseline).

    The EAGLE chain of K tokens is drafted every step; the batch-wide goodput budget and price come from the core's
    `price_device` over the model survivals only, and the core selector keeps each request's chain prefix whose
    survival is at least the price.
    """

    name = "model_adaptive"
    needs = ("eagle",)

    def __init__(self, k: int, core: _Core):
        self.k, self.core = int(k), core
        self.label = f"model-only adaptive (DSpark-style budget over EAGLE survivals, K={self.k})"
        self.last_lambda = 0.0

    def propose(self, view):
        c = self.core
        etoks, eprobs = view.drafts.eagle(view.req, view.pos, self.k)
        d = c.decide(view.root, "choose", self.k, view.cost, model=c.model_draft(etoks, eprobs))
        self.last_lambda = float(d.lam)
        return _tree_to_proposal(d.tree, draft_forwards(self.k))


class Hybrid(Policy):
    """HYBRID: EAGLE chain + our n-gram chain (or tree), calibrated survivals, goodput price over both, and the core
    selector in `choose` (the published per-request rule) or `merge` (both as branches of one tree) mode."""

    needs = ("eagle", "ngram")

    def __init__(self, mode: str, k: int, n_nodes: int, core: _Core, ngram_tree: bool = False):
        if mode not in ("choose", "merge"):
            raise ValueError(f"Hybrid mode must be 'choose' or 'merge', got {mode!r}")
        self.mode, self.k, self.n_nodes, self.core, self.tree = mode, int(k), int(n_nodes), core, ngram_tree
        self.name = f"hybrid_{mode}"
        self.needs = ("eagle", "ngram_tree" if ngram_tree else "ngram")
        self.label = (f"HYBRID {mode} (EAGLE K={self.k} + n-gram {'tree' if ngram_tree else 'chain'}, "
                      f"node budget {self.n_nodes})")
        self.last_lambda = 0.0

    def propose(self, view):
        c = self.core
        etoks, eprobs = view.drafts.eagle(view.req, view.pos, self.k)
        ng = view.drafts.ngram_features(view.req, view.pos, self.k, tree=self.tree)
        d = c.decide(view.root, self.mode, self.n_nodes, view.cost, model=c.model_draft(etoks, eprobs),
                     ngram=c.ngram_draft(ng, self.tree))
        self.last_lambda = float(d.lam)
        return _tree_to_proposal(d.tree, draft_forwards(self.k))


def build_policies(names, k: int, eagle_k: int, merge_nodes: int, core_factory: Callable[[], _Core],
                   ngram_tree: bool = False, pld_min_n: int = 2, pld_max_n: int = 5) -> list:
    """Instantiate the named policies (core objects are created once, on first need)."""
    core = None

    def get_core():
        nonlocal core
        if core is None:
            core = core_factory()
        return core

    out = []
    for n in names:
        if n == "no_spec":
            out.append(NoSpeculation())
        elif n == "eagle_fixed":
            out.append(EagleFixed(eagle_k))
        elif n == "model_adaptive":
            out.append(ModelOnlyAdaptive(k, get_core()))
        elif n == "ngram_ours":
            out.append(NgramOurs(k))
        elif n == "vllm_ngram":
            out.append(PromptLookup(k, pld_min_n, pld_max_n))
        elif n == "suffix":
            out.append(SuffixDecoding(k))
        elif n == "ngram_else_eagle":
            out.append(NgramElseEagle(k, eagle_k))
        elif n == "hybrid_choose":
            out.append(Hybrid("choose", k, k, get_core(), ngram_tree))
        elif n == "hybrid_merge":
            out.append(Hybrid("merge", k, merge_nodes, get_core(), ngram_tree))
        else:
            raise ValueError(f"unknown policy {n!r}; known: {', '.join(ALL_POLICIES)}")
    return out


ALL_POLICIES = ("no_spec", "eagle_fixed", "model_adaptive", "ngram_ours", "vllm_ngram", "suffix",
                "ngram_else_eagle", "hybrid_choose", "hybrid_merge")
