"""calibration_check: the metrics detect (mis)calibration, the step view agrees with the replay records, the
expected-accepted-tokens sum is the survival sum, and the CLI runs end to end on a tiny synthetic trace."""
import json

import numpy as np
import pytest

from sglang_hybrid import calibration_replay
from sglang_hybrid.calibration import DEFAULT_EDGES, NgramCalibration, _shape
from sglang_hybrid.calibration_records import NgramRecords
from sglang_hybrid.tools import calibration_check as cc
from sglang_hybrid.reference.trace import TraceHeader, TraceRecord, write_trace


def table_calibration(fn):
    """A calibration whose acceptance depends only on depth: ``fn(depth bucket index) -> rate``."""
    shape = _shape(DEFAULT_EDGES)
    table = np.zeros(shape)
    for d in range(shape[1]):
        table[:, d] = fn(d)
    return NgramCalibration(DEFAULT_EDGES, table, np.zeros(shape, dtype=np.int64))


def synthetic_records(cal, n=40_000, seed=0, distort=lambda p: p):
    """Records whose true acceptance is ``distort(table value)``: identity = perfectly calibrated table."""
    rng = np.random.default_rng(seed)
    depth = rng.integers(1, 9, n)
    total = rng.integers(1, 20, n)
    count = rng.integers(0, total + 1)
    ml = rng.integers(0, 40, n)
    src = rng.integers(0, 2, n)
    p = cal.acceptance_np(ml, count, total, depth, src)
    acc = (rng.random(n) < distort(p)).astype(np.int8)
    return NgramRecords(ml, count, total, depth, src, acc, workload=np.where(src == 0, "code", "chat"),
                        doc=np.arange(n) // 200)


CAL = table_calibration(lambda d: 0.15 + 0.1 * d)        # 0.15 .. 0.85 over the 8 depth buckets


def test_calibrated_records_give_ece_at_noise_floor():
    rec = synthetic_records(CAL)
    m = cc.record_metrics(CAL, rec)
    for w in ("all", "chat", "code"):
        a = m[w]["all"]
        assert a["ece_after"] < 0.02
        assert a["ece_after"] < 3 * a["ece_after_floor"] + 0.005
        assert abs(a["mean_after"] - a["hit_rate"]) < 0.015
        lo, hi = a["ece_after_ci90"]
        assert lo <= a["ece_after"] + 1e-9 and hi >= lo
    # per position: each depth has a single predicted value, so ECE = |pred - observed rate|
    for p, b in m["all"]["positions"].items():
        assert b["ece_after"] < 0.04, p


def test_miscalibrated_records_are_detected():
    rec = synthetic_records(CAL, distort=lambda p: p ** 2)   # truth well below the table
    m = cc.record_metrics(CAL, rec)["all"]["all"]
    assert m["ece_after"] > 0.1
    assert m["ece_after"] > 5 * m["ece_after_floor"]
    assert m["mean_after"] - m["hit_rate"] > 0.1
    truth = CAL.predict(rec) ** 2                    # on the same labels the true rates score a better Brier
    assert cc.block_metrics(truth, truth, rec.accepted)["brier_after"] < m["brier_after"] - 0.01


def test_noise_floor_shrinks_with_n():
    rng = np.random.default_rng(1)
    small = cc.ece_noise_floor(rng.random(200))
    big = cc.ece_noise_floor(rng.random(20_000))
    assert big < small / 3


def test_step_estimate_is_sum_of_survivals():
    half = table_calibration(lambda d: 0.5)
    k = 8
    steps = cc.Steps(length=np.array([3, 0, 8]), accepted=np.array([1, 0, 8]),
                     match_len=np.full((3, k), 5), count=np.full((3, k), 2), total=np.full((3, k), 4),
                     depth=np.tile(np.arange(1, k + 1), (3, 1)), source=np.zeros((3, k), dtype=np.int64),
                     workload=np.array(["code"] * 3), doc=np.zeros(3, dtype=np.int64))
    before, after = cc.step_estimates(half, steps)
    np.testing.assert_allclose(after, [0.5 + 0.25 + 0.125, 0.0, sum(0.5 ** j for j in range(1, 9))])
    np.testing.assert_allclose(before, after)       # raw count/total = 2/4 = 0.5 as well


def test_step_metrics_expected_matches_realised_when_calibrated():
    rng = np.random.default_rng(2)
    a, k, n = 0.7, 8, 20_000
    const = table_calibration(lambda d: a)
    hits = rng.random((n, k)) < a
    accepted = np.where(hits.all(axis=1), k, np.argmin(hits, axis=1))     # leading hits
    steps = cc.Steps(length=np.full(n, k), accepted=accepted, match_len=np.full((n, k), 3),
                     count=np.ones((n, k)), total=np.full((n, k), 2), depth=np.tile(np.arange(1, k + 1), (n, 1)),
                     source=np.zeros((n, k), dtype=np.int64), workload=np.array(["chat"] * n),
                     doc=np.arange(n))
    good = cc.step_metrics(const, steps)["chat"]
    assert abs(good["ratio_after"] - 1.0) < 0.03
    assert abs(good["survival"]["3"]["predicted"] - a ** 3) < 1e-6
    assert abs(good["survival"]["3"]["observed"] - a ** 3) < 0.02
    bad = cc.step_metrics(table_calibration(lambda d: 0.9), steps)["chat"]
    assert bad["ratio_after"] > 1.5                  # over-confident table over-predicts accepted tokens


def _docs():
    rng = np.random.default_rng(3)
    base = rng.integers(0, 50, 40).tolist()
    code_prompt = base + rng.integers(0, 50, 20).tolist()
    docs = [("code", code_prompt, base[:30] + rng.integers(0, 50, 10).tolist() + base[5:25], "c0"),
            ("chat", rng.integers(0, 50, 15).tolist(), (base[:12] * 3) + rng.integers(0, 50, 8).tolist(), "h0"),
            ("code", base[10:], base + base[:20], "c1")]
    return docs


@pytest.mark.parametrize("corpus", ["shared", "isolated"])
def test_steps_align_with_calibrate_records(corpus):
    docs = _docs()
    rec, steps = cc.replay_with_steps(docs, k=6, corpus=corpus)
    if corpus == "shared":                           # identical to calibration_replay.replay, which it must mirror
        ref = calibration_replay.replay(docs, k=6, progress=False)
        for c in ("match_len", "count", "total", "depth", "source", "accepted", "doc"):
            np.testing.assert_array_equal(getattr(rec, c), getattr(ref, c))
    assert len(rec) > 20 and rec.accepted.sum() > 10
    # every record is accounted for by exactly one step, and steps cover each output exactly
    tested = np.minimum(steps.accepted + 1, steps.length)
    assert tested.sum() == len(rec)
    for d, (_w, _p, out, _n) in enumerate(docs):
        m = steps.doc == d
        pos = 0
        for acc in steps.accepted[m]:                # replay advances by accepted + bonus, clipped at the end
            assert pos < len(out)
            pos += min(int(acc) + 1, len(out) - pos)
        assert pos == len(out)
        assert rec.accepted[rec.doc == d].sum() == steps.accepted[m].sum()
    # first feature column of each drafted step equals the first record of that step
    firsts = np.concatenate([[0], np.cumsum(tested)[:-1]])[steps.length > 0]
    np.testing.assert_array_equal(steps.match_len[steps.length > 0, 0], rec.match_len[firsts])


def test_replay_rejects_bad_arguments():
    with pytest.raises(ValueError, match="corpus"):
        cc.replay_with_steps(_docs(), corpus="global")
    with pytest.raises(ValueError, match="k must be"):
        cc.replay_with_steps(_docs(), k=0)


def test_cli_end_to_end_on_tiny_trace(tmp_path, capsys):
    k = 2
    recs = [TraceRecord(name, w, list(map(int, p)), list(map(int, o)), [[-1] * k] * len(o), [[0.0] * k] * len(o))
            for w, p, o, name in _docs()]
    trace = write_trace(tmp_path / "t.jsonl", TraceHeader("tiny", "none", 0.0, k), recs)
    out = tmp_path / "check"
    assert cc.main(["--trace", str(trace), "--out", str(out), "-k", "6"]) == 0
    text = capsys.readouterr().out
    assert "workload code" in text and "workload chat" in text and "expected vs realised" in text
    png = out / "reliability_shared.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    m = json.loads((out / "metrics_shared.json").read_text())
    assert set(m["per_token"]) == {"all", "chat", "code"}
    assert m["per_token"]["all"]["all"]["n"] == sum(m["per_token"][w]["all"]["n"] for w in ("chat", "code"))
    assert m["per_step"]["all"]["steps_with_draft"] > 0


def test_cli_missing_trace(tmp_path):
    with pytest.raises(SystemExit, match="trace not found"):
        cc.main(["--trace", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)])


