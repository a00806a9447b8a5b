"""HYBRID's per-step counters: accumulated on the device, logged from the host without blocking.

Why this shape: reading counters every step would put a device-to-host sync in the step. Instead the device adds
into one small tensor; every ``log_interval`` steps the host starts a non-blocking copy of it and, on a later step,
logs the difference once the copy has landed (``Event.query()``, never ``synchronize``).

Per request and step the verify tree is classed by where its draft nodes came from: *none* (no draft worth
verifying), *model* (EAGLE only), *ngram* (n-gram only), *mixed* (a merged tree, or tokens both drafters proposed).
Logged: requests per class, mean accepted draft tokens per class, mean price lambda, mean budget b*, how often an
n-gram proposal existed and how often it came from the device prompt lookup (the host's did not align), mean drafted
nodes, the share of verify slots that were padding, how many steps ran at each verify width bucket and EAGLE draft
depth (host counts: both are chosen on the host), under ragged verify the target tokens verified against what padding
would have cost and the fewest and most tokens per request of each step (host counts: the worker reads the node
counts to size the forward), and each side's calibration seen live: over the EAGLE chain tokens and, apart, the
n-gram chain tokens each verify tested (``request_bias.chain_outcome``: known whatever tree was verified), the mean
acceptance HYBRID priced them with against the fraction the target accepted (two numbers far apart say that side's
calibration does not fit this deployment: the model table, or the n-gram table, whose remedies are the online offsets
``model_bias_eta`` / ``ngram_bias_eta`` or a table refit on the deployment's verify logs).

Fallbacks (``fallback_<cause>``, see ``FALLBACKS``): every place the worker falls back from what it would normally do
is counted here (and logged once per worker and cause by ``worker.Fallbacks``), so none is silent. The host decides
each of them, so it knows the count and adds it to the device vector without a sync.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

import torch

from sglang_hybrid.selector import Source

logger = logging.getLogger("sglang_hybrid")

CLASSES = ("none", "model", "ngram", "mixed")
# layout of the counter vector
STEPS, LAM, BSTAR, NGRAM_AVAIL, NODES, REQS = 0, 1, 2, 3, 4, 5
REQ = {c: 6 + i for i, c in enumerate(CLASSES)}
ACC = {c: 10 + i for i, c in enumerate(CLASSES)}
SLOTS = 14          # verify slots paid for: requests x verify width
NGRAM_LOOKUP = 15   # requests whose n-gram proposal came from the device prompt lookup
MODEL_TESTED, MODEL_PRED, MODEL_HIT = 16, 17, 18   # EAGLE chain tokens tested; their priced acceptance; hits
#: what each fallback counts, by the summary's name ``fallback_<cause>``:
#: ``conf_placeholder``: requests whose first drafted token kept EAGLE's placeholder confidence 1.0 (the draft extend's
#: probability could not be recomputed; ``worker.first_token_confidence``);
#: ``no_host_view``: requests whose host n-gram proposals were dropped for a step (the batch has no host view of its
#: requests: ``worker.missing_host_view``);
#: ``lookup_whole_table``: requests whose device prompt lookup read the whole table, with no host-known bound on the
#: batch's contexts (``HybridWorkerV2._lookup_span``);
#: ``plan_missing``: steps whose chosen (EAGLE depth, verify width) had no runtime state; the worker kept its shapes
#: (``HybridWorkerV2._apply_plan``);
#: ``decision_torch``: steps decided by the torch operators although the setting ``decision_kernels`` = "auto" asked
#: for the fused kernels (Triton missing, or ``TRITON_INTERPRET`` inherited on a GPU: ``kernels.unavailable_reason``);
#: ``conf_unwritten``: requests of draft forwards (eager steps, or a draft graph's capture) whose confidences were not
#: all written, so EAGLE tokens kept the initial 1.0 (``HybridDraftWorker.draft_forward``);
#: ``eagle3_probe``: the draft model's EAGLE variant could not be read (``HybridSpecAlgo.is_eagle3``, counted at
#: start);
#: ``widths_unpaid``: extra verify widths left out at start because they do not pay at the running limit
#: (``widths.paying_extras``);
#: ``probe_rounds_skipped``: start-up probe rounds the start's time budget did not afford (``startup_costs``)
FALLBACKS = {"conf_placeholder": 19, "no_host_view": 20, "lookup_whole_table": 21, "plan_missing": 22,
             "decision_torch": 28, "conf_unwritten": 29, "eagle3_probe": 30, "widths_unpaid": 31,
             "probe_rounds_skipped": 32}
NGRAM_TESTED, NGRAM_PRED, NGRAM_HIT = 23, 24, 25   # n-gram chain tokens tested; their priced acceptance; hits
#: each side's chain outcome in the counter vector: (tested, priced acceptance summed, hits)
OUTCOME = {"model": (MODEL_TESTED, MODEL_PRED, MODEL_HIT), "ngram": (NGRAM_TESTED, NGRAM_PRED, NGRAM_HIT)}
#: EAGLE alternatives (setting ``eagle_alternatives``): verified alternative nodes; requests whose accepted path
#: took one
ALT_NODES, ALT_TAKEN = 26, 27
SIZE = 33


def tree_class(source: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 class index into ``CLASSES`` from a VerifyTree's ``source``/``valid``."""
    draft = valid.clone()
    draft[:, 0] = False
    has_m = (draft & (source == Source.MODEL)).any(1)
    has_n = (draft & (source == Source.NGRAM)).any(1)
    has_both = (draft & (source == Source.SHARED)).any(1)
    mixed = has_both | (has_m & has_n)
    return torch.where(mixed, 3, torch.where(has_n, 2, torch.where(has_m, 1, 0))).to(torch.int64)


