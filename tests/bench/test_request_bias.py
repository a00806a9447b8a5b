"""``bench.request_bias``: the engine walk through a recorded request, the online per-request correction, and the
held-out comparison on synthetic requests whose acceptance does / does not differ from the calibrated prediction by
request (no model runs)."""

import numpy as np
import pytest

from bench.request_bias import engine_steps, evaluate, main, online_predictions


def test_engine_walk_tests_the_chain_up_to_its_first_miss_and_steps_past_the_bonus_token():
    output = [5, 6, 7, 8, 9, 10]
    tokens = [[5, 6, 0], [6, 7, 8], [7, 1, 1], [8, 9, 3], [9, 10, -1], [10, -1, -1]]
    probs = [[0.9, 0.8, 0.7], [0.5] * 3, [0.4] * 3, [0.3, 0.2, 0.1], [0.6] * 3, [0.7] * 3]
    steps = engine_steps(tokens, probs, output)
    # p=0: 5, 6 hit, 0 misses -> 2 accepted, next step at 0 + 2 + 1 = 3; p=3: 8, 9 hit, 3 misses -> next at 6 (end)
    assert [list(y) for _, y in steps] == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    assert [list(q) for q, _ in steps] == [[0.9, 0.8, 0.7], [0.3, 0.2, 0.1]]


def test_online_bias_learns_only_from_outcomes_older_than_the_lag():
    steps = [(np.array([0.5]), np.array([1.0]))] * 4
    no_lag, lag2 = online_predictions(steps, 0.5, 0), online_predictions(steps, 0.5, 2)
    assert no_lag[0] == pytest.approx(0.5) and no_lag[1] > 0.5 and np.all(np.diff(no_lag) > 0)
    assert list(lag2[:3]) == pytest.approx([0.5, 0.5, 0.5]) and lag2[3] > 0.5     # step 0's outcome arrives at 3


def _synthetic(offset_sd: float, n_req: int = 40, n_steps: int = 60, seed: int = 0):
    """Requests whose true acceptance is the calibrated one shifted by a per-request logit offset (sd ``offset_sd``)."""
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(n_req):
        off = rng.normal(0.0, offset_sd)
        steps = []
        for _ in range(n_steps):
            a = rng.uniform(0.1, 0.9, size=3)
            true = 1.0 / (1.0 + np.exp(-(np.log(a / (1 - a)) + off)))
            y = (rng.uniform(size=3) < true).astype(float)
            cut = int(np.argmin(y)) + 1 if (y == 0).any() else 3        # tested up to the first miss
            steps.append((a[:cut], y[:cut]))
        reqs.append(steps)
    return reqs


def test_correction_helps_when_requests_differ_and_costs_little_when_they_do_not():
    differ = evaluate(_synthetic(1.5), [0.05, 0.1])
    assert all(o["brier_diff_ci"][1] < 0 for o in differ["online"].values()), differ["online"]
    same = evaluate(_synthetic(0.0), [0.05])
    o = same["online"][0.05]
    # nothing to learn: no gain (the interval holds 0), and the noise the bias adds costs under 0.002 Brier
    assert o["brier_diff_ci"][0] < 0 < o["brier_diff_ci"][1] and abs(o["brier_diff"]) < 0.002, o
    assert same["calibrated"]["ece"] < 0.05                 # calibrated by construction


def test_cli_refuses_bad_options(tmp_path, capsys):
    for argv, msg in ((["--etas", "0.1,x"], "--etas must be comma-separated numbers"),
                      (["--etas", "0"], "--etas must be numbers > 0"), (["--lag", "-1"], "--lag must be >= 0")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "trace not found" in capsys.readouterr().err
