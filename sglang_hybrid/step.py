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

Static shapes, no host sync: CUDA-graph and ``torch.compile(fullgraph=True)`` safe (value checks off).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from .calibration import ModelCalibration, ModelCalibrationTables, NgramCalibrationTables
from .cost import CostTables
from .price import price_device
from .selector import Candidates, Source, VerifyTree, select
from .survival import chain_survival, tree_survival


class ModelDraft(NamedTuple):
    """The model drafter's chain: ``tokens [B, S]``, ``confidence [B, S]`` (draft probability of each token),
    ``length [B]`` (valid prefix)."""

    tokens: torch.Tensor
    confidence: torch.Tensor
    length: torch.Tensor


class NgramDraft(NamedTuple):
    """The n-gram drafter's proposal: ``tokens``, ``parents`` (chain: ``j - 1``; tree: any earlier index),
    ``length`` and the per-node features the calibration reads (``match_len``, ``count``, ``total``, ``depth``,
    ``source``), all ``[B, K]`` except ``length [B]``. ``tree``: whether ``parents`` describe a tree."""

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
    """The step's outcome: the verify tree, the goodput budget ``b_star`` (0-dim int64) and the price ``lam``
    (0-dim float32), plus the candidates' survivals (``[B, S]`` / ``[B, K]``) for logging and traces."""

    tree: VerifyTree
    b_star: torch.Tensor
    lam: torch.Tensor
    model_survival: torch.Tensor
    ngram_survival: torch.Tensor


class DecisionStep:
    """Calibration tables and selection settings of one engine; call it once per decode step.

    ``model_calibration`` / ``ngram_calibration`` are the *tables* on the engine's device
    (``ModelCalibration.to(device)``, ``NgramCalibration.to(device)``); the model default is identity scaling on the
    CPU. ``ngram_calibration`` may be None for engines that never pass an ``NgramDraft`` (model-only baselines).
    """

    def __init__(self, *, mode: str, n_nodes: int, model_calibration: Optional[ModelCalibrationTables] = None,
                 ngram_calibration: Optional[NgramCalibrationTables] = None):
        if mode not in ("choose", "merge"):
            raise ValueError(f"mode must be 'choose' or 'merge', got {mode!r}")
        for name, tables in (("model_calibration", model_calibration), ("ngram_calibration", ngram_calibration)):
            if tables is not None and not hasattr(tables, "acceptance"):
                raise TypeError(f"{name} must be calibration tables on the step's device (use .to(device)), got "
                                f"{type(tables).__name__}")
        self.mode, self.n_nodes = mode, int(n_nodes)
        self.model_cal = model_calibration if model_calibration is not None else ModelCalibration.identity().to()
        self.ngram_cal = ngram_calibration

    def model_survival(self, draft: ModelDraft, check_values: Optional[bool] = None) -> torch.Tensor:
        b, s = draft.tokens.shape
        depth = torch.arange(1, s + 1, device=draft.tokens.device, dtype=torch.int64).expand(b, s)
        a = self.model_cal.acceptance(draft.confidence.to(torch.float32).clamp(0.0, 1.0), depth,
                                      check_values=check_values)
        return chain_survival(a, draft.length, check_values=check_values)

    def ngram_survival(self, draft: NgramDraft, check_values: Optional[bool] = None) -> torch.Tensor:
        if self.ngram_cal is None:
            raise ValueError("this DecisionStep has no n-gram calibration; pass ngram_calibration to use n-gram drafts")
        a = self.ngram_cal.acceptance(draft.match_len, draft.count, draft.total, draft.depth, draft.source,
                                      check_values=check_values)
        if draft.tree:
            return tree_survival(a, draft.parents, draft.length, check_values=check_values)
        return chain_survival(a, draft.length, check_values=check_values)

    def __call__(self, root_tokens: torch.Tensor, model: Optional[ModelDraft] = None,
                 ngram: Optional[NgramDraft] = None, *, cost: Optional[CostTables] = None,
                 batch: Union[int, torch.Tensor, None] = None, check_values: Optional[bool] = None) -> Decision:
        """Decide the verify tree for one decode step.

        ``root_tokens [B]``: each request's last committed token. ``cost``: the batch's step-time tables (None: price
        0). ``batch``: the number of requests the price spreads the budget over (default ``B``).
        """
        b = root_tokens.shape[0]
        dev = root_tokens.device
        if model is not None:
            s_m = self.model_survival(model, check_values)
            model_c = Candidates.chain(model.tokens.to(torch.int64), s_m, model.length, Source.MODEL)
        else:
            model_c = Candidates.empty(b, Source.MODEL, dev)
            s_m = model_c.survival
        if ngram is not None:
            s_n = self.ngram_survival(ngram, check_values)
            ngram_c = Candidates(ngram.tokens.to(torch.int64), ngram.parents.to(torch.int64), s_n, ngram.length,
                                 Source.NGRAM)
        else:
            ngram_c = Candidates.empty(b, Source.NGRAM, dev)
            s_n = ngram_c.survival
        if cost is not None:
            b_star, lam = price_device(torch.cat([s_m, s_n], 1), b if batch is None else batch, cost,
                                       check_values=check_values)
        else:
            width = s_m.shape[1] + s_n.shape[1]
            b_star = torch.full((), b * width, dtype=torch.int64, device=dev)
            lam = torch.zeros((), dtype=torch.float32, device=dev)
        tree = select(root_tokens.to(torch.int64), [model_c, ngram_c], lam, mode=self.mode, n_nodes=self.n_nodes,
                      check_values=check_values)
        return Decision(tree, b_star, lam, s_m, s_n)


__all__ = ["Decision", "DecisionStep", "ModelDraft", "NgramDraft"]
