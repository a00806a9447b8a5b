"""Server-argument validation and defaults for HYBRID.

Why here: for plugin algorithms SGLang runs none of its built-in handlers (``_handle_eagle_family`` sets steps, topk,
draft tokens, ``max_running_requests`` only for the literal EAGLE names), so HYBRID must set them itself. SGLang calls
``validate_server_args`` and then ``handle_server_args`` during ``ServerArgs.resolve_once`` with a stand-in object
that reads the resolving view and records attribute writes as declarations.

Every rejection names the setting and the fix, and happens at start, before any model is loaded.
"""
from __future__ import annotations

import logging
import os

from .config import (ENV_EAGLE3, ENV_PREFIX, MAX_NODES, HybridConfigError, HybridSettings, check_files,
                     load_settings)
from .draft_arch import draft_is_eagle3

logger = logging.getLogger(__name__)

DEFAULT_NUM_STEPS = 4
DEFAULT_MAX_RUNNING_REQUESTS = 48
#: Attention backends whose target-verify path applies the tree mask when ``speculative_eagle_topk == 1``. Others
#: (fa3, trtllm_mha, aiter, hybrid linear attention, ...) treat a topk=1 verify as a causal chain and would
#: silently ignore HYBRID's tree: wrong outputs.
TREE_MASK_BACKENDS = ("flashinfer", "triton")
#: The same backends by SGLang's class names (what a built runner holds; ragged verify plans through exactly these
#: too): the worker checks the backend actually built against them.
TREE_MASK_BACKEND_CLASSES = ("FlashInferAttnBackend", "TritonAttnBackend")
DEFAULT_ATTENTION_BACKEND = "flashinfer"
#: On a CPU engine only Triton (run by Triton's interpreter) verifies trees: SGLang's EAGLE refuses torch_native and
#: intel_amx reads a different mask layout.
DEFAULT_CPU_ATTENTION_BACKEND = "triton"
BACKEND_FIELDS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend")


class HybridArgsError(ValueError):
    """An SGLang argument combination HYBRID cannot run with."""


def _get(args, name, default=None):
    return getattr(args, name, default)


def user_value(args, name):
    """What the user passed for ``name`` (None when they did not), not what SGLang resolved.

    SGLang resolves some fields before the speculative hook runs (on Hopper ``attention_backend`` becomes fa3, on
    Blackwell trtllm_mha), so the resolved value cannot tell a user's choice from a platform default. The resolution
    pipeline keeps the raw input in ``_raw_input``; objects without it (built by hand) answer with the field itself.
    """
    raw = getattr(args, "_raw_input", None)
    if isinstance(raw, dict):
        return raw.get(name)
    return _get(args, name)


def _check_ngram_available(settings: HybridSettings) -> None:
    try:
        from sglang_hybrid.ngram import NgramDrafter
    except ImportError as e:
        raise HybridArgsError(
            f"HYBRID needs the compiled n-gram drafter (sglang_hybrid._ngram), which failed to import ({e}); "
            "reinstall the package with `pip install -e .` (builds the Rust extension)") from None
    try:
        NgramDrafter(max_draft=settings.ngram_k, **settings.ngram_options)
    except (TypeError, ValueError) as e:
        raise HybridConfigError(
            f"HYBRID setting 'ngram_options' = {settings.ngram_options!r} (or 'ngram_k' = {settings.ngram_k}) is "
            f"rejected by NgramDrafter: {e}") from None


