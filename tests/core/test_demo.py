"""The demo's fair measurement: interleaved schedule, the loop cost table (profile, monotone fit, file format, the
shipped default) and the cost-model time computed from a run's deterministic counts. No wall-clock assertions."""

import json

import numpy as np
import pytest
import torch

from sglang_hybrid.cost import CostModel
from sglang_hybrid.reference import costs as C
from sglang_hybrid.reference import eagle
from sglang_hybrid.reference.loop import ReferenceLoop, Result, StepRecord
from sglang_hybrid.reference.models import tiny_target
from sglang_hybrid.tools import demo

torch.set_num_threads(1)


def _costs(verify=(1.0, 0.1), lm=(0.5, 0.05), head=0.01):
    """verify(n) = 1 + 0.1 n, draft_lm(A) = 0.5 + 0.05 A, head step 0.01 (exact piecewise-linear tables)."""
    return C.LoopCosts(CostModel.linear(*verify, max_tokens=1024), CostModel.linear(*lm, max_tokens=64), head)


def _step(nodes, acc, eagle_len=0, source="ngram"):
    return StepRecord(source=source, n_nodes=nodes, accepted=acc, expected=0.0, lam=0.0, eagle_len=eagle_len,
                      ngram_len=0)


def test_schedule_is_round_robin_and_rotated():
    modes = ["none", "ngram", "eagle", "choose", "merge"]
    runs = demo.schedule(["code", "chat"], modes, 3)
    assert len(runs) == 3 * 2 * 5
    for rep in range(3):
        for w in ("code", "chat"):
            block = [m for r, ww, m in runs if r == rep and ww == w]
            assert sorted(block) == sorted(modes)            # every mode once per round and workload
    firsts = {next(m for r, ww, m in runs if r == rep and ww == "code") for rep in range(3)}
    assert len(firsts) == 3                                   # a different mode opens each round
    # the workloads' blocks are contiguous: all modes of a workload run back to back within a round
    assert [w for _, w, _ in runs[:10]] == ["code"] * 5 + ["chat"] * 5


