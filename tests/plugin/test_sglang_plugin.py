"""The SGLang plugin's registration, argument handling and worker selection, with SGLang's real argument pipeline.

Tiny local model configs (config.json only: resolution reads configs, never weights). ``--device cpu`` because CI
has no GPU; everything HYBRID decides here is device-independent except that SGLang turns overlap scheduling off for
speculative decoding on CPU.
"""
from __future__ import annotations

import json
import re
import sys
from importlib.metadata import entry_points

import pytest

from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.speculative.spec_registry import get_spec  # noqa: E402

from sglang_hybrid.sglang_plugin import ALGORITHM, register  # noqa: E402
from sglang_hybrid.sglang_plugin.config import (ENV_CACHE, ENV_EAGLE3, NGRAM_BIAS_ETA_AUTO,  # noqa: E402
                                                 HybridConfigError, HybridSettings, load_settings,
                                                 resolved_ngram_bias_eta)
from sglang_hybrid.sglang_plugin.spec_algo import HybridSpecAlgo  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("clean_hybrid_env")]


def _argv(models, *extra, draft="eagle"):
    argv = ["--model-path", models["target"], "--speculative-algorithm", "HYBRID", "--skip-tokenizer-init",
            "--device", "cpu"]
    if draft:
        argv += ["--speculative-draft-model-path", models[draft]]
    return argv + list(extra)


def _resolve(argv):
    register()
    sa = prepare_server_args(argv)
    sa.resolve_once()
    return sa, resolved_view(sa)


def test_register_is_idempotent_and_fills_the_gap():
    register()
    register()
    algo = SpeculativeAlgorithm.from_string("hybrid")
    assert isinstance(algo, HybridSpecAlgo) and algo is get_spec(ALGORITHM)
    assert algo.is_eagle() and algo.is_speculative() and not algo.is_ngram() and not algo.is_dflash()
    assert algo.carries_draft_hidden_states() and algo.need_topk()
    assert algo.get_platform_worker_cls() is None
    assert algo.supports_overlap
    from sglang.srt.managers.overlap_utils import FutureMap  # the class create_future_map builds

    assert callable(algo.create_future_map) and FutureMap is not None


def test_entry_point_is_discovered_by_load_plugins(monkeypatch):
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.value == "sglang_hybrid.sglang_plugin:register"]
    assert eps, "entry point missing: install the package (pip install -e .)"
    assert eps[0].name == "hybrid"
    import sglang.srt.plugins as plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", "hybrid")
    plugins.load_plugins()
    assert isinstance(get_spec(ALGORITHM), HybridSpecAlgo)


def test_prepare_server_args_defaults(models):
    sa, v = _resolve(_argv(models))
    assert v.speculative_algorithm == "HYBRID"
    assert (v.speculative_num_steps, v.speculative_eagle_topk, v.speculative_num_draft_tokens) == (4, 1, 4 + 8 + 1)
    assert v.max_running_requests == 48
    assert v.enable_mixed_chunk is False
    # HYBRID leaves overlap scheduling on, SGLang's default, on the CPU engine too (SGLang's own CPU switch-off runs
    # only in its built-in algorithms' handlers): the live suite's overlap_live cases run it
    assert v.disable_overlap_schedule is False
    _, v = _resolve(_argv(models, "--disable-overlap-schedule"))
    assert v.disable_overlap_schedule is True          # the user's choice stands
    algo = SpeculativeAlgorithm.from_string(v.speculative_algorithm)
    assert algo.is_eagle3() is False


def test_prepare_server_args_with_settings(models, monkeypatch, tmp_path):
    cfg = tmp_path / "hybrid.toml"
    cfg.write_text('[hybrid]\nmode = "choose"\nngram_k = 6\n')
    monkeypatch.setenv("SGLANG_HYBRID_CONFIG", str(cfg))
    _, v = _resolve(_argv(models, "--speculative-num-steps", "5", "--max-running-requests", "16"))
    assert (v.speculative_num_steps, v.speculative_num_draft_tokens, v.max_running_requests) == (5, 7, 16)
    monkeypatch.setenv("SGLANG_HYBRID_N_NODES", "10")      # env overrides the file
    _, v = _resolve(_argv(models, "--speculative-num-steps", "5"))
    assert v.speculative_num_draft_tokens == 11


