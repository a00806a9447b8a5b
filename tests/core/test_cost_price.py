"""Cost model (table validation, interpolation, profiling helpers) and the goodput budget / price."""
import itertools
import json

import numpy as np
import pytest
import torch

from sglang_hybrid import cost as cost_mod
from sglang_hybrid.cost import CostFileError, CostModel, cost_from_one_batch, profile
from sglang_hybrid.price import price_device, price_rows

torch.set_num_threads(1)

STAIRCASE = CostModel([1, 4, 8, 16, 32, 64, 128, 256], [10.0, 10.2, 10.5, 12.0, 13.0, 16.0, 24.0, 45.0])


def test_step_time_device_equals_host_and_interpolates():
    n = np.array([0, 1, 2, 4, 6, 8, 100, 256, 300, 1000])
    host = STAIRCASE.step_time_np(n)
    dev = STAIRCASE.to().step_time(torch.tensor(n)).numpy()
    assert np.allclose(host, dev, rtol=1e-6)
    assert host[0] == 10.0 and host[1] == 10.0                 # clamped below the first size
    assert abs(host[4] - 10.35) < 1e-12                         # n = 6: halfway between 4 and 8
    slope = (45.0 - 24.0) / 128
    assert abs(host[8] - (45.0 + slope * 44)) < 1e-9            # last slope extrapolated


def test_small_noise_is_smoothed_and_large_drops_rejected():
    m = CostModel([1, 2, 3], [1.0, 0.95, 1.2])
    assert m.seconds.tolist() == [1.0, 1.0, 1.2]
    with pytest.raises(CostFileError, match="not monotone"):
        CostModel([1, 2, 3], [1.0, 0.5, 1.2])


@pytest.mark.parametrize("sizes,seconds,match", [
    ([], [], "empty"),
    ([1, 2], [1.0], "2 sizes but 1 seconds"),
    ([2, 1], [1.0, 2.0], "strictly increasing"),
    ([0, 1], [1.0, 2.0], "positive integers"),
    ([1, 2.5], [1.0, 2.0], "positive integers"),
    ([1, 2], [1.0, -2.0], "finite and positive"),
    ([1, 2], [1.0, float("nan")], "finite and positive"),
    ([1, 2], ["a", 1.0], "must be numbers"),
])
def test_bad_tables(sizes, seconds, match):
    with pytest.raises(CostFileError, match=match):
        CostModel(sizes, seconds)


