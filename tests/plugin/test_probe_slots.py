"""The start-up probes' KV slots (``sglang_plugin/startup_costs.py``: ``probe_slots``, ``_ProbeRows``).

SGLang's dummy forwards point every request at ``req_to_token``'s padding row 0 (all zeros): every KV read of a probe
is slot 0, so the timed verify and draft forwards underprice attention at the probe's context. The probes now put each
request on a request row of its own naming KV slots of its own, and put the rows back after.

First the index construction (pure). Then both probes end to end through SGLang's own pieces on the CPU, without an
engine: SGLang's ``EagerRunner._alloc_dummy_decode_buffers`` and ``_dummy_run`` (the verify probe's forward) and
SGLang's ``ForwardBatch``/``KVIndexTranslator`` (the draft probe's), on SGLang's real ``ReqToTokenPool`` and
``TokenToKVPoolAllocator``, under SGLang's test config (``override_server_args``). What stands in is the model runner's
shell (the attributes those methods read), the model's forward and the attention backend's planning, which record what
the forward would read: ``req_to_token[req_pool_indices]`` and ``out_cache_loc`` as each forward sees them. The live
suite (``tests/live/test_sglang_live.py``) runs the probes inside SGLang's real engine.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_hybrid.sglang_plugin.startup_costs import (measure_draft_costs, measure_verify_costs, probe_batch_sizes,
                                                      probe_slots, profile_contexts)


def _check_request_slots(slots: torch.Tensor, pool_size: int) -> None:
    """Every slot of every request real (not the padding slot 0), in the pool, and distinct within its request."""
    assert slots.dtype == torch.int64
    assert int(slots.min()) >= 1 and int(slots.max()) < pool_size
    assert all(row.unique().numel() == row.numel() for row in slots)


@pytest.mark.parametrize("batch,context,width,pool_size", [
    (1, 1, 0, 2), (1, 7, 5, 13), (3, 16, 4, 61), (4, 2048, 13, 4 * 2061 + 1), (8, 256, 4, 100_000), (5, 0, 3, 16)])
def test_probe_slots_are_distinct_real_slots_covering_each_request(batch, context, width, pool_size):
    """Where the pool holds ``batch x (context + width)`` slots besides the padding slot: one row per request of its
    context's and its writes' slots, every slot distinct, none the padding slot 0, all below the pool's size."""
    slots = probe_slots(batch, context, width, pool_size)
    assert slots.shape == (batch, context + width)
    _check_request_slots(slots, pool_size)
    assert slots.unique().numel() == slots.numel()                         # distinct across requests too
    # one page a slot: request i's position p at 1 + i (context + width) + p (no wrap in a pool this large)
    n = context + width
    assert torch.equal(slots, 1 + torch.arange(batch)[:, None] * n + torch.arange(n))


@pytest.mark.parametrize("batch,context,width,pool_size", [(4, 100, 4, 300), (16, 64, 13, 80), (3, 10, 2, 13)])
def test_probe_slots_in_a_pool_smaller_than_the_batch_wrap_and_stay_distinct_within_a_request(batch, context, width,
                                                                                                pool_size):
    """A pool smaller than ``batch x context``: the slots wrap around the pool (requests then share slots), and stay
    real, in the pool, and distinct within each request while the pool holds one request's slots."""
    assert pool_size - 1 < batch * context and pool_size - 1 >= context + width
    slots = probe_slots(batch, context, width, pool_size)
    _check_request_slots(slots, pool_size)
    assert slots.unique().numel() == pool_size - 1                          # every real slot used, none twice per row


def test_probe_slots_in_a_pool_smaller_than_one_request_stay_real_and_in_the_pool():
    """Smaller still than one request: no longer distinct, but never the padding slot and never past the pool."""
    slots = probe_slots(2, 10, 3, 8)
    assert int(slots.min()) >= 1 and int(slots.max()) < 8 and slots.unique().numel() == 7


@pytest.mark.parametrize("batch,context,width,pool_size,page", [(3, 10, 4, 64, 4), (2, 64, 13, 1024, 16),
                                                                 (5, 7, 1, 40, 4)])
