"""HYBRID's decision step for padded verify as three Triton kernels: survivals, per-depth selection, plan.

Why: the torch decision (``sglang_hybrid.step.DecisionStep``) dispatches hundreds of small operators between the EAGLE
draft and the verify forward; on a GPU each is a kernel launch on the critical path of every decode step. This module
computes the same ``Decision`` for the configuration the SGLang worker runs (padded verify at a host-chosen width
bucket; an EAGLE chain of full length, with or without its alternatives as leaves, and an n-gram chain; with or
without adaptive depths and cost tables) in three launches. It replaces two paths of ``DecisionStep.__call__``:
``DecisionStep._padded`` (one draft depth) and ``DecisionStep._padded_adaptive`` (adaptive drafting over depths >= 1);
the ragged paths (``_ragged``, ``_ragged_adaptive``) and a skipped model draft (depth 0) have no kernel here.

1. ``_survivals_kernel`` (grid: request blocks) fuses ``ModelCalibrationTables.acceptance``,
   ``request_bias.corrected_acceptance``, ``NgramCalibrationTables.acceptance``, ``survival.chain_survival`` (both
   chains), ``DecisionStep.alternatives_survival`` and the depth extrapolation of ``DecisionStep._depth_candidates``
   (rate ``s_last ** (1 / S)``); it also puts the root token into the tree (column 0, int64), so the selection does
   not compile per dtype of SGLang's bonus tokens (``kernels.variants``).
2. ``_select_kernel`` (grid: request blocks x candidate depths) fuses ``selector.select`` for two chains at price 0
   (pool, running minimum, merge folding, choose, ranking, output layout, ``ancestors_from_parents``), the cumulative
   survivals ``widths.choose_plan`` sums, and ``widths.truncate`` of the drafted depth's block.
3. ``_plan_kernel`` (one program) fuses the rest of ``widths.choose_plan``: goodput per (depth, width bucket) from the
   cost tables (``cost.CostTables.step_time``), the first maximum, the next slot's price, ``b*``.

Why the fusion is exact (the invariants): both drafters' proposals are chains, so every path-reduction of the torch
selector has a closed form. A chain's running minimum is a prefix minimum. Two pool nodes have the same token path
exactly when they sit at the same depth of the two chains inside their common valid prefix (a chain has one node per
depth), so merge folding is "the n-gram chain's first ``c`` nodes fold into the model's", ``c`` the length of the
common token prefix. The rank order (survival descending, depth ascending, pool index ascending over eligible nodes)
is computed by counting, for each node, the eligible nodes ahead of it: the same total order the two stable sorts
produce. A node's ancestors are the earlier nodes of its own chain plus, for an unfolded n-gram node, the shared
prefix. The EAGLE alternatives (``step.ModelDraft.alt_tokens``) keep the closed forms: each is a leaf under the
chain's previous node, distinct from its siblings and from the chain's token there (ranks of one distribution), so its
running minimum is the chain's above it capped by its own survival, nothing folds into it but the n-gram node right
after the common prefix (when it carries that leaf's token: the n-gram chain's rest then hangs under the leaf), and
its ancestors are the chain above it. Survivals are products, minima and maxima taken in the reference's order (the
chain products sequentially in float64, each rounded to float32, as torch's ``cumprod`` of a float32 tensor does on
the CPU; an alternative's likewise, its parent's float64 product times its own acceptance). Sums that decide something
(choose's gain per source, the plan's expected tokens over slots and requests, its goodput) are float64 here and in the
torch reference, so their different summing orders cannot order two alternatives differently unless they tie
within a float64 rounding step.

The torch implementation stays the reference (the oracle in ``tests/kernels/test_fused_decision.py``) and the path for
engines without Triton. Host side, a call does shape checks and allocations only: no value is read back, nothing
depends on data, so the three launches can run inside a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_hybrid.calibration import CAL_EPS
from sglang_hybrid.request_bias import EPS as BIAS_EPS
from sglang_hybrid.selector import VerifyTree
from sglang_hybrid.step import UNDRAFTED, Decision

from . import pow2
from .workspace import alloc

#: elements a Triton tensor may hold (``triton._utils.TRITON_MAX_TENSOR_NUMEL``)
MAX_TILE = 1 << 20


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _corrected(a, bias, BIAS_EPS_C: tl.constexpr):
    """``request_bias.corrected_acceptance``: ``sigmoid(logit(a) + bias)``, ``a`` clamped into (EPS, 1 - EPS); the
    model side's and the n-gram side's offset alike."""
    ac = tl.minimum(tl.maximum(a, BIAS_EPS_C), 1.0 - BIAS_EPS_C)
    return _sigmoid(tl.log(ac / (1.0 - ac)) + bias)


@triton.jit
def _pow(x, y):
    """``x ** y`` for ``x >= 0``, ``y > 0`` (``0 ** y = 0``), from exp2 and log2: libdevice's pow has no interpreter
    twin, and one formula everywhere keeps the CPU-checked code the GPU's."""
    return tl.where(x > 0.0, tl.exp2(tl.log2(tl.where(x > 0.0, x, 1.0)) * y), 0.0)


@triton.jit
def _bucket(x, edges_ptr, N_EDGES: tl.constexpr, E2: tl.constexpr):
    """``clamp(bucketize(x, edges, right=True) - 1, 0, n - 1)``: the number of edges <= x, minus one, clamped."""
    e = tl.arange(0, E2)
    edges = tl.load(edges_ptr + e, mask=e < N_EDGES, other=float("inf"))
    n_le = tl.sum((edges[None, None, :] <= x[:, :, None]).to(tl.int32), 2)
    return tl.minimum(tl.maximum(n_le - 1, 0), N_EDGES - 1)


#: ``_survivals_kernel``: the batch size and every stride are runtime ints, not specialised (``B`` is 1, a multiple
#: of 16 or neither from step to step; a row stride follows the depth, the proposal width or a size-1 dimension's
#: arbitrary stride): each program loads a few values per row over tiles of at most ``BB x C2`` elements, so a unit
#: stride or a divisible one known at compile time vectorises nothing. ``mtok_ptr`` (SGLang's draft tokens) is not
#: specialised on its alignment either: its loads are per-row gathers.
SURVIVALS_DNS = ("conf_s0", "conf_s1", "ml_s0", "ml_s1", "ct_s0", "ct_s1", "tt_s0", "tt_s1", "dp_s0", "dp_s1", "sr_s0",
                 "sr_s1", "mtok_s0", "mtok_s1", "chain_s0", "ac_s0", "ac_s1", "ac_s2", "o_tok_s0", "B")
