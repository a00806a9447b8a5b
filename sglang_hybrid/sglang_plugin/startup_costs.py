"""The target verify's and the EAGLE draft's step-time tables, measured at start, so HYBRID has a price out of the box.

Why: without a cost table the price is zero and every request verifies its whole tree (``n_nodes + 1`` slots) every
step. While a batch is memory-bound that costs nothing; on a busy server it does: in the realistic replay
(SIMULATED, docs/benchmarks.md section 1) at batch 128 on code, the full tree every step reached 3.36x over no
speculation and the launch with this table 4.28x, the best fixed-k EAGLE chain 3.22x; on chat at batch 32, 1.40x,
2.14x and 2.17x. A table profiled by hand (``python -m sglang_hybrid.tools.cost_profile``) is one more step a
user must know about; so when none is given (setting ``cost_table``), the worker measures one at start (setting
``measure_cost_table``).

What it times: SGLang's own dummy forward (``BaseRunner._dummy_run``, the forward SGLang runs at start to warm up and
autotune kernels): a TARGET_VERIFY forward of ``B`` requests x the full verify width ``W`` (SGLang's dummy verify
input, every request at the same context, but each request on a request row of its own that names KV slots of its
own, ``probe_slots``: SGLang's dummy points every request at the pool's padding row, whose whole context is slot 0,
one slot read over and over from cache, which prices a long context's KV reads below their cost; the probe fills its
rows before it and puts them back after it, and its KV writes land in slots no request holds yet (a pool that
translates its slot ids or is backed after graph capture keeps the padding row: ``_why_padding_row``); the mask a
chain's tree, ``chain_mask``, in place of SGLang's all-ones dummy, which shows nodes their descendants), logits for
every row as a real verify computes them. One forward per batch size in ``probe_batch_sizes`` (powers of two up to
the running-request limit, and the limit), ``ROUNDS`` times round robin after one warm-up forward (the rounds after the
first only while the start's time budget allows: ``StartBudget``), the minimum per size
(``cost.profile_interleaved``), then at the shorter context (below) ``SHORT_ROUNDS`` forwards at the largest size
only (``short_from_one_probe``), the device synchronised around each. The table's sizes are ``B x W`` batch tokens, the
``T(n)`` of ``sglang_hybrid.cost``; below ``W`` it is flat (the price then takes the narrowest verify as free), past
its end the last slope continues.

Every request of a probe sits at one context, and each table is measured at two (``profile_contexts``):
``PROFILE_CONTEXT`` tokens, or half the context length where that is shorter (a request spends its life between its
prompt and the end of its window, so a short window is probed half full), and an eighth of that. Verify attention
grows with the context: a table measured at a context of one (SGLang's capture value) would price a long-context
server's verify tokens below their cost, and one measured at 2,048 tokens priced a batch of short chats as if each
verify slot cost what it costs at 2,048 (below no speculation on the replay's real chat trace at batch 128). The two
tables form a ``cost.ContextCostModel``; each step prices at its batch's mean context
(``HybridStep._follow_context``: one launch on the fused path).

What it does not time: verify CUDA graphs. The probe runs eager, so on a GPU with graphs the table overstates the
small batches, where host launch overhead dominates an eager forward (a conservative price: it trims trees a little
more than a captured graph's true cost would); ``python -m sglang_hybrid.tools.cost_profile`` builds a table from
SGLang's one-batch benchmark, graphs included, for a user who wants that.

The draft forward's table (setting ``draft_cost_table``, adaptive EAGLE depth) is measured alike where none is given
(``HybridSettings.measures_draft_table``): ``measure_draft_costs`` times ONE EAGLE draft
decode forward -- what each draft step after the first runs: one token per request (top-k 1), its KV read at the same
context -- through the draft worker's own multi-step backend and model runner, as ``EagleDraftWorker.draft`` runs an
eager step, at the same probe batch sizes. With it each step picks the EAGLE depth whose expected gain pays for its
forwards (docs/sglang.md, "Adaptive drafting"). Its cost in memory is small since every shallower depth drafts in the
start-up depth's buffers (``shared_draft_steps``): none on Triton, each depth's own step backends' wrappers on
FlashInfer (``memory_budget``). Why by default: the realistic replay's decomposition (docs/sglang.md, "A price out of
the box"). Like the verify probe it runs eager, its step plan included, so on a GPU it overstates small batches.

Tensor parallelism: every rank runs the same probes in the same order (the forward's collectives need all of them;
how many rounds the start's budget affords is rank 0's decision, broadcast);
rank 0's table is the one that decides (its trees are broadcast), the others are measured alike and logged.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import numpy as np
import torch

from sglang_hybrid.cost import ContextCostModel, CostModel, profile_interleaved

logger = logging.getLogger(__name__)

#: context tokens of every request in the probe forwards (at most half the context length): the replay's GPU
#: roofline prices with the same typical context (``bench.replay --gpu-context``, default 2048)
PROFILE_CONTEXT = 2048
#: the shorter probe context is this fraction of ``PROFILE_CONTEXT`` (256 tokens a request): verify attention's cost
#: is linear in the context, so two points describe it; an eighth keeps the short probe where the weights' reads
#: dominate, as they do for the short chats of a real trace (the replay's "blend", docs/benchmarks.md section 1)
SHORT_CONTEXT_FRACTION = 8
#: timed forwards per batch size at the longer context (round robin over the sizes, the minimum), after one warm-up
#: forward: the second round only where the start's budget allows it (``StartBudget``)
ROUNDS = 2
#: the measurements' share of the start: a round after the first runs only while both tables' measurement, that round
#: included, stays within this share of the time the process had spent starting when the measurement began (issue
#: 25: start-up grows by at most 10 % with the tables measured; the rest of the 10 % is the first rounds, which
#: always run, and noise)
START_SHARE = 0.05
#: timed forwards at the shorter context, all at the largest batch size, warm by then (the minimum); the other sizes
#: follow by ``short_from_one_probe``
SHORT_ROUNDS = 1


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


def profile_contexts(context_len: int, width: int) -> tuple:
    """The contexts the probes run at, shortest first: ``profile_context`` and an eighth of it
    (``SHORT_CONTEXT_FRACTION``), or ``profile_context`` alone where the two would meet (a window of a few tokens)."""
    long = profile_context(context_len, width)
    short = max(1, long // SHORT_CONTEXT_FRACTION)
    return (short, long) if short < long else (long,)


class StartBudget:
    """How many probe rounds a start affords: the first always, each later one only while the measurement so far
    plus that round (timed as the round before it) stays within ``share`` of the time the process had spent starting
    when the budget was made.

    Why: the probes cost forwards, and what a forward costs against a start differs by orders of magnitude. On a GPU a
    start loads the weights and captures graphs for tens of seconds to minutes before the probes run, and a round of
    eager forwards takes a fraction of a second: the budget allows every round. On SGLang's CPU engine a 135M model's
    verify forward of 48 tokens takes a quarter of a second against a 16 s start: one round (``bench.startup_profile``,
    docs/benchmarks.md section 3d). A forward long enough to exhaust the budget is also one whose timing noise is a
    small part of it, which is what the second round's minimum is for.

    ``agree``: under tensor parallelism every rank must run the same forwards (their collectives meet), and each rank's
    clock would decide alone; ``agree(local)`` returns the group's decision (rank 0's, broadcast: the worker's
    ``_rank0_decides``). ``started``: the process's start time (``time.time()`` clock; default: the OS's record of this
    process's creation, through ``psutil``)."""

    def __init__(self, share: float = START_SHARE, started: Optional[float] = None,
                 agree: Optional[Callable[[bool], bool]] = None, clock: Callable[[], float] = time.time):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        if started is None:
            import psutil

            started = psutil.Process().create_time()
        self._clock, self._agree = clock, agree
        self._began = clock()
        self.seconds = share * max(0.0, self._began - float(started))

    def more(self, last_round_s: float) -> bool:
        """Whether another round, assumed to take ``last_round_s`` like the one before it, fits the budget."""
        local = (self._clock() - self._began) + float(last_round_s) <= self.seconds
        return self._agree(local) if self._agree is not None else local


