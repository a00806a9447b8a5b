"""The replay's simulation: continuous batching of one policy over a draft bank under one cost model.

Replay rule (per step, continuous batching at a fixed concurrency B):
  * every active request gets draft nodes from the policy (bench/replay/policies.py);
  * accepted = the deepest draft node whose whole path equals the trace's output (greedy acceptance);
    emitted = accepted + 1 (the bonus token), capped at what is left of the output;
  * the step verifies n = sum over requests of (1 + draft nodes) tokens (ragged verify; a policy that models a padded
    engine says how many it verifies, `Proposal.verify_tokens`, e.g. B x W) and costs T(n) + (EAGLE draft forwards) x
    t_draft from the cost model (a roofline model charges both at the batch's real context lengths, prompt + output so
    far; an EAGLE tree's forwards after the first run ``topk`` beams per request), plus the GPU time of the kernels the
    policy's own work launches (`Proposal.launches`); the host time the policy reports (`Proposal.host_s`, plus the
    dispatch of those launches) adds to that, or the step takes the larger of the two when the host time overlaps the
    device (`Proposal.host_overlaps`: overlap scheduling); a device stall the policy reports (`Proposal.stall_s`, a
    blocking read inside the step) adds to either; the same run also totals its time with the host work overlapped and
    with it added whatever the policy reports (`HOST_ACCOUNTINGS`, `RunResult.host_seconds`), so that drafters whose
    engines place that work differently (HYBRID's worker before the step, vLLM's proposers after it) can also be
    compared with it placed the same way for all;
  * the first B requests start at seeded uniform positions of their outputs (`start_positions`), as a server in
    steady state holds requests at every phase; finished requests are replaced by the next one from a seeded stream
    (whole permutations of the workload), from their first token; the run stops at the first step after which a slot
    cannot be refilled, so throughput is measured with the batch full (no tail where a few long requests run alone).
Temperature-1 traces replay with the same rule: with deterministic (one-hot) drafts, exact tree speculative sampling
accepts child x with probability p(x) and otherwise resamples from the residual, which is the same as drawing the
target token y ~ p once and accepting the child equal to y; the trace's sampled output is that y.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from sglang_hybrid.selector import Source

from bench.replay import policies as P
from bench.replay.costs import BatchCost
from bench.replay.drafts import DraftBank


#: the two ways of charging every policy's host work alike: hidden under the device step (max) or added to it (sum)
HOST_ACCOUNTINGS = ("overlapped", "added")


def start_positions(lengths: np.ndarray, seed: int) -> np.ndarray:
    """Output positions the first wave of requests starts at: uniform over each request's output ``[0, length)``,
    drawn from ``seed`` (apart from the stream's permutations, so the requests a run serves do not change).

    Why not all at 0: a server in steady state holds requests at every phase of their outputs. Started together, a
    workload of few distinct requests runs in lockstep (the real SmolLM2 trace has 8 chat requests, 16 copies of each
    at batch 128), and the window the run measures ends at whatever phase the first refill-less finish falls on, a
    different one per policy. On that cell HYBRID / no speculation read 0.94x started together (seeds 1 and 2) and
    1.00x and 1.03x staggered, with the same drafts and step times: started together, its width-9 steps emitted more
    tokens a step than the same launch without width 9 (276 to 260), but its window ended 19 steps sooner, on a
    slower phase, and read 5 % slower."""
    lengths = np.asarray(lengths, np.int64)
    if (lengths < 1).any():
        raise ValueError("every request needs at least one output token to start inside its output")
    return np.random.default_rng([int(seed), 1]).integers(0, lengths).astype(np.int64)


def greedy_tree_accept(tokens: np.ndarray, parents: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Accepted draft tokens per request: depth of the deepest node whose whole path equals the targets.

    tokens/parents [B, N] (-1 = no node / root parent, parents[i] < i); targets [B, >= N] = the output from the
    current position on (targets[:, d - 1] is what a depth-d node must equal)."""
    b, n = tokens.shape
    if n == 0:
        return np.zeros(b, np.int64)
    if ((parents == np.arange(-1, n - 1)) | (tokens < 0)).all():
        # every drafted node hangs off the one before it: chains (most policies), whose accepted length is the run of
        # leading matches; the same answer as the pointer jumping below, in one pass
        ok = (tokens >= 0) & (tokens == targets[:, :n])
        return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)
    if (parents >= np.arange(n)).any():
        raise ValueError("parents must satisfy parents[i] < i (topological order)")
    # trees: every node's depth, then whether its whole path matches, each folded along the path to the root
    up = np.concatenate([np.where(parents < 0, n, parents), np.full((b, 1), n)], axis=1)
    depth = _fold_to_root(np.ones((b, n), np.int64), 0, up, np.add)
    good = (tokens >= 0) & (tokens == np.take_along_axis(targets, depth - 1, axis=1))
    return (depth * _fold_to_root(good, True, up, np.logical_and)).max(axis=1)


