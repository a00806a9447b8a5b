"""Every specialisation of HYBRID's Triton kernels that a worker's launch can take, enumerated from its configuration.

Why: Triton compiles a kernel the first time it is launched with a new *specialisation*: a constexpr's value, a
tensor's dtype and (unless told not to) whether its address is 16-byte aligned, an int's type and (unless told not
to) whether it is 1 or a multiple of 16. On a GPU each compile stalls the step that meets it for a fraction of a second
to a few seconds. ``launch_variants(config)`` lists every specialisation the worker's per-step launches can take, so
that ``kernels.warmup.warm_up`` compiles them at start; the kernels mark the runtime ints they need not specialise on
(``do_not_specialize``: batch sizes, strides, spans) and the pointers whose alignment is not theirs to know
(``do_not_specialize_on_alignment``: SGLang's tensors), so the set is small and exact.

The description format is ``bench.gpu_compile``'s: one record per launch, ``{"module", "kernel", "args": [...],
"kwargs": {...}}``, each argument ``{"tensor": dtype, "aligned": bool}`` or ``{"value": v}`` (``describe``); a
record is rebuilt into stand-in arguments for ``JITFunction.warmup`` by ``rebuild``. ``key_of`` maps a record to the
specialisation Triton keys its compile cache on (the kernel's ``do_not_specialize`` flags applied, as Triton's binder
applies them), so a recorded launch and an enumerated variant compare by key, whatever the values of the arguments
Triton does not specialise on.

How the enumeration stays true to the launches: each ``_<kernel>`` generator below mirrors one launch site (named in
its docstring), its arguments in the kernel's order, its constexprs computed as the launch computes them (shared
helpers where the launch has one: ``decision.select_tiles``, ``rows_per_program``, ``pow2``).
``tests/kernels/test_compile_warm.py`` runs the worker's step under the interpreter for several configurations, records
every launch and checks each is in ``launch_variants`` of its configuration. Tensors SGLang hands over have dtypes
HYBRID does not choose: ``LaunchConfig``'s ``*_dtypes`` fields list the ones SGLang 0.5.23 produces (the bonus tokens
are int32 after a verify and int64 after a greedy prefill, so both).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import itertools
from typing import Iterable, Iterator, Optional

import torch

from . import GPU_BLOCK_ROWS, GPU_LOOP_ROWS, INTERPRETER_BLOCK_ROWS, LOOKUP_CHUNK, MASK_CHUNK, pow2, rows_per_program

#: the package whose entry kernels (``@triton.jit`` functions named ``*_kernel``) are enumerated and warmed
KERNELS_PACKAGE = "sglang_hybrid.kernels"


# ---------------------------------------------------------------------------------------------------------------------
# the description format (bench.gpu_compile's) and Triton's specialisation key


def describe(value) -> dict:
    """A launch argument as JSON: what Triton specialises a compile on, and nothing else (``bench.gpu_compile``'s
    record format): a tensor's dtype and whether its address is 16-byte aligned, any other value as it is."""
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"a kernel argument of type {type(value).__name__} ({value!r}) cannot be recorded")


def rebuild(desc: dict):
    """A stand-in argument with what the compile depends on: a (CPU) tensor of the dtype, aligned or not as described
    (``None``: either); any other value as it is. A warm-up compile reads only a tensor's dtype and address."""
    if "value" in desc:
        return desc["value"]
    t = torch.zeros(32, dtype=getattr(torch, desc["tensor"]))     # CPU allocations are 64-byte aligned
    return t[1:] if desc["aligned"] is False else t                # every dtype here is narrower than 16 bytes


@dataclasses.dataclass(frozen=True)
class Param:
    """A kernel parameter as Triton's binder sees it: a constexpr, or a runtime argument specialised on its value
    (``specialise``; an int: 1 or a multiple of 16) and on its alignment (``align``; a tensor's address, an int's
    divisibility by 16)."""

    name: str
    constexpr: bool
    specialise: bool
    align: bool


def _flag_names(kernel, attr: str) -> set:
    flags = getattr(kernel, attr, None)
    if flags is None:                                      # the interpreter keeps jit's keywords
        flags = getattr(kernel, "kwargs", {}).get(attr)
    return set(flags or ())


@functools.lru_cache(maxsize=None)
def _params(kernel) -> tuple:
    sig = inspect.signature(kernel.fn)
    dns, dna = _flag_names(kernel, "do_not_specialize"), _flag_names(kernel, "do_not_specialize_on_alignment")
    out = []
    for i, (name, p) in enumerate(sig.parameters.items()):
        ann = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
        out.append(Param(name, "constexpr" in ann, not (i in dns or name in dns), not (i in dna or name in dna)))
    return tuple(out)


def kernel(module: str, name: str):
    """The entry kernel ``module.name`` (a ``JITFunction``, or an ``InterpretedFunction`` under the interpreter)."""
    return getattr(importlib.import_module(module), name)


