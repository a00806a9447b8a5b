"""Per-position trace files (reference loop -> replay benchmark), format fixed in docs/ARCHITECTURE.md.

JSON Lines, UTF-8. Line 1 is a header `{"format": "hybrid-spark-trace", "version": 1, "model", "draft_model",
"temperature", "eagle_k", "created"}` and optionally `"eagle_alternatives": M` (absent = 0); each further line is one
request `{"id", "workload", "prompt", "output", "eagle_tokens", "eagle_probs"}` where row `p` of `eagle_tokens` /
`eagle_probs` is the EAGLE chain drafted after committing `prompt + output[:p]` (guesses for `output[p],
output[p+1], ...`). With M > 0 each request also holds `"eagle_alt_tokens"` / `"eagle_alt_probs"` (`[len(output)]
[eagle_k][M]`): at each chain position the same draft forward's ranks 2 to M + 1, the chain's token excluded (what the
SGLang worker's setting `eagle_alternatives` hangs as leaves), so a replay can run that setting on real drafts.

Why one EAGLE row per position rather than per loop step: the target is causal, so the draft after a given prefix
does not depend on how the prefix was reached; with a row per position a replay can simulate any drafter policy.
The rows are computed in one teacher-forced target pass over `prompt + output` (`eagle_rows`), exactly the features
the loop would have seen incrementally. n-gram drafts are not stored: the drafter is deterministic in the committed
tokens, so a replay recomputes them.

Extra per-request keys (e.g. the loop's per-step statistics) are allowed and ignored by readers.

This module is the project's only trace reader and writer (the replay benchmark, bench/replay/traces.py, converts its
records to arrays).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "hybrid-spark-trace"
VERSION = 1


class TraceFormatError(ValueError):
    """A trace file does not follow the documented format (the message names line and field)."""


@dataclass
class TraceHeader:
    model: str
    draft_model: str
    temperature: float
    eagle_k: int
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    #: next-ranked tokens per chain position each record holds (0: the chain only, as in traces before this key)
    eagle_alternatives: int = 0

    def to_json(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "model": self.model, "draft_model": self.draft_model,
             "temperature": float(self.temperature), "eagle_k": int(self.eagle_k), "created": self.created}
        if self.eagle_alternatives:
            d["eagle_alternatives"] = int(self.eagle_alternatives)
        return d


@dataclass
class TraceRecord:
    id: str
    workload: str
    prompt: list[int]
    output: list[int]
    eagle_tokens: list[list[int]]
    eagle_probs: list[list[float]]
    extra: dict = field(default_factory=dict)
    #: ``[len(output)][eagle_k][M]`` when the header's ``eagle_alternatives`` = M > 0, else None
    eagle_alt_tokens: list | None = None
    eagle_alt_probs: list | None = None

    def to_json(self) -> dict:
        d = {"id": self.id, "workload": self.workload, "prompt": self.prompt, "output": self.output,
             "eagle_tokens": self.eagle_tokens, "eagle_probs": self.eagle_probs}
        if self.eagle_alt_tokens is not None:
            d["eagle_alt_tokens"], d["eagle_alt_probs"] = self.eagle_alt_tokens, self.eagle_alt_probs
        d.update(self.extra)
        return d


def _check_row(tokens, probs, p: int, where: str, name: str) -> None:
    """Row ``p`` of ``<name>_tokens`` / ``<name>_probs`` (flat): token ids are ints >= -1 (-1: no token), draft
    probabilities finite floats in [0, 1]."""
    if not all(isinstance(t, int) and t >= -1 for t in tokens):
        raise TraceFormatError(f"{where}: {name}_tokens row {p} has a non-int or < -1 entry")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) and 0.0 <= x <= 1.0 for x in probs):
        raise TraceFormatError(f"{where}: {name}_probs row {p} must hold finite floats in [0, 1]")


def _check_alternatives(rec: TraceRecord, k: int, m: int, where: str) -> None:
    """The alternatives' shape ``[n][k][m]``, token ids >= -1, probabilities finite in [0, 1]; absent when m = 0."""
    if not m:
        if rec.eagle_alt_tokens is not None or rec.eagle_alt_probs is not None:
            raise TraceFormatError(f"{where}: 'eagle_alt_tokens'/'eagle_alt_probs' given but the header's "
                                   "eagle_alternatives is 0 (absent)")
        return
    n = len(rec.output)
    for name in ("eagle_alt_tokens", "eagle_alt_probs"):
        v = getattr(rec, name)
        if not (isinstance(v, list) and len(v) == n and all(isinstance(r, list) and len(r) == k and all(
                isinstance(c, list) and len(c) == m for c in r) for r in v)):
            raise TraceFormatError(f"{where}: '{name}' must be [{n} output positions][eagle_k={k}]"
                                   f"[eagle_alternatives={m}]")
    for p, (tr, pr) in enumerate(zip(rec.eagle_alt_tokens, rec.eagle_alt_probs)):
        _check_row((t for c in tr for t in c), (x for c in pr for x in c), p, where, "eagle_alt")


def _check_record(rec: TraceRecord, k: int, where: str, m: int = 0) -> None:
    if not isinstance(rec.id, str) or not isinstance(rec.workload, str):
        raise TraceFormatError(f"{where}: 'id' and 'workload' must be strings")
    for name in ("prompt", "output"):
        v = getattr(rec, name)
        if not isinstance(v, list) or not all(isinstance(t, int) and t >= 0 for t in v):
            raise TraceFormatError(f"{where}: '{name}' must be a list of non-negative ints")
    if not rec.prompt:
        raise TraceFormatError(f"{where}: 'prompt' is empty")
    n = len(rec.output)
    if len(rec.eagle_tokens) != n or len(rec.eagle_probs) != n:
        raise TraceFormatError(f"{where}: 'eagle_tokens'/'eagle_probs' need one row per output position "
                               f"({n}), got {len(rec.eagle_tokens)}/{len(rec.eagle_probs)}")
    for p, (tr, pr) in enumerate(zip(rec.eagle_tokens, rec.eagle_probs)):
        if len(tr) != k or len(pr) != k:
            raise TraceFormatError(f"{where}: row {p} must have eagle_k={k} entries")
        _check_row(tr, pr, p, where, "eagle")
    _check_alternatives(rec, k, m, where)


