"""Policy replay: the paper's throughput table, reproduced from per-position traces under a cost model.

Why replay instead of running engines: a trace recorded once by the CPU reference loop (target outputs + the EAGLE
chain drafted at every output position) determines what any policy would have accepted, because greedy decoding is
lossless -- the committed text is the same whatever was drafted -- and both drafters are deterministic functions of
the committed tokens. So we can simulate every policy at batch 4, 32 and 128 under any step-time model (measured on
this CPU, or GPU-shaped from a stated roofline) in seconds, with exactly the same requests and seeds.

Replay rule (per step, continuous batching at a fixed concurrency B):
  * every active request gets draft nodes from the policy (bench/policies.py);
  * accepted = the deepest draft node whose whole path equals the trace's output (greedy acceptance);
    emitted = accepted + 1 (the bonus token), capped at what is left of the output;
  * the step verifies n = sum over requests of (1 + draft nodes) tokens and costs T(n) + (EAGLE draft forwards) x
    t_draft from the cost model;
  * finished requests are replaced by the next one from a seeded stream (whole permutations of the workload);
    the run stops at the first step after which a slot cannot be refilled, so throughput is measured with the batch
    full (no tail where a few long requests run alone).
Temperature-1 traces replay with the same rule: with deterministic (one-hot) drafts, exact tree speculative sampling
accepts child x with probability p(x) and otherwise resamples from the residual, which is the same as drawing the
target token y ~ p once and accepting the child equal to y; the trace's sampled output is that y.

Run: ``python -m bench.replay --trace T.jsonl [...]`` (see --help); ``--synthetic`` runs on generated traces.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

if __package__ in (None, ""):  # `python bench/replay.py` as well as `python -m bench.replay`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import policies as P  # noqa: E402
from bench.cost_tables import roofline as R  # noqa: E402

TRACE_FORMAT = "hybrid-spark-trace"
PUBLISHED = {  # Hybrid Spark paper, HYBRID / DSpark output throughput (DESIGN.md section 3)
    "code_b4": (1.10, 1.62),
    "code_b128": (1.04, 1.27),
    "chat_t0": (0.97, 1.01),
}
TARGETS = {"code_b4": 1.62, "code_b128": 1.27, "chat_t0": 1.00}
CPU_TABLE = Path(__file__).resolve().parent / "cost_tables" / "cpu_smollm2.json"


# ----------------------------------------------------------------------------------------------------------- traces
@dataclasses.dataclass
class TraceRequest:
    """One request of a per-position trace (docs/ARCHITECTURE.md, "Per-position traces")."""

    id: str
    workload: str
    prompt: np.ndarray        # int32 [P]
    output: np.ndarray        # int32 [L]
    eagle_tokens: np.ndarray  # int32 [L, K]
    eagle_probs: np.ndarray   # float32 [L, K]


@dataclasses.dataclass
class Trace:
    header: dict
    requests: list

    @property
    def temperature(self) -> float:
        return float(self.header.get("temperature", 0.0))

    @property
    def eagle_k(self) -> int:
        return int(self.header["eagle_k"])


class TraceError(ValueError):
    """A trace file does not follow the documented format (the message names the line and field)."""


def _request_from_obj(obj: dict, k: int, where: str) -> TraceRequest:
    for key in ("id", "workload", "prompt", "output", "eagle_tokens", "eagle_probs"):
        if key not in obj:
            raise TraceError(f"{where}: missing field {key!r}")
    prompt = np.asarray(obj["prompt"], dtype=np.int64)
    output = np.asarray(obj["output"], dtype=np.int64)
    if prompt.ndim != 1 or prompt.size == 0:
        raise TraceError(f"{where}: 'prompt' must be a non-empty list of token ids")
    if output.ndim != 1:
        raise TraceError(f"{where}: 'output' must be a list of token ids")
    if (prompt < 0).any() or (output < 0).any():
        raise TraceError(f"{where}: negative token id in prompt/output")
    L = output.size
    et = np.asarray(obj["eagle_tokens"], dtype=np.int64).reshape(-1, k) if L else np.zeros((0, k), np.int64)
    ep = np.asarray(obj["eagle_probs"], dtype=np.float64).reshape(-1, k) if L else np.zeros((0, k))
    if et.shape != (L, k) or ep.shape != (L, k):
        raise TraceError(f"{where}: eagle_tokens/eagle_probs must have {L} rows of eagle_k={k} entries, "
                         f"got {et.shape} / {ep.shape}")
    if not np.isfinite(ep).all() or (ep < 0).any() or (ep > 1).any():
        raise TraceError(f"{where}: eagle_probs must be finite probabilities in [0, 1]")
    return TraceRequest(str(obj["id"]), str(obj["workload"]), prompt.astype(np.int32), output.astype(np.int32),
                        et.astype(np.int32), ep.astype(np.float32))


def read_trace(path) -> Trace:
    """Read a trace with the project's reader (`sglang_hybrid.reference.trace`), so that writer and replay agree on
    the format, then convert each record into the arrays the replay indexes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    from sglang_hybrid.reference.trace import read_trace as read_project_trace
    try:
        head, recs = read_project_trace(path)
    except ValueError as e:  # the project's TraceFormatError is a ValueError
        raise TraceError(str(e)) from None
    header = head.to_json()
    reqs = [_request_from_obj(_as_dict(r), int(header["eagle_k"]), f"{path}:{i + 2}") for i, r in enumerate(recs)]
    return Trace(header, reqs)