def _fold_to_root(values: np.ndarray, neutral, up: np.ndarray, combine) -> np.ndarray:
    """``combine`` of ``values`` over each node's path to the root ([B, N]), by pointer jumping: log2(depth) rounds
    over all nodes at once, each node combining what its current ancestor holds and jumping to that one's ancestor.
    ``up`` [B, N + 1]: each node's parent, N for the root's children; column N is a virtual node above them that holds
    ``neutral`` and jumps to itself."""
    n = values.shape[1]
    vals = np.concatenate([values, np.full((values.shape[0], 1), neutral, values.dtype)], axis=1)
    while (up[:, :n] < n).any():
        vals, up = combine(vals, np.take_along_axis(vals, up, 1)), np.take_along_axis(up, up, 1)
    return vals[:, :n]


@dataclasses.dataclass
class RunResult:
    policy: str
    label: str
    workload: str
    batch: int
    cost: str
    steps: int
    tokens: int
    seconds: float
    request_steps: int
    accepted: int
    verified_nodes: int
    requests_done: int
    model_steps: int
    ngram_share: float       # share of verified draft nodes proposed by the n-gram drafter (or both)
    mean_lambda: float

    @property
    def tok_per_s(self):
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def accepted_per_step(self):
        return self.accepted / max(1, self.request_steps)

    @property
    def tokens_per_step(self):
        return self.tokens / max(1, self.request_steps)

    @property
    def verified_per_step(self):
        return self.verified_nodes / max(1, self.request_steps)


def request_stream(indices, batch: int, seed: int) -> np.ndarray:
    """Whole seeded permutations of the workload, enough for at least max(2 B, |workload|) requests."""
    indices = np.asarray(indices)
    rng = np.random.default_rng(seed)
    cycles = max(1, math.ceil(max(2 * batch, len(indices)) / len(indices)))
    return np.concatenate([rng.permutation(indices) for _ in range(cycles)])


