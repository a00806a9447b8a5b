"""HYBRID's Prometheus export (``sglang_plugin/prometheus.py``) fed by the real ``HybridCounters`` on CPU, into a
registry of its own: names and help texts by Prometheus conventions, values equal to the counters' summary, growth
by difference across exports. The live check against SGLang's ``/metrics`` is ``tests/live/test_server_live.py``."""
from __future__ import annotations

import pytest

from prometheus_client import CollectorRegistry  # noqa: E402

import torch  # noqa: E402

from sglang_hybrid.sglang_plugin.metrics import ACC, REQ, HybridCounters  # noqa: E402
from sglang_hybrid.sglang_plugin.prometheus import COUNTERS, PREFIX, PrometheusExport, series  # noqa: E402


def _counted(counters: HybridCounters) -> None:
    """One step's worth of counts through the counters' own host API, plus device-side totals as on_select /
    on_accept add them (two ngram requests accepting 3 and 1 drafts, one model request accepting 0), and each
    drafter's chain outcome (EAGLE: 3 tokens tested, 1 accepted; n-gram: 4 tested, 3 accepted)."""
    counters.on_select_host(12, depth=3, decision="fused")
    counters.on_ragged([5, 9, 2], 12, 16)
    counters.on_fallback("no_host_view", 2)
    counters.totals[0] += 1                          # STEPS
    counters.totals[REQ["ngram"]] += 2
    counters.totals[REQ["model"]] += 1
    counters.totals[ACC["ngram"]] += 4
    tested = torch.tensor([[True, True, False], [True, False, False]])
    counters.on_chain_outcome("model", tested, torch.tensor([[True, False, False], [False, False, False]]),
                              torch.tensor([[0.5, 0.25, 0.9], [0.75, 0.1, 0.1]]))
    counters.on_chain_outcome("ngram", torch.tensor([[True, True, True, True]]),
                              torch.tensor([[True, True, True, False]]), torch.full((1, 4), 0.5))


def _value(registry, name, **labels):
    return registry.get_sample_value(name, dict(model_name="m", **labels))


def test_server_prometheus_export_equals_the_counters_summary():
    registry = CollectorRegistry()
    counters = HybridCounters("cpu", log_interval=1)
    counters.exporter = PrometheusExport("m", registry=registry)
    _counted(counters)
    assert counters.maybe_log() is not None                # the log line fed the exporter
    _counted(counters)
    counters.maybe_log()
    total = counters.snapshot()
    assert _value(registry, f"{PREFIX}_decode_steps_total") == total["steps"] == 2
    assert _value(registry, f"{PREFIX}_request_steps_total", source="ngram") == total["chosen_ngram"] == 4
    assert _value(registry, f"{PREFIX}_request_steps_total", source="model") == 2
    assert _value(registry, f"{PREFIX}_request_steps_total", source="mixed") == 0      # shown before it counts
    assert _value(registry, f"{PREFIX}_accepted_draft_tokens_total", source="ngram") == 8
    assert _value(registry, f"{PREFIX}_width_steps_total", width="12") == 2
    assert _value(registry, f"{PREFIX}_depth_steps_total", depth="3") == 2
    assert _value(registry, f"{PREFIX}_ragged_verify_tokens_total") == total["ragged_tokens"] == 32
    assert _value(registry, f"{PREFIX}_ragged_padded_tokens_total") == total["ragged_padded_tokens"] == 72
    assert _value(registry, f"{PREFIX}_ragged_verify_rows_total") == total["ragged_rows"] == 32
    assert _value(registry, f"{PREFIX}_fallbacks_total", cause="no_host_view") == 4
    assert _value(registry, f"{PREFIX}_fallbacks_total", cause="plan_missing") == 0
    assert _value(registry, f"{PREFIX}_padded_slot_fraction") == total["padded_fraction"]
    assert _value(registry, f"{PREFIX}_chain_tokens_tested_total", side="model") == total["model_tested"] == 6
    assert _value(registry, f"{PREFIX}_chain_tokens_accepted_total", side="model") == 2
    assert _value(registry, f"{PREFIX}_chain_tokens_priced_total", side="model") == pytest.approx(3.0)
    assert _value(registry, f"{PREFIX}_chain_tokens_tested_total", side="ngram") == total["ngram_tested"] == 8
    assert _value(registry, f"{PREFIX}_chain_tokens_accepted_total", side="ngram") == 6
    assert _value(registry, f"{PREFIX}_chain_tokens_priced_total", side="ngram") == pytest.approx(4.0)


def test_server_prometheus_export_grows_by_difference_only():
    """An export of unchanged totals adds nothing; the exporter never double-counts what it already exported."""
    registry = CollectorRegistry()
    export = PrometheusExport("m", registry=registry)
    counters = HybridCounters("cpu")
    _counted(counters)
    export(counters.snapshot())
    export(counters.snapshot())
    assert _value(registry, f"{PREFIX}_decode_steps_total") == 1
    assert _value(registry, f"{PREFIX}_fallbacks_total", cause="no_host_view") == 2


def test_server_prometheus_names_follow_conventions():
    """Counters end in ``_total``, every family has a help text, every summary field the exporter reads exists."""
    registry = CollectorRegistry()
    PrometheusExport("m", registry=registry)
    families = {f.name: f for f in registry.collect()}
    for name in COUNTERS:
        family = families[f"{PREFIX}_{name}"]
        assert family.type == "counter" and family.documentation, name
        assert all(s.name in (f"{PREFIX}_{name}_total", f"{PREFIX}_{name}_created") for s in family.samples)
    assert families[f"{PREFIX}_padded_slot_fraction"].type == "gauge"
    counters = HybridCounters("cpu")
    _counted(counters)
    assert {name for name, _ in series(counters.snapshot())} == set(COUNTERS)
