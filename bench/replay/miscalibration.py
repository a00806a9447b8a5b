"""A model drafter of unknown calibration: the replay's two knobs that take away the simulated head's honesty.

Why: the simulated drafter (`bench.replay.synth`) is calibrated by construction (P(right | confidence c) = c) and its
tokens' outcomes are independent given their confidences. A deployed head is neither: its softmax can be over- or
under-confident, and acceptance comes in runs (a request, or a stretch of it, the head knows well, then one it does
not). HYBRID prices the head's chain against the n-gram chain on one scale, so a head that lies about its odds is the
approach's main real-world risk. The knobs:

* **confidence temperature** ``T`` (`distort`): the probability the engine sees is ``sigmoid(logit(c) / T)`` of the
  true one ``c``; T < 1 over-confident, T > 1 under-confident, T = 1 honest. It applies to the chain's probabilities
  and to the alternatives' (`distorted`); whether a token is right is unchanged. A real trace's recorded
  probabilities are distorted the same way (their own calibration is whatever the head's is).
* **bursty acceptance** ``rho`` (`bursty_uniforms`): the uniform a token's right/wrong draw compares with its
  confidence is ``Phi(sqrt(rho) z + sqrt(1 - rho) e)``, where ``z`` is a per-request AR(1) series over output
  positions (persistence `BURST_PERSISTENCE`) shared by every token of a chain and ``e`` is the token's own noise:
  each draw is still uniform, so every token's acceptance keeps its mean, but outcomes are correlated along a chain
  and across steps.

The trees of the EAGLE tree baseline are grown from the true probabilities (a distorted head would rank some nodes
differently; this favours the baseline).
"""
from __future__ import annotations

import copy

import numpy as np

#: the temperatures the realistic run's miscalibration sweep runs (`bench.replay.realistic`)
TEMPERATURES = (0.5, 0.7, 1.0, 1.5, 2.0)
#: the bursty sweep point's correlation (the share of a draw's variance a request's slowly moving state explains)
BURST_RHO = 0.5
#: the request state's step-to-step persistence: a burst lasts about 1 / (1 - persistence) = 20 output positions
BURST_PERSISTENCE = 0.95


def distort(p, temperature: float) -> np.ndarray:
    """``sigmoid(logit(p) / T)`` elementwise as float32; 0 and 1 stay exactly (a dead chain position stays dead)."""
    p = np.asarray(p, np.float64)
    if temperature <= 0:
        raise ValueError(f"confidence temperature must be > 0, got {temperature}")
    q = np.clip(p, 1e-6, 1 - 1e-6)
    out = 1.0 / (1.0 + np.exp(-(np.log(q) - np.log1p(-q)) / float(temperature)))
    return np.where(p <= 0, 0.0, np.where(p >= 1, 1.0, out)).astype(np.float32)


class DistortedAlternatives:
    """A drafter's alternatives (anything with ``alternatives(req, pos, depth, m)``) with their probabilities
    distorted by `distort` at ``temperature``."""

    def __init__(self, inner, temperature: float):
        self.inner, self.temperature = inner, float(temperature)

    def alternatives(self, req, pos, depth: int, m: int) -> tuple:
        toks, probs = self.inner.alternatives(req, pos, depth, m)
        return toks, distort(probs, self.temperature)


def distorted(bank, temperature: float):
    """A view of ``bank`` (its drafts shared, `copy.copy`) whose EAGLE chain and alternatives report probabilities
    distorted at ``temperature``; T = 1 returns ``bank`` itself."""
    if float(temperature) == 1.0:
        return bank
    b = copy.copy(bank)
    b.eagle_probs = distort(bank.eagle_probs, temperature)
    alt = getattr(bank, "eagle_alt", None)
    b.eagle_alt = DistortedAlternatives(alt, temperature) if alt is not None else None
    return b


def bursty_uniforms(rng, lengths, k: int, rho: float, persistence: float = BURST_PERSISTENCE) -> np.ndarray:
    """Uniform draws ``[sum(lengths), k]`` (rows in the bank's order: each request's positions in turn) correlated
    as the module docstring says; ``rho = 0``: independent uniforms."""
    from scipy import signal, stats

    rows = int(np.sum(lengths))
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"burst correlation rho must be in [0, 1), got {rho}")
    if rho == 0.0:
        return rng.random((rows, k))
    z = np.empty(rows)
    off = 0
    scale = np.sqrt(1.0 - persistence ** 2)
    for n in np.asarray(lengths, np.int64):
        # AR(1) with unit stationary variance, started from its stationary distribution
        start = persistence * rng.standard_normal()
        z[off:off + n] = signal.lfilter([scale], [1.0, -persistence], rng.standard_normal(int(n)), zi=[start])[0]
        off += n
    g = np.sqrt(rho) * z[:, None] + np.sqrt(1.0 - rho) * rng.standard_normal((rows, k))
    return stats.norm.cdf(g)
