"""Fused device kernels of HYBRID's per-step path (Triton), beside the torch reference they must equal.

``FusedDecisionStep`` runs a ``DecisionStep``'s decision for padded verify in three kernel launches
(``kernels.decision``): it replaces the paths ``DecisionStep._padded`` and ``DecisionStep._padded_adaptive`` (not
the ragged ones, ``_ragged`` and ``_ragged_adaptive``, nor a skipped model draft); the torch ``DecisionStep`` stays
the reference (the exactness tests compare the two) and the path wherever Triton cannot run. Where Triton runs:

* a CUDA device with Triton installed (compiled kernels);
* the CPU when Triton's interpreter is on (``TRITON_INTERPRET=1`` before Triton is first imported), as in SGLang's CPU
  engine (``sglang_hybrid.cpu_engine`` sets it), so the live suite runs the fused path end to end.

``available(device)`` says which; nothing here imports Triton until it is asked.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from sglang_hybrid.cost import CostTables
from sglang_hybrid.sglang_plugin.config import GPU_TILES_ENV
from sglang_hybrid.step import Decision, DecisionStep, NgramDraft

from .workspace import Workspace, alloc

#: rows of the batch one program handles on a GPU (the selection's pairwise ranking is ``rows x pool x pool``)
GPU_BLOCK_ROWS = 8
#: rows per iteration of a one-program kernel looping over the batch on a GPU (after verify: a few values per row)
GPU_LOOP_ROWS = 32
#: on the CPU interpreter one program takes the whole batch up to this many rows (each program costs interpreter time)
INTERPRETER_BLOCK_ROWS = 256
#: ``GPU_TILES_ENV`` set: run the interpreter with the GPU's rows per program: its launches then have the compiled
#: path's shapes and program counts (``bench.gpu_compile`` records them; exactness runs check the multi-program paths a
#: GPU takes), at more interpreter time per batch
#: context positions the prompt lookup compares per loop iteration
LOOKUP_CHUNK = 256
#: FULL_MASK prefix columns written per loop iteration
MASK_CHUNK = 256


def pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (at least 1): Triton's block shapes are powers of two."""
    return 1 << max(int(n) - 1, 0).bit_length()


def rows_per_program(device: torch.device, gpu_rows: int = GPU_BLOCK_ROWS,
                     interpreter_rows: int = INTERPRETER_BLOCK_ROWS) -> int:
    """Rows per program (or per loop iteration): ``gpu_rows`` on a GPU; in the CPU interpreter ``interpreter_rows``
    (the whole batch: each program costs it time), or ``gpu_rows`` where ``GPU_TILES_ENV`` is set."""
    if device.type == "cpu" and not os.environ.get(GPU_TILES_ENV):
        return interpreter_rows
    return gpu_rows


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device) -> bool:
    """Whether the fused kernels run on ``device``: CUDA with Triton, or the CPU under Triton's interpreter."""
    return unavailable_reason(device) is None


def unavailable_reason(device) -> Optional[str]:
    """Why the fused kernels cannot run on ``device``, with the fix (None when they can): the decision then takes the
    torch operators, hundreds of launches a step instead of 7 to 12."""
    dev = torch.device(device)
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (install the triton package that matches your torch)"
    if dev.type == "cuda":
        if _interpreted():
            return ("TRITON_INTERPRET=1 is set in the environment of a CUDA process, so Triton would run the kernels "
                    "in its interpreter on the host: unset TRITON_INTERPRET")
        return None
    if dev.type == "cpu":
        from . import decision
        from triton.runtime.interpreter import InterpretedFunction

        if isinstance(decision._select_kernel, InterpretedFunction):
            return None
        return "on a CPU Triton runs only in its interpreter: set TRITON_INTERPRET=1 before Triton is imported"
    return f"no Triton kernels for device type {dev.type!r}"


