"""The verify cost table measured at start (``sglang_plugin/startup_costs.py``, setting ``measure_cost_table``): the
probe plan, the probe's tree mask, the interleaved timing and the default verify widths it brings. The measurement
itself runs inside SGLang's real engine in the live suite (``tests/live/test_sglang_live.py``: every case without a
``cost_table`` reports the measured table in its counters)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid import cost as cost_mod
from sglang_hybrid.cost import CostFileError, profile_interleaved
from sglang_hybrid.sglang_plugin.config import HybridSettings
from sglang_hybrid.sglang_plugin.startup_costs import (chain_mask, measure_draft_costs, probe_batch_sizes,
                                                      profile_context, profile_contexts)
from sglang_hybrid.widths import default_buckets


def test_probe_batch_sizes_double_up_to_the_running_limit():
    assert probe_batch_sizes(1) == (1,)
    assert probe_batch_sizes(4) == (1, 2, 4)
    assert probe_batch_sizes(6) == (1, 2, 4, 6)
    assert probe_batch_sizes(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_batch"):
            probe_batch_sizes(bad)


def test_profile_context_is_typical_and_leaves_room_for_the_verify_tokens():
    assert profile_context(131072, 13) == 2048
    assert profile_context(4096, 13) == 2048
    assert profile_context(1024, 12) == 512                     # a short window probed half full
    assert profile_context(20, 12) == 8                         # room for the verify tokens
    assert profile_context(8, 12) == 1


def test_profile_contexts_are_the_typical_one_and_an_eighth_of_it():
    assert profile_contexts(131072, 13) == (256, 2048)
    assert profile_contexts(1024, 12) == (64, 512)
    assert profile_contexts(20, 12) == (1, 8)
    assert profile_contexts(8, 12) == (1,)                     # one context where the two would meet


def test_probes_at_two_contexts_make_a_table_priced_at_the_batch_context():
    """Two probe tables (shortest context first) become the ``ContextCostModel`` the step blends; one stays a
    plain table; either way ``meta`` records the contexts probed."""
    from sglang_hybrid.cost import ContextCostModel, CostModel
    from sglang_hybrid.sglang_plugin.startup_costs import _at_contexts

    short, long = CostModel([13, 26], [0.01, 0.011], {"rounds": 2}), CostModel([13, 26], [0.02, 0.04], {"rounds": 2})
    two = _at_contexts([short, long], (256, 2048), {"verify_width": 13})
    assert isinstance(two, ContextCostModel) and (two.short_context, two.long_context) == (256, 2048)
    assert two.short_seconds.tolist() == [0.01, 0.011] and two.seconds.tolist() == [0.02, 0.04]
    assert two.meta == {"rounds": 2, "verify_width": 13, "context_tokens": [256, 2048]}
    one = _at_contexts([long], (8,), {})
    assert type(one) is CostModel and one.meta["context_tokens"] == [8] and one.seconds.tolist() == [0.02, 0.04]


def test_short_context_table_from_one_probe_takes_each_size_its_share_of_the_saving():
    """At the largest probe the shorter context's table is the probe's time; every other size saves its share of
    what the probe saved, in proportion to its requests (KV reads are B x c tokens); floored at the probe's fraction of
    the step, non-decreasing; a probe slower than the longer context's (noise) saves nothing."""
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.startup_costs import short_from_one_probe

    long = CostModel([12, 24, 48], [0.10, 0.14, 0.26])
    short = short_from_one_probe(long, [1, 2, 4], 0.18)                # saved 0.08 at 4 requests: 0.02 a request
    assert np.allclose(short.seconds, [0.08, 0.10, 0.18]) and short.sizes.tolist() == [12, 24, 48]
    assert "one forward at 4 requests" in short.meta["short_probe"]
    # a table whose per-request cost rises with the batch: the subtraction alone would give 0.01 - 0.011 < 0
    convex = CostModel([1, 2, 8], [0.01, 0.012, 0.1])
    got = short_from_one_probe(convex, [1, 2, 8], 0.012)               # the probe took 12 % of the long step
    assert np.allclose(got.seconds, [0.01 * 0.12, 0.012 * 0.12, 0.012]) and (np.diff(got.seconds) >= 0).all()
    assert short_from_one_probe(long, [1, 2, 4], 0.30).seconds.tolist() == long.seconds.tolist()
    with pytest.raises(ValueError, match="one request count per table entry"):
        short_from_one_probe(long, [1, 2], 0.18)