def empty_ragged() -> dict:
    """The ragged verify counters before the first step (``HybridCounters.ragged``)."""
    return {"steps": 0, "tokens": 0, "rows": 0, "padded_tokens": 0, "node_range_steps": {}, "tier_steps": {},
            "graph_steps": 0, "graph_captures": 0}


class HybridCounters:
    def __init__(self, device, log_interval: int = 0, snapshot_path: Optional[str] = None):
        self.device = torch.device(device)
        self.snapshot_path = snapshot_path
        #: called with the cumulative summary at every log line (rank 0 under --enable-metrics: prometheus.py)
        self.exporter = None
        #: decode steps per verify width and per EAGLE draft depth (host ints: both are known on the host when the
        #: step is launched)
        self.width_steps: dict[int, int] = {}
        self.depth_steps: dict[int, int] = {}
        #: steps decided by each decision path ("fused": the Triton kernels, "torch": the reference operators)
        self.decision_steps: dict[str, int] = {}
        #: ragged verify (host ints: the worker reads each step's node counts to size the forward): steps, target
        #: tokens verified, the forward's rows (the tokens padded to their token tier), the tokens padding to the width
        #: would have cost, steps per "min-max" nodes per request and steps per token tier; the steps whose forward
        #: ran through the tier graphs (``ragged.graph_runner``) and the tier graphs captured
        self.ragged = empty_ragged()
        #: decode steps whose KV write window SGLang's draft planned (``KVLocPlan``: on a GPU whenever the verify
        #: width exceeds the draft depth; host int)
        self.kv_window_steps = 0
        #: what prices the verify slots, set at start (``HybridStep.set_cost``): {"source": "file" | "measured",
        #: "sizes", "seconds", "meta"} (host lists; a measured table's meta says how and in how long), or None
        self.cost_table: Optional[dict] = None
        #: what prices the EAGLE depths (adaptive drafting), set at start (``HybridStep.set_draft_cost``): the same
        #: layout, sizes in batch sizes; None where the depth is fixed
        self.draft_cost_table: Optional[dict] = None
        #: the runtime states built at start and the distinct parts behind them (``runtime_states.parts_built``), or
        #: None where one state serves every step
        self.runtime_parts: Optional[dict] = None
        #: SGLang's target verify CUDA graphs, set at start: "captured" (they run the padded verify), "not captured"
        #: (verify runs ragged: ``HybridWorkerV2._skip_target_verify_capture``), "dropped" (ragged verify, and SGLang
        #: captured them anyway: ``_drop_target_verify_graphs``) or "none" (SGLang captured none)
        self.target_verify_graphs: Optional[str] = None
        #: the learning rate of the n-gram side's online offset the worker runs at (setting ``ngram_bias_eta``,
        #: "auto" resolved by the verify layout at start), None when off
        self.ngram_offset_eta: Optional[float] = None
        #: how late the host's work reached the device, in decode steps (host ints): ``"plan"``, steps launched after
        #: the deciding step before its (depth, width) plan was applied (0 without overlap scheduling: the next step
        #: drafts at it; 1 with it: the step after next); ``"proposal"``, decode results still on their way to the
        #: host when a step's n-gram proposals were staged (0 without overlap; 1 with it, which the device alignment
        #: of ``alignment.align`` absorbs)
        self.lag_steps: dict[str, dict[int, int]] = {"plan": {}, "proposal": {}}
        self.totals = torch.zeros(SIZE, dtype=torch.float64, device=self.device)
        self.log_interval = log_interval
        self._host_steps = 0
        pin = self.device.type == "cuda"
        self._staging = torch.zeros(SIZE, dtype=torch.float64, pin_memory=pin)
        self._event: Optional[torch.cuda.Event] = None
        self._pending = False
        self._last = torch.zeros(SIZE, dtype=torch.float64)

    def on_select_host(self, width: int, depth: Optional[int] = None, decision: Optional[str] = None) -> None:
        """The host's share of ``on_select`` (steps per width, depth and decision path: host ints); the fused decision
        adds the device share itself (``kernels.decision._plan_kernel``)."""
        self.width_steps[width] = self.width_steps.get(width, 0) + 1
        if depth is not None:
            self.depth_steps[depth] = self.depth_steps.get(depth, 0) + 1
        if decision is not None:
            self.decision_steps[decision] = self.decision_steps.get(decision, 0) + 1

    def on_ragged(self, counts: list, width: int, rows: int) -> None:
        """Count one ragged verify step from its per-request node counts (root included) and the rows its forward
        ran (the token tier; host ints)."""
        r = self.ragged
        r["steps"] += 1
        r["tokens"] += sum(counts)
        r["rows"] += rows
        r["padded_tokens"] += len(counts) * width
        key = f"{min(counts)}-{max(counts)}"
        r["node_range_steps"][key] = r["node_range_steps"].get(key, 0) + 1
        r["tier_steps"][rows] = r["tier_steps"].get(rows, 0) + 1

    def on_lag(self, kind: str, steps: int) -> None:
        """Count one ``kind`` ("plan" or "proposal", see ``lag_steps``) that reached the device ``steps`` late."""
        counts = self.lag_steps[kind]
        counts[steps] = counts.get(steps, 0) + 1

    def on_ragged_graph(self, captured: bool) -> None:
        """Count one ragged verify forward run through the tier graphs (``ragged.graph_runner``): a replay, or the
        capture of its tier's graph (``captured``)."""
        self.ragged["graph_steps"] += 1
        self.ragged["graph_captures"] += int(captured)

    def on_select(self, tree, ngram_len: torch.Tensor, lam: torch.Tensor, b_star: torch.Tensor,
                  depth: Optional[int] = None, from_lookup: Optional[torch.Tensor] = None,
                  decision: Optional[str] = None) -> None:
        """Count one decode step; ``from_lookup [B]`` bool: rows whose n-gram proposal the device prompt lookup
        supplied; ``decision``: the path that decided it ("fused" or "torch")."""
        b, w = tree.tokens.shape
        self.on_select_host(w, depth, decision)
        cls = tree_class(tree.source, tree.valid)
        upd = torch.zeros(SIZE, dtype=torch.float64, device=tree.tokens.device)
        upd[STEPS] = 1
        upd[LAM] = lam.to(torch.float64)
        upd[BSTAR] = b_star.to(torch.float64)
        upd[NGRAM_AVAIL] = (ngram_len > 0).sum().to(torch.float64)
        upd[NODES] = (tree.valid.sum() - b).to(torch.float64)
        upd[REQS] = b
        upd[SLOTS] = b * w
        if from_lookup is not None:
            upd[NGRAM_LOOKUP] = from_lookup.sum().to(torch.float64)
        upd[6:10] = torch.nn.functional.one_hot(cls, 4).sum(0).to(torch.float64)
        self.totals += upd

    def on_accept(self, tree, accept_lens: torch.Tensor) -> None:
        cls = tree_class(tree.source, tree.valid)
        acc = (accept_lens.to(torch.float64) - 1).clamp(min=0)
        self.totals[10:14] += torch.zeros(4, dtype=torch.float64, device=acc.device).index_add_(0, cls, acc)

    def on_chain_outcome(self, side: str, tested: torch.Tensor, hit: torch.Tensor, acceptance: torch.Tensor) -> None:
        """Count the chain tokens of ``side`` ("model": the EAGLE chain, "ngram": the n-gram chain) a verify tested
        (``tested [B, S]`` bool), how many the target accepted (``hit``), and the acceptance they were priced with
        (``acceptance [B, S]``)."""
        first, _, last = OUTCOME[side]
        t = tested.to(torch.float64)
        self.totals[first:last + 1] += torch.stack(
            [t.sum(), (t * acceptance.to(torch.float64)).sum(), (t * hit.to(torch.float64)).sum()])

    def on_alternatives(self, nodes: torch.Tensor, taken: torch.Tensor) -> None:
        """Count one verify's EAGLE alternatives (``alternatives.alternatives_outcome``): the alternative nodes
        verified and the requests whose accepted path went through one (0-dim device tensors)."""
        self.totals[ALT_NODES:ALT_TAKEN + 1] += torch.stack([nodes, taken]).to(torch.float64)

    def on_fallback(self, cause: str, n: int = 1) -> None:
        """Count ``n`` (a host int: the host took the fallback) under ``fallback_<cause>``; one add on the device, no
        sync."""
        if n:
            self.totals[FALLBACKS[cause]] += n

    def snapshot(self) -> dict:
        """Host dict of the totals (synchronous: for tests and shutdown, not the step)."""
        return self._summary(self.totals.detach().cpu())

    def _summary(self, v: torch.Tensor) -> dict:
        """``summarize`` of the device vector ``v`` (host copy) with the host counts, which are cumulative."""
        out = summarize(v, self.width_steps, self.depth_steps, self.decision_steps, self.ragged, self.kv_window_steps)
        out["cost_table"] = self.cost_table
        out["draft_cost_table"] = self.draft_cost_table
        out["runtime_parts"] = self.runtime_parts
        out["target_verify_graphs"] = self.target_verify_graphs
        out["ngram_offset_eta"] = self.ngram_offset_eta
        for kind, counts in self.lag_steps.items():
            out[f"{kind}_lag_steps"] = {str(k): n for k, n in sorted(counts.items())}
        from sglang_hybrid.kernels import warmup   # the Triton variants compiled at start, and what compiled after

        out.update(warmup.counters())
        return out

    def maybe_log(self) -> Optional[dict]:
        """Called once per step on the host; logs (and returns) the interval's summary when a copy has landed.

        Every ``log_interval`` steps a copy of the totals starts (non-blocking on CUDA, where it lands on a later
        step; immediate on CPU). When ``snapshot_path`` is set, the cumulative summary is also written there as JSON
        (atomically), for the self-check and for monitoring.
        """
        if self.log_interval <= 0:
            return None
        self._host_steps += 1
        cuda = self.device.type == "cuda"
        if not self._pending and self._host_steps % self.log_interval == 0:
            self._staging.copy_(self.totals, non_blocking=cuda)
            if cuda:
                self._event = torch.cuda.Event()
                self._event.record()
            self._pending = True
        out = None
        if self._pending and (self._event is None or self._event.query()):
            cur = self._staging.clone()
            out = self._summary(cur - self._last)
            self._last = cur
            self._pending = False
            logger.info("HYBRID %s", format_summary(out))
            total = self._summary(cur)
            if self.snapshot_path:
                write_snapshot(self.snapshot_path, total)
            if self.exporter is not None:
                self.exporter(total)
        return out