SURVIVALS_DNA = ("mtok_ptr", "root_ptr")


@triton.jit(do_not_specialize=SURVIVALS_DNS, do_not_specialize_on_alignment=SURVIVALS_DNA)
def _survivals_kernel(
        conf_ptr, conf_s0, conf_s1, temps_ptr, bias_ptr,
        ml_ptr, ml_s0, ml_s1, ct_ptr, ct_s0, ct_s1, tt_ptr, tt_s0, tt_s1, dp_ptr, dp_s0, dp_s1, sr_ptr, sr_s0, sr_s1,
        ng_len_ptr, ng_bias_ptr,
        de_ptr, me_ptr, re_ptr, ce_ptr, table_ptr,
        a_m_ptr, s_m_ptr, a_n_ptr, s_n_ptr, ext_ptr, rate_ptr,
        mtok_ptr, mtok_s0, mtok_s1, chain_ptr, chain_s0, conf_out_ptr,
        aconf_ptr, ac_s0, ac_s1, ac_s2, s_alt_ptr, root_ptr, o_tok_ptr, o_tok_s0,
        B,
        COPY_CHAIN: tl.constexpr, COPY_CONF: tl.constexpr, S: tl.constexpr, K: tl.constexpr, DM: tl.constexpr,
        NT: tl.constexpr, M: tl.constexpr, M2: tl.constexpr,
        HAS_BIAS: tl.constexpr, NG_HAS_BIAS: tl.constexpr,
        ADAPTIVE: tl.constexpr, BB: tl.constexpr, C2: tl.constexpr,
        N_DE: tl.constexpr, N_ME: tl.constexpr, N_RE: tl.constexpr, N_CE: tl.constexpr, E2: tl.constexpr,
        SH1: tl.constexpr, SH2: tl.constexpr, SH3: tl.constexpr, SH4: tl.constexpr,
        CAL_EPS_C: tl.constexpr, BIAS_EPS_C: tl.constexpr):
    """Fuses ``DecisionStep.model_acceptance`` (with the request offset), ``DecisionStep.ngram_acceptance`` (with the
    request's n-gram offset) and ``DecisionStep.ngram_survival`` for a chain,
    ``chain_survival`` of both chains and the per-request rate of ``_depth_candidates``; with ``COPY_CHAIN``, the copy
    of the EAGLE chain that must outlive the draft graph's next replay (``HybridStep._chain``); with ``COPY_CONF``,
    the chain's draft probabilities as the calibration read them (``[B, S]`` contiguous at ``conf_out_ptr``: what the
    online temperature learns from after verify, ``online_calibration``); with ``M`` > 0,
    ``DecisionStep.alternatives_survival`` of the ``M`` alternatives at each chain position (``[B, S * M]``). It also
    writes each request's root (SGLang's bonus token: int32 after a verify, int64 after a greedy prefill) into column 0
    of the tree's tokens (``o_tok_ptr``, int64, row stride ``o_tok_s0``), where ``_select_kernel`` takes it: this
    kernel, not the selection (the step's largest compile), is the one compiled per root dtype."""
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rows < B
    r64 = rows.to(tl.int64)
    tl.store(o_tok_ptr + r64 * o_tok_s0, tl.load(root_ptr + rows, mask=rmask, other=0).to(tl.int64), mask=rmask)
    # ---- model side: calibrated acceptance, request offset, chain survival (sequential product, as cumprod) ----
    # the product runs in float64 and each survival is that rounded to float32, the chain's and its alternatives'
    # alike (survival.chain_survival, DecisionStep.alternatives_survival): a float32 product drifts from it by an ulp
    # in a quarter of the nodes, and a chain token and an equally likely alternative beside it must tie exactly, or
    # the last bits of their acceptance order them differently here and in the reference
    surv = tl.full((BB,), 1.0, tl.float32)
    prod = tl.full((BB,), 1.0, tl.float64)
    last = tl.zeros((BB,), tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rows, mask=rmask, other=0.0)
    for j in tl.static_range(S):
        p = tl.load(conf_ptr + r64 * conf_s0 + j * conf_s1, mask=rmask, other=0.0).to(tl.float32)
        p = tl.minimum(tl.maximum(p, 0.0), 1.0)
        t = tl.load(temps_ptr + (j if j < NT else NT - 1))
        pc = tl.minimum(tl.maximum(p, CAL_EPS_C), 1.0 - CAL_EPS_C)
        a = _sigmoid((tl.log(pc) - tl.log(1.0 - pc)) / t)
        a = tl.where(p <= 0.0, 0.0, tl.where(p >= 1.0, 1.0, a))
        if HAS_BIAS:
            a = _corrected(a, bias, BIAS_EPS_C)
        if M > 0:
            # the alternatives at this position: the same calibration and offset, times the parent's survival
            mm = tl.arange(0, M2)
            amask = rmask[:, None] & (mm[None, :] < M)
            pa = tl.load(aconf_ptr + r64[:, None] * ac_s0 + j * ac_s1 + mm[None, :] * ac_s2, mask=amask,
                         other=0.0).to(tl.float32)
            pa = tl.minimum(tl.maximum(pa, 0.0), 1.0)
            pca = tl.minimum(tl.maximum(pa, CAL_EPS_C), 1.0 - CAL_EPS_C)
            aa = _sigmoid((tl.log(pca) - tl.log(1.0 - pca)) / t)
            aa = tl.where(pa <= 0.0, 0.0, tl.where(pa >= 1.0, 1.0, aa))
            if HAS_BIAS:
                aa = _corrected(aa, bias[:, None], BIAS_EPS_C)
            tl.store(s_alt_ptr + r64[:, None] * (S * M) + j * M + mm[None, :],
                     (prod[:, None] * aa.to(tl.float64)).to(tl.float32), mask=amask)
        prod = prod * a.to(tl.float64)
        surv = prod.to(tl.float32)
        if COPY_CHAIN:
            tok = tl.load(mtok_ptr + r64 * mtok_s0 + j * mtok_s1, mask=rmask, other=0)
            tl.store(chain_ptr + r64 * chain_s0 + j, tok, mask=rmask)
        if COPY_CONF:
            tl.store(conf_out_ptr + r64 * S + j, p, mask=rmask)
        tl.store(a_m_ptr + r64 * S + j, a, mask=rmask)
        tl.store(s_m_ptr + r64 * S + j, surv, mask=rmask)
        if ADAPTIVE:
            tl.store(ext_ptr + r64 * DM + j, surv, mask=rmask)
        last = surv
    # ---- depth extrapolation: rate = s_last ** (1 / S); s_j = s_last * rate ** (j - S + 1) past the drafted depth ----
    if ADAPTIVE:
        last = tl.maximum(last, 0.0)
        # torch's pow with a scalar exponent takes these exact shortcuts: 1 -> the value, 0.5 -> sqrt
        if S == 1:
            rate = last
        elif S == 2:
            rate = tl.sqrt_rn(last)
        else:
            rate = _pow(last, 1.0 / S)
        tl.store(rate_ptr + rows, rate, mask=rmask)
        for j in tl.static_range(S, DM):
            e = tl.full((BB,), j - (S - 1), tl.float32)
            tl.store(ext_ptr + r64 * DM + j, last * _pow(rate, e), mask=rmask)
    # ---- n-gram side: one bucketized table lookup per node, then the chain product ----
    cols = tl.arange(0, C2)
    fmask = rmask[:, None] & (cols[None, :] < K)
    r2 = r64[:, None]
    c2 = cols[None, :]
    ng_len = tl.load(ng_len_ptr + rows, mask=rmask, other=0)
    valid = fmask & (cols[None, :] < ng_len[:, None])
    ml = tl.load(ml_ptr + r2 * ml_s0 + c2 * ml_s1, mask=fmask, other=0).to(tl.float32)
    cf = tl.load(ct_ptr + r2 * ct_s0 + c2 * ct_s1, mask=fmask, other=0).to(tl.float32)
    tf = tl.load(tt_ptr + r2 * tt_s0 + c2 * tt_s1, mask=fmask, other=0).to(tl.float32)
    dp = tl.load(dp_ptr + r2 * dp_s0 + c2 * dp_s1, mask=fmask, other=0).to(tl.float32)
    src = tl.load(sr_ptr + r2 * sr_s0 + c2 * sr_s1, mask=fmask, other=0)
    ratio = tl.where(tf > 0.0, tl.math.div_rn(cf, tl.maximum(tf, 1.0)), 0.0)
    idx = tl.minimum(tl.maximum(src, 0), 1).to(tl.int64)
    idx = idx * SH1 + _bucket(dp, de_ptr, N_DE, E2)
    idx = idx * SH2 + _bucket(ml, me_ptr, N_ME, E2)
    idx = idx * SH3 + _bucket(ratio, re_ptr, N_RE, E2)
    idx = idx * SH4 + _bucket(cf, ce_ptr, N_CE, E2)
    a_n = tl.load(table_ptr + idx, mask=fmask, other=0.0)
    if NG_HAS_BIAS:
        a_n = _corrected(a_n, tl.load(ng_bias_ptr + rows, mask=rmask, other=0.0)[:, None], BIAS_EPS_C)
    a_n = tl.where(valid, a_n, 0.0)
    tl.store(a_n_ptr + r64[:, None] * K + cols[None, :], a_n, mask=fmask)
    s_n = tl.cumprod(a_n.to(tl.float64), 1).to(tl.float32)                # as the model chain's
    tl.store(s_n_ptr + r64[:, None] * K + cols[None, :], tl.where(valid, s_n, 0.0), mask=fmask)


