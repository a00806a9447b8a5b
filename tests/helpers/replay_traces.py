"""Tiny replay inputs shared by the replay benchmark's tests (``tests/bench``): a one-request trace whose EAGLE chain
is always right (or always wrong) and a linear batch cost."""
from __future__ import annotations

import numpy as np

from bench.replay import costs as replay_costs
from bench.replay import traces as replay_traces
from bench.replay.host import LaunchCost


def one_request_trace(L=30, k=4, eagle_right=True, prompt=None, output=None, workload="code"):
    """A single-request trace whose EAGLE chain at every position is the true continuation (or always wrong)."""
    rng = np.random.default_rng(1)
    prompt = np.asarray(prompt if prompt is not None else rng.integers(0, 50, 10), np.int32)
    out = np.asarray(output if output is not None else rng.integers(0, 50, L), np.int32)
    L = len(out)
    et = np.zeros((L, k), np.int32)
    for p in range(L):
        for j in range(k):
            truth = int(out[p + j]) if p + j < L else 0
            et[p, j] = truth if eagle_right else truth + 100
    ep = np.full((L, k), 0.9 if eagle_right else 0.1, np.float32)
    return [replay_traces.TraceRequest("r0", workload, prompt, out, et, ep)]


def linear_cost(base=1.0, per_token=0.1, draft=0.05, max_tokens=4096, launch=LaunchCost(0.0, 0.0, 0.0, 0.0)):
    """T(n) = base + per_token * n, ``draft`` s per draft forward; kernel launches free unless ``launch`` says (the
    by-hand figures of most tests leave them out; `test_decision_launches_are_charged_by_hand` charges them)."""
    from sglang_hybrid.cost import CostModel

    m = CostModel.linear(base, per_token, max_tokens)
    return replay_costs.BatchCost(m, m.to("cpu"), draft, launch=launch)
