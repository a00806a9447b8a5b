"""Calibrated acceptance estimates for draft tokens.

Why: the price compares a draft token's survival with ``lambda``; survival is a product of conditional acceptances, so
those must be *probabilities*, not scores. The n-gram drafter's raw frequency ``count / total`` is a poor one (a
continuation seen once after a 1-token match is right far less often than 1/1 suggests), so we fit a table.

n-gram tokens (``NgramCalibration``): features are bucketed -- source (own context / shared corpus), depth, match
length, ratio ``count / total`` and count -- and each cell holds a hit rate. Fitting is hierarchical Beta smoothing: a
cell's rate is ``(hits + k * parent) / (n + k)`` where ``parent`` is the smoothed rate of the next coarser cell
(full -> without count -> without ratio -> (source, depth) -> source), so sparse cells back off to what coarser data
says. Then weighted pool-adjacent-violators makes the table non-decreasing in match length (a longer matched context
never makes a copy *less* likely to be right). Evaluation on the device is ``bucketize`` + one gather.

Model tokens (``ModelCalibration``): the draft probability ``p`` of the drafted token, rescaled per position in logit
space: ``a = sigmoid(logit(p) / T[depth])``, with ``T`` fit by maximum likelihood (grid + golden-section search).

Both fit on records (``sglang_hybrid.calibration_records``) and report the metrics of
``sglang_hybrid.calibration_metrics``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from . import _checks
from .calibration_metrics import brier, ece

if TYPE_CHECKING:
    from .calibration_records import ModelRecords, NgramRecords

NGRAM_FORMAT = "hybrid-spark-ngram-calibration"
MODEL_FORMAT = "hybrid-spark-model-calibration"
VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "ngram_calibration.json"
DEFAULT_HELDOUT_PATH = Path(__file__).resolve().parent / "data" / "ngram_calibration_heldout.npz"

#: Bucket lower edges (a value falls in the last bucket whose edge is <= value).
DEFAULT_EDGES = {
    "depth": [1, 2, 3, 4, 5, 6, 8, 12],
    "match_len": [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64],
    "ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
    "count": [0, 1, 2, 4, 8, 16],
}
AXES = ("source", "depth", "match_len", "ratio", "count")
N_SOURCES = 2


class CalibrationFileError(ValueError):
    """A calibration file (or dict) is malformed."""


# ------------------------------------------------------------------------------------------------------------------
# fitting helpers
# ------------------------------------------------------------------------------------------------------------------

def pav(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators: the non-decreasing sequence closest to ``y`` in weighted least squares."""
    vals, wts, cnt = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist()):
        vals.append(yi)
        wts.append(wi)
        cnt.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w2 = wts[-2] + wts[-1]
            v2 = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2 if w2 > 0 else (vals[-2] + vals[-1]) / 2
            c2 = cnt[-2] + cnt[-1]
            vals[-2:], wts[-2:], cnt[-2:] = [v2], [w2], [c2]
    return np.repeat(np.asarray(vals), cnt)


# ------------------------------------------------------------------------------------------------------------------
# n-gram calibration
# ------------------------------------------------------------------------------------------------------------------

MIN_STRENGTH, MAX_STRENGTH = 2.0, 1e6


def _moment_strength(n: np.ndarray, h: np.ndarray, parent: np.ndarray) -> float:
    """Beta prior strength ``k`` from the excess spread of child rates around their parent rates.

    ``E[sum_c n_c (r_c - P_c)^2] = tau^2 sum_c n_c + sum_c P_c (1 - P_c)`` for binomial children with true rates
    spread by ``tau^2`` around ``P``; a Beta prior with mean ``P`` and variance ``tau^2`` has ``k = P(1-P)/tau^2 - 1``.
    """
    p = np.broadcast_to(parent, n.shape)
    m = n > 0
    if not m.any():
        return MAX_STRENGTH
    nn, r, pp = n[m], h[m] / n[m], np.clip(p[m], 1e-6, 1 - 1e-6)
    noise = pp * (1 - pp)
    tau2 = (np.sum(nn * (r - pp) ** 2) - np.sum(noise)) / np.sum(nn)
    if tau2 <= 0:
        return MAX_STRENGTH
    k = float(np.average(noise, weights=nn) / tau2 - 1.0)
    return float(np.clip(k, MIN_STRENGTH, MAX_STRENGTH))