def _as_dict(r) -> dict:
    if isinstance(r, dict):
        return r
    if dataclasses.is_dataclass(r):
        return dataclasses.asdict(r)
    return {k: getattr(r, k) for k in ("id", "workload", "prompt", "output", "eagle_tokens", "eagle_probs")}


def write_trace(trace: Trace, path) -> None:
    """Write a trace in the documented format (used for synthetic traces; real ones come from the reference loop)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(trace.header) + "\n")
        for r in trace.requests:
            fh.write(json.dumps({"id": r.id, "workload": r.workload, "prompt": r.prompt.tolist(),
                                 "output": r.output.tolist(), "eagle_tokens": r.eagle_tokens.tolist(),
                                 "eagle_probs": np.round(r.eagle_probs.astype(float), 5).tolist()}) + "\n")


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
    header = {"format": TRACE_FORMAT, "version": 1, "model": "synthetic", "draft_model": "synthetic",
              "temperature": float(temperature), "eagle_k": k, "created": "synthetic"}
    return Trace(header, reqs)


# ------------------------------------------------------------------------------------------------- draft bank
class DraftBank:
    """Every drafter's proposal at every output position of every request, computed once per trace.

    Rows are addressed by (request index, output position p): the draft made after committing prompt + output[:p].
    The model-free drafters are deterministic in the committed tokens (no shared corpus is used, so a request that
    appears several times in a batch stream cannot copy its own earlier answer), which is what makes this cache exact.
    """

    def __init__(self, requests: list, k: int, pld_n=(2, 5), progress: bool = False):
        if not requests or any(len(r.output) == 0 for r in requests):
            raise ValueError("DraftBank needs at least one request and every output non-empty")
        self.requests = requests
        self.k = int(k)
        self.pld_n = pld_n
        self.progress = progress
        self.lengths = np.array([len(r.output) for r in requests], np.int64)
        self.offset = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.eagle_tokens = np.concatenate([r.eagle_tokens for r in requests]).astype(np.int64)
        self.eagle_probs = np.concatenate([r.eagle_probs for r in requests]).astype(np.float32)
        # root (last committed token) for each position, and the output padded so windows past the end never match
        self.root = np.concatenate([np.concatenate([[r.prompt[-1]], r.output[:-1]]) if len(r.output) else []
                                    for r in requests]).astype(np.int64)
        self.pad = 64
        self.out_off = np.concatenate([[0], np.cumsum(self.lengths + self.pad)[:-1]]).astype(np.int64)
        self.out_pad = np.concatenate([np.concatenate([r.output, np.full(self.pad, -2)]) for r in requests]
                                      ).astype(np.int64)
        self._kinds: dict = {}
        self.unavailable: dict = {}
        self.notes: dict = {}

    # -- queries ---------------------------------------------------------------------------------------------
    def rows(self, req, pos):
        return self.offset[req] + pos

    def eagle(self, req, pos, k):
        """EAGLE chain (tokens int64 [B, k], probs float32 [B, k]); a chain stops at its first -1 token (the
        trace's "no token"), after which tokens are -1 and probabilities 0."""
        r = self.rows(req, pos)
        if k > self.eagle_tokens.shape[1]:
            raise ValueError(f"EAGLE k={k} exceeds the trace's eagle_k={self.eagle_tokens.shape[1]}")
        toks, probs = self.eagle_tokens[r, :k], self.eagle_probs[r, :k]
        dead = np.cumsum(toks < 0, axis=1) > 0
        if dead.any():
            toks, probs = np.where(dead, -1, toks), np.where(dead, 0.0, probs).astype(np.float32)
        return toks, probs

    def targets(self, req, pos, width):
        if width > self.pad:
            raise ValueError(f"draft depth {width} exceeds the replay's padding {self.pad}")
        return self.out_pad[self.out_off[req][:, None] + pos[:, None] + np.arange(width)[None, :]]

    def roots(self, req, pos):
        return self.root[self.rows(req, pos)]

    def chain(self, kind, req, pos, k):
        d = self.ensure(kind)
        r = self.rows(req, pos)
        if k > d["tokens"].shape[1]:
            raise ValueError(f"{kind} drafts were precomputed with k={d['tokens'].shape[1]} < {k}")
        return d["tokens"][r, :k].astype(np.int64), np.minimum(d["lengths"][r], k)

    def ngram_features(self, req, pos, k, tree=False):
        d = self.ensure("ngram_tree" if tree else "ngram")
        r = self.rows(req, pos)
        cols = slice(None) if tree else slice(0, k)
        out = {f: d[f][r, cols] for f in ("tokens", "match_len", "count", "total", "depth", "source")}
        out["lengths"] = d["lengths"][r] if tree else np.minimum(d["lengths"][r], k)
        if tree:
            out["parents"] = d["parents"][r]
        return out

    # -- precomputation ----------------------------------------------------------------------------------------
    def ensure(self, kind):
        if kind in self.unavailable:
            raise DrafterUnavailable(self.unavailable[kind])
        if kind not in self._kinds:
            t0 = time.perf_counter()
            try:
                self._kinds[kind] = {"ngram": self._ngram_chain, "ngram_tree": self._ngram_tree,
                                     "pld": self._pld, "suffix": self._suffix}[kind]()
            except DrafterUnavailable as e:
                self.unavailable[kind] = str(e)
                raise
            if self.progress:
                note = f" ({self.notes[kind]})" if kind in self.notes else ""
                print(f"  [drafts] {kind}: {int(self.lengths.sum())} positions in {time.perf_counter() - t0:.1f} s"
                      f"{note}", flush=True)
        return self._kinds[kind]

    def _positions(self):
        """(active request indices) for p = 0, 1, ...: requests whose output has a position p."""
        for p in range(int(self.lengths.max(initial=0))):
            yield p, np.nonzero(self.lengths > p)[0]

    def _run_ngram(self, tree: bool, n_nodes: int):
        try:
            from sglang_hybrid.ngram import NgramDrafter
        except ImportError as e:
            raise DrafterUnavailable(f"sglang_hybrid.ngram is not importable ({e}); build the extension "
                                     "(pip install -e .)") from None
        d = NgramDrafter(max_draft=max(self.k, n_nodes), use_corpus=False)  # own context only (see class doc)
        total = int(self.lengths.sum())
        width = n_nodes if tree else self.k
        fields = ("tokens", "match_len", "count", "total", "depth", "source") + (("parents",) if tree else ())
        out = {f: np.full((total, width), -1 if f in ("tokens", "parents") else 0, np.int64) for f in fields}
        out["lengths"] = np.zeros(total, np.int64)
        for i, r in enumerate(self.requests):
            d.start(i, np.ascontiguousarray(r.prompt, dtype=np.int32))
        try:
            for p, act in self._positions():
                ids = np.ascontiguousarray(act, dtype=np.int64)
                res = d.propose_tree(ids, n_nodes) if tree else d.propose(ids, self.k)
                rows = self.offset[act] + p
                for f in fields:
                    out[f][rows] = np.asarray(getattr(res, f))[:, :width]
                out["lengths"][rows] = np.asarray(res.lengths)
                for i in act:
                    d.extend(int(i), np.ascontiguousarray(self.requests[i].output[p:p + 1], dtype=np.int32))
        finally:
            for i in range(len(self.requests)):
                try:
                    d.remove(i)
                except Exception:  # noqa: BLE001 - cleanup only
                    pass
        return out

    def _ngram_chain(self):
        return self._run_ngram(False, self.k)

    def _ngram_tree(self):
        return self._run_ngram(True, self.k)

    def _per_request(self, start, propose, extend, finish):
        """Drive a one-request-at-a-time drafter through every position of every request."""
        total = int(self.lengths.sum())
        toks = np.full((total, self.k), -1, np.int64)
        lens = np.zeros(total, np.int64)
        for i, r in enumerate(self.requests):
            start(i, np.ascontiguousarray(r.prompt, dtype=np.int32))
            for p in range(len(r.output)):
                draft = np.asarray(propose(i, p), dtype=np.int64)[: self.k]
                row = self.offset[i] + p
                toks[row, : len(draft)] = draft
                lens[row] = len(draft)
                extend(i, np.ascontiguousarray(r.output[p:p + 1], dtype=np.int32))
            finish(i)
        return {"tokens": toks, "lengths": lens}

    def _pld(self):
        """vLLM prompt lookup: vLLM's own `NgramProposer` through bench/anchors.py when the `vllm` package imports,
        else our rendering of the rule vLLM documents (`prompt_lookup`)."""
        lo, hi = self.pld_n
        try:
            from bench.anchors import VllmNgramAdapter

            ad = VllmNgramAdapter(k=self.k, min_n=lo, max_n=hi, max_model_len=int(
                max(len(r.prompt) + len(r.output) for r in self.requests) + self.k + 2))
            self.notes["pld"] = f"vLLM's own NgramProposer (min_n={lo}, max_n={hi})"
            return self._per_request(ad.start, lambda i, p: ad.propose(i, self.k), ad.extend, ad.finish)
        except Exception as e:  # noqa: BLE001 - vllm missing or not importable here
            self.notes["pld"] = f"our rendering of vLLM's prompt-lookup rule (vLLM not importable: {e})"
        ctxs = {}

        def start(i, prompt):
            ctxs[i] = list(prompt)

        def extend(i, t):
            ctxs[i].extend(int(x) for x in t)

        return self._per_request(start, lambda i, p: prompt_lookup(np.asarray(ctxs[i]), lo, hi, self.k), extend,
                                 lambda i: ctxs.pop(i))

    def _suffix(self):
        """Arctic Inference's SuffixDecodingCache through bench/anchors.py (vLLM's `suffix` defaults: depth 24,
        max_spec_factor 1, min_token_prob 0.1), chain mode, with no global cache of other responses (as for our
        drafter: the replay shares nothing across requests)."""
        try:
            from bench.anchors import ArcticAdapter

            ad = ArcticAdapter(max_cached_requests=0)
        except Exception as e:  # noqa: BLE001
            raise DrafterUnavailable(
                f"arctic-inference is not importable ({e}); it builds from source on CPU: pip install "
                "--no-build-isolation nanobind==2.9.2 arctic-inference==0.3.0 (cmake, "
                "CMAKE_ARGS=-DPython_EXECUTABLE=$(which python3))") from None
        self.notes["suffix"] = "Arctic SuffixDecodingCache 0.3.0 via bench/anchors.ArcticAdapter, no global cache"
        return self._per_request(ad.start, lambda i, p: ad.propose(i, self.k), ad.extend, ad.finish)


class DrafterUnavailable(RuntimeError):
    """A drafter (anchor) cannot run here; the message says why."""


def prompt_lookup(ctx: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Prompt lookup as vLLM describes it: the longest n in [min_n, max_n] such that the last n tokens occurred
    earlier in the context; copy up to k tokens following the *earliest* such occurrence. Empty when none."""
    T = len(ctx)
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        pattern = ctx[T - n:]
        hay = ctx[:T - 1]  # an occurrence must end before the last token, so at least one token follows it
        if len(hay) < n:
            continue
        win = np.lib.stride_tricks.sliding_window_view(hay, n)
        hits = np.nonzero((win == pattern).all(axis=1))[0]
        if hits.size:
            start = int(hits[0]) + n
            return ctx[start:start + k]
    return ctx[:0]


# ------------------------------------------------------------------------------------------------ cost models
@dataclasses.dataclass
class BatchCost:
    """Step-time model for one batch size: T(n) (core CostModel) and the cost of one EAGLE draft forward."""

    model: object          # sglang_hybrid.cost.CostModel
    tables: object         # its CostTables on CPU (the price input)
    draft_step_s: float

    def step_time(self, n: int) -> float:
        return float(self.model.step_time_np(np.asarray([n]))[0])


@dataclasses.dataclass
class CostSpec:
    name: str
    kind: str              # "simulated" | "measured" | "user"
    assumptions: list
    per_batch: dict        # {B: BatchCost}; key 0 = applies to every B

    def for_batch(self, b: int) -> BatchCost:
        if b in self.per_batch:
            return self.per_batch[b]
        if 0 in self.per_batch:
            return self.per_batch[0]
        raise ValueError(f"cost model {self.name!r} has no table for batch {b} (has {sorted(self.per_batch)})")


def _batch_cost(sizes, seconds, draft_s, meta=None) -> BatchCost:
    from sglang_hybrid.cost import CostModel

    m = CostModel(list(sizes), list(seconds), meta=meta or {})
    return BatchCost(m, m.to("cpu"), float(draft_s))


def gpu_cost_spec(batch_sizes, context: int, buckets: bool = True) -> CostSpec:
    roof = R.Roofline(context_tokens=context, **({} if buckets else {"graph_buckets": ()}))
    doc = R.build_tables(roof, batch_sizes)
    per = {int(b): _batch_cost(t["tokens"], t["seconds"], t["draft_step_seconds"]) for b, t in doc["tables"].items()}
    return CostSpec("gpu-roofline" if buckets else "gpu-smooth", "simulated", roof.assumptions(), per)


def load_cost_spec(path, name=None) -> CostSpec:
    """A cost file: this benchmark's per-batch format (`hybrid-spark-cost-tables`, as written by
    bench/cost_tables/*.py) or the core's single table (`hybrid-spark-cost`, e.g. from `sglang_hybrid.cost.profile`
    on your own GPU; it then applies to every batch size, and `meta.draft_step_seconds` gives the EAGLE step cost)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cost table {path}: cannot read JSON ({e})") from None
    fmt = doc.get("format")
    if fmt == R.FORMAT:
        tabs = doc.get("tables")
        if not isinstance(tabs, dict) or not tabs:
            raise ValueError(f"cost table {path}: 'tables' must be a non-empty object keyed by batch size")
        per = {}
        for b, t in tabs.items():
            for key in ("tokens", "seconds", "draft_step_seconds"):
                if key not in t:
                    raise ValueError(f"cost table {path}: batch {b} lacks {key!r}")
            per[int(b)] = _batch_cost(t["tokens"], t["seconds"], t["draft_step_seconds"])
        kind = "measured" if "measured" in str(doc.get("source", "")) else "simulated"
        return CostSpec(name or path.stem, kind, list(doc.get("assumptions", [])), per)
    if fmt == "hybrid-spark-cost":
        meta = doc.get("meta") or {}
        draft = float(meta.get("draft_step_seconds", 0.0))
        per = {0: _batch_cost(doc["sizes"], doc["seconds"], draft, meta)}
        notes = [f"user table {path} (one T(n) for every batch size)", f"meta: {json.dumps(meta)[:300]}"]
        if "draft_step_seconds" not in meta:
            notes.append("no meta.draft_step_seconds: EAGLE drafting is charged 0 s (favours EAGLE-based policies)")
        return CostSpec(name or path.stem, "user", notes, per)
    raise ValueError(f"cost table {path}: unknown format {fmt!r} (expected {R.FORMAT!r} or 'hybrid-spark-cost')")


# --------------------------------------------------------------------------------------------------- replay
def greedy_tree_accept(tokens: np.ndarray, parents: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Accepted draft tokens per request: depth of the deepest node whose whole path equals the targets.

    tokens/parents [B, N] (-1 = no node / root parent, parents[i] < i); targets [B, >= N] = the output from the
    current position on (targets[:, d - 1] is what a depth-d node must equal)."""
    b, n = tokens.shape
    if n == 0:
        return np.zeros(b, np.int64)
    rows = np.arange(b)
    depth = np.zeros((b, n), np.int64)
    acc = np.zeros((b, n), bool)
    for i in range(n):
        par = parents[:, i]
        if (par >= i).any():
            raise ValueError("parents must satisfy parents[i] < i (topological order)")
        has = par >= 0
        pidx = np.where(has, par, 0)
        d = np.where(has, depth[rows, pidx], 0) + 1
        ok_parent = np.where(has, acc[rows, pidx], True)
        depth[:, i] = d
        acc[:, i] = (tokens[:, i] >= 0) & ok_parent & (tokens[:, i] == targets[rows, d - 1])
    return (depth * acc).max(axis=1)


@dataclasses.dataclass
class RunResult:
    policy: str
    label: str
    workload: str
    batch: int
    cost: str
    steps: int
    tokens: int
    seconds: float
    request_steps: int
    accepted: int
    verified_nodes: int
    requests_done: int
    model_steps: int
    ngram_share: float       # share of verified draft nodes proposed by the n-gram drafter (or both)
    mean_lambda: float

    @property
    def tok_per_s(self):
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def accepted_per_step(self):
        return self.accepted / max(1, self.request_steps)

    @property
    def tokens_per_step(self):
        return self.tokens / max(1, self.request_steps)

    @property
    def verified_per_step(self):
        return self.verified_nodes / max(1, self.request_steps)


def request_stream(indices, batch: int, seed: int) -> np.ndarray:
    """Whole seeded permutations of the workload, enough for at least max(2 B, |workload|) requests."""
    indices = np.asarray(indices)
    rng = np.random.default_rng(seed)
    cycles = max(1, math.ceil(max(2 * batch, len(indices)) / len(indices)))
    return np.concatenate([rng.permutation(indices) for _ in range(cycles)])


def simulate(policy, bank: DraftBank, indices, batch: int, cost: BatchCost, seed: int = 0,
             workload: str = "", cost_name: str = "") -> RunResult:
    """Continuous-batching replay of one policy at concurrency `batch` (see the module docstring)."""
    stream = request_stream(indices, batch, seed)
    if len(stream) < batch:
        raise ValueError("request stream shorter than the batch")
    req = stream[:batch].astype(np.int64)
    pos = np.zeros(batch, np.int64)
    nxt = batch
    tot = dict(steps=0, tokens=0, seconds=0.0, rs=0, acc=0, nodes=0, done=0, msteps=0, ng=0, lam=0.0)
    while True:
        view = P.StepView(req=req, pos=pos, root=bank.roots(req, pos), drafts=bank,
                          cost=cost.tables, requests=batch)
        prop = policy.propose(view)
        toks, par = np.asarray(prop.tokens, np.int64), np.asarray(prop.parents, np.int64)
        n_nodes = (toks >= 0).sum(axis=1)
        accepted = greedy_tree_accept(toks, par, bank.targets(req, pos, max(1, toks.shape[1])))
        remaining = bank.lengths[req] - pos
        emitted = np.minimum(accepted + 1, remaining)
        n_tokens = batch + int(n_nodes.sum())
        tot["seconds"] += cost.step_time(n_tokens) + prop.model_steps * cost.draft_step_s
        tot["steps"] += 1
        tot["tokens"] += int(emitted.sum())
        tot["rs"] += batch
        tot["acc"] += int((emitted - 1).sum())
        tot["nodes"] += int(n_nodes.sum())
        tot["msteps"] += prop.model_steps
        tot["lam"] += float(getattr(policy, "last_lambda", 0.0))
        if prop.source is not None:
            tot["ng"] += int(((prop.source == 1) | (prop.source == 2))[toks >= 0].sum())
        pos = pos + emitted
        done = np.nonzero(pos >= bank.lengths[req])[0]
        stop = False
        for slot in done:
            tot["done"] += 1
            if nxt < len(stream):
                req[slot], pos[slot] = stream[nxt], 0
                nxt += 1
            else:
                stop = True
        if stop:
            break
    return RunResult(policy.name, policy.describe(), workload, batch, cost_name, tot["steps"], tot["tokens"],
                     tot["seconds"], tot["rs"], tot["acc"], tot["nodes"], tot["done"], tot["msteps"],
                     tot["ng"] / max(1, tot["nodes"]), tot["lam"] / max(1, tot["steps"]))


# -------------------------------------------------------------------------------------------------- report
def fmt_table(results: list) -> str:
    base = {r.policy: r for r in results}.get("no_spec")
    head = f"{'policy':<18}{'tok/s':>10}{'vs no-spec':>11}{'acc/step':>10}{'tok/step':>10}{'verified':>10}{'ngram%':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        sp = r.tok_per_s / base.tok_per_s if base and base.tok_per_s else float("nan")
        lines.append(f"{r.policy:<18}{r.tok_per_s:>10.1f}{sp:>10.2f}x{r.accepted_per_step:>10.2f}"
                     f"{r.tokens_per_step:>10.2f}{r.verified_per_step:>10.2f}{100 * r.ngram_share:>7.0f}%")
    return "\n".join(lines)


def ratio(results: dict, key, num: str, den: str = "model_adaptive") -> Optional[float]:
    a, b = results.get(key + (num,)), results.get(key + (den,))
    if a is None or b is None or b.tok_per_s == 0:
        return None
    return a.tok_per_s / b.tok_per_s


def paper_layout(results: dict, cost: str, temps: list, batches: list) -> tuple[str, list]:
    """HYBRID / model-only adaptive throughput beside the published ranges, and the targets met or missed."""
    lines = [f"Paper layout ({cost}): HYBRID / model-only adaptive output throughput",
             f"{'row':<26}{'published':>12}{'choose':>12}{'merge':>12}{'target':>9}  verdict"]
    verdicts = []
    t0 = 0.0 if 0.0 in temps else None
    rows = []
    if t0 is not None:
        if 4 in batches:
            rows.append(("code editing, batch 4", "code_b4", [("code", t0, 4)]))
        if 128 in batches:
            rows.append(("code editing, batch 128", "code_b128", [("code", t0, 128)]))
        rows.append(("chat, temperature 0", "chat_t0", [("chat", t0, b) for b in batches]))
    for title, key, cells in rows:
        if len(cells) > 1:  # the chat row spans the batch sizes this cost model has results for
            cells = [c for c in cells if ratio(results, (cost,) + c, "hybrid_choose") is not None] or cells
        ch = [ratio(results, (cost,) + c, "hybrid_choose") for c in cells]
        me = [ratio(results, (cost,) + c, "hybrid_merge") for c in cells]
        if any(v is None for v in ch + me):
            lines.append(f"{title:<26}  (missing results)")
            continue
        lo, hi = PUBLISHED[key]
        rng = lambda v: f"{min(v):.2f}" if len(v) == 1 else f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
        met = {m: min(v) >= TARGETS[key] for m, v in (("choose", ch), ("merge", me))}
        verdict = ", ".join(f"{m} {'MET' if ok else 'MISSED'}" for m, ok in met.items())
        lines.append(f"{title:<26}{lo:>6.2f}-{hi:.2f}x{rng(ch):>12}{rng(me):>12}"
                     f"{'>=' + format(TARGETS[key], '.2f'):>9}  {verdict}"
                     + ("  (worst batch counts)" if len(cells) > 1 else ""))
        for m, v in (("choose", ch), ("merge", me)):
            verdicts.append((f"{cost}: {title}: HYBRID {m} / model-only >= {TARGETS[key]:.2f}x", met[m],
                             f"{rng(v)}" + (f" over batches {[c[2] for c in cells]}" if len(cells) > 1 else "")))
    return "\n".join(lines), verdicts


def merge_vs_choose(results: dict, cost: str):
    """(verdict name, met, detail) for "merge >= choose in every cell" under one cost model, or None."""
    worst = None
    for key, r in results.items():
        if key[0] != cost or key[4] != "hybrid_merge":
            continue
        c = results.get(key[:4] + ("hybrid_choose",))
        if c is None or c.tok_per_s == 0:
            continue
        q = r.tok_per_s / c.tok_per_s
        if worst is None or q < worst[0]:
            worst = (q, key)
    if worst is None:
        return None
    _, w, t, b, _ = worst[1]
    return (f"{cost}: HYBRID merge >= choose everywhere", worst[0] >= 1.0,
            f"worst merge/choose = {worst[0]:.3f} ({w}, T={t:g}, B={b})")


def plot(results: dict, path: Path, cost: str, workloads, temps, batches, policies) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cells = [(w, t, b) for w in workloads for t in temps for b in batches
             if (cost, w, t, b, "no_spec") in results]
    if not cells:
        return None
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 4.2), sharey=False, squeeze=False)
    for ax, (w, t, b) in zip(axes[0], cells):
        base = results[(cost, w, t, b, "no_spec")].tok_per_s
        names = [p for p in policies if (cost, w, t, b, p) in results]
        vals = [results[(cost, w, t, b, p)].tok_per_s / base for p in names]
        colors = ["#d62728" if p.startswith("hybrid") else "#1f77b4" if p == "model_adaptive" else "#7f7f7f"
                  for p in names]
        ax.barh(range(len(names)), vals, color=colors)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names if ax is axes[0][0] else [""] * len(names), fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.5)
        ax.set_title(f"{w} T={t:g} B={b}", fontsize=9)
        ax.set_xlabel("speedup vs no speculation", fontsize=8)
    fig.suptitle(f"Replay throughput, cost model: {cost}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------- trace making
def code_edit_prompts(n: int):
    """The reference loop's code-editing prompts, then edits of short held-out standard-library files (real code
    nobody here wrote; every 10th stdlib file, which the EAGLE head's training excludes)."""
    import re

    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference.corpus import stdlib_python_files

    out = list(PR.CODE_EDITS[:n])
    for f in stdlib_python_files()[::10]:
        if len(out) >= n:
            break
        try:
            src = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        names = re.findall(r"^def ([a-z_][a-z0-9_]*)\(", src, flags=re.M)
        if not (1200 <= len(src) <= 3500) or not names:
            continue
        fn = names[0]
        text = (f"Here is the file `{f.name}`:\n```python\n{src}```\nRename the function `{fn}` to "
                f"`{fn}_renamed` everywhere. Reply with the complete updated file.")
        out.append(PR.Prompt(f"code-{f.stem}", "code", text))
    return out


def _decode_batch(target, prompts, max_new, temperature, seed, eos):
    """The target's own continuation of each prompt, all prompts in one left-padded `generate` call (about ten times
    faster on CPU than one at a time). Temperature 0 = greedy; otherwise plain multinomial sampling (no top-k/p).
    Each output ends at its first EOS (kept) or after `max_new` tokens."""
    import torch

    pad = eos if eos is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    with torch.no_grad():
        gen = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=1,
                              pad_token_id=pad, eos_token_id=eos, **kw)
    outs = []
    for row in gen[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        outs.append(row)
    return outs


def make_trace(out_path, temperature=0.0, n_code=8, n_chat=8, max_new=320, k=8, head_dir=None, seed=0,
               threads=1) -> int:
    """Record a per-position trace with the reference loop's pieces: the target's own decode of each prompt (greedy
    output = any lossless speculative mode's output), then the EAGLE rows by `reference.trace.eagle_rows`.
    Outputs are cached next to the trace (`.outputs.json`) so decoding survives a missing head or a restart."""
    import torch
    from tqdm import tqdm

    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference import trace as TR
    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2

    torch.set_num_threads(threads)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path = out_path.with_suffix(".outputs.json")
    lm = load_smollm2()
    prompts = code_edit_prompts(n_code) + PR.chat_prompts(n_chat)
    done = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    key = f"T{temperature:g}-max{max_new}-seed{seed}"
    got = done.setdefault(key, {})
    todo = [pr for pr in prompts if pr.id not in got]
    if todo:
        print(f"decoding {len(todo)} prompts (T={temperature:g}, up to {max_new} tokens) in one batch ...", flush=True)
        enc = [PR.encode(lm.tokenizer, pr) for pr in todo]
        outs = _decode_batch(lm.model, enc, max_new, temperature, seed, lm.eos_token_id)
        for pr, ids, o in zip(todo, enc, outs):
            got[pr.id] = {"workload": pr.workload, "prompt": ids, "output": o}
        cache_path.write_text(json.dumps(done))
    head_dir = Path(head_dir) if head_dir else Path(__file__).resolve().parents[1] / "sglang_hybrid" / "data" / \
        "eagle_smollm2"
    try:
        head = load_head(head_dir, lm.model.config).eval()
    except Exception as e:  # noqa: BLE001 - report and keep the decoded outputs
        print(f"cannot load the EAGLE head from {head_dir} ({e}); decoded outputs kept in {cache_path}; "
              "rerun when the head exists (python -m sglang_hybrid.train_eagle)")
        return 2
    recs = []
    for pid, r in tqdm(got.items(), desc="EAGLE rows"):
        toks, probs = TR.eagle_rows(lm.model, head, r["prompt"], r["output"], k)
        recs.append(TR.TraceRecord(pid, r["workload"], r["prompt"], r["output"], toks, probs))
    header = TR.TraceHeader(model=lm.name, draft_model=str(head_dir), temperature=float(temperature), eagle_k=k)
    TR.write_trace(out_path, header, recs)
    print(f"wrote {out_path}: {len(recs)} requests, {sum(len(r.output) for r in recs)} output tokens")
    return 0


# ---------------------------------------------------------------------------------------------------- main
def load_workloads(trace_paths, synthetic: bool, seed: int) -> dict:
    """{temperature: [TraceRequest]} from the given traces (or a synthetic trace), checking eagle_k agrees."""
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Replay speculation policies over per-position traces "
                                             "(the paper's HYBRID vs model-only adaptive table).")
    ap.add_argument("--trace", nargs="*", default=[], help="trace files (JSON Lines, docs/ARCHITECTURE.md)")
    ap.add_argument("--synthetic", action="store_true", help="use a generated synthetic trace (mechanics demo only)")
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 32, 128])
    ap.add_argument("--policies", nargs="+", default=list(P.ALL_POLICIES))
    ap.add_argument("--cost", nargs="+", default=["gpu", "cpu"],
                    help="'gpu' (roofline with CUDA-graph buckets, simulated), 'gpu-smooth' (same without bucket "
                         "padding), 'cpu' (measured SmolLM2 table) and/or cost JSON files")
    ap.add_argument("--cost-table", nargs="*", default=[], help="extra cost table files (yours, profiled on a GPU)")
    ap.add_argument("--gpu-context", type=int, default=R.Roofline.context_tokens,
                    help="context tokens per request assumed by the GPU roofline")
    ap.add_argument("--k", type=int, default=None, help="max draft length (default: the trace's eagle_k)")
    ap.add_argument("--eagle-k", type=int, default=4, help="EAGLE fixed-chain length")
    ap.add_argument("--merge-nodes", type=int, default=None, help="HYBRID merge node budget (default 2k)")
    ap.add_argument("--ngram-tree", action="store_true", help="HYBRID uses the n-gram tree instead of the chain")
    ap.add_argument("--model-calibration", default=None, help="ModelCalibration JSON (default: identity)")
    ap.add_argument("--ngram-calibration", default=None, help="NgramCalibration JSON (default: shipped)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/replay"))
    ap.add_argument("--make-trace", type=Path, default=None, metavar="FILE",
                    help="record a trace with SmolLM2 + the trained EAGLE head instead of replaying")
    ap.add_argument("--temperature", type=float, default=0.0, help="--make-trace: decode temperature")
    ap.add_argument("--n-code", type=int, default=8, help="--make-trace: code-editing prompts")
    ap.add_argument("--n-chat", type=int, default=8, help="--make-trace: chat prompts")
    ap.add_argument("--max-new", type=int, default=320, help="--make-trace: max new tokens per request")
    ap.add_argument("--head", default=None, help="--make-trace: EAGLE head folder (default: the shipped one)")
    args = ap.parse_args(argv)
    if args.make_trace:
        return make_trace(args.make_trace, args.temperature, args.n_code, args.n_chat, args.max_new,
                          args.k or 8, args.head, args.seed)

    if not args.trace and not args.synthetic:
        ap.error("give --trace FILE... (from the reference loop) or --synthetic")
    t_start = time.perf_counter()
    by_t, trace_k, traces = load_workloads(args.trace, args.synthetic, args.seed)
    k = args.k or trace_k
    if k > trace_k or args.eagle_k > trace_k:
        ap.error(f"--k/--eagle-k cannot exceed the trace's eagle_k={trace_k}")
    merge_nodes = args.merge_nodes or 2 * k
    args.out.mkdir(parents=True, exist_ok=True)

    specs = []
    for c in args.cost + args.cost_table:
        if c in ("gpu", "gpu-smooth"):
            specs.append(gpu_cost_spec(args.batches, args.gpu_context, buckets=(c == "gpu")))
        elif c == "cpu":
            if not CPU_TABLE.is_file():
                print(f"note: no measured CPU table at {CPU_TABLE}; run python -m bench.cost_tables.profile_cpu")
                continue
            specs.append(load_cost_spec(CPU_TABLE, "cpu-smollm2"))
        else:
            specs.append(load_cost_spec(c))

    def core_factory():
        return P._Core(args.model_calibration, args.ngram_calibration)

    pols = P.build_policies(args.policies, k, args.eagle_k, merge_nodes, core_factory, args.ngram_tree)
    print("# Hybrid Spark policy replay")
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}, seed {args.seed}, k={k}, EAGLE fixed k={args.eagle_k}, "
          f"merge node budget {merge_nodes}, n-gram {'tree' if args.ngram_tree else 'chain'} for HYBRID")
    for t in traces:
        h = t.header
        print(f"trace: model {h.get('model')}, draft {h.get('draft_model')}, T={t.temperature:g}, "
              f"eagle_k={t.eagle_k}, {len(t.requests)} requests, created {h.get('created')}"
              + ("  [SYNTHETIC: mechanics only, not a result]" if args.synthetic else ""))
    core = next((p.core for p in pols if hasattr(p, "core")), None)
    if core is not None:
        print(f"calibration: n-gram {args.ngram_calibration or 'shipped default'}, model {core.model_cal_name}")
    for s in specs:
        print(f"\ncost model {s.name} ({s.kind}):")
        for a in s.assumptions:
            print(f"  - {a}")

    results: dict = {}
    temps = sorted(by_t)
    workloads_seen = []
    for temp in temps:
        reqs = by_t[temp]
        bank = DraftBank(reqs, k, progress=True)
        groups = {}
        for w in ("code", "chat"):
            idx = [i for i, r in enumerate(reqs) if r.workload == w]
            if idx:
                groups[w] = idx
        others = sorted({r.workload for r in reqs} - {"code", "chat"})
        for w in others:
            groups[w] = [i for i, r in enumerate(reqs) if r.workload == w]
        if len(groups) > 1:
            groups["mixed"] = list(range(len(reqs)))
        for w in groups:
            if w not in workloads_seen:
                workloads_seen.append(w)
        for spec in specs:
            for w, idx in groups.items():
                for b in args.batches:
                    try:
                        cost = spec.for_batch(b)
                    except ValueError as e:
                        print(f"\n## {spec.name} | {w} | batch {b}: skipped ({e})")
                        continue
                    cell = []
                    for pol in pols:
                        try:
                            r = simulate(pol, bank, idx, b, cost, seed=args.seed * 1000 + b, workload=w,
                                         cost_name=spec.name)
                        except DrafterUnavailable as e:
                            if (pol.name, "warned") not in results:
                                print(f"  [skip] {pol.name}: {e}")
                                results[(pol.name, "warned")] = True
                            continue
                        results[(spec.name, w, temp, b, pol.name)] = r
                        cell.append(r)
                    print(f"\n## {spec.name} | {w} | T={temp:g} | batch {b} | {cell[0].requests_done if cell else 0}"
                          f" requests finished (no-spec run), stream of {len(request_stream(idx, b, 0))}")
                    print(fmt_table(cell))
    results = {k_: v for k_, v in results.items() if isinstance(v, RunResult)}

    verdicts = []
    print()
    for spec in specs:
        text, v = paper_layout(results, spec.name, temps, args.batches)
        print(text)
        verdicts += v if spec.kind != "measured" else []
        mc = merge_vs_choose(results, spec.name)
        if mc and spec.kind != "measured":
            verdicts.append(mc)
        if spec.kind == "measured":
            for temp in temps:
                for b in args.batches:
                    cell = {p: results.get((spec.name, "mixed", temp, b, p)) for p in args.policies}
                    cell = {p: r for p, r in cell.items() if r is not None}
                    if "hybrid_choose" not in cell and "hybrid_merge" not in cell:
                        continue
                    hy = max((cell[p] for p in ("hybrid_choose", "hybrid_merge") if p in cell),
                             key=lambda r: r.tok_per_s)
                    rivals = [r for p, r in cell.items() if not p.startswith("hybrid")]
                    best = max(rivals, key=lambda r: r.tok_per_s)
                    verdicts.append((f"{spec.name}: HYBRID ahead of every other policy, mixed T={temp:g} B={b}",
                                     hy.tok_per_s > best.tok_per_s,
                                     f"{hy.policy} {hy.tok_per_s:.1f} tok/s vs best other {best.policy} "
                                     f"{best.tok_per_s:.1f} ({hy.tok_per_s / best.tok_per_s:.3f}x)"))
        print()
    print("Targets:")
    for name, ok, detail in verdicts:
        print(f"  [{'MET' if ok else 'MISSED'}] {name}: {detail}")
    if args.synthetic:
        print("  (synthetic trace: these verdicts only exercise the mechanics)")

    pngs = []
    for spec in specs:
        for temp in temps:
            pth = plot(results, args.out / f"replay_{spec.name}_T{temp:g}.png", spec.name, workloads_seen, [temp],
                       args.batches, args.policies)
            if pth:
                pngs.append(str(pth))
    dump = [dict(dataclasses.asdict(r), temperature=key[2], tok_per_s=r.tok_per_s,
                 accepted_per_step=r.accepted_per_step, tokens_per_step=r.tokens_per_step)
            for key, r in results.items()]
    (args.out / "replay_results.json").write_text(json.dumps({"args": {k_: str(v) for k_, v in vars(args).items()},
                                                              "results": dump,
                                                              "verdicts": verdicts}, indent=1))
    print(f"\nwrote {args.out / 'replay_results.json'}" + (f", plots: {', '.join(pngs)}" if pngs else ""))
    print(f"replay wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