def validate_server_args(server_args, *, check_ngram: bool = True) -> HybridSettings:
    """Reject combinations HYBRID cannot run; returns the loaded settings (tests use the return value)."""
    if _get(server_args, "speculative_draft_model_path") is None:
        raise HybridArgsError(
            "--speculative-algorithm HYBRID needs an EAGLE draft model: pass --speculative-draft-model-path "
            "<EAGLE or EAGLE-3 head for this target>")
    topk = _get(server_args, "speculative_eagle_topk")
    settings = load_settings()
    if topk is not None and int(topk) > 1:
        raise HybridArgsError(
            f"--speculative-eagle-topk {topk}: HYBRID mode '{settings.mode}' takes the EAGLE draft as a chain (the "
            "n-gram branch supplies the alternatives); pass --speculative-eagle-topk 1 or omit it")
    twn = _get(server_args, "tokenizer_worker_num", 1) or 1
    if int(twn) > 1:
        raise HybridArgsError(
            f"--tokenizer-worker-num {twn}: multi-process tokenizer workers never load plugins, so they cannot "
            "resolve HYBRID; use --tokenizer-worker-num 1")
    checks = (
        ("disaggregation_mode", lambda v: v not in (None, "null"),
         "prefill/decode disaggregation is not supported by HYBRID; drop --disaggregation-mode"),
        ("pp_size", lambda v: v is not None and int(v) > 1,
         "pipeline parallelism is not supported by HYBRID (the PP tail-draft relays EAGLE-only trees); "
         "use --pp-size 1"),
        ("speculative_adaptive", bool,
         "--speculative-adaptive tunes EAGLE steps only; HYBRID prices its drafts itself: drop the flag"),
        ("enable_multi_layer_eagle", bool,
         "--enable-multi-layer-eagle is not supported by HYBRID; drop the flag"),
        ("speculative_use_rejection_sampling", bool,
         "--speculative-use-rejection-sampling needs draft distributions that n-gram drafts do not have; HYBRID "
         "samples losslessly with deterministic-proposal tree sampling: drop the flag"),
        ("speculative_use_block_verification", bool,
         "--speculative-use-block-verification is not supported by HYBRID; drop the flag"),
        ("speculative_accept_threshold_single", lambda v: v is not None and float(v) != 1.0,
         "accept thresholds below 1 make verification lossy; HYBRID is lossless: leave "
         "--speculative-accept-threshold-single at 1.0"),
        ("speculative_accept_threshold_acc", lambda v: v is not None and float(v) != 1.0,
         "accept thresholds below 1 make verification lossy; leave --speculative-accept-threshold-acc at 1.0"),
        ("page_size", lambda v: v is not None and int(v) > 1,
         "HYBRID verifies irregular trees and compacts the accepted path token by token; use --page-size 1"),
    )
    for name, bad, fix in checks:
        value = _get(server_args, name)
        if bad(value):
            raise HybridArgsError(f"{name}={value!r}: {fix}")
    allowed = (DEFAULT_CPU_ATTENTION_BACKEND,) if _get(server_args, "device") == "cpu" else TREE_MASK_BACKENDS
    for name in BACKEND_FIELDS:
        # Only the user's own choice is checked here: a backend SGLang picked by platform is replaced by
        # handle_server_args (and the worker checks the backend actually built at the first decode step).
        value = user_value(server_args, name)
        if value is not None and value not in allowed:
            raise HybridArgsError(
                f"--{name.replace('_', '-')} {value}: this backend verifies a topk=1 draft as a causal chain and would "
                f"ignore HYBRID's tree mask; use --{name.replace('_', '-')} {' or '.join(allowed)}"
                + (" (on a CPU engine only Triton verifies trees)" if len(allowed) == 1 else ""))
    n_nodes = settings.resolved_n_nodes(int(_get(server_args, "speculative_num_steps") or DEFAULT_NUM_STEPS))
    if n_nodes > MAX_NODES:
        raise HybridArgsError(
            f"HYBRID's default n_nodes = {'steps + ngram_k' if settings.mode == 'merge' else 'max(steps, ngram_k)'}"
            f" = {n_nodes} is above {MAX_NODES}: lower --speculative-num-steps or {ENV_PREFIX}NGRAM_K, or set "
            f"{ENV_PREFIX}N_NODES to at most {MAX_NODES} (the price then keeps the best)")
    ndt = _get(server_args, "speculative_num_draft_tokens")
    if ndt is not None and int(ndt) != n_nodes + 1:
        raise HybridArgsError(
            f"--speculative-num-draft-tokens {ndt}: HYBRID's verify width is n_nodes + 1 = {n_nodes + 1} "
            f"(mode '{settings.mode}'); omit the flag or set SGLANG_HYBRID_N_NODES={int(ndt) - 1}")
    steps = _get(server_args, "speculative_num_steps")
    if steps is not None and int(steps) < 1:
        raise HybridArgsError(f"--speculative-num-steps {steps}: HYBRID needs at least one EAGLE step")
    widths = settings.resolved_verify_widths(int(steps or DEFAULT_NUM_STEPS), str(_get(server_args, "device")))
    depths = settings.resolved_draft_depths(int(steps or DEFAULT_NUM_STEPS), str(_get(server_args, "device")))
    if _get(server_args, "enable_dp_attention") and (
            (settings.verify_widths and len(widths) > 1) or (settings.draft_depths and len(depths) > 1)):
        raise HybridArgsError(
            f"HYBRID settings 'verify_widths' = {settings.verify_widths}, 'draft_depths' = {settings.draft_depths} "
            "with --enable-dp-attention: DP ranks must verify at one width and draft one depth (their forwards meet "
            f"in collectives), so both are fixed under DP attention; unset {ENV_PREFIX}VERIFY_WIDTHS and "
            f"{ENV_PREFIX}DRAFT_DEPTHS or drop --enable-dp-attention")
    check_files(settings)
    if check_ngram:
        _check_ngram_available(settings)
    return settings