def test_file_roundtrip_and_malformed_files(tmp_path):
    p = tmp_path / "cost.json"
    STAIRCASE.save(p)
    m = CostModel.load(p)
    assert m.sizes.tolist() == STAIRCASE.sizes.tolist() and np.allclose(m.seconds, STAIRCASE.seconds)
    bad = {
        "notjson.json": "{not json",
        "format.json": json.dumps({"format": "other", "version": 1, "sizes": [1], "seconds": [1.0]}),
        "version.json": json.dumps({"format": "hybrid-spark-cost", "version": 9, "sizes": [1], "seconds": [1.0]}),
        "missing.json": json.dumps({"format": "hybrid-spark-cost", "version": 1, "sizes": [1]}),
        "values.json": json.dumps({"format": "hybrid-spark-cost", "version": 1, "sizes": [1, 2],
                                   "seconds": [1.0, 0.0]}),
    }
    msgs = {"notjson.json": "not valid JSON", "format.json": "'format'", "version.json": "version",
            "missing.json": "seconds", "values.json": "finite and positive"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(CostFileError, match=msgs[name]):
            CostModel.load(tmp_path / name)


def test_profile_takes_median_after_warmup(monkeypatch):
    calls = []
    clock = [0.0]
    jitter = iter([5.0, 1.0, 2.0] * 10)

    def fn(n):
        calls.append(n)
        clock[0] += n * next(jitter)

    monkeypatch.setattr(cost_mod.time, "perf_counter", lambda: clock[0])
    m = profile(fn, [8, 2], warmup=1, repeats=3)
    assert calls == [2, 2, 2, 2, 8, 8, 8, 8]          # sorted sizes, 1 warm-up + 3 timed each
    # timed durations are n * (1, 2, 5) in some order after the warm-up consumed one jitter value -> median 2n
    assert m.sizes.tolist() == [2, 8]
    assert np.allclose(m.seconds, [2 * 2.0, 8 * 2.0])
    assert m.meta["statistic"] == "median"


def test_cost_table_from_one_batch_results(tmp_path):
    from sglang_hybrid.tools.cost_profile import main

    raw = tmp_path / "raw.jsonl"
    rows = [(1, 50.0), (8, 390.0), (64, 2500.0), (8, 410.0), (8, 400.0)]
    raw.write_text("\n".join(json.dumps({"batch_size": b, "last_gen_throughput": t, "latency": 1.0})
                             for b, t in rows) + "\n")
    model = cost_from_one_batch(raw)
    assert model.to_json()["sizes"] == [1, 8, 64]
    assert model.to_json()["seconds"] == pytest.approx([1 / 50.0, 8 / 400.0, 64 / 2500.0])
    out = tmp_path / "cost.json"
    assert main([str(raw), "--out", str(out)]) == 0
    assert CostModel.load(out).to_json()["sizes"] == [1, 8, 64]
    raw.write_text(json.dumps({"batch_size": 4, "last_gen_throughput": -1}) + "\n")
    with pytest.raises(ValueError, match="no decode throughput"):
        cost_from_one_batch(raw)
    raw.write_text('{"latency": 1}\n')
    with pytest.raises(ValueError, match="not a one_batch_server result line"):
        cost_from_one_batch(raw)


def brute_budget(s, r, cost):
    """Max goodput over every subset of slots (the top-b set must be optimal among subsets of size b)."""
    best, best_b = -1.0, None
    flat = s.reshape(-1)
    for k in range(flat.size + 1):
        for sub in itertools.combinations(range(flat.size), k):
            g = (r + flat[list(sub)].sum()) / cost.step_time_np(r + k)
            if g > best + 1e-12:
                best, best_b = g, k
    return best, best_b


def price_host(survivals, num_requests: int, cost: CostModel) -> tuple[int, float]:
    """The price maths of ``price_device`` in float64 numpy (an independent oracle): ``(b_star, lam)``."""
    s = np.asarray(survivals, dtype=np.float64).reshape(-1)
    srt = -np.sort(-s)
    csum = np.concatenate([[0.0], np.cumsum(srt)])
    b = np.arange(csum.size)
    g = (num_requests + csum) / cost.step_time_np(num_requests + b)
    b_star = int(np.argmax(g))
    n_star = num_requests + b_star
    lam = float(g[b_star] * (cost.step_time_np(n_star + 1) - cost.step_time_np(n_star)))
    padded = np.concatenate([[np.inf], srt, [0.0]]).astype(np.float32)   # float32: the same bounds as the device
    s_in, s_out = padded[b_star], padded[b_star + 1]
    lo = float(np.nextafter(s_out, np.float32(np.inf))) if s_out > 0 else 0.0
    lam = min(max(lam, lo), float(s_in))
    return b_star, lam


def test_budget_equals_brute_force_and_device_equals_host():
    rng = np.random.default_rng(0)
    for cost in (STAIRCASE, CostModel.linear(1.0, 0.2), CostModel([1, 3, 6, 10], [1.0, 1.0, 2.5, 3.0])):
        ct = cost.to()
        for trial in range(6):
            b, k = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            s = np.sort(rng.random((b, k)), axis=1)[:, ::-1] * (rng.random((b, 1)) < 0.8)
            r = b
            g_best, b_best = brute_budget(s, r, cost)
            b_host, lam_host = price_host(s, r, cost)
            g_host = (r + np.sort(s.reshape(-1))[::-1][:b_host].sum()) / cost.step_time_np(r + b_host)
            assert abs(g_host - g_best) < 1e-9 and b_host == b_best
            want_lam = g_best * (cost.step_time_np(r + b_best + 1) - cost.step_time_np(r + b_best))
            srt = np.sort(s.reshape(-1))[::-1]
            s_in = srt[b_best - 1] if b_best > 0 else np.inf
            s_out = srt[b_best] if b_best < srt.size else 0.0
            want_lam = min(max(want_lam, s_out), s_in)          # clamped between the budget and the rest
            assert abs(lam_host - want_lam) < 1e-6
            # the price selects exactly the budget (no ties in random survivals)
            s32 = s.astype(np.float32)                              # survivals are float32 in the engine
            assert int(((s32 > 0) & (s32 >= lam_host)).sum()) == b_host   # zero slots are never candidates
            b_dev, lam_dev = price_device(torch.tensor(s.copy(), dtype=torch.float32), r, ct)
            assert b_dev.dim() == 0 and lam_dev.dim() == 0
            assert int(b_dev) == b_host
            assert abs(float(lam_dev) - lam_host) < 1e-4 * max(1.0, lam_host)


def test_price_is_zero_when_memory_bound_and_rises_with_batch():
    flat = CostModel([1, 1024], [0.05, 0.05])
    s = torch.rand(4, 8)
    b, lam = price_device(s, 4, flat.to())
    assert float(lam) == 0.0
    lin = CostModel.linear(0.01, 0.0005, max_tokens=8192).to()
    lams = []
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 8, 64, 256):
        surv = torch.rand((batch, 8), generator=gen)
        lams.append(float(price_device(surv, batch, lin)[1]))
    assert all(x < y for x, y in zip(lams, lams[1:])), lams


