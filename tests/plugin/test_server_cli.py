"""``python -m sglang_hybrid.serve``'s command line without starting a server: what it refuses (with the fix in the
message), and that the CPU recipe it builds is what SGLang's own argument pipeline resolves, with the user's flags
winning over the recipe's. Tiny model configs (config.json only: resolution reads configs, never weights)."""
from __future__ import annotations


import pytest

from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

from sglang_hybrid import serve  # noqa: E402
from sglang_hybrid.sglang_plugin import register  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("clean_hybrid_env")]


@pytest.mark.parametrize("argv, words", [
    ([], ["--cpu", "python -m sglang.launch_server --model-path M --speculative-algorithm HYBRID"]),
    (["--port", "30000"], ["add --cpu", "sglang.launch_server"]),
    (["--cpu", "--device", "cuda"], ["--device cuda", "drop --device"]),
    (["--cpu", "--speculative-algorithm", "EAGLE"], ["--speculative-algorithm EAGLE", "serves HYBRID"]),
    (["--cpu", "--no-speculation", "--speculative-algorithm", "HYBRID"], ["contradict"]),
    (["--cpu", "--speculative-draft-model-path", "/nonexistent/head"], ["/nonexistent/head", "no config.json"]),
    (["--cpu", "--tp-size", "0"], ["--tp-size"]),
    (["--cpu", "--tokenizer-worker-num", "2"], ["--tokenizer-worker-num 2", "drop the flag"]),
])
def test_server_cli_refuses_bad_use_with_the_fix(argv, words, capsys):
    """Refused before SGLang is imported or the model converted: exit 2 and a message naming the flag and the fix."""
    assert serve.main(argv) == serve.EXIT_BAD_USE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and all(w in err for w in words), err


def _resolve(argv):
    register()
    sa = prepare_server_args(argv)
    sa.resolve_once()
    return resolved_view(sa)


def test_server_cli_recipe_resolves_in_sglang_with_user_flags_winning(models):
    """The HYBRID recipe as server flags resolves in SGLang's own pipeline to the CPU engine settings
    (``cpu_engine.engine_kwargs``); flags the user passes go to SGLang and override the recipe's."""
    args, rest = serve.build_parser().parse_known_args(
        ["--cpu", "--speculative-draft-model-path", models["eagle"], "--context-length", "2048",
         "--enable-metrics", "--port", "30123", "--skip-tokenizer-init"])
    serve.validate(args)
    v = _resolve(serve.server_argv(args, models["target"], rest))
    assert (v.device, v.dtype, v.attention_backend, v.page_size) == ("cpu", "float32", "triton", 1)
    assert (v.speculative_algorithm, v.speculative_draft_model_path, v.speculative_num_steps) == (
        "HYBRID", models["eagle"], 3)
    assert v.disable_cuda_graph and v.skip_server_warmup and v.sleep_on_idle and v.log_level == "info"
    assert (v.context_length, v.enable_metrics, v.port) == (2048, True, 30123)      # the user's flags


def test_server_cli_no_speculation_is_plain_torch_native(models):
    args, rest = serve.build_parser().parse_known_args(["--cpu", "--no-speculation", "--skip-tokenizer-init"])
    serve.validate(args)
    v = _resolve(serve.server_argv(args, models["target"], rest))
    assert v.speculative_algorithm is None and v.attention_backend == "torch_native"
    assert (v.device, v.dtype, v.context_length) == ("cpu", "float32", 1024)


def test_server_cli_flags_are_sglang_flags():
    """``True`` is a bare switch, ``False``/``None`` are left out (SGLang's defaults), the rest ``--flag value``."""
    assert serve.kwargs_to_flags({"model_path": "m", "disable_cuda_graph": True, "enable_x": False, "tp_size": 1,
                                  "chunked_prefill_size": None}) == [
        "--model-path", "m", "--disable-cuda-graph", "--tp-size", "1"]


def test_server_cli_spawned_server_stops_with_its_process_group(tmp_path):
    """``serve.spawn`` starts the server in a process group of its own on a free port, its output in the log: a bad
    command line ends with the usage exit status and the fix in the log, and ``serve.stop`` ends a starting server
    with its whole group (SGLang's scheduler and detokenizer are its children once it runs)."""
    import os

    log = tmp_path / "bad.log"
    proc, port = serve.spawn(["--no-speculation", "--torch-kernels"], log, dict(os.environ))
    assert proc.wait(timeout=300) == serve.EXIT_BAD_USE and 0 < port < 65536
    assert "--torch-kernels" in log.read_text()
    proc, _ = serve.spawn([], tmp_path / "server.log", dict(os.environ))
    assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)          # a group of its own
    serve.stop(proc)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