def handle_server_args(server_args) -> None:
    """Fill SGLang's speculative fields for HYBRID (the job ``_handle_eagle_family`` does for EAGLE)."""
    settings = load_settings()
    steps = _get(server_args, "speculative_num_steps")
    if steps is None:
        steps = DEFAULT_NUM_STEPS
        server_args.speculative_num_steps = steps
    steps = int(steps)
    n_nodes = settings.resolved_n_nodes(steps)
    if n_nodes < steps:
        raise HybridConfigError(
            f"HYBRID setting 'n_nodes' = {n_nodes} is below --speculative-num-steps {steps}: the whole EAGLE chain "
            f"must fit the verify tree; raise SGLANG_HYBRID_N_NODES or lower --speculative-num-steps")
    server_args.speculative_eagle_topk = 1
    server_args.speculative_num_draft_tokens = n_nodes + 1
    if _get(server_args, "max_running_requests") is None:
        server_args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.warning("HYBRID: --max-running-requests defaults to %d; set it explicitly to change",
                       DEFAULT_MAX_RUNNING_REQUESTS)
    if _get(server_args, "enable_mixed_chunk"):
        server_args.enable_mixed_chunk = False
        logger.warning("HYBRID: mixed chunked prefill disabled (it degrades running requests to plain decode)")
    cpu = _get(server_args, "device") == "cpu"
    default_backend = DEFAULT_CPU_ATTENTION_BACKEND if cpu else DEFAULT_ATTENTION_BACKEND
    for name in BACKEND_FIELDS:
        chosen = user_value(server_args, name)
        resolved = _get(server_args, name)
        if name == "attention_backend" and chosen is None and resolved != default_backend:
            server_args.attention_backend = default_backend
            logger.info("HYBRID: --attention-backend defaults to %s (its verify applies tree masks; SGLang had "
                        "picked %s)", default_backend, resolved)
        elif name != "attention_backend" and chosen is None and resolved is not None:
            # A split backend SGLang chose by platform: fall back to the base backend HYBRID just set.
            setattr(server_args, name, None)
    # Spawned children (scheduler, detokenizer) inherit the environment: they answer is_eagle3() from it.
    eagle3 = draft_is_eagle3(_get(server_args, "speculative_draft_model_path"),
                             bool(_get(server_args, "trust_remote_code", False)))
    os.environ[ENV_EAGLE3] = "1" if eagle3 else "0"
    fixed = bool(_get(server_args, "enable_dp_attention"))
    device = str(_get(server_args, "device"))
    depths, widths = settings.resolved_shapes(steps, fixed=fixed, device_type=device)
    logger.info("HYBRID: mode=%s eagle_steps=%s n_nodes=%d (verify widths %s) ngram_k=%d cost_table=%s "
                "draft_cost_table=%s", settings.mode, ",".join(map(str, depths)), n_nodes, ",".join(map(str, widths)),
                settings.ngram_k,
                settings.cost_table or ("measured at start" if settings.measures_cost_table(device) and not fixed
                                        else "none (price 0)"),
                settings.draft_cost_table or ("measured at start" if len(depths) > 1 else "none (one depth)"))
    if settings.cost_table:
        _warn_if_cost_table_short(settings.cost_table, int(server_args.max_running_requests) * (n_nodes + 1))


def _warn_if_cost_table_short(path: str, widest_step: int) -> None:
    """Say so at start when the cost table stops short of the widest step the engine can verify: past its last size
    ``T(n)`` continues its last segment's slope, and a table that ends on a flat stretch (inside one CUDA-graph
    bucket) then prices every wider step as free, so the price would pick wide verifies that cost far more."""
    from sglang_hybrid.cost import CostModel

    last = int(CostModel.load(path).sizes[-1])
    if widest_step > last:
        logger.warning("HYBRID: cost_table %s covers steps of up to %d batch tokens, but a step can verify %d "
                       "(--max-running-requests x verify width n_nodes + 1); beyond %d the price extrapolates the "
                       "table's last slope: profile up to %d tokens (docs/sglang.md, 'Fitting for a deployment')",
                       path, last, widest_step, last, widest_step)
