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
when ``m(e*) >= n_min`` the proposal is ``k`` tokens, token ``j`` = ``c[e* + 1 + (j mod D)]`` with ``D = T - 1 - e*``
the copy's distance: the committed tokens after ``e*``, then, as the host drafter's chains do (docs/ngram.md), the
copy continued over its own drafted tokens (an overlapping copy: the text's own tail repeats as the loop it is).
Features for the calibration, in the host drafter's terms: source 0 (own context), depth ``j + 1``, match length
``M + (j mod D)`` for token ``j`` (the match grows along a copy and falls back where the copy wraps), where ``M`` is
``m(e*)``, or, when that reached ``n_max``, the chosen occurrence's full match length up to ``N_LONG``; ``total`` =
end positions matching at least ``m(e*)`` tokens, ``count`` = those of them followed by the proposed first token
(the same for every token).

Memory: one ``[P, L + 1]`` int32 table (``P`` request-pool slots, ``L`` the context length; the last column is the
trash column for writes past ``L``), the size of SGLang's own ``req_to_token`` table. Writes: the host copies a
request's whole context once, when it first decodes in a slot, and tags the row with the slot's generation
(``write_context``); the device then adds the root and every verify's emitted tokens itself (``write_rows``). A row
whose tag is not the slot's current generation (a reused slot the host has not written yet) gets no proposal, so a
request never copies from the previous occupant's tokens.

Per step the lookup touches each row's real context only: it reads the first ``S`` positions of the batch's rows, the
span ``S`` a host-known bound on the batch's longest committed context rounded up to a power of two (``context_span``;
the worker's bound comes from SGLang's CPU sequence lengths, no device read). It reads nothing at or past a row's
committed tokens, so over any span that covers them it returns exactly what it returns over the whole table; a row
longer than the span gets no proposal (a bound too low costs proposals, never gives a wrong one). Each span is one
static shape, so a compiled or captured step has one variant per power of two. The rows are compared reversed, as
``[B, S, n_max + 1]`` bool windows against their tails (one byte per compared token, and ``argmin`` for the leading
run of matches), in a constant number of operators: about 43 bytes per row and position in all, measured from the
allocator's events (tests/ngram/test_context_lookup.py): 23 MB at B=128 and contexts of 2,049 committed tokens (span
4,096), whatever the table's length (131,072 there). Without a span it reads the whole table: 706 MB at
L=131,072 (3.3 GB before spans, when it compared unreversed int32 windows over the whole table).

All functions are static-shape tensor code without host sync (CUDA-graph and ``torch.compile(fullgraph=True)`` safe).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

#: longest suffix compared at every position (the choice: longest match, then latest occurrence)
N_MAX = 8
#: longest match measured at the chosen occurrence, the calibration's ``match_len`` feature (its top bucket is 64):
#: capped at ``N_MAX`` the feature priced long copies at 0.83 where 0.98 of their tokens were accepted (replay, code)
N_LONG = 64
#: shortest match that yields a proposal, as the host drafter's ``min_match``: the calibration prices short matches
#: low (in the realistic replay 1 beat 2 on code and chat at batch 4 and tied at 128)
N_MIN = 1
#: shortest span ``context_span`` picks (short contexts all share one shape)
SPAN_MIN = 1024


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


def context_span(longest: int, max_len: int) -> int:
    """Columns of the table the lookup reads for a batch whose longest committed context (root included) is
    ``longest``, a host-known int: the smallest power of two >= ``longest`` (at least ``SPAN_MIN``), capped at the
    table's context length ``max_len``.

    Why a ladder: each span is one static shape (one CUDA graph or compiled graph per span, about
    ``log2(max_len / SPAN_MIN) + 1`` of them), while the lookup's work stays within twice the batch's real context
    instead of following the table's maximum."""
    return min(max(SPAN_MIN, 1 << max(int(longest) - 1, 0).bit_length()), max_len)


def _tail(rows: torch.Tensor, tc: torch.Tensor, n_max: int) -> torch.Tensor:
    """``[B, n_max + 1]``: column ``i < n_max`` holds ``c[T - 1 - i]`` (-2 before position 0); column ``n_max`` is the
    sentinel slot ``_match_lengths`` forces to a mismatch (its value is never compared)."""
    i = torch.arange(n_max + 1, device=rows.device)
    pos = tc[:, None] - 1 - i[None, :]
    return torch.where(pos >= 0, torch.gather(rows, 1, pos.clamp(min=0)), -2)


