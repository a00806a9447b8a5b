"""One HYBRID decision step, composed in one place: calibrate -> survivals -> price -> select.

Why one place: the SGLang worker (``sglang_plugin.hybrid_step``), the CPU reference loop (our test oracle), the policy
replay and the selection-cost benchmark all decide what to verify. When each composed calibration, survival, price
and selection itself, the oracle and the benchmark could drift from what ships. Now they all call
``DecisionStep``; what differs between engines is only how drafts reach it (the worker aligns late n-gram proposals
first, the reference loop drafts synchronously, the replay reads traces).

Inputs are per drafter: ``ModelDraft`` (the EAGLE chain with the draft probability of each token) and ``NgramDraft``
(the n-gram chain or tree with the drafter's features). Either may be absent (a single-drafter baseline); it then
enters the selector as an empty source, so ties resolve exactly as with both present. The price ``lambda`` comes from
the batch's cost table over every candidate's survival (``price.price_device``); without a cost table ``lambda = 0``
(verify every draft with positive survival) and ``b*`` is the whole candidate pool.

Verify width. An engine that verifies a ragged batch (each request exactly its selected nodes: the replay's ideal
mode) lets the price mask nodes: ``lambda`` trims the tree and ``b*`` is the budget. An engine that pads every request
to a captured width (SGLang's CUDA graphs) passes ``widths``, the widths it can run: the price then becomes the choice
of width (``widths.choose_width``: the bucket of highest padded goodput), every request fills its ``W - 1`` slots
with its best-ranked nodes (padding slots cost the same as used ones), and ``Decision.next_width`` is the bucket the
*next* step should verify at; this step verifies at ``width``, the bucket decided before (one step late, because the
engine must pick a captured graph on the host without waiting for the device).

Draft depth (adaptive drafting). The model draft costs a forward per token on every step. With ``depths`` (the
EAGLE depths the engine can run, e.g. 1, 2, 4) the step also decides how deep the *next* step drafts: for every
candidate depth it selects the tree that depth would allow (survivals beyond this step's depth extrapolated flat in
depth, as EAGLE-3 reports its acceptance: ``a = s_last ** (1 / depth)`` per request) and picks the (depth, width)
pair of highest goodput ``(R + expected drafts) / (T(R W) + depth * t_draft(R))`` (``widths.choose_plan``): a model
chain is drafted only as deep as its expected gain over the n-gram alternative pays for its forwards. In SGLang depth
1 is the floor: its draft extend, which keeps the draft model's KV cache current, runs every step and yields the first
token anyway. An engine whose draft model commits accepted tokens apart from drafting (the CPU reference loop) may
also offer depth 0, skipping the model draft: a step that drafted nothing has no survivals to extrapolate from, so it
takes each request's rate from the last step that did (``model_rate``, returned in ``Decision.model_rate`` for the
engine to keep), and the model is re-priced against every step's n-gram alternative at that rate. Nothing is observed
while skipping, so each skipped step moves the carried rate toward 1 (optimism under uncertainty, half-life
``probe_half_life`` steps): a skipped model is drafted again once its optimistic value pays for the forwards, and
that draft measures it afresh -- often when it is weak beside a strong copy, at once when the copy stops.

Static shapes, no host sync: CUDA-graph and ``torch.compile(fullgraph=True)`` safe (value checks off).
"""
from __future__ import annotations

import copy
from typing import NamedTuple, Optional, Sequence, Union

import torch

from .calibration import ModelCalibration, ModelCalibrationTables, NgramCalibrationTables
from .cost import CostTables
from .price import price_device, price_rows
from .request_bias import corrected_acceptance
from .selector import Candidates, Source, VerifyTree, select
from .survival import chain_products, chain_survival, tree_survival
from .widths import check_buckets, choose_plan, truncate

#: token id of model-chain positions beyond the drafted depth in the depth evaluation: never a real token (vocabularies
#: are below 2**31), so it never folds with an n-gram node; those trees are only scored, never verified
UNDRAFTED = 1 << 40


