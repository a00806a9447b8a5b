"""CPU cost of the hybrid core per decode step, against one target forward of a SmolLM2-135M-shaped model.

    python -m bench.step_cost [--threads 1] [--repeats 20] [--model random|smollm2] [--no-model] [--depths 0,1,2,3,4,8]

For batch 1/4/32/128 and two modes -- ``chain`` (EAGLE chain of 8 vs n-gram chain of 8, ``choose``, 8 verify nodes)
and ``tree`` (EAGLE chain of 8 + n-gram tree of 16, ``merge``, 16 verify nodes) -- it times, eagerly on the CPU:
``select`` alone; ``decide`` = everything the core adds before the target forward (n-gram acceptance gather, model
temperature scaling, survivals, device price, select); ``verify`` = ``greedy_accept`` on ``[B, W, 49152]`` logits
(dominated by the argmax over the vocabulary, which any decoder pays). The target forward verifies the same ``B x W``
tokens with an empty KV cache (no context attention), i.e. a *lower bound* on the real verify forward, so the printed
ratios overstate the core's share.

``--depths``: ``decide`` with adaptive drafting, as the reference loop runs it (``DecisionStep(depths=...)`` and a
draft cost of 2 ms per chain position: every candidate depth is priced, selected and scored each step; the EAGLE chain
of 8 must be one of the depths).

``--model random`` (default) builds a randomly initialised ``LlamaForCausalLM`` with SmolLM2-135M's shapes (hidden 576,
30 layers, 9 heads / 3 KV heads, vocab 49152): same FLOPs as the real model, no conversion needed. ``--model smollm2``
loads the real weights through ``sglang_hybrid.reference.models`` (converts the packaged GGUF once).

Inputs are synthetic (random features and survivals, shapes as in serving); only pure-PyTorch modules are imported.
Numbers are medians of one run on this machine; compare ratios, not absolute times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.cost import CostModel
from sglang_hybrid.selector import Candidates, Source, select
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_parents
from sglang_hybrid.verify import greedy_accept

VOCAB = 49152
MODES = {"chain": dict(km=8, kn=8, tree=False, mode="choose", n_nodes=8),
         "tree": dict(km=8, kn=16, tree=True, mode="merge", n_nodes=16)}


def make_step_inputs(batch: int, km: int, kn: int, tree: bool, n_nodes: int, device="cpu", seed: int = 0,
                     vocab: int = VOCAB, with_logits: bool = True) -> dict:
    """Synthetic per-step inputs with serving shapes (features, tokens, lengths, target logits, uniforms)."""
    g = torch.Generator().manual_seed(seed)

    def ri(lo, hi, shape):
        return torch.randint(lo, hi, shape, generator=g)

    if tree:   # heap-shaped tree: node i hangs under (i - 1) // 2 (-1 = root for node 0)
        par = torch.tensor([(i - 1) // 2 if i else -1 for i in range(kn)]).expand(batch, kn).contiguous()
    else:
        par = chain_parents(batch, kn)
    depth = torch.zeros(batch, kn, dtype=torch.int64)
    for i in range(kn):
        p = int(par[0, i])
        depth[:, i] = 1 if p < 0 else depth[:, p] + 1
    model_tokens = ri(0, vocab, (batch, km))
    ngram_tokens = ri(0, vocab, (batch, kn))
    ngram_tokens[: batch // 2, 0] = model_tokens[: batch // 2, 0]   # half the requests share a first token
    x = dict(
        feats=dict(match_len=ri(0, 40, (batch, kn)), count=ri(1, 4, (batch, kn)), total=ri(4, 8, (batch, kn)),
                   depth=depth, source=ri(0, 2, (batch, kn))),
        par=par, prob=torch.rand((batch, km), generator=g), mdepth=torch.arange(1, km + 1).expand(batch, km),
        model_tokens=model_tokens, ngram_tokens=ngram_tokens,
        model_len=ri(0, km + 1, (batch,)), ngram_len=ri(0, kn + 1, (batch,)), root=ri(0, vocab, (batch,)),
        uniforms=torch.rand((batch, n_nodes + 1), generator=g), temperature=torch.full((batch,), 0.7))
    if with_logits:
        x["logits"] = torch.randn((batch, n_nodes + 1, vocab), generator=g)
    x = {k: ({kk: vv.to(device).contiguous() for kk, vv in v.items()} if isinstance(v, dict)
             else v.to(device).contiguous()) for k, v in x.items()}
    x["ngram_cal"] = NgramCalibration.load().to(device)
    x["model_cal"] = ModelCalibration(np.linspace(0.9, 1.4, 8)).to(device)
    x["cost"] = CostModel([1, 64, 256, 1024, 4096], [0.010, 0.011, 0.016, 0.045, 0.17]).to(device)
    x["batch"] = batch
    return x


#: one EAGLE chain position's draft cost for ``--depths`` (seconds, whatever the batch)
DRAFT_COST = CostModel([1, 4096], [0.002, 0.002])


def decision_step(x: dict, mode: str, n_nodes: int, depths=None) -> DecisionStep:
    return DecisionStep(mode=mode, n_nodes=n_nodes, model_calibration=x["model_cal"], ngram_calibration=x["ngram_cal"],
                        depths=depths)


def decide(x: dict, mode: str, n_nodes: int, tree: bool, depths=None):
    """Everything before the target forward: the core's DecisionStep (acceptance -> survival -> price -> select);
    with ``depths``, adaptive drafting (every candidate depth scored)."""
    model = ModelDraft(x["model_tokens"], x["prob"], x["model_len"])
    ngram = NgramDraft(x["ngram_tokens"], x["par"], x["ngram_len"], tree=tree, **x["feats"])
    draft_cost = DRAFT_COST.to("cpu") if depths else None
    d = decision_step(x, mode, n_nodes, depths)(x["root"], model, ngram, cost=x["cost"], batch=x["batch"],
                                                draft_cost=draft_cost)
    return d.b_star, d.lam, d.tree


def select_only(x: dict, mode: str, n_nodes: int, s_m, s_ng, lam):
    """The selector alone (a component of ``decide``, timed on its own)."""
    return select(x["root"], [Candidates.chain(x["model_tokens"], s_m, x["model_len"], Source.MODEL),
                              Candidates(x["ngram_tokens"], x["par"], s_ng, x["ngram_len"], Source.NGRAM)],
                  lam, mode=mode, n_nodes=n_nodes)


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def target_model(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM
    if kind == "smollm2":
        from sglang_hybrid.reference.models import load_smollm2
        return load_smollm2().model.eval(), "SmolLM2-135M-Instruct (real weights)"
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval(), "random LlamaForCausalLM with SmolLM2-135M shapes"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--model-repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,4,32,128")
    ap.add_argument("--model", default="random", choices=["random", "smollm2"])
    ap.add_argument("--no-model", action="store_true", help="skip the target forward (core timings only)")
    ap.add_argument("--depths", default=None,
                    help="comma-separated EAGLE draft depths (0 = skip, must include 8): time decide with adaptive "
                         "drafting")
    args = ap.parse_args(argv)
    depths = None
    if args.depths:
        try:
            depths = tuple(int(d) for d in args.depths.split(","))
        except ValueError:
            ap.error(f"--depths must be comma-separated ints, got {args.depths!r}")
        if 8 not in depths or min(depths) < 0:
            ap.error(f"--depths must be >= 0 and include 8 (the EAGLE chain drafted), got {args.depths!r}")
    torch.set_num_threads(args.threads)
    model, model_desc = (None, "none") if args.no_model else target_model(args.model)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"torch {torch.__version__}, {args.threads} CPU thread(s); target: {model_desc}; medians of "
          f"{args.repeats} (core) / {args.model_repeats} (target) runs"
          + (f"; decide with adaptive drafting, depths {depths}" if depths else ""))
    hdr = (f"{'batch':>5} {'mode':>6} {'W':>3} {'select ms':>10} {'decide ms':>10} {'verify ms':>10}"
           f" {'target fwd ms':>14} {'decide/fwd':>11} {'verify/fwd':>11}")
    print(hdr)
    print("-" * len(hdr))
    for b in batches:
        fwd_ms = {}
        for name, m in MODES.items():
            x = make_step_inputs(b, m["km"], m["kn"], m["tree"], m["n_nodes"])
            with torch.inference_mode():
                _, lam, t = decide(x, m["mode"], m["n_nodes"], m["tree"])
                step = decision_step(x, m["mode"], m["n_nodes"])
                s_m = step.model_survival(ModelDraft(x["model_tokens"], x["prob"], x["model_len"]))
                s_ng = step.ngram_survival(NgramDraft(x["ngram_tokens"], x["par"], x["ngram_len"], tree=m["tree"],
                                                      **x["feats"]))
                sel = median_ms(lambda: select_only(x, m["mode"], m["n_nodes"], s_m, s_ng, lam), args.repeats)
                dec = median_ms(lambda: decide(x, m["mode"], m["n_nodes"], m["tree"], depths), args.repeats)
                ver = median_ms(lambda: greedy_accept(t, x["logits"]), args.repeats)
                w = m["n_nodes"] + 1
                if model is not None and w not in fwd_ms:
                    ids = torch.randint(0, VOCAB, (b, w), generator=torch.Generator().manual_seed(1))
                    fwd_ms[w] = median_ms(lambda: model(input_ids=ids, use_cache=False), args.model_repeats, 1)
            f = fwd_ms.get(w)
            fmt = (lambda v: f"{v / f:.5f}") if f else (lambda v: "n/a")
            print(f"{b:>5} {name:>6} {w:>3} {sel:>10.3f} {dec:>10.3f} {ver:>10.3f} "
                  f"{(f'{f:.1f}' if f else 'n/a'):>14} {fmt(dec):>11} {fmt(ver):>11}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
