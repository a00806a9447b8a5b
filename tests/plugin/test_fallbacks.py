"""Nothing silent: each way HYBRID runs other than its settings asked is counted (``fallback_<cause>`` in the counters'
summary, on ``/metrics`` through ``prometheus.series``) and logged once at warning level with its cause and fix.

The causes checked here: the decision on the torch operators where ``decision_kernels = auto`` asked for the fused
kernels (Triton missing, or ``TRITON_INTERPRET`` inherited on a GPU), draft confidences left unwritten (SGLang's draft
forward no longer calling the wrapped ``draft_runner.forward``), the draft's EAGLE variant unreadable, extra widths left
out because they do not pay, start-up probe rounds the budget did not afford. The worker-level causes of
``tests/plugin/test_sglang_worker.py`` (placeholder confidence, no host view, whole-table lookup) are counted the same
way.
"""
from __future__ import annotations

import logging
import shutil
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.speculative.eagle_worker_v2 as eagle_v2

from sglang_hybrid import kernels
from sglang_hybrid.cost import CostModel
from sglang_hybrid.sglang_plugin import spec_algo
from sglang_hybrid.sglang_plugin import worker as hw
from sglang_hybrid.sglang_plugin.config import ENV_EAGLE3, HybridSettings
from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep
from sglang_hybrid.sglang_plugin.metrics import FALLBACKS, HybridCounters, format_summary
from sglang_hybrid.sglang_plugin.prometheus import series
from sglang_hybrid.sglang_plugin.startup_costs import ROUNDS

pytestmark = pytest.mark.sglang


class _Records(logging.Handler):
    """The warnings one logger emits (read at the logger: SGLang's logging set-up may stop propagation)."""

    def __init__(self, logger: logging.Logger):
        super().__init__(logging.WARNING)
        self.logger, self.records = logger, []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)

    def about(self, cause: str) -> list:
        return [r for r in self.records if f"HYBRID fallback {cause}:" in r.getMessage()]


def _select(step: HybridStep) -> None:
    slots, seq = torch.tensor([0, 1]), torch.tensor([3, 3])
    step.select(torch.tensor([7, 8]), torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.full((2, 3), 0.9), slots,
                torch.tensor([0, 0]), seq)


def test_fallback_counted_every_cause_reaches_the_summary_the_log_line_and_metrics():
    counters = HybridCounters("cpu")
    for i, cause in enumerate(FALLBACKS):
        counters.on_fallback(cause, i + 1)
    out = counters.snapshot()
    line = format_summary(out)
    metrics = series(out)
    for i, cause in enumerate(FALLBACKS):
        assert out[f"fallback_{cause}"] == i + 1
        assert f"fallback_{cause}={i + 1}" in line
        assert metrics[("fallbacks", cause)] == i + 1
    assert len(set(FALLBACKS.values())) == len(FALLBACKS)       # one counter slot each


def test_fallback_counted_decision_on_torch_where_auto_asked_for_the_kernels():
    """This pytest process imported Triton without its interpreter, so the fused kernels cannot run on its CPU:
    ``decision_kernels = auto`` takes the torch operators, says why once at start, and counts every step it decides;
    ``decision_kernels = torch`` asked for them, so nothing is counted."""
    assert not kernels.available("cpu")
    logger = logging.getLogger("sglang_hybrid.sglang_plugin.hybrid_step")
    with _Records(logger) as log:
        counters = HybridCounters("cpu")
        step = HybridStep(HybridSettings(mode="choose", ngram_k=4), num_steps=3, pool_size=4, device="cpu",
                          counters=counters)
        _select(step)
        _select(step)
    assert step.fused is None and "TRITON_INTERPRET=1" in step.decision_fallback
    assert counters.snapshot()["fallback_decision_torch"] == 2
    assert counters.snapshot()["decision_steps"] == {"torch": 2}
    logs = log.about("decision_torch")
    assert len(logs) == 1 and logs[0].levelname == "WARNING" and "DECISION_KERNELS=torch" in logs[0].getMessage()

    asked = HybridCounters("cpu")
    step = HybridStep(HybridSettings(mode="choose", ngram_k=4, decision_kernels="torch"), num_steps=3, pool_size=4,
                      device="cpu", counters=asked)
    _select(step)
    assert step.decision_fallback is None and asked.snapshot()["fallback_decision_torch"] == 0