def write_snapshot(path: str, summary: dict) -> None:
    """Write ``summary`` as JSON to ``path`` through a temporary file and a rename: readers never see half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, path)


def summarize(v: torch.Tensor, width_steps: Optional[dict] = None, depth_steps: Optional[dict] = None,
              decision_steps: Optional[dict] = None, ragged: Optional[dict] = None,
              kv_window_steps: int = 0) -> dict:
    """Host summary of a counter vector; ``width_steps`` / ``depth_steps`` / ``decision_steps`` (cumulative steps per
    verify width, per EAGLE draft depth and per decision path), ``ragged`` (``HybridCounters.ragged``) and
    ``kv_window_steps`` (cumulative) are copied in."""
    v = v.tolist()
    reqs = max(v[REQS], 1.0)
    out = {"steps": int(v[STEPS]), "requests": int(v[REQS]),
           "mean_lambda": v[LAM] / max(v[STEPS], 1.0), "mean_b_star": v[BSTAR] / max(v[STEPS], 1.0),
           "ngram_available": v[NGRAM_AVAIL] / reqs, "ngram_from_lookup": v[NGRAM_LOOKUP] / reqs,
           "mean_nodes": v[NODES] / reqs}
    for c in CLASSES:
        n = v[REQ[c]]
        out[f"chosen_{c}"] = int(n)
        out[f"mean_accepted_{c}"] = v[ACC[c]] / n if n else 0.0
    # verify slots spent on padding: requests verify at the step's width whatever their trees hold
    out["padded_fraction"] = 1.0 - (v[NODES] + v[REQS]) / v[SLOTS] if v[SLOTS] else 0.0
    for side, (t, pred, hit) in OUTCOME.items():
        tested = v[t]
        out[f"{side}_tested"] = int(tested)
        out[f"{side}_predicted"] = v[pred] / tested if tested else 0.0
        out[f"{side}_accepted"] = v[hit] / tested if tested else 0.0
    out["alternatives_verified"] = int(v[ALT_NODES])
    out["alternatives_per_request"] = v[ALT_NODES] / reqs
    out["alternatives_taken"] = int(v[ALT_TAKEN])
    out["width_steps"] = {str(w): n for w, n in sorted((width_steps or {}).items())}
    out["depth_steps"] = {str(d): n for d, n in sorted((depth_steps or {}).items())}
    out["decision_steps"] = dict(sorted((decision_steps or {}).items()))
    r = ragged or empty_ragged()
    out["ragged_steps"], out["ragged_tokens"], out["ragged_padded_tokens"] = r["steps"], r["tokens"], r["padded_tokens"]
    out["ragged_rows"] = r["rows"]
    out["ragged_node_range_steps"] = dict(r["node_range_steps"])
    out["ragged_tier_steps"] = {str(t): n for t, n in sorted(r["tier_steps"].items())}
    out["ragged_graph_steps"], out["ragged_graph_captures"] = r["graph_steps"], r["graph_captures"]
    out["kv_window_steps"] = kv_window_steps
    for cause, i in FALLBACKS.items():
        out[f"fallback_{cause}"] = int(v[i])
    return out


def format_summary(s: dict) -> str:
    parts = [f"steps={s['steps']}", f"lambda={s['mean_lambda']:.4f}", f"b*={s['mean_b_star']:.1f}",
             f"ngram_avail={s['ngram_available']:.2f}", f"ngram_lookup={s['ngram_from_lookup']:.2f}",
             f"nodes/req={s['mean_nodes']:.2f}"]
    parts.append(f"padded={s['padded_fraction']:.2f}")
    if s.get("model_tested"):
        parts.append(f"eagle_priced={s['model_predicted']:.2f} eagle_accepted={s['model_accepted']:.2f}")
    if s.get("ngram_tested"):
        parts.append(f"ngram_priced={s['ngram_predicted']:.2f} ngram_accepted={s['ngram_accepted']:.2f}")
    if s.get("alternatives_verified"):
        parts.append(f"alternatives/req={s['alternatives_per_request']:.2f} taken={s['alternatives_taken']}")
    if s.get("width_steps"):
        parts.append("widths=" + ",".join(f"{w}:{n}" for w, n in s["width_steps"].items()))
    if s.get("ragged_steps"):
        parts.append(f"ragged_tokens={s['ragged_tokens']}/{s['ragged_padded_tokens']} rows={s['ragged_rows']} "
                     f"graphs={s['ragged_graph_captures']}/{s['ragged_graph_steps']}")
    if s.get("depth_steps"):
        parts.append("depths=" + ",".join(f"{d}:{n}" for d, n in s["depth_steps"].items()))
    for c in CLASSES:
        parts.append(f"{c}={s[f'chosen_{c}']}(acc {s[f'mean_accepted_{c}']:.2f})")
    parts.extend(f"fallback_{cause}={s.get(f'fallback_{cause}', 0)}" for cause in FALLBACKS)
    if "triton_compiles_after_start" in s:
        parts.append(f"triton_compiles_after_start={s['triton_compiles_after_start']}")
    return " ".join(parts)
