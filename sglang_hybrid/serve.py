"""SGLang's own HTTP server with HYBRID on this CPU, the embedded SmolLM2 and the shipped EAGLE head.

    python -m sglang_hybrid.serve --cpu [--torch-kernels | --no-speculation] [SGLang server flags]
    python -m sglang_hybrid.serve --cpu --host 127.0.0.1 --port 30000 --enable-metrics

Why a module: SGLang serves on a CPU only with its environment set before ``sglang`` is imported and a dozen server
flags (``sglang_hybrid.cpu_engine``); a user typing ``python -m sglang.launch_server`` cannot set the first, and should
not have to find the second. This module applies that recipe, then hands over to SGLang's own launch path
(``load_plugins``, ``prepare_server_args``, ``sglang.launch_server.run_server``): the OpenAI-compatible API,
streaming, ``/metrics`` and every other flag are SGLang's. Flags given here come after the recipe's, so any of them
overrides it (e.g. ``--context-length 2048``, ``--max-running-requests 8``).

Two kinds of request SGLang's server would serve although OpenAI's API refuses them, a ``model`` it does not serve
and ``temperature`` above 2, are refused here with OpenAI's 404 and a 400 (``sglang_hybrid.http_guard``).

``--no-speculation`` serves the same model without speculation (``torch_native``, much faster on CPU): the
reference HYBRID's greedy output must equal, and what the live server tests compare with.

``--torch-kernels`` is the try-out server: without it the CPU engine runs HYBRID's fused kernels and SGLang's
speculative Triton kernels in Triton's interpreter (seconds per token: what the live suite checks); with it, every one
of them runs as its torch twin, each chosen by an explicit setting, so none counts as a fallback: HYBRID's per-step
device work on the torch operators (setting ``decision_kernels=torch``) and SGLang's attention, KV-index and greedy
tree-verify kernels through the CPU engine's twins (``cpu_engine.prepare_environment(torch_kernels=True)``), each
checked against its kernel in the tests. ``python -m bench.cpu_serving`` times it against ``--no-speculation``.

On a GPU there is nothing to apply: run ``python -m sglang.launch_server --speculative-algorithm HYBRID ...``.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sglang_hybrid.check import DEFAULT_DRAFT  # the shipped EAGLE head for the embedded SmolLM2
from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

#: HYBRID settings the CPU server gets unless the environment sets them: a decode step takes seconds on the CPU engine,
#: so a counter log line and a Prometheus export every step cost nothing, and /metrics is exact after each response
#: (the default, every 50 steps, would show a user trying one request nothing at all)
CPU_SETTINGS = {ENV_PREFIX + "LOG_INTERVAL": "1"}
#: HYBRID settings ``--torch-kernels`` sets: the decision, proposals, verify input, ragged layout and after-verify work
#: on the torch operators, chosen (not the ``auto`` fallback: no ``fallback_decision_torch`` is counted)
TORCH_KERNEL_SETTINGS = {ENV_PREFIX + "DECISION_KERNELS": "torch"}
GPU_LAUNCH = ("python -m sglang.launch_server --model-path M --speculative-algorithm HYBRID "
              "--speculative-draft-model-path D --speculative-num-steps 4 --page-size 1")
EXIT_BAD_USE = 2


def spawn(flags: list, log: Path, env: dict, cwd=None) -> tuple:
    """(process, port): ``python -m sglang_hybrid.serve --cpu --host 127.0.0.1 --port PORT *flags`` on a free local
    port, its output in ``log``, in a process group of its own so that `stop` ends SGLang's scheduler and
    detokenizer with it (the benches and tests that start a server beside themselves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_hybrid.serve", "--cpu", "--host", "127.0.0.1", "--port",
                                 str(port), *flags], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    """End a server `spawn` started, and its engine processes: SIGTERM to its process group, SIGKILL after 60 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


class ServeUsageError(ValueError):
    """A command line this module refuses; the message names the flag and the fix."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_hybrid.serve", description=__doc__.split("\n\n")[0], allow_abbrev=False,
        epilog="Any other flag goes to SGLang's server (python -m sglang.launch_server --help lists them), e.g. "
               "--host 127.0.0.1 --port 30000 --enable-metrics. On a GPU run " + GPU_LAUNCH)
    ap.add_argument("--cpu", action="store_true",
                    help="serve on SGLang's CPU engine (required: the only target this module has)")
    ap.add_argument("--no-speculation", action="store_true",
                    help="plain decoding (torch_native), the reference for HYBRID's greedy output")
    ap.add_argument("--torch-kernels", action="store_true",
                    help="the try-out server: run HYBRID's step kernels and SGLang's speculative Triton kernels as "
                         "their torch twins, not in Triton's interpreter (decision_kernels=torch and the CPU "
                         "engine's twins; median inter-token latency within 5x --no-speculation's, where the "
                         "interpreter takes seconds per token)")
    ap.add_argument("--model-path", default=None, help="target model (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--speculative-draft-model-path", default=str(DEFAULT_DRAFT),
                    help="EAGLE draft head (default: the shipped SmolLM2 head)")
    ap.add_argument("--speculative-num-steps", type=int, default=3, help="EAGLE draft steps (default 3)")
    ap.add_argument("--speculative-algorithm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default=None, help=argparse.SUPPRESS)
    # SGLang's flag, kept at its default 1: more workers re-import SGLang's app without the request guard
    ap.add_argument("--tokenizer-worker-num", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1,
                    help="tensor-parallel ranks over gloo (default 1)")
    return ap


def validate(args) -> None:
    """Refuse what this module cannot serve, before anything is imported or converted."""
    if not args.cpu:
        raise ServeUsageError(
            "this module serves on SGLang's CPU engine only: add --cpu. On a GPU, SGLang's own launcher needs no "
            f"recipe: {GPU_LAUNCH}")
    if args.device not in (None, "cpu"):
        raise ServeUsageError(f"--device {args.device}: this module serves on the CPU; drop --device, or on a GPU run "
                              f"{GPU_LAUNCH}")
    if args.speculative_algorithm is not None and args.speculative_algorithm.upper() != "HYBRID":
        raise ServeUsageError(
            f"--speculative-algorithm {args.speculative_algorithm}: this module serves HYBRID (or no speculation "
            "with --no-speculation); drop the flag, or run another algorithm with python -m sglang.launch_server")
    if args.no_speculation and args.speculative_algorithm is not None:
        raise ServeUsageError("--no-speculation and --speculative-algorithm contradict each other: keep one")
    if args.no_speculation and args.torch_kernels:
        raise ServeUsageError("--torch-kernels chooses the speculative kernels' torch twins, and --no-speculation "
                              "runs none (it is torch_native already): drop --torch-kernels")
    if args.torch_kernels:
        for key, value in TORCH_KERNEL_SETTINGS.items():
            if os.environ.get(key, value) != value:
                raise ServeUsageError(f"--torch-kernels sets {key}={value}, but the environment sets it to "
                                      f"{os.environ[key]!r}: unset it, or drop --torch-kernels")
    if args.tokenizer_worker_num != 1:
        raise ServeUsageError(f"--tokenizer-worker-num {args.tokenizer_worker_num}: this server runs one HTTP process "
                              "(the request guard, sglang_hybrid/http_guard.py, lives in it); drop the flag")
    if args.tp_size < 1 or args.speculative_num_steps < 1:
        raise ServeUsageError("--tp-size and --speculative-num-steps must be at least 1")
    if not args.no_speculation and not Path(args.speculative_draft_model_path, "config.json").is_file():
        raise ServeUsageError(f"--speculative-draft-model-path {args.speculative_draft_model_path}: no config.json "
                              "there; point it at an EAGLE head folder (the default is the shipped SmolLM2 head)")


def kwargs_to_flags(kwargs: dict) -> list[str]:
    """``sglang.Engine`` keyword arguments as SGLang server flags (the same ``ServerArgs`` fields): ``True`` is a bare
    switch, ``False``/``None`` are SGLang's defaults and left out."""
    flags: list[str] = []
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def server_argv(args, model_path: str, passthrough: list[str]) -> list[str]:
    """The CPU recipe as server flags, then the user's own (later flags win in SGLang's parser)."""
    from sglang_hybrid.cpu_engine import engine_kwargs

    spec = None
    if not args.no_speculation:
        spec = dict(speculative_algorithm="HYBRID", speculative_draft_model_path=args.speculative_draft_model_path,
                    speculative_num_steps=args.speculative_num_steps)
    kw = engine_kwargs(model_path, speculative=spec, tp_size=args.tp_size)
    kw["log_level"] = "info"     # a server says where it listens and when it is ready (the recipe's engines are quiet)
    # an idle SGLang scheduler otherwise polls its sockets in a busy loop: a core taken from the forwards on a CPU host
    kw["sleep_on_idle"] = True
    return kwargs_to_flags(kw) + passthrough


def main(argv=None) -> int:
    args, passthrough = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        validate(args)
    except ServeUsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_USE
    from sglang_hybrid.cpu_engine import prepare_environment

    for key, value in CPU_SETTINGS.items():
        os.environ.setdefault(key, value)
    if args.torch_kernels:
        os.environ.update(TORCH_KERNEL_SETTINGS)
    prepare_environment(args.tp_size, torch_kernels=args.torch_kernels)
    model_path = args.model_path
    if model_path is None:
        from sglang_hybrid.reference.models import ModelPackageMissing, ensure_converted

        try:
            model_path = str(ensure_converted())
        except ModelPackageMissing as e:
            print(f"error: {e} (scripts/setup.sh installs it), or pass --model-path", file=sys.stderr)
            return EXIT_BAD_USE
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from sglang_hybrid.http_guard import install_on_sglang_server

    load_plugins()      # registers HYBRID as a --speculative-algorithm choice before the flags are parsed
    server_args = prepare_server_args(server_argv(args, model_path, passthrough))
    install_on_sglang_server()
    try:
        run_server(server_args)
    finally:                       # as SGLang's own launcher: the scheduler and detokenizer go with the server
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