def _profile_contexts(contexts: tuple, at_context, forward, sizes: list, requests: list, sync,
                      budget: Optional[StartBudget] = None) -> list:
    """The tables at ``contexts`` (shortest first; ``at_context(c)`` sets the probe buffers to context ``c``): at the
    longest, ``ROUNDS`` round robin after a warm-up (the rounds after the first as ``budget`` allows); at a shorter
    one, ``SHORT_ROUNDS`` forwards at the largest size (warm by then), the other sizes by ``short_from_one_probe``.
    ``requests``: the requests of each size's probe."""
    at_context(contexts[-1])
    long = profile_interleaved(forward, sizes, rounds=ROUNDS, sync=sync, monotone=True,
                               meta={} if budget is None else {"start_budget_s": round(budget.seconds, 3)},
                               more=None if budget is None else budget.more)
    if len(contexts) == 1:
        return [long]
    at_context(contexts[0])
    top = profile_interleaved(forward, sizes[-1:], rounds=SHORT_ROUNDS, sync=sync, warmup=False)
    return [short_from_one_probe(long, requests, float(top.seconds[0])), long]


def short_from_one_probe(long: CostModel, requests, seconds: float) -> CostModel:
    """The table at the shorter context from the longer one's (``long``, one entry per probe of ``requests[i]``
    requests) and one forward at the shorter context at the largest probe (``seconds``).

    Why one probe: start-up time (its target: at most +10 %; timing every size at both contexts took +19 % on
    the CPU engine, ``bench.startup_profile``). Why this model: what a shorter context saves in a verify is its KV
    reads and their attention, ``B x c`` tokens for ``B`` requests: at a given context difference, proportional to
    the requests. The probe at the largest batch measures that saving, every other size takes its share:
    ``short(B) = long(B) - B / B_max x (long(B_max) - seconds)``, floored at ``long(B) x seconds / long(B_max)`` (the
    saving never a larger fraction of a step than at the largest batch: where the per-request cost rises with the
    batch, the subtraction alone could go below zero), then raised to its running maximum. A probe slower than the
    longer context's (noise) leaves the table as the longer one's."""
    b = np.asarray(requests, dtype=np.float64)
    if b.shape != long.seconds.shape:
        raise ValueError(f"one request count per table entry: {b.size} for {long.seconds.size}")
    top = float(long.seconds[-1])
    saving = max(0.0, top - float(seconds)) / b[-1]
    ratio = min(1.0, float(seconds) / top)
    short = np.maximum(long.seconds - saving * b, long.seconds * ratio)
    meta = {**long.meta, "short_probe": f"one forward at {int(b[-1])} requests ({float(seconds):.6g} s), the other "
                                        "sizes by the KV-read model (startup_costs.short_from_one_probe)"}
    return CostModel(long.sizes, np.maximum.accumulate(short), meta)