def test_probes_time_every_size_at_the_long_context_and_one_at_the_short():
    """The probe plan: at the longer context a warm-up forward and ``ROUNDS`` round robin over every size; at the
    shorter one ``SHORT_ROUNDS`` forwards at the largest size only, no warm-up (its shape is warm)."""
    from sglang_hybrid.sglang_plugin import startup_costs

    calls, ctx = [], [None]

    def forward(n):
        calls.append((ctx[0], n))

    def at_context(c):
        ctx[0] = c

    short, long = startup_costs._profile_contexts((64, 512), at_context, forward, [12, 24, 48], [1, 2, 4], None)
    assert calls == ([(512, 12)] + [(512, n) for n in (12, 24, 48)] * startup_costs.ROUNDS
                     + [(64, 48)] * startup_costs.SHORT_ROUNDS)
    assert short.sizes.tolist() == long.sizes.tolist() == [12, 24, 48]
    calls.clear()
    (one,) = startup_costs._profile_contexts((512,), at_context, forward, [12], [1], None)
    assert calls == [(512, 12)] * (1 + startup_costs.ROUNDS) and one.sizes.tolist() == [12]


def test_chain_mask_is_a_chain_tree_after_a_visible_prefix():
    b, w, ctx = 3, 5, 7
    m = chain_mask(b, w, ctx, "cpu").reshape(b, w, ctx + w)
    assert m.dtype == torch.bool
    assert m[:, :, :ctx].all()                                              # the whole prefix visible
    expect = torch.ones(w, w, dtype=torch.bool).tril()                      # node i sees nodes 0..i
    assert all(torch.equal(m[i, :, ctx:], expect) for i in range(b))


def _fake_clock(monkeypatch, durations):
    """``time.perf_counter`` of ``sglang_hybrid.cost`` advanced only by the calls: call ``i`` of ``fn`` lasts
    ``durations(n, i)``."""
    clock = [0.0]
    calls = []

    def fn(n):
        clock[0] += durations(n, len(calls))
        calls.append(n)

    monkeypatch.setattr(cost_mod.time, "perf_counter", lambda: clock[0])
    return fn, calls