def _bucket_np(x: np.ndarray, edges) -> np.ndarray:
    return np.clip(np.searchsorted(np.asarray(edges), x, side="right") - 1, 0, len(edges) - 1)


def _check_edges(edges: dict) -> dict:
    if not isinstance(edges, dict):
        raise CalibrationFileError("'edges' must be an object")
    out = {}
    for k in ("depth", "match_len", "ratio", "count"):
        e = edges.get(k)
        if not isinstance(e, list) or not e:
            raise CalibrationFileError(f"edges[{k!r}] must be a non-empty list")
        a = np.asarray(e, dtype=np.float64)
        if not np.all(np.isfinite(a)) or np.any(np.diff(a) <= 0):
            raise CalibrationFileError(f"edges[{k!r}] must be finite and strictly increasing")
        out[k] = [float(v) if k == "ratio" else int(v) for v in e]
    if out["depth"][0] > 1:
        raise CalibrationFileError("edges['depth'] must start at 1 or below (depth is 1-based)")
    if out["match_len"][0] > 0 or out["count"][0] > 0 or out["ratio"][0] > 0:
        raise CalibrationFileError("edges for match_len, count and ratio must start at 0")
    return out


def _shape(edges: dict) -> tuple:
    return (N_SOURCES, len(edges["depth"]), len(edges["match_len"]), len(edges["ratio"]), len(edges["count"]))


