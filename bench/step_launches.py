"""Kernel launches of HYBRID's per-step device path, counted with the PyTorch profiler at several batch sizes.

    python -m bench.step_launches [--batches 1,32,128]

What is counted: one decode step of the SGLang worker's device logic between the EAGLE draft and the verify forward,
in the shipped configuration (merge, 4 EAGLE steps, ngram_k 8, width buckets 2/4/6/8/13, a cost table): n-gram
alignment, the device prompt lookup for rows left without a proposal, the core ``DecisionStep`` (calibration,
survivals, width choice, selection), the counters, the verify tree links and the FULL_MASK, and the ring and context
updates after verify. The profiler records every ATen operator the step
dispatches; on a GPU each is (at most) one kernel launch, so the count is an upper bound on launches per step.

Why it matters: eagerly, each launch costs several microseconds of host time on a GPU; a count that grows with the
batch would make the step's overhead grow with it. Static shapes keep the count constant; the target (engine
issue) is a count independent of batch size. On this CPU only the count is meaningful; GPU latency of the same step
captured in a CUDA graph is measured by ``bench/device_run.sh`` when a GPU is lent.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

K, STEPS, VOCAB = 8, 4, 32000
#: context length of the device prompt lookup's table (its work per step is static in it, not in the batch)
CONTEXT = 2048


def _count(step, b: int) -> int:
    """ATen operators dispatched by one decode step for ``b`` requests (a warm-up step runs first)."""
    from torch.profiler import ProfilerActivity, profile

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
    chain = torch.randint(0, VOCAB, (b, STEPS), generator=g)
    conf = torch.rand((b, STEPS), generator=g)

    def one_step():
        d = step.select(root, chain, conf, slots, gen, seq, width=8)
        anc = d.tree.ancestors
        tree_links_torch(anc, seq)
        full_mask(anc, seq, int(b * 101))
        emitted = torch.zeros((b, 8), dtype=torch.int64)
        step.after_verify(d.tree, slots, seq, emitted, torch.ones(b, dtype=torch.int64))

    one_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        one_step()
    # top-level ATen calls only: an operator implemented by other operators counts once
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,32,128")
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cost = Path(tmp) / "cost.json"
        CostModel.linear(0.01, 0.0001).save(cost)
        settings = HybridSettings(mode="merge", ngram_k=K, cost_table=str(cost))
        counts = {}
        for b in batches:
            step = HybridStep(settings, num_steps=STEPS, pool_size=max(batches), device="cpu",
                              max_context_len=CONTEXT)
            counts[b] = _count(step, b)
    print("ATen operators per decode step (selection + verify-input tree links and mask + ring update), CPU profiler")
    for b, n in counts.items():
        print(f"  batch {b:4d}: {n} operators")
    const = len(set(counts.values())) == 1
    print(f"{'MET' if const else 'MISSED'}: operator count independent of batch size "
          f"({', '.join(str(n) for n in counts.values())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
