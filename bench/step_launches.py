"""Kernel launches of HYBRID's per-step device path, counted with the PyTorch profiler at several batch sizes.

    python -m bench.step_launches [--batches 1,32,128]

What is counted: one decode step of the SGLang worker's device logic between the EAGLE draft and the verify forward
(``HybridStep.select``: n-gram alignment, the device prompt lookup for rows left without a proposal, the core
``DecisionStep`` with calibration, survivals, price, width and depth plans and selection, the counters), the verify
tree links and the FULL_MASK, and the ring and context updates after verify (``HybridStep.after_verify``). The
profiler records every ATen operator the step dispatches; on a GPU each is (at most) one kernel launch, so the count
is an upper bound on launches per step.

Configurations: ``choose`` and ``merge``, each with no plan (no cost tables: the full width every step), the width
plan (a cost table) and the width and depth plans (both tables, the replay's as-built HYBRID), 4 EAGLE steps,
ngram_k 8. The model-only adaptive baseline of the replay (the core's ``DecisionStep`` without an n-gram side, the
same tree links and mask) is counted too: the replay charges each policy its own count (``bench.replay.engine``).

Why it matters: eagerly, each launch costs several microseconds of host time on a GPU and a couple of microseconds of
GPU time even when tiny; a count in the hundreds is milliseconds per step on the critical path (the engine issue
asks for at most 12 launches, i.e. fused kernels). On this CPU only the count is meaningful; GPU latency of the same
step captured in a CUDA graph is measured by ``bench/device_run.sh`` when a GPU is lent.
"""
from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import torch

K, STEPS, VOCAB = 8, 4, 32000
#: context length of the device prompt lookup's table (its work per step is static in it, not in the batch)
CONTEXT = 2048
#: the fused-kernel target of the engine issue: launches per decision step
TARGET = 12
#: (name, cost table, draft cost table) of the counted configurations
PLANS = (("no plan", False, False), ("width plan", True, False), ("width + depth plans", True, True))


def count_ops(step_fn) -> int:
    """ATen operators one call of ``step_fn`` dispatches (after a warm-up call); top-level calls only: an operator
    implemented by other operators counts once."""
    from torch.profiler import ProfilerActivity, profile

    step_fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def _hybrid_step_fn(step, b: int):
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.verify_input import full_mask, tree_links_torch

    g = torch.Generator().manual_seed(b)
    slots = torch.arange(b)
    seq = torch.full((b,), 100)
    gen = torch.zeros(b, dtype=torch.int64)
    width = step.proposal_width
    alignment.publish(step.buffers, slots, torch.randint(0, VOCAB, (b, width), generator=g),
                      torch.full((b,), width), seq + 1, gen, torch.full((b, width), 9), torch.full((b, width), 2),
                      torch.full((b, width), 3), torch.zeros((b, width), dtype=torch.int64))
    root = torch.randint(0, VOCAB, (b,), generator=g)
    chain = torch.randint(0, VOCAB, (b, step.num_steps), generator=g)
    conf = torch.rand((b, step.num_steps), generator=g)
    w = step.widths[len(step.widths) // 2]

    def one_step():
        d = step.select(root, chain, conf, slots, gen, seq, width=w)
        anc = d.tree.ancestors
        tree_links_torch(anc, seq)
        full_mask(anc, seq, int(b * 101))
        emitted = torch.zeros((b, w), dtype=torch.int64)
        step.after_verify(d.tree, slots, seq, emitted, torch.ones(b, dtype=torch.int64))

    return one_step


@functools.lru_cache(maxsize=None)
def hybrid_launches(b: int, mode: str = "merge", num_steps: int = STEPS, ngram_k: int = K, width_plan: bool = True,
                    depth_plan: bool = True, context: int = CONTEXT) -> int:
    """ATen operators of one HYBRID decode step of the worker (``HybridStep``) for ``b`` requests."""
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    with tempfile.TemporaryDirectory() as tmp:
        kw = {}
        if width_plan:
            kw["cost_table"] = str(Path(tmp) / "cost.json")
            CostModel.linear(0.01, 0.0001).save(kw["cost_table"])
        if depth_plan:
            kw["draft_cost_table"] = str(Path(tmp) / "draft.json")
            CostModel.linear(0.001, 0.00001).save(kw["draft_cost_table"])
        settings = HybridSettings(mode=mode, ngram_k=ngram_k, **kw)
        with _one_thread():
            step = HybridStep(settings, num_steps=num_steps, pool_size=max(b, 1), device="cpu",
                              max_context_len=context)
            return count_ops(_hybrid_step_fn(step, b))


@functools.lru_cache(maxsize=None)
def model_only_launches(b: int, k: int = STEPS) -> int:
    """ATen operators of one step of the replay's model-only adaptive baseline for ``b`` requests: the core's
    ``DecisionStep`` on an EAGLE chain of ``k`` (no n-gram side) at a width bucket, with the verify tree links and
    mask."""
    from sglang_hybrid.calibration import ModelCalibration
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.verify_input import full_mask, tree_links_torch
    from sglang_hybrid.step import DecisionStep, ModelDraft
    from sglang_hybrid.widths import default_buckets

    widths = default_buckets(k + 1)
    decide = DecisionStep(mode="choose", n_nodes=k, model_calibration=ModelCalibration.identity().to("cpu"),
                          widths=widths)
    cost = CostModel.linear(0.01, 0.0001).to("cpu")
    g = torch.Generator().manual_seed(b)
    root = torch.randint(0, VOCAB, (b,), generator=g)
    model = ModelDraft(torch.randint(0, VOCAB, (b, k), generator=g), torch.rand((b, k), generator=g),
                       torch.full((b,), k, dtype=torch.int64))
    seq = torch.full((b,), 100)
    w = widths[len(widths) // 2]

    def one_step():
        d = decide(root, model, None, cost=cost, check_values=False, width=w)
        tree_links_torch(d.tree.ancestors, seq)
        full_mask(d.tree.ancestors, seq, int(b * 101))

    with _one_thread():
        return count_ops(one_step)


class _one_thread:
    """Counts do not depend on threads; one keeps the profiler's run short on a shared machine."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,32,128")
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    print("ATen operators per decode step (HybridStep.select + verify-input tree links and mask + after_verify), "
          f"CPU profiler; {STEPS} EAGLE steps, ngram_k {K}, prompt-lookup context {CONTEXT}")
    print(f"{'configuration':<34}" + "".join(f"{'B=' + str(b):>10}" for b in batches))
    counts = {}
    for mode in ("choose", "merge"):
        for plan, wp, dp in PLANS:
            row = [hybrid_launches(b, mode, width_plan=wp, depth_plan=dp) for b in batches]
            counts[(mode, plan)] = row
            print(f"{mode + ', ' + plan:<34}" + "".join(f"{n:>10}" for n in row))
    mo = [model_only_launches(b) for b in batches]
    print(f"{'model-only adaptive (replay)':<34}" + "".join(f"{n:>10}" for n in mo))
    const = all(len(set(row)) == 1 for row in counts.values())
    print(f"{'MET' if const else 'MISSED'}: operator count independent of batch size")
    worst = max(max(row) for row in counts.values())
    print(f"{'MET' if worst <= TARGET else 'MISSED'}: <= {TARGET} launches per decision step at every size and "
          f"configuration (most: {worst}; the torch path, one operator a launch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
