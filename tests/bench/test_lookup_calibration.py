"""``bench.lookup_calibration``: the records it scores, on a trace whose text repeats (hand-checkable)."""
from __future__ import annotations

from bench import lookup_calibration
from bench.replay import drafts as replay_drafts
from sglang_hybrid.calibration import NgramCalibration
from tests.helpers.replay_traces import one_request_trace


def test_records_label_each_token_given_its_parent_was_right():
    """Output = a 5-token motif repeated 8 times: after the first period both the lookup and the host drafter copy
    it, so nearly every tested token is right. Tokens after a wrong one are not tested, so a drafter wrong at every
    position of the first period contributes one 0 per position there, not eight."""
    motif = [11, 12, 13, 14, 15]
    reqs = one_request_trace(k=8, prompt=[1, 2, 3], output=motif * 8)
    bank = replay_drafts.DraftBank(reqs, 8, ngram_width=8)
    recs = lookup_calibration._records(reqs, [0], bank, NgramCalibration.load())
    for name in ("lookup", "drafter"):
        pred, label = recs[name]
        assert len(pred) == len(label) > 100, name
        assert ((pred >= 0) & (pred <= 1)).all()
        assert label.mean() > 0.9, (name, label.mean())
        assert (1 - label).sum() <= len(motif) + 1, (name, (1 - label).sum())    # at most one miss per early row
