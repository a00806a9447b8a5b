"""The device prompt lookup's memory bound, shared by ``tests/ngram/test_context_lookup.py`` (the lookup alone) and
``tests/plugin/test_sglang_alignment.py`` (through the decode step): the bytes a call allocates, the bound, and the
batch it is checked on."""
from __future__ import annotations

import torch

from sglang_hybrid.sglang_plugin import context_lookup as CL


def bytes_allocated(fn):
    """(bytes the CPU allocator handed out while ``fn`` ran, counting every allocation whether freed or not, and
    ``fn``'s result): the profiler's allocator events, so temporaries inside operators count too (a bool ``sum``
    copies its input to int64 first; a count of the tensors the code creates would miss that)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    return sum(e.nbytes() for e in events if e.nbytes() > 0), out


#: the engine issue's target: per step, at most this many bytes at B=128, L=131,072, contexts of 2,048 tokens
LOOKUP_BYTES_BOUND = 64 * 10**6
B_BIG, L_BIG, CONTEXT_BIG = 128, 131072, 2048


def big_batch():
    """B=128 rows of a table of L=131,072 positions, each with 2,048 tokens in the KV cache and the root (2,049
    committed: the worst case for a 2,048-token context, its span is 4,096), a few shorter."""
    g = torch.Generator().manual_seed(0)
    table = CL.alloc_context(B_BIG, L_BIG, "cpu")
    table.tokens[:, :CONTEXT_BIG + 1] = torch.randint(0, 50, (B_BIG, CONTEXT_BIG + 1), generator=g, dtype=torch.int32)
    table.gen.zero_()
    seq_lens = torch.full((B_BIG,), CONTEXT_BIG)
    seq_lens[::7] = torch.randint(1, CONTEXT_BIG, seq_lens[::7].shape, generator=g)
    return table, torch.arange(B_BIG), seq_lens, torch.zeros(B_BIG, dtype=torch.int64)
