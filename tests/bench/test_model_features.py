"""``bench.model_features``: the held-out comparison of model-confidence features, on synthetic records whose labels
depend on the features in a known way (the real run needs SmolLM2 and traces; docs/calibration_check.md)."""
import numpy as np

from bench.model_features import evaluate


def _records(n_req: int, per_req: int, seed: int, use_margin: bool) -> np.ndarray:
    """(request, depth, p1, p2, entropy, label) rows: the label follows p1 alone, or mostly the margin p1 - p2."""
    rng = np.random.default_rng(seed)
    n = n_req * per_req
    p1 = rng.uniform(0.2, 0.95, n)
    p2 = rng.uniform(0.0, 1.0, n) * (1 - p1)
    ent = rng.uniform(0.5, 4.0, n)
    prob = np.clip(p1 - 1.5 * p2, 0.02, 0.98) if use_margin else p1
    return np.stack([np.repeat(np.arange(n_req), per_req), rng.integers(1, 4, n), p1, p2, ent,
                     (rng.uniform(size=n) < prob).astype(float)], 1)


def test_features_that_carry_information_are_found_and_noise_is_not():
    helpful = evaluate(_records(12, 400, 0, True), _records(8, 400, 1, True), n_boot=300)
    assert helpful["brier_diff_ci"][1] < 0 and helpful["logloss_diff"] < 0
    assert helpful["table"][("all", "shape")]["auc"] > helpful["table"][("all", "temperature")]["auc"]
    useless = evaluate(_records(12, 400, 2, False), _records(8, 400, 3, False), n_boot=300)
    hi = useless["brier_diff_ci"][1]
    assert hi > 0 and abs(useless["brier_diff"]) < 0.002           # no help: the interval reaches above 0
    # the temperature model is the shipped form: calibrated on labels that follow p1, it stays close to p1
    assert useless["table"][("all", "temperature")]["ece"] < 0.03