def test_monotone_fit_is_pav():
    assert C.monotone_fit([1, 2, 3], [1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    fit = C.monotone_fit([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0])
    assert fit == pytest.approx([1.0, 2.5, 2.5, 4.0])         # the violating pair is pooled, not raised to a max
    assert np.all(np.diff(C.monotone_fit(list(range(6)), [5, 1, 4, 2, 8, 3])) >= 0)


def test_modeled_seconds_by_hand():
    cm = _costs()
    a = Result("a", "code", [1, 2, 3], output=[0] * 5, steps=[_step(3, 2, 4), _step(0, 0, 1)])
    b = Result("b", "chat", [1, 2], output=[0] * 3, steps=[_step(1, 1, 2)])
    got = C.modeled_seconds([a, b], cm)
    # step 0: verify(4) + verify(2); chain positions drafted by 2, 2, 1, 1 requests; head steps (4-1) + (2-1)
    # step 1: verify(1); one position by 1 request; head steps 0
    ver = (1.4 + 1.2) + 1.1
    draft = (0.6 + 0.6 + 0.55 + 0.55) + 0.01 * 4 + 0.55
    draft += 0.01 * (2 + 1)                                   # committing to the head: one per step per request
    pre = 1.2 + 1.1                                           # prefill of len(prompt) - 1 tokens
    assert got["verify"] == pytest.approx(ver)
    assert got["draft"] == pytest.approx(draft)
    assert got["prefill"] == pytest.approx(pre)
    assert got["total"] == pytest.approx(ver + draft + pre)
    counts = C.run_counts([a, b])
    assert counts == {"forwards": 3, "verified_tokens": 4 + 1 + 2, "accepted_per_step": 1.0, "eagle_drafted": 7,
                      "tokens": 8}


def test_cost_model_speedup_of_a_real_run():
    """Plain decoding vs n-gram on a repetitive prompt (tiny model): the n-gram run needs fewer forwards, and its
    cost-model time follows from its counts."""
    lm = tiny_target(0)
    head = eagle.new_head(lm.model.config, seed=1)
    prompt = [torch.randint(3, 96, (10,), generator=torch.Generator().manual_seed(0)).tolist() * 4]
    cm = _costs()
    out = {}
    for mode in ("none", "ngram", "eagle"):
        res = ReferenceLoop(lm.model, mode=mode, head=head, cost=cm.verify, eos_token_id=-1).generate(prompt, 30)
        out[mode] = (res, C.modeled_seconds(res, cm), C.run_counts(res))
    assert out["none"][2]["forwards"] == 30 and out["none"][1]["draft"] == 0.0
    assert out["none"][1]["verify"] == pytest.approx(30 * 1.1)
    assert out["eagle"][1]["draft"] > 0                       # EAGLE drafting is charged, n-gram drafting is not
    assert out["ngram"][1]["draft"] == 0.0
    assert out["ngram"][0][0].output == out["none"][0][0].output
    assert out["ngram"][2]["verified_tokens"] == sum(s.n_nodes + 1 for s in out["ngram"][0][0].steps)


def test_loop_costs_file_roundtrip_and_errors(tmp_path):
    cm = _costs()
    cm.meta = {"measured": "x"}
    p = cm.save(tmp_path / "t.json")
    back = C.LoopCosts.load(p)
    assert back.to_json() == cm.to_json()
    bad = cm.to_json()
    bad["format"] = "other"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(C.CostTableError, match="format"):
        C.LoopCosts.load(tmp_path / "bad.json")
    bad = cm.to_json()
    bad["verify"]["seconds"] = [2.0, 1.0]                     # far from monotone: a broken profile
    (tmp_path / "bad2.json").write_text(json.dumps(bad))
    with pytest.raises(C.CostTableError, match="monotone"):
        C.LoopCosts.load(tmp_path / "bad2.json")
    bad = cm.to_json()
    del bad["draft_head_seconds"]
    (tmp_path / "bad3.json").write_text(json.dumps(bad))
    with pytest.raises(C.CostTableError, match="draft_head_seconds"):
        C.LoopCosts.load(tmp_path / "bad3.json")


def test_shipped_table_is_valid_and_in_the_package():
    t = C.LoopCosts.load()
    assert C.DEFAULT_PATH.parent.name == "data" and C.DEFAULT_PATH.parent.parent.name == "sglang_hybrid"
    assert t.verify.sizes[0] == 1 and t.verify.sizes[-1] >= 13  # covers a full verify tree (n_nodes 12 + root)
    assert np.all(np.diff(t.verify.seconds) >= 0) and np.all(np.diff(t.draft_lm.seconds) >= 0)
    assert t.meta.get("measured") and t.meta.get("draft_dtype") in ("bfloat16", "float32")


def test_profile_loop_costs_on_tiny_model():
    lm = tiny_target(0)
    t = C.profile_loop_costs(lm.model, None, context=16, verify_sizes=(1, 2, 4), draft_rows=(1, 2), repeats=2)
    assert list(t.verify.sizes) == [1, 2, 4] and list(t.draft_lm.sizes) == [1, 2]
    assert np.all(np.diff(t.verify.seconds) >= 0) and t.draft_head > 0
    assert len(t.meta["raw_min_seconds"]["verify"]) == 3 and t.meta["repeats"] == 2


def test_target_report_and_table():
    rows = []
    for w, sp in (("code", {"ngram": 1.5, "eagle": 0.9, "choose": 1.6, "merge": 1.7}),
                  ("chat", {"ngram": 1.1, "eagle": 0.9, "choose": 1.0, "merge": 1.05})):
        for m in ("none", "ngram", "eagle", "choose", "merge"):
            s = sp.get(m, 1.0)
            rows.append({"workload": w, "mode": m, "speedup": s, "speedup_all": [s, s], "modeled_speedup": s,
                         "tok_s": 10 * s, "mean_accepted": 0.0, "forwards": 1, "verified_tokens": 1,
                         "share": {"eagle": 0, "ngram": 0, "both": 0, "none": 1}, "identical": True})
    rep = demo.target_report(rows)
    assert len(rep) == 4
    assert rep[0].endswith("MET") and "(merge) 1.70x" in rep[0] and rep[2].endswith("MISSED")
    assert "HYBRID merge" in demo.format_table(rows)


def test_profile_cpu_clock_needs_one_thread():
    lm = tiny_target(0)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="set_num_threads"):
            C.profile_loop_costs(lm.model, None, context=8, verify_sizes=(1, 2), draft_rows=(1,), repeats=1,
                                 clock="cpu")
        torch.set_num_threads(1)
        t = C.profile_loop_costs(lm.model, None, context=8, verify_sizes=(1, 2), draft_rows=(1,), repeats=1,
                                 clock="cpu")
        assert t.meta["clock"].startswith("process CPU time")
        with pytest.raises(ValueError, match="clock"):
            C.profile_loop_costs(lm.model, None, clock="sundial")
    finally:
        torch.set_num_threads(old)


def test_summarize_uses_the_least_disturbed_times_and_the_cost_model():
    cm = _costs()
    base = [Result("a", "chat", [1, 2], output=[0] * 2, steps=[_step(0, 0, source="none")] * 2)]
    spec = [Result("a", "chat", [1, 2], output=[0] * 2, steps=[_step(1, 1)])]
    b_mod = C.modeled_seconds(base, cm)["total"]               # 2 x verify(1) + prefill verify(1) = 3.3
    row = demo.summarize(spec, [2.0, 9.0], [4.0, 3.0], cm, b_mod)   # a burst hit round 2 of the mode
    assert row["speedup"] == pytest.approx(3.0 / 2.0)           # min over rounds, not the burst
    assert row["speedup_all"] == pytest.approx([2.0, 3.0 / 9.0])
    assert row["tok_s"] == pytest.approx(2 / 2.0)
    assert row["modeled_speedup"] == pytest.approx(3.3 / (1.2 + 1.1))
    assert row["forwards"] == 1 and row["verified_tokens"] == 2 and row["mean_accepted"] == 1.0


def test_default_threads():
    assert demo.default_threads(cores=2, load1=0.1) == 2
    assert demo.default_threads(cores=2, load1=1.5) == 1      # shared: one thread does not wait for a descheduled twin
    assert demo.default_threads(cores=1, load1=0.0) == 1


@pytest.mark.parametrize("argv, message", [
    (["--draft-depths", "0,x"], "--draft-depths must be comma-separated integers, got '0,x'"),
    (["--probe-half-life", "0"], "--probe-half-life must be a number of steps > 0 or 'none', got '0'"),
    (["--probe-half-life", "soon"], "--probe-half-life must be a number of steps > 0 or 'none', got 'soon'"),
    (["--model-bias-eta", "-1"], "--model-bias-eta must be a learning rate > 0 or 'none', got '-1'"),
])
def test_bad_adaptive_drafting_options_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_draft_position_cost_prices_one_chain_position():
    """The loop's adaptive drafting prices a chain position for R requests as one batched lm_head read plus R head
    steps: draft_lm(R) + R * draft_head."""
    c = _costs()
    d = c.draft_position()
    for r in (1, 4, 8):
        assert float(d.step_time_np(r)) == pytest.approx(0.5 + 0.05 * r + r * 0.01)