def test_staircase_price_keeps_the_budget():
    """At a CUDA-graph bucket edge the marginal step time jumps; the price must still admit the chosen budget."""
    bucket = CostModel([1, 64, 65, 128], [1.0, 1.0, 2.0, 2.0])     # 64-token graph bucket, then a jump
    s = torch.linspace(0.95, 0.30, 60).reshape(4, 15)            # 4 requests: 4 + 60 = 64 tokens fit the bucket
    b, lam = price_device(s, 4, bucket.to())
    assert int(b) == 60
    raw = (4 + float(s.sum())) / 1.0 * (2.0 - 1.0)              # the unclamped marginal price, far above 1
    assert raw > 1.0 and float(lam) <= 0.30 + 1e-6
    assert int((s >= lam).sum()) == 60
    b_h, lam_h = price_host(s.numpy(), 4, bucket)
    assert b_h == 60 and abs(lam_h - float(lam)) < 1e-6


def test_price_rows_equal_pricing_each_candidate_set_alone():
    """``price_rows`` (adaptive drafting prices every candidate depth in one call) gives exactly ``price_device`` of
    each row: random survivals with zero padding, flat / linear / staircase tables, batch as int and as tensor."""
    gen = torch.Generator().manual_seed(3)
    tables = (CostModel([1, 1024], [0.05, 0.05]).to(), CostModel.linear(0.01, 0.0005, max_tokens=8192).to(),
              STAIRCASE.to())
    for ct in tables:
        for d, b, k in ((1, 1, 1), (3, 4, 6), (6, 16, 20)):
            s = torch.rand((d, b, k), generator=gen) * (torch.rand((d, b, k), generator=gen) > 0.3)
            for r in (b, torch.tensor(b)):
                b_rows, lam_rows = price_rows(s, r, ct)
                assert b_rows.shape == (d,) and lam_rows.shape == (d,)
                for i in range(d):
                    b_one, lam_one = price_device(s[i], r, ct)
                    assert int(b_rows[i]) == int(b_one) and float(lam_rows[i]) == float(lam_one)
    with pytest.raises(ValueError, match="survivals must be 3-D"):
        price_rows(torch.rand(4, 6), 4, STAIRCASE.to())


