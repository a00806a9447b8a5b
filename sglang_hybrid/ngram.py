"""NgramDrafter: the validated Python facade over the Rust suffix-automaton drafter (``sglang_hybrid._ngram``).

Why a facade: the Rust core takes only 1-D C-contiguous int32/int64 numpy arrays (so it can read them in place
with the GIL released); this module turns everything else a caller may reasonably pass into that form, and turns
everything unreasonable into a clear exception *before* the core is touched.

Input policy (documented choice):

* token and id arrays: numpy integer arrays of any integer dtype and Python sequences of ints are accepted;
  int32/int64 C-contiguous arrays are the zero-conversion fast path, other integer dtypes are converted once;
* float/bool/object arrays or sequences raise ``TypeError``; arrays that are not 1-D raise ``ValueError``; a strided
  (not C-contiguous) 1-D view, such as a column of a 2-D batch, is copied once into a contiguous array;
* token ids must be ``0 <= t < vocab_size`` (or ``< 2**31`` without ``vocab_size``): ``ValueError``;
* unknown request ids raise ``KeyError``; starting an id twice, extending a finished request, ``k``/``n_nodes``
  out of range raise ``ValueError``. A rejected call changes nothing (every other request is intact).

Thread safety: the core holds a mutex and releases the GIL for every call, so one drafter may be shared by
several Python threads.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from sglang_hybrid import _ngram

__all__ = ["NgramDrafter", "NgramDrafts", "drafter_defaults"]

drafter_defaults = _ngram.drafter_defaults
"""``drafter_defaults() -> dict``: every setting of :class:`NgramDrafter` and its default, read from the Rust core
(``rust_ngram::DrafterConfig::default()``, the one place the defaults are written)."""

_DEFAULTS = drafter_defaults()


class NgramDrafts(NamedTuple):
    """Batched drafts, the layout of docs/ARCHITECTURE.md ("n-gram drafts"); all arrays C-contiguous.

    ``tokens``/``parents``/``depth``/``match_len``/``count``/``total``: int32 ``[B, W]``; ``source``: int8
    ``[B, W]``; ``lengths``: int32 ``[B]``. Valid entries are a prefix of each row; padding holds -1 in
    ``tokens``/``parents`` and 0 elsewhere. Chains have ``parents[j] = j - 1``.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    parents: np.ndarray
    depth: np.ndarray
    match_len: np.ndarray
    count: np.ndarray
    total: np.ndarray
    source: np.ndarray


_FAST = (np.dtype(np.int32), np.dtype(np.int64))
_I32, _I64 = _FAST
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_new_drafts = tuple.__new__


def _int_array(x, name: str) -> np.ndarray:
    """1-D C-contiguous int32/int64 view or conversion of ``x`` (see the module docstring for the policy).

    Fast path (one step of a serving loop calls this a few times, so it must cost ~100 ns, not microseconds): a plain
    1-D C-contiguous int32/int64 ndarray is returned as is; the Rust core checks every token id.
    """
    if type(x) is np.ndarray and x.ndim == 1 and (x.dtype is _I32 or x.dtype is _I64) and x.flags.c_contiguous:
        return x
    if isinstance(x, np.ndarray):
        a = x
    elif isinstance(x, (list, tuple, range)):
        if len(x) == 0:
            return np.zeros(0, dtype=np.int64)
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in x):
            raise TypeError(f"{name} must contain only ints")
        try:
            return np.asarray(x, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"{name}: value out of int64 range") from None
    else:
        try:
            a = np.asarray(x)
        except Exception as e:  # pragma: no cover - exotic objects
            raise TypeError(f"{name} must be a 1-D integer array or a sequence of ints, got {type(x).__name__}") from e
    if a.dtype.kind not in "iu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must have an integer dtype, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)     # the core reads arrays in place: a strided view is copied once
    if a.dtype in _FAST:
        return a
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: value {int(a.max())} out of int64 range")
    return a.astype(np.int64)


def _req_id(req_id, name: str = "req_id") -> int:
    if type(req_id) is int and _I64_MIN <= req_id <= _I64_MAX:  # fast path: a plain in-range int
        return req_id
    if isinstance(req_id, bool) or not isinstance(req_id, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(req_id).__name__}")
    r = int(req_id)
    if not -(2**63) <= r < 2**63:
        raise ValueError(f"{name} {r} out of int64 range")
    return r


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


