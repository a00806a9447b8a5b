"""HYBRID's own settings: one validated object, read from a config file and environment variables.

Why environment variables: SGLang's argument parser is closed to plugins (``ServerArgs`` fields are fixed), and every
SGLang process (main, scheduler, detokenizer) inherits the environment, so the scheduler that builds the worker sees
exactly what the launcher validated.

Sources, later wins:

1. ``SGLANG_HYBRID_CONFIG=/path/file.json`` or ``.toml``: a table of the fields below (TOML may nest them under
   ``[hybrid]``).
2. ``SGLANG_HYBRID_<FIELD>`` for any single field, e.g. ``SGLANG_HYBRID_MODE=choose``,
   ``SGLANG_HYBRID_NGRAM_K=6``, ``SGLANG_HYBRID_NGRAM_OPTIONS='{"min_match": 2}'`` (JSON for dict and list values).

Unknown keys, unknown ``SGLANG_HYBRID_*`` variables, wrong types and out-of-range values raise ``HybridConfigError``
naming the setting and its source: nothing silently falls back to a default. The few ``SGLANG_HYBRID_*`` variables
that are not settings (``ENV_EAGLE3``, ``ENV_CACHE``, ``ENV_ACCEPT_SGLANG``, ``ENV_RECORD_LAUNCHES``) are named below
with the others; this module is their one home.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Every environment variable of HYBRID is named here: ``ENV_PREFIX + FIELD.upper()`` sets one field of
# ``HybridSettings``; the constants below are the rest.
ENV_PREFIX = "SGLANG_HYBRID_"
#: A settings file (.json or .toml).
ENV_CONFIG = ENV_PREFIX + "CONFIG"
#: Written by the launcher (``server_args.handle_server_args``), read by ``HybridSpecAlgo.is_eagle3`` in the spawned
#: scheduler and detokenizer: "1" when the draft model is an EAGLE-3 head, else "0".
ENV_EAGLE3 = ENV_PREFIX + "DRAFT_IS_EAGLE3"
#: Converted-model cache root of the CPU reference loop (``sglang_hybrid.reference.models``).
ENV_CACHE = ENV_PREFIX + "CACHE"
#: The SGLang version HYBRID was built and tested against: ``register()`` refuses any other (``sglang_plugin``).
SUPPORTED_SGLANG = "0.5.23"
#: Set to an installed SGLang version other than ``SUPPORTED_SGLANG`` to run HYBRID on it anyway (at the user's risk:
#: the plugin overrides SGLang internals, listed in ``sglang_plugin.compat``); read by ``register()``, which logs it.
ENV_ACCEPT_SGLANG = ENV_PREFIX + "ACCEPT_SGLANG_VERSION"
# Switches of the test and CPU-engine machinery (never read on a GPU deployment), named here with the rest:
#: set (to any non-empty value) in a CPU engine's environment to plan KV windows there (``cpu_engine.kv_window``)
KV_WINDOW_ENV = "HYBRID_CPU_ENGINE_KV_WINDOW"
#: set (to any non-empty value) in a CPU engine's environment to run extend and decode attention and the KV-index
#: builder with their torch twins (``cpu_engine.torch_attention``, ``cpu_engine.torch_kv_indices``)
TORCH_ATTENTION_ENV = "HYBRID_CPU_ENGINE_TORCH_ATTENTION"
#: set (to any non-empty value) in a CPU engine's environment to run every SGLang Triton kernel HYBRID's step launches
#: with its torch twin: the ``TORCH_ATTENTION_ENV`` twins, the KV-index gather and the greedy tree verify
#: (``cpu_engine.torch_kv_indices``, ``cpu_engine.torch_tree_verify``); the try-out server's ``--torch-kernels``
TORCH_KERNELS_ENV = "HYBRID_CPU_ENGINE_TORCH_KERNELS"
#: a JSON counts file: run SGLang's sampling verify with the CPU tree-sampling stand-in (``cpu_engine.tree_sampling``)
TREE_SAMPLING_ENV = "HYBRID_CPU_ENGINE_TREE_SAMPLING"
#: set (to any non-empty value) to run Triton's interpreter with the GPU's rows per program (``kernels``)
GPU_TILES_ENV = "HYBRID_INTERPRETER_GPU_TILES"
#: Set (to any non-empty value but "0") to key every launch of HYBRID's Triton kernels on the host and check it
#: against the variants compiled at start, on a GPU too (``kernels.warmup``; always on under Triton's interpreter).
ENV_RECORD_LAUNCHES = ENV_PREFIX + "RECORD_KERNEL_LAUNCHES"
#: Variables with the prefix that are not settings.
_NOT_SETTINGS = {ENV_CONFIG, ENV_EAGLE3, ENV_CACHE, ENV_ACCEPT_SGLANG, ENV_RECORD_LAUNCHES}


class HybridConfigError(ValueError):
    """A HYBRID setting is invalid; the message names the setting, where it came from, and the fix."""


#: the n-gram offset's learning rate that ``ngram_bias_eta = "auto"`` takes where verify runs ragged (docs/sglang.md,
#: "The n-gram side's online offset": the rate measured in the realistic replay)
NGRAM_BIAS_ETA_AUTO = 0.3


#: the default rate of the model side's online temperature (setting ``model_calibration_eta``,
#: ``online_calibration``): in the replay's simulated drafter distorted at head temperatures 0.5 to 2 it leaves the
#: model side's ECE at most about 0.02 after 2,000 steps at every batch size measured, and an honest head's where it
#: was (docs/sglang.md, "The EAGLE side's online temperature and offset")
MODEL_CALIBRATION_ETA = 0.1


def resolved_ngram_bias_eta(setting, ragged: bool) -> Optional[float]:
    """The learning rate of the n-gram side's online offset for the setting ``ngram_bias_eta`` (a rate, None or
    "auto") on an engine whose verify runs ragged (``ragged``) or padded. Why "auto" depends on the layout: a ragged
    verify prices every n-gram node by the calibration, so a table that under-values a request's long copies cuts them
    short (the offset learns the request's own rate: +0.0 to +8.7 % in the simulated headline cells of the ragged
    launch), while a padded step verifies its width whatever the price says and gains nothing from it."""
    if setting == "auto":
        return NGRAM_BIAS_ETA_AUTO if ragged else None
    return setting


#: the most draft nodes a verify tree holds (setting ``n_nodes``, and its default from the other settings)
MAX_NODES = 63


class HybridSettings(BaseModel):
    """Every HYBRID setting (documented in docs/sglang.md).

    Each field's description is one line, then its docs anchor ``(docs/sglang.md#setting-<name>)``: its row in the
    reference ``python -m sglang_hybrid.tools.settings_doc --write`` generates (which enforces the rule). The longer
    story of a setting lives in docs/sglang.md's prose."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["choose", "merge"] = Field(
        "merge", description="choose: verify the better of the EAGLE chain and the n-gram draft; merge: verify both "
                             "as one tree (docs/sglang.md#setting-mode)")
    ngram_k: int = Field(8, ge=1, le=32, description="longest n-gram chain proposed per request and step (\"The "
                                                     "n-gram chain length\") (docs/sglang.md#setting-ngram_k)")
    n_nodes: Optional[int] = Field(
        None, ge=1, le=MAX_NODES, description="draft nodes per verify tree (width n_nodes + 1); none = steps + ngram_k "
                                              "(merge), max(steps, ngram_k) (choose) "
                                              "(docs/sglang.md#setting-n_nodes)")
    eagle_alternatives: int = Field(
        0, ge=0, le=7, strict=True,
        description="the draft model's next M tokens at each EAGLE chain position, as leaves beside the chain's "
                    "(\"EAGLE alternatives\") (docs/sglang.md#setting-eagle_alternatives)")
    verify_widths: Optional[list[int]] = Field(
        None, description="verify widths to pick from, each in [2, n_nodes + 1], plus the full width ([] = it "
                          "alone; none: \"Verify width buckets\") (docs/sglang.md#setting-verify_widths)")
    ngram_calibration: Optional[str] = Field(
        None, description="n-gram calibration JSON (python -m sglang_hybrid.tools.calibrate); none = the shipped "
                          "table (docs/sglang.md#setting-ngram_calibration)")
    model_calibration: Optional[str] = Field(
        None, description="EAGLE per-position temperature JSON; none = identity (the draft probability as is) "
                          "(docs/sglang.md#setting-model_calibration)")
    cost_table: Optional[str] = Field(
        None, description="profiled verify step-time table JSON (sglang_hybrid.cost); none = measured at start "
                          "(docs/sglang.md#setting-cost_table)")
    measure_cost_table: Literal["auto", "on", "off"] = Field(
        "auto", description="time the verify and draft forwards at start where no table is given; auto = on a GPU "
                            "only, off = no price (docs/sglang.md#setting-measure_cost_table)")
    draft_cost_table: Optional[str] = Field(
        None, description="step-time table JSON of ONE draft-model forward by batch size: turns on adaptive "
                          "drafting; none = measured at start (docs/sglang.md#setting-draft_cost_table)")
    draft_depths: Optional[list[int]] = Field(
        None, description="EAGLE depths adaptive drafting picks from, each in [1, steps], plus steps; none = 1-4, "
                          "steps // 2, steps; [] = off (docs/sglang.md#setting-draft_depths)")
    model_bias_eta: Optional[float] = Field(
        None, gt=0, le=10, strict=True,
        description="learning rate of the EAGLE side's per-request online offset (0.03-0.1); none = off "
                    "(docs/sglang.md#setting-model_bias_eta)")
    model_calibration_eta: Optional[float] = Field(
        MODEL_CALIBRATION_ETA, gt=0, le=10, strict=True,
        description="learning rate of the EAGLE side's per-depth temperature, learned online across requests; none "
                    "= off (docs/sglang.md#setting-model_calibration_eta)")
    ngram_bias_eta: Union[Literal["auto"], Annotated[float, Field(gt=0, le=10, strict=True)], None] = Field(
        "auto",
        description=f"learning rate of the n-gram side's per-request online offset; auto = {NGRAM_BIAS_ETA_AUTO} "
                    "under ragged verify, else off; none = off "
                    "(docs/sglang.md#setting-ngram_bias_eta)")
    context_lookup: bool = Field(
        True, description="rows whose late n-gram proposal did not align take a prompt lookup over their committed "
                          "tokens, on the device (docs/sglang.md#setting-context_lookup)")
    ngram_donate: bool = Field(True, description="donate finished responses to the shared n-gram corpus "
                                                 "(docs/sglang.md#setting-ngram_donate)")
    ngram_options: dict = Field(
        default_factory=dict, description="extra keyword options for NgramDrafter (docs/ngram.md; not max_draft, "
                                          "which ngram_k sets), checked at start "
                                          "(docs/sglang.md#setting-ngram_options)")
    decision_kernels: Literal["auto", "fused", "torch"] = Field(
        "auto", description="how the per-step device work runs: fused = Triton kernels, torch = torch "
                            "operators; auto = fused where Triton runs (docs/sglang.md#setting-decision_kernels)")
    ragged_verify: Literal["auto", "on", "off"] = Field(
        "auto", description="verify each request's own nodes only (\"Ragged verify\"); auto = on the CPU engine only, "
                            "on = also on a GPU, off = never (docs/sglang.md#setting-ragged_verify)")
    ragged_graphs: bool = Field(
        True, description="run the ragged verify forward as one graph per token tier, captured when first needed; "
                          "false = eager (docs/sglang.md#setting-ragged_graphs)")
    log_interval: int = Field(
        50, ge=0, description="decode steps between HYBRID counter log lines (0 = off) "
                              "(docs/sglang.md#setting-log_interval)")
    counters_file: Optional[str] = Field(
        None, description="also write the cumulative counters as JSON to this file at every log line (rank 0; "
                          "the self-check reads it) (docs/sglang.md#setting-counters_file)")

    @field_validator("ngram_options")
    @classmethod
    def _ngram_options_leave_max_draft(cls, options: dict) -> dict:
        """``max_draft`` is the plugin's to set (``ngram_k`` at start, each step's width at run time): given here it
        would meet the plugin's own value in ``NgramDrafter(...)`` as a duplicate keyword."""
        if "max_draft" in options:
            raise ValueError("'max_draft' is set by the plugin from 'ngram_k' (the n-gram chain length); set "
                             f"{ENV_PREFIX}NGRAM_K instead and drop it from the options")
        return options

    def resolved_n_nodes(self, num_steps: int) -> int:
        """Draft nodes per verify tree: the setting ``n_nodes``, else both chains' nodes (merge) or the longer
        chain's (choose): the EAGLE chain and the n-gram chain.

        EAGLE alternatives (``eagle_alternatives``) do not widen this default: they compete with the chains' nodes
        for it, and the price keeps the best. Why: every verify buffer SGLang sizes (the draft extend's graphs, the
        shared logits rows, the verify mask) grows with ``max_bs x (n_nodes + 1)``, so widening by ``steps x M``
        made 3 alternatives cost 1.99x plain EAGLE's start-up memory against 1.46x for the chains alone
        (``bench.memory_budget``, batch 128); and the realistic replay found the wider budget bought nothing: within
        0.3 % in every headline cell of its last run (docs/benchmarks.md, "EAGLE alternatives"), because the price
        rarely keeps more nodes than the chains offer."""
        if self.n_nodes is not None:
            return self.n_nodes
        return num_steps + self.ngram_k if self.mode == "merge" else max(num_steps, self.ngram_k)

    def measures_cost_table(self, device_type: str) -> bool:
        """Whether the worker measures the verify cost table at start on a ``device_type`` ("cuda", "cpu", ...)
        device (setting ``measure_cost_table``; DP attention aside, which the caller rules out)."""
        return self.cost_table is None and self._measures_at_start(device_type)

    def measures_draft_table(self, device_type: str, num_steps: int) -> bool:
        """Whether the worker measures the draft forward's table at start (``startup_costs.measure_draft_costs``),
        which turns adaptive drafting on: as the verify table, where none is given (``draft_cost_table``), unless
        ``draft_depths = []``, for an EAGLE chain of 2 or more steps (one step runs no draft decode)."""
        return (self.draft_cost_table is None and self.draft_depths != [] and int(num_steps) >= 2
                and self._measures_at_start(device_type))

    def _measures_at_start(self, device_type: str) -> bool:
        return self.measure_cost_table == "on" or (self.measure_cost_table == "auto" and device_type != "cpu")

    def resolved_shapes(self, num_steps: int, fixed: bool = False,
                        device_type: str = "cuda") -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(EAGLE draft depths, verify widths) the engine switches between; ``fixed`` (DP attention, where every DP
        rank must run the same shapes): only ``num_steps`` and the full width."""
        if fixed:
            return (num_steps,), (self.resolved_n_nodes(num_steps) + 1,)
        return (self.resolved_draft_depths(num_steps, device_type),
                self.resolved_verify_widths(num_steps, device_type))

    def resolved_draft_depths(self, num_steps: int, device_type: str = "cuda") -> tuple[int, ...]:
        """EAGLE draft depths to pick from on a ``device_type`` device (sorted; the last is ``num_steps``);
        ``(num_steps,)`` when adaptive drafting is off: no draft table (none given, ``draft_cost_table``, and none
        measured at start, ``measures_draft_table``), or ``draft_depths = []``."""
        adaptive = self.draft_cost_table is not None or self.measures_draft_table(device_type, num_steps)
        if not adaptive or self.draft_depths == []:
            if self.draft_depths:
                raise HybridConfigError(
                    f"HYBRID setting 'draft_depths' = {self.draft_depths} needs a draft table (the draft forward's "
                    f"step time prices the depth): set {ENV_PREFIX}DRAFT_COST_TABLE, or let the worker measure one "
                    f"at start ({ENV_PREFIX}MEASURE_COST_TABLE=on where it is off here), or unset the depths")
            return (num_steps,)
        from sglang_hybrid.widths import default_depths

        depths = self.draft_depths if self.draft_depths is not None else default_depths(num_steps)
        bad = [d for d in depths if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= num_steps]
        if bad:
            raise HybridConfigError(
                f"HYBRID setting 'draft_depths' = {self.draft_depths}: {bad} outside [1, {num_steps}] "
                f"(--speculative-num-steps); fix {ENV_PREFIX}DRAFT_DEPTHS or the config file")
        return tuple(sorted(set(depths) | {num_steps}))

    def fits_widths_to_memory(self, device_type: str = "cuda") -> bool:
        """Whether the worker trims the verify widths at start to the extras that pay by the measured table
        (``widths.paying_extras``) and whose runtime states fit the GPU memory SGLang left
        (``memory_budget.fit_widths``): the default launch on a GPU, a table measured at start and no
        ``verify_widths`` given. A user's widths are built as given (and refused at start when they do not fit)."""
        return (device_type == "cuda" and self.verify_widths is None and not self.cost_table
                and self.measures_cost_table(device_type))

    def resolved_verify_widths(self, num_steps: int, device_type: str = "cuda") -> tuple[int, ...]:
        """The verify width buckets for ``num_steps`` EAGLE steps on a ``device_type`` device (sorted; the last is
        ``n_nodes + 1``).

        Raises ``HybridConfigError`` naming the setting for a width outside ``[2, n_nodes + 1]``: width 1 (verify
        only the root) needs SGLang's zero-step draft, which HYBRID does not switch to (the EAGLE draft has run by
        the time the width applies)."""
        from sglang_hybrid.widths import check_buckets, default_buckets, measured_table_buckets

        full = self.resolved_n_nodes(num_steps) + 1
        if self.verify_widths is None:
            if self.cost_table:
                return default_buckets(full)
            if self.measures_cost_table(device_type):
                # a table measured at start: plain EAGLE's width and the whole tree, plus the extras, which the
                # worker keeps on a GPU only where they pay and their runtime states fit the free memory
                # (``fits_widths_to_memory``; the buckets' six do not fit an H200 at 128 requests:
                # bench/memory_budget.py)
                required, extras = measured_table_buckets(num_steps, full)
                return check_buckets([*required, *extras], full)
            # without a price the width rule verifies every useful node, which is nearly always the full width:
            # extra runtime states would cost start-up time and memory for nothing
            return (full,)
        bad = [w for w in self.verify_widths if not 2 <= w <= full]
        if bad:
            raise HybridConfigError(
                f"HYBRID setting 'verify_widths' = {self.verify_widths}: {bad} outside [2, {full}] (n_nodes + 1 "
                f"with {num_steps} EAGLE steps); fix {ENV_PREFIX}VERIFY_WIDTHS or the config file")
        return check_buckets(self.verify_widths, full)