def _match_lengths(rows: torch.Tensor, pat: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
    """``m(e)`` of every end position, in reversed order: ``[B, S]`` int64 whose column ``x`` is ``m(S - 1 - x)``
    (0 where no committed token follows ``e``).

    Why reversed: unfolding the reversed rows gives each window's tokens as ``c[e], c[e - 1], ...`` directly, so the
    comparison with the tail makes the only ``[B, S, n_max + 1]`` intermediate, one bool per token (flipping the
    unreversed windows copied every window as int32, four times those bytes). With the sentinel column forced False,
    the leading run of matches is the first mismatch: ``argmin`` (which returns the first minimal index) over the
    bools viewed as uint8, with no cumulative-product temporaries."""
    span, width = rows.shape[1], pat.shape[1]
    rev = rows.flip(1)                                                  # rev[:, x] = c[S - 1 - x]
    windows = torch.nn.functional.pad(rev, (0, width - 1), value=-3).unfold(1, width, 1)   # token i: c[e - i]
    eq = windows == pat[:, None, :]                                     # [B, S, n_max + 1] bool
    eq.select(2, width - 1).zero_()                                     # the sentinel never matches
    x = torch.arange(span, device=rows.device)[None, :]
    eq.select(2, 0).logical_and_(x >= span + 1 - tc[:, None])           # e <= T - 2: a committed token follows e
    return eq.view(torch.uint8).argmin(2)


def lookup(table: ContextTable, slots: torch.Tensor, seq_lens: torch.Tensor, cur_gen: torch.Tensor, k: int,
           n_min: int = N_MIN, n_max: int = N_MAX, span: Optional[int] = None) -> LookupProposals:
    """The prompt-lookup proposal of each batch row (slot ``slots[b]`` at generation ``cur_gen[b]``, root at position
    ``seq_lens[b]``), by the rule in the module docstring. Rows whose context does not fit the table, or whose row
    was not written for ``cur_gen``, get none.

    ``span`` (host int, ``context_span``): read only the first ``span`` positions of each row; a row with more
    committed tokens gets none (never a proposal from part of its context). The lookup reads nothing at or past a
    row's committed tokens, so any ``span`` at least the batch's longest context returns exactly what the whole
    table does. None: the whole table (callers without a host-known bound)."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    ctx = table.tokens
    big = ctx.shape[1] - 1                                              # the table's context length L
    if span is None:
        span = big
    elif not 1 <= span <= big:
        raise ValueError(f"span must be in [1, {big}] (the table's context length), got {span}")
    idx = slots.to(torch.int64)
    rows = ctx[:, :span].index_select(0, idx)                           # [B, S] int32
    t = seq_lens.to(torch.int64) + 1                                    # committed tokens, root included
    fits = (t <= span) & (table.gen.index_select(0, idx) == cur_gen.to(torch.int64))
    tc = t.clamp(max=span)
    m = _match_lengths(rows, _tail(rows, tc, n_max), tc)                # reversed: column x is e = S - 1 - x
    best = m.amax(1)                                                    # [B]
    e_star = span - 1 - m.argmax(1)                                     # longest, then latest (first in reverse)
    return _proposals(rows, m, tc, best, e_star, fits & (best >= n_min), k, n_max)


def _long_match(rows: torch.Tensor, tc: torch.Tensor, best: torch.Tensor, e_star: torch.Tensor,
                n_max: int) -> torch.Tensor:
    """The calibration's ``match_len`` of token 0: ``best``, or, when that reached ``n_max``, the chosen occurrence's
    full match length up to ``N_LONG`` (one ``[B, N_LONG]`` gather)."""
    i_long = torch.arange(N_LONG, device=rows.device)[None, :]
    at_e, at_t = e_star[:, None] - i_long, tc[:, None] - 1 - i_long
    same = (torch.gather(rows, 1, at_e.clamp(min=0)) == torch.gather(rows, 1, at_t.clamp(min=0))) & (at_e >= 0)
    return torch.where(best >= n_max, same.to(torch.uint8).cumprod(1, dtype=torch.uint8).sum(1, dtype=torch.int64),
                       best)


def _proposals(rows: torch.Tensor, m: torch.Tensor, tc: torch.Tensor, best: torch.Tensor, e_star: torch.Tensor,
               ok: torch.Tensor, k: int, n_max: int) -> LookupProposals:
    """The copy after ``e_star`` (rows ``ok``) and its features, from the reversed match lengths ``m``."""
    dev, span = rows.device, rows.shape[1]
    j = torch.arange(k, device=dev)[None, :]
    length = torch.where(ok, k, 0)
    keep = j < length[:, None]
    # the copy's distance D = T - 1 - e*: a copy that reaches the root goes on with its own first tokens
    jj = j % (tc - 1 - e_star).clamp(min=1)[:, None]
    copied = torch.gather(rows, 1, (e_star[:, None] + 1 + jj).clamp(max=span - 1))    # int32, as the table
    tokens = torch.where(keep, copied.to(torch.int64), -1)
    # occurrences as long as the chosen one; the successor c[e + 1] of column x >= 1 is c[S - x] (column 0, e = S - 1,
    # is never one: no committed token follows it inside the span)
    strong = m == torch.where(best > 0, best, -1)[:, None]
    # column x - 1: c[S - x] is the first copied token (int32 both: no int64 copy of the rows; unused where no copy)
    nxt_is_first = (rows[:, 1:] == copied[:, :1]).flip(1)
    # int32 sums: a bool sum to int64 first copies its input to int64 (8 bytes a position); int32 halves that
    total = strong.sum(1, dtype=torch.int32)
    count = (strong[:, 1:] & nxt_is_first).sum(1, dtype=torch.int32)
    match = _long_match(rows, tc, best, e_star, n_max)
    zero = torch.zeros((rows.shape[0], k), dtype=torch.int64, device=dev)
    return LookupProposals(                                             # where(.., zero) widens the counts to int64
        tokens=tokens, length=length, depth=torch.where(keep, j + 1, 0),
        match_len=torch.where(keep, match[:, None] + jj, 0), count=torch.where(keep, count[:, None], zero),
        total=torch.where(keep, total[:, None], zero), source=zero)


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


__all__ = ["ContextTable", "LookupProposals", "N_LONG", "N_MAX", "N_MIN", "SPAN_MIN", "alloc_context", "context_span",
           "fill_missing", "lookup", "write_context", "write_rows"]