@dataclass
class NgramCalibration:
    """Host-side n-gram acceptance table plus its provenance (see module docstring)."""

    edges: dict
    table: np.ndarray            # float64 [2, n_depth, n_match, n_ratio, n_count]
    samples: np.ndarray          # int64, same shape: records per cell
    corpus: dict = field(default_factory=dict)
    split: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    fit_params: dict = field(default_factory=dict)
    created: str = ""

    def __post_init__(self):
        self.edges = _check_edges(self.edges)
        shape = _shape(self.edges)
        self.table = np.asarray(self.table, dtype=np.float64)
        self.samples = np.asarray(self.samples, dtype=np.int64)
        if self.table.shape != shape:
            raise CalibrationFileError(f"'table' has shape {self.table.shape}, expected {shape} from the edges")
        if self.samples.shape != shape:
            raise CalibrationFileError(f"'samples' has shape {self.samples.shape}, expected {shape}")
        if not np.all(np.isfinite(self.table)) or self.table.min() < 0 or self.table.max() > 1:
            raise CalibrationFileError("'table' values must be finite probabilities in [0, 1]")
        if self.samples.min() < 0:
            raise CalibrationFileError("'samples' must be non-negative counts")

    # -- evaluation ------------------------------------------------------------------------------------------------
    def cell_index_np(self, match_len, count, total, depth, source) -> np.ndarray:
        e = self.edges
        count = np.asarray(count)
        total = np.asarray(total)
        ratio = np.where(total > 0, count / np.maximum(total, 1), 0.0)
        idx = np.clip(np.asarray(source).astype(np.int64), 0, 1)
        for name, x in (("depth", depth), ("match_len", match_len), ("ratio", ratio), ("count", count)):
            idx = idx * len(e[name]) + _bucket_np(np.asarray(x), e[name])
        return idx

    def acceptance_np(self, match_len, count, total, depth, source) -> np.ndarray:
        """Host evaluation; identical numbers to the device tables (up to float32 rounding)."""
        return self.table.reshape(-1)[self.cell_index_np(match_len, count, total, depth, source)]

    def predict(self, rec: NgramRecords) -> np.ndarray:
        return self.acceptance_np(rec.match_len, rec.count, rec.total, rec.depth, rec.source)

    def to(self, device=None) -> "NgramCalibrationTables":
        return NgramCalibrationTables(self, device)

    # -- fitting ---------------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, records: NgramRecords, edges: Optional[dict] = None, prior_strength: Optional[float] = None,
            monotone_match: bool = True, corpus: Optional[dict] = None, split: Optional[dict] = None,
            created: str = "") -> "NgramCalibration":
        """Hierarchical Beta-smoothed hit rates, then PAV over match length (see module docstring).

        ``prior_strength=None`` (default) sets each level's Beta prior strength by empirical Bayes: the spread of the
        child cells around their parents beyond binomial noise (method of moments). An axis that does not change the
        hit rate thus gets a huge prior (its cells collapse onto the parent: low variance); one that matters gets a
        small prior (cells follow their data). A number fixes the strength for every level.
        """
        if len(records) == 0:
            raise ValueError("cannot fit a calibration from zero records")
        if prior_strength is not None and not prior_strength > 0:
            raise ValueError("prior_strength must be positive")
        edges = _check_edges(edges or DEFAULT_EDGES)
        shape = _shape(edges)
        tmp = cls(edges, np.zeros(shape), np.zeros(shape, dtype=np.int64))
        cell = tmp.cell_index_np(records.match_len, records.count, records.total, records.depth, records.source)
        size = int(np.prod(shape))
        n = np.bincount(cell, minlength=size).reshape(shape).astype(np.float64)
        h = np.bincount(cell, weights=records.accepted.astype(np.float64), minlength=size).reshape(shape)
        overall = (h.sum() + 1.0) / (n.sum() + 2.0)
        # coarse -> fine: marginal sums over the trailing axes, each level shrunk towards its parent
        rate = np.full((1,) * len(shape), overall)
        strengths = []
        for level in range(1, len(shape) + 1):
            axes = tuple(range(level, len(shape)))
            nl = n.sum(axis=axes, keepdims=True) if axes else n
            hl = h.sum(axis=axes, keepdims=True) if axes else h
            k = float(prior_strength) if prior_strength is not None else _moment_strength(nl, hl, rate)
            strengths.append(k)
            rate = (hl + k * rate) / (nl + k)
        table = rate
        if monotone_match:
            table = table.copy()
            w = n + strengths[-1]
            flat_t = np.moveaxis(table, 2, -1).reshape(-1, shape[2])
            flat_w = np.moveaxis(w, 2, -1).reshape(-1, shape[2])
            for i in range(flat_t.shape[0]):
                flat_t[i] = pav(flat_t[i], flat_w[i])
            table = np.moveaxis(flat_t.reshape(np.moveaxis(table, 2, -1).shape), -1, 2)
        params = {"method": "hierarchical Beta smoothing (source > depth > match_len > ratio > count)"
                            + (" + weighted PAV over match_len" if monotone_match else ""),
                  "prior_strength": "empirical Bayes per level" if prior_strength is None else float(prior_strength),
                  "level_strengths": dict(zip(AXES, [round(v, 3) for v in strengths])),
                  "records": len(records), "overall_rate": float(overall)}
        # rounded as saved, so metrics computed in memory equal those recomputed from the file
        return cls(edges, np.round(np.clip(table, 0.0, 1.0), 6), n.astype(np.int64), dict(corpus or {}),
                   dict(split or {}), {}, params, created)

    # -- reporting -------------------------------------------------------------------------------------------------
    def evaluate(self, rec: NgramRecords, max_position: int = 8) -> dict:
        """ECE/Brier before (raw ``count/total``) and after (this table): overall, per position, per workload."""
        after = self.predict(rec)
        before = rec.raw_frequency()
        y = rec.accepted.astype(np.float64)

        def block(m):
            return {"n": int(m.sum()), "hit_rate": float(y[m].mean()) if m.any() else float("nan"),
                    "ece_before": ece(before[m], y[m]), "ece_after": ece(after[m], y[m]),
                    "brier_before": brier(before[m], y[m]), "brier_after": brier(after[m], y[m])}

        out = {"overall": block(np.ones(len(rec), dtype=bool)), "per_position": {}, "per_workload": {}}
        for p in range(1, max_position + 1):
            m = rec.depth == p if p < max_position else rec.depth >= p
            if m.any():
                out["per_position"][str(p) if p < max_position else f"{p}+"] = block(m)
        if rec.workload is not None:
            for w in sorted(set(rec.workload.tolist())):
                out["per_workload"][w] = block(rec.workload == w)
        return out

    # -- files -----------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": NGRAM_FORMAT, "version": VERSION, "created": self.created, "corpus": self.corpus,
                "split": self.split, "fit": self.fit_params, "axes": list(AXES), "edges": self.edges,
                "table": np.round(self.table, 6).tolist(), "samples": self.samples.tolist(),
                "metrics": self.metrics}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")

    @classmethod
    def from_json(cls, obj, where: str = "calibration") -> "NgramCalibration":
        _checks.file_header(obj, NGRAM_FORMAT, VERSION, where, CalibrationFileError)
        for key in ("edges", "table", "samples"):
            if key not in obj:
                raise CalibrationFileError(f"{where}: missing field {key!r}")
        if obj.get("axes", list(AXES)) != list(AXES):
            raise CalibrationFileError(f"{where}: 'axes' must be {list(AXES)}")
        for key in ("corpus", "split", "metrics", "fit"):
            if not isinstance(obj.get(key, {}), dict):
                raise CalibrationFileError(f"{where}: {key!r} must be an object")
        try:
            table = np.asarray(obj["table"], dtype=np.float64)
            samples = np.asarray(obj["samples"], dtype=np.float64)
        except (TypeError, ValueError):
            raise CalibrationFileError(f"{where}: 'table' and 'samples' must be rectangular numeric arrays") from None
        try:
            return cls(obj["edges"], table, samples, obj.get("corpus", {}), obj.get("split", {}),
                       obj.get("metrics", {}), obj.get("fit", {}), str(obj.get("created", "")))
        except CalibrationFileError as e:
            raise CalibrationFileError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path=None) -> "NgramCalibration":
        """``path=None`` loads the default shipped with the package."""
        path = Path(path) if path is not None else DEFAULT_PATH
        if not path.is_file():
            raise FileNotFoundError(f"calibration file not found: {path}")
        obj = _checks.read_json(path, CalibrationFileError)
        return cls.from_json(obj, where=str(path))


