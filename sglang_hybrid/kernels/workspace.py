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

Bounded: a name keeps the views of its last ``VIEWS_PER_NAME`` shapes, oldest dropped first, so the handles held are at
most ``VIEWS_PER_NAME`` per name whatever the steps ask for. Most names see a handful of shapes (the batch size, the
verify width and the depth move among few values) and keep hitting their cached views; the FULL_MASK verify mask
where the target backend keeps no buffer of its own (FlashInfer: ``worker.verify_mask_buffer`` answers None) is sized
by ``seq_lens_sum``, a new shape almost every step: each such step builds one fresh view of the same buffer and drops
the oldest cached one, where a cache keyed by every shape ever asked would keep one handle per step for the process's
lifetime. The buffer itself still grows to exactly the largest size asked for (``memory_budget.hybrid_buffer_bytes``
counts it so) and only a larger request replaces it, so the data stay where they were between steps.
"""
from __future__ import annotations

import collections
import math
from typing import Optional

import torch


#: cached views one name keeps (its most recent shapes; see the module's docstring, "Bounded")
VIEWS_PER_NAME = 16


class Workspace:
    """Named flat buffers on one device; ``take`` returns a ``shape`` view of the front of ``name``'s buffer."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._bufs: dict = {}
        #: (name, shape, dtype) -> the view handed out, while ``name``'s buffer stays the same
        self._views: dict = {}
        #: name -> its keys in ``_views``, oldest first (at most ``VIEWS_PER_NAME``)
        self._keys: dict = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (name, tuple(shape), dtype)
        view = self._views.get(key)
        if view is not None:
            return view
        n = math.prod(shape)
        buf = self._bufs.get(name)
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = collections.deque()
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = torch.empty(max(n, 1), dtype=dtype, device=self.device)
            self._bufs[name] = buf
            for k in keys:                  # views of the old buffer
                del self._views[k]
            keys.clear()
        elif len(keys) >= VIEWS_PER_NAME:
            del self._views[keys.popleft()]
        view = buf[:n].view(shape)
        self._views[key] = view
        keys.append(key)
        return view

    @property
    def views_held(self) -> int:
        """Cached view handles (at most ``VIEWS_PER_NAME`` per name; the bounded-growth tests read it)."""
        return len(self._views)

    @property
    def nbytes(self) -> int:
        """Bytes held (for the start-up log and the memory budget)."""
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def alloc(ws: Optional[Workspace], name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """``ws.take(name, shape, dtype)``, or a fresh tensor without a workspace (standalone calls, tests)."""
    if ws is not None:
        return ws.take(name, shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)
