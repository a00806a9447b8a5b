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
from typing import Optional, Sequence

import numpy as np
import torch

from . import alignment, context_lookup

logger = logging.getLogger(__name__)

_FIELDS = ("tokens", "match_len", "count", "total", "source")
#: decode steps a request admitted at its prefill is kept while absent from the decode batches (its prefill chunks
#: interleave with decode steps): past that it is forgotten like any absent request (an abort during prefill), and
#: rebuilt at its first decode step should it come
ADMIT_GRACE_STEPS = 256


class NgramFeeder:
    """``context``: also stage each request's whole context for the device prompt lookup's table
    (``context_lookup``), once per slot occupancy (a new request, or one that moved to another slot)."""

    def __init__(self, drafter, k: int, device, max_bs: int, donate: bool = True, context: bool = False):
        self.drafter = drafter
        self.k = k
        self.device = torch.device(device)
        self.donate = donate
        self.context = bool(context)
        self._ids: dict = {}      # rid -> drafter id
        self._fed: dict = {}      # rid -> committed tokens fed so far
        self._ctx_key: dict = {}  # rid -> (slot, generation) its context was staged for
        self._admitted: dict = {}  # rid -> the step count it was admitted at, until its first decode step
        self._steps = 0           # stage_batch calls: decode steps
        self._next_id = 1
        self._pin = self.device.type == "cuda"
        self.max_bs = max_bs

    # -- request lifecycle ---------------------------------------------------------------------------------------
    def _resync(self, rid, prompt: Sequence[int], output: Sequence[int]) -> tuple[int, Optional[list]]:
        """The uncommon cases of ``stage_batch`` (the common one, a known request grown by output tokens, is inlined
        there): register a new request (its full context copied once), start over after the committed tokens shrank
        (retraction and re-prefill), or return the tokens to append when the prompt itself grew. Returns the drafter
        id and the tokens to append (None: nothing)."""
        n = len(prompt) + len(output)
        if rid in self._ids and n < self._fed[rid]:
            self._forget(rid)
        new = None
        if rid not in self._ids:
            self._ids[rid] = self._next_id
            self._next_id += 1
            tokens = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)])
            self.drafter.start(self._ids[rid], tokens)
        elif n > self._fed[rid]:          # fed fewer tokens than the prompt holds: a prompt that grew
            new = list(prompt[self._fed[rid]:]) + list(output)
        self._fed[rid] = n
        return self._ids[rid], new

    def _forget(self, rid) -> None:
        did = self._ids.pop(rid, None)
        self._fed.pop(rid, None)
        self._ctx_key.pop(rid, None)
        self._admitted.pop(rid, None)
        if did is not None:
            self.drafter.remove(did)

    def admit(self, reqs, generations=None, slots=None) -> Optional[dict]:
        """Build the automata of requests new to the drafter (or started over: retraction and re-prefill) from their
        whole context, at their prefill, as soon as the prefill forward is queued; with ``context`` on and the
        requests' ``slots`` and slot ``generations`` given, also stage their contexts for the device prompt lookup
        (returned for ``publish_context``; None when there is none to copy).

        Why: a request's first decode step would otherwise copy its whole context into the drafter and the lookup's
        table on the way to the step's proposals, O(context) (tens of milliseconds for a 32k-token prompt here), in a
        decode step, every running request waiting; at prefill it runs while the device computes that very context.
        Requests the drafter already follows are left to ``stage_batch``, which also handles anything admitted here
        that grows before its first step."""
        for req in reqs:
            rid, prompt, output = req.rid, req.origin_input_ids, req.output_ids
            done = self._fed.get(rid)
            if done is not None and len(prompt) <= done <= len(prompt) + len(output):
                continue
            did, new = self._resync(rid, prompt, output)
            if new:
                self.drafter.extend_batch(np.asarray([did], dtype=np.int64), np.asarray(new, dtype=np.int64),
                                          np.asarray([len(new)], dtype=np.int64))
            self._admitted[rid] = self._steps
        if self.context and slots is not None and generations is not None and len(slots) == len(reqs):
            return self._stage_context(reqs, generations, slots)
        return None

    def finish(self, rid, natural_stop: bool) -> None:
        """Request finished: donate its response to the shared corpus when it stopped naturally, then free it."""
        did = self._ids.get(rid)
        if did is None:
            return
        self.drafter.finish(did, donate=bool(self.donate and natural_stop))
        self._forget(rid)

    def drop_absent(self, live_rids) -> None:
        """Forget requests that left the decode batch without finishing (retracted or aborted), and requests admitted
        at their prefill that have not reached a decode batch within ``ADMIT_GRACE_STEPS`` steps."""
        admitted, now = self._admitted, self._steps
        for rid in [r for r in self._ids if r not in live_rids]:
            if rid in admitted and now - admitted[rid] <= ADMIT_GRACE_STEPS:
                continue                  # still prefilling (its chunks interleave with decode steps)
            self._forget(rid)

    # -- per step ------------------------------------------------------------------------------------------------
    def stage_batch(self, reqs, generations, slots=None) -> dict:
        """Feed and propose for ``reqs`` (objects with ``rid``, ``origin_input_ids``, ``output_ids``, in batch order)
        into pinned host tensors tagged with each request's committed length and slot generation. With ``context``
        on, ``slots`` (the batch's request-pool slots, host ints) is required: contexts new to their slot are staged
        under ``"context"``."""
        bs = len(reqs)
        if bs > self.max_bs:
            raise ValueError(f"decode batch of {bs} exceeds the n-gram staging capacity {self.max_bs}")
        if self.context and (slots is None or len(slots) != bs):
            raise ValueError("the context table needs the batch's slots (one per request)")
        ids, at = [], []
        known, fed = self._ids, self._fed
        self._steps += 1
        admitted = self._admitted
        new_ids, new_tokens, new_lens = [], [], []
        for req in reqs:
            rid, prompt, output = req.rid, req.origin_input_ids, req.output_ids
            done, p = fed.get(rid), len(prompt)
            n = p + len(output)
            if done is not None and p <= done <= n:
                # the common case, inlined (per-step host time): a known request, grown by output tokens (host work
                # O(new tokens): only those are sliced off ``output``)
                did = known[rid]
                new = output[done - p:] if n > done else None
                fed[rid] = n
            else:
                did, new = self._resync(rid, prompt, output)
            if new:
                new_ids.append(did)
                new_tokens.extend(new)
                new_lens.append(len(new))
            if admitted:
                admitted.pop(rid, None)   # decoding now: absent from a later batch means it left
            ids.append(did)
            at.append(n)
        staged_ctx = self._stage_context(reqs, generations, slots) if self.context else None
        if new_ids:
            self.drafter.extend_batch(np.asarray(new_ids, dtype=np.int64), np.asarray(new_tokens, dtype=np.int64),
                                      np.asarray(new_lens, dtype=np.int64))
        drafts = self.drafter.propose(np.asarray(ids, dtype=np.int64), self.k)
        rows = torch.empty((bs, len(_FIELDS), self.k), dtype=torch.int64, pin_memory=self._pin)
        rows_np = rows.numpy()              # the same (pinned) host memory: numpy casts in place, no temporaries
        for f, name in enumerate(_FIELDS):
            arr = getattr(drafts, name, None)
            # a drafter without a per-token source reports its own context (0)
            rows_np[:, f] = 0 if arr is None else arr
        sc = torch.empty((bs, 3), dtype=torch.int64, pin_memory=self._pin)
        sc_np = sc.numpy()
        sc_np[:, 0] = drafts.lengths
        sc_np[:, 1] = at
        sc_np[:, 2] = generations.numpy() if isinstance(generations, torch.Tensor) else generations
        out = {"rows": rows, "scalars": sc}
        if staged_ctx is not None:
            out["context"] = staged_ctx
        return out

    def _stage_context(self, reqs, generations, slots) -> Optional[dict]:
        """Whole contexts of the requests whose (slot, generation) changed since their context was last staged:
        O(context) once per slot occupancy, nothing on later steps (the device appends what it commits)."""
        parts, tags = [], []
        staged = self._ctx_key
        gens = generations.tolist() if hasattr(generations, "tolist") else [int(g) for g in generations]
        for req, key in zip(reqs, zip(slots, gens)):    # host ints: no per-element tensor conversion
            if staged.get(req.rid) == key:
                continue
            staged[req.rid] = key
            parts.append((key[0], np.concatenate([np.asarray(req.origin_input_ids, dtype=np.int64),
                                                  np.asarray(req.output_ids, dtype=np.int64)])))
            tags.append(key)
        if not tags:
            return None
        n = sum(len(t) for _, t in parts)
        flat = torch.empty((3, n), dtype=torch.int64, pin_memory=self._pin)
        flat[0].copy_(torch.from_numpy(np.concatenate([np.full(len(t), s, np.int64) for s, t in parts])))
        flat[1].copy_(torch.from_numpy(np.concatenate([np.arange(len(t), dtype=np.int64) for _, t in parts])))
        flat[2].copy_(torch.from_numpy(np.concatenate([t for _, t in parts])))
        tag = torch.empty((2, len(tags)), dtype=torch.int64, pin_memory=self._pin)
        tag.copy_(torch.as_tensor(tags, dtype=torch.int64).T)
        return {"flat": flat, "tags": tag}

    def publish_context(self, staged_context: Optional[dict], context: context_lookup.ContextTable) -> None:
        """Copy contexts staged at admission (``admit``) into the device prompt lookup's table (non-blocking)."""
        if staged_context is None:
            return
        flat = staged_context["flat"].to(self.device, non_blocking=self._pin)
        tags = staged_context["tags"].to(self.device, non_blocking=self._pin)
        context_lookup.write_context(context, flat[0], flat[1], flat[2], tags[0], tags[1])

    def publish(self, staged: dict, slots: torch.Tensor, buffers: alignment.ProposalBuffers,
                context: Optional[context_lookup.ContextTable] = None) -> torch.Tensor:
        """Copy a staged batch to the device (non-blocking), scatter it into the slot buffers (and staged contexts
        into ``context``); returns the batch's current slot generations on the device (for ``alignment.align``)."""
        nb = self._pin
        rows = staged["rows"].to(self.device, non_blocking=nb)
        sc = staged["scalars"].to(self.device, non_blocking=nb)
        alignment.publish(buffers, slots.to(torch.int64), rows[:, 0], sc[:, 0], sc[:, 1], sc[:, 2], rows[:, 1],
                          rows[:, 2], rows[:, 3], rows[:, 4])
        if context is not None and "context" in staged:
            self.publish_context(staged["context"], context)
        return sc[:, 2]
