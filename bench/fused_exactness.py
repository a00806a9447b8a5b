"""The fused decision kernels against the torch ``DecisionStep`` on random and adversarial batches.

    TRITON_INTERPRET=1 python -m bench.fused_exactness [--batches 10000] [--episodes 0] [--ragged 0] [--recorded]
                                                       [--seed 0] [--control]

Each batch draws a configuration (choose or merge; EAGLE steps 1-6, adaptive depths or not; n-gram chains of 1-12;
``n_nodes`` the default or anything from 1 up, so width <= depth happens; width buckets the default, a random set or
the full width only; no cost table, a linear, a staircase or a one-point table; a draft cost table; the identity or a
random model calibration; request offsets or none; batch 1, 2-40 or the maximum 128) and data (random, or adversarial:
tiny vocabularies so paths fold, the n-gram chain a copy of the EAGLE chain, confidences from {0, 0.25, 0.5, 1} so
survivals tie or vanish, empty and full-length n-gram chains, identical rows). Both paths decide the step; the tree
(tokens, parents, ancestor mask, depths, validity, sources), ``b*``, the next width and depth must be equal, the
price equal within 1e-6 relative, survivals, acceptances and rates within 1e-5 (``VALUE_RTOL``: the last bits of
float32 log and exp differ between torch's vectorised functions and Triton's).

``--episodes N`` also runs the worker's whole step both ways (``run_steps``: ``HybridStep`` select, the verify input's
links and mask, after_verify, over evolving batches; cost tables at one context or at two, the kind measured at start,
blended at each step's context: the blended tables must be equal too), ``N`` episodes of 6 steps, each step counted as
a batch.

``--ragged N`` also compares ragged verify's layout and compaction kernels with the torch builder on ``N`` random
trees (``run_ragged``; ``run_steps`` compares them on every step's decided tree too).

``--recorded`` also decides steps recorded from the CPU reference loop on real text (``run_recorded``: SmolLM2 and
the shipped EAGLE head on code edits and chats).

``--control`` decides the reference with the other mode (choose for merge and back): the comparison must then find
mismatches, which shows it can fail. On this CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
required); on a GPU, compiled.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

#: exactness target of the engine issue: batches compared
TARGET_BATCHES = 10_000
#: the price's relative tolerance (the engine issue's)
RTOL = 1e-6
#: survivals, acceptances and rates: float32 chains of log, exp and division whose last bits differ between torch's
#: vectorised functions and Triton's (a 1-ulp difference in an acceptance near 1 grows about tenfold through the
#: request offset's logit); 1e-5 relative is about 100 float32 ulps
VALUE_RTOL = 1e-5
MAX_BATCH = 128


def _config(rng: np.random.Generator) -> dict:
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.widths import default_buckets

    mode = str(rng.choice(["choose", "merge"]))
    s_max = int(rng.integers(1, 7))
    k = int(rng.integers(1, 13))
    adaptive = s_max >= 2 and rng.random() < 0.5
    depths = None
    s = s_max
    if adaptive:
        extra = [d for d in range(1, s_max) if rng.random() < 0.6]
        depths = tuple(sorted(set(extra) | {s_max}))
        if len(depths) == 1:
            depths = (1, s_max)
        s = int(rng.choice(depths))
    m = 0 if rng.random() < 0.5 else int(rng.integers(1, 5))       # EAGLE alternatives per chain position
    # the worker's default budget (``HybridSettings.resolved_n_nodes``: with alternatives, below the candidates, which
    # then compete for the chains' nodes), or any budget up to one that holds every candidate and more
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    default_nodes = HybridSettings(mode=mode, ngram_k=k).resolved_n_nodes(s_max)
    n_nodes = default_nodes if rng.random() < 0.6 else int(rng.integers(1, s_max * (1 + m) + k + 3))
    w = n_nodes + 1
    u = rng.random()
    if u < 0.5:
        widths = list(default_buckets(w))
    elif u < 0.8:
        widths = sorted({int(x) for x in rng.integers(1, w + 1, size=int(rng.integers(1, 4)))} | {w})
    else:
        widths = [w]
    u = rng.random()
    if u < 0.3:
        cost = None
    elif u < 0.6:
        cost = CostModel.linear(float(rng.uniform(0.002, 0.02)), float(rng.uniform(1e-5, 5e-4)))
    elif u < 0.9:
        sizes = sorted({int(x) for x in rng.integers(1, 600, size=int(rng.integers(2, 7)))})
        steps = np.cumsum(rng.choice([0.0, 0.0, 0.003, 0.01], size=len(sizes))) + 0.01
        cost = CostModel(sizes, steps.tolist())
    else:
        cost = CostModel([int(rng.integers(1, 300))], [float(rng.uniform(0.005, 0.02))])
    draft_cost = (CostModel.linear(float(rng.uniform(2e-4, 3e-3)), float(rng.uniform(0, 2e-5)))
                  if depths is not None and rng.random() < 0.7 else None)
    temps = None if rng.random() < 0.4 else rng.uniform(0.5, 2.0, size=int(rng.integers(1, 9))).tolist()
    u = rng.random()
    b = 1 if u < 0.15 else (MAX_BATCH if u < 0.25 else int(rng.integers(2, 41)))
    return dict(mode=mode, s=s, k=k, m=m, depths=depths, n_nodes=n_nodes, widths=widths,
                width=int(rng.choice(widths)), cost=cost, draft_cost=draft_cost, temps=temps,
                bias=rng.random() < 0.4, ngram_bias=rng.random() < 0.4, b=b)


def _data(rng: np.random.Generator, cfg: dict) -> dict:
    b, s, k = cfg["b"], cfg["s"], cfg["k"]
    adversarial = rng.random() < 0.5
    m = cfg["m"]
    vocab = max(int(rng.integers(2, 6)), m + 1) if adversarial else 32000
    root = rng.integers(0, vocab, size=b)
    mt = rng.integers(0, vocab, size=(b, s))
    nt = rng.integers(0, vocab, size=(b, k))
    # alternatives: distinct from each other and from the chain token at their position (ranks 2..M+1 of one forward)
    at = np.zeros((b, s, m), dtype=np.int64)
    for r in range(b):
        for j in range(s):
            at[r, j] = (mt[r, j] + 1 + rng.choice(vocab - 1, size=m, replace=False)) % vocab
    if adversarial and rng.random() < 0.5:                      # the n-gram chain copies the EAGLE chain's prefix
        n = min(s, k)
        nt[:, :n] = mt[:, :n]
        cut = rng.integers(0, n + 1, size=b)                     # ... up to a per-row point
        for r in range(b):
            if cut[r] < n:
                # ... where it takes one of the alternatives (folds into that leaf) or another token
                nt[r, cut[r]] = (at[r, cut[r], rng.integers(0, m)] if m and rng.random() < 0.5
                                 else (nt[r, cut[r]] + 1) % vocab)
    conf = (rng.choice([0.0, 0.25, 0.5, 1.0], size=(b, s)) if adversarial and rng.random() < 0.5
            else rng.random((b, s)))
    alt_conf = (rng.choice([0.0, 0.25, 0.5, 1.0], size=(b, s, m)) if adversarial and rng.random() < 0.5
                else rng.random((b, s, m)) * rng.random((b, s, 1)))
    u = rng.random()
    ng_len = (np.zeros(b, dtype=np.int64) if adversarial and u < 0.2 else
              np.full(b, k) if adversarial and u < 0.5 else rng.integers(0, k + 1, size=b))
    match = rng.integers(0, 80, size=(b, k))
    total = rng.integers(0, 40, size=(b, k))
    count = np.minimum(rng.integers(0, 40, size=(b, k)), total)
    source = rng.integers(0, 2, size=(b, k))
    if adversarial and rng.random() < 0.3:                       # identical rows: ties across the batch
        for a in (root, mt, nt, conf, ng_len, match, total, count, source, at, alt_conf):
            a[...] = a[:1]
    depth = np.broadcast_to(np.arange(1, k + 1), (b, k)).copy()
    bias = rng.normal(0, 1.5, size=b).astype(np.float32) if cfg["bias"] else None
    ngram_bias = rng.normal(0, 1.5, size=b).astype(np.float32) if cfg["ngram_bias"] else None
    t = lambda x, dt=torch.int64: torch.as_tensor(np.ascontiguousarray(x), dtype=dt)  # noqa: E731
    return dict(root=t(root), mt=t(mt), conf=t(conf, torch.float32), nt=t(nt), ng_len=t(ng_len), match=t(match),
                count=t(count), total=t(total), depth=t(depth), source=t(source),
                alt_tokens=t(at) if m else None, alt_conf=t(alt_conf, torch.float32) if m else None,
                bias=None if bias is None else t(bias, torch.float32),
                ngram_bias=None if ngram_bias is None else t(ngram_bias, torch.float32))


def _progress(n: int, desc: str, unit: str, show: bool):
    if not show:
        return range(n)
    from tqdm import tqdm

    return tqdm(range(n), desc=desc, unit=unit, file=sys.stderr, mininterval=5)


def _compare(ref, got) -> list[str]:
    """Names of the fields where ``got`` differs from ``ref`` (exact for the tree's discrete fields and the plan)."""
    bad = []
    for f in ref.tree._fields:
        a, c = getattr(ref.tree, f), getattr(got.tree, f)
        same = (torch.allclose(a, c, rtol=VALUE_RTOL, atol=1e-7) if a.dtype.is_floating_point
                else a.shape == c.shape and torch.equal(a, c))
        if not same:
            bad.append(f"tree.{f}")
    for f in ("b_star", "next_width", "next_depth"):
        if not torch.equal(getattr(ref, f), getattr(got, f)):
            bad.append(f)
    for f in ("lam", "model_survival", "ngram_survival", "model_acceptance", "ngram_acceptance", "model_rate"):
        a, c = getattr(ref, f), getattr(got, f)
        tol = RTOL if f == "lam" else VALUE_RTOL
        if (a is None) != (c is None) or (a is not None and not torch.allclose(a, c, rtol=tol, atol=1e-9)):
            bad.append(f)
    return bad


def run(batches: int, seed: int = 0, control: bool = False, progress: bool = True) -> dict:
    """Compare ``batches`` batches; returns counts (batches, mismatching batches, per-field counts, first failure)."""
    from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
    from sglang_hybrid.kernels import FusedDecisionStep
    from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
    from sglang_hybrid.survival import chain_parents

    ngram_cal = NgramCalibration.load(
        os.path.join(os.path.dirname(__file__), "..", "sglang_hybrid", "data", "ngram_calibration.json")).to("cpu")
    rng = np.random.default_rng(seed)
    fields: dict = {}
    failed, first = 0, None
    for i in _progress(batches, "fused vs torch", "batch", progress):
        cfg = _config(rng)
        x = _data(rng, cfg)
        mcal = (ModelCalibration.identity() if cfg["temps"] is None else ModelCalibration(cfg["temps"])).to("cpu")
        kw = dict(n_nodes=cfg["n_nodes"], model_calibration=mcal, ngram_calibration=ngram_cal,
                  widths=cfg["widths"], depths=cfg["depths"])
        fused = FusedDecisionStep(DecisionStep(mode=cfg["mode"], **kw), "cpu")
        ref_mode = {"choose": "merge", "merge": "choose"}[cfg["mode"]] if control else cfg["mode"]
        torch_step = DecisionStep(mode=ref_mode, **kw)
        b, k = cfg["b"], cfg["k"]
        ngram = NgramDraft(x["nt"], chain_parents(b, k), x["ng_len"], x["match"], x["count"], x["total"], x["depth"],
                           x["source"])
        cost = cfg["cost"].to("cpu") if cfg["cost"] is not None else None
        draft_cost = cfg["draft_cost"].to("cpu") if cfg["draft_cost"] is not None else None
        model = ModelDraft(x["mt"], x["conf"], torch.full((b,), cfg["s"]), x["alt_tokens"], x["alt_conf"])
        ref = torch_step(x["root"], model, ngram, cost=cost, draft_cost=draft_cost, width=cfg["width"],
                         model_bias=x["bias"], ngram_bias=x["ngram_bias"], check_values=False)
        got = fused(x["root"], x["mt"], x["conf"], ngram, cost=cost, draft_cost=draft_cost, width=cfg["width"],
                    model_bias=x["bias"], ngram_bias=x["ngram_bias"], alt_tokens=x["alt_tokens"],
                    alt_conf=x["alt_conf"])
        bad = _compare(ref, got)
        if bad:
            failed += 1
            for f in bad:
                fields[f] = fields.get(f, 0) + 1
            if first is None:
                first = {"batch": i, "fields": bad, "config": {k2: (v if not hasattr(v, "sizes") else "table")
                                                               for k2, v in cfg.items()}}
    return {"batches": batches, "failed": failed, "fields": fields, "first": first}


def run_recorded(max_new: int = 24, seed: int = 0) -> dict:
    """Decisions on steps recorded from the CPU reference loop on real text: SmolLM2-135M-Instruct with the shipped
    EAGLE head, HYBRID merge with n-gram chains (4 EAGLE steps, n-gram chains of 8), three code edits and two chat
    questions decoded together for ``max_new`` tokens. Every recorded step whose EAGLE chain is full length (all but
    the first) is decided again by both paths in the worker's configuration, in both modes, with and without cost
    tables and adaptive depths, at a random width bucket. Returns counts as ``run`` plus ``skipped`` steps."""
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.kernels import FusedDecisionStep
    from sglang_hybrid.reference import eagle
    from sglang_hybrid.reference import prompts as P
    from sglang_hybrid.reference.loop import ReferenceLoop
    from sglang_hybrid.reference.models import load_smollm2
    from sglang_hybrid.step import DecisionStep
    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT
    from sglang_hybrid.widths import default_buckets

    lm = load_smollm2(full_check=False)
    head = eagle.load_head(DEFAULT_OUT, lm.model.config)
    texts = list(P.CODE_EDITS[:3]) + [P.Prompt("chat", "chat", q) for q in (
        "Explain in two sentences what a hash map is.", "Write a haiku about the sea, then explain its imagery.")]
    prompts = [P.encode(lm.tokenizer, t) for t in texts]
    loop = ReferenceLoop(lm.model, mode="merge", head=head, eagle_k=4, ngram_k=8, n_nodes=12, ngram_tree=False,
                         cost=CostModel.linear(0.05, 0.0008))
    recorded = []
    decide = loop.decide

    def record(root, model, ngram, **kw):
        recorded.append((root.clone(), model, ngram))
        return decide(root, model, ngram, **kw)

    loop.decide = record
    loop.generate(prompts, max_new)
    rng = np.random.default_rng(seed)
    costs = (None, CostModel.linear(0.01, 1e-4).to("cpu"))
    draft_cost = CostModel.linear(1e-3, 1e-5).to("cpu")
    fields: dict = {}
    failed = skipped = compared = 0
    first = None
    for i, (root, model, ngram) in enumerate(recorded):
        s = model.tokens.shape[1] if model is not None else 0
        if s == 0 or not bool((model.length == s).all()):
            skipped += 1                          # the first step drafts no chain: nothing the worker would see
            continue
        for mode in ("choose", "merge"):
            n_nodes = s + 8 if mode == "merge" else 8
            widths = default_buckets(n_nodes + 1)
            for cost in costs:
                depths = (1, 2, 3, 4) if cost is not None and rng.random() < 0.5 else None
                kw = dict(mode=mode, n_nodes=n_nodes, model_calibration=loop.model_cal,
                          ngram_calibration=loop.ngram_cal, widths=widths, depths=depths)
                width = int(rng.choice(widths))
                dc = draft_cost if depths is not None else None
                ref = DecisionStep(**kw)(root, model, ngram, cost=cost, width=width, draft_cost=dc,
                                         check_values=False)
                got = FusedDecisionStep(DecisionStep(**kw), "cpu")(root, model.tokens, model.confidence, ngram,
                                                                    cost=cost, width=width, draft_cost=dc)
                compared += 1
                bad = _compare(ref, got)
                if bad:
                    failed += 1
                    for f in bad:
                        fields[f] = fields.get(f, 0) + 1
                    first = first or {"step": i, "mode": mode, "fields": bad}
    return {"batches": compared, "steps": len(recorded), "skipped": skipped, "failed": failed, "fields": fields,
            "first": first}


def _table(rng: np.random.Generator, base: float, per_token: float, measured: bool = False):
    """A linear table, or (half the time, always with ``measured``) one at two contexts (the kind measured at start)
    whose shorter context costs less, with contexts inside the episodes' few dozen committed tokens so the blend moves
    from step to step."""
    from sglang_hybrid.cost import ContextCostModel, CostModel

    if rng.random() < 0.5 and not measured:
        return CostModel.linear(base, per_token)
    sizes = np.unique(np.concatenate([[1], rng.integers(2, 200, size=int(rng.integers(0, 8))), [4096]]))
    long = CostModel(sizes, base + per_token * sizes)
    short_context = int(rng.integers(1, 20))
    short = long.seconds * rng.uniform(0.3, 1.0, size=long.seconds.size)
    return ContextCostModel(long.sizes, long.seconds, np.minimum.accumulate(short[::-1])[::-1], short_context,
                            short_context + int(rng.integers(1, 40)))


def _step_settings(rng: np.random.Generator, tmp: str, full: bool = False):
    """One episode's worker settings, drawn; ``full``: every kernel of the step runs (both tables measured at start,
    EAGLE alternatives on, the prompt lookup on), so a short run (``bench.gpu_compile``'s) launches each of them."""
    num_steps = int(rng.integers(2 if full else 1, 6))
    kw = dict(mode=str(rng.choice(["choose", "merge"])), ngram_k=int(rng.integers(1, 13)),
              context_lookup=bool(rng.random() < 0.8) or full, log_interval=0)
    if rng.random() < 0.3 and not full:
        kw["n_nodes"] = int(rng.integers(1, num_steps + kw["ngram_k"] + 2))
    if rng.random() < 0.7 or full:
        kw["cost_table"] = f"{tmp}/cost.json"
        _table(rng, float(rng.uniform(0.002, 0.02)), float(rng.uniform(1e-5, 5e-4)), full).save(kw["cost_table"])
        if num_steps >= 2 and (rng.random() < 0.6 or full):
            kw["draft_cost_table"] = f"{tmp}/draft.json"
            _table(rng, float(rng.uniform(2e-4, 3e-3)), 1e-5, full).save(kw["draft_cost_table"])
    if rng.random() < 0.5:
        kw["model_bias_eta"] = 0.1
    if rng.random() < 0.5:
        kw["ngram_bias_eta"] = 0.3
    if rng.random() < 0.5 or full:
        kw["eagle_alternatives"] = int(rng.integers(1, 4))
    return num_steps, kw


def run_steps(episodes: int, steps: int = 6, seed: int = 0, progress: bool = True, control: bool = False) -> dict:
    """The worker's whole device step, fused against torch: two ``HybridStep``s (``decision_kernels`` fused and torch)
    with the same settings and state run ``steps`` decode steps of an evolving batch (host proposals that align or
    not, stale slot generations, contexts the prompt lookup copies from, a span or the whole table), each ``select``
    then ``after_verify``; after every call the decisions and every piece of state (ring, context table, online
    offsets, the online temperatures, counters) must agree. With EAGLE alternatives (setting ``eagle_alternatives``)
    each path also takes the step's alternatives from its own position-0 table and the draft's records
    (``kernels.alternatives`` against ``sglang_plugin.alternatives``) and keeps the extend's top tokens after verify:
    alternatives and tables must agree.
    ``control``: the torch twin runs the other mode (the comparison must then find
    differences). Returns counts as ``run``."""
    import tempfile

    from sglang_hybrid.kernels import alternatives as fused_alt
    from sglang_hybrid.sglang_plugin import alignment, alternatives, context_lookup
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    rng = np.random.default_rng(seed)
    fields: dict = {}
    failed, first = 0, None
    learned = 0             # episodes whose n-gram offsets moved (so their comparison is not of zeros)
    ngram_tested = 0        # n-gram chain tokens the fused path counted as tested (so that counter is not of zeros)
    with tempfile.TemporaryDirectory() as tmp:
        for ep in _progress(episodes, "fused vs torch steps", "episode", progress):
            num_steps, kw = _step_settings(rng, tmp, full=ep == 0)
            pool = int(rng.integers(1, 9))
            max_ctx = int(rng.choice([48, 300]))
            twin = kw
            if control:                  # the other mode, at the same verify width (same n_nodes)
                twin = dict(kw, mode={"choose": "merge", "merge": "choose"}[kw["mode"]],
                            n_nodes=HybridSettings(**kw).resolved_n_nodes(num_steps))
            pair = [HybridStep(HybridSettings(decision_kernels=kind, **opts), num_steps=num_steps, pool_size=pool,
                               device="cpu", max_context_len=max_ctx)
                    for kind, opts in (("fused", kw), ("torch", twin))]
            m = kw.get("eagle_alternatives", 0)
            firsts = [alternatives.FirstAlternatives(pool, m, "cpu") for _ in pair] if m else None
            vocab = max(int(rng.integers(2, 6)), m + 2)
            committed = {sl: list(rng.integers(0, vocab, size=int(rng.integers(1, 40)))) for sl in range(pool)}
            gens = {sl: 0 for sl in range(pool)}
            bad_ep = []
            for _ in range(steps):
                b = int(rng.integers(1, pool + 1))
                slots = np.sort(rng.choice(pool, size=b, replace=False))
                for sl in slots:
                    if rng.random() < 0.1:                       # a new request takes the slot
                        gens[sl] += 1
                        committed[sl] = list(rng.integers(0, vocab, size=int(rng.integers(1, 40))))
                pw = pair[0].proposal_width
                props = np.full((b, pw), -1)
                lens, ats, pgen = np.zeros(b, dtype=np.int64), np.zeros(b, dtype=np.int64), np.zeros(b, dtype=np.int64)
                for r, sl in enumerate(slots):
                    c = committed[sl]
                    at = max(1, len(c) - int(rng.integers(0, 4)))
                    n = int(rng.integers(0, pw + 1))
                    cont = list(c[at:]) + list(rng.integers(0, vocab, size=pw))
                    if rng.random() < 0.2:                       # a proposal that no longer matches
                        cont = list(rng.integers(0, vocab, size=pw + len(c)))
                    props[r, :n] = cont[:n]
                    lens[r], ats[r] = n, at
                    pgen[r] = gens[sl] - (1 if rng.random() < 0.1 else 0)
                feats = [rng.integers(0, 30, size=(b, pw)) for _ in range(3)]
                t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.int64)  # noqa: E731
                sl_t = t(slots)
                seq = t([len(committed[sl]) - 1 for sl in slots])
                gen_t = t([gens[sl] for sl in slots])
                root = t([committed[sl][-1] for sl in slots])
                chain = t(rng.integers(0, vocab, size=(b, num_steps)))
                conf = torch.as_tensor(rng.random((b, num_steps)), dtype=torch.float32)
                depths = pair[0].depths
                s_now = int(rng.choice(depths))
                chain, conf = chain[:, :s_now].contiguous(), conf[:, :s_now].contiguous()
                width = int(rng.choice(pair[0].widths))
                longest = int(seq.max()) + 1
                source = rng.integers(0, 2, (b, pw))
                host_writes = rng.random(b) < 0.8                # the host has written the new slot's context
                for st in pair:
                    alignment.publish(st.buffers, sl_t, t(props), t(lens), t(ats), t(pgen), t(feats[0]),
                                      t(np.minimum(feats[1], feats[2])), t(feats[2]), t(source))
                    if st.context is not None:
                        for r, sl in enumerate(slots):
                            if int(st.context.gen[sl]) != gens[sl] and host_writes[r]:
                                c = committed[sl][:-1]
                                context_lookup.write_context(st.context, t([sl] * len(c)), t(range(len(c))), t(c),
                                                             t([sl]), t([gens[sl]]))
                span = pair[0].lookup_span(longest) if rng.random() < 0.7 else None
                alt_bad, alts = [], [{}, {}]
                if m:
                    # the draft's records: M + 1 distinct tokens per position, the chain's own among them or not
                    rec_i = t(np.stack([np.stack([rng.choice(vocab, m + 1, replace=False) for _ in range(num_steps)])
                                        for _ in range(b)]))
                    rec_p = torch.as_tensor(-np.sort(-rng.random((b, num_steps, m + 1))), dtype=torch.float32)
                    a_k = fused_alt.step_alternatives(firsts[0], sl_t, gen_t, rec_p, rec_i, chain)
                    a_t = alternatives.step_alternatives(firsts[1], sl_t, gen_t, rec_p, rec_i, chain)
                    if not (torch.equal(a_k[0], a_t[0]) and torch.equal(a_k[1], a_t[1])):
                        alt_bad.append("alternatives")
                    alts = [dict(alt_tokens=a[0], alt_conf=a[1]) for a in (a_k, a_t)]
                got = pair[0].select(root, chain, conf, sl_t, gen_t, seq, width=width, lookup_span=span, **alts[0])
                ref = pair[1].select(root, chain, conf, sl_t, gen_t, seq, width=width, lookup_span=span, **alts[1])
                bad = alt_bad + (_compare(ref, got) + _state_diff(pair) + _links_diff(got.tree, seq, rng)
                       + _ragged_diff(got.tree, seq, rng))
                acc = t(rng.integers(1, width + 1, size=b))
                emitted = t(rng.integers(0, vocab, size=(b, width)))
                for st in pair:
                    st.after_verify(st is pair[0] and got.tree or ref.tree, sl_t, seq, emitted, acc)
                bad += [f"after_verify.{f}" for f in _state_diff(pair)]
                if m:
                    # the draft extend's top tokens for the next step, kept per slot (some rows a newer request's)
                    top_p = torch.as_tensor(-np.sort(-rng.random((b, m + 1))), dtype=torch.float32)
                    top_i = t(np.stack([rng.choice(vocab, m + 1, replace=False) for _ in range(b)]))
                    rec_gen = gen_t + t(rng.random(b) < 0.1)
                    fused_alt.record(firsts[0], sl_t, rec_gen, top_p, top_i)
                    firsts[1].record(sl_t, rec_gen, top_p, top_i)
                    if not all(torch.equal(getattr(firsts[0], f), getattr(firsts[1], f))
                               for f in ("probs", "tokens", "gen")):
                        bad.append("first_alternatives")
                for r, sl in enumerate(slots):
                    committed[sl] = committed[sl] + [int(x) for x in emitted[r, :int(acc[r])]]
                bad_ep += bad
            learned += int(pair[0].ngram_bias is not None and bool((pair[0].ngram_bias != 0).any()))
            ngram_tested += pair[0].counters.snapshot()["ngram_tested"]
            if bad_ep:
                failed += 1
                for f in set(bad_ep):
                    fields[f] = fields.get(f, 0) + 1
                if first is None:
                    first = {"episode": ep, "fields": sorted(set(bad_ep)), "settings": kw, "steps": num_steps}
    return {"batches": episodes * steps, "episodes": episodes, "failed": failed, "fields": fields, "first": first,
            "ngram_offsets_learned": learned, "ngram_tokens_tested": ngram_tested}