def kernel_params(module: str, name: str, honour_flags: bool = True) -> tuple:
    """The kernel's ``Param``s in signature order; ``honour_flags=False``: as if nothing were marked
    ``do_not_specialize`` (Triton's default, what the kernels compiled before)."""
    params = _params(kernel(module, name))
    if honour_flags:
        return params
    return tuple(dataclasses.replace(p, specialise=True, align=True) for p in params)


def _int_type(v: int) -> str:
    return "i32" if -2**31 <= v < 2**31 else "i64" if -2**63 <= v < 2**63 else "u64"


def _item(p: Param, d: dict) -> tuple:
    """One parameter's part of the key, by Triton's rule (``native_specialize_impl``; tests/kernels/test_compile_warm.py
    checks the two agree): a constexpr's value with its type; a tensor's dtype and, when specialised, its alignment;
    an int's type and, when specialised, whether it is 1 (then a constexpr) or a multiple of 16; a bool or a float's
    type only; None a constexpr."""
    if "tensor" in d:
        return ("*" + d["tensor"], bool(d["aligned"]) if p.specialise and p.align else None)
    v = d["value"]
    if p.constexpr or v is None or isinstance(v, str):
        return ("constexpr", type(v).__name__, v)
    if isinstance(v, bool):
        return ("u1",)
    if isinstance(v, int):
        if not p.specialise:
            return (_int_type(v), None)
        if v == 1:
            return ("constexpr", "int", 1)
        return (_int_type(v), v % 16 == 0 if p.align else False)
    if isinstance(v, float):
        return ("fp32",)
    raise TypeError(f"argument {p.name}: cannot key {d!r}")


def key_of(record: dict, honour_flags: bool = True) -> tuple:
    """The specialisation Triton compiles ``record`` (the description format) for: ``(module, kernel, per-parameter
    items)``; two launches with the same key share one compiled kernel."""
    params = kernel_params(record["module"], record["kernel"], honour_flags)
    args, kwargs = record["args"], record.get("kwargs", {})
    if len(args) > len(params):
        raise TypeError(f"{record['kernel']} takes {len(params)} arguments, got {len(args)}")
    descs = list(args) + [kwargs[p.name] for p in params[len(args):]]
    return (record["module"], record["kernel"], tuple(_item(p, d) for p, d in zip(params, descs)))


def record_of(kernel_obj, args: tuple, kwargs: dict) -> dict:
    """A launch's record (``describe`` of each argument) for ``kernel_obj`` (a launch's own arguments)."""
    return {"module": kernel_obj.fn.__module__, "kernel": kernel_obj.fn.__name__,
            "args": [describe(a) for a in args], "kwargs": {k: describe(v) for k, v in kwargs.items()}}


def entry_kernels() -> list:
    """``module.name`` of every ``@triton.jit`` function in ``KERNELS_PACKAGE`` whose name ends in ``_kernel`` (the
    ones launched from the host; the others are device helpers that compile inside them)."""
    import pkgutil

    pkg = importlib.import_module(KERNELS_PACKAGE)
    names = []
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{KERNELS_PACKAGE}.{info.name}")
        for attr, value in vars(mod).items():
            fn = getattr(value, "fn", None)
            if (callable(fn) and hasattr(value, "run") and getattr(fn, "__module__", None) == mod.__name__
                    and attr.endswith("_kernel")):
                names.append(f"{mod.__name__}.{attr}")
    return sorted(names)


# ---------------------------------------------------------------------------------------------------------------------
# the worker's configuration


def _setting_default(name: str):
    from sglang_hybrid.sglang_plugin.config import HybridSettings

    return HybridSettings.model_fields[name].default


