"""Buffers the fused step writes into, kept from step to step.

Why: the fused step's outputs and scratch arrays change shape with the batch, the EAGLE depth and the verify width.
Allocating them each step costs nothing on the device (PyTorch's caching allocator hands out cached blocks, no kernel
and no host sync), but a step that allocates nothing once warmed up is what a CUDA graph wants (fixed addresses) and
what the engine issue asks for. A ``Workspace`` keeps one flat buffer per name that grows to the largest size asked
for and hands out contiguous views of its front: after one step at the largest batch, width and depth, no step
allocates again.

Contract: a view stays valid until the same name is taken again, i.e. until the next step; nothing may keep a step's
outputs past it. ``HybridStep`` does not (its ``after_verify`` consumes the step's decision in the same step, and the
worker drops the tree when the step ends).
"""
from __future__ import annotations

import math
from typing import Optional

import torch


class Workspace:
    """Named flat buffers on one device; ``take`` returns a ``shape`` view of the front of ``name``'s buffer."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._bufs: dict = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = torch.empty(max(n, 1), dtype=dtype, device=self.device)
            self._bufs[name] = buf
        return buf[:n].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held (for the start-up log and the memory budget)."""
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def alloc(ws: Optional[Workspace], name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """``ws.take(name, shape, dtype)``, or a fresh tensor without a workspace (standalone calls, tests)."""
    if ws is not None:
        return ws.take(name, shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)