def _open_text(name: Path, path: Path, mode: str):
    """A trace file opened as text: gzip-compressed when ``name`` ends in ``.gz`` (written with mtime 0, so the same
    records give the same bytes and checksum)."""
    if name.suffix == ".gz":
        import gzip
        import io

        if mode == "w":
            return io.TextIOWrapper(gzip.GzipFile(path, "wb", mtime=0), encoding="utf-8")
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def write_trace(path: str | Path, header: TraceHeader, records: list[TraceRecord]) -> Path:
    """Validate and write a trace (atomically: a temp file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(records):
        _check_record(r, header.eagle_k, f"record {i} ({r.id})", header.eagle_alternatives)
    tmp = path.with_name(path.name + ".tmp")
    with _open_text(path, tmp, "w") as fh:
        fh.write(json.dumps(header.to_json()) + "\n")
        for r in records:
            fh.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def read_trace(path: str | Path) -> tuple[TraceHeader, list[TraceRecord]]:
    """Read and validate a trace; raises `TraceFormatError` naming the line and field on any deviation."""
    path = Path(path)
    with _open_text(path, path, "r") as fh:
        lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    if not lines:
        raise TraceFormatError(f"{path}: empty file")
    try:
        h = json.loads(lines[0])
    except ValueError as e:
        raise TraceFormatError(f"{path}:1: invalid JSON ({e})") from None
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        raise TraceFormatError(f"{path}:1: header 'format' must be {FORMAT!r}")
    if h.get("version") != VERSION:
        raise TraceFormatError(f"{path}:1: unsupported version {h.get('version')!r} (expected {VERSION})")
    try:
        header = TraceHeader(model=str(h["model"]), draft_model=str(h["draft_model"]),
                             temperature=float(h["temperature"]), eagle_k=int(h["eagle_k"]),
                             created=str(h["created"]), eagle_alternatives=int(h.get("eagle_alternatives", 0)))
    except KeyError as e:
        raise TraceFormatError(f"{path}:1: header misses {e}") from None
    except (TypeError, ValueError) as e:
        raise TraceFormatError(f"{path}:1: bad header value ({e})") from None
    if header.eagle_k < 0:
        raise TraceFormatError(f"{path}:1: eagle_k must be >= 0")
    if header.eagle_alternatives < 0:
        raise TraceFormatError(f"{path}:1: eagle_alternatives must be >= 0")
    records = []
    for ln, line in enumerate(lines[1:], start=2):
        try:
            d = json.loads(line)
        except ValueError as e:
            raise TraceFormatError(f"{path}:{ln}: invalid JSON ({e})") from None
        if not isinstance(d, dict):
            raise TraceFormatError(f"{path}:{ln}: a request must be a JSON object")
        keys = ("id", "workload", "prompt", "output", "eagle_tokens", "eagle_probs")
        missing = [k for k in keys if k not in d]
        if missing:
            raise TraceFormatError(f"{path}:{ln}: missing {missing}")
        alt = ("eagle_alt_tokens", "eagle_alt_probs")
        rec = TraceRecord(*(d[k] for k in keys), extra={k: v for k, v in d.items() if k not in keys + alt},
                          eagle_alt_tokens=d.get(alt[0]), eagle_alt_probs=d.get(alt[1]))
        _check_record(rec, header.eagle_k, f"{path}:{ln}", header.eagle_alternatives)
        records.append(rec)
    return header, records


@torch.no_grad()
def eagle_rows(target, head, prompt: list[int], output: list[int], k: int, alternatives: int = 0):
    """EAGLE chains (tokens, probs as lists) for every output position, via one teacher-forced target pass; with
    ``alternatives`` = M > 0 also each chain position's next M tokens and probabilities (the records'
    ``eagle_alt_tokens`` / ``eagle_alt_probs``)."""
    from sglang_hybrid.reference.drafters import EagleDrafter

    if not output:
        return ([], [], [], []) if alternatives else ([], [])
    tokens = torch.tensor(prompt + output)
    feats = target.model(input_ids=tokens[None]).last_hidden_state[0].to(next(head.parameters()).dtype)
    dr = EagleDrafter(head, target)
    got = dr.trace_rows(feats, tokens, len(prompt), k, alternatives)
    out = [got[0].tolist(), rounded(got[1].tolist())]
    if alternatives:
        out += [got[2].tolist(), [rounded(r) for r in got[3].tolist()]]
    return tuple(out)


def rounded(rows: list, decimals: int = 6) -> list:
    """Probabilities rounded to ``decimals`` (6: the file's precision)."""
    return [[round(float(x), decimals) for x in row] for row in rows]


def records_from_results(target, head, results, k: int, progress: bool = False) -> list[TraceRecord]:
    """Trace records for loop `Result`s (their outputs), with the loop's per-step stats as extra keys."""
    from tqdm import tqdm

    out = []
    for r in tqdm(results, desc="trace rows", disable=not progress, leave=False):
        toks, probs = eagle_rows(target, head, r.prompt, r.output, k)
        extra = {"steps": [[s.source, s.n_nodes, s.accepted] for s in r.steps]}
        out.append(TraceRecord(r.id, r.workload, list(r.prompt), list(r.output), toks, probs, extra))
    return out