#: the online temperature's rate of the default launch (setting ``model_calibration_eta``)
_DEFAULT_CALIBRATION_ETA = _setting_default("model_calibration_eta")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """What the worker's per-step launches depend on (``HybridStep`` after start-up; ``from_step`` reads it).

    Shapes: ``depths`` (EAGLE draft depths, the last ``num_steps``), ``widths`` (verify width buckets, the last the
    full width ``n_nodes + 1``), ``ngram_k``, ``proposal_width`` and ``ring`` (the alignment buffers'), ``context_len``
    (the prompt lookup's table; None: off), ``alternatives`` (EAGLE alternatives M), ``temps`` / ``ngram_edges`` /
    ``ngram_shape`` (the calibrations' sizes), ``cost`` / ``draft_cost`` (table entries, None: no table) and whether
    each is blended per step (``*_follows``: a table measured at two contexts), the online offsets' rates (None: off),
    ``model_calibration_eta`` the online temperature's rate (None: off; default the setting's default),
    ``max_batch`` (the running limit: the power-of-two batch buckets), ``ragged`` (verify at the full width) and
    ``ragged_layout`` (the layout kernels run: Triton backend), ``gpu_tiles`` (rows per program as on a GPU: a CUDA
    device, or the interpreter with ``GPU_TILES_ENV``; else the interpreter's whole-batch programs). Dtypes of
    SGLang's tensors (``torch`` dtype names): ``root`` the bonus tokens, ``draft`` the draft tokens, ``seq`` the
    sequence lengths, ``slot`` the request slots, ``accept`` the accept lengths, ``mask`` the verify mask buffer (the
    backend's, else HYBRID's bool one), ``layout_mask`` the ragged layout's, ``ids`` the forward batch's node
    tokens."""

    mode: str
    depths: tuple
    widths: tuple
    n_nodes: int
    ngram_k: int
    proposal_width: int
    ring: int
    context_len: Optional[int] = None
    alternatives: int = 0
    temps: int = 16
    ngram_edges: tuple = (8, 12, 5, 6)
    ngram_shape: tuple = (2, 8, 12, 5, 6)
    cost: Optional[int] = None
    cost_follows: bool = False
    draft_cost: Optional[int] = None
    draft_cost_follows: bool = False
    model_bias_eta: Optional[float] = None
    ngram_bias_eta: Optional[float] = None
    model_calibration_eta: Optional[float] = _DEFAULT_CALIBRATION_ETA
    max_batch: int = 1
    ragged: bool = False
    ragged_layout: bool = False
    gpu_tiles: bool = True
    root_dtypes: tuple = ("int32", "int64")
    draft_dtypes: tuple = ("int64",)
    seq_dtypes: tuple = ("int64",)
    slot_dtypes: tuple = ("int64",)
    accept_dtypes: tuple = ("int32",)
    mask_dtypes: tuple = ("bool",)
    layout_mask_dtypes: tuple = ("uint8",)
    ids_dtypes: tuple = ("int64",)

    @property
    def num_steps(self) -> int:
        return self.depths[-1]

    @property
    def adaptive(self) -> bool:
        return len(self.depths) > 1

    @property
    def max_depth(self) -> int:
        return min(self.n_nodes, max(self.num_steps, self.ngram_k))

    @property
    def full_width(self) -> int:
        return self.n_nodes + 1

    @property
    def tree_widths(self) -> tuple:
        """Widths of the trees the verify input and after_verify see: the runtime state's width when padded (one of
        ``widths``), the full width when ragged (the states' one width; the decision's bucket only caps the nodes)."""
        return (self.full_width,) if self.ragged else tuple(self.widths)

    @classmethod
    def from_step(cls, step, *, max_batch: int, ragged: bool = False, attn_backend=None, **overrides) -> "LaunchConfig":
        """The configuration of a ``HybridStep`` (settings resolved, cost tables set, widths restricted: after the
        worker's ``_build_runtime_states``) serving up to ``max_batch`` requests; ``attn_backend`` (the target's):
        whether it keeps a verify mask buffer (its dtype) and whether ragged verify builds its layout with the layout
        kernels (the Triton backend's buffers); None: both mask dtypes and the layout kernels when ``ragged``."""
        from sglang_hybrid.cost import ContextCostTables

        from .cost_context import MAX_ENTRIES

        def entries(t):
            return None if t is None else int(t.sizes.numel())

        def follows(t):
            return isinstance(t, ContextCostTables) and t.sizes.numel() <= MAX_ENTRIES

        nc = step.decide.ngram_cal
        kw = dict(
            mode=step.settings.mode, depths=tuple(step.depths), widths=tuple(step.widths), n_nodes=step.n_nodes,
            ngram_k=step.k, proposal_width=step.proposal_width, ring=step.buffers.ring.shape[1] - 1,
            context_len=step.context.tokens.shape[1] - 1 if step.context is not None else None,
            alternatives=step.alternatives, temps=int(step.decide.model_cal.temperatures.numel()),
            ngram_edges=tuple(int(e.numel()) for e in (nc.depth_edges, nc.match_edges, nc.ratio_edges,
                                                       nc.count_edges)),
            ngram_shape=tuple(int(x) for x in nc.shape), cost=entries(step.cost), cost_follows=follows(step.cost),
            draft_cost=entries(step.draft_cost), draft_cost_follows=follows(step.draft_cost),
            model_bias_eta=step.model_bias_eta if step.model_bias is not None else None,
            ngram_bias_eta=step.ngram_bias_eta if step.ngram_bias is not None else None,
            model_calibration_eta=step.online_temperature.eta if step.online_temperature is not None else None,
            max_batch=int(max_batch), ragged=bool(ragged), ragged_layout=bool(ragged),
            gpu_tiles=rows_per_program(step.device) == GPU_BLOCK_ROWS, mask_dtypes=("bool", "uint8"),
            layout_mask_dtypes=("uint8", "bool"))
        if attn_backend is not None:
            kw.update(_backend_dtypes(attn_backend, int(max_batch), bool(ragged)))
        kw.update(overrides)
        return cls(**kw)


