"""The replay's draft bank: every drafter's proposal at every output position of a trace, computed once.

Drafters: our n-gram drafter (chain and tree, `sglang_hybrid.ngram`), vLLM prompt lookup (vLLM's own `NgramProposer`
through bench/anchors.py, else `prompt_lookup` below) and Arctic suffix decoding (bench/anchors.py). EAGLE chains come
from the trace itself.
"""
from __future__ import annotations

import time

import numpy as np


class DraftBank:
    """Every drafter's proposal at every output position of every request, computed once per trace.

    Rows are addressed by (request index, output position p): the draft made after committing prompt + output[:p].
    The model-free drafters are deterministic in the committed tokens (no shared corpus is used, so a request that
    appears several times in a batch stream cannot copy its own earlier answer), which is what makes this cache exact.
    """

    def __init__(self, requests: list, k: int, pld_n=(2, 5), progress: bool = False, ngram_width: int = 0,
                 pad: int = 64):
        if not requests or any(len(r.output) == 0 for r in requests):
            raise ValueError("DraftBank needs at least one request and every output non-empty")
        self.requests = requests
        self.k = int(k)
        #: width of the n-gram chain proposals (default k); the as-built replay asks for the plugin's proposal width
        #: k + max_depth + 1 and slices the first k for the ideal engine
        self.ngram_width = int(ngram_width) or self.k
        self.pld_n = pld_n
        self.progress = progress
        self.lengths = np.array([len(r.output) for r in requests], np.int64)
        self.offset = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.eagle_tokens = np.concatenate([r.eagle_tokens for r in requests]).astype(np.int64)
        self.eagle_probs = np.concatenate([r.eagle_probs for r in requests]).astype(np.float32)
        #: the EAGLE alternatives behind these chains (anything with ``alternatives(req, pos, depth, m)``): the
        #: trace's recorded ones when every request holds them, else None (a simulated drafter sets its own,
        #: `synth.with_eagle`)
        self.eagle_alt = RecordedAlternatives(self, requests) if all(
            getattr(r, "eagle_alt_tokens", None) is not None for r in requests) else None
        # root (last committed token) for each position, and the output padded so windows past the end never match
        self.root = np.concatenate([np.concatenate([[r.prompt[-1]], r.output[:-1]]) if len(r.output) else []
                                    for r in requests]).astype(np.int64)
        #: output positions past each request's end a step may compare against: the widest verify tree's node count
        #: (a tree of N nodes is at most N deep; `targets`)
        self.pad = int(pad)
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
                if kind.startswith("pld-"):
                    lo, hi = (int(x) for x in kind.split("-")[1:3])
                    self._kinds[kind] = self._pld((lo, hi), kind)
                else:
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
        width = n_nodes if tree else self.ngram_width
        d = NgramDrafter(max_draft=max(width, n_nodes), use_corpus=False)  # own context only (see class doc)
        total = int(self.lengths.sum())
        fields = ("tokens", "match_len", "count", "total", "depth", "source") + (("parents",) if tree else ())
        out = {f: np.full((total, width), -1 if f in ("tokens", "parents") else 0, np.int64) for f in fields}
        out["lengths"] = np.zeros(total, np.int64)
        for i, r in enumerate(self.requests):
            d.start(i, np.ascontiguousarray(r.prompt, dtype=np.int32))
        try:
            for p, act in self._positions():
                ids = np.ascontiguousarray(act, dtype=np.int64)
                res = d.propose_tree(ids, n_nodes) if tree else d.propose(ids, width)
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

    def _pld(self, pld_n=None, kind="pld"):
        """vLLM prompt lookup: vLLM's own `NgramProposer` through bench/anchors.py when the `vllm` package imports,
        else our rendering of the rule vLLM documents (`PromptLookupIndex`, the incremental form of
        `prompt_lookup`)."""
        lo, hi = pld_n or self.pld_n
        try:
            from bench.anchors import VllmNgramAdapter

            ad = VllmNgramAdapter(k=self.k, min_n=lo, max_n=hi, max_model_len=int(
                max(len(r.prompt) + len(r.output) for r in self.requests) + self.k + 2))
            self.notes[kind] = f"vLLM's own NgramProposer (min_n={lo}, max_n={hi})"
            return self._per_request(ad.start, lambda i, p: ad.propose(i, self.k), ad.extend, ad.finish)
        except Exception as e:  # noqa: BLE001 - vllm missing or not importable here
            self.notes[kind] = f"our rendering of vLLM's prompt-lookup rule (vLLM not importable: {e})"
        idx = {}

        def start(i, prompt):
            idx[i] = PromptLookupIndex(prompt, lo, hi)

        def extend(i, t):
            idx[i].extend(t)

        return self._per_request(start, lambda i, p: idx[i].propose(self.k), extend, lambda i: idx.pop(i))

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


