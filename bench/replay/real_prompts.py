"""Prompts for the real-drafter traces, split into tuning and evaluation by source.

Three workloads, each written by the model itself when the trace is recorded (`bench.replay.record.record_real`):

* ``code`` (copy-heavy): a piece of a real package's source and "rename `name` everywhere, reply with the complete
  updated code": most of the reply is a copy of the prompt.
* ``code-edit`` (edit-dense): another piece and "add a docstring to every function and type hints to its
  parameters, reply with the complete updated code": copied lines interleaved with text the model writes fresh.
* ``chat``: a ShareGPT first-turn question (records after the ones the shipped EAGLE head trained on).

Why the split is by source: a selector or a baseline tuned on the same files or conversations it is scored on can
learn them. Tuning code comes from other packages than evaluation code (`TUNE_PACKAGES` vs `EVAL_PACKAGES`), and
tuning conversations are other ShareGPT records than evaluation ones (`chat_split`). None of these packages is in
the EAGLE head's training data (it trained on the standard library and earlier ShareGPT records).

Everything here is deterministic: the same wheels and the same ShareGPT file give the same prompts in the same order.
"""
from __future__ import annotations

import functools
import hashlib
import re
import zipfile
from typing import NamedTuple

from bench import data as D

#: evaluation code: the newer releases of the code-edit benchmark's packages (already cached for it)
EVAL_PACKAGES = (("requests", "2.32.0"), ("click", "8.1.8"), ("flask", "3.1.0"), ("jinja2", "3.1.5"),
                 ("werkzeug", "3.1.0"))
#: tuning code: other packages, so no evaluation file is ever seen while tuning
TUNE_PACKAGES = (("attrs", "24.2.0"), ("packaging", "24.2"), ("pluggy", "1.5.0"), ("idna", "3.10"),
                 ("itsdangerous", "2.2.0"), ("tomli", "2.2.1"))
#: candidates per (workload, split); a candidate is kept when its greedy reply reaches the trace's output length, so
#: these leave room above the 48 evaluation requests the replay needs per workload
CANDIDATES = {("code", "eval"): 56, ("code-edit", "eval"): 56, ("chat", "eval"): 72,
              ("code", "tune"): 16, ("code-edit", "tune"): 16, ("chat", "tune"): 24}
WORKLOADS = ("code", "code-edit", "chat")
SPLITS = ("tune", "eval")
#: a code piece: whole top-level blocks of a file, joined until at least MIN_CHARS, never above MAX_CHARS
MIN_CHARS, MAX_CHARS = 1000, 3000
#: ShareGPT records the shipped head trained on come before this one (`sglang_hybrid.reference.prompts`)
CHAT_FIRST_RECORD = 2100
#: a chat candidate's question got a long answer from ChatGPT (so a 256-token reply is natural, not forced)
CHAT_MIN_ANSWER_CHARS = 1500
CHAT_MAX_QUESTION_CHARS = 600


class RealPrompt(NamedTuple):
    id: str
    workload: str
    split: str
    source: str  # the package (code) or "sharegpt" (chat): what the split keeps apart
    text: str


def chat_split(index: int) -> str:
    """A ShareGPT record's split, from its position in the file: a quarter tune, the rest evaluate."""
    return "tune" if int(hashlib.sha256(f"chat-{index}".encode()).hexdigest(), 16) % 4 == 0 else "eval"


def code_pieces(source: str) -> list:
    """Pieces of one file: consecutive top-level blocks (a def, a class, or the statements between them) joined until
    `MIN_CHARS`; a piece above `MAX_CHARS` is dropped; only pieces that define a function are kept."""
    starts = [m.start() for m in re.finditer(r"^(?:def|class|async def|@)", source, flags=re.M)]
    blocks, prev = [], 0
    for s in starts + [len(source)]:
        if s > prev:
            blocks.append(source[prev:s])
        prev = s
    # a decorator line begins its block: glue it to the def/class that follows
    merged: list = []
    for b in blocks:
        if merged and merged[-1].lstrip().startswith("@") and not re.search(r"^(?:def|class|async def)", merged[-1],
                                                                             flags=re.M):
            merged[-1] += b
        else:
            merged.append(b)
    pieces, cur = [], ""
    for b in merged:
        cur += b
        if len(cur) >= MIN_CHARS:
            if len(cur) <= MAX_CHARS and re.search(r"^\s*(?:async )?def [A-Za-z_]", cur, flags=re.M):
                pieces.append(cur)
            cur = ""
    return pieces