def _backend_dtypes(attn, max_batch: int, ragged: bool) -> dict:
    """The mask dtypes and whether the layout kernels run, from the target's attention backend: the verify input's
    mask is its FULL_MASK buffer where it keeps one that fits (``worker.verify_mask_buffer``), else HYBRID's bool one;
    ragged verify runs the layout kernels on the Triton backend (its ``ragged_buffers``, not FlashInfer's tiers)."""
    from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode

    out = {}
    vm = getattr(attn, "verify_mask", None)
    buf = getattr(vm, "buffer", None)
    mode = getattr(vm, "mode", None)
    full = mode is not None and int(mode) == int(TreeMaskMode.FULL_MASK)
    fits = getattr(vm, "fits", None)
    if buf is not None and full and callable(fits):
        dtype = str(buf.dtype).removeprefix("torch.")
        # a batch the buffer cannot hold takes a fresh bool mask (none at the running limit it was sized for)
        out["mask_dtypes"] = (dtype,) if fits(max_batch) else tuple(dict.fromkeys((dtype, "bool")))
    else:
        out["mask_dtypes"] = ("bool",)
    buffers = getattr(attn, "ragged_buffers", None)
    out["ragged_layout"] = ragged and buffers is not None and type(buffers).__name__ != "RaggedTierBuffers"
    if out["ragged_layout"] and getattr(buffers, "mask", None) is not None:
        out["layout_mask_dtypes"] = (str(buffers.mask.dtype).removeprefix("torch."),)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# per-kernel generators: (module, kernel, {parameter: description}) for every variant of one launch site


class Ints(tuple):
    """The values a runtime int takes (the first stands for all where it is not specialised; ``count_before``
    expands them by Triton's default classes)."""


class Aligns(tuple):
    """The alignments a tensor argument can have where they vary from step to step (the kernel does not specialise on
    them; ``count_before`` expands them). Elsewhere a tensor is described aligned: HYBRID's buffers and views start at
    their allocation, and SGLang's are assumed to for the before-count (the kernels do not specialise on theirs)."""


I64, I32, I8, U1, F32, F64 = "int64", "int32", "int8", "bool", "float32", "float64"


def _t(dtype: str, aligned=True) -> dict:
    return {"tensor": dtype, "aligned": aligned}


def _v(value) -> dict:
    return {"value": value}


def _batches(cfg: LaunchConfig) -> Ints:
    return Ints(range(1, cfg.max_batch + 1))


def _b2(cfg: LaunchConfig) -> dict:
    """Power-of-two batch bucket -> the batch sizes in it (1 .. max_batch)."""
    out: dict = {}
    for b in range(1, cfg.max_batch + 1):
        out.setdefault(pow2(b), []).append(b)
    return out


def _rows(cfg: LaunchConfig, gpu_rows: int = GPU_BLOCK_ROWS, interpreter_rows: int = INTERPRETER_BLOCK_ROWS) -> int:
    """``kernels.rows_per_program`` for the configuration's device (``gpu_tiles``)."""
    return gpu_rows if cfg.gpu_tiles else interpreter_rows


def _counter_slots() -> dict:
    from .decision import _COUNTER_SLOTS

    return dict(_COUNTER_SLOTS)


def _follow(cfg: LaunchConfig):
    """``cost_context.follow_context`` (``HybridStep._follow_context``): both tables measured at two contexts."""
    from . import cost_context as cc

    if not (cfg.cost_follows or cfg.draft_cost_follows):
        return
    tables = [_t(F32)] * 7
    for seq in cfg.seq_dtypes:
        yield cc.__name__, "_follow_kernel", dict(
            zip(("sz_ptr", "ss_ptr", "ls_ptr", "sec_ptr", "sl_ptr", "cs_ptr", "cw_ptr"), tables),
            **dict(zip(("dsz_ptr", "dss_ptr", "dls_ptr", "dsec_ptr", "dsl_ptr", "dcs_ptr", "dcw_ptr"), tables)),
            seq_ptr=_t(seq), B=_batches(cfg),
            NS=cfg.cost if cfg.cost_follows else 1, NDS=cfg.draft_cost if cfg.draft_cost_follows else 1,
            HAS_VERIFY=cfg.cost_follows, HAS_DRAFT=cfg.draft_cost_follows, BLOCK_B=cc.BLOCK)