def test_fallback_counted_interpreter_inherited_on_a_gpu_is_named_with_its_fix(monkeypatch):
    """On CUDA the interpreter flag would run the kernels on the host: the reason names the variable to unset (checked
    without a GPU: the answer depends on the environment only)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "unset TRITON_INTERPRET" in kernels.unavailable_reason("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels.unavailable_reason("cuda") is None


def test_fallback_counted_confidences_left_unwritten_by_the_draft_forward(monkeypatch):
    """``HybridDraftWorker`` wraps ``draft_runner.forward`` to record each draft forward's confidence. Where SGLang's
    ``draft_forward`` stops calling it (a changed SGLang), the tokens past the first would keep stale confidences: the
    step is counted per request and logged once. The base method here stands in for such an SGLang: it calls the
    wrapped forward for one of the two draft forwards of a 3-step chain, then for both."""
    calls = {"n": 1}

    def sglang_draft_forward(self, forward_batch):
        for _ in range(calls["n"]):
            self.draft_runner.forward()
        return "drafted"

    monkeypatch.setattr(eagle_v2.EagleDraftWorker, "draft_forward", sglang_draft_forward)
    counters = HybridCounters("cpu")
    draft = hw.HybridDraftWorker.__new__(hw.HybridDraftWorker)
    draft.speculative_num_steps, draft.alternatives, draft._extend_capture = 3, 0, None
    draft.step_conf = torch.ones(2, 3)
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    draft.draft_runner = SimpleNamespace(
        forward=lambda: hw.HybridDraftWorker._record(draft, SimpleNamespace(next_token_logits=logits)))
    draft.hybrid_owner = SimpleNamespace(fallbacks=hw.Fallbacks(counters))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False),
                            spec_info=SimpleNamespace(topk_p=torch.tensor([[0.5], [0.25]])))
    with _Records(hw.logger) as log:
        assert draft.draft_forward(batch) == "drafted"
        assert draft.draft_forward(batch) == "drafted"
        calls["n"] = 2
        assert draft.draft_forward(batch) == "drafted"
    assert counters.snapshot()["fallback_conf_unwritten"] == 4        # two steps of two requests
    logs = log.about("conf_unwritten")
    assert len(logs) == 1 and "ran 1 of the 2 draft forwards" in logs[0].getMessage()
    assert torch.allclose(draft.step_conf[:, 2], torch.softmax(logits, -1).amax(-1))   # written once both ran


def test_fallback_counted_unreadable_draft_config_answers_eagle_once_logged(models, monkeypatch, tmp_path):
    """Without the launcher's answer (``ENV_EAGLE3``), ``is_eagle3`` reads the draft's config once SGLang has
    published its settings; a config that cannot be read answers EAGLE, is logged once and counted for the worker."""
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import prepare_server_args

    from sglang_hybrid.sglang_plugin import register

    monkeypatch.delenv(ENV_EAGLE3, raising=False)
    monkeypatch.setattr(spec_algo, "EAGLE3_PROBE_FAILURES", [])
    register()
    algo = spec_algo.HybridSpecAlgo.__new__(spec_algo.HybridSpecAlgo)
    assert algo.is_eagle3() is False and algo._eagle3 is None        # nothing published yet: not cached, not counted
    draft = tmp_path / "draft"
    shutil.copytree(models["eagle"], draft)
    sa = prepare_server_args(["--model-path", models["target"], "--skip-tokenizer-init", "--device", "cpu",
                              "--speculative-draft-model-path", str(draft)])
    sa.resolve_once()
    (draft / "config.json").write_text("{not json")                  # unreadable by the time a process asks
    try:
        publish(sa, role="scheduler")
        with _Records(spec_algo.logger) as log:
            assert algo.is_eagle3() is False and algo.is_eagle3() is False
    finally:
        reset_context()
    assert len(spec_algo.EAGLE3_PROBE_FAILURES) == 1 and algo._eagle3 is False
    logs = log.about("eagle3_probe")
    assert len(logs) == 1 and ENV_EAGLE3 in logs[0].getMessage()


def test_fallback_counted_start_up_choices_the_budget_and_the_price_made():
    """The worker names at start the probe rounds its time budget did not afford and the extra widths it left out
    because they do not pay at the running limit, each counted (``HybridWorkerV2._rounds_skipped`` on a measured
    table's metadata; the widths in ``_build_runtime_states``, whose rule ``widths.paying_extras`` is)."""
    counters = HybridCounters("cpu")
    worker = SimpleNamespace(fallbacks=hw.Fallbacks(counters))
    one_round = CostModel([4, 8], [0.01, 0.02], meta={"rounds": 1, "start_budget_s": 0.8})
    every_round = CostModel([4, 8], [0.01, 0.02], meta={"rounds": ROUNDS, "start_budget_s": 60.0})
    with _Records(hw.logger) as log:
        hw.HybridWorkerV2._rounds_skipped(worker, "target verify's cost table", every_round)
        hw.HybridWorkerV2._rounds_skipped(worker, "target verify's cost table", one_round)
        hw.HybridWorkerV2._rounds_skipped(worker, "draft forward's cost table", one_round)
    assert counters.snapshot()["fallback_probe_rounds_skipped"] == 2 * (ROUNDS - 1)
    logs = log.about("probe_rounds_skipped")
    assert len(logs) == 1 and f"1 of {ROUNDS} probe rounds" in logs[0].getMessage()
