"""The target verify's step-time table, measured at start, so HYBRID has a price out of the box.

Why: without a cost table the price is zero and every request verifies its whole tree (``n_nodes + 1`` slots) every
step. While a batch is memory-bound that costs nothing; on a busy server it does: in the realistic replay
(SIMULATED, docs/benchmarks.md section 1) at batch 128 on code, the full tree every step reached 3.36x over no
speculation and the launch with this table 4.28x, the best fixed-k EAGLE chain 3.22x; on chat at batch 32, 1.40x,
2.14x and 2.17x. A table profiled by hand (``python -m sglang_hybrid.tools.cost_profile``) is one more step a
user must know about; so when none is given (setting ``cost_table``), the worker measures one at start (setting
``measure_cost_table``).

What it times: SGLang's own dummy forward (``BaseRunner._dummy_run``, the forward SGLang runs at start to warm up and
autotune kernels): a TARGET_VERIFY forward of ``B`` requests x the full verify width ``W`` (SGLang's dummy verify
input: every request at the same context, its KV read from and written to the pool's padding slot; the mask a
chain's tree, ``chain_mask``, in place of SGLang's all-ones dummy, which shows nodes their descendants), logits for
every row as a real verify computes them. One forward
per batch size in ``probe_batch_sizes`` (powers of two up to the running-request limit, and the limit), ``ROUNDS``
times round robin after one warm-up forward, the minimum per size (``cost.profile_interleaved``), the device
synchronised around each. The table's sizes are ``B x W`` batch tokens, the
``T(n)`` of ``sglang_hybrid.cost``; below ``W`` it is flat (the price then takes the narrowest verify as free), past
its end the last slope continues.

Every request of the probe sits at ``PROFILE_CONTEXT`` tokens, or half the context length where that is shorter:
verify attention grows with the context, and a table measured at a context of one (SGLang's capture value) would price
a long-context server's verify tokens below their cost; the price wants a typical step, not the worst one, and a
request spends its life between its prompt and the end of its window, so a short window is probed half full.

What it does not time: verify CUDA graphs. The probe runs eager, so on a GPU with graphs the table overstates the
small batches, where host launch overhead dominates an eager forward (a conservative price: it trims trees a little
more than a captured graph's true cost would); ``python -m sglang_hybrid.tools.cost_profile`` builds a table from
SGLang's one-batch benchmark, graphs included, for a user who wants that. The draft forward's table (adaptive EAGLE
depth, setting ``draft_cost_table``) is not measured: each extra depth adds a draft part (its draft decode backend and
graph set, 0.4-1.1 GiB for Llama-3.1-8B at 128 requests and a 131,072-token context; docs/sglang.md, "Start-up memory
budget") that would compete with the width buckets for the free memory, so adaptive depth stays a choice the user
makes.

Tensor parallelism: every rank runs the same probes in the same order (the forward's collectives need all of them);
rank 0's table is the one that decides (its trees are broadcast), the others are measured alike and logged.
"""
from __future__ import annotations

import logging
import time

import torch

from sglang_hybrid.cost import CostModel, profile_interleaved

logger = logging.getLogger(__name__)

#: context tokens of every request in the probe forwards (at most half the context length): the replay's GPU
#: roofline prices with the same typical context (``bench.replay --gpu-context``, default 2048)
PROFILE_CONTEXT = 2048
#: timed forwards per batch size (round robin over the sizes, the minimum), after one warm-up forward
ROUNDS = 2


def probe_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, and ``max_batch``: ``128 -> (1, 2, 4, ..., 128)``, ``6 -> (1, 2, 4, 6)``.

    Doubling keeps the probes few (8 at 128 requests) while ``T`` is flat for small batches on a GPU, where a few
    points describe it; the last probe is the largest batch the engine runs, so the table needs no extrapolation."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    sizes = []
    b = 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch)
    return tuple(sizes)


def profile_context(context_len: int, width: int) -> int:
    """Context tokens per probe request: ``PROFILE_CONTEXT``, at most half the context length, and room left for the
    ``width`` verify tokens."""
    return max(1, min(PROFILE_CONTEXT, int(context_len) // 2, int(context_len) - int(width)))


def chain_mask(batch: int, width: int, context: int, device) -> torch.Tensor:
    """The packed FULL_MASK of ``batch`` requests each verifying a ``width``-token chain after ``context`` tokens:
    per request ``width`` rows of ``context + width`` entries, the prefix visible, then each node sees itself and the
    nodes before it (a chain is a tree, and a tree mask never shows a node its descendants, which attention kernels
    may rely on: SGLang's Triton kernel skips masked key blocks). Costs what any tree of that width costs."""
    rows = torch.cat([torch.ones(width, context, dtype=torch.bool, device=device),
                      torch.ones(width, width, dtype=torch.bool, device=device).tril()], dim=1)
    return rows.reshape(-1).repeat(batch)


def measure_verify_costs(model_runner, *, width: int, max_batch: int, context_len: int) -> CostModel:
    """``T(n)`` of the target verify at ``n = B x width`` batch tokens for ``B`` in ``probe_batch_sizes(max_batch)``,
    timed on ``model_runner`` (SGLang's target ``ModelRunner``); see the module docstring. The table's ``meta`` says
    how it was measured and how long it took."""
    runner = model_runner.eager_runner
    device = torch.device(model_runner.device)
    batches = probe_batch_sizes(max_batch)
    context = profile_context(context_len, width)
    started = time.perf_counter()
    # SGLang's dummy decode buffers, sized for the largest probe; every request at `context` tokens, with a verify
    # mask buffer that holds their FULL_MASK rows (width x (context + width) per request; SGLang sizes it for the
    # capture context of one)
    buffers = runner._alloc_dummy_decode_buffers(max(batches), num_tokens_per_req=width,
                                                 allocate_logits_buffer=False)
    buffers.seq_lens.fill_(context)
    buffers.seq_lens_cpu.fill_(context)
    buffers.custom_mask = chain_mask(max(batches), width, context, device)
    sync = torch.get_device_module(device).synchronize

    def forward(n_tokens: int) -> None:
        runner._dummy_run(n_tokens // width, buffers=buffers)

    meta = {"source": "measured at start (sglang_hybrid.sglang_plugin.startup_costs)",
            "forward": "SGLang dummy TARGET_VERIFY forward, eager", "verify_width": width,
            "batch_sizes": list(batches), "context_tokens": context, "device": str(device)}
    table = profile_interleaved(forward, [b * width for b in batches], rounds=ROUNDS, sync=sync, meta=meta,
                                monotone=True)
    table.meta["seconds_spent"] = round(time.perf_counter() - started, 3)
    return table
