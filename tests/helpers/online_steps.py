"""Driving the worker's step through select and after_verify on random batches, shared by the online temperature's
test module and the subprocess script that runs its fused path under Triton's interpreter."""
from __future__ import annotations

import torch


def hybrid_step(kind: str, pool: int = 6, **settings):
    """A small worker step (4 draft steps, ``pool`` slots, context 64) on the CPU with the decision path ``kind``
    (``torch`` or ``fused``) and any other settings."""
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    return HybridStep(HybridSettings(decision_kernels=kind, log_interval=0, **settings), num_steps=4, pool_size=pool,
                      device="cpu", max_context_len=64)


def drive(step, steps: int = 4, seed: int = 0, b: int = 5) -> list:
    """``select`` then ``after_verify`` on random batches; returns what each step kept for after_verify."""
    g = torch.Generator().manual_seed(seed)
    kept = []
    for it in range(steps):
        slots, gen = torch.arange(b), torch.zeros(b, dtype=torch.int64)
        seq = torch.full((b,), 20 + 5 * it)
        root, chain = torch.randint(0, 9, (b,), generator=g), torch.randint(0, 9, (b, 4), generator=g)
        conf = torch.rand((b, 4), generator=g)
        emitted = torch.cat([chain[:, :2], torch.randint(0, 9, (b, 11), generator=g)], 1)
        acc = torch.randint(1, 5, (b,), generator=g)
        d = step.select(root, chain, conf, slots, gen, seq, width=step.widths[-1])
        # copies: the chain's buffer and the fused path's workspace are the next step's
        ms = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in step._model_step)
        kept.append((ms, emitted[:, :step.widths[-1]], acc))
        step.after_verify(d.tree, slots, seq, emitted[:, :step.widths[-1]], acc)
    return kept
