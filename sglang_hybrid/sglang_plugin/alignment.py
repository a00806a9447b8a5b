"""Device-side alignment of n-gram proposals that the host computed one step (or more) late.

Why: under overlap scheduling the host sees a request's committed tokens only after the device has already moved on
(verify of step t runs while the host processes step t-1). The host therefore computes each n-gram proposal from the
tokens it has, at committed length ``at``, and publishes it into slot-indexed device buffers without waiting. By the
time the device drafts, ``d = committed - at`` more tokens may have been accepted. The proposal is still useful if its
first ``d`` tokens are exactly those accepted tokens: then its tail ``tokens[d:]`` is the proposal for *now*.

Guarantee (what the tests check): a row gets n-gram tokens only if

* the proposal was published for this request (slot generation equals the slot's current generation: a reused slot
  never inherits the previous request's proposal),
* ``0 <= d < length`` (the proposal still reaches past the committed tokens), and
* every one of the ``d`` overlapping tokens equals the committed token at that position (from a per-slot ring of the
  last ``R`` committed tokens, written on the device from the root and the verify output).

Otherwise the row has no n-gram candidate this step (length 0): never a wrong or misaligned one.

All functions are static-shape tensor code without host sync (CUDA-graph and ``torch.compile(fullgraph=True)`` safe).
Positions count committed tokens from 0 (prompt first); at decode time the root token sits at position ``seq_len``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class ProposalBuffers(NamedTuple):
    """Slot-indexed device buffers (``P`` = request-pool size, ``K`` = n-gram width, ``R`` = ring length)."""

    tokens: torch.Tensor     # [P, K] int64, -1 past length
    length: torch.Tensor     # [P] int64
    at: torch.Tensor         # [P] int64: committed length the proposal was computed at
    gen: torch.Tensor        # [P] int64: slot generation it was computed for (-1 = never)
    match_len: torch.Tensor  # [P, K] int64
    count: torch.Tensor      # [P, K] int64
    total: torch.Tensor      # [P, K] int64
    source: torch.Tensor     # [P, K] int64
    ring: torch.Tensor       # [P, R + 1] int64: committed token at position p in column p % R; column R = trash


class AlignedProposals(NamedTuple):
    tokens: torch.Tensor     # [B, K] int64, -1 past length
    length: torch.Tensor     # [B] int64
    depth: torch.Tensor      # [B, K] int64 (1-based, after the shift)
    match_len: torch.Tensor  # [B, K]
    count: torch.Tensor
    total: torch.Tensor
    source: torch.Tensor
    shift: torch.Tensor      # [B] int64: tokens accepted since the proposal (valid rows only, else 0)


def alloc_buffers(pool_size: int, k: int, ring: int, device) -> ProposalBuffers:
    if ring < k:
        raise ValueError(f"ring length ({ring}) must be at least the n-gram width ({k})")

    def z(*shape, fill=0):
        return torch.full(shape, fill, dtype=torch.int64, device=device)

    return ProposalBuffers(z(pool_size, k, fill=-1), z(pool_size), z(pool_size), z(pool_size, fill=-1),
                           z(pool_size, k), z(pool_size, k), z(pool_size, k), z(pool_size, k),
                           z(pool_size, ring + 1, fill=-1))


def publish(buf: ProposalBuffers, slots: torch.Tensor, tokens, length, at, gen, match_len, count, total,
            source) -> None:
    """Write host-computed proposals (already on the device, batch order) into their slots (``index_copy_``)."""
    for dst, src in ((buf.tokens, tokens), (buf.length, length), (buf.at, at), (buf.gen, gen),
                     (buf.match_len, match_len), (buf.count, count), (buf.total, total), (buf.source, source)):
        dst.index_copy_(0, slots, src.to(dst.dtype))


def ring_write_root(buf: ProposalBuffers, slots: torch.Tensor, seq_lens: torch.Tensor,
                    root_tokens: torch.Tensor) -> None:
    """Record the root (last committed token, position ``seq_len``) of each decoding request."""
    r = buf.ring.shape[1] - 1
    buf.ring[slots, seq_lens.to(torch.int64) % r] = root_tokens.to(torch.int64)


def ring_write_emitted(buf: ProposalBuffers, slots: torch.Tensor, seq_lens: torch.Tensor, emitted: torch.Tensor,
                       emit_len: torch.Tensor) -> None:
    """Record a step's emitted tokens ``emitted[b, :emit_len[b]]`` at positions ``seq_len + 1 ...``.

    ``seq_lens`` are the lengths *before* the step (root at ``seq_len``); entries past ``emit_len`` go to the
    trash column.
    """
    r = buf.ring.shape[1] - 1
    b, d = emitted.shape
    j = torch.arange(d, device=emitted.device)[None, :]
    pos = seq_lens.to(torch.int64)[:, None] + 1 + j
    col = torch.where(j < emit_len.to(torch.int64)[:, None], pos % r, r)
    buf.ring[slots[:, None].expand(b, d), col] = emitted.to(torch.int64)


def align(buf: ProposalBuffers, slots: torch.Tensor, cur_gen: torch.Tensor, seq_lens: torch.Tensor) -> AlignedProposals:
    """Proposals for the batch rows (slots ``slots``, current generations ``cur_gen``, decode ``seq_lens``)."""
    slots = slots.to(torch.int64)
    k = buf.tokens.shape[1]
    r = buf.ring.shape[1] - 1
    dev = buf.tokens.device
    committed = seq_lens.to(torch.int64) + 1                # root included
    tokens = buf.tokens[slots]                              # [B, K]
    length = buf.length[slots]
    at = buf.at[slots]
    d = committed - at                                      # [B]
    j = torch.arange(k, device=dev)[None, :]
    # Overlap: proposal token j (j < d) must equal the committed token at position at + j.
    ring_rows = buf.ring[slots]                             # [B, R + 1]
    committed_tok = torch.gather(ring_rows, 1, (at[:, None] + j) % r)
    overlap_ok = ((committed_tok == tokens) | (j >= d[:, None])).all(1)
    ok = (buf.gen[slots] == cur_gen.to(torch.int64)) & (d >= 0) & (d < length) & (d <= r) & overlap_ok
    shift = torch.where(ok, d, 0)
    src = (j + shift[:, None]).clamp(max=k - 1)
    new_len = torch.where(ok, length - shift, 0)
    keep = j < new_len[:, None]

    def take(x, fill):
        return torch.where(keep, torch.gather(x[slots], 1, src), fill)

    return AlignedProposals(
        tokens=torch.where(keep, torch.gather(tokens, 1, src), -1),
        length=new_len,
        depth=torch.where(keep, j + 1, 0).expand(slots.shape[0], k),
        match_len=take(buf.match_len, 0), count=take(buf.count, 0), total=take(buf.total, 0),
        source=take(buf.source, 0), shift=shift)
