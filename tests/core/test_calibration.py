"""Calibration: fitting recovers known curves, files round-trip and reject malformed input, the shipped default
reproduces its reported held-out numbers, and the replay labels drafts as the text dictates."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_hybrid import calibration_replay
from sglang_hybrid.calibration import (DEFAULT_HELDOUT_PATH, DEFAULT_PATH, CalibrationFileError, ModelCalibration,
                                       NgramCalibration, pav)
from sglang_hybrid.calibration_metrics import brier, ece
from sglang_hybrid.calibration_records import ModelRecords, NgramRecords
from sglang_hybrid.tools import calibrate

torch.set_num_threads(1)


def synthetic_records(n=150_000, seed=0):
    """Known acceptance depending on source, match length and depth (constant inside the default buckets)."""
    rng = np.random.default_rng(seed)
    ml = rng.choice([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64], n)
    total = rng.integers(1, 30, n)
    count = rng.integers(1, total + 1)
    depth = rng.integers(1, 6, n)
    src = rng.integers(0, 2, n)
    true = truth(ml, depth, src)
    acc = (rng.random(n) < true).astype(np.int8)
    return NgramRecords(ml, count, total, depth, src, acc, workload=np.where(src == 0, "code", "chat"),
                        doc=np.arange(n) // 50), true


def truth(ml, depth, src):
    return np.clip(0.95 - 0.75 * np.exp(-np.asarray(ml) / 5.0) - 0.03 * (np.asarray(depth) - 1)
                   - 0.1 * np.asarray(src), 0.0, 1.0)


def test_fit_recovers_known_curve():
    rec, true = synthetic_records()
    cal = NgramCalibration.fit(rec)
    pred = cal.predict(rec)
    assert np.mean(np.abs(pred - true)) < 0.02
    # per (source, depth, match) slice, averaged over the nuisance features
    for s in (0, 1):
        for d in (1, 3, 5):
            for m in (0, 2, 8, 32):
                sel = (rec.source == s) & (rec.depth == d) & (rec.match_len == m)
                assert abs(pred[sel].mean() - truth(m, d, s)) < 0.03, (s, d, m)
    # monotone in match length for every other cell
    assert (np.diff(cal.table, axis=2) >= -1e-12).all()
    ev = cal.evaluate(rec)
    assert ev["overall"]["ece_after"] < 0.01
    assert set(ev["per_workload"]) == {"chat", "code"}
    assert set(ev["per_position"]) == {"1", "2", "3", "4", "5"}


def test_device_tables_equal_host():
    rec, _ = synthetic_records(20_000, seed=1)
    cal = NgramCalibration.fit(rec)
    t = cal.to("cpu")
    args = [torch.tensor(v) for v in (rec.match_len, rec.count, rec.total, rec.depth, rec.source)]
    dev = t.acceptance(*args).numpy()
    assert dev.dtype == np.float32
    assert np.allclose(dev, cal.predict(rec), atol=1e-6)
    # any shape
    dev2 = t.acceptance(*[a[:12].reshape(3, 4) for a in args])
    assert np.allclose(dev2.reshape(-1), dev[:12])


def test_metrics_and_pav():
    assert ece([0.0, 1.0], [0, 1]) == 0.0
    assert abs(ece([0.8] * 10, [1] * 5 + [0] * 5) - 0.3) < 1e-12
    assert abs(brier([0.5, 1.0], [1, 1]) - 0.125) < 1e-12
    rng = np.random.default_rng(0)
    for _ in range(20):
        y, w = rng.random(7), rng.random(7) + 0.1
        fit = pav(y, w)
        assert (np.diff(fit) >= -1e-12).all()
        # optimality: no random monotone sequence does better in weighted least squares
        base = np.sum(w * (fit - y) ** 2)
        for _ in range(50):
            cand = np.sort(rng.random(7))
            assert np.sum(w * (cand - y) ** 2) >= base - 1e-12


def test_calibration_file_roundtrip_and_errors(tmp_path):
    rec, _ = synthetic_records(5_000)
    cal = NgramCalibration.fit(rec, corpus={"kind": "synthetic"})
    p = tmp_path / "cal.json"
    cal.save(p)
    back = NgramCalibration.load(p)
    assert np.allclose(back.table, cal.table, atol=1e-6) and back.corpus == {"kind": "synthetic"}
    good = json.loads(p.read_text())

    def bad(mutate, match):
        obj = json.loads(json.dumps(good))
        mutate(obj)
        q = tmp_path / "bad.json"
        q.write_text(json.dumps(obj))
        with pytest.raises(CalibrationFileError, match=match):
            NgramCalibration.load(q)

    bad(lambda o: o.update(format="x"), "'format'")
    bad(lambda o: o.update(version=2), "version")
    bad(lambda o: o.pop("table"), "missing field 'table'")
    bad(lambda o: o.update(table=o["table"][:1]), "'table' has shape")
    bad(lambda o: o["table"][0][0][0][0].__setitem__(0, 1.5), r"'table' values must be finite probabilities")
    bad(lambda o: o["edges"].update(match_len=[0, 3, 2]), "strictly increasing")
    bad(lambda o: o["edges"].pop("count"), r"edges\['count'\]")
    bad(lambda o: o.update(samples=[[1]]), "'samples'")
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(CalibrationFileError, match="not valid JSON"):
        NgramCalibration.load(tmp_path / "junk.json")
    with pytest.raises(FileNotFoundError):
        NgramCalibration.load(tmp_path / "missing.json")


def test_records_roundtrip_and_errors(tmp_path):
    rec, _ = synthetic_records(300)
    for name in ("r.npz", "r.jsonl"):
        rec.save(tmp_path / name)
        back = NgramRecords.load(tmp_path / name)
        for c in ("match_len", "count", "total", "depth", "source", "accepted", "workload", "doc"):
            assert np.array_equal(getattr(back, c), getattr(rec, c)), (name, c)
    cols = dict(match_len=[1], count=[2], total=[1], depth=[1], source=[0], accepted=[1])
    with pytest.raises(ValueError, match="count must not exceed total"):
        NgramRecords(**cols)
    with pytest.raises(ValueError, match="depth is 1-based"):
        NgramRecords(**{**cols, "count": [1], "depth": [0]})
    with pytest.raises(ValueError, match="'source'"):
        NgramRecords(**{**cols, "count": [1], "source": [0, 1]})
    with pytest.raises(ValueError, match="NaN"):
        NgramRecords(**{**cols, "count": [1], "match_len": [float("nan")]})
    (tmp_path / "x.jsonl").write_text('{"match_len": 1}\n')
    with pytest.raises(ValueError, match="lack column"):
        NgramRecords.load(tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="at least|zero records"):
        NgramCalibration.fit(rec.subset(np.zeros(len(rec), dtype=bool)))


def test_model_temperature_fit_recovers_known_temperatures(tmp_path):
    rng = np.random.default_rng(3)
    n = 40_000
    p = rng.uniform(0.02, 0.98, n)
    depth = rng.integers(1, 4, n)
    t_true = np.array([2.0, 0.5, 1.0])[depth - 1]
    z = np.log(p) - np.log1p(-p)
    acc = rng.random(n) < 1 / (1 + np.exp(-z / t_true))
    cal = ModelCalibration.fit(ModelRecords(p, depth, acc), positions=4)
    assert np.allclose(cal.temperatures[:3], [2.0, 0.5, 1.0], rtol=0.1)
    assert cal.metrics["train"]["ece_after"] < cal.metrics["train"]["ece_before"]
    dev = cal.to().acceptance(torch.tensor(p[:100], dtype=torch.float32), torch.tensor(depth[:100]))
    assert np.allclose(dev.numpy(), cal.acceptance_np(p[:100], depth[:100]), atol=1e-5)
    edge = cal.to().acceptance(torch.tensor([0.0, 1.0]), torch.tensor([1, 9]))
    assert edge.tolist() == [0.0, 1.0]
    cal.save(tmp_path / "m.json")
    assert np.allclose(ModelCalibration.load(tmp_path / "m.json").temperatures, cal.temperatures)
    (tmp_path / "bad.json").write_text(json.dumps({"format": "hybrid-spark-model-calibration", "version": 1,
                                                   "temperatures": [1.0, -1.0]}))
    with pytest.raises(CalibrationFileError, match="finite and positive"):
        ModelCalibration.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="prob must lie"):
        cal.to().acceptance(torch.tensor([1.5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="prob must be finite"):
        ModelRecords([float("nan")], [1], [1])


def test_acceptance_bad_input():
    rec, _ = synthetic_records(2_000)
    t = NgramCalibration.fit(rec).to()
    ok = [torch.tensor([1, 2]), torch.tensor([1, 1]), torch.tensor([2, 2]), torch.tensor([1, 2]), torch.tensor([0, 1])]
    with pytest.raises(TypeError, match="match_len must have an integer dtype"):
        t.acceptance(ok[0].float(), *ok[1:])
    with pytest.raises(ValueError, match="count has shape"):
        t.acceptance(ok[0], ok[1][:1], *ok[2:])
    with pytest.raises(ValueError, match="source must be 0"):
        t.acceptance(*ok[:4], torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="must share one device"):
        t.acceptance(*ok[:4], torch.zeros(2, dtype=torch.int64, device="meta"))


# ---------------------------------------------------------------------------------------------------------------
# the shipped default
# ---------------------------------------------------------------------------------------------------------------

def test_default_file_loads_and_reproduces_heldout_metrics():
    cal = NgramCalibration.load()                      # path=None -> shipped default
    assert cal.corpus.get("kind") == "replay" and cal.split.get("rule")
    held = NgramRecords.load(DEFAULT_HELDOUT_PATH)
    assert len(held) == cal.split["heldout_records"]
    rep = cal.metrics["heldout"]
    got = cal.evaluate(held)
    for key in ("ece_before", "ece_after", "brier_before", "brier_after"):
        assert abs(got["overall"][key] - rep["overall"][key]) < 1e-6, key
        for pos, block in rep["per_position"].items():
            assert abs(got["per_position"][pos][key] - block[key]) < 1e-6, (pos, key)
        for w, block in rep["per_workload"].items():
            assert abs(got["per_workload"][w][key] - block[key]) < 1e-6, (w, key)
    assert set(rep["per_workload"]) == {"chat", "code", "edit"}
    # the calibration is the point of the file: it must beat the raw frequency on held-out text
    assert got["overall"]["ece_after"] < got["overall"]["ece_before"]
    assert got["overall"]["brier_after"] < got["overall"]["brier_before"]
    assert DEFAULT_PATH.is_file()


# ---------------------------------------------------------------------------------------------------------------
# replay rule and CLI
# ---------------------------------------------------------------------------------------------------------------

class ScriptedDrafter:
    """Proposes a fixed chain per committed length; records the lifecycle calls."""

    def __init__(self, script):
        self.script, self.calls, self.committed = script, [], 0

    def start(self, rid, prompt):
        self.calls.append(("start", rid, len(prompt)))

    def extend(self, rid, toks):
        self.calls.append(("extend", rid, list(map(int, toks))))
        self.committed += len(toks)

    def propose(self, rids, k):
        chain = self.script.get(self.committed, [])
        n = len(chain)
        tok = np.full((1, k), -1, np.int32)
        tok[0, :n] = chain
        f = np.zeros((1, k), np.int32)
        f[0, :n] = np.arange(n) + 3
        return SimpleNamespace(tokens=tok, lengths=np.array([n], np.int32), match_len=f, count=np.ones_like(f),
                               total=np.ones_like(f) * 2, depth=np.where(f > 0, np.arange(k) + 1, 0)[None][0],
                               source=np.zeros((1, k), np.int8))

    def finish(self, rid, donate=True):
        self.calls.append(("finish", rid, donate))

    def remove(self, rid):
        self.calls.append(("remove", rid))


def test_replay_records_are_conditional_and_steps_mimic_decoding():
    resp = [10, 11, 12, 13, 14, 15]
    # at 0: drafts 10, 11, 99 -> hits, hits, miss ; step commits 10, 11, 12 (2 accepted + bonus)
    # at 3: drafts 13, 14, 15, 16 -> 3 hits then past the end (not a hit) ; commits 13, 14, 15
    d = ScriptedDrafter({0: [10, 11, 99, 12], 3: [13, 14, 15, 16]})
    cols = calibration_replay.replay_document(d, 7, [1, 2], resp, k=8)
    assert cols["accepted"] == [1, 1, 0, 1, 1, 1, 0]
    assert cols["depth"] == [1, 2, 3, 1, 2, 3, 4]
    assert [c for c in d.calls if c[0] == "extend"] == [("extend", 7, [10, 11, 12]), ("extend", 7, [13, 14, 15])]
    assert d.calls[-2:] == [("finish", 7, True), ("remove", 7)]
    d = ScriptedDrafter({0: [10, 99], 1: [11, 12]})
    cols = calibration_replay.replay_document(d, 1, [1], resp[:3], k=4, step_mode="token")
    assert cols["accepted"] == [1, 0, 1, 1]
    assert [c[2] for c in d.calls if c[0] == "extend"] == [[10], [11], [12]]


def test_cli_fits_from_records(tmp_path, capsys):
    rec, _ = synthetic_records(20_000, seed=5)
    rec.save(tmp_path / "logs.npz")
    out = tmp_path / "cal.json"
    assert calibrate.main(["--from-records", str(tmp_path / "logs.npz"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held-out" in text and "workload chat" in text and "position 1" in text
    cal = NgramCalibration.load(out)
    held = NgramRecords.load(tmp_path / "cal_heldout.npz")
    assert np.all(held.doc % 5 == 0) and len(held) == cal.split["heldout_records"]
    assert abs(cal.evaluate(held)["overall"]["ece_after"] - cal.metrics["heldout"]["overall"]["ece_after"]) < 1e-9


def write_synthetic_trace(path, n_req=12, k=4, seed=0):
    """A trace whose EAGLE drafts are over-confident: a draft with stated prob q hits w.p. sigmoid(logit(q) / 3)."""
    from sglang_hybrid.reference.trace import TraceHeader, TraceRecord, write_trace
    rng = np.random.default_rng(seed)
    recs = []
    for r in range(n_req):
        motif = rng.integers(0, 50, 6).tolist()
        out = (motif * 12)[:60]
        toks, probs = [], []
        for p in range(len(out)):
            row_t, row_p = [], []
            for j in range(k):
                q = float(rng.uniform(0.02, 0.98))
                true = 1 / (1 + np.exp(-np.log(q / (1 - q)) / 3))
                right = p + j < len(out) and rng.random() < true
                row_t.append(int(out[p + j]) if right else 999)
                row_p.append(q)
            toks.append(row_t)
            probs.append(row_p)
        recs.append(TraceRecord(f"r{r}", "code" if r % 2 else "chat", motif, out, toks, probs))
    write_trace(path, TraceHeader("m", "d", 0.0, k), recs)


def test_cli_fits_both_drafters_from_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace)
    rec = calibration_replay.model_records_from_trace(trace)
    assert len(rec) > 0 and set(rec.workload.tolist()) == {"chat", "code"}
    # conditional records: depth j + 1 appears only after a hit at depth j of the same row
    assert (rec.depth >= 1).all() and (rec.depth <= 4).all()
    hi = rec.prob > 0.8
    assert np.mean(rec.accepted[hi]) < np.mean(rec.prob[hi])   # over-confident by construction
    out, mout = tmp_path / "ng.json", tmp_path / "model.json"
    assert calibrate.main(["--trace", str(trace), "--out", str(out), "--model-out", str(mout),
                           "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "model drafter: temperatures" in text and "held-out" in text
    m = ModelCalibration.load(mout)
    assert 2.0 < m.temperatures[0] < 4.5                       # true temperature 3
    assert m.metrics["heldout"]["ece_after"] < m.metrics["heldout"]["ece_before"]
    ng = NgramCalibration.load(out)
    assert ng.corpus["trace"] == str(trace) and ng.split["train_records"] > 0


def test_cli_model_fit_with_a_separate_heldout_trace(tmp_path, capsys):
    """--model-heldout-trace: fit on every record of --trace, report on the other trace; --trace alone with
    --model-out fits only the model drafter."""
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    write_synthetic_trace(train)
    write_synthetic_trace(held, seed=1)
    mout = tmp_path / "model.json"
    assert calibrate.main(["--trace", str(train), "--model-heldout-trace", str(held), "--model-out", str(mout),
                           "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "model drafter: temperatures" in text and "train (" not in text   # no n-gram fit was asked for
    m = ModelCalibration.load(mout)
    n_train = len(calibration_replay.model_records_from_trace(train))
    n_held = len(calibration_replay.model_records_from_trace(held))
    assert m.metrics["train"]["n"] == n_train and m.metrics["heldout"]["n"] == n_held
    assert m.metrics["heldout"]["ece_after"] < m.metrics["heldout"]["ece_before"]
    assert str(held) in m.corpus["split"]