def test_profile_interleaved_warms_up_once_then_round_robin_minimum(monkeypatch):
    noise = iter([100.0, 3.0, 1.0, 2.0, 1.0, 5.0, 1.0])                  # the warm-up is the slow first call
    fn, calls = _fake_clock(monkeypatch, lambda n, i: n * next(noise))
    m = profile_interleaved(fn, [8, 2, 4], rounds=2)
    assert calls == [2, 2, 4, 8, 2, 4, 8]                                   # warm-up at the smallest, then rounds
    # per size the faster of its two rounds: 2 -> min(3, 1), 4 -> min(1, 2)... (durations are n x noise)
    assert m.sizes.tolist() == [2, 4, 8]
    assert np.allclose(m.seconds, [2 * 1.0, 4 * 1.0, 8 * 1.0])
    assert m.meta["rounds"] == 2 and "minimum" in m.meta["statistic"]
    with pytest.raises(ValueError, match="rounds"):
        profile_interleaved(fn, [2], rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        profile_interleaved(fn, [], rounds=1)


def test_profile_interleaved_monotone_absorbs_a_noisy_probe(monkeypatch):
    # the smallest size's samples both land on a busy machine: 50 % above the next size
    table = {2: 3.0, 4: 2.0, 8: 4.0}
    fn, _ = _fake_clock(monkeypatch, lambda n, i: table[n])
    with pytest.raises(CostFileError, match="not monotone"):
        profile_interleaved(fn, [2, 4, 8], rounds=2)                      # a file would be refused
    m = profile_interleaved(fn, [2, 4, 8], rounds=2, monotone=True)        # a start must not fail on noise
    assert m.seconds.tolist() == [3.0, 3.0, 4.0]
    assert "running maximum" in m.meta["statistic"]


def test_profile_interleaved_asks_before_each_later_round(monkeypatch):
    """``more`` is asked after every round but the last, with that round's seconds; False stops there, with every
    size timed once and ``meta["rounds"]`` saying so."""
    fn, calls = _fake_clock(monkeypatch, lambda n, i: float(n))
    asked = []
    m = profile_interleaved(fn, [2, 4], rounds=3, more=lambda s: asked.append(s) or False)
    assert calls == [2, 2, 4] and asked == [6.0] and m.meta["rounds"] == 1 and m.seconds.tolist() == [2.0, 4.0]
    calls.clear(), asked.clear()
    m = profile_interleaved(fn, [2, 4], rounds=3, more=lambda s: asked.append(s) or True)
    assert calls == [2] + [2, 4] * 3 and asked == [6.0, 6.0] and m.meta["rounds"] == 3


def test_start_budget_allows_a_round_while_the_measurement_fits_its_share_of_the_start():
    """The budget is ``share`` of the time since the process started, read when the budget is made; a further round
    fits while the time measured so far plus that round (the last round's time) stays within it."""
    from sglang_hybrid.sglang_plugin.startup_costs import START_SHARE, StartBudget

    now = [100.0]
    budget = StartBudget(share=0.05, started=20.0, clock=lambda: now[0])      # 80 s into the start: 4 s to spend
    assert budget.seconds == pytest.approx(4.0)
    assert budget.more(1.0)                                                  # 0 + 1 <= 4
    now[0] = 102.5
    assert budget.more(1.5) and not budget.more(1.6)                         # 2.5 + 1.5 fits, 2.5 + 1.6 does not
    # a GPU start (minutes of loading and graph capture) affords both rounds of a probe of a fraction of a second;
    # the CPU engine's (about 10 s before the probes, a quarter of a second a forward) one
    assert StartBudget(started=0.0, clock=lambda: 120.0).more(0.4)
    assert not StartBudget(started=0.0, clock=lambda: 10.0).more(0.53)
    assert START_SHARE <= 0.1
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="share"):
            StartBudget(share=bad, started=0.0)


def test_start_budget_follows_the_groups_decision():
    """Under tensor parallelism each rank's clock decides alone; ``agree`` (the worker's broadcast from rank 0)
    gets the local decision and its answer is the budget's, either way."""
    from sglang_hybrid.sglang_plugin.startup_costs import StartBudget

    seen = []
    says_no = StartBudget(started=0.0, clock=lambda: 1000.0, agree=lambda local: seen.append(local) or False)
    says_yes = StartBudget(started=0.0, clock=lambda: 1.0, agree=lambda local: seen.append(local) or True)
    assert not says_no.more(0.1) and says_yes.more(5.0) and seen == [True, False]


def test_probes_with_a_spent_budget_time_each_size_once():
    """With the budget spent after the first round, the probe plan is a warm-up, one round over every size, and the
    short context's forward; the table records the one round and the budget."""
    from sglang_hybrid.sglang_plugin import startup_costs

    calls, now = [], [10.0]

    def forward(n):                                                        # each forward 0.1 s on the budget's clock
        calls.append(n)
        now[0] += 0.1

    spent = startup_costs.StartBudget(started=3.0, clock=lambda: now[0])   # 0.35 s: spent by a warm-up and a round
    short, long = startup_costs._profile_contexts((64, 512), lambda c: None, forward, [12, 24, 48], [1, 2, 4],
                                                  None, spent)
    assert calls == [12, 12, 24, 48] + [48] * startup_costs.SHORT_ROUNDS
    assert long.meta["rounds"] == 1 and short.meta["rounds"] == 1
    assert long.meta["start_budget_s"] == short.meta["start_budget_s"] == pytest.approx(0.35)