class NgramCalibrationTables:
    """Device copy of an ``NgramCalibration``; ``acceptance`` is bucketize + one gather (graph safe)."""

    def __init__(self, cal: NgramCalibration, device=None):
        e = cal.edges
        self.depth_edges = torch.as_tensor(e["depth"], dtype=torch.float32, device=device)
        self.match_edges = torch.as_tensor(e["match_len"], dtype=torch.float32, device=device)
        self.ratio_edges = torch.as_tensor(e["ratio"], dtype=torch.float32, device=device)
        self.count_edges = torch.as_tensor(e["count"], dtype=torch.float32, device=device)
        self.shape = _shape(e)
        self.table = torch.as_tensor(cal.table.reshape(-1), dtype=torch.float32, device=device)

    @property
    def device(self):
        return self.table.device

    @staticmethod
    def _bucket(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        return (torch.bucketize(x, edges, right=True) - 1).clamp(min=0, max=edges.numel() - 1)

    def acceptance(self, match_len: torch.Tensor, count: torch.Tensor, total: torch.Tensor, depth: torch.Tensor,
                   source: torch.Tensor, check_values: Optional[bool] = None) -> torch.Tensor:
        """float32 conditional acceptance, same shape as the (integer) feature tensors."""
        names = ["match_len", "count", "total", "depth", "source"]
        ts = [match_len, count, total, depth, source]
        for n, t in zip(names, ts):
            _checks.int_tensor(t, n)
            _checks.shape(t, n, tuple(match_len.shape))
        _checks.same_device(names + ["calibration table"], ts + [self.table])
        if _checks.want_values(check_values, *ts):
            for n, t in zip(names[:3], ts[:3]):
                if t.numel() and bool((t < 0).any()):
                    raise ValueError(f"{n} must be non-negative")
            if source.numel() and bool(((source < 0) | (source > 1)).any()):
                raise ValueError("source must be 0 (own context) or 1 (shared corpus)")
        cf = count.to(torch.float32)
        tf = total.to(torch.float32)
        ratio = torch.where(tf > 0, cf / tf.clamp(min=1.0), torch.zeros_like(cf))
        idx = source.to(torch.int64).clamp(min=0, max=1)
        idx = idx * self.shape[1] + self._bucket(depth.to(torch.float32), self.depth_edges)
        idx = idx * self.shape[2] + self._bucket(match_len.to(torch.float32), self.match_edges)
        idx = idx * self.shape[3] + self._bucket(ratio, self.ratio_edges)
        idx = idx * self.shape[4] + self._bucket(cf, self.count_edges)
        return torch.take(self.table, idx)


# ------------------------------------------------------------------------------------------------------------------
# model-drafter calibration
# ------------------------------------------------------------------------------------------------------------------

#: the clamp on a probability before its logit (the fused decision kernels read the same: ``kernels.decision``)
CAL_EPS = 1e-6


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, CAL_EPS, 1 - CAL_EPS)
    return np.log(p) - np.log1p(-p)


