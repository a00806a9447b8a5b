"""Token tiers: the row counts a ragged verify forward is padded to, so that its shapes come from a short fixed list.

Why: a CUDA graph replays one shape. SGLang keys its verify graphs by batch size at one width (``B x W`` rows); a
ragged verify has ``T = sum(n_b)`` rows, any count up to ``B x W``. Capturing a graph per count is out of the
question, so the forward runs at the smallest tier holding ``T``: multiples of 8 up to 128 rows, then 8 tiers per
doubling (under 12.5 % padding above 64 rows, 48 tiers up to 2,048 rows, about as many graphs as SGLang's batch-size
list captures). SGLang's own compact ragged mode keys its graphs by ``bs x W`` over its batch-size list
(``DecodeCudaGraphRunner._build_ragged_verify_token_buckets``): a tier every ``W`` rows for the smallest batches (25
rows at an n-gram chain of 24) and every ``4 W`` to ``8 W`` past 40 requests (100 to 200 rows), where these tiers
step by 8 to 64 rows up to 1,024; the finer tiers are what lets a step of short trees cost its own rows.

The rows past ``T`` belong to no request (``layout.RaggedLayout.rows``): their KV writes go to SGLang's sink slot and
their outputs are never read. On SGLang's Triton backend every ragged verify runs at its tier (the CPU engine's, so
the live suite checks that padding is lossless); the realistic replay (``bench/replay/engine.py``) charges a ragged
verify at this same tier.

Pure Python, no SGLang: the replay imports it.
"""
from __future__ import annotations


def token_tier(tokens: int) -> int:
    """The smallest tier holding ``tokens`` rows: a multiple of 8 up to 128, beyond a multiple of
    ``2 ** (bit_length(tokens - 1) - 4)`` (8 tiers per doubling).

    >>> [token_tier(n) for n in (1, 9, 128, 129, 1000)]
    [8, 16, 128, 144, 1024]
    """
    n = int(tokens)
    if n < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens!r}")
    step = max(8, 1 << max(0, (n - 1).bit_length() - 4))
    return -(-n // step) * step


def tier_rows(tokens: int, max_rows: int) -> int:
    """The rows a ragged verify of ``tokens`` real rows runs: its tier, capped at ``max_rows`` (the largest forward
    the engine sizes for, ``max_bs x W``: a step never holds more real rows, and its buffers hold no more).

    >>> tier_rows(97, 100), tier_rows(9, 100)
    (100, 16)
    """
    if not 1 <= int(tokens) <= int(max_rows):
        raise ValueError(f"a ragged verify of {tokens} rows does not fit the {max_rows} rows the engine sizes for")
    return min(token_tier(tokens), int(max_rows))


def token_tiers(max_rows: int) -> list:
    """Every row count ``tier_rows`` can return under ``max_rows``, ascending: the verify graphs to capture.

    >>> token_tiers(20)
    [8, 16, 20]
    """
    if int(max_rows) < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows!r}")
    out, n = [], 1
    while n <= max_rows:
        t = tier_rows(n, max_rows)
        out.append(t)
        n = t + 1
    return out


__all__ = ["tier_rows", "token_tier", "token_tiers"]
