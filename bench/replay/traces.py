"""The replay's traces: per-position trace files as arrays, synthetic traces, and the workloads a run replays.

Reading and writing go through `sglang_hybrid.reference.trace`, the project's only trace reader and writer (format in
docs/ARCHITECTURE.md, "Per-position traces"); this module only converts its records into the numpy arrays the replay
indexes, and back. Recording a real trace is `bench.replay.record`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from sglang_hybrid.reference import trace as TR

TraceError = TR.TraceFormatError  # a trace file does not follow the documented format (names the line and field)


@dataclasses.dataclass
class TraceRequest:
    """One request of a per-position trace, as arrays (row p of eagle_* = the chain drafted after output[:p])."""

    id: str
    workload: str
    prompt: np.ndarray        # int32 [P]
    output: np.ndarray        # int32 [L]
    eagle_tokens: np.ndarray  # int32 [L, K]
    eagle_probs: np.ndarray   # float32 [L, K]
    #: int32 / float32 [L, K, M]: each chain position's next M tokens (the header's eagle_alternatives), or None
    eagle_alt_tokens: np.ndarray | None = None
    eagle_alt_probs: np.ndarray | None = None


@dataclasses.dataclass
class Trace:
    header: TR.TraceHeader
    requests: list

    @property
    def temperature(self) -> float:
        return float(self.header.temperature)

    @property
    def eagle_k(self) -> int:
        return int(self.header.eagle_k)

    @property
    def eagle_alternatives(self) -> int:
        return int(self.header.eagle_alternatives)


def read_trace(path) -> Trace:
    """Read and validate a trace with `sglang_hybrid.reference.trace.read_trace` (raises `TraceError`, or
    FileNotFoundError), then turn each record into arrays."""
    header, records = TR.read_trace(path)
    k, m = header.eagle_k, header.eagle_alternatives
    reqs = []
    for r in records:
        n = len(r.output)
        alt = (np.asarray(r.eagle_alt_tokens, np.int32).reshape(n, k, m),
               np.asarray(r.eagle_alt_probs, np.float32).reshape(n, k, m)) if m else (None, None)
        reqs.append(TraceRequest(r.id, r.workload, np.asarray(r.prompt, np.int32), np.asarray(r.output, np.int32),
                                 np.asarray(r.eagle_tokens, np.int32).reshape(n, k),
                                 np.asarray(r.eagle_probs, np.float32).reshape(n, k), *alt))
    return Trace(header, reqs)


def write_trace(trace: Trace, path) -> None:
    """Write a trace with `sglang_hybrid.reference.trace.write_trace` (used for synthetic traces; real ones come from
    the reference loop or `bench.replay.record`); probabilities are rounded to 5 decimals."""
    m = trace.eagle_alternatives
    records = [TR.TraceRecord(r.id, r.workload, r.prompt.tolist(), r.output.tolist(), r.eagle_tokens.tolist(),
                              np.round(r.eagle_probs.astype(float), 5).tolist(),
                              eagle_alt_tokens=r.eagle_alt_tokens.tolist() if m else None,
                              eagle_alt_probs=np.round(r.eagle_alt_probs.astype(float), 5).tolist() if m else None)
               for r in trace.requests]
    TR.write_trace(path, trace.header, records)


def synthetic_trace(n_code: int = 6, n_chat: int = 6, k: int = 8, vocab: int = 500, out_len: int = 120,
                    eagle_hit: float = 0.55, seed: int = 0, temperature: float = 0.0) -> Trace:
    """A small synthetic trace with the two regimes that matter: code edits (the output mostly copies spans of the
    prompt, so n-gram drafts are long and right) and chat (fresh text, n-gram rarely right). The EAGLE chain at each
    position is right for a geometric number of tokens (continuation probability `eagle_hit`), with draft
    probabilities that are informative (higher when right). For tests and for running the benchmark before real
    traces exist; never reported as a result."""
    rng = np.random.default_rng(seed)
    reqs = []

    def eagle_rows(prompt, output):
        L = len(output)
        toks = np.zeros((L, k), np.int32)
        probs = np.zeros((L, k), np.float32)
        for p in range(L):
            run = 0
            while run < k and rng.random() < eagle_hit:
                run += 1
            for j in range(k):
                truth = output[p + j] if p + j < L else int(rng.integers(vocab))
                if j < run:
                    toks[p, j], probs[p, j] = truth, rng.uniform(0.5, 1.0)
                else:
                    wrong = int(rng.integers(vocab))
                    toks[p, j] = wrong if wrong != truth else (wrong + 1) % vocab
                    probs[p, j] = rng.uniform(0.0, 0.6)
        return toks, probs

    for i in range(n_code):
        prompt = rng.integers(0, vocab, size=int(rng.integers(150, 300))).astype(np.int32)
        out = []
        while len(out) < out_len:  # copy a span of the prompt, then a short fresh edit
            start = int(rng.integers(0, len(prompt) - 40))
            out.extend(prompt[start:start + int(rng.integers(15, 40))].tolist())
            out.extend(rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist())
        out = np.asarray(out[:out_len], np.int32)
        et, ep = eagle_rows(prompt, out)
        reqs.append(TraceRequest(f"code-{i}", "code", prompt, out, et, ep))
    for i in range(n_chat):
        prompt = rng.integers(0, vocab, size=int(rng.integers(20, 60))).astype(np.int32)
        out = rng.integers(0, vocab, size=out_len).astype(np.int32)
        et, ep = eagle_rows(prompt, out)
        reqs.append(TraceRequest(f"chat-{i}", "chat", prompt, out, et, ep))
    header = TR.TraceHeader(model="synthetic", draft_model="synthetic", temperature=float(temperature), eagle_k=k,
                            created="synthetic")
    return Trace(header, reqs)


def load_workloads(trace_paths, synthetic: bool, seed: int) -> tuple:
    """({temperature: [TraceRequest]}, eagle_k, traces) from the given traces (or a synthetic trace), checking eagle_k
    agrees."""
    traces = [synthetic_trace(seed=seed)] if synthetic else [read_trace(p) for p in trace_paths]
    by_t: dict = {}
    ks = {t.eagle_k for t in traces}
    if len(ks) != 1:
        raise TraceError(f"traces disagree on eagle_k: {sorted(ks)}")
    for t in traces:
        empty = [r.id for r in t.requests if len(r.output) == 0]
        if empty:
            print(f"note: skipping {len(empty)} request(s) with an empty output: {', '.join(empty[:5])}")
        by_t.setdefault(t.temperature, []).extend(r for r in t.requests if len(r.output))
    return by_t, ks.pop(), traces


def read_real_traces(directory) -> tuple:
    """(tuning `Trace`, evaluation `Trace`, manifest) of the committed real-drafter traces in ``directory``
    (`bench.replay.record.assemble_real` wrote them): each file's SHA-256 is checked against the manifest, so a
    replay never runs on a file other than the one recorded. Raises FileNotFoundError (naming the command that
    records them) or `TraceError` (a checksum differs)."""
    import hashlib
    import json
    from pathlib import Path

    directory = Path(directory)
    manifest_path = directory / "smollm2_real.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no real-drafter traces in {directory} (record them with python -m bench.replay "
                                "--record-real out/real_traces, about an hour on two cores)")
    manifest = json.loads(manifest_path.read_text())
    out = []
    for split in ("tune", "eval"):
        path = directory / f"smollm2_real_{split}.jsonl.gz"
        want = manifest["files"].get(path.name)
        got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if got is None or got != want:
            raise TraceError(f"{path}: {'missing' if got is None else 'checksum differs from ' + manifest_path.name}"
                             "; record and assemble the traces again (python -m bench.replay --record-real DIR)")
        out.append(read_trace(path))
    return out[0], out[1], manifest