def _proposals(cfg: LaunchConfig):
    """``kernels.fused_proposals`` (``HybridStep.select``): ``_prepare_kernel`` and, with the prompt lookup,
    ``_lookup_kernel``."""
    from sglang_hybrid.sglang_plugin import context_lookup

    from . import proposals as kp

    pw, ctx = cfg.proposal_width, cfg.context_len is not None
    has_bias, ng_bias = cfg.model_bias_eta is not None, cfg.ngram_bias_eta is not None
    for slot, seq, root in itertools.product(cfg.slot_dtypes, cfg.seq_dtypes, cfg.root_dtypes):
        args = dict(slots_ptr=_t(slot), seq_ptr=_t(seq),
                    gen_ptr=_t(I64), root_ptr=_t(root), ring_ptr=_t(I64),
                    ctx_ptr=_t(I32 if ctx else I64), mb_ptr=_t(F32 if has_bias else I64), mb_gen_ptr=_t(I64),
                    nb_ptr=_t(F32 if ng_bias else I64), nb_gen_ptr=_t(I64),
                    o_bias_ptr=_t(F32 if has_bias else I64), o_nbias_ptr=_t(F32 if ng_bias else I64), B=_batches(cfg),
                    PW=pw, PW2=pow2(pw), R=cfg.ring, L=cfg.context_len if ctx else 1, HAS_CTX=ctx, HAS_BIAS=has_bias,
                    NG_BIAS=ng_bias, BB=_rows(cfg))
        for n in ("b_tok", "b_len", "b_at", "b_gen", "b_ml", "b_ct", "b_tt", "b_src", "o_tok", "o_len", "o_dep",
                  "o_ml", "o_ct", "o_tt", "o_src", "o_shift"):
            args[f"{n}_ptr"] = _t(I64)
        yield kp.__name__, "_prepare_kernel", args
    if not ctx:
        return
    spans = sorted({context_lookup.context_span(n, cfg.context_len) for n in range(1, cfg.context_len + 1)}
                   | {cfg.context_len})
    for slot, seq in itertools.product(cfg.slot_dtypes, cfg.seq_dtypes):
        args = dict(ctx_ptr=_t(I32), ctx_gen_ptr=_t(I64), slots_ptr=_t(slot),
                    seq_ptr=_t(seq), gen_ptr=_t(I64), from_lookup_ptr=_t(U1),
                    span=Ints(spans), L=cfg.context_len, K=pw, K2=pow2(pw), N_MAX=context_lookup.N_MAX,
                    N2=pow2(context_lookup.N_MAX), N_MIN=context_lookup.N_MIN, N_LONG=pow2(context_lookup.N_LONG),
                    CH=LOOKUP_CHUNK)
        for n in ("o_tok", "o_len", "o_dep", "o_ml", "o_ct", "o_tt", "o_src"):
            args[f"{n}_ptr"] = _t(I64)
        yield kp.__name__, "_lookup_kernel", args


def _decision(cfg: LaunchConfig):
    """``decision.launch`` (``FusedDecisionStep``, from ``HybridStep.select``): survivals per drafted depth, selection
    per (depth, verify width bucket), plan per width bucket (and rows per program)."""
    from sglang_hybrid.request_bias import EPS as BIAS_EPS

    from . import decision as kd

    m, k, n_nodes = cfg.alternatives, cfg.ngram_k, cfg.n_nodes
    has_bias, ng_bias = cfg.model_bias_eta is not None, cfg.ngram_bias_eta is not None
    nt, ns = cfg.ngram_edges, cfg.ngram_shape
    has_cost = cfg.cost is not None
    has_draft = cfg.draft_cost is not None and cfg.adaptive
    n_cost = cfg.cost if has_cost else 1
    n_draft = cfg.draft_cost if has_draft else 1
    pw, steps = cfg.proposal_width, cfg.num_steps
    nd, nj = len(cfg.depths), len(cfg.widths)
    for s in cfg.depths:
        dm = cfg.depths[-1] if cfg.adaptive else s
        bb, p2, w2 = kd.select_tiles(_rows(cfg), dm, s, m, k, n_nodes)
        ac = (Ints([s * m]), Ints([m]), Ints([1])) if m else (Ints([0]),) * 3
        for draft, root in itertools.product(cfg.draft_dtypes, cfg.root_dtypes):
            yield kd.__name__, "_survivals_kernel", dict(
                conf_ptr=_t(F32), conf_s0=Ints([steps]), conf_s1=Ints([1]), temps_ptr=_t(F32), bias_ptr=_t(F32),
                **{f"{n}_ptr": _t(I64) for n in ("ml", "ct", "tt", "dp", "sr", "ng_len")},
                **{f"{n}_s{i}": Ints([(pw, 1)[i]]) for n in ("ml", "ct", "tt", "dp", "sr") for i in (0, 1)},
                ng_bias_ptr=_t(F32), de_ptr=_t(F32), me_ptr=_t(F32), re_ptr=_t(F32), ce_ptr=_t(F32),
                table_ptr=_t(F32), a_m_ptr=_t(F32), s_m_ptr=_t(F32), a_n_ptr=_t(F32), s_n_ptr=_t(F32),
                ext_ptr=_t(F32), rate_ptr=_t(F32), mtok_ptr=_t(draft), mtok_s0=Ints([s]), mtok_s1=Ints([1]),
                chain_ptr=_t(I64), chain_s0=Ints([steps]), conf_out_ptr=_t(F32), aconf_ptr=_t(F32), ac_s0=ac[0],
                ac_s1=ac[1], ac_s2=ac[2],
                s_alt_ptr=_t(F32), root_ptr=_t(root), o_tok_ptr=_t(I64), o_tok_s0=Ints(cfg.widths), B=_batches(cfg),
                COPY_CHAIN=True, COPY_CONF=cfg.model_calibration_eta is not None, S=s, K=k, DM=dm, NT=cfg.temps, M=m,
                M2=pow2(max(m, 1)), HAS_BIAS=has_bias,
                NG_HAS_BIAS=ng_bias, ADAPTIVE=cfg.adaptive, BB=bb, C2=pow2(k), N_DE=nt[0], N_ME=nt[1], N_RE=nt[2],
                N_CE=nt[3], E2=pow2(max(nt)), SH1=ns[1], SH2=ns[2], SH3=ns[3], SH4=ns[4], CAL_EPS_C=kd.CAL_EPS,
                BIAS_EPS_C=BIAS_EPS)
        for draft in cfg.draft_dtypes:
            yield kd.__name__, "_select_kernel", dict(
                mtok_ptr=_t(draft), mtok_s0=Ints([s]), mtok_s1=Ints([1]),
                msurv_ptr=_t(F32), ntok_ptr=_t(I64), ntok_s0=Ints([pw]), ntok_s1=Ints([1]), nsurv_ptr=_t(F32),
                ng_len_ptr=_t(I64), dlen_ptr=_t(I64), atok_ptr=_t(I64 if m else draft),
                at_s0=ac[0], at_s1=ac[1], at_s2=ac[2], asurv_ptr=_t(F32), csum_ptr=_t(F64), nsel_ptr=_t(I32),
                o_tok_ptr=_t(I64), o_par_ptr=_t(I64), o_anc_ptr=_t(U1), o_dep_ptr=_t(I64), o_val_ptr=_t(U1),
                o_src_ptr=_t(I8), o_surv_ptr=_t(F32), o_exp_ptr=_t(F32), B=_batches(cfg),
                S=s, DM=dm, K=k, M=m, N_NODES=n_nodes, MERGE=cfg.mode == "merge",
                KBLOCK=cfg.depths.index(s) if cfg.adaptive else 0, WIDTH=Ints(cfg.widths), BB=bb, P2=p2, W2=w2,
                UNDRAFTED_C=kd.UNDRAFTED)
        for width in cfg.widths:
            yield kd.__name__, "_plan_kernel", dict(
                csum_ptr=_t(F64), nsel_ptr=_t(I32), buckets_ptr=_t(I64), depths_ptr=_t(I64),
                **{f"{n}_ptr": _t(F32 if has_cost else F64) for n in ("sz", "sec", "sl")},
                **{f"{n}_ptr": _t(F32 if has_draft else F64) for n in ("dsz", "dsec", "dsl")},
                width_ptr=_t(I64), bstar_ptr=_t(I64), lam_ptr=_t(F32), depth_ptr=_t(I64), totals_ptr=_t(F64),
                ng_len_ptr=_t(I64), from_lookup_ptr=_t(U1 if cfg.context_len is not None else I64),
                t_val_ptr=_t(U1), t_src_ptr=_t(I8), B=_batches(cfg),
                D=nd, J=nj, W_FULL=n_nodes + 1, DJ2=pow2(max(nd * nj, 2)), BB=bb, HAS_COST=has_cost,
                HAS_DRAFT=has_draft, NS=n_cost, NS2=pow2(n_cost), NDS=n_draft, NDS2=pow2(n_draft), COUNT=True,
                HAS_LOOKUP=cfg.context_len is not None, WIDTH=width, W2=pow2(width), **_counter_slots())