class NgramDrafter:
    """Suffix-automaton n-gram drafter over many requests (own context + shared corpus of finished requests).

    Args:
        max_draft: largest chain length ``k`` for :meth:`propose`.
        max_nodes: largest tree size for :meth:`propose_tree`.
        min_match: shortest matched context worth drafting from (>= 1).
        max_backoff: shorter contexts (suffix links) consulted per tree node, for prose alternatives.
        scan_limit: continuations examined per context in trees.
        use_corpus: consult the shared corpus (donations and :meth:`add_corpus`).
        corpus_cap_tokens: cap on donated corpus tokens (two generations of ``cap/2``); 0 disables donations.
        donate_prompts: :meth:`finish` with ``donate`` donates the whole context (prompt + response, one document)
            instead of the response alone. Prompts enter the corpus only when their request finishes, so a request
            never drafts from its own donated prompt.
        vocab_size: when given, token ids must be below it.

    Shapes:
        Inputs: prompts, token runs and request ids are 1-D integer arrays or sequences of ints (int32/int64
        C-contiguous numpy arrays pass without a copy; see the module docstring).
        :meth:`propose` / :meth:`propose_tree` return :class:`NgramDrafts`: int32 ``[B, k]`` (chain) or
        ``[B, n_nodes]`` (tree) per field, ``source`` int8, ``lengths`` int32 ``[B]``, ``B = len(req_ids)``.

    Every default comes from the Rust core (:func:`drafter_defaults`); none is written in Python.

    Why: a model drafter guesses; an n-gram drafter copies, and in edits, code and retrieval-heavy text the next
    tokens are often a verbatim copy of the request's own context or of an earlier response, which it drafts far
    deeper than a model would, on the host and without a GPU forward. Each drafted token carries the features
    (``match_len``, ``count``, ``total``, ``depth``, ``source``) the n-gram calibration turns into an acceptance, so
    the step can price it against the model's chain.
    """

    def __init__(
        self,
        max_draft: int = _DEFAULTS["max_draft"],
        *,
        max_nodes: int = _DEFAULTS["max_nodes"],
        min_match: int = _DEFAULTS["min_match"],
        max_backoff: int = _DEFAULTS["max_backoff"],
        scan_limit: int = _DEFAULTS["scan_limit"],
        use_corpus: bool = _DEFAULTS["use_corpus"],
        corpus_cap_tokens: int = _DEFAULTS["corpus_cap_tokens"],
        donate_prompts: bool = _DEFAULTS["donate_prompts"],
        vocab_size: int | None = _DEFAULTS["vocab_size"],
    ):
        args = dict(max_draft=max_draft, max_nodes=max_nodes, min_match=min_match, max_backoff=max_backoff,
                    scan_limit=scan_limit, corpus_cap_tokens=corpus_cap_tokens)
        for name, v in args.items():
            if _positive_int(v, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        for name in ("max_draft", "max_nodes", "min_match"):
            if args[name] < 1:
                raise ValueError(f"{name} must be >= 1, got {args[name]}")
        if vocab_size is not None and not 1 <= _positive_int(vocab_size, "vocab_size") <= 2**31:
            raise ValueError(f"vocab_size must be in [1, 2**31], got {vocab_size}")
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self.max_draft = int(max_draft)
        self.max_nodes = int(max_nodes)
        self._core = _ngram.NgramCore(
            max_draft=int(max_draft), max_nodes=int(max_nodes), min_match=int(min_match),
            max_backoff=int(max_backoff), scan_limit=int(scan_limit), use_corpus=bool(use_corpus),
            corpus_cap_tokens=int(corpus_cap_tokens), donate_prompts=bool(donate_prompts), vocab_size=self.vocab_size,
        )

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, req_id, prompt) -> None:
        """Registers ``req_id`` with its prompt (1-D ints; may be empty)."""
        self._core.start(_req_id(req_id), _int_array(prompt, "prompt"))

    def extend(self, req_id, tokens) -> None:
        """Appends the tokens accepted since the last call (any number, including none)."""
        self._core.extend(_req_id(req_id), _int_array(tokens, "tokens"))

    def extend_batch(self, req_ids, tokens, lengths) -> None:
        """Appends ``tokens`` split by ``lengths`` (``len(req_ids)`` entries) to distinct ``req_ids`` in one call.

        ``tokens`` is the concatenation of every request's new tokens (1-D), or a padded ``[B, M]`` array whose
        rows are cut to ``lengths``.
        """
        ids = _int_array(req_ids, "req_ids")
        lens = _int_array(lengths, "lengths")
        if lens.shape != ids.shape:
            raise ValueError(f"lengths must have one entry per request id, got {lens.shape} for {ids.shape}")
        if lens.size and int(lens.min()) < 0:
            raise ValueError("lengths must be non-negative")
        if isinstance(tokens, np.ndarray) and tokens.ndim == 2:
            if tokens.shape[0] != ids.shape[0] or (lens.size and int(lens.max()) > tokens.shape[1]):
                raise ValueError(f"tokens {tokens.shape} does not fit {ids.shape[0]} rows of lengths {lens.tolist()}")
            if tokens.dtype.kind not in "iu":
                raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}")
            mask = np.arange(tokens.shape[1])[None, :] < lens[:, None]
            flat = np.ascontiguousarray(tokens[mask])
        else:
            flat = _int_array(tokens, "tokens")
        offsets = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        if offsets[-1] != flat.shape[0]:
            raise ValueError(f"sum(lengths) = {int(offsets[-1])} but {flat.shape[0]} tokens were given")
        self._core.extend_batch(ids, flat, offsets)

    def finish(self, req_id, donate: bool = True) -> None:
        """Finishes ``req_id``: if ``donate``, donates its response (tokens after the prompt), or its prompt and
        response with ``donate_prompts``, to the shared corpus; frees its automaton."""
        self._core.finish(_req_id(req_id), bool(donate))

    def remove(self, req_id) -> None:
        """Forgets ``req_id`` (finished or not)."""
        self._core.remove(_req_id(req_id))

    def add_corpus(self, tokens) -> None:
        """Adds one document to the static external corpus (outside the cap, never evicted)."""
        self._core.add_corpus(_int_array(tokens, "tokens"))

    # -- drafts ------------------------------------------------------------------------------------------------
    def propose(self, req_ids, k: int | None = None) -> NgramDrafts:
        """Chain drafts, one per request, copying after the most recent occurrence of the longest matched suffix.

        Args:
            req_ids: the requests to draft for (each started and not finished).
            k: the longest chain, in ``[1, max_draft]`` (default ``max_draft``).

        Returns:
            :class:`NgramDrafts`, row ``i`` for ``req_ids[i]``; a row with no match has length 0.

        Shapes:
            req_ids: ``[B]`` integer. Every field ``[B, k]`` int32 (``source`` int8), ``lengths`` ``[B]`` int32;
            ``parents[j] = j - 1``.

        Why the copy continues past the end of the context: a copy that reaches the end continues over its own
        drafted tokens, so a context ending in a loop drafts the loop continued (docs/ngram.md, "Chain draft").
        """
        if k is None:
            k = self.max_draft
        elif type(k) is not int:
            k = _positive_int(k, "k")
        if not 1 <= k <= self.max_draft:
            raise ValueError(f"k = {k} out of range [1, max_draft = {self.max_draft}]")
        return _new_drafts(NgramDrafts, self._core.propose(_int_array(req_ids, "req_ids"), k))

    def propose_tree(self, req_ids, n_nodes: int) -> NgramDrafts:
        """Tree drafts, one per request, nodes added best-first by estimated probability.

        Args:
            req_ids: the requests to draft for (each started and not finished).
            n_nodes: the most nodes per tree, in ``[1, max_nodes]``.

        Returns:
            :class:`NgramDrafts`, row ``i`` for ``req_ids[i]``, nodes in topological order (``parents[j] < j``,
            ``-1`` = child of the root).

        Shapes:
            req_ids: ``[B]`` integer. Every field ``[B, n_nodes]`` int32 (``source`` int8), ``lengths`` ``[B]``
            int32.

        Why a tree: where the context continued in several ways (prose more than code), one chain bets on one
        continuation; a tree verifies the likely alternatives beside it, backing off to shorter contexts
        (``max_backoff``) for them.
        """
        n = n_nodes if type(n_nodes) is int else _positive_int(n_nodes, "n_nodes")
        if not 1 <= n <= self.max_nodes:
            raise ValueError(f"n_nodes = {n} out of range [1, max_nodes = {self.max_nodes}]")
        return _new_drafts(NgramDrafts, self._core.propose_tree(_int_array(req_ids, "req_ids"), n))

    # -- introspection -----------------------------------------------------------------------------------------
    def __contains__(self, req_id) -> bool:
        if isinstance(req_id, bool) or not isinstance(req_id, numbers.Integral):
            return False
        return self._core.contains(_req_id(req_id))

    def __len__(self) -> int:
        return self._core.num_requests()

    @property
    def num_requests(self) -> int:
        """Registered requests (finished ones included until removed)."""
        return self._core.num_requests()

    def context_len(self, req_id) -> int:
        """Prompt + accepted tokens of ``req_id`` (0 once finished)."""
        return self._core.context_len(_req_id(req_id))

    def memory_bytes(self, req_id=None) -> int:
        """Heap bytes held: in total (requests + corpus), or by one request's automaton."""
        if req_id is None:
            return self._core.memory_bytes()
        return self._core.request_memory_bytes(_req_id(req_id))

    def corpus_stats(self) -> dict:
        """Shared-corpus bookkeeping: donated/static tokens held (separators included), bytes, rotations."""
        donated, static, nbytes, rotations = self._core.corpus_stats()
        return {"donated_tokens": donated, "static_tokens": static, "bytes": nbytes, "rotations": rotations}