class FusedDecisionStep:
    """``DecisionStep.__call__`` for the SGLang worker's configuration, in three launches: the paths
    ``DecisionStep._padded`` (one draft depth) and ``DecisionStep._padded_adaptive`` (adaptive drafting, depths >= 1).
    Ragged verify (``_ragged``, ``_ragged_adaptive``) keeps the torch step.

    Supported: padded verify (``decide.widths`` set), a model chain drafted at full length (every row ``S`` tokens,
    ``S`` one of ``decide.depths`` when adaptive), an n-gram *chain* (``NgramDraft.tree`` False) with the n-gram
    calibration, one batch-wide price (``batch`` = the rows). Anything else raises ``ValueError`` naming what differs:
    the caller keeps the torch ``DecisionStep`` for it. The result equals the torch step's
    (tests/kernels/test_fused_decision.py).
    """

    def __init__(self, decide: DecisionStep, device):
        if decide.widths is None:
            raise ValueError("the fused decision covers padded verify only (DecisionStep(widths=...)); ragged verify "
                             "keeps the torch DecisionStep")
        if decide.ngram_cal is None:
            raise ValueError("the fused decision needs the n-gram calibration (DecisionStep(ngram_calibration=...))")
        if decide.depths is not None and 0 in decide.depths:
            raise ValueError("the fused decision does not skip the model draft (depth 0); keep the torch DecisionStep")
        self.decide = decide
        self.device = torch.device(device)
        why = unavailable_reason(self.device)
        if why is not None:
            raise ValueError(f"Triton cannot run on {self.device} here: {why}")
        self.block_rows = rows_per_program(self.device)
        self._buckets = torch.tensor(decide.widths, dtype=torch.int64, device=self.device)
        self._depths = {}

    def _depths_tensor(self, depths: tuple) -> torch.Tensor:
        # built once per depth set, outside any capture (a host-to-device copy cannot be captured)
        if depths not in self._depths:
            self._depths[depths] = torch.tensor(depths, dtype=torch.int64, device=self.device)
        return self._depths[depths]

    def __call__(self, root_tokens: torch.Tensor, model_tokens: torch.Tensor, model_conf: torch.Tensor,
                 ngram: NgramDraft, *, cost: Optional[CostTables] = None, draft_cost: Optional[CostTables] = None,
                 width: Optional[int] = None, model_bias: Optional[torch.Tensor] = None,
                 ngram_bias: Optional[torch.Tensor] = None, counters=None,
                 from_lookup: Optional[torch.Tensor] = None, chain_out: Optional[torch.Tensor] = None,
                 workspace: Optional[Workspace] = None, alt_tokens: Optional[torch.Tensor] = None,
                 alt_conf: Optional[torch.Tensor] = None, conf_out: Optional[torch.Tensor] = None) -> Decision:
        """The ``Decision`` of ``DecisionStep.__call__(root_tokens, ModelDraft(model_tokens, model_conf, S), ngram,
        cost=cost, draft_cost=draft_cost, width=width, model_bias=model_bias, ngram_bias=ngram_bias)``. With
        ``counters`` (``HybridCounters``) the step is also counted on the device as ``HybridCounters.on_select``
        counts it (``from_lookup``: the rows the prompt lookup supplied); the caller counts the host share
        (``on_select_host``). ``chain_out`` (``[B, S]``, unit column stride): where to copy ``model_tokens``;
        ``conf_out`` (``[B, S]`` float32, contiguous): where to copy ``model_conf`` clamped into [0, 1] (the online
        temperature learns from it after verify, ``HybridStep.after_verify``).
        ``workspace``: where the decision's tensors live (valid until the next call with it; None: fresh tensors).
        ``alt_tokens`` / ``alt_conf`` (``[B, S, M]``, both or neither): the EAGLE alternatives
        (``ModelDraft.alt_tokens`` / ``alt_confidence``), which the kernels assume distinct from each other and from
        the chain token at their position, as ranks 2 to ``M + 1`` of one distribution are (the torch step folds a
        duplicate under merge; the worker excludes the chain token, ``HybridDraftWorker``)."""
        from . import decision

        d = self.decide
        b, s = model_tokens.shape
        if width is None:
            width = d.max_width
        if width not in d.widths:
            raise ValueError(f"width {width!r} is not one of the verify width buckets {d.widths}")
        if ngram.tree:
            raise ValueError("the fused decision takes an n-gram chain; an n-gram tree keeps the torch DecisionStep")
        # ngram.parents is not read (a chain's are implied); ngram.length may exceed k (the kernels clamp it)
        if tuple(model_conf.shape) != (b, s) or tuple(root_tokens.shape) != (b,):
            raise ValueError(f"model_conf must be [{b}, {s}] and root_tokens [{b}], got {tuple(model_conf.shape)} "
                             f"and {tuple(root_tokens.shape)}")
        k = ngram.tokens.shape[1]
        for name in ("length", "match_len", "count", "total", "depth", "source"):
            t = getattr(ngram, name)
            want = (b,) if name == "length" else (b, k)
            if tuple(t.shape) != want:
                raise ValueError(f"ngram.{name} must have shape {want}, got {tuple(t.shape)}")
        if not ngram.length.is_contiguous() or not root_tokens.is_contiguous():
            raise ValueError("ngram.length and root_tokens must be contiguous")
        for name, bias in (("model_bias", model_bias), ("ngram_bias", ngram_bias)):
            if bias is not None and tuple(bias.shape) != (b,):
                raise ValueError(f"{name} must have shape ({b},), got {tuple(bias.shape)}")
        adaptive = d.depths is not None
        if adaptive and s not in d.depths:
            raise ValueError(f"the model chain has {s} tokens but the draft depths are {d.depths}")
        if s < 1:
            raise ValueError("the fused decision needs a drafted model chain (S >= 1)")
        if (alt_tokens is None) != (alt_conf is None):
            raise ValueError("alt_tokens and alt_conf come together: pass both or neither")
        if alt_tokens is not None:
            m = alt_tokens.shape[2] if alt_tokens.dim() == 3 else -1
            if m < 1 or tuple(alt_tokens.shape) != (b, s, m) or tuple(alt_conf.shape) != (b, s, m):
                raise ValueError(f"alt_tokens and alt_conf must both have shape ({b}, {s}, M), M >= 1, got "
                                 f"{tuple(alt_tokens.shape)} and {tuple(alt_conf.shape)}")
        if conf_out is not None and (tuple(conf_out.shape) != (b, s) or conf_out.dtype != torch.float32
                                     or not conf_out.is_contiguous()):
            raise ValueError(f"conf_out must be a contiguous float32 [{b}, {s}] tensor, got {conf_out.dtype} "
                             f"{tuple(conf_out.shape)}")
        depths = d.depths if adaptive else (s,)
        return decision.launch(
            root=root_tokens, model_tokens=model_tokens, model_conf=model_conf,
            bias=None if model_bias is None else model_bias.to(torch.float32),
            ngram_bias=None if ngram_bias is None else ngram_bias.to(torch.float32),
            ng_tokens=ngram.tokens, ng_len=ngram.length, ng_match_len=ngram.match_len, ng_count=ngram.count,
            ng_total=ngram.total, ng_depth=ngram.depth, ng_source=ngram.source,
            temps=d.model_cal.temperatures, ngram_tables=d.ngram_cal, buckets=self._buckets, depths=depths,
            depths_t=self._depths_tensor(depths), cost=cost, draft_cost=draft_cost if adaptive else None,
            mode=d.mode, n_nodes=d.n_nodes, width=int(width), block_rows=self.block_rows, counters=counters,
            from_lookup=from_lookup, chain_out=chain_out, workspace=workspace, alt_tokens=alt_tokens,
            alt_conf=alt_conf, conf_out=conf_out)