def _nll(z: np.ndarray, y: np.ndarray, t: float) -> float:
    x = z / t
    return float(np.mean(np.logaddexp(0.0, -x) * y + np.logaddexp(0.0, x) * (1 - y)))


def _fit_temperature(z: np.ndarray, y: np.ndarray) -> float:
    """1-D maximum likelihood over log T: coarse grid then golden-section refinement."""
    grid = np.linspace(math.log(0.05), math.log(20.0), 61)
    losses = [_nll(z, y, math.exp(g)) for g in grid]
    i = int(np.argmin(losses))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if _nll(z, y, math.exp(a)) < _nll(z, y, math.exp(b)):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


@dataclass
class ModelCalibration:
    """Per-position temperature in logit space: ``a = sigmoid(logit(p) / T[min(depth, P) - 1])``."""

    temperatures: np.ndarray
    samples: Optional[np.ndarray] = None
    metrics: dict = field(default_factory=dict)
    corpus: dict = field(default_factory=dict)

    def __post_init__(self):
        t = np.asarray(self.temperatures, dtype=np.float64)
        if t.ndim != 1 or t.size == 0:
            raise CalibrationFileError("'temperatures' must be a non-empty list")
        if not np.all(np.isfinite(t)) or t.min() <= 0:
            raise CalibrationFileError("'temperatures' must be finite and positive")
        self.temperatures = t
        self.samples = (np.zeros(t.size, dtype=np.int64) if self.samples is None
                        else np.asarray(self.samples, dtype=np.int64))
        if self.samples.shape != t.shape:
            raise CalibrationFileError("'samples' must have one entry per temperature")

    @classmethod
    def identity(cls, positions: int = 16) -> "ModelCalibration":
        return cls(np.ones(positions))

    def acceptance_np(self, prob, depth) -> np.ndarray:
        p = np.asarray(prob, dtype=np.float64)
        t = self.temperatures[np.clip(np.asarray(depth) - 1, 0, self.temperatures.size - 1)]
        out = 1.0 / (1.0 + np.exp(-_logit(p) / t))
        return np.where(p <= 0, 0.0, np.where(p >= 1, 1.0, out))

    @classmethod
    def fit(cls, records: ModelRecords, positions: int = 16, min_samples: int = 50) -> "ModelCalibration":
        """Per-position ML temperature; positions with fewer than ``min_samples`` records share the pooled fit."""
        if len(records) == 0:
            raise ValueError("cannot fit a calibration from zero records")
        z = _logit(records.prob)
        y = records.accepted.astype(np.float64)
        pos = np.clip(records.depth, 1, positions) - 1
        pooled = _fit_temperature(z, y)
        temps = np.full(positions, pooled)
        counts = np.bincount(pos, minlength=positions)
        for p in range(positions):
            if counts[p] >= min_samples:
                temps[p] = _fit_temperature(z[pos == p], y[pos == p])
        cal = cls(temps, counts)
        after = cal.acceptance_np(records.prob, records.depth)
        cal.metrics = {"train": {"n": len(records), "ece_before": ece(records.prob, y), "ece_after": ece(after, y),
                                 "brier_before": brier(records.prob, y), "brier_after": brier(after, y)}}
        return cal

    def to(self, device=None) -> "ModelCalibrationTables":
        return ModelCalibrationTables(torch.as_tensor(self.temperatures, dtype=torch.float32, device=device))

    def to_json(self) -> dict:
        return {"format": MODEL_FORMAT, "version": VERSION, "temperatures": self.temperatures.tolist(),
                "samples": self.samples.tolist(), "metrics": self.metrics, "corpus": self.corpus}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path) -> "ModelCalibration":
        obj = _checks.read_json(path, CalibrationFileError)
        _checks.file_header(obj, MODEL_FORMAT, VERSION, path, CalibrationFileError)
        if "temperatures" not in obj:
            raise CalibrationFileError(f"{path}: missing field 'temperatures'")
        try:
            return cls(obj["temperatures"], obj.get("samples"), obj.get("metrics", {}), obj.get("corpus", {}))
        except (CalibrationFileError, TypeError, ValueError) as e:
            raise CalibrationFileError(f"{path}: {e}") from None