_FIELDS = tuple(HybridSettings.model_fields)


def _read_file(path_str: str) -> dict:
    path = Path(path_str)
    if not path.is_file():
        raise HybridConfigError(
            f"{ENV_CONFIG}={path_str!r}: file not found; point it at a readable .json or .toml file or unset it")
    try:
        text = path.read_text()
    except OSError as e:
        raise HybridConfigError(f"{ENV_CONFIG}={path_str!r}: cannot read ({e})") from None
    try:
        if path.suffix.lower() == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise HybridConfigError(f"{ENV_CONFIG}={path_str!r}: TOML needs Python >= 3.11; use a .json file") \
                    from None
            obj = tomllib.loads(text)
            if isinstance(obj.get("hybrid"), dict):
                obj = obj["hybrid"]
        elif path.suffix.lower() == ".json":
            obj = json.loads(text)
        else:
            raise HybridConfigError(f"{ENV_CONFIG}={path_str!r}: extension must be .json or .toml")
    except HybridConfigError:
        raise
    except Exception as e:  # json.JSONDecodeError, tomllib.TOMLDecodeError
        raise HybridConfigError(f"{ENV_CONFIG}={path_str!r}: not valid {path.suffix[1:]} ({e})") from None
    if not isinstance(obj, dict):
        raise HybridConfigError(f"{ENV_CONFIG}={path_str!r}: top level must be a table of settings")
    return dict(obj)


