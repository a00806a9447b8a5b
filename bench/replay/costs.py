"""The replay's step-time models: per-batch-size cost tables (simulated GPU roofline, measured CPU, or yours).

A step verifying n tokens costs T(n) from the core's `CostModel`, plus the EAGLE draft forwards the policy ran times
the table's draft-step cost. The price (a policy's input) always reads the tables; the charge reads the roofline
itself when the spec has one: there a step's KV traffic and attention work follow its requests' real context lengths
(a code-edit prompt of 4,000 tokens reads twice the KV of the tables' 2,048), which a table of T(n) cannot hold.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import numpy as np

from bench.cost_tables import roofline
from bench.replay.host import LaunchCost, interp_extend

CPU_TABLE = Path(__file__).resolve().parent / "cost_tables" / "cpu_smollm2.json"


@dataclasses.dataclass
class BatchCost:
    """Step-time model for one batch size: T(n) (core CostModel) and the cost of one EAGLE draft forward."""

    model: object          # sglang_hybrid.cost.CostModel
    tables: object         # its CostTables on CPU (the price input)
    draft_step_s: float
    #: the roofline the tables were built from (None for measured or user tables): charges real contexts
    roof: Optional[roofline.Roofline] = None
    requests: int = 0
    #: what one eagerly launched kernel of a policy's own per-step work costs (``bench.replay.host.LaunchCost``)
    launch: LaunchCost = LaunchCost()
    #: a per-batch table's draft step by batch size, ``((B, ...), (seconds, ...))``: prices a tree's draft forwards
    #: (``topk`` beams per request) as one draft step of ``requests x topk`` sequences
    draft_by_batch: Optional[tuple] = None

    def step_time(self, n: int, context_total: Optional[float] = None) -> float:
        """Seconds of one target forward over ``n`` batch tokens; with a roofline and ``context_total`` (the KV
        tokens of the whole batch) at the batch's real contexts, else from the table."""
        if self.roof is not None and context_total is not None:
            return self.roof.target_step_s(int(n), self.requests, context_total)
        return float(self.model.step_time_np(np.asarray([n]))[0])

    def draft_time(self, context_total: Optional[float] = None, branches: int = 1) -> float:
        """Seconds of one EAGLE draft forward (real contexts as in `step_time`); ``branches`` > 1: a tree's forward
        over that many beams per request, each a sequence reading its request's whole KV (SGLang's draft decode for
        ``topk`` > 1): the roofline's, or a per-batch table's draft step at ``requests x branches`` sequences (the
        same KV per sequence as a batch of that many requests)."""
        if branches > 1:
            if self.roof is not None and context_total is not None:
                return self.roof.draft_step_s(self.requests * branches, context_total * branches)
            if self.draft_by_batch is not None and self.requests > 0:
                return interp_extend(self.requests * branches, *self.draft_by_batch)
            raise ValueError("an EAGLE tree's draft forwards (topk > 1) need the GPU roofline with each request's "
                             "context or a per-batch table's draft step by batch size: this table holds one "
                             "sequence per request (use --cost gpu)")
        if self.roof is not None and context_total is not None:
            return self.roof.draft_step_s(self.requests, context_total)
        return self.draft_step_s


@dataclasses.dataclass
class CostSpec:
    name: str
    kind: str              # "simulated" | "measured" | "user"
    assumptions: list
    per_batch: dict        # {B: BatchCost}; key 0 = applies to every B

    def with_launch_cost(self, launch: LaunchCost) -> "CostSpec":
        """The same spec with every batch size's launch cost set to ``launch`` (its text added to the assumptions)."""
        per = {b: dataclasses.replace(c, launch=launch) for b, c in self.per_batch.items()}
        return dataclasses.replace(self, per_batch=per, assumptions=[*self.assumptions, launch.describe()])

    def for_batch(self, b: int) -> BatchCost:
        if b in self.per_batch:
            return self.per_batch[b]
        if 0 in self.per_batch:
            return self.per_batch[0]
        raise ValueError(f"cost model {self.name!r} has no table for batch {b} (has {sorted(self.per_batch)})")


def _batch_cost(sizes, seconds, draft_s, meta=None, roof=None, requests=0) -> BatchCost:
    from sglang_hybrid.cost import CostModel

    m = CostModel(list(sizes), list(seconds), meta=meta or {})
    return BatchCost(m, m.to("cpu"), float(draft_s), roof, int(requests))