def _alternatives(cfg: LaunchConfig):
    """``kernels.alternatives``: ``step_alternatives`` (``HybridStep.step_alternatives``), ``record``
    (``keep_first_alternatives``) and ``count_outcome`` (``after_verify``), with EAGLE alternatives on."""
    from sglang_hybrid.sglang_plugin import metrics as mt

    from . import alternatives as ka

    m, steps = cfg.alternatives, cfg.num_steps
    if not m:
        return
    for slot in cfg.slot_dtypes:
        yield ka.__name__, "_record_kernel", dict(
            slots_ptr=_t(slot), gens_ptr=_t(I64), p_ptr=_t(F32), p_s0=Ints([m + 1]), i_ptr=_t(I64),
            i_s0=Ints([m + 1]), t_p_ptr=_t(F32), t_i_ptr=_t(I64), t_gen_ptr=_t(I64), B=_batches(cfg),
            M1=m + 1, M2=pow2(m + 1), BB=_rows(cfg))
        for s, draft in itertools.product(cfg.depths, cfg.draft_dtypes):
            yield ka.__name__, "_alternatives_kernel", dict(
                slots_ptr=_t(slot), gens_ptr=_t(I64), t_p_ptr=_t(F32), t_i_ptr=_t(I64), t_gen_ptr=_t(I64),
                rp_ptr=_t(F32), rp_s0=Ints([steps * (m + 1)]), rp_s1=Ints([m + 1]), ri_ptr=_t(I64),
                ri_s0=Ints([steps * (m + 1)]), ri_s1=Ints([m + 1]), chain_ptr=_t(draft), ch_s0=Ints([s]),
                ch_s1=Ints([1]), o_tok_ptr=_t(I64), o_p_ptr=_t(F32), B=_batches(cfg), S=s, M=m, M2=pow2(m + 1),
                BB=_rows(cfg))
    for w, s, accept in itertools.product(cfg.tree_widths, cfg.depths, cfg.accept_dtypes):
        yield ka.__name__, "_outcome_kernel", dict(
            tok_ptr=_t(I64), dep_ptr=_t(I64), val_ptr=_t(U1), src_ptr=_t(I8), chain_ptr=_t(I64),
            ch_s0=Ints([steps]), emit_ptr=_t(I64), em_s0=Ints([w]), em_s1=Ints([1]),
            accept_ptr=_t(accept), totals_ptr=_t(F64), B=_batches(cfg), W=w, W2=pow2(w), S=s, S2=pow2(s),
            C=w, N=min(s, w), BB=_rows(cfg, 32), C_NODES=mt.ALT_NODES, C_TAKEN=mt.ALT_TAKEN)


