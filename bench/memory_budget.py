"""Which HYBRID configurations start: the start-up memory budget for the realistic replay's deployment.

    python -m bench.memory_budget [--batches 4,32,128] [--contexts 8192,32768,131072]

Arithmetic only (seconds; no GPU, no SGLang import): ``sglang_hybrid.sglang_plugin.memory_budget``, the worker's own
start-up check, applied to the deployment the realistic replay models (``python -m bench.replay --realistic``,
docs/benchmarks.md): Llama-3.1-8B in bf16 with an EAGLE-3 head on one H200, FlashInfer, SGLang's default
``--mem-fraction-static`` and ``--cuda-graph-max-bs`` (= ``--max-running-requests``, the batch), 4 EAGLE steps, merge
with an n-gram chain of 8 (12 nodes, full width 13; ``bench.replay.engine.EngineConfig()``). At each batch and
``--context-length`` it prints the free memory SGLang leaves after sizing its KV pool, plain EAGLE's speculative memory,
and HYBRID's with both cost tables (as built: one runtime state per (EAGLE depth, verify width) pair, the replay's
``default_depths(4)`` x ``default_buckets(13)`` = 24 states, assembled from 4 draft and 6 verify parts), with one table
(widths only: ``cost_table``, 6 states; depths only: ``draft_cost_table``, 4 states), the default launch (no table
given: the verify table measured at start, widths 5 and 13 and the extras 8 and 4 while they fit,
``default_launch_widths``) and with no price (one state, width 13): GiB, ratio to EAGLE, graph sets, and whether it fits
(the machinery allocated after the KV pool plus SGLang's post-capture runtime reserve against the free memory: the
test's criterion; the worker refuses at start where the states it still has to build do not fit). Then, per (batch,
context), the most runtime states a settable grid (``draft_depths`` x ``verify_widths``, which always keep 4 and 13)
fits, and which of the replay's tuned HYBRID configurations (S<steps>/K<ngram_k>, printed in its tables) fit. Last,
per batch, the runtime activation reserve the worker keeps free before it fits widths at start
(``memory_budget.runtime_activation_reserve``: a sampled verify at the full width 13 and the batch, plus an 8,192-token
chunked prefill), with its breakdown, and the default launch's widths at each (batch, context) without and with it.

Computed from SGLang 0.5.23's (and FlashInfer 0.7.2's) sizing formulas, cited in the memory_budget module (the
sampled verify's top-p workspace from FlashInfer's newest stored source, 0.6.18); not measured on a GPU. The free
memory is an upper bound (the card's whole memory taken as free before the weights load).
The shared Llama-3.1-8B / H200 construction lives here; tests/plugin/test_memory_budget.py imports it and checks the
SGLang lists reproduced here (captured batch sizes, prefill graph sizes) against SGLang's own functions.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

from sglang_hybrid.sglang_plugin import memory_budget as mb
from sglang_hybrid.sglang_plugin.config import HybridSettings, resolved_ngram_bias_eta

ROOT = Path(__file__).resolve().parent.parent
GiB, MiB = mb.GiB, mb.MiB

#: Llama-3.1-8B (config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, vocab 128,256, bf16, context 131,072,
#: intermediate 14,336)
LLAMA8B = mb.ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256, intermediate=14336)
LLAMA8B_PARAMS = 8_030_261_248
LLAMA8B_CONTEXT = 131072
#: an EAGLE-3 head for it (jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B, the README's): one Llama layer, 14,336
#: intermediate, a 32,000-token draft vocabulary, the target's embedding
EAGLE3_INTERMEDIATE, EAGLE3_VOCAB = 14336, 32000
EAGLE3 = mb.ModelShape(hidden=4096, layers=1, heads=32, kv_heads=8, head_dim=128, vocab=128256,
                       intermediate=EAGLE3_INTERMEDIATE)
#: nvidia-smi's memory.total of an H200 (/work/.library/device/KINDS.md), what SGLang's get_nvgpu_memory_capacity reads
H200_MIB = 143771
#: SGLang's default chunked prefill size on an H200 (``srt/arg_groups/memory_hook.py`` ~147-155)
H200_CHUNKED_PREFILL = 8192
#: the replay's deployed configuration (``bench.replay.engine.EngineConfig()``): EAGLE steps, n-gram chain, mode
STEPS, NGRAM_K, MODE = 4, 8, "merge"
#: the HYBRID launch settings the replay also tunes per cell (``bench.replay.realistic.Config``: hybrid_steps (2, 6),
#: hybrid_ngram_ks (24,)), with the deployed one first
REPLAY_TUNED = ((4, 8), (4, 24), (2, 8), (2, 24), (6, 8), (6, 24))
COST_TABLE = ROOT / "bench" / "cost_tables" / "h200_llama8b.json"
BATCHES = (4, 32, 128)
CONTEXTS = (8192, 32768, 131072)


def eagle3_weight_bytes(h: int, inter: int, heads: int, kv_heads: int, head_dim: int, draft_vocab: int,
                        dtype_bytes: int = 2) -> int:
    """``LlamaForCausalLMEagle3`` (sglang ``srt/models/llama_eagle3.py`` ~46-210, 272-320): one decoder layer whose
    qkv projection reads 2h, o_proj, the gated MLP and three norms; ``fc`` from the three concatenated aux layers;
    the final norm; the draft-vocab ``lm_head``. The embedding is the target's (``set_embed``)."""
    qkv = 2 * h * (heads + 2 * kv_heads) * head_dim
    layer = qkv + heads * head_dim * h + 3 * h * inter + 3 * h
    return dtype_bytes * (layer + 3 * h * h + h + draft_vocab * h)