def _links_diff(tree, seq_lens: torch.Tensor, rng: np.random.Generator) -> list[str]:
    """The verify input's node tokens, tree links and FULL_MASK rows: the kernel against ``tree_mask``'s torch code
    (over-sized ``seq_lens_sum`` half the time; a uint8 buffer, as Triton backends keep, or a bool one)."""
    from sglang_hybrid.kernels import fused_links_and_mask
    from sglang_hybrid.sglang_plugin.tree_mask import full_mask, tree_links_torch, verify_nodes

    total = int(seq_lens.sum()) + (int(rng.integers(0, 50)) if rng.random() < 0.5 else 0)
    b, w = tree.tokens.shape
    dtype = torch.uint8 if rng.random() < 0.5 else torch.bool
    draft_ref, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
    ref = (draft_ref, *tree_links_torch(anc, seq_lens), full_mask(anc, seq_lens, total).to(dtype))
    got = fused_links_and_mask(tree.tokens, tree.valid, tree.ancestors, seq_lens, total,
                               torch.full((total * w + w * w * b,), 7, dtype=torch.uint8).to(dtype))
    used = int(seq_lens.sum()) * w + w * w * b                         # the requests' rows (the tail is unread)
    names = ("draft_token", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")
    bad = [f"links.{n}" for n, x, y in zip(names, ref[:5], got[:5]) if not torch.equal(x, y)]
    if not torch.equal(ref[5][:used], got[5][:used]):
        bad.append("links.full_mask")
    return bad


def _ragged_diff(tree, seq_lens: torch.Tensor, rng: np.random.Generator) -> list[str]:
    """Ragged verify's layout before the read and its compaction (``kernels.ragged_layout``) against the torch builder
    (``ragged.layout.build_pending_layout`` of ``verify_nodes``' ancestors), as the worker calls them: half the time
    on the tree widened to a wider bucket (``widths.widen``, whose rows are not contiguous), the mask in a uint8
    buffer sized as the Triton backend's (``row_bound`` = the longest row + the width, room for more requests), half
    the time padded to more request slots in the same launch (against ``graph_runner.pad_requests``), the node tokens
    and positions of the padded batch compacted to the tier bound, half the time into longer static buffers; the mask
    compared up to ``mask_indptr[B]`` (no reader looks past it)."""
    from sglang_hybrid.kernels.ragged_layout import pending_layout
    from sglang_hybrid.sglang_plugin.ragged.graph_runner import pad_requests
    from sglang_hybrid.sglang_plugin.ragged.layout import build_pending_layout, node_counts
    from sglang_hybrid.sglang_plugin.tree_mask import verify_nodes
    from sglang_hybrid.widths import widen

    b, w = tree.tokens.shape
    if rng.random() < 0.5:
        w += int(rng.integers(1, 8))
        tree = widen(tree, w)
    total = int(seq_lens.sum()) + (int(rng.integers(0, 50)) if rng.random() < 0.5 else 0)
    row_bound = int(seq_lens.max()) + w + int(rng.integers(0, 9))
    size = (b + int(rng.integers(0, 3))) * w * row_bound + 1
    max_rows = b * w if rng.random() < 0.7 else None
    bufs = [torch.full((size,), 7, dtype=torch.uint8) for _ in range(2)]
    _, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
    ref = build_pending_layout(tree.valid, anc, seq_lens, total, node_counts(tree.valid), mask_out=bufs[0],
                               row_bound=row_bound, max_rows=max_rows)
    slots = b + int(rng.integers(0, 3)) if rng.random() < 0.5 else None
    got = pending_layout(tree.valid, tree.ancestors, seq_lens, total, mask_out=bufs[1], row_bound=row_bound,
                         max_rows=max_rows, slots=slots)
    bad = [f"ragged.{n}" for n in ("counts", "token_index", "qo_indptr", "mask_indptr")
           if not torch.equal(getattr(ref, n), getattr(got, n))]
    if slots is not None:                       # padded to the graphs' slots in the same launch
        want, have = pad_requests(ref, slots), pad_requests(got, slots)
        bad += [f"ragged.slots_{n}" for n in ("counts", "qo_indptr", "mask_indptr")
                if not torch.equal(getattr(want, n), getattr(have, n))]
    end = int(ref.mask_indptr[-1])
    if not torch.equal(bufs[0][:end], bufs[1][:end]):
        bad.append("ragged.custom_mask")
    ids = torch.as_tensor(rng.integers(0, 50_000, size=b * w), dtype=torch.int64)
    positions = torch.as_tensor(rng.integers(0, 4_000, size=b * w), dtype=torch.int64)
    out = None
    if rng.random() < 0.5:                      # into the graphs' static buffers, longer than the rows
        extra = int(rng.integers(0, 9))
        out = tuple(torch.full((got.rows_bound() + extra,), -7, dtype=torch.int64) for _ in range(2))
    names = ("input_ids", "positions", "kv_write_cols")
    have = got.compact_ahead(ids, positions, out)
    bad += [f"ragged.compact_{n}" for n, x, y in zip(names, ref.compact_ahead(ids, positions), have)
            if not torch.equal(x, y)]
    if out is not None and not all(h.data_ptr() == o.data_ptr() for h, o in zip(have, out)):
        bad.append("ragged.compact_out")
    return bad


def run_ragged(cases: int, seed: int = 0, progress: bool = True) -> dict:
    """``_ragged_diff`` on ``cases`` random trees (1-9 requests, widths 1-24, random parents and a tenth of the
    ancestor bits dropped, the self bit included, which the layout's reflexive rule restores; prefixes of 0-700
    tokens, past the kernel's 256-column chunk, as int64 or int32). Returns counts as ``run``."""
    from sglang_hybrid.selector import VerifyTree

    rng = np.random.default_rng(seed)
    fields: dict = {}
    failed, first = 0, None
    for case in _progress(cases, "ragged layout fused vs torch", "batch", progress):
        b, w = int(rng.integers(1, 10)), int(rng.integers(1, 25))
        n = rng.integers(1, w + 1, size=b)
        anc = torch.zeros(b, w, w, dtype=torch.bool)
        for r in range(b):
            for i in range(w):
                anc[r, i, i] = True
                if i:
                    anc[r, i] |= anc[r, int(rng.integers(0, i))]
        anc &= torch.as_tensor(rng.random((b, w, w)) > 0.1)
        valid = torch.as_tensor(np.arange(w)[None, :] < n[:, None])
        zeros = torch.zeros(b, w, dtype=torch.int64)
        tree = VerifyTree(tokens=torch.as_tensor(rng.integers(0, 100, size=(b, w))), parents=zeros, ancestors=anc,
                          depth=zeros, valid=valid, source=zeros, survival=zeros.float(),
                          expected_accepted=torch.zeros(b))
        seq = torch.as_tensor(rng.integers(0, 700, size=b), dtype=torch.int32 if rng.random() < 0.3 else torch.int64)
        bad = _ragged_diff(tree, seq, rng)
        if bad:
            failed += 1
            for f in bad:
                fields[f] = fields.get(f, 0) + 1
            if first is None:
                first = {"case": case, "fields": bad, "batch": b, "width": w}
    return {"batches": cases, "failed": failed, "fields": fields, "first": first}


def _state_diff(pair) -> list[str]:
    """Names of the device state that differs between two ``HybridStep``s."""
    a, b = pair
    bad = []
    # the trash columns (last) take writes nobody reads: the torch path writes there, the kernels skip them
    if not torch.equal(a.buffers.ring[:, :-1], b.buffers.ring[:, :-1]):
        bad.append("ring")
    if a.context is not None and not torch.equal(a.context.tokens[:, :-1], b.context.tokens[:, :-1]):
        bad.append("context")
    if a.model_bias is not None and not (torch.allclose(a.model_bias, b.model_bias, rtol=VALUE_RTOL, atol=1e-6)
                                         and torch.equal(a.model_bias_gen, b.model_bias_gen)):
        bad.append("model_bias")
    if a.ngram_bias is not None and not (torch.allclose(a.ngram_bias, b.ngram_bias, rtol=VALUE_RTOL, atol=1e-6)
                                         and torch.equal(a.ngram_bias_gen, b.ngram_bias_gen)):
        bad.append("ngram_bias")
    if not torch.allclose(a.counters.totals, b.counters.totals, rtol=VALUE_RTOL, atol=1e-6):
        bad.append("counters")
    ta, tb = a.online_temperature, b.online_temperature
    if (ta is None) != (tb is None) or ta is not None and not (
            torch.allclose(ta.temperatures, tb.temperatures, rtol=VALUE_RTOL, atol=1e-6)
            and torch.allclose(ta.sq_grad, tb.sq_grad, rtol=VALUE_RTOL, atol=1e-9)):
        bad.append("model_temperatures")
    for name in ("cost", "draft_cost"):            # the tables blended at the batch's context: exactly alike
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and not (torch.equal(x.seconds, y.seconds) and torch.equal(x._seg_slope, y._seg_slope)):
            bad.append(name)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=TARGET_BATCHES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=0,
                    help="also run this many episodes of the worker's whole step (HybridStep, 6 steps each)")
    ap.add_argument("--recorded", action="store_true",
                    help="also decide steps recorded from the CPU reference loop on real text (SmolLM2)")
    ap.add_argument("--ragged", type=int, default=0,
                    help="also compare ragged verify's layout kernels on this many random trees (run_ragged)")
    ap.add_argument("--control", action="store_true", help="reference in the other mode: mismatches must be found")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        print("error: no GPU here; run the kernels in Triton's interpreter: TRITON_INTERPRET=1 python -m "
              "bench.fused_exactness", file=sys.stderr)
        return 2
    t0 = time.time()
    res = run(args.batches, args.seed, args.control)
    print(f"fused decision vs torch DecisionStep: {res['batches']} batches (seed {args.seed}), "
          f"{res['failed']} differ; {time.time() - t0:.0f} s")
    _details(res)
    total, failed = res["batches"], res["failed"]
    if args.episodes:
        t0 = time.time()
        st = run_steps(args.episodes, seed=args.seed, control=args.control)
        print(f"fused HybridStep vs torch HybridStep: {st['episodes']} episodes, {st['batches']} steps (select, "
              f"verify input, after_verify), {st['failed']} episodes differ; {time.time() - t0:.0f} s")
        _details(st)
        total, failed = total + st["batches"], failed + st["failed"]
    if args.recorded:
        t0 = time.time()
        rec = run_recorded(seed=args.seed)
        print(f"fused decision vs torch on reference-loop steps (SmolLM2, real text): {rec['steps']} steps recorded, "
              f"{rec['batches']} decisions, {rec['failed']} differ; {time.time() - t0:.0f} s")
        _details(rec)
        total, failed = total + rec["batches"], failed + rec["failed"]
    if args.ragged and not args.control:
        t0 = time.time()
        rg = run_ragged(args.ragged, seed=args.seed)
        print(f"ragged verify's layout kernels vs the torch builder: {rg['batches']} random trees, {rg['failed']} "
              f"differ; {time.time() - t0:.0f} s")
        _details(rg)
        failed += rg["failed"]
    if args.control:
        ok = res["failed"] > 0 and (not args.episodes or st["failed"] > 0)
        print(f"{'MET' if ok else 'MISSED'}: the positive control (reference in the other mode) is detected")
        return 0 if ok else 1
    ok = failed == 0
    print(f"{'MET' if ok and total >= TARGET_BATCHES else 'MISSED'}: fused == torch on >= {TARGET_BATCHES} batches "
          f"({total} compared, {failed} differ)")
    return 0 if ok else 1


def _details(res: dict) -> None:
    if res["fields"]:
        print("  differing fields:", ", ".join(f"{f} {n}" for f, n in sorted(res["fields"].items())))
        print("  first:", res["first"])


if __name__ == "__main__":
    sys.exit(main())