#: ``_select_kernel``: batch size and strides as in ``_survivals_kernel``, and ``WIDTH``, the step's verify width
#: bucket: a runtime int that only masks and strides the stores of the truncated tree (the tiles are ``W2`` wide, the
#: full width's power of two), so the selection, the step's largest compile, is compiled once per drafted depth, not
#: once per (depth, width). The draft tokens (SGLang's, and ``atok_ptr``, which is the draft tokens when there are no
#: alternatives) are not specialised on their alignment: the pool's token loads are gathers at computed depths. The
#: root is read from the tokens' column 0, where ``_survivals_kernel`` wrote it as int64, so the bonus tokens' dtype
#: does not multiply this kernel's compiles either.
SELECT_DNS = ("mtok_s0", "mtok_s1", "ntok_s0", "ntok_s1", "at_s0", "at_s1", "at_s2", "B", "WIDTH")
SELECT_DNA = ("mtok_ptr", "atok_ptr")


@triton.jit(do_not_specialize=SELECT_DNS, do_not_specialize_on_alignment=SELECT_DNA)
def _select_kernel(
        mtok_ptr, mtok_s0, mtok_s1, msurv_ptr, ntok_ptr, ntok_s0, ntok_s1, nsurv_ptr, ng_len_ptr, dlen_ptr,
        atok_ptr, at_s0, at_s1, at_s2, asurv_ptr,
        csum_ptr, nsel_ptr,
        o_tok_ptr, o_par_ptr, o_anc_ptr, o_dep_ptr, o_val_ptr, o_src_ptr, o_surv_ptr, o_exp_ptr,
        B,
        S: tl.constexpr, DM: tl.constexpr, K: tl.constexpr, M: tl.constexpr, N_NODES: tl.constexpr,
        MERGE: tl.constexpr, KBLOCK: tl.constexpr, WIDTH, BB: tl.constexpr, P2: tl.constexpr,
        W2: tl.constexpr, UNDRAFTED_C: tl.constexpr):
    """Fuses ``selector.select(root, [model chain (with its alternatives), n-gram chain], 0.0, mode)`` for one
    candidate depth, the cumulative draft survivals of ``widths.choose_plan``, and (for the drafted depth's block)
    ``widths.truncate``."""
    pid_d = tl.program_id(1)
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rows < B
    r64 = rows.to(tl.int64)
    len_m = tl.load(dlen_ptr + pid_d)                                    # model chain length at this depth
    len_n = tl.minimum(tl.load(ng_len_ptr + rows, mask=rmask, other=0), K)

    # ---- the pool, in the torch selector's order: the model chain (DM nodes), its alternatives (S * M leaves,
    # position-major: step._with_alternatives), the n-gram chain (K nodes); q = depth - 1 ----
    MA = S * M
    p = tl.arange(0, P2)
    is_m = p < DM
    is_a = (p >= DM) & (p < DM + MA)
    is_n = (p >= DM + MA) & (p < DM + MA + K)
    a_i = tl.where(is_a, p - DM, 0)                                      # leaf index: position * M + rank
    q = tl.where(is_m, p, tl.where(is_a, a_i // (M if M > 0 else 1), p - DM - MA))
    in_m = is_m[None, :] & (q[None, :] < len_m) & rmask[:, None]
    in_n = is_n[None, :] & (q[None, :] < len_n[:, None]) & rmask[:, None]
    # an alternative exists where its chain position was drafted (step._with_alternatives: < min(length, S))
    in_a = is_a[None, :] & (q[None, :] < tl.minimum(len_m, S)) & rmask[:, None]
    valid = in_m | in_n | in_a
    # the model and n-gram chains at every node's depth: the node itself, its partner (folding), a leaf's sibling
    pm = (q[None, :] < DM) & (q[None, :] < len_m) & rmask[:, None]
    pn = (q[None, :] < K) & (q[None, :] < len_n[:, None]) & rmask[:, None]
    tok_m = tl.load(mtok_ptr + r64[:, None] * mtok_s0 + q[None, :] * mtok_s1, mask=pm & (q[None, :] < S), other=0)
    tok_m = tl.where(q[None, :] < S, tok_m.to(tl.int64), q[None, :].to(tl.int64) + UNDRAFTED_C)
    tok_n = tl.load(ntok_ptr + r64[:, None] * ntok_s0 + q[None, :] * ntok_s1, mask=pn, other=0).to(tl.int64)
    sv_m = tl.load(msurv_ptr + r64[:, None] * DM + q[None, :], mask=pm, other=0.0)
    sv_n = tl.load(nsurv_ptr + r64[:, None] * K + q[None, :], mask=pn, other=0.0)
    # running minimum along each chain (selector: path_min) at every node's depth
    chain_le = is_m[None, :] & (q[None, :] <= q[:, None])                                       # [P, P']
    ngram_le = is_n[None, :] & (q[None, :] <= q[:, None])
    sel_m = tl.where(pm, sv_m, 0.0)
    sel_n = tl.where(pn, sv_n, 0.0)
    cm_m = tl.min(tl.where(chain_le[None, :, :], sel_m[:, None, :], float("inf")), 2)
    cm_n = tl.min(tl.where(ngram_le[None, :, :], sel_n[:, None, :], float("inf")), 2)
    tok = tl.where(is_m[None, :], tok_m, tok_n)
    surv = tl.where(is_m[None, :], cm_m, cm_n)
    if M > 0:
        # a leaf: its own survival (the parent's included), capped by the running minimum of the chain above it
        tok_a = tl.load(atok_ptr + r64[:, None] * at_s0 + (a_i // M)[None, :] * at_s1 + (a_i % M)[None, :] * at_s2,
                        mask=in_a, other=0).to(tl.int64)
        sv_a = tl.load(asurv_ptr + r64[:, None] * MA + a_i[None, :], mask=in_a, other=0.0)
        chain_lt = is_m[None, :] & (q[None, :] < q[:, None])
        cm_par = tl.min(tl.where(chain_lt[None, :, :], sel_m[:, None, :], float("inf")), 2)
        tok = tl.where(is_a[None, :], tok_a, tok)
        surv = tl.where(is_a[None, :], tl.minimum(cm_par, sv_a), surv)
    surv = tl.where(valid, surv, 0.0)
    src = tl.where(is_n[None, :], 1, 0)
    if MERGE:
        # folding (selector._fold_identical_paths for a chain with leaves and a chain): the n-gram chain's first c
        # nodes (the common token prefix) fold into the model chain's; the next one, when a leaf at that depth has
        # its token (the alternatives are distinct, so at most one), folds into that leaf (f = 1)
        eq = pm & pn & (tok_m == tok_n) & is_m[None, :]
        eq_i = tl.where(is_m[None, :], eq.to(tl.int32), 1)
        run = tl.min(tl.where(chain_le[None, :, :], eq_i[:, None, :], 1), 2)               # all equal up to q
        c = tl.sum(tl.where(is_m[None, :], run, 0), 1)                                    # [BB]
        folded = q[None, :] < c[:, None]
        surv = tl.where(is_m[None, :] & folded, tl.maximum(cm_m, tl.where(pn, cm_n, 0.0)), surv)
        src = tl.where(is_m[None, :] & folded, 2, src)
        if M > 0:
            fold_a = in_a & (q[None, :] == c[:, None]) & pn & (tok_a == tok_n)
            f = tl.max(fold_a.to(tl.int32), 1)                                            # [BB] 0 or 1
            leaf_p = tl.sum(tl.where(fold_a, p[None, :], 0), 1)
            surv = tl.where(fold_a, tl.maximum(surv, cm_n), surv)
            src = tl.where(fold_a, 2, src)
            folded = q[None, :] < (c + f)[:, None]
        else:
            fold_a = in_a & (q[None, :] < 0)
            f = tl.zeros((BB,), tl.int32)
            leaf_p = tl.zeros((BB,), tl.int32)
        valid = valid & ~(is_n[None, :] & folded)
        surv = tl.where(valid, surv, 0.0)
    else:
        c = tl.zeros((BB,), tl.int32)
        f = tl.zeros((BB,), tl.int32)
        leaf_p = tl.zeros((BB,), tl.int32)
        fold_a = in_a & (q[None, :] < 0)
    depth = tl.where(valid, q[None, :] + 1, 0)
    elig = valid & (surv > 0.0)
    if not MERGE:
        # choose: the source with the larger sum of eligible survivals supplies all its nodes (ties: the model, whose
        # nodes are the chain and its leaves)
        g_m = tl.sum(tl.where(elig & ~is_n[None, :], surv, 0.0).to(tl.float64), 1)
        g_n = tl.sum(tl.where(elig & is_n[None, :], surv, 0.0).to(tl.float64), 1)
        use_m = g_m >= g_n
        elig = elig & (~is_n[None, :] == use_m[:, None])

    # ---- rank: eligible nodes ahead of each node (survival desc, depth asc, pool index asc) ----
    s_i = surv[:, :, None]
    s_j = surv[:, None, :]
    d_i = depth[:, :, None]
    d_j = depth[:, None, :]
    ahead = (s_j > s_i) | ((s_j == s_i) & ((d_j < d_i) | ((d_j == d_i) & (p[None, None, :] < p[None, :, None]))))
    rank = tl.sum((ahead & elig[:, None, :]).to(tl.int32), 2)                                # [BB, P]
    n_sel = tl.minimum(tl.sum(elig.to(tl.int32), 1), N_NODES)
    tl.store(nsel_ptr + pid_d * B + rows, n_sel, mask=rmask)

    # ---- output slots: slot o >= 1 holds the node of rank o - 1 ----
    o = tl.arange(0, W2)
    hit = elig[:, None, :] & (rank[:, None, :] == (o[None, :, None] - 1)) & \
        ((o[None, :, None] - 1) < n_sel[:, None, None])                                        # [BB, W, P]
    out_valid = tl.sum(hit.to(tl.int32), 2) > 0
    hit64 = hit.to(tl.int64)
    kind = tl.where(is_m, 0, tl.where(is_a, 1, 2))                  # chain, leaf, n-gram
    o_tok = tl.sum(hit64 * tok[:, None, :], 2)
    o_q = tl.sum(hit64 * q[None, None, :].to(tl.int64), 2)
    o_kind = tl.sum(hit64 * kind[None, None, :].to(tl.int64), 2)
    o_src = tl.sum(hit64 * src[:, None, :].to(tl.int64), 2)
    o_surv = tl.sum(tl.where(hit, surv[:, None, :], 0.0), 2)
    o_dep = tl.sum(hit64 * depth[:, None, :].to(tl.int64), 2)
    # parent: the chain's previous node (a chain node's, a leaf's), the previous n-gram node, the root at depth 1;
    # the first unfolded n-gram node hangs off the leaf it folded into, else the end of the shared prefix
    par_p = tl.where(q == 0, -1, tl.where(is_a, q - 1, p - 1))
    first_n = is_n[None, :] & (q[None, :] == (c + f)[:, None])
    par_p = tl.where(first_n, tl.where(f[:, None] > 0, leaf_p[:, None], c[:, None] - 1), par_p[None, :])
    par_rank = tl.sum(tl.where(p[None, None, :] == par_p[:, :, None], rank[:, None, :], 0), 2)
    o_par = tl.sum(tl.where(hit, tl.where(par_p >= 0, par_rank + 1, 0)[:, None, :], 0), 2).to(tl.int64)

    root = tl.load(o_tok_ptr + r64 * WIDTH, mask=rmask, other=0)          # written by _survivals_kernel
    is_root = o[None, :] == 0
    o_tok = tl.where(is_root, root[:, None], tl.where(out_valid, o_tok, -1))
    o_par = tl.where(out_valid, o_par, -1)
    o_dep = tl.where(out_valid, o_dep, 0)
    o_src = tl.where(out_valid, o_src, -1)
    o_surv = tl.where(is_root, 1.0, tl.where(out_valid, o_surv, 0.0))
    o_val = is_root | out_valid

    # ---- the plan's cumulative draft survivals over slots (choose_plan: drafts only, slot 0 counts 0) ----
    w_full = N_NODES + 1
    o_cs = tl.cumsum(tl.where(is_root, 0.0, o_surv).to(tl.float64), 1)
    cmask = rmask[:, None] & (o[None, :] < w_full)
    tl.store(csum_ptr + (pid_d * B + r64[:, None]) * w_full + o[None, :], o_cs, mask=cmask)

    # ---- the drafted depth's tree, truncated to this step's width ----
    if pid_d == KBLOCK:
        wmask = rmask[:, None] & (o[None, :] < WIDTH)
        base = r64[:, None] * WIDTH + o[None, :]
        tl.store(o_tok_ptr + base, o_tok, mask=wmask)
        tl.store(o_par_ptr + base, o_par, mask=wmask)
        tl.store(o_dep_ptr + base, o_dep, mask=wmask)
        tl.store(o_val_ptr + base, o_val, mask=wmask)
        tl.store(o_src_ptr + base, o_src.to(tl.int8), mask=wmask)
        tl.store(o_surv_ptr + base, o_surv, mask=wmask)
        tl.store(o_exp_ptr + rows, tl.sum(tl.where(o[None, :] < WIDTH, tl.where(is_root, 0.0, o_surv), 0.0), 1),
                 mask=rmask)
        # ancestors (reflexive): a chain node's are the chain up to it, a leaf's the chain above it, an unfolded
        # n-gram node's the shared prefix, the leaf it folded into and its own chain up to it; the root, everyone's
        q1 = o_q[:, :, None]
        q2 = o_q[:, None, :]
        k1 = o_kind[:, :, None]
        k2 = o_kind[:, None, :]
        o_fl = tl.sum(hit64 * fold_a.to(tl.int64)[:, None, :], 2) > 0                           # the folded leaf
        draft_pair = out_valid[:, :, None] & out_valid[:, None, :]
        on_chain = (k2 == 0) & (((k1 == 0) & (q2 <= q1)) | ((k1 == 1) & (q2 < q1)) |
                                ((k1 == 2) & (q2 < c[:, None, None])))
        on_ngram = (k1 == 2) & (((k2 == 2) & (q2 <= q1)) | ((k2 == 1) & o_fl[:, None, :]))
        anc = draft_pair & (on_chain | on_ngram)
        anc = anc | ((o[None, None, :] == 0) & o_val[:, :, None]) | (o[None, :, None] == o[None, None, :])
        amask = rmask[:, None, None] & (o[None, :, None] < WIDTH) & (o[None, None, :] < WIDTH)
        tl.store(o_anc_ptr + (r64[:, None, None] * WIDTH + o[None, :, None]) * WIDTH + o[None, None, :], anc,
                 mask=amask)


@triton.jit
def tree_class(val_ptr, src_ptr, rows, rm, o, WIDTH: tl.constexpr):
    """``metrics.tree_class`` of the tree rows ``rows`` (``[B, WIDTH]`` validity and sources): 0 none, 1 model,
    2 ngram, 3 mixed (a shared node, or nodes of both sources). Returns ``(valid [BB, W2], class [BB])``."""
    m2 = rm[:, None] & (o[None, :] < WIDTH)
    at = rows.to(tl.int64)[:, None] * WIDTH + o[None, :]
    val = tl.load(val_ptr + at, mask=m2, other=0) != 0
    src = tl.load(src_ptr + at, mask=m2, other=-1).to(tl.int32)
    draft = val & (o[None, :] > 0)
    has_m = tl.max((draft & (src == 0)).to(tl.int32), 1) > 0
    has_n = tl.max((draft & (src == 1)).to(tl.int32), 1) > 0
    has_s = tl.max((draft & (src == 2)).to(tl.int32), 1) > 0
    return val, tl.where(has_s | (has_m & has_n), 3, tl.where(has_n, 2, tl.where(has_m, 1, 0)))


@triton.jit
def _step_time(n, sizes_ptr, seconds_ptr, slope_ptr, NS: tl.constexpr, NS2: tl.constexpr):
    """``CostTables.step_time``: piecewise linear, flat below the first size, last slope past the last."""
    e = tl.arange(0, NS2)
    sizes = tl.load(sizes_ptr + e, mask=e < NS, other=float("inf"))
    seg = tl.sum((sizes[None, :] <= n[:, None]).to(tl.int32), 1)
    left = tl.maximum(seg - 1, 0)
    x0 = tl.load(sizes_ptr + left)
    y0 = tl.load(seconds_ptr + left)
    slope = tl.load(slope_ptr + seg)
    return y0 + slope * tl.maximum(n - x0, 0.0)


#: ``_plan_kernel``: the batch size only bounds its loops over the batch (one program): not specialised.
PLAN_DNS = ("B",)


@triton.jit(do_not_specialize=PLAN_DNS)
def _plan_kernel(
        csum_ptr, nsel_ptr, buckets_ptr, depths_ptr,
        sz_ptr, sec_ptr, sl_ptr, dsz_ptr, dsec_ptr, dsl_ptr,
        width_ptr, bstar_ptr, lam_ptr, depth_ptr,
        totals_ptr, ng_len_ptr, from_lookup_ptr, t_val_ptr, t_src_ptr,
        B,
        D: tl.constexpr, J: tl.constexpr, W_FULL: tl.constexpr, DJ2: tl.constexpr, BB: tl.constexpr,
        HAS_COST: tl.constexpr, HAS_DRAFT: tl.constexpr, NS: tl.constexpr, NS2: tl.constexpr,
        NDS: tl.constexpr, NDS2: tl.constexpr,
        COUNT: tl.constexpr, HAS_LOOKUP: tl.constexpr, WIDTH: tl.constexpr, W2: tl.constexpr,
        C_STEPS: tl.constexpr, C_LAM: tl.constexpr, C_BSTAR: tl.constexpr, C_AVAIL: tl.constexpr,
        C_NODES: tl.constexpr, C_REQS: tl.constexpr, C_SLOTS: tl.constexpr, C_LOOKUP: tl.constexpr,
        C_CLASS: tl.constexpr):
    """Fuses ``widths.choose_plan`` (every (depth, width bucket) pair flattened depth-major into one axis) and, with
    ``COUNT``, the device share of ``HybridCounters.on_select`` over the step's tree (one program: no atomics, the
    same float64 additions as the torch counters)."""
    f = tl.arange(0, DJ2)
    fmask = f < D * J
    d = f // J
    j = f % J
    bw_i = tl.load(buckets_ptr + j, mask=fmask, other=1)
    col = tl.minimum(tl.maximum(bw_i - 1, 0), W_FULL - 1)
    acc = tl.zeros((DJ2,), tl.float64)
    for b0 in range(0, B, BB):
        rows = b0 + tl.arange(0, BB)
        m = fmask[:, None] & (rows[None, :] < B)
        v = tl.load(csum_ptr + (d[:, None].to(tl.int64) * B + rows[None, :]) * W_FULL + col[:, None], mask=m,
                    other=0.0)
        acc += tl.sum(v, 1)
    r = B * 1.0
    r64 = r.to(tl.float64)
    expected = r64 + acc
    bw = bw_i.to(tl.float32)
    if HAS_COST:
        if HAS_DRAFT:
            t_draft = tl.sum(_step_time(tl.zeros((1,), tl.float32) + r, dsz_ptr, dsec_ptr, dsl_ptr, NDS, NDS2), 0)
        else:
            t_draft = tl.sum(tl.zeros((1,), tl.float32), 0)
        dv = tl.load(depths_ptr + d, mask=fmask, other=0).to(tl.float64)
        t = _step_time(r * bw, sz_ptr, sec_ptr, sl_ptr, NS, NS2).to(tl.float64) + dv * t_draft.to(tl.float64)
        g = expected / t
        g_max = tl.max(tl.where(fmask, g, float("-inf")), 0)
        best = tl.min(tl.where(fmask & (g == g_max), f, DJ2), 0)                 # first maximum, depth-major
        d_i = best // J
        j_i = best % J
        nxt = tl.minimum(j_i + 1, J - 1)
        t_j = tl.sum(tl.where(f == best, t, 0.0), 0)
        t_n = tl.sum(tl.where(f == d_i * J + nxt, t, 0.0), 0)
        w_j = tl.load(buckets_ptr + j_i).to(tl.float64)
        w_n = tl.load(buckets_ptr + nxt).to(tl.float64)
        extra = r64 * (w_n - w_j)
        lam = tl.where(extra > 0.0, g_max * (t_n - t_j) / tl.maximum(extra, 1.0), 0.0).to(tl.float32)
    else:
        # no step time: the deepest draft, and the narrowest bucket holding every request's useful nodes
        d_i = D - 1
        most = tl.zeros((BB,), tl.int32)
        for b0 in range(0, B, BB):
            rows = b0 + tl.arange(0, BB)
            most = tl.maximum(most, tl.load(nsel_ptr + (D - 1) * B + rows, mask=rows < B, other=0))
        useful = tl.max(most, 0) + 1
        jj = tl.arange(0, DJ2)
        bws = tl.load(buckets_ptr + jj, mask=jj < J, other=0)
        j_i = tl.min(tl.where((jj < J) & (bws >= useful), jj, J - 1), 0)
        lam = tl.sum(tl.zeros((1,), tl.float32), 0)
    width = tl.load(buckets_ptr + j_i)
    b_star = B * (width - 1)
    tl.store(width_ptr, width)
    tl.store(bstar_ptr, b_star)
    tl.store(lam_ptr, lam)
    tl.store(depth_ptr, tl.load(depths_ptr + d_i))
    if COUNT:
        # metrics.tree_class per request: none, model, ngram, mixed (a shared node, or both sources)
        o = tl.arange(0, W2)
        c4 = tl.arange(0, 4)
        classes = tl.zeros((4,), tl.int32)
        nodes = tl.zeros((), tl.int32)
        avail = tl.zeros((), tl.int32)
        looked = tl.zeros((), tl.int32)
        for b0 in range(0, B, BB):
            rows = b0 + tl.arange(0, BB)
            rm = rows < B
            val, cls = tree_class(t_val_ptr, t_src_ptr, rows, rm, o, WIDTH)
            classes += tl.sum(((cls[:, None] == c4[None, :]) & rm[:, None]).to(tl.int32), 0)
            nodes += tl.sum(val.to(tl.int32), 1).sum(0)
            avail += tl.sum(((tl.load(ng_len_ptr + rows, mask=rm, other=0) > 0) & rm).to(tl.int32), 0)
            if HAS_LOOKUP:
                looked += tl.sum((tl.load(from_lookup_ptr + rows, mask=rm, other=0) != 0).to(tl.int32), 0)
        tl.store(totals_ptr + C_STEPS, tl.load(totals_ptr + C_STEPS) + 1.0)
        tl.store(totals_ptr + C_LAM, tl.load(totals_ptr + C_LAM) + lam.to(tl.float64))
        tl.store(totals_ptr + C_BSTAR, tl.load(totals_ptr + C_BSTAR) + b_star.to(tl.float64))
        tl.store(totals_ptr + C_AVAIL, tl.load(totals_ptr + C_AVAIL) + avail.to(tl.float64))
        tl.store(totals_ptr + C_NODES, tl.load(totals_ptr + C_NODES) + (nodes - B).to(tl.float64))
        tl.store(totals_ptr + C_REQS, tl.load(totals_ptr + C_REQS) + B * 1.0)
        tl.store(totals_ptr + C_SLOTS, tl.load(totals_ptr + C_SLOTS) + B * WIDTH * 1.0)
        if HAS_LOOKUP:
            tl.store(totals_ptr + C_LOOKUP, tl.load(totals_ptr + C_LOOKUP) + looked.to(tl.float64))
        cp = totals_ptr + C_CLASS + c4
        tl.store(cp, tl.load(cp) + classes.to(tl.float64))


def _table_size(cost) -> int:
    """Entries of a cost table (1 for none: the kernel's table arguments are then unread placeholders)."""
    return cost.sizes.numel() if cost is not None else 1


def _counter_slots() -> dict:
    from sglang_hybrid.sglang_plugin import metrics as m

    return dict(C_STEPS=m.STEPS, C_LAM=m.LAM, C_BSTAR=m.BSTAR, C_AVAIL=m.NGRAM_AVAIL, C_NODES=m.NODES, C_REQS=m.REQS,
                C_SLOTS=m.SLOTS, C_LOOKUP=m.NGRAM_LOOKUP, C_CLASS=m.REQ["none"])


#: where ``HybridCounters`` keeps each total (its layout, read once)
_COUNTER_SLOTS = _counter_slots()


def select_tiles(block_rows: int, dm: int, s: int, m: int, k: int, n_nodes: int) -> tuple:
    """``(rows per program, P2, W2)`` of a decision whose pool holds ``dm`` model-chain nodes, ``s * m`` alternatives
    and ``k`` n-gram nodes: the selection's largest tiles are rows x pool x max(pool, width), kept within Triton's
    tensor limit (wide trees, e.g. many EAGLE alternatives, on the interpreter's whole-batch programs) by halving
    ``block_rows``. Shared by ``launch`` and the start-up enumeration (``kernels.variants``)."""
    p2, w2 = pow2(dm + s * m + k), pow2(n_nodes + 1)
    while block_rows > 1 and block_rows * p2 * max(p2, w2) > MAX_TILE:
        block_rows //= 2
    return block_rows, p2, w2


def launch(*, root, model_tokens, model_conf, bias, ngram_bias, ng_tokens, ng_len, ng_match_len, ng_count, ng_total,
           ng_depth, ng_source, temps, ngram_tables, buckets, depths: tuple, depths_t, cost, draft_cost, mode: str,
           n_nodes: int, width: int, block_rows: int, counters=None, from_lookup=None, chain_out=None,
           workspace=None, alt_tokens=None, alt_conf=None, conf_out=None) -> Decision:
    """Run the three kernels; every argument already validated by ``FusedDecisionStep`` (shapes, devices, dtypes).
    ``bias`` / ``ngram_bias``: the requests' online offsets on the model / n-gram side (``[B]`` float32, or None).
    ``depths``: the candidate depths as host ints (one entry when the engine does not draft adaptively).
    ``counters``: a ``HybridCounters`` whose device totals the plan kernel adds the step to (``from_lookup``: the rows
    the prompt lookup supplied, or None). ``chain_out``: ``[B, S]`` (row stride free) to copy the EAGLE chain into;
    ``conf_out``: ``[B, S]`` contiguous float32 to copy its draft probabilities into (clamped into [0, 1]).
    ``workspace`` (``kernels.workspace.Workspace``): where the outputs live (None: fresh tensors). ``alt_tokens`` /
    ``alt_conf`` (``[B, S, M]`` or None): the EAGLE alternatives (``step.ModelDraft.alt_tokens``), distinct from
    each other and from the chain token at their position."""
    b, s = model_tokens.shape
    m = alt_tokens.shape[2] if alt_tokens is not None else 0
    k = ng_tokens.shape[1]
    dev = root.device
    adaptive = len(depths) > 1
    dm = depths[-1] if adaptive else s
    nd = len(depths)
    kblock = depths.index(s)
    f32, i64 = torch.float32, torch.int64
    ws = workspace
    a_m = alloc(ws, "a_m", (b, s), f32, dev)
    s_m = alloc(ws, "s_m", (b, s), f32, dev)
    s_n = alloc(ws, "s_n", (b, k), f32, dev)
    a_n = alloc(ws, "a_n", (b, k), f32, dev)
    ext = alloc(ws, "ext", (b, dm), f32, dev) if adaptive else s_m
    rate = alloc(ws, "rate", (b,), f32, dev) if adaptive else None
    s_alt = alloc(ws, "s_alt", (b, s * m), f32, dev) if m else s_m
    ac = alt_conf if m else model_conf
    at = alt_tokens if m else model_tokens
    ac_strides = tuple(ac.stride()) if m else (0, 0, 0)
    at_strides = tuple(at.stride()) if m else (0, 0, 0)
    nt = ngram_tables
    block_rows, p2, w2 = select_tiles(block_rows, dm, s, m, k, n_nodes)
    # the tree's tokens: the survivals kernel writes each root into column 0, the selection the rest
    tokens = alloc(ws, "tokens", (b, width), i64, dev)
    grid_b = triton.cdiv(b, block_rows)
    e2 = pow2(max(nt.depth_edges.numel(), nt.match_edges.numel(), nt.ratio_edges.numel(), nt.count_edges.numel()))
    _survivals_kernel[(grid_b,)](
        model_conf, *model_conf.stride(), temps, bias if bias is not None else a_m,
        ng_match_len, *ng_match_len.stride(), ng_count, *ng_count.stride(), ng_total, *ng_total.stride(),
        ng_depth, *ng_depth.stride(), ng_source, *ng_source.stride(), ng_len,
        ngram_bias if ngram_bias is not None else a_m,
        nt.depth_edges, nt.match_edges, nt.ratio_edges, nt.count_edges, nt.table,
        a_m, s_m, a_n, s_n, ext, rate if rate is not None else a_m,
        model_tokens, *model_tokens.stride(), chain_out if chain_out is not None else model_tokens,
        chain_out.stride(0) if chain_out is not None else 0, conf_out if conf_out is not None else a_m,
        ac, *ac_strides, s_alt, root, tokens, tokens.stride(0),
        b,
        COPY_CHAIN=chain_out is not None, COPY_CONF=conf_out is not None, S=s, K=k, DM=dm, NT=temps.numel(), M=m,
        M2=pow2(max(m, 1)),
        HAS_BIAS=bias is not None,
        NG_HAS_BIAS=ngram_bias is not None, ADAPTIVE=adaptive, BB=block_rows, C2=pow2(k),
        N_DE=nt.depth_edges.numel(), N_ME=nt.match_edges.numel(), N_RE=nt.ratio_edges.numel(),
        N_CE=nt.count_edges.numel(), E2=e2, SH1=nt.shape[1], SH2=nt.shape[2], SH3=nt.shape[3], SH4=nt.shape[4],
        CAL_EPS_C=CAL_EPS, BIAS_EPS_C=BIAS_EPS)

    w_full = n_nodes + 1
    csum = alloc(ws, "csum", (nd, b, w_full), torch.float64, dev)
    nsel = alloc(ws, "nsel", (nd, b), torch.int32, dev)
    parents = alloc(ws, "parents", (b, width), i64, dev)
    ancestors = alloc(ws, "ancestors", (b, width, width), torch.bool, dev)
    depth = alloc(ws, "depth", (b, width), i64, dev)
    valid = alloc(ws, "valid", (b, width), torch.bool, dev)
    source = alloc(ws, "source", (b, width), torch.int8, dev)
    survival = alloc(ws, "survival", (b, width), f32, dev)
    expected = alloc(ws, "expected", (b,), f32, dev)
    _select_kernel[(grid_b, nd)](
        model_tokens, *model_tokens.stride(), ext, ng_tokens, *ng_tokens.stride(), s_n, ng_len, depths_t,
        at, *at_strides, s_alt,
        csum, nsel, tokens, parents, ancestors, depth, valid, source, survival, expected,
        b,
        S=s, DM=dm, K=k, M=m, N_NODES=n_nodes, MERGE=mode == "merge", KBLOCK=kblock, WIDTH=width, BB=block_rows,
        P2=p2, W2=w2, UNDRAFTED_C=UNDRAFTED)

    out_width = alloc(ws, "next_width", (), i64, dev)
    b_star = alloc(ws, "b_star", (), i64, dev)
    lam = alloc(ws, "lam", (), f32, dev)
    next_depth = alloc(ws, "next_depth", (), i64, dev)
    nj = buckets.numel()
    cz, dz = cost, draft_cost
    _plan_kernel[(1,)](
        csum, nsel, buckets, depths_t,
        *((cz.sizes, cz.seconds, cz._seg_slope) if cz is not None else (csum,) * 3),
        *((dz.sizes, dz.seconds, dz._seg_slope) if dz is not None else (csum,) * 3),
        out_width, b_star, lam, next_depth,
        counters.totals if counters is not None else csum, ng_len,
        from_lookup if from_lookup is not None else ng_len, valid, source,
        b,
        D=nd, J=nj, W_FULL=w_full, DJ2=pow2(max(nd * nj, 2)), BB=block_rows, HAS_COST=cz is not None,
        HAS_DRAFT=dz is not None, NS=_table_size(cz), NS2=pow2(_table_size(cz)), NDS=_table_size(dz),
        NDS2=pow2(_table_size(dz)),
        COUNT=counters is not None, HAS_LOOKUP=from_lookup is not None, WIDTH=width, W2=pow2(width), **_COUNTER_SLOTS)
    tree = VerifyTree(tokens=tokens, parents=parents, ancestors=ancestors, depth=depth, valid=valid, source=source,
                      survival=survival, expected_accepted=expected)
    return Decision(tree, b_star, lam, s_m, s_n, out_width, next_depth, rate, a_m, a_n)
