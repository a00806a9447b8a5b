"""Acceptance records: the shared format of replay-built data and engine verify logs.

One record per draft token that was actually *tested*, i.e. all earlier tokens on its path were accepted (the accepted
tokens plus the first rejected one), so a record's label estimates the *conditional* acceptance ``a_j``.
``NgramRecords`` carry the n-gram drafter's features (``match_len, count, total, depth, source``), ``ModelRecords``
the model drafter's draft probability and depth; both have the label ``accepted`` and optional ``workload`` (str per
record) and ``doc`` (source text / request id, for held-out splits). Files: ``.npz`` or ``.jsonl`` (one JSON object
per record with those keys).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

NGRAM_COLUMNS = ("match_len", "count", "total", "depth", "source", "accepted")
MODEL_COLUMNS = ("prob", "depth", "accepted")


def _load_columns(path, columns: tuple, dtypes: dict) -> dict:
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    elif path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open() as f:
            for ln, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{ln}: not valid JSON ({e})") from None
        data = {}
        for c in set(columns) | {"workload", "doc"}:
            present = [c in r for r in rows]
            if all(present) and rows:
                data[c] = np.asarray([r[c] for r in rows])
            elif any(present):
                raise ValueError(f"{path}: column {c!r} is present in some records but not all")
        if not rows:
            data = {c: np.zeros(0) for c in columns}
    else:
        raise ValueError(f"{path}: records must be .npz or .jsonl")
    for c in columns:
        if c not in data:
            raise ValueError(f"{path}: records lack column {c!r} (need {', '.join(columns)})")
    out = {c: np.asarray(data[c]).astype(dtypes[c]) for c in columns}
    if "workload" in data:
        out["workload"] = np.asarray(data["workload"]).astype(str)
    if "doc" in data:
        out["doc"] = np.asarray(data["doc"]).astype(np.int64)
    return out


def _save_columns(path, cols: dict) -> None:
    path = Path(path)
    cols = {k: v for k, v in cols.items() if v is not None}
    if path.suffix == ".npz":
        np.savez_compressed(path, **cols)
    elif path.suffix == ".jsonl":
        keys = list(cols)
        with path.open("w") as f:
            for i in range(len(cols[keys[0]])):
                f.write(json.dumps({k: cols[k][i].item() for k in keys}) + "\n")
    else:
        raise ValueError(f"{path}: records must be saved as .npz or .jsonl")


@dataclass
class NgramRecords:
    """One row per tested n-gram draft token. ``doc`` (optional) identifies the source text for the held-out split."""

    match_len: np.ndarray
    count: np.ndarray
    total: np.ndarray
    depth: np.ndarray
    source: np.ndarray
    accepted: np.ndarray
    workload: Optional[np.ndarray] = None
    doc: Optional[np.ndarray] = None

    _DT = {"match_len": np.int32, "count": np.int32, "total": np.int32, "depth": np.int32, "source": np.int8,
           "accepted": np.int8}

    def __post_init__(self):
        n = None
        for c in NGRAM_COLUMNS:
            v = np.asarray(getattr(self, c))
            if v.ndim != 1:
                raise ValueError(f"records column {c!r} must be 1-D, got shape {v.shape}")
            n = v.size if n is None else n
            if v.size != n:
                raise ValueError(f"records column {c!r} has {v.size} rows, expected {n}")
            if v.size and not np.all(np.isfinite(v.astype(np.float64))):
                raise ValueError(f"records column {c!r} contains NaN or infinite values")
            setattr(self, c, v.astype(self._DT[c]))
        for c in ("workload", "doc"):
            v = getattr(self, c)
            if v is not None:
                v = np.asarray(v)
                if v.shape != (n,):
                    raise ValueError(f"records column {c!r} has shape {v.shape}, expected ({n},)")
                setattr(self, c, v.astype(str) if c == "workload" else v.astype(np.int64))
        if n:
            if self.match_len.min() < 0 or self.count.min() < 0 or self.total.min() < 0:
                raise ValueError("records: match_len, count and total must be non-negative")
            if np.any(self.count > self.total):
                raise ValueError("records: count must not exceed total")
            if self.depth.min() < 1:
                raise ValueError("records: depth is 1-based and must be >= 1")
            if not np.isin(self.source, (0, 1)).all():
                raise ValueError("records: source must be 0 (own context) or 1 (shared corpus)")
            if not np.isin(self.accepted, (0, 1)).all():
                raise ValueError("records: accepted must be 0 or 1")

    def __len__(self) -> int:
        return int(self.accepted.size)

    def subset(self, mask: np.ndarray) -> "NgramRecords":
        return NgramRecords(**{c: (None if getattr(self, c) is None else getattr(self, c)[mask])
                               for c in NGRAM_COLUMNS + ("workload", "doc")})

    @classmethod
    def concat(cls, parts: list) -> "NgramRecords":
        parts = list(parts)
        if not parts:
            return cls(*[np.zeros(0) for _ in NGRAM_COLUMNS])
        cols = {c: np.concatenate([getattr(p, c) for p in parts]) for c in NGRAM_COLUMNS}
        for c in ("workload", "doc"):
            if all(getattr(p, c) is not None for p in parts):
                cols[c] = np.concatenate([getattr(p, c) for p in parts])
        return cls(**cols)

    def save(self, path) -> None:
        _save_columns(path, {c: getattr(self, c) for c in NGRAM_COLUMNS + ("workload", "doc")})

    @classmethod
    def load(cls, path) -> "NgramRecords":
        return cls(**_load_columns(path, NGRAM_COLUMNS, cls._DT))

    def raw_frequency(self) -> np.ndarray:
        """The uncalibrated estimate ``count / total`` (0 when ``total == 0``): the 'before' baseline."""
        return np.where(self.total > 0, self.count / np.maximum(self.total, 1), 0.0)


@dataclass
class ModelRecords:
    """One row per tested model-drafter token: draft probability, 1-based depth, accepted."""

    prob: np.ndarray
    depth: np.ndarray
    accepted: np.ndarray
    workload: Optional[np.ndarray] = None
    doc: Optional[np.ndarray] = None

    _DT = {"prob": np.float64, "depth": np.int32, "accepted": np.int8}

    def __post_init__(self):
        self.prob = np.asarray(self.prob, dtype=np.float64)
        self.depth = np.asarray(self.depth).astype(np.int32)
        self.accepted = np.asarray(self.accepted).astype(np.int8)
        n = self.prob.size
        for c in ("prob", "depth", "accepted"):
            if getattr(self, c).shape != (n,):
                raise ValueError(f"records column {c!r} has shape {getattr(self, c).shape}, expected ({n},)")
        if n:
            if not np.all(np.isfinite(self.prob)) or self.prob.min() < 0 or self.prob.max() > 1:
                raise ValueError("records: prob must be finite and lie in [0, 1]")
            if self.depth.min() < 1:
                raise ValueError("records: depth is 1-based and must be >= 1")
            if not np.isin(self.accepted, (0, 1)).all():
                raise ValueError("records: accepted must be 0 or 1")

    def __len__(self) -> int:
        return int(self.prob.size)

    def save(self, path) -> None:
        _save_columns(path, {c: getattr(self, c) for c in MODEL_COLUMNS + ("workload", "doc")})

    @classmethod
    def load(cls, path) -> "ModelRecords":
        return cls(**_load_columns(path, MODEL_COLUMNS, cls._DT))
