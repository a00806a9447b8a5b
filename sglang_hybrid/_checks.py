"""Input checks shared by the per-step core functions.

Metadata checks (shape, dtype, device) are free and always run. Value checks (NaN, ranges) need the data on the host,
so they run only when asked, or by default when the tensors already live on the CPU and we are not being traced by
``torch.compile`` -- the GPU / CUDA-graph path never pays a host sync for them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import torch

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def positive_or_none(value: str) -> Optional[float]:
    """A command-line setting that is a number > 0 or 'none' (the feature off); ValueError otherwise."""
    if value.lower() == "none":
        return None
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise ValueError(f"must be > 0 or 'none', got {value!r}")
    return x


def read_json(path, error: type[Exception]):
    """Parse a JSON file, turning a syntax error into ``error`` naming the file (a missing file stays an OSError)."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e})") from None


def file_header(obj, fmt: str, version: int, where, error: type[Exception]) -> dict:
    """The shared front of every versioned JSON file we read (calibration, cost table): a JSON object whose
    ``format`` and ``version`` match, else ``error`` naming the file and the field."""
    if not isinstance(obj, dict):
        raise error(f"{where}: top level must be a JSON object")
    if obj.get("format") != fmt:
        raise error(f"{where}: 'format' must be {fmt!r}, got {obj.get('format')!r}")
    if obj.get("version") != version:
        raise error(f"{where}: unsupported 'version' {obj.get('version')!r} (expected {version})")
    return obj


def want_values(check_values: Optional[bool], *tensors: torch.Tensor) -> bool:
    """Resolve ``check_values=None`` to "on CPU and not compiling"."""
    if check_values is not None:
        return bool(check_values)
    if torch.compiler.is_compiling():
        return False
    return all(t.device.type == "cpu" for t in tensors)


def tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def int_tensor(x, name: str, ndim: Optional[int] = None) -> torch.Tensor:
    tensor(x, name)
    if x.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    return x


def float_tensor(x, name: str, ndim: Optional[int] = None) -> torch.Tensor:
    tensor(x, name)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    return x


def same_device(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    dev = tensors[0].device
    for n, t in zip(names, tensors):
        if t.device != dev:
            raise ValueError(f"{n} is on {t.device} but {names[0]} is on {dev}: all inputs must share one device")


def shape(x: torch.Tensor, name: str, expected: Sequence[int]) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(expected)}")


def probabilities(x: torch.Tensor, name: str) -> None:
    """Host-side value check: finite and within [0, 1]."""
    if x.numel() == 0:
        return
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got values in [{lo}, {hi}]")


def lengths(x: torch.Tensor, name: str, width: int) -> None:
    if x.numel() == 0:
        return
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi > width:
        raise ValueError(f"{name} must lie in [0, {width}], got values in [{lo}, {hi}]")


def non_empty_batch(b: int, name: str) -> None:
    if b == 0:
        raise ValueError(f"{name} has an empty batch (B = 0)")