def sglang_mem_fraction_static(gpu_mib: float, decode_max_bs: int, prefill_graph_sizes: int,
                               chunked_prefill: int = H200_CHUNKED_PREFILL, tp: int = 1) -> float:
    """SGLang's default ``--mem-fraction-static`` (``srt/arg_groups/memory_hook.py`` ~291-325 with
    ``reserve_for_graph_mb`` ~360-392; post-capture KV sizing off, its default): reserve 512 MiB + 1.5 MiB per
    activation token (the chunked prefill size, 8,192 on an H200, ~149-160) + tp/8 GiB + 2 MiB per decode graph batch
    size up to ``--cuda-graph-max-bs`` + 8 MiB per prefill graph size (breakable prefill graphs are on by default on
    CUDA), at least 10 GiB above 60 GiB."""
    reserved = 512 + max(chunked_prefill, 2048) * 1.5 + tp / 8 * 1024 + decode_max_bs * 2 + prefill_graph_sizes * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def sglang_decode_capture_bs(max_bs: int) -> tuple:
    """SGLang's captured decode batch sizes under speculative decoding up to ``--cuda-graph-max-bs``
    (``generate_decode_cuda_graph_batch_sizes``, ``srt/arg_groups/cuda_graph_hook.py`` ~500-532): 35 at 128."""
    bs = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    bs = [b for b in bs if b <= max_bs]
    return tuple(bs if max_bs in bs else [*bs, max_bs])