def test_probe_slots_on_a_paged_pool_start_each_request_on_a_page_of_its_own(batch, context, width, pool_size, page):
    """Pages of ``page`` slots: each request's slots run on from a page boundary (a paged backend reads its page table
    as ``req_to_token[:, ::page] // page``), page 0 (the padding slot's) is never used, and every slot is below the
    pool's size; where the pool holds every request's pages, every slot is distinct and no two requests share a page
    (the last case wraps: 5 requests of 2 pages in a pool of 9 pages besides the padding page)."""
    slots = probe_slots(batch, context, width, pool_size, page)
    _check_request_slots(slots, pool_size)
    n = context + width
    assert (slots % page == torch.arange(n) % page).all()                  # the in-page offset is the position's
    pages = slots // page
    assert int(pages.min()) >= 1
    first = slots[:, ::page]                                                # each page's first slot: page-aligned
    assert (first % page == 0).all() and torch.equal(slots, first.repeat_interleave(page, dim=1)[:, :n]
                                                     + torch.arange(n) % page)
    span = -(-n // page)
    if batch * span <= pool_size // page - 1:
        assert slots.unique().numel() == slots.numel()
        assert pages[:, ::page].flatten().unique().numel() == batch * span    # no page shared between requests


def test_probe_slots_refuse_what_has_no_slot():
    for args in ((0, 4, 1, 10), (1, 0, 0, 10), (1, -1, 2, 10), (1, 4, -1, 10), (1, 4, 1, 10, 0)):
        with pytest.raises(ValueError, match="probe_slots needs"):
            probe_slots(*args)
    for args in ((1, 4, 1, 1), (1, 4, 1, 7, 4)):
        with pytest.raises(ValueError, match="no slot besides the padding page"):
            probe_slots(*args)


# -- both probes end to end through SGLang's own pieces ---------------------------------------------------------------

#: the KV allocator hands out ``POOL_TOKENS`` slots, the KV buffers hold ``KV_TOKENS`` (and the padding slot)
MAX_BATCH, WIDTH, STEPS, CONTEXT_LEN, POOL_TOKENS, KV_TOKENS, REQUEST_ROWS = 4, 5, 3, 64, 600, 400, 6


@pytest.fixture
def sglang_config():
    """SGLang's published config for an EAGLE engine on the CPU, one rank (SGLang's test primitive
    ``override_server_args``, as its attention test kits use), restored after the test."""
    from sglang.srt.runtime_context import get_context, get_parallel

    group = SimpleNamespace(rank_in_group=0, world_size=1, barrier=lambda: None)
    with get_context().override_server_args(device="cpu", speculative_algorithm="EAGLE",
                                            speculative_num_steps=STEPS, speculative_eagle_topk=1,
                                            speculative_num_draft_tokens=WIDTH):
        with get_parallel().override(tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0, pp_size=1, moe_ep_size=1,
                                     tp_group=group):
            yield


def _kv_pool():
    """SGLang's KV pool on the CPU, ``KV_TOKENS`` slots and the padding slot, one layer."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(size=KV_TOKENS, page_size=1, dtype=torch.float16, head_num=1, head_dim=4, layer_num=1,
                            device="cpu", enable_memory_saver=False, enable_alt_stream=False)


def _runner(*, draft: bool, model=None, attn_backend=None, token_to_kv_pool=None):
    """A model runner's shell around SGLang's real request pool, KV allocator and KV index translator (what
    ``_alloc_dummy_decode_buffers``, ``_dummy_run`` and the probes read), with SGLang's ``EagerRunner`` as its eager
    runner."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool = ReqToTokenPool(REQUEST_ROWS, CONTEXT_LEN + 16, "cpu", False)
    allocator = TokenToKVPoolAllocator(POOL_TOKENS, torch.float16, "cpu", token_to_kv_pool, False)
    translator = KVIndexTranslator(req_to_token=pool.req_to_token, token_to_kv_pool_allocator=allocator,
                                   token_to_kv_pool=token_to_kv_pool, page_size=1, device="cpu")
    mr = SimpleNamespace(
        device="cpu", dtype=torch.float16, is_draft_worker=draft, is_generation=True,
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"), decode_num_tokens_per_req=lambda **k: WIDTH,
        attn_backend=attn_backend, model=model, lora_manager=None, kv_index_translator=translator,
        prepare_dummy_forward_batch=lambda fb: fb,
        model_config=SimpleNamespace(hidden_size=8, spec_hidden_size=8, vocab_size=32, dtype=torch.float16,
                                     is_encoder_decoder=False, hf_config=None),
        ngram_embedding_manager=SimpleNamespace(enabled=False), get_pp_proxy_topk_size=lambda: None,
        get_pp_proxy_residual_num_blocks=lambda: None, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
        token_to_kv_pool=token_to_kv_pool)
    mr.eager_runner = EagerRunner.__new__(EagerRunner)
    mr.eager_runner.model_runner = mr
    return mr


def _read(table: torch.Tensor, fb, width: int) -> dict:
    """What a forward reads and writes: each request's row of ``req_to_token`` (``table``) up to its context plus
    ``width``, as the row holds it during the forward, and the slots it writes."""
    rows = fb.req_pool_indices.clone()
    context = int(fb.seq_lens[0])
    return {"rows": rows, "context": context, "seq_lens": fb.seq_lens.clone(),
            "read": table[rows, :context + width].clone(), "writes": fb.out_cache_loc.clone()}


class _Planner:
    """An attention backend's planning step (SGLang's dummy buffers ask it for the fill value of their lengths);
    with ``table``, records what each plan reads, ``STEPS`` slots past the context (the draft's)."""

    def __init__(self, table=None):
        self.table, self.seen = table, []

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata(self, fb):
        if self.table is not None:
            self.seen.append(_read(self.table, fb, STEPS))


class _VerifyModel:
    """The target model's forward inside SGLang's ``_dummy_run``: records what the verify reads and writes
    (``table``: the request pool's, set once the runner is built); raises at forward ``fail_at`` (1-based)."""

    def __init__(self, fail_at=None):
        self.table, self.seen, self.fail_at = None, [], fail_at

    def forward(self, input_ids, positions, fb, **kwargs):
        self.seen.append(_read(self.table, fb, WIDTH))
        if self.fail_at is not None and len(self.seen) >= self.fail_at:
            raise RuntimeError("forward failed")


def _assert_distinct_reads(seen: list, width: int, pool_size: int) -> None:
    """Every forward's requests on distinct real rows, reading distinct real slots, the slots after each context
    being those it writes (request-major, ``width`` each)."""
    assert seen
    for s in seen:
        b, c = s["rows"].numel(), s["context"]
        assert (s["seq_lens"] == c).all()
        assert int(s["rows"].min()) >= 1 and s["rows"].unique().numel() == b                   # not the padding row
        read = s["read"].long()
        assert read.shape == (b, c + width)
        assert int(read.min()) >= 1 and int(read.max()) < pool_size
        assert read.unique().numel() == read.numel()                                            # distinct KV slots
        assert torch.equal(read, probe_slots(b, c, width, pool_size))


def test_probe_slots_verify_probe_reads_distinct_rows_through_sglang_dummy_run(sglang_config):
    """The verify probe through SGLang's ``_dummy_run``: every TARGET_VERIFY forward, at both probe contexts and every
    batch size, sees its requests on distinct request rows whose first ``context + width`` entries are distinct real
    KV slots, and writes the ``width`` slots after each context; after the probe the rows are zeros again and the
    table says what the probe read."""
    model = _VerifyModel()
    mr = _runner(draft=False, model=model, attn_backend=_Planner(), token_to_kv_pool=_kv_pool())
    model.table = table = mr.req_to_token_pool.req_to_token
    got = measure_verify_costs(mr, width=WIDTH, max_batch=MAX_BATCH, context_len=CONTEXT_LEN)
    pool_size = KV_TOKENS + 1                         # the smaller of the allocator's and the KV buffers' slots
    assert pool_size == mr.token_to_kv_pool.k_buffer[0].shape[0] < POOL_TOKENS + 1
    _assert_distinct_reads(model.seen, WIDTH, pool_size)
    for s in model.seen:
        c = s["context"]
        assert torch.equal(s["writes"], s["read"][:, c:].reshape(-1).long())                  # where a verify writes
    contexts = {s["context"] for s in model.seen}
    assert contexts == set(profile_contexts(CONTEXT_LEN, WIDTH))
    assert {s["rows"].numel() for s in model.seen} == set(probe_batch_sizes(MAX_BATCH))
    assert not table.any(), "the probe's request rows must be zeros again"
    assert "distinct per request" in got.meta["kv_slots"]


def test_probe_slots_rows_are_put_back_when_the_probe_fails(sglang_config):
    """A forward that fails mid-probe: the failure reaches the caller (the worker stops the start with it) and the
    request rows the probe wrote are zeros again; a row the probe did not use keeps what it held."""
    model = _VerifyModel(fail_at=3)
    mr = _runner(draft=False, model=model, attn_backend=_Planner())
    model.table = table = mr.req_to_token_pool.req_to_token
    table[MAX_BATCH + 1, :8] = 77                                 # a row past the probe's requests
    with pytest.raises(RuntimeError, match="forward failed"):
        measure_verify_costs(mr, width=WIDTH, max_batch=MAX_BATCH, context_len=CONTEXT_LEN)
    assert int(model.seen[-1]["rows"].min()) >= 1                  # it was on the probe's rows when it failed
    assert not table[:MAX_BATCH + 1].any() and (table[MAX_BATCH + 1, :8] == 77).all()
    assert not table[MAX_BATCH + 1, 8:].any() and not table[MAX_BATCH + 2:].any()


def test_probe_slots_draft_probe_reads_distinct_rows_and_writes_its_steps_slots(sglang_config):
    """The draft probe: its step plan (the multi-step backend's ``init_forward_metadata``) sees its requests on
    distinct request rows of distinct real slots, ``context + steps`` each, with the plan's ``out_cache_loc`` the
    ``steps`` slots after each context (SGLang's request-major layout); the draft model's forward writes each request's
    first slot after its context (step 0); after the probe the rows are zeros again."""
    forwards = []

    def forward(fb):                                 # the draft model runner's forward
        forwards.append({"rows": fb.req_pool_indices.clone(), "writes": fb.out_cache_loc.clone(),
                         "context": int(fb.seq_lens[0])})

    mr = _runner(draft=True, attn_backend=_Planner(), token_to_kv_pool=_kv_pool())
    mr.forward = forward
    table = mr.req_to_token_pool.req_to_token
    backend = _Planner(table)                         # the multi-step backend: plans every step
    backend.attn_backends = [_Planner()]
    plans = backend.seen
    worker = SimpleNamespace(speculative_num_steps=STEPS, topk=1, draft_runner=mr, draft_attn_backend=backend)
    got = measure_draft_costs(worker, max_batch=MAX_BATCH, context_len=CONTEXT_LEN)
    pool_size = KV_TOKENS + 1
    _assert_distinct_reads(plans, STEPS, pool_size)
    for plan in plans:
        c = plan["context"]
        assert torch.equal(plan["writes"], plan["read"][:, c:].reshape(-1).long())          # each request's steps
    assert len(forwards) == len(plans)
    for plan, fw in zip(plans, forwards):
        assert torch.equal(fw["rows"], plan["rows"])
        assert torch.equal(fw["writes"], plan["read"][:, fw["context"]].long())             # step 0's slots
    assert {p["context"] for p in plans} == set(profile_contexts(CONTEXT_LEN, STEPS))
    assert not table.any(), "the probe's request rows must be zeros again"
    assert "distinct per request" in got.meta["kv_slots"]


def test_probe_slots_not_used_on_a_pool_backed_after_graph_capture(sglang_config):
    """A KV pool backed after graph capture has only its padding page resident while the probe runs: the probe stays
    on SGLang's padding row and slot (as before), writes no row, and its table says so."""
    model = _VerifyModel()
    # the one attribute the decision reads, on a stand-in for the pool (a real one needs CUDA's virtual memory)
    mr = _runner(draft=False, model=model, attn_backend=_Planner(),
                 token_to_kv_pool=SimpleNamespace(post_capture_active=True, size=POOL_TOKENS))
    model.table = table = mr.req_to_token_pool.req_to_token
    got = measure_verify_costs(mr, width=WIDTH, max_batch=MAX_BATCH, context_len=CONTEXT_LEN)
    assert model.seen and all(not s["rows"].any() and not s["read"].any() and not s["writes"].any()
                              for s in model.seen)
    assert not table.any() and "padding slot" in got.meta["kv_slots"]