def follow_context(seq_lens: torch.Tensor, cost, draft_cost) -> None:
    """Both measured tables (``cost.ContextCostTables`` or None) blended at the batch's mean context in one launch
    (``kernels.cost_context``)."""
    from .cost_context import follow_context as launch

    launch(seq_lens, cost, draft_cost)


def fused_proposals(buffers, context, slots: torch.Tensor, cur_gen: torch.Tensor, seq_lens: torch.Tensor,
                    root_tokens: torch.Tensor, span: Optional[int], model_bias: Optional[torch.Tensor] = None,
                    model_bias_gen: Optional[torch.Tensor] = None, ngram_bias: Optional[torch.Tensor] = None,
                    ngram_bias_gen: Optional[torch.Tensor] = None, workspace: Optional[Workspace] = None):
    """``HybridStep``'s n-gram side before the decision in one or two launches (``kernels.proposals``): records the
    root in the ring (``buffers``, ``alignment.ProposalBuffers``) and the context table (``context``,
    ``context_lookup.ContextTable`` or None), aligns the host's proposals and, with a context table, fills rows left
    without one from the prompt lookup over the first ``span`` positions (None: the whole table).

    Returns ``(proposals, from_lookup, bias, ngram_bias)``: ``alignment.AlignedProposals`` (``[B, K]``, ``K`` the
    buffers' width), the rows the lookup supplied (bool ``[B]``, None without a context table) and each row's online
    EAGLE and n-gram offsets gathered from ``model_bias``/``model_bias_gen`` and ``ngram_bias``/``ngram_bias_gen``
    (0 where the slot's generation is not the row's; None without them). ``workspace``: where they live (valid
    until the next call with it; None: fresh tensors)."""
    from sglang_hybrid.sglang_plugin import context_lookup
    from sglang_hybrid.sglang_plugin.alignment import AlignedProposals

    import triton

    from . import proposals as kp

    b = slots.shape[0]
    dev = slots.device
    pw = buffers.tokens.shape[1]
    r = buffers.ring.shape[1] - 1
    i64 = torch.int64
    ws = workspace
    out = [alloc(ws, f"proposal_{n}", (b, pw), i64, dev)
           for n in ("tokens", "depth", "match_len", "count", "total", "source")]
    length = alloc(ws, "proposal_length", (b,), i64, dev)
    shift = alloc(ws, "proposal_shift", (b,), i64, dev)
    bias = alloc(ws, "bias", (b,), torch.float32, dev) if model_bias is not None else None
    nbias = alloc(ws, "ngram_bias", (b,), torch.float32, dev) if ngram_bias is not None else None
    ctx_len = context.tokens.shape[1] - 1 if context is not None else 1
    block = rows_per_program(dev)
    kp._prepare_kernel[(triton.cdiv(b, block),)](
        slots, seq_lens, cur_gen, root_tokens, buffers.tokens, buffers.length, buffers.at, buffers.gen,
        buffers.match_len, buffers.count, buffers.total, buffers.source, buffers.ring,
        context.tokens if context is not None else buffers.ring,
        model_bias if model_bias is not None else length, model_bias_gen if model_bias is not None else length,
        ngram_bias if ngram_bias is not None else length, ngram_bias_gen if ngram_bias is not None else length,
        out[0], length, out[1], out[2], out[3], out[4], out[5], shift, bias if bias is not None else length,
        nbias if nbias is not None else length,
        b, PW=pw, PW2=pow2(pw), R=r, L=ctx_len, HAS_CTX=context is not None, HAS_BIAS=model_bias is not None,
        NG_BIAS=ngram_bias is not None, BB=block)
    from_lookup = None
    if context is not None:
        if span is None:
            span = ctx_len
        elif not 1 <= span <= ctx_len:
            raise ValueError(f"span must be in [1, {ctx_len}] (the table's context length), got {span}")
        from_lookup = alloc(ws, "from_lookup", (b,), torch.bool, dev)
        kp._lookup_kernel[(b,)](
            context.tokens, context.gen, slots, seq_lens, cur_gen, out[0], length, out[1], out[2], out[3], out[4],
            out[5], from_lookup, span, L=ctx_len, K=pw, K2=pow2(pw), N_MAX=context_lookup.N_MAX,
            N2=pow2(context_lookup.N_MAX), N_MIN=context_lookup.N_MIN, N_LONG=pow2(context_lookup.N_LONG),
            CH=LOOKUP_CHUNK)
    props = AlignedProposals(tokens=out[0], length=length, depth=out[1], match_len=out[2], count=out[3],
                             total=out[4], source=out[5], shift=shift)
    return props, from_lookup, bias, nbias