def simulate(policy, bank: DraftBank, indices, batch: int, cost: BatchCost, seed: int = 0,
             workload: str = "", cost_name: str = "", lockstep_start: bool = False) -> RunResult:
    """Continuous-batching replay of one policy at concurrency `batch` (the rule in the module docstring).
    ``lockstep_start``: the first wave starts at token 0 together, as earlier runs did
    (``--lockstep-start`` reproduces their figures; the mechanics tests count steps by hand from it)."""
    stream = request_stream(indices, batch, seed)
    if len(stream) < batch:
        raise ValueError("request stream shorter than the batch")
    if hasattr(policy, "reset"):
        policy.reset(batch, cost)  # engine state (width in flight, late n-gram proposals) starts fresh per run
    n_req = len(bank.lengths)
    req_tokens = np.zeros(n_req, np.float64)   # per request of the bank: tokens emitted, and its share of the time
    req_seconds = np.zeros(n_req, np.float64)  # (each step's time split evenly over the B slots): for the bootstrap
    alike = {how: np.zeros(n_req, np.float64) for how in HOST_ACCOUNTINGS}   # the same, host work charged alike
    prompt_len = np.array([len(r.prompt) for r in bank.requests], np.int64)
    req = stream[:batch].astype(np.int64)
    pos = np.zeros(batch, np.int64) if lockstep_start else start_positions(bank.lengths[req], seed)
    nxt = batch
    tot = dict(steps=0, tokens=0, seconds=0.0, rs=0, acc=0, nodes=0, done=0, msteps=0, ng=0, lam=0.0)
    while True:
        context = prompt_len[req] + pos
        view = P.StepView(req=req, pos=pos, root=bank.roots(req, pos), drafts=bank,
                          cost=cost.tables, requests=batch, draft_step_s=cost.draft_step_s, context=context)
        prop = policy.propose(view)
        toks, par = np.asarray(prop.tokens, np.int64), np.asarray(prop.parents, np.int64)
        n_nodes = (toks >= 0).sum(axis=1)
        accepted = greedy_tree_accept(toks, par, bank.targets(req, pos, max(1, toks.shape[1])))
        remaining = bank.lengths[req] - pos
        emitted = np.minimum(accepted + 1, remaining)
        n_tokens = batch + int(n_nodes.sum()) if prop.verify_tokens is None else int(prop.verify_tokens)
        ctx = float(context.sum())
        if prop.draft_topk > 1 and prop.model_steps > 0:    # a tree: the forwards after the first run topk beams
            draft_s = cost.draft_time(ctx) + (prop.model_steps - 1) * cost.draft_time(ctx, branches=prop.draft_topk)
        else:
            draft_s = prop.model_steps * cost.draft_time(ctx)
        device_s = cost.step_time(n_tokens, ctx) + draft_s + cost.launch.device_s(prop.launches, prop.eager_ops)
        host_s = float(prop.host_s) + cost.launch.host_s(prop.launches, prop.eager_ops)
        # the step's time with its host work hidden under the device step and added to it: the policy's own
        # placement is its run's time, both are kept for comparing every policy with the same placement
        step_s = {"overlapped": max(device_s, host_s) + float(prop.stall_s),
                  "added": device_s + host_s + float(prop.stall_s)}
        dt = step_s["overlapped" if prop.host_overlaps else "added"]
        tot["seconds"] += dt
        np.add.at(req_tokens, req, emitted)
        np.add.at(req_seconds, req, dt / batch)
        for how in HOST_ACCOUNTINGS:
            np.add.at(alike[how], req, step_s[how] / batch)
        tot["steps"] += 1
        tot["tokens"] += int(emitted.sum())
        tot["rs"] += batch
        tot["acc"] += int((emitted - 1).sum())
        tot["nodes"] += int(n_nodes.sum())
        tot["msteps"] += prop.model_steps
        tot["lam"] += float(getattr(policy, "last_lambda", 0.0))
        if prop.source is not None:
            tot["ng"] += int(((prop.source == Source.NGRAM) | (prop.source == Source.SHARED))[toks >= 0].sum())
        pos = pos + emitted
        done = np.nonzero(pos >= bank.lengths[req])[0]
        stop = False
        for slot in done:
            tot["done"] += 1
            if nxt < len(stream):
                req[slot], pos[slot] = stream[nxt], 0
                nxt += 1
            else:
                stop = True
        if stop:
            break
    res = RunResult(policy.name, policy.describe(), workload, batch, cost_name, tot["steps"], tot["tokens"],
                    tot["seconds"], tot["rs"], tot["acc"], tot["nodes"], tot["done"], tot["msteps"],
                    tot["ng"] / max(1, tot["nodes"]), tot["lam"] / max(1, tot["steps"]))
    res.per_request = (req_tokens, req_seconds)     # not dataclass fields: kept out of the JSON dump
    res.host_seconds = alike                        # per request, by `HOST_ACCOUNTINGS`
    res.request_ids = [str(r.id) for r in bank.requests]
    res.stats = dict(getattr(policy, "stats", {}) or {})
    return res
