"""Adapters that drive our drafter and the published anchors through one small interface, for bench/drafters.py.

Why adapters: the four drafters have different lifecycles (vLLM's n-gram proposer is stateless over the engine's
token buffer, Arctic keeps per-request and global suffix trees, SGLang keeps one global trie plus per-request match
state, ours keeps per-request suffix automata plus a shared corpus). The benchmark replays the same token streams
through all of them, so each adapter maps *start / extend / propose / propose_tree / finish / batch_step* onto the
calls its engine really makes, with that engine's default parameters. Anchors are always used through their
published packages (``vllm``, ``arctic-inference``, ``sglang``); nothing of their code is copied here.

Every anchor is optional: `load_adapters` returns the adapters that import, and for the others the reason (the
import error), so the benchmark runs, and says what is missing, on a machine without any of them.

Conventions: request ids are ints; tokens are 1-D C-contiguous int32 numpy arrays; ``propose`` returns the chain as
an int array; ``propose_tree`` returns ``(tokens, parents)`` with ``parents[i] < i`` and ``-1`` for children of the
last committed token (the layout of docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

EMPTY = np.zeros(0, dtype=np.int32)


class _Context:
    """A growable int32 token buffer (prompt + accepted tokens) whose prefix is always one contiguous view."""

    __slots__ = ("buf", "n")

    def __init__(self, prompt: np.ndarray, reserve: int = 0):
        self.buf = np.zeros(max(len(prompt) + reserve, 64), dtype=np.int32)
        self.buf[: len(prompt)] = prompt
        self.n = len(prompt)

    def append(self, tokens: np.ndarray) -> None:
        m = len(tokens)
        if self.n + m > len(self.buf):
            nb = np.zeros(max(2 * len(self.buf), self.n + m), dtype=np.int32)
            nb[: self.n] = self.buf[: self.n]
            self.buf = nb
        self.buf[self.n : self.n + m] = tokens
        self.n += m

    def tail(self, m: int) -> np.ndarray:
        return self.buf[max(0, self.n - m) : self.n]


class DrafterAdapter:
    """Interface of one drafter under replay. Subclasses map it onto their engine's real calls."""

    name: str = "?"

    def start(self, rid: int, prompt: np.ndarray) -> None:
        raise NotImplementedError

    def extend(self, rid: int, tokens: np.ndarray) -> None:
        raise NotImplementedError

    def propose(self, rid: int, k: int) -> np.ndarray:
        raise NotImplementedError

    def propose_tree(self, rid: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError(f"{self.name} has no tree drafts")

    def finish(self, rid: int) -> None:
        raise NotImplementedError

    def batch_step(self, rids: Sequence[int], new_tokens: Sequence[np.ndarray], k: int) -> List[np.ndarray]:
        """One decode step for a whole batch as the engine does it: append each request's newly accepted tokens,
        then draft ``k`` tokens for every request."""
        for r, t in zip(rids, new_tokens):
            self.extend(r, t)
        return [self.propose(r, k) for r in rids]

    def memory_bytes(self) -> Optional[int]:
        """Self-reported heap bytes, where the drafter can tell (None otherwise)."""
        return None


# --------------------------------------------------------------------------------------------------------------------
# Ours
# --------------------------------------------------------------------------------------------------------------------
class OursAdapter(DrafterAdapter):
    """`sglang_hybrid.ngram.NgramDrafter` with its defaults (shared corpus on: finished responses are donated)."""

    name = "ours"

    def __init__(self, max_draft: int = 8, max_nodes: int = 64, **kw):
        from sglang_hybrid.ngram import NgramDrafter

        self.d = NgramDrafter(max_draft=max_draft, max_nodes=max_nodes, **kw)
        self._one = np.zeros(1, dtype=np.int64)

    def start(self, rid, prompt):
        self.d.start(rid, prompt)

    def extend(self, rid, tokens):
        self.d.extend(rid, tokens)

    def propose(self, rid, k):
        self._one[0] = rid
        r = self.d.propose(self._one, k)
        return r.tokens[0, : r.lengths[0]]

    def propose_tree(self, rid, n):
        self._one[0] = rid
        r = self.d.propose_tree(self._one, n)
        m = r.lengths[0]
        return r.tokens[0, :m], r.parents[0, :m]

    def finish(self, rid):
        self.d.finish(rid, donate=True)
        self.d.remove(rid)

    def batch_step(self, rids, new_tokens, k):
        # One call to append everything, one call to draft for the whole batch (GIL released in both).
        ids = np.asarray(rids, dtype=np.int64)
        lengths = np.fromiter((len(t) for t in new_tokens), dtype=np.int64, count=len(new_tokens))
        flat = np.concatenate(new_tokens).astype(np.int32, copy=False) if len(new_tokens) else EMPTY
        self.d.extend_batch(ids, flat, lengths)
        # The rows of the [B, k] token array as drafted (padding -1 never equals a token, so scoring a padded row
        # is scoring its valid prefix): our native output, no per-request slicing in the timed step.
        return self.d.propose(ids, k).tokens

    def memory_bytes(self):
        return int(self.d.memory_bytes())


# --------------------------------------------------------------------------------------------------------------------
# vLLM ngram (prompt lookup, numba KMP over the engine's token buffer)
# --------------------------------------------------------------------------------------------------------------------
class VllmNgramAdapter(DrafterAdapter):
    """vLLM's own `NgramProposer` (``vllm.v1.spec_decode.ngram_proposer``) called exactly as its GPU model runner
    calls it: ``propose(k, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` over a ``[num_seqs, max_model_len]``
    int32 token buffer. The proposer only reads five config fields, so a duck-typed config replaces ``VllmConfig``
    (building a real one needs a model). Defaults are vLLM's: ``prompt_lookup_min = prompt_lookup_max = 5``.
    """

    memory_note = "no state beyond the engine's int32 token buffer (4 B/token, which vLLM holds anyway)"

    def __init__(self, k: int = 8, min_n: int = 5, max_n: int = 5, max_model_len: int = 1 << 16,
                 max_num_seqs: int = 1, name: Optional[str] = None):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=min_n, prompt_lookup_max=max_n,
                                               num_speculative_tokens=k),
            model_config=SimpleNamespace(max_model_len=max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        self.name = name or ("vllm-ngram" if (min_n, max_n) == (5, 5) else f"vllm-ngram[{min_n},{max_n}]")
        self.p = NgramProposer(cfg)
        self.max_model_len = max_model_len
        self.tok = np.zeros((max_num_seqs, max_model_len), dtype=np.int32)
        self.len = np.zeros(max_num_seqs, dtype=np.int32)
        self.slot: Dict[int, int] = {}
        self.free = list(range(max_num_seqs - 1, -1, -1))
        self._sampled = [[0]]

    def start(self, rid, prompt):
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_model_len={self.max_model_len}")
        s = self.free.pop()
        self.slot[rid] = s
        self.tok[s, : len(prompt)] = prompt
        self.len[s] = len(prompt)

    def extend(self, rid, tokens):
        s = self.slot[rid]
        n = self.len[s]
        self.tok[s, n : n + len(tokens)] = tokens
        self.len[s] = n + len(tokens)

    def propose(self, rid, k):
        s = self.slot[rid]
        out = self.p.propose(k, self._sampled, self.len[s : s + 1], self.tok[s : s + 1])
        return np.asarray(out[0], dtype=np.int32)

    def finish(self, rid):
        s = self.slot.pop(rid)
        self.len[s] = 0
        self.free.append(s)

    def batch_step(self, rids, new_tokens, k):
        slots = [self.slot[r] for r in rids]
        if slots != list(range(len(rids))):
            raise ValueError("batch_step needs the batch's requests in slots 0..B-1 (start them in order)")
        for s, t in zip(slots, new_tokens):
            n = self.len[s]
            self.tok[s, n : n + len(t)] = t
            self.len[s] = n + len(t)
        b = len(rids)
        out = self.p.propose(k, [[0]] * b, self.len[:b], self.tok[:b])
        return [np.asarray(o, dtype=np.int32) for o in out]


# --------------------------------------------------------------------------------------------------------------------
# Arctic Inference SuffixDecodingCache (what vLLM's `suffix` method runs)
# --------------------------------------------------------------------------------------------------------------------
class ArcticAdapter(DrafterAdapter):
    """`arctic_inference.suffix_decoding.SuffixDecodingCache` driven like vLLM's ``SuffixDecodingProposer``: start
    the request with its prompt, ``add_active_response`` with the newly sampled tokens, ``speculate`` on the last
    ``max_tree_depth`` tokens; a Python loop over the batch. vLLM's defaults: depth 24, 10000 cached responses,
    ``max_spec_factor = 1.0``, ``min_token_prob = 0.1``. Finished responses stay in its global tree."""

    name = "arctic"

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.c = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self.depth = max_tree_depth
        self.factor = max_spec_factor
        self.min_prob = min_token_prob
        self.ctx: Dict[int, _Context] = {}

    def start(self, rid, prompt):
        self.c.start_request(rid, prompt)
        self.ctx[rid] = _Context(prompt)

    def extend(self, rid, tokens):
        self.c.add_active_response(rid, tokens)
        self.ctx[rid].append(tokens)

    def _spec(self, rid, n, tree):
        return self.c.speculate(rid, self.ctx[rid].tail(self.depth), max_spec_tokens=n,
                                max_spec_factor=self.factor, min_token_prob=self.min_prob, use_tree_spec=tree)

    def propose(self, rid, k):
        return np.asarray(self._spec(rid, k, False).token_ids, dtype=np.int32)

    def propose_tree(self, rid, n):
        d = self._spec(rid, n, True)
        return np.asarray(d.token_ids, dtype=np.int32), np.asarray(d.parents, dtype=np.int32)

    def finish(self, rid):
        self.c.stop_request(rid)
        del self.ctx[rid]


# --------------------------------------------------------------------------------------------------------------------
# SGLang NgramCorpus (the NGRAM speculative worker's C++ trie)
# --------------------------------------------------------------------------------------------------------------------
def sglang_tree_from_mask(tokens: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """SGLang's draft (node 0 = last committed token, ``mask[i, j]`` = node j is an ancestor-or-self of node i) to
    ``(tokens, parents)`` without the root: the parent of a node is its deepest strict ancestor."""
    d = len(tokens)
    m = mask.reshape(d, d).astype(bool)
    depth = m.sum(axis=1) - 1
    parents = np.full(d - 1, -1, dtype=np.int32)
    for i in range(1, d):
        anc = np.flatnonzero(m[i, :i])
        anc = anc[anc > 0]
        if len(anc):
            parents[i - 1] = anc[np.argmax(depth[anc])] - 1
    return np.asarray(tokens[1:], dtype=np.int32), parents


class SglangAdapter(DrafterAdapter):
    """`sglang.srt.speculative.cpp_ngram.ngram_corpus.NgramCorpus` driven like SGLang's ``NGRAMWorker``: every step
    ``batch_put`` of the last ``max_trie_depth`` tokens of each request (after verify), ``synchronize`` and
    ``batch_get`` on the same tails. One global trie for all requests, BFS matching, depth 18 (SGLang's defaults).

    ``insert_prompt=False`` is SGLang as shipped (it never inserts the prompt, so it cannot copy from it);
    ``insert_prompt=True`` also inserts the whole prompt at start. ``breadth=1`` gives chains; the default breadth
    range 1..10 gives SGLang's BFS trees. SGLang always emits ``width`` nodes (unmatched slots are token 0 under the
    root); they are scored as SGLang's verifier would see them. ``capacity`` (trie nodes, preallocated) is smaller than
    SGLang's 10M default to spare memory; least recently used nodes are evicted beyond it.
    """

    def __init__(self, width: int = 8, insert_prompt: bool = True, breadth: Optional[int] = None,
                 max_trie_depth: int = 18, capacity: int = 1_000_000, name: Optional[str] = None):
        os.environ.setdefault("MAX_JOBS", "1")  # its first use JIT-compiles the C++ corpus; keep that polite
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        lo, hi = (breadth, breadth) if breadth else (1, 10)
        self.c = NgramCorpus(max_trie_depth=max_trie_depth, min_bfs_breadth=lo, max_bfs_breadth=hi,
                             draft_token_num=width + 1, match_type="BFS", capacity=capacity)
        self.width = width
        self.depth = max_trie_depth
        self.insert_prompt = insert_prompt
        self.name = name or ("sglang" + ("+prompt" if insert_prompt else "") + ("" if breadth is None else "-chain"))
        self.ctx: Dict[int, _Context] = {}

    def start(self, rid, prompt):
        self.ctx[rid] = _Context(prompt)
        if self.insert_prompt and len(prompt):
            self.c.batch_put([prompt.tolist()])
            self.c.synchronize()

    def extend(self, rid, tokens):
        c = self.ctx[rid]
        c.append(tokens)
        self.c.batch_put([c.tail(self.depth).tolist()])

    def _get(self, rids):
        self.c.synchronize()
        tails = [self.ctx[r].tail(self.depth).tolist() for r in rids]
        lens = [self.ctx[r].n for r in rids]
        return self.c.batch_get([str(r) for r in rids], tails, lens)

    def propose_tree(self, rid, n):
        if n != self.width:
            raise ValueError(f"this SGLang corpus drafts {self.width} nodes, asked for {n}")
        toks, mask = self._get([rid])
        return sglang_tree_from_mask(toks, mask)

    def propose(self, rid, k):
        # With breadth 1 the BFS tree is one chain (plus token-0 filler under the root): follow it from the root.
        toks, parents = self.propose_tree(rid, self.width)
        chain = []
        cur = -1
        for i in range(len(toks)):
            if parents[i] == cur:
                chain.append(toks[i])
                cur = i
        return np.asarray(chain[:k], dtype=np.int32)

    def finish(self, rid):
        self.c.erase_match_state([str(rid)])
        del self.ctx[rid]

    def batch_step(self, rids, new_tokens, k):
        tails = []
        for r, t in zip(rids, new_tokens):
            c = self.ctx[r]
            c.append(t)
            tails.append(c.tail(self.depth).tolist())
        self.c.batch_put(tails)
        toks, mask = self._get(rids)
        w = self.width + 1
        return [sglang_tree_from_mask(toks[i * w : (i + 1) * w], mask[i * w * w : (i + 1) * w * w])[0]
                for i in range(len(rids))]


# --------------------------------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------------------------------
#: name -> (package, module to import, install hint)
ANCHORS = {
    "vllm-ngram": ("vllm", "vllm.v1.spec_decode.ngram_proposer",
                   "pip install --no-deps vllm==0.33.0 && pip install numba==0.65.1 cbor2 openai openai-harmony"),
    "arctic": ("arctic-inference", "arctic_inference.suffix_decoding",
               "pip install cmake nanobind==2.9.2 && CMAKE_ARGS=-DPython_EXECUTABLE=$(which python3) "
               "pip install --no-deps --no-build-isolation --no-binary arctic-inference arctic-inference==0.3.0"),
    "sglang": ("sglang", "sglang.srt.speculative.cpp_ngram.ngram_corpus",
               "pip install --no-deps sglang==0.5.23 (+ scripts/requirements-sglang.txt) && pip install ninja"),
}


def probe(name: str) -> Optional[str]:
    """None when anchor ``name`` imports and constructs here, else the reason (first line of the error)."""
    try:
        if name == "ours":
            OursAdapter()
        elif name == "vllm-ngram":
            VllmNgramAdapter(max_model_len=1024)
        elif name == "arctic":
            ArcticAdapter()
        elif name == "sglang":
            SglangAdapter(capacity=1024)
        else:
            raise KeyError(name)
        return None
    except Exception as e:  # noqa: BLE001 - the reason is reported, never swallowed
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        hint = ANCHORS.get(name, ("", "", ""))[2]
        return msg + (f"  [install: {hint}]" if hint else "")


def load_adapters(names: Sequence[str] = ("ours", "vllm-ngram", "arctic", "sglang"),
                  ) -> Tuple[List[str], Dict[str, str]]:
    """Which of ``names`` work here, and for the others why not."""
    ok, missing = [], {}
    for n in names:
        why = probe(n)
        if why is None:
            ok.append(n)
        else:
            missing[n] = why
    return ok, missing