class RecordedAlternatives:
    """A recorded trace's EAGLE alternatives (`traces.TraceRequest.eagle_alt_tokens`): at each chain position the
    head's next M tokens after the chain's own, served like the simulated drafter's
    (`synth.SimulatedEagleTrees.alternatives`)."""

    def __init__(self, bank: "DraftBank", requests: list):
        self.bank = bank
        self.tokens = np.concatenate([r.eagle_alt_tokens for r in requests]).astype(np.int64)
        self.probs = np.concatenate([r.eagle_alt_probs for r in requests]).astype(np.float32)

    def alternatives(self, req, pos, depth: int, m: int) -> tuple:
        """(tokens int64 [B, depth, m], probs float32 [B, depth, m]) after output[:pos] of each request ``req``;
        positions at or past the chain's end (its first -1 token) hold -1 and probability 0."""
        depth, m = int(depth), int(m)
        if not 1 <= m <= self.tokens.shape[2]:
            raise DrafterUnavailable(f"EAGLE alternatives m={m}: the trace records {self.tokens.shape[2]} per chain "
                                     "position (record more with python -m bench.replay --make-trace FILE "
                                     f"--trace-alternatives {m})")
        if depth > self.tokens.shape[1]:
            raise ValueError(f"depth {depth} exceeds the trace's eagle_k={self.tokens.shape[1]}")
        r = self.bank.rows(np.asarray(req, np.int64), np.asarray(pos, np.int64))
        toks, probs = self.tokens[r, :depth, :m], self.probs[r, :depth, :m]
        dead = (np.cumsum(self.bank.eagle_tokens[r, :depth] < 0, axis=1) > 0)[:, :, None]
        return np.where(dead, -1, toks), np.where(dead, 0.0, probs).astype(np.float32)


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


class PromptLookupIndex:
    """`prompt_lookup` kept incrementally for one growing context (same answers, O(max_n) per token instead of a
    scan of the whole context per position): for each n, the first occurrence of every n-gram that ends before the
    last token."""

    def __init__(self, prompt, min_n: int, max_n: int):
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.ctx: list = []
        self.first: dict = {n: {} for n in range(self.min_n, self.max_n + 1)}
        self.extend(prompt)

    def extend(self, tokens) -> None:
        ctx, first = self.ctx, self.first
        for t in np.asarray(tokens).tolist():
            ctx.append(int(t))
            e = len(ctx) - 2          # n-grams ending at e now end before the last token: they may be copied from
            if e < 0:
                continue
            for n, table in first.items():
                s = e - n + 1
                if s >= 0:
                    table.setdefault(tuple(ctx[s:e + 1]), s)

    def propose(self, k: int) -> np.ndarray:
        ctx, T = self.ctx, len(self.ctx)
        for n in range(min(self.max_n, T - 1), self.min_n - 1, -1):
            s = self.first[n].get(tuple(ctx[T - n:]))
            if s is not None:
                return np.asarray(ctx[s + n:s + n + k], np.int64)
        return np.zeros(0, np.int64)