#: the GPU roofline variants: name -> (knee_p, CUDA-graph bucket padding)
GPU_VARIANTS = {"gpu": (3.0, True), "gpu-hardmax": (None, True), "gpu-unpadded": (3.0, False)}


def gpu_cost_spec(batch_sizes, context: int, variant: str = "gpu", max_width: int = 17) -> CostSpec:
    """The roofline's step times for each batch size R, tabulated for R to ``R * max_width`` verified tokens: pass
    the widest per-request verify of the policies to be charged (past the table the cost model extrapolates its last
    segment, which inside a CUDA-graph bucket is flat, so a wider step would be charged too little). ``variant``: a
    name of `GPU_VARIANTS` (the knee and the bucket padding)."""
    if variant not in GPU_VARIANTS:
        raise ValueError(f"unknown GPU cost variant {variant!r}; known: {', '.join(GPU_VARIANTS)}")
    knee_p, buckets = GPU_VARIANTS[variant]
    roof = roofline.Roofline(context_tokens=context, knee_p=knee_p, **({} if buckets else {"graph_buckets": ()}))
    doc = roofline.build_tables(roof, batch_sizes, max_width=max_width)
    per = {int(b): _batch_cost(t["tokens"], t["seconds"], t["draft_step_seconds"], roof=roof, requests=int(b))
           for b, t in doc["tables"].items()}
    return CostSpec(variant, "simulated", roof.assumptions(), per)


def load_cost_spec(path, name=None) -> CostSpec:
    """A cost file: this benchmark's per-batch format (`hybrid-spark-cost-tables`, as written by
    bench/cost_tables/*.py) or the core's single table (`hybrid-spark-cost`, e.g. from `sglang_hybrid.cost.profile`
    on your own GPU; it then applies to every batch size, and `meta.draft_step_seconds` gives the EAGLE step cost)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cost table {path}: cannot read JSON ({e})") from None
    fmt = doc.get("format")
    if fmt == roofline.FORMAT:
        tabs = doc.get("tables")
        if not isinstance(tabs, dict) or not tabs:
            raise ValueError(f"cost table {path}: 'tables' must be a non-empty object keyed by batch size")
        per = {}
        for b, t in tabs.items():
            for key in ("tokens", "seconds", "draft_step_seconds"):
                if key not in t:
                    raise ValueError(f"cost table {path}: batch {b} lacks {key!r}")
            per[int(b)] = _batch_cost(t["tokens"], t["seconds"], t["draft_step_seconds"], requests=int(b))
        drafts = tuple(zip(*sorted((b, float(per[b].draft_step_s)) for b in per)))
        per = {b: dataclasses.replace(c, draft_by_batch=drafts) for b, c in per.items()}
        kind = "measured" if "measured" in str(doc.get("source", "")) else "simulated"
        return CostSpec(name or path.stem, kind, list(doc.get("assumptions", [])), per)
    if fmt == "hybrid-spark-cost":
        meta = doc.get("meta") or {}
        draft = float(meta.get("draft_step_seconds", 0.0))
        per = {0: _batch_cost(doc["sizes"], doc["seconds"], draft, meta)}
        notes = [f"user table {path} (one T(n) for every batch size)", f"meta: {json.dumps(meta)[:300]}"]
        if "draft_step_seconds" not in meta:
            notes.append("no meta.draft_step_seconds: EAGLE drafting is charged 0 s (favours EAGLE-based policies)")
        return CostSpec(name or path.stem, "user", notes, per)
    raise ValueError(f"cost table {path}: unknown format {fmt!r} "
                     f"(expected {roofline.FORMAT!r} or 'hybrid-spark-cost')")


def cost_specs(names, batch_sizes, gpu_context: int) -> list:
    """The cost models named on the command line: 'gpu' (roofline, smooth knee, CUDA-graph buckets), 'gpu-hardmax'
    (the hard-max knee), 'gpu-unpadded' (no bucket padding), 'cpu' (the measured table, skipped with a note when
    absent) or a cost file."""
    specs = []
    for c in names:
        if c in GPU_VARIANTS:
            specs.append(gpu_cost_spec(batch_sizes, gpu_context, c))
        elif c == "cpu":
            if not CPU_TABLE.is_file():
                print(f"note: no measured CPU table at {CPU_TABLE}; run python -m bench.cost_tables.profile_cpu")
                continue
            specs.append(load_cost_spec(CPU_TABLE, "cpu-smollm2"))
        else:
            specs.append(load_cost_spec(c))
    return specs