def fused_links_and_mask(tokens: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor, seq_lens: torch.Tensor,
                         seq_lens_sum: int, mask_buf: Optional[torch.Tensor] = None,
                         workspace: Optional[Workspace] = None):
    """``verify_nodes`` + ``tree_links_torch`` + ``full_mask`` of ``sglang_plugin.tree_mask`` in one launch
    (``kernels.verify_input``): returns ``(draft_token [B*W], positions [B*W], retrieve_index, retrieve_next_token,
    retrieve_next_sibling [B, W], custom_mask)``. ``mask_buf``: a bool or uint8 buffer of at least
    ``seq_lens_sum * W + W * W * B`` entries (None: a new one, from ``workspace`` when given); only the requests'
    rows are written."""
    from . import verify_input as kv

    b, w = tokens.shape
    dev = tokens.device
    numel = seq_lens_sum * w + w * w * b
    if mask_buf is None:
        mask_buf = alloc(workspace, "custom_mask", (numel,), torch.bool, dev)
    elif mask_buf.numel() < numel:
        raise ValueError(f"custom mask buffer holds {mask_buf.numel()} entries, FULL_MASK needs {numel}")
    elif mask_buf.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"custom mask buffer must be bool or uint8 (Triton's), got {mask_buf.dtype}")
    i64 = torch.int64
    draft = alloc(workspace, "draft_token", (b * w,), tokens.dtype, dev)
    positions = alloc(workspace, "positions", (b * w,), i64, dev)
    links = alloc(workspace, "links", (3, b, w), i64, dev)
    kv._verify_input_kernel[(b,)](tokens, valid, ancestors, seq_lens, draft, positions, links[0], links[1], links[2],
                                  mask_buf, b, W=w, W2=pow2(w), B2=pow2(b), CH=MASK_CHUNK)
    return draft, positions, links[0], links[1], links[2], mask_buf