def _at_contexts(tables: list, contexts: tuple, meta: dict) -> CostModel:
    """One table per probe context (shortest first) as the ``ContextCostModel`` that prices each step at its batch's
    context, or the one table where a single context was probed; ``meta`` for the result."""
    meta = {**{k: v for t in tables for k, v in t.meta.items()}, **meta, "context_tokens": list(contexts)}
    if len(tables) == 1:
        return CostModel(tables[0].sizes, tables[0].seconds, meta)
    short, long = tables
    return ContextCostModel(long.sizes, long.seconds, short.seconds, contexts[0], contexts[1], meta)


def chain_mask(batch: int, width: int, context: int, device) -> torch.Tensor:
    """The packed FULL_MASK of ``batch`` requests each verifying a ``width``-token chain after ``context`` tokens:
    per request ``width`` rows of ``context + width`` entries, the prefix visible, then each node sees itself and the
    nodes before it (a chain is a tree, and a tree mask never shows a node its descendants, which attention kernels
    may rely on: SGLang's Triton kernel skips masked key blocks). Costs what any tree of that width costs."""
    rows = torch.cat([torch.ones(width, context, dtype=torch.bool, device=device),
                      torch.ones(width, width, dtype=torch.bool, device=device).tril()], dim=1)
    return rows.reshape(-1).repeat(batch)