class ModelDraft(NamedTuple):
    """The model drafter's (EAGLE's) chain for one decode step, with the draft probability of each token.

    Args:
        tokens: the drafted chain, ``S`` tokens per request (``S`` the drafted depth; 0 when the engine skipped the
            model draft, adaptive drafting only).
        confidence: the draft model's probability of each chain token (clamped into [0, 1]; the model calibration
            turns it into the token's acceptance).
        length: each row's valid prefix; tokens past it are ignored.
        alt_tokens: optional, with ``alt_confidence`` (both or neither): at each chain position the draft model's
            next ``M`` most likely tokens after the chain's own (ranks 2 to ``M + 1`` of the same forward's
            distribution), each hung as a leaf beside the chain token it competes with (a child of the chain's
            previous token). The fused decision (``sglang_hybrid.kernels``) assumes them distinct from each other
            and from the chain's token at their position, as ranks of one distribution are.
        alt_confidence: the draft probabilities of ``alt_tokens``.

    Shapes:
        tokens: ``[B, S]``, integer (taken as int64).
        confidence: ``[B, S]``, floating (taken as float32).
        length: ``[B]``, integer.
        alt_tokens / alt_confidence: ``[B, S, M]``, integer / floating.

    Why: every engine (the SGLang worker, the CPU reference loop, the replay) drafts its own way; the step needs only
    the chain and its probabilities, so they all hand it this tuple. The alternatives make a tree that needs no draft
    forward beyond the chain's: where the chain token is wrong, a next-best one is often right (the measured rates in
    docs/benchmarks.md), and an EAGLE tree's edge over a chain at small batches comes from those candidates. An
    alternative's survival is its parent's times its calibrated probability (the ranks' events are disjoint). Ragged
    and padded verify take them alike (a width bucket truncates the tree in rank order); the SGLang worker drafts
    them with its setting ``eagle_alternatives``.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    length: torch.Tensor
    alt_tokens: Optional[torch.Tensor] = None
    alt_confidence: Optional[torch.Tensor] = None


class NgramDraft(NamedTuple):
    """The n-gram drafter's proposal for one decode step, a chain or a tree, with the features its calibration reads.

    Args:
        tokens: the drafted tokens (ignored past ``length``).
        parents: each node's parent: ``-1`` for a child of the root, else an earlier index of the same row (a chain:
            ``j - 1``).
        length: each row's valid prefix.
        match_len: length of the context suffix matched when the token was drafted.
        count: occurrences of this continuation after the matched context.
        total: occurrences of the matched context that have any continuation.
        depth: 1-based depth of the node below the root.
        source: 0 = the request's own context, 1 = the shared corpus.
        tree: whether ``parents`` describe a tree (False: a chain).

    Shapes:
        tokens, parents, match_len, count, total, depth, source: ``[B, K]``, integer (``tokens`` and ``parents``
        taken as int64).
        length: ``[B]``, integer.
        tree: a Python bool, not a tensor.

    Why: the features are the ones ``sglang_hybrid.ngram.NgramDrafts`` carries (docs/ARCHITECTURE.md, "n-gram
    drafts"), so the step prices each node by how it was drafted rather than by one constant rate. ``tree`` is a
    Python bool so that the survival rule (a chain's cumulative product, a tree's product along parents) is chosen
    without reading the device.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    length: torch.Tensor
    match_len: torch.Tensor
    count: torch.Tensor
    total: torch.Tensor
    depth: torch.Tensor
    source: torch.Tensor
    tree: bool = False


class Decision(NamedTuple):
    """The outcome of one decode step's decision (``DecisionStep.__call__``).

    Args:
        tree: the verify tree (``selector.VerifyTree``; node 0 is the root).
        b_star: the draft nodes the batch pays for: ragged, the goodput budget over every candidate's survival
            (``price.price_device``); padded, ``R * (W - 1)`` at the chosen width bucket (``widths.choose_plan``).
        lam: the price ``lambda``: ragged, the survival a node needs (at least) to be verified; padded, the goodput lost
            per extra draft slot were the next wider bucket verified (the selection itself runs at 0).
        model_survival: each model-chain token's survival (probability that the path to it is accepted), for
            logging and traces.
        ngram_survival: the same for the n-gram draft's nodes.
        next_width: the verify width the next step should use: with width buckets the chosen bucket; ragged: the
            full width ``n_nodes + 1``.
        next_depth: the model-draft depth the next step should use: with depth candidates the chosen one; else this
            step's depth.
        model_rate: adaptive drafting only, else None: each request's per-position model acceptance the depths were
            scored with, measured from this step's chain (``s_last ** (1 / depth)``) or, when the step drafted
            nothing (depth 0), the rate passed in moved toward 1 by one step of probing; an engine that can skip
            keeps it per request and passes it back.
        model_acceptance: each model-chain token's conditional acceptance the step priced with (calibrated, then
            corrected by ``model_bias`` when given), what ``request_bias.update_bias`` learns against.
        ngram_acceptance: the same for the n-gram draft's nodes (calibrated, then corrected by ``ngram_bias`` when
            given; 0 past the draft's length); None without an n-gram draft.

    Shapes:
        tree: ``[B, W]`` per field (``W`` this step's verify width; ``ancestors`` ``[B, W, W]``; dtypes in
        ``selector.VerifyTree``).
        b_star, next_width, next_depth: 0-dim int64.
        lam: 0-dim float32.
        model_survival, model_acceptance: ``[B, S]`` float32 (``[B, 0]`` without a model draft).
        ngram_survival, ngram_acceptance: ``[B, K]`` float32 (``[B, 0]`` survivals without an n-gram draft).
        model_rate: ``[B]`` float32.

    Why: every field is a device tensor, never a Python number, so an engine can capture the step in a graph and read
    ``next_width`` / ``next_depth`` on the host later without waiting for the device (the worker applies them one
    step late). The acceptances come back so that the engine's online offsets learn against exactly what was priced.
    """

    tree: VerifyTree
    b_star: torch.Tensor
    lam: torch.Tensor
    model_survival: torch.Tensor
    ngram_survival: torch.Tensor
    next_width: torch.Tensor
    next_depth: torch.Tensor
    model_rate: Optional[torch.Tensor] = None
    model_acceptance: Optional[torch.Tensor] = None
    ngram_acceptance: Optional[torch.Tensor] = None


def _with_alternatives(chain: Candidates, alt_tokens: torch.Tensor, alt_survival: torch.Tensor) -> Candidates:
    """The model chain (``D`` nodes, valid prefix ``chain.length``) with each drafted position's alternatives hung as
    leaves beside it: one tree of ``D + S * M`` nodes, chain first, then the alternatives position-major.

    ``alt_tokens`` / ``alt_survival`` ``[B, S, M]`` (``S <= D`` drafted positions; the survival already includes the
    parent's). An alternative exists where its chain position does (position ``< min(length, S)``). The pool's
    validity is a prefix, so a node that does not exist is made unselectable instead: survival 0 and a token id no
    drafter proposes (``UNDRAFTED`` upward, distinct per node, so nothing folds into it)."""
    b, d = chain.tokens.shape
    s, m = alt_tokens.shape[1], alt_tokens.shape[2]
    dev = chain.tokens.device
    j = torch.arange(d, device=dev, dtype=torch.int64)
    chain_ok = j[None, :] < chain.length[:, None]
    c_tok = torch.where(chain_ok, chain.tokens.to(torch.int64), UNDRAFTED + j[None, :])
    c_surv = torch.where(chain_ok, chain.survival.to(torch.float32), 0.0)
    i = torch.arange(s, device=dev, dtype=torch.int64)
    alt_ok = (i[None, :] < torch.minimum(chain.length, torch.full_like(chain.length, s))[:, None])[:, :, None]
    a_idx = torch.arange(s * m, device=dev, dtype=torch.int64).reshape(1, s, m)
    a_tok = torch.where(alt_ok, alt_tokens.to(torch.int64), UNDRAFTED + d + a_idx).reshape(b, s * m)
    a_surv = torch.where(alt_ok, alt_survival.to(torch.float32), 0.0).reshape(b, s * m)
    a_par = (i - 1)[None, :, None].expand(b, s, m).reshape(b, s * m)         # the chain's previous token (-1: root)
    tokens = torch.cat([c_tok, a_tok], 1)
    parents = torch.cat([chain.parents.to(torch.int64), a_par], 1)
    length = torch.full((b,), d + s * m, dtype=torch.int64, device=dev)
    return Candidates(tokens, parents, torch.cat([c_surv, a_surv], 1), length, chain.source)


class _Sides(NamedTuple):
    """Both drafters' candidates of one step, calibrated (``DecisionStep._sides``): the start of every path."""

    root: torch.Tensor                  # [B] int64
    model: Candidates                   # the model chain, alternatives not hung yet
    ngram: Candidates
    alt: Optional[tuple]                # (alt_tokens, alt_survival) [B, S, M], or None
    s_m: torch.Tensor                   # model-chain survivals [B, S]
    s_n: torch.Tensor                   # n-gram survivals [B, K]
    a_m: torch.Tensor                   # model-chain acceptances [B, S]
    a_n: Optional[torch.Tensor]         # n-gram acceptances [B, K], None without an n-gram draft


class DecisionStep:
    """Calibration tables and selection settings of one engine; call it once per decode step.

    ``model_calibration`` / ``ngram_calibration`` are the *tables* on the engine's device
    (``ModelCalibration.to(device)``, ``NgramCalibration.to(device)``); the model default is identity scaling on the
    CPU. ``ngram_calibration`` may be None for engines that never pass an ``NgramDraft`` (model-only baselines).
    ``widths``: the verify widths the engine can run (padded verify, see the module docstring); None: ragged verify,
    the price masks nodes. ``depths``: the model-draft depths the engine can run (adaptive drafting; 0 = skip the
    model draft, for engines that can, see the module docstring); None: the engine always drafts the same depth.
    ``probe_half_life`` (depth 0 only): skipped steps after which the unobserved model rate has moved half way to 1
    (``None``: it stays where drafting stopped, and a model that recovers is never drafted again).

    A call takes one of four paths, fixed by the construction (``widths``, ``depths``) and whether a model draft is
    given: ``_padded``, ``_padded_adaptive``, ``_ragged``, ``_ragged_adaptive``; each method's docstring says why it
    exists. ``sglang_hybrid.kernels.FusedDecisionStep`` replaces the two padded ones on the SGLang worker.
    """

    def __init__(self, *, mode: str, n_nodes: int, model_calibration: Optional[ModelCalibrationTables] = None,
                 ngram_calibration: Optional[NgramCalibrationTables] = None, widths: Optional[Sequence[int]] = None,
                 depths: Optional[Sequence[int]] = None, probe_half_life: Optional[float] = 8.0):
        if mode not in ("choose", "merge"):
            raise ValueError(f"mode must be 'choose' or 'merge', got {mode!r}")
        for name, tables in (("model_calibration", model_calibration), ("ngram_calibration", ngram_calibration)):
            if tables is not None and not hasattr(tables, "acceptance"):
                raise TypeError(f"{name} must be calibration tables on the step's device (use .to(device)), got "
                                f"{type(tables).__name__}")
        self.mode, self.n_nodes = mode, int(n_nodes)
        self.model_cal = model_calibration if model_calibration is not None else ModelCalibration.identity().to()
        self.ngram_cal = ngram_calibration
        self.widths = None if widths is None else check_buckets(list(widths), self.n_nodes + 1)
        if depths is not None:
            if not depths or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in depths):
                raise ValueError(f"depths must be a non-empty list of ints >= 0 (model-draft depths, 0 = skip), got "
                                 f"{depths!r}")
            depths = tuple(sorted(set(depths)))
            if depths[-1] < 1:
                raise ValueError(f"depths {depths!r} never draft the model: add a depth >= 1")
        self.depths = depths
        if probe_half_life is not None and not (isinstance(probe_half_life, (int, float))
                                                and not isinstance(probe_half_life, bool) and probe_half_life > 0):
            raise ValueError(f"probe_half_life must be a number of steps > 0 or None, got {probe_half_life!r}")
        #: per skipped step, the carried rate's distance to 1 is multiplied by this (1: no probing)
        self.probe_keep = 1.0 if probe_half_life is None else 0.5 ** (1.0 / float(probe_half_life))
        self._constants: dict = {}

    def with_widths(self, widths: Sequence[int]) -> "DecisionStep":
        """The same decision (mode, calibrations, depths, probing) choosing among ``widths`` instead: what an engine
        builds once it knows which widths it can run (the worker's start-up fit, the replay's per-batch launch). The
        bucket constants are cached per instance, so the copy starts without them."""
        if self.widths is None:
            raise ValueError("with_widths is for padded verify; this DecisionStep verifies ragged (widths=None)")
        out = copy.copy(self)
        out.widths = check_buckets(list(widths), self.n_nodes + 1)
        out._constants = {}
        return out

    @property
    def max_width(self) -> int:
        """The widest verify tree: ``n_nodes + 1``."""
        return self.n_nodes + 1

    def _constant(self, name: str, values, device) -> torch.Tensor:
        # built once per device, outside any graph capture (a host-to-device copy cannot be captured)
        key = (name, str(device))
        if key not in self._constants:
            self._constants[key] = torch.tensor(values, dtype=torch.int64, device=device)
        return self._constants[key]

    def _depth_candidates(self, model_c: Candidates, ngram_c: Candidates, model_rate: Optional[torch.Tensor]):
        """The model chain as each candidate depth would draft it, stacked depth-major over the batch: ``D`` copies of
        the batch whose model chains are cut to (or extrapolated up to) ``depths[d]``; the n-gram side repeats. Also
        returns each request's per-position rate (``[B]``): from the chain, or ``model_rate`` moved toward 1 by one
        skipped step's probing when none was drafted."""
        b, s = model_c.tokens.shape
        dev = model_c.tokens.device
        d_max = self.depths[-1]
        nd = len(self.depths)
        j = torch.arange(d_max, device=dev, dtype=torch.int64)
        surv = model_c.survival.to(torch.float32)
        if s > 0:
            last = surv[:, s - 1:s].clamp(min=0.0)                                           # [B, 1]
            rate = last ** (1.0 / s)                                   # per-position acceptance, flat in depth
        else:            # nothing drafted: the rate carried in, moved toward 1 because it was not observed (probing)
            carried = model_rate.to(torch.float32).clamp(0.0, 1.0)[:, None]
            rate = carried + (1.0 - carried) * (1.0 - self.probe_keep)
            last = torch.ones_like(rate)
        beyond = last * rate ** (j[None, :] - (s - 1)).clamp(min=0).to(torch.float32)
        ext_s = torch.cat([surv, beyond[:, s:]], 1) if d_max > s else surv[:, :d_max]
        ext_t = torch.cat([model_c.tokens, (UNDRAFTED + j[s:])[None, :].expand(b, d_max - s)], 1) \
            if d_max > s else model_c.tokens[:, :d_max]
        full_len = torch.where(model_c.length >= s, torch.full_like(model_c.length, d_max), model_c.length)
        dt = self._constant("depths", self.depths, dev)
        lengths = torch.minimum(full_len[None, :], dt[:, None]).reshape(nd * b)
        rep = lambda x: x.repeat(nd, *([1] * (x.dim() - 1)))  # noqa: E731
        model_s = Candidates.chain(rep(ext_t), rep(ext_s), lengths, Source.MODEL)
        ngram_s = Candidates(rep(ngram_c.tokens), rep(ngram_c.parents), rep(ngram_c.survival), rep(ngram_c.length),
                             Source.NGRAM)
        return model_s, ngram_s, dt, rate[:, 0]

    def model_acceptance(self, draft: ModelDraft, check_values: Optional[bool] = None,
                         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Each chain token's conditional acceptance ``[B, S]``: the calibration of its draft probability, shifted by
        the request's online offset ``bias [B]`` when given (``request_bias.corrected_acceptance``)."""
        b, s = draft.tokens.shape
        depth = torch.arange(1, s + 1, device=draft.tokens.device, dtype=torch.int64).expand(b, s)
        a = self.model_cal.acceptance(draft.confidence.to(torch.float32).clamp(0.0, 1.0), depth,
                                      check_values=check_values)
        return a if bias is None else corrected_acceptance(a, bias)

    def model_survival(self, draft: ModelDraft, check_values: Optional[bool] = None) -> torch.Tensor:
        return chain_survival(self.model_acceptance(draft, check_values), draft.length, check_values=check_values)

    def alternatives_survival(self, draft: ModelDraft, chain_acceptance: torch.Tensor,
                              check_values: Optional[bool] = None, bias: Optional[torch.Tensor] = None
                              ) -> torch.Tensor:
        """Each alternative's survival ``[B, S, M]`` (``ModelDraft.alt_tokens``): the chain's survival up to its
        parent (1 at the first position; ``chain_acceptance`` ``[B, S]``, the chain tokens' acceptances) times the
        calibration of its draft probability at its depth, shifted by ``bias`` as the chain's tokens are. The ranks of
        one position are disjoint events, so these add up. The product is the chain's own
        (``survival.chain_products``, float64, rounded once), so an alternative as likely as the chain's token beside
        it has exactly its survival (and the fused kernels order the two as this does)."""
        b, s, m = draft.alt_confidence.shape
        depth = torch.arange(1, s + 1, device=draft.tokens.device, dtype=torch.int64)[:, None].expand(s, m)
        a = self.model_cal.acceptance(draft.alt_confidence.to(torch.float32).clamp(0.0, 1.0).reshape(b, s * m),
                                      depth.reshape(1, s * m).expand(b, s * m), check_values=check_values)
        if bias is not None:
            a = corrected_acceptance(a, bias)
        prefix = chain_products(chain_acceptance, draft.length)
        parent = torch.cat([torch.ones((b, min(s, 1)), dtype=prefix.dtype, device=a.device), prefix[:, :s - 1]], 1)
        return (parent[:, :, None] * a.reshape(b, s, m).to(prefix.dtype)).to(torch.float32)

    @staticmethod
    def _check_alternatives(draft: ModelDraft) -> None:
        has_t, has_c = draft.alt_tokens is not None, draft.alt_confidence is not None
        if has_t != has_c:
            raise ValueError("ModelDraft.alt_tokens and alt_confidence come together: pass both or neither")
        b, s = draft.tokens.shape
        for name, x in (("alt_tokens", draft.alt_tokens), ("alt_confidence", draft.alt_confidence)):
            if x.dim() != 3 or tuple(x.shape[:2]) != (b, s):
                raise ValueError(f"ModelDraft.{name} must have shape ({b}, {s}, M) (M alternatives per chain "
                                 f"position), got {tuple(x.shape)}")
        if draft.alt_tokens.shape[2] != draft.alt_confidence.shape[2]:
            raise ValueError(f"ModelDraft.alt_tokens {tuple(draft.alt_tokens.shape)} and alt_confidence "
                             f"{tuple(draft.alt_confidence.shape)} differ in M")

    def ngram_acceptance(self, draft: NgramDraft, check_values: Optional[bool] = None,
                         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Each n-gram node's conditional acceptance ``[B, K]``: the calibration of its features, shifted by the
        request's online offset ``bias [B]`` when given (``request_bias.corrected_acceptance``), 0 past the draft's
        length."""
        if self.ngram_cal is None:
            raise ValueError("this DecisionStep has no n-gram calibration; pass ngram_calibration to use n-gram drafts")
        a = self.ngram_cal.acceptance(draft.match_len, draft.count, draft.total, draft.depth, draft.source,
                                      check_values=check_values)
        if bias is not None:
            a = corrected_acceptance(a, bias)
        j = torch.arange(a.shape[1], device=a.device)
        return torch.where(j[None, :] < draft.length[:, None], a.to(torch.float32), 0.0)

    def ngram_survival(self, draft: NgramDraft, check_values: Optional[bool] = None,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self._ngram_survival(draft, self.ngram_acceptance(draft, check_values, bias), check_values)

    @staticmethod
    def _ngram_survival(draft: NgramDraft, a: torch.Tensor, check_values: Optional[bool]) -> torch.Tensor:
        if draft.tree:
            return tree_survival(a, draft.parents, draft.length, check_values=check_values)
        return chain_survival(a, draft.length, check_values=check_values)

    def __call__(self, root_tokens: torch.Tensor, model: Optional[ModelDraft] = None,
                 ngram: Optional[NgramDraft] = None, *, cost: Optional[CostTables] = None,
                 batch: Union[int, torch.Tensor, None] = None, check_values: Optional[bool] = None,
                 width: Optional[int] = None, draft_cost: Optional[CostTables] = None,
                 model_rate: Optional[torch.Tensor] = None, model_bias: Optional[torch.Tensor] = None,
                 ngram_bias: Optional[torch.Tensor] = None) -> Decision:
        """Decide the verify tree for one decode step.

        ``root_tokens [B]``: each request's last committed token. ``cost``: the batch's step-time tables (None: price
        0). ``batch``: the number of requests the price spreads the budget over (default ``B``). ``width`` (padded
        verify only): this step's verify width, one of ``widths`` (default: the widest); the tree has that width.
        ``draft_cost``: time of one model-draft forward by batch size (adaptive drafting; None: drafting is free, so
        the deepest depth wins). With ``depths`` the model chain must be drafted at one of them; a chain of 0 tokens
        (depth 0: the engine skipped the model draft) needs ``model_rate [B]``, each request's per-position model
        acceptance carried from the previous step (``Decision.model_rate``); it is ignored when a chain was drafted.
        ``model_bias [B]``: each request's online offset on the model side's calibrated logit (``request_bias``; None:
        the calibration alone); ``ngram_bias [B]``: the same on the n-gram side's.

        Calibrates both drafts into survivals (``_sides``), then dispatches on the construction: padded verify
        (``widths``) or ragged, each with adaptive drafting (``depths`` and a model draft) or at the drafted depth:
        ``_padded``, ``_padded_adaptive``, ``_ragged``, ``_ragged_adaptive``. The choice reads only Python settings
        and shapes, never a tensor's value.
        """
        if width is not None:
            if self.widths is None:
                raise ValueError("width is for padded verify; construct the DecisionStep with widths=...")
            if width not in self.widths:
                raise ValueError(f"width {width!r} is not one of the verify width buckets {self.widths}")
        sides = self._sides(root_tokens, model, ngram, check_values, model_bias, ngram_bias)
        r = root_tokens.shape[0] if batch is None else batch
        adaptive = self.depths is not None and model is not None
        if self.widths is not None:
            if adaptive:
                return self._padded_adaptive(sides, r, cost, draft_cost, width, model_rate, check_values)
            return self._padded(sides, r, cost, width, check_values)
        if adaptive:
            return self._ragged_adaptive(sides, r, cost, draft_cost, model_rate, check_values)
        return self._ragged(sides, r, cost, check_values)

    def _sides(self, root_tokens: torch.Tensor, model: Optional[ModelDraft], ngram: Optional[NgramDraft],
               check_values: Optional[bool], model_bias: Optional[torch.Tensor],
               ngram_bias: Optional[torch.Tensor]) -> _Sides:
        """Both drafters' calibrated candidates: what every path starts from (calibrate -> survivals). An absent
        drafter enters as an empty source of its kind, so ties resolve as with both present."""
        b = root_tokens.shape[0]
        dev = root_tokens.device
        for name, bias in (("model_bias", model_bias), ("ngram_bias", ngram_bias)):
            if bias is not None and tuple(bias.shape) != (b,):
                raise ValueError(f"{name} must have shape ({b},) (one offset per request), got {tuple(bias.shape)}")
        alt = None
        if model is not None:
            a_m = self.model_acceptance(model, check_values, model_bias)
            s_m = chain_survival(a_m, model.length, check_values=check_values)
            model_c = Candidates.chain(model.tokens.to(torch.int64), s_m, model.length, Source.MODEL)
            if model.alt_tokens is not None or model.alt_confidence is not None:
                self._check_alternatives(model)
                alt = (model.alt_tokens, self.alternatives_survival(model, a_m, check_values, model_bias))
        else:
            model_c = Candidates.empty(b, Source.MODEL, dev)
            s_m = a_m = model_c.survival
        a_n = None
        if ngram is not None:
            a_n = self.ngram_acceptance(ngram, check_values, ngram_bias)
            s_n = self._ngram_survival(ngram, a_n, check_values)
            ngram_c = Candidates(ngram.tokens.to(torch.int64), ngram.parents.to(torch.int64), s_n, ngram.length,
                                 Source.NGRAM)
        else:
            ngram_c = Candidates.empty(b, Source.NGRAM, dev)
            s_n = ngram_c.survival
        return _Sides(root_tokens.to(torch.int64), model_c, ngram_c, alt, s_m, s_n, a_m, a_n)

    def _drafted_depth(self, sides: _Sides) -> torch.Tensor:
        """The depth this step drafted (0-dim int64): the model chain's columns, alternatives aside."""
        return torch.full((), sides.model.tokens.shape[1], dtype=torch.int64, device=sides.root.device)

    def _depth_stack(self, sides: _Sides, model_rate: Optional[torch.Tensor]):
        """The adaptive paths' shared start: checks the drafted depth, builds the depth-major stack
        (``_depth_candidates``) with each block keeping the alternatives of the positions it drafts. Returns
        ``(model_s, ngram_s, depths [D], rate [B], k)``, ``k`` the drafted depth's block."""
        b = sides.root.shape[0]
        s_now = sides.model.tokens.shape[1]
        if s_now not in self.depths:
            raise ValueError(f"the model chain has {s_now} tokens but the draft depths are {self.depths}")
        if s_now == 0 and (model_rate is None or tuple(model_rate.shape) != (b,)):
            raise ValueError(f"a step that drafted no model tokens (depth 0) needs model_rate [{b}]: each "
                             "request's Decision.model_rate from the previous step")
        model_s, ngram_s, dt, rate = self._depth_candidates(sides.model, sides.ngram, model_rate)
        nd = len(self.depths)
        if sides.alt is not None:      # every depth block keeps the alternatives of the positions it drafts
            alt_tokens, alt_survival = sides.alt
            model_s = _with_alternatives(model_s, alt_tokens.repeat(nd, 1, 1), alt_survival.repeat(nd, 1, 1))
        return model_s, ngram_s, dt, rate, self.depths.index(s_now)

    def _padded(self, sides: _Sides, r, cost: Optional[CostTables], width: Optional[int],
                check_values: Optional[bool]) -> Decision:
        """Padded verify at the drafted depth (``widths`` set, no ``depths``).

        Why this path: an engine that replays captured graphs (SGLang's CUDA graphs) verifies every request at one
        width, so a price that masked nodes inside it would save no compute. Every eligible node competes for the
        slots instead (selection at ``lambda = 0``), the tree is cut to this step's ``width`` (decided one step
        before, on the host), and the price becomes the choice of the *next* step's width bucket
        (``widths.choose_plan``: the bucket of highest padded goodput). Replaced on the SGLang worker by
        ``kernels.FusedDecisionStep`` wherever Triton runs; this stays its reference.
        """
        model_c = sides.model if sides.alt is None else _with_alternatives(sides.model, *sides.alt)
        buckets = self._constant("widths", self.widths, sides.root.device)
        full = select(sides.root, [model_c, sides.ngram], 0.0, mode=self.mode, n_nodes=self.n_nodes,
                      check_values=check_values)
        choice = choose_plan(full.survival[None], full.valid[None], buckets, cost, r,
                             self._drafted_depth(sides).reshape(1))
        tree = truncate(full, self.max_width if width is None else width)
        return Decision(tree, choice.b_star, choice.lam, sides.s_m, sides.s_n, choice.width, choice.depth, None,
                        sides.a_m, sides.a_n)

    def _padded_adaptive(self, sides: _Sides, r, cost: Optional[CostTables], draft_cost: Optional[CostTables],
                         width: Optional[int], model_rate: Optional[torch.Tensor],
                         check_values: Optional[bool]) -> Decision:
        """Padded verify with adaptive drafting (``widths`` and ``depths`` set, a model draft given).

        Why this path: the model draft costs a forward per token every step, so the next step's depth is priced with
        its width. The batch is selected once for every candidate depth (a depth-major stack of ``D x B`` rows, the
        chain cut or extrapolated to each depth: ``_depth_stack``), ``widths.choose_plan`` picks the (depth, width)
        pair of highest goodput ``(R + expected drafts) / (T(R W) + depth * t_draft(R))``, and this step's tree is
        the block of the depth it drafted (only real tokens there), cut to ``width``. Replaced on the SGLang worker
        by ``kernels.FusedDecisionStep`` wherever Triton runs (depths >= 1; skipping the draft, depth 0, stays here).
        """
        model_s, ngram_s, dt, rate, k = self._depth_stack(sides, model_rate)
        nd, b = dt.shape[0], sides.root.shape[0]
        buckets = self._constant("widths", self.widths, sides.root.device)
        stack = select(sides.root.repeat(nd), [model_s, ngram_s], 0.0, mode=self.mode, n_nodes=self.n_nodes,
                       check_values=check_values)
        w = self.max_width
        choice = choose_plan(stack.survival.reshape(nd, b, w), stack.valid.reshape(nd, b, w), buckets, cost, r, dt,
                             draft_cost)
        full = type(stack)(*(x[k * b:(k + 1) * b] for x in stack))
        tree = truncate(full, self.max_width if width is None else width)
        return Decision(tree, choice.b_star, choice.lam, sides.s_m, sides.s_n, choice.width, choice.depth, rate,
                        sides.a_m, sides.a_n)

    def _ragged(self, sides: _Sides, r, cost: Optional[CostTables], check_values: Optional[bool]) -> Decision:
        """Ragged verify at the drafted depth (no ``widths``, no ``depths``).

        Why this path: an engine that verifies each request's own selected nodes (the replay's ideal mode, the CPU
        reference loop) pays per verified node, so the price can mask nodes: ``price_device`` gives ``lambda`` and
        the budget ``b*`` over every candidate's survival, and the selector keeps the nodes worth more than
        ``lambda``. Without a cost table ``lambda = 0`` (every draft with positive survival) and ``b*`` is the whole
        pool. ``next_width`` is the full width: there are no buckets to choose. No fused kernel replaces it.
        """
        model_c = sides.model if sides.alt is None else _with_alternatives(sides.model, *sides.alt)
        b, dev = sides.root.shape[0], sides.root.device
        if cost is not None:
            b_star, lam = price_device(torch.cat([model_c.survival.to(torch.float32), sides.s_n], 1), r, cost,
                                       check_values=check_values)
        else:
            b_star = torch.full((), b * (model_c.survival.shape[1] + sides.s_n.shape[1]), dtype=torch.int64,
                                device=dev)
            lam = torch.zeros((), dtype=torch.float32, device=dev)
        tree = select(sides.root, [model_c, sides.ngram], lam, mode=self.mode, n_nodes=self.n_nodes,
                      check_values=check_values)
        next_width = torch.full((), self.max_width, dtype=torch.int64, device=dev)
        return Decision(tree, b_star, lam, sides.s_m, sides.s_n, next_width, self._drafted_depth(sides), None,
                        sides.a_m, sides.a_n)

    def _ragged_adaptive(self, sides: _Sides, r, cost: Optional[CostTables], draft_cost: Optional[CostTables],
                         model_rate: Optional[torch.Tensor], check_values: Optional[bool]) -> Decision:
        """Ragged verify with adaptive drafting (``depths`` set, no ``widths``, a model draft given).

        Why this path: a ragged engine pays per verified node *and* per draft forward, so each candidate depth is
        priced on its own candidates (``b*_d``, ``lambda_d``: ``price_rows`` over the depth-major stack of
        ``_depth_stack``), selected, and scored ``G(d) = (R + E_d) / (T(R + n_d) + d t_draft(R))`` with ``E_d`` the
        expected accepted drafts and ``n_d`` the verified drafts; the first maximum (the shallowest) is the next
        step's depth. The step's tree, ``b*`` and ``lambda`` are the drafted depth's. This is the path of an engine
        that may skip the model draft (depth 0, the CPU reference loop). No fused kernel replaces it.
        """
        model_s, ngram_s, dt, rate, k = self._depth_stack(sides, model_rate)
        nd = dt.shape[0]
        b = sides.root.shape[0]
        dev = sides.root.device
        j = torch.arange(model_s.tokens.shape[1], device=dev)
        model_sv = torch.where(j[None, :] < model_s.length[:, None], model_s.survival, 0.0)   # pricing needs 0 padding
        surv = torch.cat([model_sv, ngram_s.survival.to(torch.float32)], 1).reshape(nd, b, -1)
        if cost is not None:
            b_stars, lams = price_rows(surv, r, cost, check_values=check_values)
        else:
            b_stars = torch.full((nd,), b * surv.shape[2], dtype=torch.int64, device=dev)
            lams = torch.zeros((nd,), dtype=torch.float32, device=dev)
        stack = select(sides.root.repeat(nd), [model_s, ngram_s], lams.repeat_interleave(b), mode=self.mode,
                       n_nodes=self.n_nodes, check_values=check_values)
        if cost is not None:
            rf = r.to(torch.float32) if isinstance(r, torch.Tensor) else torch.full((), float(r), device=dev)
            expected = stack.expected_accepted.reshape(nd, b).sum(1)
            verified = (stack.valid.sum(1) - 1).reshape(nd, b).sum(1).to(torch.float32)
            t_draft = draft_cost.step_time(rf) if draft_cost is not None else torch.zeros((), device=dev)
            goodput = (rf + expected) / (cost.step_time(rf + verified) + dt.to(torch.float32) * t_draft)
            d_i = torch.argmax(goodput)                                          # first maximum: the shallowest
        else:
            d_i = torch.full((), nd - 1, dtype=torch.int64, device=dev)          # nothing priced: the deepest
        tree = type(stack)(*(x[k * b:(k + 1) * b] for x in stack))
        next_width = torch.full((), self.max_width, dtype=torch.int64, device=dev)
        return Decision(tree, b_stars[k], lams[k], sides.s_m, sides.s_n, next_width,
                        dt.gather(0, d_i.reshape(1))[0], rate, sides.a_m, sides.a_n)


__all__ = ["Decision", "DecisionStep", "ModelDraft", "NgramDraft"]