def test_measured_table_default_widths_are_eagles_the_full_tree_and_the_extras_that_fit():
    """With the table measured at start (the default on a GPU), the engine verifies at plain EAGLE's width (steps + 1),
    the whole tree, and the extras (their geometric middle, then one narrower than EAGLE's), the price picking per step;
    on a GPU the worker keeps an extra only while its runtime states fit the free memory (``fits_widths_to_memory``;
    tests/plugin/test_memory_budget.py). A user's table keeps the buckets; no price keeps the full width; explicit
    widths win, untrimmed; DP attention fixes one width."""
    s = HybridSettings()                                      # merge, ngram_k 8: 4 steps -> 12 nodes, full width 13
    assert s.measure_cost_table == "auto"
    assert s.measures_cost_table("cuda") and not s.measures_cost_table("cpu")
    assert s.resolved_verify_widths(4) == (4, 5, 8, 13)
    assert s.resolved_shapes(4) == ((1, 2, 3, 4), (4, 5, 8, 13))           # the draft table measured too
    assert s.resolved_shapes(4, fixed=True) == ((4,), (13,))
    assert s.fits_widths_to_memory("cuda") and not s.fits_widths_to_memory("cpu")
    assert s.resolved_verify_widths(4, "cpu") == (13,)           # the CPU engine measures only when asked to
    on = HybridSettings(measure_cost_table="on")
    assert on.measures_cost_table("cpu") and on.resolved_verify_widths(4, "cpu") == (4, 5, 8, 13)
    assert not on.fits_widths_to_memory("cpu")                 # no free memory to fit on the CPU engine: all kept
    off = HybridSettings(measure_cost_table="off")
    assert not off.measures_cost_table("cuda") and off.resolved_verify_widths(4) == (13,)
    assert not off.fits_widths_to_memory("cuda")
    assert not HybridSettings(cost_table="t.json", measure_cost_table="on").measures_cost_table("cuda")
    assert HybridSettings(cost_table="t.json").resolved_verify_widths(4) == default_buckets(13)
    assert not HybridSettings(cost_table="t.json").fits_widths_to_memory("cuda")
    assert HybridSettings(verify_widths=[4]).resolved_verify_widths(4) == (4, 13)
    assert not HybridSettings(verify_widths=[4]).fits_widths_to_memory("cuda")
    assert HybridSettings(verify_widths=[]).resolved_verify_widths(4) == (13,)


def test_draft_table_is_measured_where_the_verify_table_is_and_no_draft_table_is_given():
    """Adaptive drafting comes with the tables measured at start (``measures_draft_table``): on a GPU by default, on
    the CPU engine when asked (``on``), never with ``off``. A user's draft table is loaded instead, ``draft_depths =
    []`` keeps one depth, and a one-step chain has no draft decode to time (nor a depth to choose). It does not
    depend on the verify table: a user's verify table with no draft table still measures the draft's."""
    s = HybridSettings()
    assert s.measures_draft_table("cuda", 4) and not s.measures_draft_table("cpu", 4)
    assert s.resolved_draft_depths(4) == (1, 2, 3, 4) and s.resolved_draft_depths(4, "cpu") == (4,)
    assert s.resolved_draft_depths(8) == (1, 2, 3, 4, 8)
    assert not s.measures_draft_table("cuda", 1) and s.resolved_draft_depths(1) == (1,)
    on = HybridSettings(measure_cost_table="on")
    assert on.measures_draft_table("cpu", 3) and on.resolved_draft_depths(3, "cpu") == (1, 2, 3)
    assert HybridSettings(measure_cost_table="on", draft_depths=[2]).resolved_draft_depths(4, "cpu") == (2, 4)
    off = HybridSettings(measure_cost_table="off")
    assert not off.measures_draft_table("cuda", 4) and off.resolved_draft_depths(4) == (4,)
    assert not HybridSettings(draft_depths=[]).measures_draft_table("cuda", 4)
    assert HybridSettings(draft_depths=[]).resolved_draft_depths(4) == (4,)
    given = HybridSettings(draft_cost_table="d.json")
    assert not given.measures_draft_table("cuda", 4) and given.resolved_draft_depths(4, "cpu") == (1, 2, 3, 4)
    assert HybridSettings(cost_table="t.json").measures_draft_table("cuda", 4)
    assert HybridSettings(ngram_k=24).resolved_verify_widths(4) == (4, 5, 12, 29)       # 28 nodes: middle sqrt(145)
    # choose mode with a chain no longer than EAGLE's: EAGLE's width is the full tree; the narrower extra stays
    assert HybridSettings(mode="choose", ngram_k=3).resolved_verify_widths(4) == (4, 5)