def probe_slots(batch: int, context: int, width: int, pool_size: int, page_size: int = 1) -> torch.Tensor:
    """The KV slots of the start-up probe's ``batch`` requests: row ``i`` holds request ``i``'s ``context + width``
    slots, its context's then the ``width`` its forward writes (int64 ``[batch, context + width]``, on the host).

    Why: SGLang's dummy forwards point every request at ``req_to_token``'s padding row 0, all zeros, so every KV read
    of a probe is slot 0, one slot that stays in cache however long the context: a verify or draft forward so timed
    underprices the attention at the probe's context (its KV reads are ``B x context`` slots in a served batch). With
    these slots each request reads a context of its own.

    Layout: request ``i``'s position ``p`` is slot ``page x page_size + p % page_size`` in page
    ``1 + (i x span + p // page_size) mod (pages - 1)``, where ``span`` is a request's pages (``context + width``
    tokens, rounded up) and ``pages = pool_size // page_size``; ``pool_size`` counts the pool's slots, padding included
    (its allocator's tokens plus the padding page). So no slot is 0 or in page 0 (the padding slot, which padded
    tokens write), every slot is below ``pool_size``, and each request's slots run on from a page boundary, as the
    paged backends expect (they read ``req_to_token[:, ::page_size] // page_size`` as the page table). With pages of
    one slot, that is slot ``1 + (i x (context + width) + p) mod (pool_size - 1)``. Where the pool holds ``batch x
    span`` pages besides the padding page (``batch x (context + width)`` tokens with pages of one) every slot is
    distinct; a smaller pool wraps around: the slots stay distinct within each request while the pool holds one
    request's span, and requests then share slots."""
    batch, context, width, pool_size, page_size = (int(batch), int(context), int(width), int(pool_size),
                                                    int(page_size))
    if batch < 1 or context < 0 or width < 0 or context + width < 1 or page_size < 1:
        raise ValueError(f"probe_slots needs a request and a slot each: batch {batch}, context {context}, "
                         f"width {width}, page size {page_size}")
    pages = pool_size // page_size
    if pages < 2:
        raise ValueError(f"a KV pool of {pool_size} slots ({pages} pages of {page_size}) has no slot besides the "
                         f"padding page")
    n = context + width
    span = -(-n // page_size)
    position = torch.arange(n, dtype=torch.int64)
    page = 1 + (torch.arange(batch, dtype=torch.int64)[:, None] * span + position // page_size) % (pages - 1)
    return page * page_size + position % page_size


def _kv_pool_slots(model_runner) -> tuple:
    """``(pool_size, page_size)`` for ``probe_slots`` on ``model_runner``'s KV pool: the slots its allocator hands out
    (pages ``1 .. size // page_size``) and the padding page, no more than its KV buffers hold (``size`` tokens and
    the padding page)."""
    allocator = model_runner.token_to_kv_pool_allocator
    page = max(1, int(getattr(allocator, "page_size", 1) or 1))
    tokens = int(allocator.size)
    held = getattr(getattr(model_runner, "token_to_kv_pool", None), "size", None)
    if isinstance(held, int) and not isinstance(held, bool):
        tokens = min(tokens, held)
    return (tokens // page + 1) * page, page


def _why_padding_row(model_runner, table: torch.Tensor, columns: int) -> Optional[str]:
    """Why the probe must stay on SGLang's padding row and slot on ``model_runner`` (None: it need not).

    A translating pool (unified, fused draft) names slots by virtual ids, which read the sink until allocated: no
    distinct KV to read, and slot ids past its tables. A pool backed after graph capture
    (``post_capture_active``) has only its first page resident while the probe runs: any other slot would fault."""
    if getattr(getattr(model_runner, "kv_index_translator", None), "is_translating", False):
        return "the KV pool translates its slot ids (virtual slots read the sink until allocated)"
    if getattr(getattr(model_runner, "token_to_kv_pool", None), "post_capture_active", False):
        return "the KV pool is backed after graph capture (only its padding page is resident during the probe)"
    rows, cols = table.shape
    if rows < 2:
        return "the request pool has no row besides the padding row"
    if columns > cols:
        return f"a probe request's {columns} slots exceed the request pool's {cols} columns"
    try:
        pool_size, page_size = _kv_pool_slots(model_runner)
    except (AttributeError, TypeError, ValueError) as e:
        return f"the KV pool's size is not known ({type(e).__name__}: {e})"
    if pool_size // page_size < 2:
        return "the KV pool has no slot besides the padding page"
    return None


class _ProbeRows:
    """The probe requests' own request rows and KV slots on ``model_runner``'s pools: request ``i`` on row
    ``1 + i`` (wrapping past the pool's rows), its ``context + width`` slots from ``probe_slots`` written into the row
    by ``at(context)``, the buffers' ``req_pool_indices`` pointed at the rows and their ``out_cache_loc`` at each
    request's ``width`` slots after its context (request-major, where a verify writes and the draft's steps write);
    ``restore`` puts back the rows as they were (zeros at start) and zeroes both buffers, so serving starts from
    the pool the probe found. Why the writes harm nothing: the probe runs at start, before any request holds a slot.

    Where the pool cannot take them (``_why_padding_row``, logged) the probe stays on the padding row as SGLang's own
    dummy forwards do: ``at`` returns None and nothing is written."""

    def __init__(self, model_runner, *, batch: int, width: int, contexts: tuple, req_pool_indices: torch.Tensor,
                 out_cache_loc: torch.Tensor):
        self.batch, self.width = int(batch), int(width)
        self.req_pool_indices, self.out_cache_loc = req_pool_indices, out_cache_loc
        self.table = model_runner.req_to_token_pool.req_to_token
        self.columns = max(contexts) + self.width
        self.reason = _why_padding_row(model_runner, self.table, self.columns)
        self.saved = None
        if self.reason is not None:
            logger.info("HYBRID: the start-up probe reads SGLang's padding KV slot: %s", self.reason)
            return
        self.pool_size, self.page_size = _kv_pool_slots(model_runner)
        free_rows = self.table.shape[0] - 1
        self.touched = min(self.batch, free_rows)                      # rows 1 .. touched
        self.rows = 1 + torch.arange(self.batch, dtype=torch.int64, device=self.table.device) % free_rows
        self.saved = self.table[1:1 + self.touched, :self.columns].clone()

    def at(self, context: int) -> Optional[torch.Tensor]:
        """Every probe request at ``context``: its slots (``[batch, context + width]``, on the pool's device) in its
        row and the buffers; None on the padding row."""
        if self.saved is None:
            return None
        slots = probe_slots(self.batch, context, self.width, self.pool_size, self.page_size).to(self.table.device)
        self.table[self.rows, :context + self.width] = slots.to(self.table.dtype)
        self.req_pool_indices[:self.batch] = self.rows.to(self.req_pool_indices.dtype)
        self.out_cache_loc[:self.batch * self.width] = slots[:, context:].reshape(-1).to(self.out_cache_loc.dtype)
        return slots

    def restore(self) -> None:
        """The rows as the probe found them, the buffers' indices zeros (the padding row and slot)."""
        if self.saved is not None:
            self.table[1:1 + self.touched, :self.columns] = self.saved
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()


def measure_verify_costs(model_runner, *, width: int, max_batch: int, context_len: int,
                         budget: Optional[StartBudget] = None) -> CostModel:
    """``T(n)`` of the target verify at ``n = B x width`` batch tokens for ``B`` in ``probe_batch_sizes(max_batch)``,
    timed on ``model_runner`` (SGLang's target ``ModelRunner``); see the module docstring. The table's ``meta`` says
    how it was measured and how long it took."""
    runner = model_runner.eager_runner
    device = torch.device(model_runner.device)
    batches = probe_batch_sizes(max_batch)
    contexts = profile_contexts(context_len, width)
    started = time.perf_counter()
    # SGLang's dummy decode buffers, sized for the largest probe; every request at one probe context, with a verify
    # mask buffer that holds their FULL_MASK rows (width x (context + width) per request; SGLang sizes it for the
    # capture context of one)
    buffers = runner._alloc_dummy_decode_buffers(max(batches), num_tokens_per_req=width,
                                                 allocate_logits_buffer=False)
    sync = torch.get_device_module(device).synchronize

    def forward(n_tokens: int) -> None:
        runner._dummy_run(n_tokens // width, buffers=buffers)

    probe = None

    def at_context(context: int) -> None:
        buffers.seq_lens.fill_(context)
        buffers.seq_lens_cpu.fill_(context)
        buffers.custom_mask = chain_mask(max(batches), width, context, device)
        probe.at(context)

    try:
        # each request on its own row of KV slots (probe_slots), the rows put back whatever happens
        probe = _ProbeRows(model_runner, batch=max(batches), width=width, contexts=contexts,
                           req_pool_indices=buffers.req_pool_indices, out_cache_loc=buffers.out_cache_loc)
        tables = _profile_contexts(contexts, at_context, forward, [b * width for b in batches], list(batches), sync,
                                   budget)
    finally:
        if probe is not None:
            probe.restore()
    meta = {"source": "measured at start (sglang_hybrid.sglang_plugin.startup_costs)",
            "forward": "SGLang dummy TARGET_VERIFY forward, eager", "verify_width": width,
            "kv_slots": _slots_meta(probe), "batch_sizes": list(batches), "device": str(device),
            "seconds_spent": round(time.perf_counter() - started, 3)}
    return _at_contexts(tables, contexts, meta)


def measure_draft_costs(draft_worker, *, max_batch: int, context_len: int,
                        budget: Optional[StartBudget] = None) -> CostModel:
    """``T(B)`` of one EAGLE draft decode forward of ``B`` requests (top-k 1: one token each, its KV at
    ``profile_context`` tokens) for ``B`` in ``probe_batch_sizes(max_batch)``, timed on ``draft_worker`` (SGLang's
    ``EagleDraftWorker``) as it runs an eager draft step: its multi-step backend plans every step
    (``init_forward_metadata``), then the first step's backend runs the draft model's forward. Every request reads
    its context from, and writes its draft tokens to, KV slots of its own on a request row of its own
    (``probe_slots``, ``_ProbeRows``: the rows put back after the probe), as a served batch does; the hidden states
    are zeros. Round robin as ``measure_verify_costs``; the table's sizes are batch sizes, the unit of
    ``draft_cost_table``. Needs ``--speculative-num-steps`` >= 2 (a one-step draft runs no draft decode)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

    steps, topk = int(draft_worker.speculative_num_steps), int(draft_worker.topk)
    if steps < 2 or topk != 1:
        raise ValueError(f"the draft table is measured for chain drafts of 2 or more steps (--speculative-num-steps "
                         f"{steps}, --speculative-eagle-topk {topk})")
    runner, backend = draft_worker.draft_runner, draft_worker.draft_attn_backend
    device = torch.device(runner.device)
    batches = probe_batch_sizes(max_batch)
    contexts = profile_contexts(context_len, steps)
    started = time.perf_counter()
    buffers = runner.eager_runner._alloc_dummy_decode_buffers(max(batches) * steps, allocate_logits_buffer=False)
    hidden, dtype = get_draft_recurrent_hidden_state_spec(runner)
    hidden_states = torch.zeros((max(batches), hidden), dtype=dtype, device=device)
    # what the first draft step writes: each request's first slot after its context (SGLang's layout of the steps'
    # slots is request-major, ``per_step_draft_out_cache_loc``: step 0 is every ``steps``-th)
    first_writes = torch.zeros(max(batches), dtype=buffers.out_cache_loc.dtype, device=device)
    sync = torch.get_device_module(device).synchronize

    def forward(n: int) -> None:
        spec = EagleDraftInput(topk_p=torch.ones((n, 1), dtype=torch.float32, device=device),
                               topk_index=buffers.input_ids[:n, None], hidden_states=hidden_states[:n],
                               capture_hidden_mode=CaptureHiddenMode.LAST)
        batch = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=n, input_ids=buffers.input_ids[:n],
                             req_pool_indices=buffers.req_pool_indices[:n], seq_lens=buffers.seq_lens[:n],
                             seq_lens_cpu=buffers.seq_lens_cpu[:n], orig_seq_lens=buffers.seq_lens[:n],
                             out_cache_loc=buffers.out_cache_loc[:n * steps],
                             seq_lens_sum=n * int(buffers.seq_lens_cpu[0]),   # a host tensor: no device read
                             return_logprob=False, positions=buffers.positions[:n],
                             spec_algorithm=runner.spec_algorithm,
                             spec_info=spec, capture_hidden_mode=CaptureHiddenMode.LAST)
        runner.kv_index_translator.bind_runner_slots(batch)
        backend.init_forward_metadata(batch)
        batch.mark_forward_metadata_ready()
        batch.out_cache_loc = first_writes[:n]
        with forward_context(ForwardContext(attn_backend=backend.attn_backends[0]), forward_batch=batch):
            runner.forward(batch)

    probe = None

    def at_context(c: int) -> None:
        buffers.seq_lens.fill_(c)
        buffers.seq_lens_cpu.fill_(c)
        buffers.positions.fill_(c)
        slots = probe.at(c)
        if slots is not None:
            first_writes.copy_(slots[:, c])

    try:
        # each request on its own row of KV slots (probe_slots): its context, then its steps' slots
        probe = _ProbeRows(runner, batch=max(batches), width=steps, contexts=contexts,
                           req_pool_indices=buffers.req_pool_indices, out_cache_loc=buffers.out_cache_loc)
        tables = _profile_contexts(contexts, at_context, forward, list(batches), list(batches), sync, budget)
    finally:
        if probe is not None:
            probe.restore()
    meta = {"source": "measured at start (sglang_hybrid.sglang_plugin.startup_costs)",
            "forward": "one EAGLE draft decode forward (top-k 1), eager, its step plan included",
            "what": "one EAGLE draft forward by batch", "kv_slots": _slots_meta(probe), "batch_sizes": list(batches),
            "device": str(device),
            "seconds_spent": round(time.perf_counter() - started, 3)}
    return _at_contexts(tables, contexts, meta)


def _slots_meta(probe: _ProbeRows) -> str:
    """What a table's ``meta`` says of the KV its probe read."""
    if probe.reason is not None:
        return f"SGLang's padding slot ({probe.reason})"
    return (f"distinct per request (startup_costs.probe_slots: rows 1..{probe.touched} of the request pool, a pool of "
            f"{probe.pool_size} slots in pages of {probe.page_size}; put back after the probe)")
