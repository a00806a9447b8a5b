"""Is the device prompt lookup's proposal priced right? Calibration of its tokens against the host drafter's.

    python -m bench.lookup_calibration [--requests 100] [--seed 0]

Why: rows whose late host proposal did not align take the device prompt lookup's proposal
(``sglang_plugin.context_lookup``), and the price reads its features through the n-gram calibration fitted on the
host drafter (the Rust suffix automaton). The lookup reports those features in the drafter's terms; this checks that
the shipped calibration then predicts its acceptance as well as it predicts the drafter's.

What runs: the realistic replay's real text (``replay_synth.real_text_requests``: code edits between package
releases, ShareGPT turns; cl100k tokens), every output position of every request; at each, the lookup (the shipped
code, on CPU tensors) and the host drafter (fresh, as ``bench.replay.drafts`` computes it) propose 8 tokens; token j
counts when tokens 0..j-1 of its chain were right (the survival definition: acceptance given the parent was
accepted), labelled by whether it is the text's next token. Prints, per workload and drafter: tokens, mean predicted
acceptance, mean actual, ECE (10 bins) and Brier score (``sglang_hybrid.calibration_metrics``).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

K = 8


def _records(reqs, idx, bank, cal):
    """(predicted, label) arrays for the lookup and the host drafter over the requests ``idx``."""
    from sglang_hybrid.sglang_plugin import context_lookup as CL

    out = {"lookup": ([], []), "drafter": ([], [])}
    for i in idx:
        r = reqs[i]
        ctx = np.concatenate([r.prompt, r.output]).astype(np.int32)
        pos = np.arange(1, len(r.output))                       # output positions with at least one token to predict
        if not len(pos):
            continue
        committed = len(r.prompt) + pos
        rows = torch.arange(len(pos))
        table = CL.ContextTable(torch.from_numpy(np.tile(np.append(ctx, -1), (len(pos), 1))),
                                torch.zeros(len(pos), dtype=torch.int64))
        got = CL.lookup(table, rows, torch.from_numpy(committed - 1), torch.zeros_like(rows), K)
        target = np.stack([np.pad(r.output[p:p + K], (0, K - len(r.output[p:p + K])), constant_values=-5)
                           for p in pos])
        host = bank.ngram_features(np.full(len(pos), i), pos, K)
        for name, f in (("lookup", {"tokens": got.tokens.numpy(), "lengths": got.length.numpy(),
                                    **{n: getattr(got, n).numpy() for n in ("match_len", "count", "total", "depth",
                                                                           "source")}}),
                        ("drafter", host)):
            a = cal.acceptance_np(f["match_len"], f["count"], f["total"], f["depth"], f["source"])
            right = f["tokens"] == target
            reached = np.cumprod(np.concatenate([np.ones((len(pos), 1), bool), right[:, :-1]], 1), 1).astype(bool)
            # the recorded output ends: a token past it is unknown, not a miss
            tested = reached & (np.arange(K)[None, :] < np.minimum(f["lengths"], len(r.output) - pos)[:, None])
            out[name][0].append(a[tested])
            out[name][1].append(right[tested])
    return {n: (np.concatenate(p), np.concatenate(y).astype(np.float64)) for n, (p, y) in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100, help="requests per workload")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from bench.replay import synth as replay_synth
    from bench.replay.drafts import DraftBank
    from sglang_hybrid.calibration import NgramCalibration
    from sglang_hybrid.calibration_metrics import brier, ece

    torch.set_num_threads(1)
    reqs, groups = replay_synth.real_text_requests(args.requests, args.seed, 128, K, edit_dense=False)
    bank = DraftBank(reqs, K, ngram_width=K)
    cal = NgramCalibration.load()
    print(f"n-gram calibration (shipped) on the device prompt lookup's proposals vs the host drafter's; real text, "
          f"{args.requests} requests per workload, seed {args.seed}, {K}-token chains, tokens tested given their "
          "parent was right")
    print(f"{'workload':<9} {'drafter':<8} {'tokens':>7} {'predicted':>9} {'actual':>7} {'ECE':>6} {'Brier':>6}")
    for w in ("code", "chat"):
        for name, (p, y) in _records(reqs, groups[w], bank, cal).items():
            print(f"{w:<9} {name:<8} {len(p):>7} {p.mean():>9.3f} {y.mean():>7.3f} {ece(p, y):>6.3f} "
                  f"{brier(p, y):>6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
