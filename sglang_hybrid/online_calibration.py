"""A deployment-wide online correction of the model drafter's calibration: its per-depth temperature, learned on the
device from verify outcomes (setting ``model_calibration_eta``).

Why: the model side's acceptance is ``a = sigmoid(logit(p) / T[depth])`` of the head's draft probability ``p``
(``calibration.ModelCalibration``), and ``T`` comes from a calibration file or is 1 (the probability as is). A head
deployed without a file fit to it can be over- or under-confident: its probability is ``sigmoid(logit(q) / T_head)``
of the true acceptance ``q``, ``T_head`` unknown. HYBRID prices the head's chain against the n-gram chain on one scale,
so such a head skews every decision. A per-request offset on the logit (``request_bias``, ``model_bias_eta``) cannot
undo it: a temperature error scales the logit, it does not shift it, so a confident token and an unsure one are wrong
in opposite directions. A per-depth temperature learned online can, exactly (``T = 1 / T_head``), and it is one quantity
of the head, not of a request: every request's outcomes teach it, so it is learned across the deployment.

The learning: with ``z = logit(p)`` and ``w_d = 1 / T_d``, each verify takes one step on the log loss of the step's
tested model-chain tokens (``request_bias.chain_outcome``: the tokens up to and including the chain's first miss):

    g_d = sum_{tested j at depth d} (a_j - y_j) z_j  +  POOL * sum_d' g_d'
    G_d <- DECAY * G_d + g_d ** 2,        w_d <- clamp(w_d - eta * g_d / sqrt(G_d), W_MIN, W_MAX),     T_d = 1 / w_d

``a_j`` is the acceptance the step priced (the calibration, shifted by the request's offset where that is on: the
gradient of the priced prediction's log loss), ``y_j`` whether the token hit. Sums, not means over the tested tokens:
how many tokens a step tests depends on the outcomes (a chain is tested up to its first miss), and a mean weighted the
steps by it, which biased the learned temperature (an honest head's inverse temperature came out 0.43 to 0.91 at
batch 1). Each depth also takes ``POOL`` of the depths' summed gradient: the deep depths are tested rarely (a token is
tested only if the ones before it hit); the fixed point is still every depth's own, and a depth never drafted follows
the pooled direction. A step that tested nothing moves nothing. The step is RMS-normalised (``G_d``, a running mean
of squared gradients over about ``1 / (1 - DECAY)`` steps), so one ``eta`` moves ``w`` by at most about ``eta`` a step
at any batch size and noise level. Measured on the replay's simulated drafter with its confidence distorted
(docs/sglang.md, "The EAGLE side's online temperature and offset"): with the default rate the model side's ECE after
2,000 steps is at most 0.02 at every head temperature in 0.5..2 and batch size measured, where without the correction
it is 0.05 to 0.10 away from T = 1, and an honest head's is unchanged.

Graph-safe: static shapes, no host sync, no data-dependent branching; the temperatures are updated in place, so a
decision (the torch step, the fused kernels, a captured graph) that reads the tables' tensor sees the new values at
its next step. The fused path computes the same step inside its after-verify kernel (``kernels.outcome``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .calibration import CAL_EPS, ModelCalibrationTables

#: bounds of the learned inverse temperature ``w = 1 / T`` (a head 10 times over- or under-confident at most)
W_MIN, W_MAX = 0.1, 10.0
#: per-step decay of the running mean of squared gradients: about 1,000 steps of memory
DECAY = 0.999
#: the share of the depths' summed gradient each depth's gradient adds (the deep depths lean on the shallow ones)
POOL = 0.25
#: the RMS normaliser's floor (a gradient of 0 moves nothing)
NORM_EPS = 1e-12


def _logit64(prob: torch.Tensor) -> torch.Tensor:
    """``logit(p)`` in float64 of ``p`` clamped as the calibration clamps it (``CAL_EPS``; float32 first, as
    ``ModelCalibrationTables.acceptance`` reads it)."""
    pc = prob.to(torch.float32).clamp(0.0, 1.0).clamp(CAL_EPS, 1 - CAL_EPS).to(torch.float64)
    return torch.log(pc) - torch.log1p(-pc)


def temperature_gradient(temperatures: torch.Tensor, prob: torch.Tensor, tested: torch.Tensor, hit: torch.Tensor,
                         acceptance: Optional[torch.Tensor] = None, pool: float = POOL) -> torch.Tensor:
    """The step's gradient ``g [P]`` (float64) of the tested tokens' log loss with respect to each depth's inverse
    temperature (module docstring). ``prob [B, S]``: the chain's draft probabilities, column ``j`` at depth ``j + 1``
    (depths past ``P`` share the last temperature, as the calibration reads them); ``tested`` / ``hit [B, S]`` bool
    (``request_bias.chain_outcome``); ``acceptance [B, S]``: what the step priced (None: the calibration's
    ``sigmoid(logit(p) / T)``)."""
    p_n = temperatures.numel()
    s = prob.shape[1]
    dev = prob.device
    z = _logit64(prob)
    col = torch.arange(s, device=dev).clamp(max=p_n - 1)
    if acceptance is None:
        a = torch.sigmoid(z / torch.take(temperatures, col).to(torch.float64)[None, :])
    else:
        a = acceptance.to(torch.float32).to(torch.float64)
    r = torch.where(tested, (a - hit.to(torch.float64)) * z, 0.0)
    onehot = (col[:, None] == torch.arange(p_n, device=dev)[None, :]).to(torch.float64)      # [S, P]
    g = r.sum(0) @ onehot
    return g + float(pool) * g.sum()


def update_temperatures(temperatures: torch.Tensor, sq_grad: torch.Tensor, prob: torch.Tensor, tested: torch.Tensor,
                        hit: torch.Tensor, eta: float, acceptance: Optional[torch.Tensor] = None, *,
                        decay: float = DECAY, pool: float = POOL) -> None:
    """One online step (module docstring), in place: ``temperatures [P]`` (the tables' tensor, float32) and
    ``sq_grad [P]`` (the running mean of squared gradients, float32, zeros to start). Arguments as
    ``temperature_gradient``."""
    g = temperature_gradient(temperatures, prob, tested, hit, acceptance, pool)
    g2 = float(decay) * sq_grad.to(torch.float64) + g * g
    w = 1.0 / temperatures.to(torch.float64)
    w = (w - float(eta) * g / (torch.sqrt(g2) + NORM_EPS)).clamp(W_MIN, W_MAX)
    sq_grad.copy_(g2.to(sq_grad.dtype))
    temperatures.copy_((1.0 / w).to(temperatures.dtype))


class OnlineTemperature:
    """The learning state of one engine's model calibration (``ModelCalibrationTables``, shared by every request and
    updated in place): rate ``eta`` (setting ``model_calibration_eta``), the running squared gradients, and the
    temperatures it started from (a calibration file's, or 1)."""

    def __init__(self, tables: ModelCalibrationTables, eta: float):
        if not eta > 0:
            raise ValueError(f"the online temperature's rate must be > 0, got {eta!r}")
        self.tables = tables
        self.eta = float(eta)
        self.sq_grad = torch.zeros_like(tables.temperatures, dtype=torch.float32)
        self.start = tables.temperatures.clone()

    @property
    def temperatures(self) -> torch.Tensor:
        return self.tables.temperatures

    def update(self, prob: torch.Tensor, tested: torch.Tensor, hit: torch.Tensor,
               acceptance: Optional[torch.Tensor] = None) -> None:
        """``update_temperatures`` of the tables from one verify's outcome."""
        update_temperatures(self.tables.temperatures, self.sq_grad, prob, tested, hit, self.eta, acceptance)

    def reset(self) -> None:
        """Back to the starting temperatures, nothing learned (a fresh engine)."""
        self.tables.temperatures.copy_(self.start)
        self.sq_grad.zero_()


class OutcomeBins:
    """Running reliability bins of predictions and outcomes: ``ece`` equals ``calibration_metrics.ece`` over every
    ``add``-ed pair (equal-width bins over [0, 1]), kept in ``n_bins`` sums so a long run records it for free."""

    def __init__(self, n_bins: int = 10):
        self.n_bins = int(n_bins)
        self.count = 0
        self.pred = np.zeros(self.n_bins)
        self.label = np.zeros(self.n_bins)

    def add(self, pred, label) -> None:
        p = np.asarray(pred, dtype=np.float64).reshape(-1)
        y = np.asarray(label, dtype=np.float64).reshape(-1)
        b = np.clip((p * self.n_bins).astype(np.int64), 0, self.n_bins - 1)
        self.pred += np.bincount(b, weights=p, minlength=self.n_bins)
        self.label += np.bincount(b, weights=y, minlength=self.n_bins)
        self.count += p.size

    def merge(self, pred, label, count: int) -> None:
        """Pool another set of bins (its ``pred`` and ``label`` sums per bin and its pair count, as recorded): ``ece``
        is then that of both sets' pairs together."""
        pred, label = np.asarray(pred, dtype=np.float64), np.asarray(label, dtype=np.float64)
        if pred.shape != self.pred.shape or label.shape != self.label.shape:
            raise ValueError(f"bins of another size: {pred.shape} and {label.shape}, these are {self.pred.shape}")
        self.pred += pred
        self.label += label
        self.count += int(count)

    @property
    def ece(self) -> Optional[float]:
        """Expected calibration error of the pairs so far; None before the first."""
        if not self.count:
            return None
        return float(np.abs(self.pred - self.label).sum() / self.count)


__all__ = ["DECAY", "POOL", "W_MAX", "W_MIN", "OnlineTemperature", "OutcomeBins", "temperature_gradient",
           "update_temperatures"]
