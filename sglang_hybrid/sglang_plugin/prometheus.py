"""HYBRID's counters on SGLang's Prometheus endpoint (``--enable-metrics``), beside SGLang's own ``sglang:`` metrics.

Why this shape: SGLang 0.5.23 serves ``/metrics`` from its HTTP process with prometheus_client's multiprocess
collector over ``PROMETHEUS_MULTIPROC_DIR``, which it sets before the scheduler processes start (they inherit it). A
counter created in the scheduler process, where HYBRID's worker lives, writes its value into that directory and
appears on ``/metrics`` with no route of HYBRID's own. The values come from ``HybridCounters.maybe_log``: every
``log_interval`` decode steps it hands the exporter the cumulative summary it already holds on the host (no device
sync in the step), and each Prometheus counter grows by the change since the last export. A scrape therefore trails
the device by up to one log interval (and, on a GPU, the step the copy takes to land); the CPU engine with
``log_interval`` 1 is exact. Only TP rank 0 exports: every rank counts the same steps, and multiprocess counters add
up across processes.

Names follow Prometheus conventions (``sglang_hybrid_<what>_total`` for counters, base units, one label per
dimension, ``model_name`` as SGLang labels its own); docs/sglang.md lists them.
"""
from __future__ import annotations

import logging
from typing import Optional

from .metrics import CLASSES, FALLBACKS, OUTCOME

logger = logging.getLogger("sglang_hybrid")

PREFIX = "sglang_hybrid"
#: counter name (without ``_total``) -> (extra label or None, help text)
COUNTERS = {
    "decode_steps": (None, "HYBRID decode steps (one verify forward each)"),
    "request_steps": ("source", "requests verified per decode step, by where the verified tree's draft came from: "
                                "none, model (EAGLE only), ngram (n-gram only), mixed (both)"),
    "accepted_draft_tokens": ("source", "draft tokens the target accepted (bonus token excluded), by the source of "
                                        "the verified tree"),
    "width_steps": ("width", "decode steps per verify width (tree nodes + root)"),
    "depth_steps": ("depth", "decode steps per EAGLE draft depth"),
    "ragged_verify_steps": (None, "decode steps verified ragged (each request verifies its own nodes only)"),
    "ragged_verify_tokens": (None, "target tokens (tree nodes, roots included) the ragged verify steps verified"),
    "ragged_verify_rows": (None, "rows the ragged verify forwards ran: their tokens padded to the token tier"),
    "ragged_padded_tokens": (None, "target tokens the ragged verify steps would have run padded to the step's width"),
    "chain_tokens_tested": ("side", "chain tokens a verify tested (those before the chain's first miss, within "
                                    "what the target committed), by drafter: model (EAGLE), ngram"),
    "chain_tokens_accepted": ("side", "tested chain tokens the target accepted, by drafter"),
    "chain_tokens_priced": ("side", "the acceptance HYBRID priced the tested chain tokens with, summed, by drafter "
                                    "(over chain_tokens_accepted: how well that drafter's calibration fits)"),
    "eagle_alternatives_verified": (None, "EAGLE alternatives verified (setting eagle_alternatives): tree nodes "
                                          "beside the chain's own token"),
    "eagle_alternatives_taken": (None, "requests whose accepted path left the EAGLE chain through a verified "
                                       "alternative"),
    "fallbacks": ("cause", "worker fallbacks by cause (docs/sglang.md, 'No silent fallbacks'); should stay 0"),
    "triton_compiles_after_start": (None, "HYBRID Triton kernel variants compiled after start (not among those "
                                          "compiled at start: a step stalled for the compiler); should stay 0"),
}
PADDED_GAUGE = "padded_slot_fraction"
PADDED_HELP = "share of verify slots (requests x verify width) that held padding, since the server started"


def series(total: dict) -> dict:
    """``(counter name, label value or None) -> cumulative value`` from a cumulative ``summarize()`` dict.

    Accepted tokens per source are rebuilt from the summary's mean and count (integers, exactly representable)."""
    out = {("decode_steps", None): total["steps"], ("ragged_verify_steps", None): total["ragged_steps"],
           ("ragged_verify_tokens", None): total["ragged_tokens"], ("ragged_verify_rows", None): total["ragged_rows"],
           ("ragged_padded_tokens", None): total["ragged_padded_tokens"],
           ("eagle_alternatives_verified", None): total["alternatives_verified"],
           ("eagle_alternatives_taken", None): total["alternatives_taken"]}
    for c in CLASSES:
        n = total[f"chosen_{c}"]
        out[("request_steps", c)] = n
        out[("accepted_draft_tokens", c)] = round(total[f"mean_accepted_{c}"] * n)
    for w, n in total["width_steps"].items():
        out[("width_steps", str(w))] = n
    for d, n in total["depth_steps"].items():
        out[("depth_steps", str(d))] = n
    for side in OUTCOME:
        n = total[f"{side}_tested"]
        out[("chain_tokens_tested", side)] = n
        out[("chain_tokens_accepted", side)] = round(total[f"{side}_accepted"] * n)
        out[("chain_tokens_priced", side)] = total[f"{side}_predicted"] * n
    for cause in FALLBACKS:
        out[("fallbacks", cause)] = total[f"fallback_{cause}"]
    out[("triton_compiles_after_start", None)] = total.get("triton_compiles_after_start", 0)
    return out


class PrometheusExport:
    """Prometheus counters fed with cumulative HYBRID summaries; call it with each one (``HybridCounters.exporter``)."""

    def __init__(self, model_name: str, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        registry = REGISTRY if registry is None else registry
        self.model_name = model_name
        self.counters = {
            name: Counter(f"{PREFIX}_{name}", text, ["model_name"] + ([label] if label else []), registry=registry)
            for name, (label, text) in COUNTERS.items()}
        self.padded = Gauge(f"{PREFIX}_{PADDED_GAUGE}", PADDED_HELP, ["model_name"], registry=registry,
                            multiprocess_mode="mostrecent")
        self._seen: dict = {}
        # every series with a fixed label set shows from the start, at 0 rather than absent (an alert on a fallback,
        # or a rate per source, needs the series before its first increment)
        fixed = {"source": CLASSES, "cause": tuple(FALLBACKS), "side": tuple(OUTCOME), None: (None,)}
        for name, (label, _) in COUNTERS.items():
            for value in fixed.get(label, ()):
                self.counters[name].labels(*self._labels(value))

    def _labels(self, value) -> tuple:
        return (self.model_name,) if value is None else (self.model_name, value)

    def __call__(self, total: dict) -> None:
        for (name, label), value in series(total).items():
            grown = value - self._seen.get((name, label), 0)
            if grown > 0:
                self.counters[name].labels(*self._labels(label)).inc(grown)
                self._seen[(name, label)] = value
        self.padded.labels(self.model_name).set(total["padded_fraction"])


def server_exporter(log_interval: int) -> Optional[PrometheusExport]:
    """The exporter when SGLang serves with ``--enable-metrics`` (read from SGLang's runtime context in the scheduler
    process, as its own metrics collector does), else None."""
    from sglang.srt.runtime_context import get_observability, get_serving

    if not get_observability().enable_metrics:
        return None
    if log_interval <= 0:
        logger.warning("HYBRID: --enable-metrics is on but log_interval is 0, so HYBRID's counters are not exported "
                       "to /metrics (they are exported at every log line): set SGLANG_HYBRID_LOG_INTERVAL to 1 or more")
        return None
    return PrometheusExport(get_serving().served_model_name)