def test_price_bad_input():
    ct = STAIRCASE.to()
    with pytest.raises(ValueError, match="survivals must lie"):
        price_device(torch.tensor([[1.5]]), 1, ct)
    with pytest.raises(ValueError, match="NaN"):
        price_device(torch.tensor([[float("nan")]]), 1, ct)
    with pytest.raises(ValueError, match="survivals must be 2-D"):
        price_device(torch.tensor([0.5]), 1, ct)
    with pytest.raises(TypeError, match="CostTables"):
        price_device(torch.tensor([[0.5]]), 1, STAIRCASE)
    with pytest.raises(ValueError, match="num_requests"):
        price_device(torch.tensor([[0.5]]), -1, ct)
    with pytest.raises(ValueError, match="cost tables are on"):
        price_device(torch.zeros((1, 1), device="meta"), 1, ct)


def _two_contexts() -> "cost_mod.ContextCostModel":
    """Sizes 4..64; at 256 tokens a request flat, at 2,048 rising, and 5 % below the short table at 16 (noise)."""
    sizes = [4, 8, 16, 32, 64]
    return cost_mod.ContextCostModel(sizes, [1.0, 1.2, 1.9, 3.0, 5.0], [1.0, 1.0, 2.0, 2.1, 2.2], 256, 2048)


def test_two_context_table_blends_by_the_batch_context_on_device_as_on_host():
    """``ContextCostTables.follow`` (device) equals ``ContextCostModel.at`` (host): the short table at or below the
    short context, the long one at the long context, linear between, extrapolated past it and raised to its running
    maximum; the long table is raised to the short one where noise put it below."""
    m = _two_contexts()
    assert m.seconds.tolist() == [1.0, 1.2, 2.0, 3.0, 5.0]          # raised to the short table at 16
    dev = m.to()
    n = torch.tensor([1, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100])
    assert np.allclose(dev.step_time(n).numpy(), m.step_time_np(n.numpy()), rtol=1e-6)   # the long one until told
    for seq in ([10, 20, 30], [256, 256], [1000, 1200, 500], [2048], [4000, 3000], [9000, 9000]):
        dev.follow(torch.tensor(seq))
        host = m.at(float(np.mean(seq)))
        assert np.allclose(dev.step_time(n).numpy(), host.step_time_np(n.numpy()), rtol=1e-6), seq
        assert np.all(np.diff(host.step_time_np(n.numpy())) >= 0), seq        # never a negative marginal cost
    assert m.at(10).seconds.tolist() == m.at(256).seconds.tolist() == [1.0, 1.0, 2.0, 2.1, 2.2]
    assert np.allclose(m.at(2048).seconds, m.seconds)
    assert np.allclose(m.at(1152).seconds, [1.0, 1.1, 2.0, 2.55, 3.6])       # halfway
    # past the long context a table whose gap between the probes narrows with n would dip: held at its maximum
    dip = cost_mod.ContextCostModel([1, 2], [1.0, 2.0], [0.5, 1.9], 100, 200)
    assert dip.at(500).seconds.tolist() == [2.5, 2.5]               # 0.5 + 4 * 0.5 = 2.5, 1.9 + 4 * 0.1 = 2.3


def test_two_context_table_file_roundtrip_and_errors(tmp_path):
    m = _two_contexts()
    p = tmp_path / "cost.json"
    m.save(p)
    got = CostModel.load(p)
    assert isinstance(got, cost_mod.ContextCostModel)
    assert (got.short_context, got.long_context) == (256, 2048)
    assert got.short_seconds.tolist() == m.short_seconds.tolist() and got.seconds.tolist() == m.seconds.tolist()
    obj = json.loads(p.read_text())
    del obj["short_seconds"]
    p.write_text(json.dumps(obj))
    with pytest.raises(CostFileError, match=r"missing \['short_seconds'\]"):
        CostModel.load(p)
    with pytest.raises(CostFileError, match="must be below"):
        cost_mod.ContextCostModel([1, 2], [1.0, 2.0], [1.0, 2.0], 300, 300)
    with pytest.raises(CostFileError, match="short_context must be a positive int"):
        cost_mod.ContextCostModel([1, 2], [1.0, 2.0], [1.0, 2.0], 0, 300)
    with pytest.raises(CostFileError, match="2 sizes but 1 seconds"):
        cost_mod.ContextCostModel([1, 2], [1.0, 2.0], [1.0], 10, 300)
