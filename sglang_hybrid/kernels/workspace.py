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

A ``take`` at a (name, shape, dtype) asked for before returns the same view object, not a new one: the worker runs the
step eagerly, its host time is its cost (the H200 device run profiled 26 takes per step among the largest Python
costs, docs/benchmarks.md section 4), and a cached view costs a dict lookup where slicing and viewing cost two
tensor constructions. Callers may write a view's elements, never change its metadata in place (``resize_``,
``transpose_``...): the next step would receive the changed view.
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
        #: (name, shape, dtype) -> the view handed out, while ``name``'s buffer stays the same
        self._views: dict = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (name, tuple(shape), dtype)
        view = self._views.get(key)
        if view is not None:
            return view
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = torch.empty(max(n, 1), dtype=dtype, device=self.device)
            self._bufs[name] = buf
            self._views = {k: v for k, v in self._views.items() if k[0] != name}   # views of the old buffer
        view = buf[:n].view(shape)
        self._views[key] = view
        return view

    @property
    def nbytes(self) -> int:
        """Bytes held (for the start-up log and the memory budget)."""
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def alloc(ws: Optional[Workspace], name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """``ws.take(name, shape, dtype)``, or a fresh tensor without a workspace (standalone calls, tests)."""
    if ws is not None:
        return ws.take(name, shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)
