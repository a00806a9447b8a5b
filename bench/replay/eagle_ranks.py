"""How often the real EAGLE head's r-th candidate is the target's token (``python -m bench.replay.eagle_ranks``).

Why: the replay's EAGLE-tree baseline (`bench.replay.synth.SimulatedEagleTrees`) needs more than the chain the traces
hold: how likely a node's second, third, ... candidate is right when the better ones are not. That is a property of
a real head, so it is measured on the only one here, SmolLM2-135M's (the shipped head), at every output position of
the real trace: the head's distribution over the first draft token (the state the target's own features give it),
ranked, against the token the target committed. `synth.RANK_HIT` holds the printed rates.

A small head on a small model: a strong 8B head is right at rank 1 far more often; what it does at ranks 2 and
beyond when rank 1 misses is assumed to be like this one's (docs/benchmarks.md says so beside the results).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from bench.replay.realistic import REAL_TRACES

#: the tuning split of the real-drafter traces: the simulated drafter's rates are parameters, so they come from
#: tuning data
REAL_TRACE = REAL_TRACES / "smollm2_real_tune.jsonl.gz"


def rank_hits(trace_path=REAL_TRACE, ranks: int = 8, lm=None, head=None) -> tuple:
    """(P(right at rank r | ranks < r wrong) for r = 1..ranks, positions measured) over every output position of the
    trace, with the shipped head and the target it was trained for (``lm``, ``head``: already loaded ones). Checks on
    the way that the head's rank-1 token is the trace's recorded first chain token (the same head, the same
    features)."""
    import torch
    import torch.nn.functional as F

    from bench.replay.traces import read_trace
    from sglang_hybrid.check import DEFAULT_DRAFT
    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2

    lm = lm or load_smollm2()
    head = (head or load_head(DEFAULT_DRAFT, lm.model.config)).eval()
    trace = read_trace(trace_path)
    lm_w = lm.model.get_output_embeddings().weight.detach()
    emb_w = lm.model.get_input_embeddings().weight.detach()
    found = []
    with torch.no_grad():
        for r in trace.requests:
            tokens = torch.tensor(np.concatenate([r.prompt, r.output]).astype(np.int64))
            feats = lm.model.model(input_ids=tokens[None]).last_hidden_state[0]
            n = tokens.shape[0]
            g, _ = head(F.embedding(tokens[1:][None], emb_w), feats[None, :-1], torch.arange(n - 1)[None])
            # the head state after committing tokens[:m] is g[0, m - 2]; it drafts tokens[m]
            start = len(r.prompt)
            top = F.linear(g[0, start - 2:n - 2], lm_w).float().topk(ranks, -1).indices
            if not torch.equal(top[:, 0], torch.as_tensor(r.eagle_tokens[:, 0], dtype=torch.int64)):
                raise RuntimeError(f"{trace_path}: request {r.id}: the head's first candidates differ from the "
                                   "trace's chains (another head or target recorded it?)")
            hit = top == tokens[start:n, None]
            found.append(torch.where(hit.any(1), hit.float().argmax(1), torch.full((n - start,), ranks)).numpy())
    rank = np.concatenate(found)
    return [float(np.mean(rank[rank >= r] == r)) for r in range(ranks)], len(rank)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(REAL_TRACE), help="a trace recorded with the shipped head")
    args = ap.parse_args(argv)
    rates, n = rank_hits(args.trace)
    print(f"{n} positions of {args.trace}")
    for r, p in enumerate(rates, 1):
        print(f"rank {r}: P(right | ranks < {r} wrong) = {p:.3f}")
    print(f"RANK_HIT = ({', '.join(f'{p:.3f}' for p in rates[1:])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
