"""Host side of the n-gram drafter: feed the Rust automaton, propose, publish to the device without blocking.

Why on the host and one step late: the suffix automaton lives in Rust (``sglang_hybrid.ngram.NgramDrafter``); the
committed tokens reach the host only after SGLang's result processing (``req.output_ids``), which under overlap
scheduling trails the device by a step. Each proposal is therefore tagged with the committed length it was computed
at and the slot's generation, and the device aligns it (``alignment.align``) with what was accepted since.

Publishing never waits: rows are written into freshly allocated pinned host tensors and copied with
``non_blocking=True``; PyTorch's caching host allocator does not hand a pinned block out again until the copy that
used it has completed (it records an event per copy), so the next step cannot overwrite data still in flight.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from . import alignment

logger = logging.getLogger(__name__)

_FIELDS = ("tokens", "match_len", "count", "total", "source")


class NgramFeeder:
    def __init__(self, drafter, k: int, device, max_bs: int, donate: bool = True):
        self.drafter = drafter
        self.k = k
        self.device = torch.device(device)
        self.donate = donate
        self._ids: dict = {}      # rid -> drafter id
        self._fed: dict = {}      # rid -> committed tokens fed so far
        self._next_id = 1
        self._pin = self.device.type == "cuda"
        self.max_bs = max_bs

    # -- request lifecycle ---------------------------------------------------------------------------------------
    def _sync_request(self, rid, prompt: Sequence[int], output: Sequence[int], pending: list) -> int:
        """Register ``rid`` or queue its new tokens in ``pending`` (one ``extend_batch`` call per step).

        Host work is O(new tokens): the full context is copied once, when the request first appears; afterwards
        only the output tokens committed since the last call are sliced off ``output``.
        """
        n = len(prompt) + len(output)
        if rid in self._ids and n < self._fed[rid]:
            # The request's committed tokens shrank (retraction and re-prefill): start over.
            self._forget(rid)
        if rid not in self._ids:
            self._ids[rid] = self._next_id
            self._next_id += 1
            tokens = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)])
            self.drafter.start(self._ids[rid], tokens)
        elif n > self._fed[rid]:
            fed_out = self._fed[rid] - len(prompt)
            if fed_out >= 0:
                new = output[fed_out:]
            else:  # cannot happen after a full start, kept for a prompt that grew (chunked prefill)
                new = list(prompt[self._fed[rid]:]) + list(output)
            pending.append((self._ids[rid], new))
        self._fed[rid] = n
        return self._ids[rid]

    def _forget(self, rid) -> None:
        did = self._ids.pop(rid, None)
        self._fed.pop(rid, None)
        if did is not None:
            self.drafter.remove(did)

    def finish(self, rid, natural_stop: bool) -> None:
        """Request finished: donate its response to the shared corpus when it stopped naturally, then free it."""
        did = self._ids.get(rid)
        if did is None:
            return
        self.drafter.finish(did, donate=bool(self.donate and natural_stop))
        self._forget(rid)

    def drop_absent(self, live_rids) -> None:
        """Forget requests that left the decode batch without finishing (retracted or aborted)."""
        for rid in [r for r in self._ids if r not in live_rids]:
            self._forget(rid)

    # -- per step ------------------------------------------------------------------------------------------------
    def stage_batch(self, reqs, generations) -> dict:
        """Feed and propose for ``reqs`` (objects with ``rid``, ``origin_input_ids``, ``output_ids``, in batch order)
        into pinned host tensors tagged with each request's committed length and slot generation."""
        bs = len(reqs)
        if bs > self.max_bs:
            raise ValueError(f"decode batch of {bs} exceeds the n-gram staging capacity {self.max_bs}")
        ids, at, pending = [], [], []
        for req in reqs:
            ids.append(self._sync_request(req.rid, req.origin_input_ids, req.output_ids, pending))
            at.append(self._fed[req.rid])
        if pending:
            self.drafter.extend_batch(np.asarray([p[0] for p in pending], dtype=np.int64),
                                      np.asarray([t for p in pending for t in p[1]], dtype=np.int64),
                                      np.asarray([len(p[1]) for p in pending], dtype=np.int64))
        drafts = self.drafter.propose(np.asarray(ids, dtype=np.int64), self.k)
        rows = torch.empty((bs, len(_FIELDS), self.k), dtype=torch.int64, pin_memory=self._pin)
        for f, name in enumerate(_FIELDS):
            arr = getattr(drafts, name, None)
            if arr is None:  # a drafter without a per-token source reports its own context (0)
                rows[:, f].zero_()
            else:
                rows[:, f].copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64)))
        sc = torch.empty((bs, 3), dtype=torch.int64, pin_memory=self._pin)
        sc[:, 0].copy_(torch.from_numpy(np.ascontiguousarray(drafts.lengths, dtype=np.int64)))
        sc[:, 1].copy_(torch.as_tensor(at, dtype=torch.int64))
        sc[:, 2].copy_(torch.as_tensor(generations, dtype=torch.int64))
        return {"rows": rows, "scalars": sc}

    def publish(self, staged: dict, slots: torch.Tensor, buffers: alignment.ProposalBuffers) -> torch.Tensor:
        """Copy a staged batch to the device (non-blocking), scatter it into the slot buffers; returns the batch's
        current slot generations on the device (for ``alignment.align``)."""
        nb = self._pin
        rows = staged["rows"].to(self.device, non_blocking=nb)
        sc = staged["scalars"].to(self.device, non_blocking=nb)
        alignment.publish(buffers, slots.to(torch.int64), rows[:, 0], sc[:, 0], sc[:, 1], sc[:, 2], rows[:, 1],
                          rows[:, 2], rows[:, 3], rows[:, 4])
        return sc[:, 2]