def _verify_input(cfg: LaunchConfig):
    """``kernels.fused_links_and_mask`` (``verify_input.build_verify_input`` with ``fused``): per tree width, batch
    bucket and mask dtype."""
    from . import verify_input as kv

    for w, (b2, bs), seq, mask in itertools.product(cfg.tree_widths, _b2(cfg).items(), cfg.seq_dtypes,
                                                    cfg.mask_dtypes):
        yield kv.__name__, "_verify_input_kernel", dict(
            tok_ptr=_t(I64), val_ptr=_t(U1), anc_ptr=_t(U1), seq_ptr=_t(seq),
            draft_ptr=_t(I64), pos_ptr=_t(I64), idx_ptr=_t(I64),
            next_ptr=_t(I64, Aligns((True, False)) if w % 2 else Aligns((True,))), sib_ptr=_t(I64),
            mask_ptr=_t(mask), B=Ints(bs), W=w, W2=pow2(w), B2=b2, CH=MASK_CHUNK)


def _after_verify(cfg: LaunchConfig):
    """``kernels.fused_after_verify`` (``HybridStep.after_verify``): per tree width (the emitted tokens' too) and
    drafted depth."""
    from sglang_hybrid.sglang_plugin import metrics as m

    from . import outcome as ko

    from sglang_hybrid import online_calibration as oc
    from sglang_hybrid.calibration import CAL_EPS

    ctx = cfg.context_len is not None
    has_bias, ng_bias = cfg.model_bias_eta is not None, cfg.ngram_bias_eta is not None
    cal = cfg.model_calibration_eta is not None
    nt = cfg.temps if cal else 1
    for w, s, slot, seq, accept in itertools.product(cfg.tree_widths, cfg.depths, cfg.slot_dtypes, cfg.seq_dtypes,
                                                     cfg.accept_dtypes):
        yield ko.__name__, "_after_verify_kernel", dict(
            slots_ptr=_t(slot), seq_ptr=_t(seq), emit_ptr=_t(I64), emit_s0=Ints([w]),
            emit_s1=Ints([1]), acc_ptr=_t(accept), ring_ptr=_t(I64), ctx_ptr=_t(I32 if ctx else F64),
            chain_ptr=_t(I64), chain_s0=Ints([cfg.num_steps]), gen_ptr=_t(I64), bias_ptr=_t(F32 if has_bias else F64),
            accept_ptr=_t(F32), mb_ptr=_t(F32 if has_bias else F64), mb_gen_ptr=_t(I64 if has_bias else F64),
            **{f"{n}_ptr": _t(F32 if cal else F64) for n in ("conf", "temps", "g2")},
            ng_tok_ptr=_t(I64), ng_tok_s0=Ints([cfg.proposal_width]), ng_len_ptr=_t(I64), ng_acc_ptr=_t(F32),
            ng_used_ptr=_t(F32 if ng_bias else F64), nb_ptr=_t(F32 if ng_bias else F64),
            nb_gen_ptr=_t(I64 if ng_bias else F64), t_val_ptr=_t(U1), t_src_ptr=_t(I8), totals_ptr=_t(F64),
            B=_batches(cfg), C=w, D_EMIT=min(w, cfg.max_depth + 1), C2=pow2(w), R=cfg.ring,
            L=cfg.context_len if ctx else 1, HAS_CTX=ctx, MODEL=True, S=s, S2=pow2(s), HAS_BIAS=has_bias,
            ETA=float(cfg.model_bias_eta or 0.0), NGRAM=True, K=cfg.ngram_k, K2=pow2(cfg.ngram_k), NG_BIAS=ng_bias,
            NG_ETA=float(cfg.ngram_bias_eta or 0.0), W=w, W2=pow2(w), BB=_rows(cfg, GPU_LOOP_ROWS),
            CAL=cal, CAL_ETA=float(cfg.model_calibration_eta or 0.0), NT=nt, NT2=pow2(nt), CAL_DECAY=oc.DECAY,
            CAL_POOL=oc.POOL, W_LO=oc.W_MIN, W_HI=oc.W_MAX, CAL_EPS_C=CAL_EPS, NORM_EPS_C=oc.NORM_EPS,
            C_ACC=m.ACC["none"], C_TESTED=m.MODEL_TESTED, C_PRED=m.MODEL_PRED, C_HIT=m.MODEL_HIT,
            C_NTESTED=m.NGRAM_TESTED, C_NPRED=m.NGRAM_PRED, C_NHIT=m.NGRAM_HIT)