def _model_trace(tmp_path, k=3, n_docs=12, seed=0, temp=2.0):
    """A trace whose EAGLE chains hit with probability sigmoid(logit(p) / temp): raw p is overconfident when
    temp > 1, and a per-depth temperature fit recovers it."""
    rng = np.random.default_rng(seed)
    recs = []
    for d in range(n_docs):
        out = rng.integers(5, 50, 80).tolist()
        toks, probs = [], []
        for p in range(len(out)):
            row_t, row_p = [], []
            for j in range(k):
                q = float(rng.uniform(0.05, 0.99))
                hit = rng.random() < 1 / (1 + np.exp(-np.log(q / (1 - q)) / temp))
                tgt = out[p + j] if p + j < len(out) else 1
                row_t.append(int(tgt) if hit else int(tgt) + 100)
                row_p.append(round(q, 6))
            toks.append(row_t)
            probs.append(row_p)
        recs.append(TraceRecord(f"d{d}", "code" if d % 2 else "chat", [1, 2, 3], out, toks, probs))
    return write_trace(tmp_path / "m.jsonl", TraceHeader("tiny", "head", 0.0, k), recs)


def test_model_side_metrics_and_cli(tmp_path, capsys):
    from sglang_hybrid.calibration import ModelCalibration
    trace = _model_trace(tmp_path)
    rec = calibration_replay.model_records_from_trace(trace)
    ident = cc.model_record_metrics(ModelCalibration.identity(), rec)["all"]["all"]
    assert ident["ece_after"] == pytest.approx(ident["ece_before"]) and ident["ece_before"] > 0.05  # overconfident
    train = rec.doc % 3 != 0
    from sglang_hybrid.calibration_records import ModelRecords
    cal = ModelCalibration.fit(ModelRecords(rec.prob[train], rec.depth[train], rec.accepted[train]))
    assert 1.5 < cal.temperatures[0] < 2.7 and cal.temperatures[1] > 1.2   # the overconfidence is found
    held = ModelRecords(rec.prob[~train], rec.depth[~train], rec.accepted[~train], rec.workload[~train],
                        rec.doc[~train])
    m = cc.model_record_metrics(cal, held)["all"]["all"]
    assert m["ece_after"] < m["ece_before"] and m["ece_after"] < 3 * m["ece_after_floor"] + 0.01
    cal.save(tmp_path / "mc.json")
    out = tmp_path / "check"
    assert cc.main(["--trace", str(trace), "--out", str(out), "-k", "4", "--model-calibration",
                    str(tmp_path / "mc.json")]) == 0
    text = capsys.readouterr().out
    assert "model-drafter per-token conditional acceptance" in text and "summary:" in text
    assert any(line.strip().startswith("model") for line in text.splitlines())
    js = json.loads((out / "metrics_shared.json").read_text())
    assert js["model_per_token"]["all"]["all"]["n"] == len(rec)
    assert js["model_calibration"] == str(tmp_path / "mc.json")