def test_measure_draft_costs_refuses_what_has_no_draft_decode_to_time():
    """A one-step chain runs no draft decode, and a tree draft (top-k > 1) is not the forward the table prices: both
    are refused by name before anything runs (the worker never asks: ``measures_draft_table``; the live suite's
    EAGLE-3 and tensor-parallel cases measure the table on SGLang's real draft worker)."""
    class Worker:                       # only the two settings the guard reads; nothing else is touched
        def __init__(self, steps, topk):
            self.speculative_num_steps, self.topk = steps, topk

    for steps, topk in ((1, 1), (4, 2)):
        with pytest.raises(ValueError, match=f"--speculative-num-steps {steps}, --speculative-eagle-topk {topk}"):
            measure_draft_costs(Worker(steps, topk), max_batch=4, context_len=1024)


def test_hybrid_step_restrict_widths_decides_among_the_kept_buckets_only():
    """The worker's start-up memory fit narrows the step's widths (``HybridStep.restrict_widths``): the decision is
    rebuilt on the kept buckets. With verify slots priced dear, the same inputs that pick width 4 before the fit pick
    the narrowest kept width (5) after it; selecting at a dropped width is refused; a set that drops the full tree or
    adds a width is refused; the same set again is a no-op."""
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    st = HybridStep(HybridSettings(measure_cost_table="on", decision_kernels="torch", log_interval=0), num_steps=4,
                    pool_size=4, device="cpu")
    assert st.widths == (4, 5, 8, 13)
    table = CostModel.linear(1e-3, 1e-3)                     # every verified token costs as much as the step
    st.set_cost(table, "measured")
    assert st.cost_model is table                             # the host copy the start-up width choice reads
    b = 3
    slots, seq, gen = torch.arange(b), torch.full((b,), 12), torch.zeros(b, dtype=torch.int64)
    root, chain = torch.tensor([1, 2, 3]), torch.tensor([[4, 5, 6, 7]] * b)
    conf = torch.tensor([[0.9, 0.5, 0.2, 0.1]] * b)

    def decide(width):
        return st.select(root, chain, conf, slots, gen, seq, width=width)

    assert int(decide(13).next_width) == 4
    before = st.decide
    st.restrict_widths((13, 8, 5))
    assert st.widths == (5, 8, 13) == st.decide.widths and st.decide is not before
    d = decide(8)
    assert d.tree.tokens.shape[1] == 8 and int(d.next_width) == 5
    with pytest.raises(ValueError, match="not one of the verify width buckets"):
        decide(4)
    for bad in ((5, 8), (5, 9, 13), (4, 13, 14)):
        with pytest.raises(ValueError, match="must be a subset"):
            st.restrict_widths(bad)
    kept = st.decide
    st.restrict_widths((5, 8, 13))
    assert st.decide is kept
