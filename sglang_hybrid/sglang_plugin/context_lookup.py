"""Device-side prompt lookup over each request's committed tokens: a fresh n-gram candidate for the rows whose late
host proposal did not align.

Why: under overlap scheduling the host's n-gram proposal is one step late, and ``alignment.align`` keeps it only when
the tokens accepted since are its own first tokens. Exactly where a fresh proposal pays most, it is lost: after an
edit point (the copy resumes elsewhere in the prompt) or after a step that accepted the model chain instead. In the
realistic replay fresh proposals on those rows were worth 3-7 % of throughput (docs/benchmarks.md). The device has
every committed token as soon as the verify ends, so a lookup there is never late.

Rule (prompt lookup, longest then latest): with committed tokens ``c[0..T)`` (``T = seq_len + 1``, the root last),
each end position ``e <= T - 2`` (at least one committed token follows it) has match length
``m(e) = max{n <= n_max : c[e - i] == c[T - 1 - i] for all i < n}``. The chosen ``e*`` maximises ``(m(e), e)``;
when ``m(e*) >= n_min`` the proposal is ``c[e* + 1 : min(e* + 1 + k, T)]`` (only committed tokens are copied).
Features for the calibration, in the host drafter's terms: source 0 (own context), depth ``j + 1``, match length
``M + j`` for token ``j`` (the match grows along a copy), where ``M`` is ``m(e*)``, or, when that reached ``n_max``,
the chosen occurrence's full match length up to ``N_LONG``; ``total`` = end positions matching at least ``m(e*)``
tokens, ``count`` = those of them followed by the proposed first token (the same for every token).

Memory: one ``[P, L + 1]`` int32 table (``P`` request-pool slots, ``L`` the context length; the last column is the
trash column for writes past ``L``), the size of SGLang's own ``req_to_token`` table. Writes: the host copies a
request's whole context once, when it first decodes in a slot, and tags the row with the slot's generation
(``write_context``); the device then adds the root and every verify's emitted tokens itself (``write_rows``). A row
whose tag is not the slot's current generation (a reused slot the host has not written yet) gets no proposal, so a
request never copies from the previous occupant's tokens. Per step the lookup compares ``[B, L, n_max]`` windows of
the batch's rows with their tails in a constant number of operators (bool and uint8 intermediates of ``B L n_max``
bytes: 34 MB each at B=128, L=32k, n_max=8).

All functions are static-shape tensor code without host sync (CUDA-graph and ``torch.compile(fullgraph=True)`` safe).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

#: longest suffix compared at every position (the choice: longest match, then latest occurrence)
N_MAX = 8
#: longest match measured at the chosen occurrence, the calibration's ``match_len`` feature (its top bucket is 64):
#: capped at ``N_MAX`` the feature priced long copies at 0.83 where 0.98 of their tokens were accepted (replay, code)
N_LONG = 64
#: shortest match that yields a proposal, as the host drafter's ``min_match``: the calibration prices short matches
#: low (in the realistic replay 1 beat 2 on code and chat at batch 4 and tied at 128)
N_MIN = 1


class LookupProposals(NamedTuple):
    """Per batch row: ``tokens [B, K]`` (-1 past length), ``length [B]``, and the calibration features ``depth``,
    ``match_len``, ``count``, ``total``, ``source`` (``[B, K]``, 0 past length)."""

    tokens: torch.Tensor
    length: torch.Tensor
    depth: torch.Tensor
    match_len: torch.Tensor
    count: torch.Tensor
    total: torch.Tensor
    source: torch.Tensor


class ContextTable(NamedTuple):
    """``tokens [P, L + 1]`` int32 (committed token at each position, -1 = never written; column ``L`` = trash) and
    ``gen [P]`` int64 (the slot generation the host wrote the row for, -1 = never)."""

    tokens: torch.Tensor
    gen: torch.Tensor


def alloc_context(pool_size: int, max_len: int, device) -> ContextTable:
    """An empty table for ``pool_size`` slots of up to ``max_len`` committed tokens."""
    if pool_size < 1 or max_len < 2:
        raise ValueError(f"context table needs pool_size >= 1 and max_len >= 2, got {pool_size}, {max_len}")
    return ContextTable(torch.full((pool_size, max_len + 1), -1, dtype=torch.int32, device=device),
                        torch.full((pool_size,), -1, dtype=torch.int64, device=device))


def _put(ctx: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor, keep, tokens: torch.Tensor) -> None:
    """``ctx[slot, pos] = tokens`` (broadcast shapes) where ``keep`` (None: everywhere) and ``pos`` is inside the
    table; the rest goes to the trash column. One flat index, no broadcast index tensors: the same operators at every
    batch size."""
    width = ctx.shape[1]
    inside = pos < width - 1
    col = torch.where(inside if keep is None else keep & inside, pos, width - 1)
    flat = (slot.to(torch.int64) * width + col).flatten()
    ctx.view(-1).index_copy_(0, flat, tokens.to(ctx.dtype).flatten())


def write_context(table: ContextTable, slot: torch.Tensor, pos: torch.Tensor, tokens: torch.Tensor,
                  tag_slots: torch.Tensor, tag_gens: torch.Tensor) -> None:
    """Write ``tokens[i]`` at ``(slot[i], pos[i])`` (1-d, same length; positions past the table go to the trash
    column) and tag rows ``tag_slots`` with generations ``tag_gens``. The host's path: a request's whole context,
    once per slot occupancy."""
    _put(table.tokens, slot, pos.to(torch.int64), None, tokens)
    table.gen.index_copy_(0, tag_slots.to(torch.int64), tag_gens.to(torch.int64))


def write_rows(table: ContextTable, slots: torch.Tensor, start: torch.Tensor, tokens: torch.Tensor,
               n: torch.Tensor) -> None:
    """Write ``tokens[b, :n[b]]`` at positions ``start[b], start[b] + 1, ...`` of slot ``slots[b]``; the rest of each
    row, and positions past the table, go to the trash column. The device's path: the root and each verify's
    emitted tokens."""
    j = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
    _put(table.tokens, slots[:, None], start.to(torch.int64)[:, None] + j, j < n.to(torch.int64)[:, None], tokens)


def lookup(table: ContextTable, slots: torch.Tensor, seq_lens: torch.Tensor, cur_gen: torch.Tensor, k: int,
           n_min: int = N_MIN, n_max: int = N_MAX) -> LookupProposals:
    """The prompt-lookup proposal of each batch row (slot ``slots[b]`` at generation ``cur_gen[b]``, root at position
    ``seq_lens[b]``), by the rule in the module docstring. Rows whose context does not fit the table, or whose row
    was not written for ``cur_gen``, get none."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    ctx = table.tokens
    dev = ctx.device
    b = slots.shape[0]
    width = ctx.shape[1]
    big = width - 1                                                     # the table's context length L
    rows = ctx.index_select(0, slots.to(torch.int64))                   # [B, L + 1] int32
    t = seq_lens.to(torch.int64) + 1                                    # committed tokens, root included
    fits = (t <= big) & (table.gen.index_select(0, slots.to(torch.int64)) == cur_gen.to(torch.int64))
    tc = t.clamp(max=big)
    i = torch.arange(n_max, device=dev)
    pat_pos = tc[:, None] - 1 - i[None, :]                              # c[T - 1 - i]
    pat = torch.where(pat_pos >= 0, torch.gather(rows, 1, pat_pos.clamp(min=0)), -2)      # [B, n_max]
    e = torch.arange(width, device=dev)[None, :]
    # window e holds c[e - n_max + 1 .. e] (positions before 0 never match); reversed, token s of it is c[e - s]
    windows = torch.nn.functional.pad(rows, (n_max - 1, 0), value=-3).unfold(1, n_max, 1).flip(-1)  # [B, L+1, n]
    eq = (windows == pat[:, None, :]).to(torch.uint8)
    m = eq.cumprod(-1, dtype=torch.uint8).sum(-1, dtype=torch.int64)   # leading run of matches = m(e)
    m = torch.where(e <= tc[:, None] - 2, m, 0)                         # a committed token must follow e
    best = m.amax(1)                                                    # [B]
    e_star = torch.argmax(m * width + e, 1)                             # longest, then latest
    # the chosen occurrence's full match length, up to N_LONG (one [B, N_LONG] gather): the calibration's feature
    i_long = torch.arange(N_LONG, device=dev)[None, :]
    at_e, at_t = e_star[:, None] - i_long, tc[:, None] - 1 - i_long
    same = (torch.gather(rows, 1, at_e.clamp(min=0)) == torch.gather(rows, 1, at_t.clamp(min=0))) & (at_e >= 0)
    match = torch.where(best >= n_max, same.to(torch.uint8).cumprod(1, dtype=torch.uint8).sum(1, dtype=torch.int64),
                        best)
    ok = fits & (best >= n_min)
    j = torch.arange(k, device=dev)[None, :]
    src = e_star[:, None] + 1 + j
    length = torch.where(ok, (tc - 1 - e_star).clamp(min=0, max=k), 0)
    keep = j < length[:, None]
    tokens = torch.where(keep, torch.gather(rows, 1, src.clamp(max=width - 1)).to(torch.int64), -1)
    nxt = torch.nn.functional.pad(rows[:, 1:], (0, 1), value=-3)        # c[e + 1]
    strong = (m >= best[:, None]) & (m > 0)
    total = strong.sum(1)
    count = (strong & (nxt == tokens[:, :1])).sum(1)
    zero = torch.zeros((b, k), dtype=torch.int64, device=dev)
    return LookupProposals(
        tokens=tokens, length=length, depth=torch.where(keep, j + 1, 0),
        match_len=torch.where(keep, match[:, None] + j, 0), count=torch.where(keep, count[:, None], 0),
        total=torch.where(keep, total[:, None], 0), source=zero)


def fill_missing(aligned, got: LookupProposals):
    """Rows of ``aligned`` (``alignment.AlignedProposals``) without a proposal take the lookup's ``got`` (same rows,
    same width). Returns the merged proposals and the rows the lookup supplied (bool ``[B]``). The worker
    (``HybridStep``) and the replay both merge through here."""
    use = aligned.length == 0
    pick = lambda a, b: torch.where(use.reshape(-1, *([1] * (a.dim() - 1))), b, a)  # noqa: E731
    merged = type(aligned)(
        tokens=pick(aligned.tokens, got.tokens), length=pick(aligned.length, got.length),
        depth=pick(aligned.depth, got.depth), match_len=pick(aligned.match_len, got.match_len),
        count=pick(aligned.count, got.count), total=pick(aligned.total, got.total),
        source=pick(aligned.source, got.source), shift=aligned.shift)
    return merged, use & (got.length > 0)


__all__ = ["ContextTable", "LookupProposals", "N_LONG", "N_MAX", "N_MIN", "alloc_context", "fill_missing", "lookup",
           "write_context", "write_rows"]