def _package_pieces(packages) -> list:
    """(package, path, piece) for every piece of every file of the packages' wheels, in a fixed order; at most two
    pieces a file, so no file dominates."""
    cache = D.data_dir() / "wheels"
    cache.mkdir(exist_ok=True)
    out = []
    for pkg, version in packages:
        with zipfile.ZipFile(D._wheel(pkg, version, cache)) as z:
            for name in sorted(n for n in z.namelist() if n.endswith(".py")):
                src = z.read(name).decode("utf-8", errors="replace")
                out += [(pkg, name, p) for p in code_pieces(src)[:2]]
    return out


def _interleave(items: list, key) -> list:
    """Round-robin over the groups `key` names (order kept inside each), so the first N spread over every group."""
    groups: dict = {}
    for it in items:
        groups.setdefault(key(it), []).append(it)
    out, lists = [], list(groups.values())
    for i in range(max((len(g) for g in lists), default=0)):
        out += [g[i] for g in lists if i < len(g)]
    return out


def code_prompts(split: str) -> dict:
    """{"code": [...], "code-edit": [...]} for one split: pieces alternate between the two workloads, so each
    workload's pieces are distinct."""
    pieces = _interleave(_package_pieces(EVAL_PACKAGES if split == "eval" else TUNE_PACKAGES), key=lambda t: t[0])
    out: dict = {"code": [], "code-edit": []}
    for i, (pkg, path, piece) in enumerate(pieces):
        workload = ("code", "code-edit")[i % 2]
        if len(out[workload]) >= CANDIDATES[(workload, split)]:
            continue
        pid = f"{workload}:{pkg}:{path}:{i}"
        fence = f"Here is a part of `{path}` from the {pkg} package:\n```python\n{piece}```\n"
        if workload == "code":
            name = re.search(r"^\s*(?:async )?def ([A-Za-z_][A-Za-z0-9_]*)", piece, flags=re.M).group(1)
            task = f"Rename `{name}` to `{name}_v2` everywhere in this code. Reply with the complete updated code."
        else:
            task = ("Add a docstring to every function and type hints to every parameter in this code. "
                    "Reply with the complete updated code.")
        out[workload].append(RealPrompt(pid, workload, split, pkg, fence + task))
    return out


def chat_prompts(split: str) -> list:
    """ShareGPT first-turn questions whose ChatGPT answer was long, after the head's training records, in this
    split."""
    from sglang_hybrid.reference.corpus import iter_sharegpt

    want = CANDIDATES[("chat", split)]
    out = []
    # numbered as the head's training numbered them (iter_sharegpt's default filter), so "after" means after
    for i, (q, a) in enumerate(iter_sharegpt(limit=CHAT_FIRST_RECORD + 20000)):
        if (i < CHAT_FIRST_RECORD or len(a) < CHAT_MIN_ANSWER_CHARS or len(q) > CHAT_MAX_QUESTION_CHARS
                or chat_split(i) != split):
            continue
        out.append(RealPrompt(f"chat:sharegpt:{i}", "chat", split, "sharegpt", q.strip()))
        if len(out) >= want:
            break
    return out


@functools.lru_cache(maxsize=1)
def real_prompts() -> tuple:
    """Every candidate prompt, in a fixed order: by workload, then split (read once: the chat candidates take a pass
    over about 20,000 ShareGPT records)."""
    out = []
    for split in SPLITS:
        code = code_prompts(split)
        for w in WORKLOADS:
            out += code[w] if w != "chat" else chat_prompts(split)
    order = {w: i for i, w in enumerate(WORKLOADS)}
    return tuple(sorted(out, key=lambda p: (order[p.workload], SPLITS.index(p.split))))