def fused_after_verify(step, tree, slots: torch.Tensor, seq_lens_before: torch.Tensor, emitted: torch.Tensor,
                       accept_lens: torch.Tensor, model_step, ngram_step=None) -> None:
    """``HybridStep.after_verify``'s device work in one launch (``kernels.outcome``); ``model_step`` and
    ``ngram_step``: what the step's ``select`` kept for it (``HybridStep._model_step``, ``HybridStep._ngram_step``)
    or None. The n-gram chain's outcome is counted, and its offset learned (``ngram_bias_eta``), only with the model
    step's slot generations (both come from one ``select``). With ``step.online_temperature``
    (``online_calibration.OnlineTemperature``, setting ``model_calibration_eta``) and the chain's draft probabilities
    kept by ``select``, the kernel also takes the temperatures' online step."""
    from sglang_hybrid import online_calibration as oc
    from sglang_hybrid.calibration import CAL_EPS
    from sglang_hybrid.sglang_plugin import metrics as m

    from . import outcome as ko

    b, c = emitted.shape
    w = tree.tokens.shape[1]
    chain = bias = acceptance = gen = conf = None
    if model_step is not None:
        _, gen, chain, bias, acceptance, conf = model_step
    online = step.online_temperature if conf is not None else None
    if conf is not None and (conf.shape != chain.shape or not conf.is_contiguous()):
        raise ValueError(f"the chain's draft probabilities must be contiguous and shaped as the chain "
                         f"{tuple(chain.shape)}, got {tuple(conf.shape)}")
    nt = online.temperatures.numel() if online is not None else 1
    s = chain.shape[1] if chain is not None else 1
    ng = ngram_step if model_step is not None else None
    k = ng[0].shape[1] if ng is not None else 1
    if ng is not None and ng[0].stride(1) != 1:
        raise ValueError(f"the n-gram chain's tokens must have unit column stride, got strides {ng[0].stride()}")
    ctx = step.context
    dummy = step.counters.totals
    ko._after_verify_kernel[(1,)](
        slots, seq_lens_before, emitted, *emitted.stride(), accept_lens, step.buffers.ring,
        ctx.tokens if ctx is not None else dummy,
        chain if chain is not None else dummy, chain.stride(0) if chain is not None else 0,
        gen if gen is not None else dummy, bias if bias is not None else dummy,
        acceptance if acceptance is not None else dummy,
        step.model_bias if step.model_bias is not None else dummy,
        step.model_bias_gen if step.model_bias_gen is not None else dummy,
        *((conf, online.temperatures, online.sq_grad) if online is not None else (dummy, dummy, dummy)),
        *((ng[0], ng[0].stride(0), ng[1], ng[3]) if ng is not None else (dummy, 0, dummy, dummy)),
        *((ng[2], step.ngram_bias, step.ngram_bias_gen) if ng is not None and ng[2] is not None
          else (dummy, dummy, dummy)),
        tree.valid, tree.source, step.counters.totals,
        b,
        C=c, D_EMIT=min(c, step.max_depth + 1), C2=pow2(c), R=step.buffers.ring.shape[1] - 1,
        L=ctx.tokens.shape[1] - 1 if ctx is not None else 1, HAS_CTX=ctx is not None, MODEL=chain is not None,
        S=s, S2=pow2(s), HAS_BIAS=bias is not None, ETA=float(step.model_bias_eta or 0.0), NGRAM=ng is not None,
        K=k, K2=pow2(k), NG_BIAS=ng is not None and ng[2] is not None, NG_ETA=float(step.ngram_bias_eta or 0.0),
        W=w, W2=pow2(w),
        BB=rows_per_program(slots.device, GPU_LOOP_ROWS),
        CAL=online is not None, CAL_ETA=online.eta if online is not None else 0.0, NT=nt, NT2=pow2(nt),
        CAL_DECAY=oc.DECAY, CAL_POOL=oc.POOL, W_LO=oc.W_MIN, W_HI=oc.W_MAX, CAL_EPS_C=CAL_EPS, NORM_EPS_C=oc.NORM_EPS,
        C_ACC=m.ACC["none"], C_TESTED=m.MODEL_TESTED, C_PRED=m.MODEL_PRED, C_HIT=m.MODEL_HIT,
        C_NTESTED=m.NGRAM_TESTED, C_NPRED=m.NGRAM_PRED, C_NHIT=m.NGRAM_HIT)