def test_a_cost_table_short_of_the_widest_step_is_reported_at_start(models, monkeypatch, tmp_path):
    """A cost table that stops before the widest step the engine can verify (--max-running-requests x n_nodes + 1)
    is named at start with the size to profile up to; one that covers it is not. (The handler sits on the plugin's
    logger: SGLang reconfigures the root logger while it resolves arguments, which drops pytest's capture.)"""
    import logging

    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin import server_args

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    short, full = tmp_path / "short.json", tmp_path / "full.json"
    CostModel([1, 64, 128], [0.01, 0.012, 0.02]).save(short)
    CostModel([1, 64, 16 * 13], [0.01, 0.012, 0.02]).save(full)
    for path, warned in ((short, True), (full, False)):
        monkeypatch.setenv("SGLANG_HYBRID_COST_TABLE", str(path))
        handler = Lines()
        server_args.logger.addHandler(handler)
        try:
            _resolve(_argv(models, "--max-running-requests", "16"))
        finally:
            server_args.logger.removeHandler(handler)
        lines = [m for m in handler.lines if "covers steps of up to" in m]
        assert bool(lines) == warned, handler.lines
        if warned:
            assert "up to 128 batch tokens" in lines[0] and "profile up to 208 tokens" in lines[0]


def test_eagle3_draft_detected(models, monkeypatch):
    monkeypatch.delenv(ENV_EAGLE3, raising=False)
    _resolve(_argv(models, draft="eagle3"))
    import os

    assert os.environ[ENV_EAGLE3] == "1"
    assert HybridSpecAlgo("X", lambda a: None).is_eagle3()
    monkeypatch.setenv(ENV_EAGLE3, "0")
    assert not HybridSpecAlgo("Y", lambda a: None).is_eagle3()


def test_create_worker_returns_hybrid_worker(models):
    sa, v = _resolve(_argv(models))
    from sglang_hybrid.sglang_plugin.worker import HybridDraftWorker, HybridWorkerV2
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    cls = SpeculativeAlgorithm.from_string(v.speculative_algorithm).create_worker(sa)
    assert cls is HybridWorkerV2 and issubclass(cls, EAGLEWorkerV2)
    assert issubclass(HybridDraftWorker, EagleDraftWorker)