def _ragged(cfg: LaunchConfig):
    """``ragged_layout.pending_layout`` (``HybridWorkerV2._ragged_layout`` on the Triton backend) per batch bucket, and
    ``ragged_layout.compact_ahead`` (``PendingLayout.compact_ahead``, from the ragged verify target)."""
    from . import ragged_layout as kr

    if not (cfg.ragged and cfg.ragged_layout):
        return
    w = cfg.full_width
    for (b2, bs), seq, mask in itertools.product(_b2(cfg).items(), cfg.seq_dtypes, cfg.layout_mask_dtypes):
        yield kr.__name__, "_layout_kernel", dict(
            val_ptr=_t(U1), anc_ptr=_t(U1), seq_ptr=_t(seq), counts_ptr=_t(I64),
            index_ptr=_t(I64), qo_ptr=_t(I32), mind_ptr=_t(I64), mask_ptr=_t(mask), B=Ints(bs),
            SLOTS=Ints([cfg.max_batch]), val_s0=Ints([w]), val_s1=Ints([1]), anc_s0=Ints([w * w]),
            anc_s1=Ints([w]), anc_s2=Ints([1]), W=w, W2=pow2(w), B2=b2, CH=kr.MASK_CHUNK)
    rows = range(1, cfg.max_batch * w + 1)
    blocks = sorted({_rows(cfg, kr.GPU_COMPACT_ROWS, pow2(r)) for r in rows})
    for block, ids in itertools.product(blocks, cfg.ids_dtypes):
        yield kr.__name__, "_compact_kernel", dict(
            index_ptr=_t(I64), ids_ptr=_t(ids), pos_ptr=_t(I64),
            ids_out=_t(ids), pos_out=_t(I64), cols_out=_t(I64), N=Ints(range(w, cfg.max_batch * w + 1, w)),
            ROWS=Ints([r for r in rows if _rows(cfg, kr.GPU_COMPACT_ROWS, pow2(r)) == block]),
            ids_s=Ints([1]), pos_s=Ints([1]), BLOCK=block)


#: every launch site of the worker's step, in step order
GENERATORS = (_follow, _proposals, _alternatives, _decision, _verify_input, _ragged, _after_verify)


def _generate(cfg: LaunchConfig) -> Iterator[tuple]:
    for gen in GENERATORS:
        yield from gen(cfg)


def _ordered(module: str, name: str, args: dict, honour_flags: bool = True) -> list:
    """The arguments in the kernel's order; every parameter must be given (a launch site changed without its
    generator fails here, loudly)."""
    params = kernel_params(module, name, honour_flags)
    missing = [p.name for p in params if p.name not in args]
    extra = sorted(set(args) - {p.name for p in params})
    if missing or extra:
        raise KeyError(f"{name}: the enumeration does not match the kernel's parameters (missing {missing}, unknown "
                       f"{extra}); update kernels.variants")
    return [args[p.name] for p in params]


def _expand(values, before: bool) -> Iterable:
    """A value or tensor description's alternatives: the first only (after: what the kernels specialise on is
    constexprs, dtypes and listed alignments; the rest is not specialised), or every value by Triton's default classes
    (before: 1, a multiple of 16, any other; aligned or not)."""
    if isinstance(values, Ints):
        if not before:
            return [_v(values[0])]
        reps: dict = {}
        for v in values:
            reps.setdefault("one" if v == 1 else "d16" if v % 16 == 0 else "other", v)
        return [_v(v) for v in reps.values()]
    if isinstance(values, dict) and isinstance(values.get("aligned"), Aligns):
        options = values["aligned"] if before else values["aligned"][:1]
        return [_t(values["tensor"], a) for a in options]
    return [values if isinstance(values, dict) else _v(values)]


def _records(cfg: LaunchConfig, before: bool) -> Iterator[dict]:
    for module, name, args in _generate(cfg):
        ordered = _ordered(module, name, args)
        for combo in itertools.product(*(_expand(a, before) for a in ordered)):
            yield {"module": module, "kernel": name, "args": list(combo), "kwargs": {}}


def launch_variants(cfg: LaunchConfig) -> list:
    """Every specialisation the worker's launches can take under ``cfg``: one record (description format) per distinct
    ``key_of``, in step order. Pure: reads the configuration and the kernels' signatures, launches nothing."""
    out: dict = {}
    for rec in _records(cfg, before=False):
        out.setdefault(key_of(rec), rec)
    return list(out.values())


def variant_keys(cfg: LaunchConfig) -> set:
    """``key_of`` of every variant of ``cfg``."""
    return {key_of(r) for r in launch_variants(cfg)}


def count_before(cfg: LaunchConfig) -> int:
    """How many specialisations the same launches took before the kernels marked what they need not specialise on
    (Triton's defaults: every runtime int keyed as 1, a multiple of 16 or neither, every tensor on its alignment),
    with the batch sizes 1 .. ``max_batch`` and the strides and spans the launches pass (an estimate where those are
    correlated: each is expanded by its own classes)."""
    return len({key_of(r, honour_flags=False) for r in _records(cfg, before=True)})


def by_kernel(records: Iterable[dict]) -> dict:
    """``kernel name -> count`` of ``records``."""
    out: dict = {}
    for r in records:
        out[r["kernel"]] = out.get(r["kernel"], 0) + 1
    return dict(sorted(out.items()))


__all__ = ["LaunchConfig", "by_kernel", "count_before", "describe", "entry_kernels", "key_of", "kernel",
           "kernel_params", "launch_variants", "rebuild", "record_of", "variant_keys"]