def _env_value(name: str, raw: str):
    """Environment strings -> JSON values where they parse (numbers, booleans, dicts), else the string itself."""
    if name in ("ngram_options", "verify_widths", "draft_depths"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            what = "a JSON object" if name == "ngram_options" else "a JSON list of ints, e.g. [1, 2]"
            raise HybridConfigError(f"{ENV_PREFIX}{name.upper()}: must be {what} ({e})") from None
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null", ""):
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def load_settings(environ: Optional[dict] = None) -> HybridSettings:
    """Settings from ``SGLANG_HYBRID_CONFIG`` plus ``SGLANG_HYBRID_<FIELD>`` overrides (``environ`` for tests)."""
    env = os.environ if environ is None else environ
    values: dict = {}
    origin: dict = {}
    if env.get(ENV_CONFIG):
        for k, v in _read_file(env[ENV_CONFIG]).items():
            values[k] = v
            origin[k] = f"{env[ENV_CONFIG]} [{k}]"
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key in _NOT_SETTINGS:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in _FIELDS:
            raise HybridConfigError(
                f"{key}: unknown HYBRID setting; known: {', '.join(ENV_PREFIX + f.upper() for f in _FIELDS)}")
        values[name] = _env_value(name, raw)
        origin[name] = key
    try:
        return HybridSettings(**values)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            where = origin.get(field, f"{ENV_CONFIG} file" if field not in _FIELDS else field)
            msgs.append(f"HYBRID setting '{field}' (from {where}): {err['msg']}")
        raise HybridConfigError("; ".join(msgs)) from None


def check_files(settings: HybridSettings) -> None:
    """Load every file a setting names, so a bad file stops the server at start with the setting's name."""
    from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
    from sglang_hybrid.cost import CostModel

    checks = (("ngram_calibration", NgramCalibration.load), ("model_calibration", ModelCalibration.load),
              ("cost_table", CostModel.load), ("draft_cost_table", CostModel.load))
    for name, loader in checks:
        path = getattr(settings, name)
        if path is None:
            continue
        if not os.access(path, os.R_OK) or not Path(path).is_file():
            raise HybridConfigError(
                f"HYBRID setting '{name}' = {path!r}: file missing or unreadable; fix the path "
                f"({ENV_PREFIX}{name.upper()} or the config file) or unset it to use the default")
        try:
            loader(path)
        except (ValueError, OSError, KeyError, TypeError) as e:
            raise HybridConfigError(f"HYBRID setting '{name}' = {path!r}: invalid file ({e}); regenerate it "
                                    f"(see docs/sglang.md) or unset the setting") from None
