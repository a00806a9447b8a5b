"""Compact batched speculative-decoding loop over a Hugging Face causal LM on CPU.

It is the test oracle (greedy outputs must equal plain decoding), the trace source for the replay benchmark and the
engine behind the demo — not a serving engine. Every *decision* runs through the same core the SGLang worker uses:
`NgramDrafter` (Rust), `step.DecisionStep` (calibration, survival, price, selector), `verify`. Only tensor plumbing
lives here.

One decode step for the active requests `R`:
1. drafts: EAGLE chain (head over the target's features) and/or n-gram chain/tree, per request;
2-3. `step.DecisionStep`: acceptance estimates -> survivals, price `lambda` from the profiled cost model, and the
   selector's fixed-width VerifyTree (node 0 = root = last committed token, whose KV is not yet
   in the target cache);
4. the target runs each request's valid nodes in one forward over its KV cache with a 4-D additive mask (cache
   prefix visible, then the tree's ancestor matrix) at positions `cache_len + depth`;
5. `verify.greedy_accept` / `verify.sample_accept` picks the accepted path and bonus token;
6. the target cache is compacted to `prefix + accepted path` (root first, in path order, which is increasing node
   index), the EAGLE head is extended with the features of the accepted nodes, the n-gram drafter with the tokens.

Target forwards run one request at a time (requests have different cache lengths); the core calls are batched.
Modes: `none` (root only: plain decoding through the same machinery), `ngram`, `eagle` (each verifies everything
its drafter proposes, as the standard single-drafter systems do), `choose` and `merge` (HYBRID: priced).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from sglang_hybrid.reference.drafters import EagleDrafter, NgramSource
from sglang_hybrid.request_bias import chain_outcome, tree_outcome, update_bias
from sglang_hybrid.selector import Source
from sglang_hybrid.step import DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.widths import default_depths

MODES = ("none", "ngram", "eagle", "choose", "merge")
#: the labels this loop's reports and traces use for each ``Source`` (the demo tables print them)
SOURCE_LABELS = {Source.NONE: "none", Source.MODEL: "eagle", Source.NGRAM: "ngram", Source.SHARED: "both"}


@dataclass
class StepRecord:
    """What happened to one request in one step (for stats and traces)."""

    source: str            # none / eagle / ngram / both (merge: nodes from both sources)
    n_nodes: int           # draft nodes verified
    accepted: int          # accepted draft tokens (bonus excluded)
    expected: float        # selector's expected accepted tokens
    lam: float
    eagle_len: int
    ngram_len: int
    eagle_draft: list[int] = field(default_factory=list)  # the EAGLE chain proposed this step (before selection)


@dataclass
class Result:
    id: str
    workload: str
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finished_by: str = ""


def compact_cache(cache, keep: torch.Tensor) -> None:
    """Keep only cache positions `keep` (1-D, in the order given) in every layer."""
    if hasattr(cache, "layers"):
        for lay in cache.layers:
            lay.keys = lay.keys.index_select(-2, keep)
            lay.values = lay.values.index_select(-2, keep)
    else:
        for i in range(len(cache.key_cache)):
            cache.key_cache[i] = cache.key_cache[i].index_select(-2, keep)
            cache.value_cache[i] = cache.value_cache[i].index_select(-2, keep)


def cache_kw(model) -> str:
    """Name of the KV-cache argument: transformers >= 5.2x calls it `cache`, older releases `past_key_values`."""
    import inspect

    fwd = model.model.forward if hasattr(model, "model") else model.forward
    return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"


def cache_len(cache) -> int:
    return cache.get_seq_length() if cache is not None else 0


@dataclass
class _Req:
    rid: int
    res: Result
    max_new: int
    cache: object
    root: int
    done: bool = False


class ReferenceLoop:
    """Speculative decoding over `target` (a transformers Llama-style model) on CPU.

    Parameters: `mode` in MODES; `head` (EagleHead) needed for eagle/choose/merge; `eagle_k` chain length;
    `ngram_k` n-gram chain length (`ngram_tree=True` drafts an `n_nodes` tree instead, default in merge mode);
    `n_nodes` verify-tree budget (W = n_nodes + 1); `temperature` 0 = greedy; `cost` a `CostModel` for the per-
    request forward (`profile_cost` makes one; None = profile on first use); calibrations default to the shipped
    n-gram file and identity model scaling; `seed` drives the sampling uniforms; `draft_dtype` (e.g. bf16) and
    `eagle_min_survival` (stop a chain once its cumulative draft probability is below it) only change drafting
    cost and which drafts are proposed, never the output distribution. `draft_cost` (a `CostModel`: seconds of one
    EAGLE chain position for `R` requests) turns on adaptive drafting in the HYBRID modes: each step the core decides
    how deep the next step's EAGLE chain is (`draft_depths`, default `(0,) + widths.default_depths(eagle_k)`; see
    docs/core.md, "Draft depth"). Depth 0 skips the EAGLE draft on a step: this loop commits accepted tokens to the
    head (`EagleDrafter.extend`) apart from drafting, so a skipped step saves the chain's lm_head reads (SGLang's
    draft extend drafts the first token anyway: its floor is depth 1, and `draft_depths` without 0 reproduces it).
    `probe_half_life`: skipped steps after which a skipped model's unobserved rate has moved half way to 1, so that
    it is drafted, and measured, again (docs/core.md, "Depth 0"; None: never re-drafted unless the price changes).
    `model_bias_eta` (HYBRID modes): learning rate of each request's online offset on the EAGLE side's calibrated
    logit, learned from the request's own verify outcomes (`sglang_hybrid.request_bias`; None: the calibration alone).
    `ngram_bias_eta` (HYBRID modes): the same on the n-gram side's calibrated acceptance, learned from how the
    request's own n-gram draft (chain or tree: `request_bias.tree_outcome`) fared; None (the default, as the worker's
    `ngram_bias_eta`): the table alone.
    """

    def __init__(self, target, mode: str = "merge", head=None, eagle_k: int = 8, ngram_k: int = 8,
                 n_nodes: int = 12, temperature: float = 0.0, cost=None, ngram_cal=None, model_cal=None,
                 ngram_tree: bool | None = None, seed: int = 0, eos_token_id: int | None = None,
                 ngram_kwargs: dict | None = None, price_single: bool = False, draft_dtype=None,
                 eagle_min_survival: float = 0.0, draft_cost=None, draft_depths=None,
                 probe_half_life: float | None = 8.0, model_bias_eta: float | None = 0.1,
                 ngram_bias_eta: float | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode in ("eagle", "choose", "merge") and head is None:
            raise ValueError(f"mode {mode!r} needs an EAGLE head (head=None)")
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        self.target = target.eval()
        self.mode = mode
        self.head = head
        self.eagle_k = eagle_k if mode in ("eagle", "choose", "merge") else 0
        self.ngram_k = ngram_k if mode in ("ngram", "choose", "merge") else 0
        self.ngram_tree = (mode == "merge") if ngram_tree is None else ngram_tree
        self.n_nodes = n_nodes
        self.temperature = float(temperature)
        self.cost = cost
        self.price_single = price_single
        self.seed = seed
        self.eos = eos_token_id if eos_token_id is not None else getattr(target.config, "eos_token_id", None)
        self.ngram_kwargs = ngram_kwargs or {}
        self.draft_dtype = draft_dtype
        self.eagle_min_survival = eagle_min_survival
        for name, eta in (("model_bias_eta", model_bias_eta), ("ngram_bias_eta", ngram_bias_eta)):
            if eta is not None and not (isinstance(eta, (int, float)) and not isinstance(eta, bool) and eta > 0):
                raise ValueError(f"{name} must be a learning rate > 0 or None, got {eta!r}")
        #: online per-request offsets on each side's calibrated logit (HYBRID modes, which price the drafts)
        self.model_bias_eta = model_bias_eta if mode in ("choose", "merge") and eagle_k else None
        self.ngram_bias_eta = ngram_bias_eta if mode in ("choose", "merge") and ngram_k else None
        from sglang_hybrid.calibration import ModelCalibration, NgramCalibration

        self.ngram_cal = (ngram_cal or NgramCalibration.load()).to("cpu") if self.ngram_k else None
        self.model_cal = (model_cal or ModelCalibration.identity()).to("cpu") if self.eagle_k else None
        #: adaptive drafting: HYBRID modes with a draft cost (the core prices each depth's forwards)
        self.depths = None
        if draft_cost is not None and mode in ("choose", "merge"):
            depths = draft_depths if draft_depths is not None else (0, *default_depths(eagle_k))
            self.depths = tuple(sorted(set(depths) | {eagle_k}))
            if self.depths[0] < 0 or self.depths[-1] > eagle_k:
                raise ValueError(f"draft_depths must be in [0, eagle_k={eagle_k}] (0 = skip), got {draft_depths!r}")
        elif draft_depths is not None:
            raise ValueError("draft_depths needs draft_cost and a HYBRID mode (choose or merge)")
        self.draft_cost = draft_cost.to("cpu") if self.depths is not None else None
        self.decide = DecisionStep(mode="merge" if mode == "merge" else "choose", n_nodes=n_nodes,
                                   model_calibration=self.model_cal, ngram_calibration=self.ngram_cal,
                                   depths=self.depths, probe_half_life=probe_half_life)
        self._cost_cache: dict[int, object] = {}
        self._ckw = cache_kw(self.target)

    # ------------------------------------------------------------------ target forwards

    @torch.no_grad()
    def _prefill(self, tokens: list[int]):
        from transformers import DynamicCache

        cache = DynamicCache()
        if len(tokens) == 0:
            return cache, torch.zeros(0, self.target.config.hidden_size)
        out = self.target.model(input_ids=torch.tensor([tokens]), use_cache=True, **{self._ckw: cache})
        return cache, out.last_hidden_state[0]

    @torch.no_grad()
    def _forward_tree(self, req: _Req, tokens, depth, ancestors):
        """Run the valid tree nodes of one request; returns (features [n, h], logits [n, V])."""
        S = cache_len(req.cache)
        n = tokens.shape[0]
        dt = self.target.dtype
        mask = torch.zeros(1, 1, n, S + n, dtype=dt)
        mask[0, 0, :, S:] = torch.where(ancestors, 0.0, torch.finfo(dt).min).to(dt)
        out = self.target.model(input_ids=tokens[None], position_ids=(S + depth)[None], attention_mask=mask,
                                use_cache=True, **{self._ckw: req.cache})
        h = out.last_hidden_state[0]
        return h, self.target.lm_head(h).float()

    # ------------------------------------------------------------------ cost model

    def _batch_cost(self, R: int):
        """CostModel for R requests verified one forward each: T(n) = R * t(n / R) (tokens spread evenly)."""
        from sglang_hybrid.cost import CostModel

        if self.cost is None:
            self.cost = profile_cost(self.target)
        if R not in self._cost_cache:
            sizes = [int(s) for s in self.cost.sizes]
            secs = [float(t) for t in self.cost.seconds]
            self._cost_cache[R] = CostModel([R * s for s in sizes], [R * t for t in secs]).to("cpu")
        return self._cost_cache[R]

    # ------------------------------------------------------------------ main loop

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int = 64, ids=None, workloads=None,
                 progress: bool = False, desc: str | None = None) -> list[Result]:
        from sglang_hybrid.verify import greedy_accept, sample_accept, sample_uniforms

        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        V = self.target.config.vocab_size
        for p in prompts:
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompt token ids must be in [0, {V})")
        gen = torch.Generator().manual_seed(self.seed)
        eagle = (EagleDrafter(self.head, self.target, dtype=self.draft_dtype, min_survival=self.eagle_min_survival)
                 if self.eagle_k else None)
        ngram = NgramSource(max_draft=max(self.ngram_k, self.n_nodes), **self.ngram_kwargs) if self.ngram_k else None
        reqs = []
        for i, p in enumerate(prompts):
            res = Result(id=str(ids[i]) if ids else str(i), workload=workloads[i] if workloads else "", prompt=list(p))
            cache, feats = self._prefill(p[:-1])
            r = _Req(rid=i, res=res, max_new=max_new_tokens, cache=cache, root=p[-1])
            if eagle:
                eagle.start(i)
                eagle.extend(i, feats, torch.tensor(p[1:]))
            if ngram:
                ngram.start(i, p)
            reqs.append(r)
        depth = self.eagle_k                  # the EAGLE chain length this step drafts (adaptive drafting changes it)
        # per request: the model's per-position acceptance at its last drafted step (scores depths on skipped steps)
        model_rate = torch.zeros(len(prompts), dtype=torch.float32)
        # per request: the online offset on the EAGLE side's calibrated logit (request_bias), 0 at admission
        model_bias = torch.zeros(len(prompts), dtype=torch.float32) if self.model_bias_eta else None
        ngram_bias = torch.zeros(len(prompts), dtype=torch.float32) if self.ngram_bias_eta else None
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=max_new_tokens * len(prompts), desc=desc or self.mode, leave=False, dynamic_ncols=True)
        while True:
            active = [r for r in reqs if not r.done]
            if not active:
                break
            R = len(active)
            rids = [r.rid for r in active]
            root = torch.tensor([r.root for r in active], dtype=torch.int64)
            # 1. drafts
            model = ngram_draft = None
            m_tok = torch.zeros(R, 0, dtype=torch.int64)
            m_len = n_len = torch.zeros(R, dtype=torch.int64)
            if eagle and depth > 0:
                m_tok, m_prob, m_len = eagle.propose(rids, depth)
                model = ModelDraft(m_tok, m_prob, m_len)
            elif eagle:                                   # depth 0: the model draft is skipped this step
                model = ModelDraft(m_tok, torch.zeros(R, 0), m_len)
            if ngram:
                kn = self.n_nodes if self.ngram_tree else self.ngram_k
                nd = ngram.propose(rids, kn, tree=self.ngram_tree)
                n_len = nd["lengths"]
                ngram_draft = NgramDraft(nd["tokens"], nd["parents"], nd["lengths"], nd["match_len"], nd["count"],
                                         nd["total"], nd["depth"], nd["source"], tree=self.ngram_tree)
            # 2. the core's decision step: survivals, price (HYBRID modes; single-drafter baselines verify all they
            # draft unless price_single), selection
            priced = self.mode in ("choose", "merge") or (self.price_single and self.mode != "none")
            rid_index = torch.tensor(rids, dtype=torch.int64)
            decision = self.decide(root, model, ngram_draft, cost=self._batch_cost(R) if priced else None,
                                   draft_cost=self.draft_cost, model_rate=model_rate[rid_index],
                                   model_bias=None if model_bias is None else model_bias[rid_index],
                                   ngram_bias=None if ngram_bias is None else ngram_bias[rid_index])
            tree, lam = decision.tree, decision.lam
            if self.depths is not None:
                depth = int(decision.next_depth)          # the host reads it: the loop drafts the next step itself
                model_rate[rid_index] = decision.model_rate
            # 3. target verify forward per request
            W = tree.tokens.shape[1]
            logits = torch.zeros(R, W, V)
            feats = [None] * R
            nvalid = tree.valid.sum(1).tolist()
            for b, r in enumerate(active):
                n = nvalid[b]
                h, lg = self._forward_tree(r, tree.tokens[b, :n], tree.depth[b, :n], tree.ancestors[b, :n, :n])
                feats[b] = h
                logits[b, :n] = lg
            # 4. acceptance
            if self.temperature == 0.0:
                acc = greedy_accept(tree, logits)
            else:
                acc = sample_accept(tree, logits, self.temperature, sample_uniforms(R, W, generator=gen))
            # 5. commit
            acc_nodes, acc_len, bonus = acc.accepted_nodes.tolist(), acc.accept_len.tolist(), acc.bonus.tolist()
            lam_f = float(lam)
            # per request, the tokens this step commits after the root: the accepted drafts, then the bonus token
            emitted_all = [tree.tokens[b, acc_nodes[b][1:1 + acc_len[b]]].tolist() + [bonus[b]] for b in range(R)]
            # the request's own outcomes: each side's draft against the tokens this step commits
            committed = torch.full((R, max(acc_len) + 1), -1, dtype=torch.int64)
            for b, e in enumerate(emitted_all):
                committed[b, :len(e)] = torch.tensor(e, dtype=torch.int64)
            n_committed = torch.tensor(acc_len) + 1
            if model_bias is not None and m_tok.shape[1] > 0:
                tested, hit = chain_outcome(m_tok, m_len, committed, n_committed)
                model_bias[rid_index] = update_bias(model_bias[rid_index], decision.model_acceptance, tested, hit,
                                                    self.model_bias_eta)
            if ngram_bias is not None:
                tested, hit = tree_outcome(ngram_draft.tokens, ngram_draft.parents, ngram_draft.length, committed,
                                           n_committed)
                ngram_bias[rid_index] = update_bias(ngram_bias[rid_index], decision.ngram_acceptance, tested, hit,
                                                    self.ngram_bias_eta)
            for b, r in enumerate(active):
                m = acc_len[b]
                path = acc_nodes[b][:1 + m]
                emitted = emitted_all[b]
                src = tree.source[b, 1:nvalid[b]].tolist()
                srcs = set(src)
                source = "none" if not srcs else (SOURCE_LABELS[Source(src[0])] if len(srcs) == 1 else "both")
                r.res.steps.append(StepRecord(source=source, n_nodes=nvalid[b] - 1, accepted=m,
                                              expected=float(tree.expected_accepted[b]), lam=lam_f,
                                              eagle_len=int(m_len[b]), ngram_len=int(n_len[b]),
                                              eagle_draft=m_tok[b, :int(m_len[b])].tolist()))
                room = r.max_new - len(r.res.output)
                cut = emitted[:room]
                if self.eos is not None and self.eos in cut:
                    cut = cut[:cut.index(self.eos) + 1]
                    r.res.finished_by = "eos"
                r.res.output.extend(cut)
                if bar:
                    bar.update(len(cut))
                if r.res.finished_by or len(r.res.output) >= r.max_new:
                    r.res.finished_by = r.res.finished_by or "length"
                    r.done = True
                    if bar:
                        bar.update(r.max_new - len(r.res.output))
                    if eagle:
                        eagle.remove(r.rid)
                    if ngram:
                        ngram.finish(r.rid)
                    r.cache = None
                    continue
                S = cache_len(r.cache) - nvalid[b]
                keep = torch.cat([torch.arange(S), S + torch.tensor(path, dtype=torch.int64)])
                compact_cache(r.cache, keep)
                r.root = emitted[-1]
                if eagle:
                    eagle.extend(r.rid, feats[b][path], torch.tensor(emitted))
                if ngram:
                    ngram.extend(r.rid, emitted)
        if bar:
            bar.close()
        return [r.res for r in reqs]


@torch.no_grad()
def profile_cost(target, context: int = 256, sizes=(1, 2, 4, 8, 16, 32), repeats: int = 4):
    """CostModel of one request's verify forward: `n` new tokens over a `context`-token KV cache.

    Minimum of `repeats` interleaved timings per size after a warm-up; a running maximum then removes the
    non-monotone blips a shared CPU produces (more tokens never really cost less), which `CostModel` rejects.
    """
    from transformers import DynamicCache

    from sglang_hybrid.cost import CostModel

    V = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, V, (1, context), generator=g)
    base = DynamicCache()
    kw = cache_kw(target)
    target.model(input_ids=ctx, use_cache=True, **{kw: base})

    def run(n):
        out = target.model(input_ids=torch.randint(0, V, (1, n), generator=g), use_cache=True,
                           position_ids=torch.arange(context, context + n)[None], **{kw: _clone(base)})
        target.lm_head(out.last_hidden_state)

    for n in sizes:  # warm-up
        run(n)
    times = {n: [] for n in sizes}
    for _ in range(repeats):  # interleaved, so a burst of load from other processes hits every size alike
        for n in sizes:
            t0 = time.perf_counter()
            run(n)
            times[n].append(time.perf_counter() - t0)
    secs = [min(times[n]) for n in sizes]  # the minimum is the least disturbed estimate on a shared machine
    mono = [max(secs[:i + 1]) for i in range(len(secs))]
    return CostModel(list(sizes), mono, meta={"what": "one request, per-request forward", "context": context,
                                              "raw_seconds": secs})


def _clone(cache):
    from transformers import DynamicCache

    c = DynamicCache()
    for i, (k, v) in enumerate(_kv_pairs(cache)):
        c.update(k.clone(), v.clone(), i)
    return c


def _kv_pairs(cache):
    if hasattr(cache, "layers"):
        return [(lay.keys, lay.values) for lay in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def plain_greedy(target, prompt: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Independent oracle: token-by-token greedy decoding with a plain KV cache (no trees, no masks)."""
    from transformers import DynamicCache

    eos = eos_token_id if eos_token_id is not None else getattr(target.config, "eos_token_id", None)
    cache = DynamicCache()
    kw = {cache_kw(target): cache}
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt]), use_cache=True, **kw).logits
        out = []
        while len(out) < max_new_tokens:
            t = int(logits[0, -1].argmax())
            out.append(t)
            if t == eos:
                break
            logits = target(input_ids=torch.tensor([[t]]), use_cache=True, **kw).logits
    return out


def timed_generate(loop: ReferenceLoop, prompts, max_new_tokens, **kw):
    t0 = time.perf_counter()
    res = loop.generate(prompts, max_new_tokens, **kw)
    return res, time.perf_counter() - t0