INVALID = [
    ((), "eagle-missing", "--speculative-draft-model-path"),
    (("--speculative-eagle-topk", "2", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8"), None,
     "--speculative-eagle-topk 1"),
    (("--tokenizer-worker-num", "2"), None, "--tokenizer-worker-num 1"),
    (("--page-size", "16"), None, "--page-size 1"),
    (("--speculative-num-steps", "3", "--speculative-num-draft-tokens", "5"), None, "SGLANG_HYBRID_N_NODES=4"),
    (("--speculative-accept-threshold-single", "0.5"), None, "speculative_accept_threshold_single"),
    (("--attention-backend", "fa3"), None, "--attention-backend triton (on a CPU engine"),
    (("--attention-backend", "torch_native"), None, "--attention-backend triton (on a CPU engine"),
]


@pytest.mark.parametrize("extra,draft,message", INVALID, ids=[m for _, _, m in INVALID])
def test_invalid_combinations_fail_at_start(models, extra, draft, message):
    argv = _argv(models, *extra, draft=None if draft == "eagle-missing" else "eagle")
    with pytest.raises(Exception, match=re.escape(message)):
        _resolve(argv)


def test_unreadable_or_malformed_files_fail_at_start(models, monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_HYBRID_NGRAM_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(Exception, match="ngram_calibration.*missing.json.*missing or unreadable"):
        _resolve(_argv(models))
    monkeypatch.delenv("SGLANG_HYBRID_NGRAM_CALIBRATION")
    bad = tmp_path / "cost.json"
    bad.write_text(json.dumps({"format": "hybrid-spark-cost", "version": 1, "sizes": [4, 2], "seconds": [1, 1]}))
    monkeypatch.setenv("SGLANG_HYBRID_COST_TABLE", str(bad))
    with pytest.raises(Exception, match="cost_table.*invalid file"):
        _resolve(_argv(models))


def test_missing_ngram_extension_is_reported(models, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang_hybrid.ngram", None)   # import fails as if the .so were absent
    with pytest.raises(Exception, match="compiled n-gram drafter.*pip install -e"):
        _resolve(_argv(models))


def test_settings_validation_names_the_setting(tmp_path):
    assert load_settings({}) == HybridSettings()
    # HYBRID's variables that are not settings (the child-process relay, the reference loop's model cache)
    assert load_settings({ENV_EAGLE3: "1", ENV_CACHE: str(tmp_path)}) == HybridSettings()
    s = load_settings({"SGLANG_HYBRID_MODE": "choose", "SGLANG_HYBRID_NGRAM_K": "5",
                       "SGLANG_HYBRID_NGRAM_OPTIONS": '{"min_match": 2}', "SGLANG_HYBRID_NGRAM_DONATE": "false"})
    assert (s.mode, s.ngram_k, s.ngram_options, s.ngram_donate) == ("choose", 5, {"min_match": 2}, False)
    assert s.resolved_n_nodes(4) == 5 and HybridSettings(ngram_k=5).resolved_n_nodes(4) == 9
    with pytest.raises(HybridConfigError, match="'mode' .*SGLANG_HYBRID_MODE"):
        load_settings({"SGLANG_HYBRID_MODE": "tree"})
    with pytest.raises(HybridConfigError, match="'ngram_k' .*SGLANG_HYBRID_NGRAM_K"):
        load_settings({"SGLANG_HYBRID_NGRAM_K": "0"})
    with pytest.raises(HybridConfigError, match="SGLANG_HYBRID_NGRAMK: unknown HYBRID setting"):
        load_settings({"SGLANG_HYBRID_NGRAMK": "4"})
    # no cost table: on a GPU one is measured at start (plain EAGLE's width, the full tree and the extras 8 and 4,
    # which the worker trims to what fits the memory); on the CPU engine, by default, none (no price: the full width)
    assert HybridSettings().resolved_verify_widths(4) == (4, 5, 8, 13)
    assert HybridSettings().resolved_verify_widths(4, "cpu") == (13,)
    assert HybridSettings(measure_cost_table="on").resolved_verify_widths(4, "cpu") == (4, 5, 8, 13)
    assert HybridSettings(cost_table="c.json").resolved_verify_widths(4) == (2, 4, 6, 7, 8, 13)  # n_nodes 12
    both = HybridSettings(cost_table="c.json", draft_cost_table="d.json")
    assert both.resolved_shapes(4) == ((1, 2, 3, 4), (2, 4, 6, 7, 8, 13))
    assert both.resolved_shapes(4, fixed=True) == ((4,), (13,))            # DP attention: one depth, one width
    assert load_settings({"SGLANG_HYBRID_VERIFY_WIDTHS": "[4, 2]"}).resolved_verify_widths(4) == (2, 4, 13)
    assert load_settings({"SGLANG_HYBRID_VERIFY_WIDTHS": "[]"}).resolved_verify_widths(4) == (13,)
    with pytest.raises(HybridConfigError, match=r"'verify_widths' = \[1, 20\]: \[1, 20\] outside \[2, 13\]"):
        HybridSettings(verify_widths=[1, 20]).resolved_verify_widths(4)
    assert HybridSettings().resolved_draft_depths(4, "cpu") == (4,)             # no draft table: fixed depth
    assert HybridSettings().resolved_draft_depths(4) == (1, 2, 3, 4)            # on a GPU one is measured at start
    with_cost = HybridSettings(draft_cost_table="d.json")
    assert with_cost.resolved_draft_depths(4) == (1, 2, 3, 4) and with_cost.resolved_draft_depths(3) == (1, 2, 3)
    assert with_cost.resolved_draft_depths(8) == (1, 2, 3, 4, 8)
    assert HybridSettings(draft_cost_table="d.json", draft_depths=[2]).resolved_draft_depths(4) == (2, 4)
    assert HybridSettings(draft_cost_table="d.json", draft_depths=[]).resolved_draft_depths(4) == (4,)
    with pytest.raises(HybridConfigError, match=r"'draft_depths' = \[0, 5\]: \[0, 5\] outside \[1, 4\]"):
        HybridSettings(draft_cost_table="d.json", draft_depths=[0, 5]).resolved_draft_depths(4)
    with pytest.raises(HybridConfigError, match="'draft_depths' = \\[1\\] needs a draft table .*DRAFT_COST_TABLE.*"
                                                "MEASURE_COST_TABLE=on"):
        HybridSettings(draft_depths=[1]).resolved_draft_depths(4, "cpu")
    assert HybridSettings().model_bias_eta is None                              # off unless asked for
    # the n-gram side's: "auto", learned where verify runs ragged, off where padded
    assert HybridSettings().ngram_bias_eta == "auto"
    assert resolved_ngram_bias_eta("auto", ragged=True) == NGRAM_BIAS_ETA_AUTO == 0.3
    assert resolved_ngram_bias_eta("auto", ragged=False) is None
    assert resolved_ngram_bias_eta(0.1, ragged=False) == 0.1 and resolved_ngram_bias_eta(None, ragged=True) is None
    assert load_settings({"SGLANG_HYBRID_NGRAM_BIAS_ETA": "0.3"}).ngram_bias_eta == 0.3
    assert load_settings({"SGLANG_HYBRID_NGRAM_BIAS_ETA": "none"}).ngram_bias_eta is None
    assert load_settings({"SGLANG_HYBRID_NGRAM_BIAS_ETA": "auto"}).ngram_bias_eta == "auto"
    with pytest.raises(HybridConfigError, match="'ngram_bias_eta' .*SGLANG_HYBRID_NGRAM_BIAS_ETA"):
        load_settings({"SGLANG_HYBRID_NGRAM_BIAS_ETA": "fast"})
    with pytest.raises(HybridConfigError, match="'ngram_bias_eta' .*SGLANG_HYBRID_NGRAM_BIAS_ETA"):
        load_settings({"SGLANG_HYBRID_NGRAM_BIAS_ETA": "0"})
    assert load_settings({"SGLANG_HYBRID_MODEL_BIAS_ETA": "none"}).model_bias_eta is None
    assert load_settings({"SGLANG_HYBRID_MODEL_BIAS_ETA": "0.3"}).model_bias_eta == 0.3
    for bad in ("0", "true", "fast"):
        with pytest.raises(HybridConfigError, match="'model_bias_eta' .*SGLANG_HYBRID_MODEL_BIAS_ETA"):
            load_settings({"SGLANG_HYBRID_MODEL_BIAS_ETA": bad})
    with pytest.raises(HybridConfigError, match="VERIFY_WIDTHS: must be a JSON list of ints"):
        load_settings({"SGLANG_HYBRID_VERIFY_WIDTHS": "2,4"})
    with pytest.raises(HybridConfigError, match="NGRAM_OPTIONS: must be a JSON object"):
        load_settings({"SGLANG_HYBRID_NGRAM_OPTIONS": "min_match=2"})
    with pytest.raises(HybridConfigError, match="'ngram_options' .*'max_draft' is set by the plugin.*NGRAM_K"):
        load_settings({"SGLANG_HYBRID_NGRAM_OPTIONS": '{"max_draft": 4}'})
    f = tmp_path / "h.json"
    f.write_text(json.dumps({"mode": "merge", "n_nodse": 4}))
    with pytest.raises(HybridConfigError, match="n_nodse"):
        load_settings({"SGLANG_HYBRID_CONFIG": str(f)})
    with pytest.raises(HybridConfigError, match="file not found"):
        load_settings({"SGLANG_HYBRID_CONFIG": str(tmp_path / "nope.json")})
    f.write_text("{not json")
    with pytest.raises(HybridConfigError, match="not valid json"):
        load_settings({"SGLANG_HYBRID_CONFIG": str(f)})


def test_attention_backend_default_reads_the_users_choice(models):
    """SGLang resolves a platform backend before the speculative hook runs (torch_native on CPU, fa3 on Hopper,
    trtllm_mha on Blackwell). HYBRID must replace it when the user named none, and only then."""
    _, v = _resolve(_argv(models))
    assert v.attention_backend == "triton"                          # SGLang had resolved torch_native
    _, v = _resolve(_argv(models, "--attention-backend", "triton"))
    assert v.attention_backend == "triton"
    # A GPU launch on Hopper, as SGLang leaves it before HYBRID's hook: fa3 resolved, nothing in the raw input.
    from sglang_hybrid.sglang_plugin.server_args import handle_server_args, validate_server_args

    sa = prepare_server_args(_argv(models))
    sa.device, sa.attention_backend = "cuda", "fa3"
    sa._raw_input = {"attention_backend": None, "device": "cuda"}
    validate_server_args(sa)                                        # not the user's choice: no rejection
    handle_server_args(sa)
    assert sa.attention_backend == "flashinfer"
    sa._raw_input = {"attention_backend": "fa3", "device": "cuda"}   # the user's own choice is rejected
    with pytest.raises(Exception, match="--attention-backend flashinfer or triton"):
        validate_server_args(sa)


def test_registration_failure_stops_a_hybrid_launch_with_its_cause(models, monkeypatch):
    """SGLang's plugin loader only logs an exception from register(); the launch then failed far from the cause
    ("Unknown speculative algorithm"). Now a HYBRID launch stops with the original error."""
    import sglang.srt.speculative.spec_registry as registry

    import sglang_hybrid.sglang_plugin as plugin

    register()
    saved = registry._REGISTRY.pop(ALGORITHM)
    try:
        def broken():
            raise ImportError("sglang_hybrid._ngram: undefined symbol")

        monkeypatch.setattr(plugin, "_register_hybrid", broken)
        register()                                                  # does not raise: SGLang would only log it
        with pytest.raises(plugin.HybridPluginError, match="failed to register.*undefined symbol.*pip install -e"):
            sa = prepare_server_args(_argv(models))
            sa.resolve_once()
        sa = prepare_server_args(["--model-path", models["target"], "--skip-tokenizer-init", "--device", "cpu"])
        sa.resolve_once()                                           # servers without HYBRID are unaffected
    finally:
        registry._REGISTRY[ALGORITHM] = saved


def test_sglang_compat_another_sglang_version_stops_a_hybrid_launch_naming_both_and_the_fix(models, monkeypatch):
    """The plugin overrides SGLang internals that change between releases: registered on an SGLang other than the
    supported one, a HYBRID launch stops at start naming both versions and the two fixes (servers without HYBRID are
    unaffected); accepting that exact version runs it, logged at warning level."""
    import logging
    from importlib import metadata

    import sglang.srt.speculative.spec_registry as registry

    import sglang_hybrid.sglang_plugin as plugin
    from sglang_hybrid.sglang_plugin.config import ENV_ACCEPT_SGLANG, SUPPORTED_SGLANG

    assert metadata.version("sglang") == SUPPORTED_SGLANG                # what CI installs
    plugin.check_sglang_version(SUPPORTED_SGLANG)                       # the supported one passes silently
    register()
    saved = registry._REGISTRY.pop(ALGORITHM)
    try:
        monkeypatch.setattr(plugin.metadata, "version", lambda name: "0.6.0")
        register()
        with pytest.raises(plugin.HybridPluginError, match=rf"supports SGLang {SUPPORTED_SGLANG}, and SGLang 0.6.0 is "
                           rf"installed.*pip install 'sglang=={SUPPORTED_SGLANG}'.*{ENV_ACCEPT_SGLANG}=0.6.0"):
            sa = prepare_server_args(_argv(models))
            sa.resolve_once()
        sa = prepare_server_args(["--model-path", models["target"], "--skip-tokenizer-init", "--device", "cpu"])
        sa.resolve_once()                                           # servers without HYBRID are unaffected
        registry._REGISTRY.pop(ALGORITHM)
        monkeypatch.setenv(ENV_ACCEPT_SGLANG, "0.6.0")
        register()
        assert isinstance(get_spec(ALGORITHM), HybridSpecAlgo)       # registered for real
        # read at the plugin's logger itself: SGLang's logging set-up (prepare_server_args) reroutes propagation
        records: list = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = records.append
        plugin.logger.addHandler(handler)
        try:
            plugin.check_sglang_version("0.6.0")
        finally:
            plugin.logger.removeHandler(handler)
        assert any("HYBRID runs on SGLang 0.6.0, not the supported" in r.getMessage() for r in records), records
        monkeypatch.setenv(ENV_ACCEPT_SGLANG, "0.5.99")             # accepting another version does not count
        with pytest.raises(plugin.SGLangVersionError):
            plugin.check_sglang_version("0.6.0")
    finally:
        registry._REGISTRY[ALGORITHM] = saved


def test_eagle_alternatives_keep_the_tree_width_and_a_default_over_the_limit_stops_the_start(models, monkeypatch):
    """``eagle_alternatives`` leaves the verify width SGLang is told about as the chains' (``--speculative-num-draft-
    tokens`` = ``n_nodes + 1`` with ``n_nodes = steps + ngram_k``: the leaves compete for those nodes, so SGLang's
    width-sized buffers do not grow with them); a default above the tree limit stops the start, naming the settings
    that lower it."""
    _, plain = _resolve(_argv(models, "--speculative-num-steps", "3"))
    monkeypatch.setenv("SGLANG_HYBRID_EAGLE_ALTERNATIVES", "2")
    _, v = _resolve(_argv(models, "--speculative-num-steps", "3"))
    assert v.speculative_num_draft_tokens == plain.speculative_num_draft_tokens == 3 + 8 + 1
    monkeypatch.setenv("SGLANG_HYBRID_NGRAM_K", "32")
    with pytest.raises(Exception, match=r"n_nodes = steps \+ ngram_k = 72 is above 63: lower --speculative-num-steps "
                                        r"or SGLANG_HYBRID_NGRAM_K"):
        _resolve(_argv(models, "--speculative-num-steps", "40"))