def sglang_prefill_capture_sizes(max_tokens: int) -> tuple:
    """SGLang's captured prefill token counts up to ``max_tokens`` (``generate_prefill_cuda_graph_batch_sizes``,
    ``cuda_graph_hook.py`` ~480-497): 58 at the H200's 8,192."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return tuple(s for s in sizes if s <= max_tokens)


@dataclass(frozen=True)
class H200Case:
    """One deployment of Llama-3.1-8B + the EAGLE-3 head on an H200: the budget's ``Deployment``, SGLang's default
    ``--mem-fraction-static`` for it, the free memory it leaves after the KV pool (an upper bound: SGLang leaves the
    memory free before the weights load x (1 - fraction), at most the card's), SGLang's post-capture runtime reserve
    and the KV pool's tokens."""

    dep: mb.Deployment
    mfs: float
    free: int
    reserve: int
    pool_tokens: int

    @property
    def running(self) -> int:
        return self.dep.max_running_requests

    @property
    def context(self) -> int:
        return self.dep.context_len

    def fits(self, b: mb.Budget) -> bool:
        """Whether ``b``'s machinery allocated after the KV pool and the runtime reserve fit the free memory."""
        return self.needs(b) <= self.free

    def needs(self, b: mb.Budget) -> int:
        return b.from_free + self.reserve

    def activation_reserve(self, settings: HybridSettings, steps: int = STEPS) -> tuple:
        """The runtime activation reserve the worker keeps free before it fits widths at start
        (``memory_budget.runtime_activation_reserve``, as ``fit_widths_at_start`` computes it): a sampled verify at
        ``settings``' full width and the running limit (logits in SGLang's shared graph buffer; logprob copies at the
        deepest path, ``HybridStep.max_depth``) plus a chunked prefill of ``H200_CHUNKED_PREFILL`` tokens. Returns
        ``(bytes, breakdown)``."""
        n_nodes = settings.resolved_n_nodes(steps)
        full = n_nodes + 1
        accept = min(n_nodes, max(steps, settings.ngram_k), full - 1) + 1
        return mb.runtime_activation_reserve(self.dep, full, self.running, accept_width=accept)


def llama8b_h200(running: int = 128, context: int = LLAMA8B_CONTEXT, *,
                 capture_bs: Optional[Sequence[int]] = None) -> H200Case:
    """Llama-3.1-8B (bf16) + the EAGLE-3 head on one H200 at ``--max-running-requests running`` (the default
    ``--cuda-graph-max-bs`` is then ``min(256, running)``, ``memory_hook.py`` ~180-188) and ``--context-length
    context``, FlashInfer, topk 1. ``capture_bs``: SGLang's captured sizes (default: ``sglang_decode_capture_bs``)."""
    capture_bs = tuple(capture_bs) if capture_bs is not None else sglang_decode_capture_bs(min(256, running))
    draft_weights = eagle3_weight_bytes(4096, EAGLE3_INTERMEDIATE, 32, 8, 128, EAGLE3_VOCAB)
    mfs = sglang_mem_fraction_static(H200_MIB, decode_max_bs=max(capture_bs),
                                     prefill_graph_sizes=len(sglang_prefill_capture_sizes(H200_CHUNKED_PREFILL)))
    # SGLang leaves pre_model_load_memory x (1 - fraction) free (kv_cache_configurator.py ~2990-3050); the memory
    # free before the weights load is at most the card's, so this bounds it from above
    free = int(H200_MIB * MiB * (1 - mfs))
    t, d = LLAMA8B, EAGLE3
    cell = sum(2 * m.layers * m.kv_heads * m.head_dim * m.dtype_bytes for m in (t, d))      # K and V per token
    pool_tokens = int((H200_MIB * MiB * mfs - t.dtype_bytes * LLAMA8B_PARAMS - draft_weights) // cell)
    dep = mb.Deployment(target=t, draft=d, draft_logits_vocab=EAGLE3_VOCAB, draft_input_hidden=3 * t.hidden,
                        draft_weight_bytes=draft_weights, max_running_requests=running, context_len=context,
                        cuda_graph_bs=capture_bs, kv_pool_tokens=pool_tokens,
                        chunked_prefill_tokens=H200_CHUNKED_PREFILL)
    return H200Case(dep=dep, mfs=mfs, free=free, reserve=mb.post_capture_reserve_bytes(), pool_tokens=pool_tokens)


def hybrid_settings(cost_table: bool = True, draft_cost_table: bool = True, ngram_k: int = NGRAM_K,
                    measure: str = "off", mode: str = MODE, **kw) -> HybridSettings:
    """The worker's settings with the shipped H200 table as ``cost_table`` and / or ``draft_cost_table``;
    ``measure``: the setting ``measure_cost_table`` (without a ``cost_table``, "auto" measures one at start on a GPU:
    the default launch)."""
    table = str(COST_TABLE)
    return HybridSettings(mode=mode, ngram_k=ngram_k, cost_table=table if cost_table else None,
                          draft_cost_table=table if draft_cost_table else None, measure_cost_table=measure,
                          log_interval=0, **kw)


def proposal_width(settings: HybridSettings, steps: int) -> int:
    """n-gram tokens proposed per request (``HybridStep.proposal_width``: ``ngram_k + max_depth + 1``, the deepest
    path ``min(n_nodes, max(steps, ngram_k))``): 17 as deployed."""
    k = settings.ngram_k
    return k + min(settings.resolved_n_nodes(steps), max(steps, k)) + 1


def hybrid_budget(case: H200Case, settings: HybridSettings, *, steps: int = STEPS, layout: str = "HYBRID",
                  depths: Optional[Sequence[int]] = None, widths: Optional[Sequence[int]] = None,
                  ragged: bool = False, tier_graphs: bool = False) -> mb.Budget:
    """HYBRID's budget at ``case`` as the worker computes it at start (``check_start``), padded verify (a GPU with
    graphs): the start-up state (``steps``, full width) first, then one state per (depth, width) pair, assembled from a
    draft part per depth and a verify part per width (``ragged``: one state per depth, all at the full width's one
    verify part). ``depths`` / ``widths``: the states' shapes (default: ``settings``' resolved ones;
    ``depths`` are also the fused step's candidate depths). HYBRID's own buffers: online offsets off, fused step,
    prompt lookup on (the defaults). Under ``ragged`` SGLang's target verify graphs are not captured
    (``HybridWorkerV2._skip_target_verify_capture``). ``tier_graphs`` (ragged): the verify runs in HYBRID's token-tier
    CUDA graphs, as the worker runs it at TP 1 on Triton and FlashInfer (the plan's buffers and the graphs' own
    counted as ``_start_budget`` counts them)."""
    rd, rw = settings.resolved_shapes(steps)
    depths = tuple(depths) if depths is not None else rd
    widths = tuple(widths) if widths is not None else rw
    full = settings.resolved_n_nodes(steps) + 1
    dep, running = case.dep, case.running
    own = mb.hybrid_buffer_bytes(
        pool_size=running, num_steps=steps, ngram_k=settings.ngram_k, proposal_width=proposal_width(settings, steps),
        context_cols=case.context + 4 + full,                # SGLang's req_to_token row (allocation_sizing.py ~96)
        model_bias=False, fused=True, max_bs=dep.max_bs or running, width=full, depths=len(depths),
        mask_entries=mb.workspace_mask_entries(dep, full),
        # the n-gram offset's buffers where the worker learns it (ngram_bias_eta: "auto" = under ragged verify)
        ngram_bias=resolved_ngram_bias_eta(settings.ngram_bias_eta, ragged) is not None,
        alternatives=settings.eagle_alternatives, model_calibration=settings.model_calibration_eta is not None)
    if tier_graphs:
        if not ragged:
            raise ValueError("token-tier graphs run ragged verify (ragged=True)")
        extra = mb.ragged_triton_bytes if dep.attention_backend == "triton" else mb.ragged_flashinfer_bytes
        own = replace(own, fixed=own.fixed + extra(dep, running, full, tier_graphs=True))
    pairs = [(d, full) for d in depths] if ragged else [(d, w) for d in depths for w in widths]
    return mb.budget(dep, [(steps, full), *pairs], layout=layout, max_draft_tokens=full, own=own,
                     target_verify_graphs=not ragged)


@functools.lru_cache(maxsize=None)
def default_launch_widths(running: int, steps: int, ngram_k: int, n_nodes: Optional[int] = None, mode: str = MODE,
                          context: int = LLAMA8B_CONTEXT, extras: Optional[tuple] = None,
                          activations: bool = False) -> tuple:
    """The verify widths the default launch (a table measured at start, no ``verify_widths``) builds at
    ``running`` requests and ``context``: the worker's own fit (``memory_budget.fit_widths``: ``extras`` in order
    while their states fit; default every extra of ``widths.measured_table_buckets``, the caller passing those that
    pay by its step-time table, ``widths.paying_extras``), with this module's deployment and the criterion of
    ``H200Case.fits`` (the free memory after the KV pool, an upper bound). The realistic replay's as-built HYBRID
    verifies at these widths. ``activations``: also keep the runtime activation reserve free
    (``H200Case.activation_reserve``), as the worker's fit does since the reserve was added; False (the default):
    the fit without it, which the replay and the pinned tables still use."""
    from sglang_hybrid.widths import measured_table_buckets

    case = llama8b_h200(running, context)
    settings = hybrid_settings(False, False, ngram_k=ngram_k, measure="auto", mode=mode, n_nodes=n_nodes)
    required, every = measured_table_buckets(steps, settings.resolved_n_nodes(steps) + 1)
    extras = every if extras is None else tuple(extras)
    kept = case.activation_reserve(settings, steps)[0] if activations else 0
    return mb.fit_widths(lambda ws: case.needs(hybrid_budget(case, settings, steps=steps, widths=ws)) + kept
                         <= case.free, required, extras)


#: the HYBRID layouts the table prints: (label, cost_table, draft_cost_table, measure_cost_table, ragged,
#: eagle_alternatives); the ragged ones in their token-tier graphs, as ``ragged_verify=on`` runs at TP 1
LAYOUTS = (("HYBRID as built, both cost tables", True, True, "off", False, 0),
           ("HYBRID ragged, both cost tables", True, True, "off", True, 0),
           ("HYBRID, cost_table only (widths)", True, False, "off", False, 0),
           ("HYBRID, draft_cost_table only (depths)", False, True, "off", False, 0),
           ("HYBRID default, measured", False, False, "auto", False, 0),
           ("HYBRID, no price (width 13)", False, False, "off", False, 0),
           ("HYBRID +3 alternatives, ragged", True, True, "off", True, 3))


def layouts(case: H200Case) -> list:
    """Plain EAGLE (``STEPS`` steps) and the HYBRID layouts of ``LAYOUTS`` at ``case`` (the ragged one as
    ``ragged_verify=on`` builds it on FlashInfer at TP 1: one verify part, the verify in its token-tier graphs)."""
    out = [mb.eagle_budget(case.dep, STEPS)]
    for label, table, draft_table, measure, ragged, alternatives in LAYOUTS:
        widths = None
        if measure == "auto":       # the default launch: the widths the worker fits to the free memory at start
            widths = default_launch_widths(case.running, STEPS, NGRAM_K, context=case.context)
            label = f"{label} ({','.join(map(str, widths))})"
        settings = hybrid_settings(table, draft_table, measure=measure, eagle_alternatives=alternatives)
        out.append(hybrid_budget(case, settings, layout=label, widths=widths, ragged=ragged, tier_graphs=ragged))
    return out


def largest_grid(case: H200Case, steps: int = STEPS, ngram_k: int = NGRAM_K) -> Optional[mb.Budget]:
    """The largest settable set of runtime states that fits ``case``: ``draft_depths`` x ``verify_widths`` subsets of
    the defaults (the worker always keeps ``steps`` and the full width), both cost tables; the most states, then the
    least memory. None when not even the single state fits."""
    settings = hybrid_settings(ngram_k=ngram_k)
    dd, ww = settings.resolved_shapes(steps)
    best = None
    for nd in range(len(dd)):
        for ds in itertools.combinations(dd[:-1], nd):
            for nw in range(len(ww)):
                for ws in itertools.combinations(ww[:-1], nw):
                    b = hybrid_budget(case, settings, steps=steps, depths=(*ds, dd[-1]), widths=(*ws, ww[-1]))
                    if case.fits(b) and (best is None or (len(b.states), -b.total) > (len(best.states), -best.total)):
                        best = b
    return best


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def table(batches: Sequence[int] = BATCHES, contexts: Sequence[int] = CONTEXTS) -> list:
    """The printed lines."""
    cases = {(b, c): llama8b_h200(b, c) for b in batches for c in contexts}
    out = ["HYBRID start-up memory vs plain EAGLE: Llama-3.1-8B bf16 + EAGLE-3 head, one H200, FlashInfer, "
           f"{STEPS} EAGLE steps, merge n-gram k={NGRAM_K} (full width 13)",
           "COMPUTED from SGLang 0.5.23's sizing formulas (sglang_hybrid/sglang_plugin/memory_budget.py), NOT "
           "measured on a GPU. SGLang's default --mem-fraction-static; --cuda-graph-max-bs = --max-running-requests "
           "= batch.",
           "memory: the speculative machinery (graph buffers, workspaces, logits, draft weights, HYBRID's buffers); "
           f"needs: what is allocated after the KV pool + SGLang's post-capture runtime reserve "
           f"({_gib(mb.post_capture_reserve_bytes())} GiB); "
           "free: what SGLang leaves after sizing its KV pool (an upper bound).",
           ""]
    head = (f"{'batch':>5}  {'context':>7}  {'mfs':>5}  {'layout':<40} {'states':>6} {'graph sets':>10} "
            f"{'memory GiB':>10} {'vs EAGLE':>8} {'needs GiB':>9} {'free GiB':>8}  verdict")
    out += [head, "-" * len(head)]
    for (b, c), case in cases.items():
        budgets = layouts(case)
        eagle = budgets[0]
        for i, bud in enumerate(budgets):
            label = f"plain EAGLE (width {STEPS + 1})" if i == 0 else bud.layout
            out.append(f"{b:>5}  {c:>7,}  {case.mfs:>5.3f}  {label:<40} {len(bud.states):>6} {bud.graph_sets:>10} "
                       f"{_gib(bud.total):>10} {bud.total / eagle.total:>7.2f}x {_gib(case.needs(bud)):>9} "
                       f"{_gib(case.free):>8}  {'FITS' if case.fits(bud) else 'DOES NOT FIT'}")
        out.append("")
    out += ["Largest number of runtime states that fits (both cost tables; the settable draft_depths x verify_widths "
            "grids, which keep depth 4 and width 13; most states, then least memory):", ""]
    head = f"{'batch':>5}  {'context':>7}  {'states':>6}  {'of':>3}  {'depths':<14} {'widths':<20} {'needs GiB':>9} " \
           f"{'free GiB':>8}"
    out += [head, "-" * len(head)]
    as_built = len(hybrid_budget(next(iter(cases.values())), hybrid_settings()).states)
    for (b, c), case in cases.items():
        g = largest_grid(case)
        if g is None:
            out.append(f"{b:>5}  {c:>7,}  {0:>6}  {as_built:>3}  not even one state fits")
            continue
        ds = ",".join(str(d) for d in sorted({d for d, _ in g.states}))
        ws = ",".join(str(w) for w in sorted({w for _, w in g.states}))
        out.append(f"{b:>5}  {c:>7,}  {len(g.states):>6}  {as_built:>3}  {ds:<14} {ws:<20} {_gib(case.needs(g)):>9} "
                   f"{_gib(case.free):>8}")
    out += ["", "The replay's tuned HYBRID launch settings (S<EAGLE steps>/K<n-gram k>, as its tables print them), "
                "as built with both cost tables: states, and whether they fit at each batch x context:", ""]
    cols = [(b, c) for b in batches for c in contexts]
    head = f"{'setting':<8} {'states':>6}  {'widths':<22} " + " ".join(f"{f'{b}x{c // 1024}k':>9}" for b, c in cols)
    out += [head, "-" * len(head)]
    for steps, k in REPLAY_TUNED:
        settings = hybrid_settings(ngram_k=k)
        verdicts, n = [], 0
        for b, c in cols:
            bud = hybrid_budget(cases[(b, c)], settings, steps=steps)
            n = len(bud.states)
            verdicts.append("fits" if cases[(b, c)].fits(bud) else "NO")
        ws = ",".join(str(w) for w in settings.resolved_verify_widths(steps))
        out.append(f"{f'S{steps}/K{k}':<8} {n:>6}  {ws:<22} " + " ".join(f"{v:>9}" for v in verdicts))
    out += [""] + reserve_lines(batches, contexts)
    return out


def reserve_lines(batches: Sequence[int] = BATCHES, contexts: Sequence[int] = CONTEXTS) -> list:
    """The runtime activation reserve per batch (it does not depend on the context) with its breakdown, and the
    default launch's widths at every (batch, context) without and with it."""
    settings = hybrid_settings(False, False, measure="auto")
    full = settings.resolved_n_nodes(STEPS) + 1
    out = ["Runtime activation reserve the worker keeps free before fitting widths at start "
           "(memory_budget.runtime_activation_reserve, fit_widths_at_start), beside SGLang's post-capture reserve: "
           f"a sampled verify at the full width {full} x batch requests (vocab {LLAMA8B.vocab:,}, float32; logits in "
           f"SGLang's shared graph buffer) plus a chunked prefill of {H200_CHUNKED_PREFILL:,} tokens (GiB):", ""]
    verify_keys = ("probability copies", "top-p workspace", "top-k row states", "logprob copies", "logits")
    prefill_keys = ("hidden states", "layer intermediate", "draft hidden states", "last-token logits")
    head = (f"{'batch':>5}  {'verify':>6} = {'2 copies':>8} {'top-p ws':>8} {'top-k':>6} {'logprob':>7} "
            f"{'logits':>6}   {'prefill':>7} = {'hidden':>6} {'layer':>6} {'draft h':>7} {'logits':>6}   "
            f"{'reserve':>7}")
    out += [head, "-" * len(head)]
    for b in batches:
        total, items = llama8b_h200(b, contexts[0]).activation_reserve(settings)
        v = [items[f"sampled verify: {k}"] for k in verify_keys]
        p = [items[f"chunked prefill: {k}"] for k in prefill_keys]
        out.append(f"{b:>5}  {_gib(sum(v)):>6} = {_gib(v[0]):>8} {_gib(v[1]):>8} {_gib(v[2]):>6} {_gib(v[3]):>7} "
                   f"{_gib(v[4]):>6}   {_gib(sum(p)):>7} = {_gib(p[0]):>6} {_gib(p[1]):>6} {_gib(p[2]):>7} "
                   f"{_gib(p[3]):>6}   {_gib(total):>7}")
    out += ["", "The default launch's verify widths (a table measured at start; every extra assumed to pay), without "
                "the activation reserve (this table's and the replay's) and with it (the worker's fit):", ""]
    head = f"{'batch x context':>15}  {'without':<12} {'with':<12}"
    out += [head, "-" * len(head)]
    for b in batches:
        for c in contexts:
            without, with_ = (",".join(map(str, default_launch_widths(b, STEPS, NGRAM_K, context=c, activations=a)))
                              for a in (False, True))
            out.append(f"{f'{b} x {c:,}':>15}  {without:<12} {with_:<12}")
    return out


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=_ints, default=BATCHES, help="max running requests (= cuda-graph max bs)")
    ap.add_argument("--contexts", type=_ints, default=CONTEXTS, help="--context-length values")
    args = ap.parse_args(argv)
    print("\n".join(table(args.batches, args.contexts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
