"""The decode step's launch path: nothing of HYBRID's n-gram host work runs before the step's first device launch.

The worker feeds the Rust drafter, proposes and publishes after the EAGLE draft is queued (``HybridDraftWorker.draft``
calls ``HybridWorkerV2.host_proposals`` between the draft launch and the decision), so the device drafts while the host
works; a request's automaton and prompt-lookup context are built at its prefill (``NgramFeeder.admit``), so the decode
step it joins copies none of its context. ``python -m bench.host_path`` times each part; these tests pin where each
runs, on the worker's own methods, the real Rust drafter and SGLang's real ``Req`` objects.
"""
from __future__ import annotations

from array import array
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_hybrid.ngram import NgramDrafter
from sglang_hybrid.sglang_plugin import worker as hw
from sglang_hybrid.sglang_plugin.ngram_host import ADMIT_GRACE_STEPS, NgramFeeder

pytestmark = pytest.mark.sglang


def _req(rid: str, prompt, out=()) -> Req:
    req = Req(rid, "", array("l", prompt), SamplingParams(max_new_tokens=64))
    req.output_ids.extend(out)
    return req


class _CountingDrafter:
    """The real Rust drafter, with the tokens each call hands it counted (what the host copies per step)."""

    def __init__(self, width: int):
        self.inner = NgramDrafter(max_draft=width)
        self.started: list = []
        self.extended = 0

    def start(self, did, tokens):
        self.started.append(len(tokens))
        return self.inner.start(did, tokens)

    def extend_batch(self, ids, tokens, lens):
        self.extended += int(np.sum(lens))
        return self.inner.extend_batch(ids, tokens, lens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_launch_path_the_draft_is_queued_before_the_ngram_work(monkeypatch):
    """``HybridDraftWorker.draft`` launches the EAGLE draft, then runs the host's n-gram work, then builds the verify
    input (the decision reads the proposals); ``before_launch``, the step's host work before the draft, touches no
    n-gram state."""
    order = []
    draft = hw.HybridDraftWorker.__new__(hw.HybridDraftWorker)
    draft.req_to_token_pool = draft.cuda_graph_runner = draft.draft_runner = draft.target_worker = None
    draft.topk, draft.speculative_num_steps, draft.speculative_num_draft_tokens = 1, 2, 11
    draft.target_worker = SimpleNamespace(model_runner=SimpleNamespace(kv_index_translator=None))
    draft.draft_attn_backend = SimpleNamespace(init_forward_metadata=lambda fb: order.append("plan"))
    forward_batch = SimpleNamespace(mark_forward_metadata_ready=lambda: None)
    monkeypatch.setattr(hw, "prepare_for_draft", lambda *a, **k: (forward_batch, False, None))

    def draft_forward(fb):
        order.append("draft")
        return None, None, torch.zeros((2, 2), dtype=torch.int64), None

    draft.draft_forward = draft_forward
    draft.step_conf = torch.ones(2, 2)
    draft.hybrid_owner = SimpleNamespace(host_proposals=lambda batch: order.append("ngram"),
                                         build_verify=lambda *a: order.append("decide") or SimpleNamespace())
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), spec_info=None)
    hw.HybridDraftWorker.draft(draft, batch)
    assert order == ["plan", "draft", "ngram", "decide"]

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the launch path touched the n-gram feeder ({name})")

    worker = SimpleNamespace(_launched=4, feeder=Untouchable())
    step = SimpleNamespace(req_pool_indices=torch.tensor([3, 1]), seq_lens=torch.tensor([9, 5]))
    slots, seq = hw.HybridWorkerV2.before_launch(worker, step)
    assert worker._launched == 5 and slots is step.req_pool_indices and torch.equal(seq, step.seq_lens)
    assert seq is not step.seq_lens                    # kept as it was before the step


def test_launch_path_admission_builds_at_prefill_and_the_first_step_copies_no_context():
    """Admitted at prefill, a request's automaton holds its whole prompt and its lookup context is staged; its first
    decode step hands the drafter only the tokens committed since and stages no context again."""
    width = 8
    drafter = _CountingDrafter(width)
    feeder = NgramFeeder(drafter, width, "cpu", max_bs=4, context=True)
    prompt = list(range(100, 160)) * 4                          # 240 tokens
    req = _req("a", prompt)
    staged = feeder.admit([req], torch.tensor([7]), [2])
    assert drafter.started == [240] and staged is not None and staged["flat"].shape == (3, 240)
    assert feeder.admit([req], torch.tensor([7]), [2]) is None  # known and staged: nothing again
    req.output_ids.extend([100, 101, 102])                      # the prefill's token and a verify step's
    out = feeder.stage_batch([req], torch.tensor([7]), [2])
    assert drafter.started == [240] and drafter.extended == 3 and "context" not in out
    assert int(out["scalars"][0, 1]) == 243 and int(out["scalars"][0, 0]) > 0    # proposes at the committed length


def test_launch_path_admitted_requests_survive_decode_steps_until_they_join():
    """A long prompt's prefill chunks interleave with decode steps of other requests: the admitted request is kept
    through them (``drop_absent``) for ``ADMIT_GRACE_STEPS`` steps, forgotten past that (an abort during prefill);
    once it has decoded, leaving the batch forgets it at once."""
    drafter = _CountingDrafter(8)
    feeder = NgramFeeder(drafter, 8, "cpu", max_bs=4)
    running, waiting = _req("run", list(range(30))), _req("wait", list(range(40)))
    feeder.admit([running, waiting])
    for _ in range(ADMIT_GRACE_STEPS):
        running.output_ids.append(1)
        feeder.stage_batch([running], torch.tensor([0]))
        feeder.drop_absent({"run"})
    assert "wait" in feeder._ids                                # still prefilling: kept
    running.output_ids.append(1)
    feeder.stage_batch([running], torch.tensor([0]))
    feeder.drop_absent({"run"})
    assert "wait" not in feeder._ids and "wait" not in feeder._admitted
    late = _req("late", list(range(50)))
    feeder.admit([late])
    late.output_ids.append(3)
    feeder.stage_batch([running, late], torch.tensor([0, 0]))  # decoding: no longer "admitted"
    feeder.drop_absent({"run"})
    assert "late" not in feeder._ids
