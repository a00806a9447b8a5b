"""Calibration metrics: how far predicted acceptance probabilities are from the observed outcomes.

Used by the calibrators' own reports (``NgramCalibration.evaluate``, ``ModelCalibration.fit``) and by the tools that
check them (``sglang_hybrid.tools.calibrate``, ``sglang_hybrid.tools.calibration_check``).
"""
from __future__ import annotations

import numpy as np


def ece(pred, label, n_bins: int = 10) -> float:
    """Expected calibration error: equal-width bins over [0, 1], weighted mean |mean(pred) - mean(label)|."""
    p = np.asarray(pred, dtype=np.float64)
    y = np.asarray(label, dtype=np.float64)
    if p.size == 0:
        return float("nan")
    b = np.clip((p * n_bins).astype(np.int64), 0, n_bins - 1)
    sp = np.bincount(b, weights=p, minlength=n_bins)
    sy = np.bincount(b, weights=y, minlength=n_bins)
    return float(np.abs(sp - sy).sum() / p.size)


def brier(pred, label) -> float:
    p = np.asarray(pred, dtype=np.float64)
    y = np.asarray(label, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else float("nan")