def step_alternatives(first, slots: torch.Tensor, gens: torch.Tensor, recorded_p: torch.Tensor,
                      recorded_i: torch.Tensor, chain: torch.Tensor, workspace: Optional[Workspace] = None):
    """The step's EAGLE alternatives (``sglang_plugin.alternatives.step_alternatives``) in one launch
    (``kernels.alternatives``)."""
    from . import alternatives

    return alternatives.step_alternatives(first, slots, gens, recorded_p, recorded_i, chain, workspace=workspace)


def record_alternatives(first, slots: torch.Tensor, gens: torch.Tensor, probs: torch.Tensor,
                        tokens: torch.Tensor) -> None:
    """``FirstAlternatives.record`` in one launch (``kernels.alternatives``)."""
    from . import alternatives

    alternatives.record(first, slots, gens, probs, tokens)


def count_alternatives(counters, tree, chain: torch.Tensor, emitted: torch.Tensor, accept_lens: torch.Tensor) -> None:
    """``HybridStep.after_verify``'s count of the EAGLE alternatives (``kernels.alternatives``) in one launch."""
    from . import alternatives

    alternatives.count_outcome(counters, tree, chain, emitted, accept_lens)


__all__ = ["FusedDecisionStep", "Workspace", "available", "count_alternatives", "fused_after_verify",
           "fused_links_and_mask", "fused_proposals", "record_alternatives", "step_alternatives"]