class ModelCalibrationTables:
    """Device copy of a ``ModelCalibration``."""

    def __init__(self, temperatures: torch.Tensor):
        self.temperatures = temperatures

    @property
    def device(self):
        return self.temperatures.device

    def acceptance(self, prob: torch.Tensor, depth: torch.Tensor, check_values: Optional[bool] = None) -> torch.Tensor:
        """float32 ``sigmoid(logit(p) / T[depth])``; ``p = 0 -> 0`` and ``p = 1 -> 1`` exactly.

        The logs and the sigmoid run in float64, rounded once to float32. Why: torch's CPU kernels take a vectorised
        or a scalar path by a tensor's size and an element's place in it, and in float32 the two differ in the last
        bit, so one probability got two acceptances (an EAGLE chain token and an equally likely alternative beside
        it, priced from tensors of different sizes, no longer tied, and the fused kernels ordered them otherwise);
        float64's last-bit differences almost never survive the rounding."""
        _checks.float_tensor(prob, "prob")
        _checks.int_tensor(depth, "depth")
        _checks.shape(depth, "depth", tuple(prob.shape))
        _checks.same_device(["prob", "depth", "calibration table"], [prob, depth, self.temperatures])
        if _checks.want_values(check_values, prob, depth):
            _checks.probabilities(prob, "prob")
        p = prob.to(torch.float32)
        pos = (depth.to(torch.int64) - 1).clamp(min=0, max=self.temperatures.numel() - 1)
        t = torch.take(self.temperatures, pos)
        pc = p.clamp(CAL_EPS, 1 - CAL_EPS).to(torch.float64)
        a = torch.sigmoid((torch.log(pc) - torch.log1p(-pc)) / t.to(torch.float64)).to(torch.float32)
        return torch.where(p <= 0, torch.zeros_like(a), torch.where(p >= 1, torch.ones_like(a), a))
