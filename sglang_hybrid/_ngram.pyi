"""Type stubs of the compiled module ``sglang_hybrid._ngram`` (built by maturin from ``rust_ngram_py``).

Use :class:`sglang_hybrid.ngram.NgramDrafter`; this core accepts only 1-D C-contiguous int32/int64 numpy arrays
and raises ``TypeError`` (wrong dtype/type), ``ValueError`` (non-contiguous, token out of range, duplicate start,
finished request, bad ``k``/``n_nodes``) or ``KeyError`` (unknown request id). Every call releases the GIL.

Defaults are written only in Rust (``DrafterConfig::default()``): read them with :func:`drafter_defaults`; this stub
gives none (``= ...``).
"""

from typing import TypedDict

import numpy as np
import numpy.typing as npt

SEPARATOR: int
"""Token id reserved as the corpus document separator (never a valid token)."""

_IntArray = npt.NDArray[np.int32] | npt.NDArray[np.int64]
_Drafts = tuple[
    npt.NDArray[np.int32],  # tokens [B, W]
    npt.NDArray[np.int32],  # lengths [B]
    npt.NDArray[np.int32],  # parents [B, W]
    npt.NDArray[np.int32],  # depth [B, W]
    npt.NDArray[np.int32],  # match_len [B, W]
    npt.NDArray[np.int32],  # count [B, W]
    npt.NDArray[np.int32],  # total [B, W]
    npt.NDArray[np.int8],  # source [B, W]
]

class _DrafterConfig(TypedDict):
    """Every field of ``rust_ngram::DrafterConfig``, in the order of ``NgramCore``'s arguments."""

    max_draft: int
    max_nodes: int
    min_match: int
    max_backoff: int
    scan_limit: int
    use_corpus: bool
    corpus_cap_tokens: int
    donate_prompts: bool
    vocab_size: int | None

def drafter_defaults() -> _DrafterConfig:
    """``DrafterConfig::default()`` as a new dict: the defaults of ``NgramCore`` and ``NgramDrafter``."""
    ...

class NgramCore:
    def __init__(
        self,
        max_draft: int = ...,
        max_nodes: int = ...,
        min_match: int = ...,
        max_backoff: int = ...,
        scan_limit: int = ...,
        use_corpus: bool = ...,
        corpus_cap_tokens: int = ...,
        donate_prompts: bool = ...,
        vocab_size: int | None = ...,
    ) -> None: ...
    @property
    def max_draft(self) -> int: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def config(self) -> _DrafterConfig:
        """The configuration this core was built with (a new dict)."""
        ...
    def start(self, req_id: int, prompt: _IntArray) -> None: ...
    def extend(self, req_id: int, tokens: _IntArray) -> None: ...
    def extend_batch(self, req_ids: _IntArray, tokens: _IntArray, offsets: _IntArray) -> None: ...
    def propose(self, req_ids: _IntArray, k: int) -> _Drafts: ...
    def propose_tree(self, req_ids: _IntArray, n_nodes: int) -> _Drafts: ...
    def finish(self, req_id: int, donate: bool = True) -> None: ...
    def remove(self, req_id: int) -> None: ...
    def add_corpus(self, tokens: _IntArray) -> None: ...
    def contains(self, req_id: int) -> bool: ...
    def context_len(self, req_id: int) -> int: ...
    def num_requests(self) -> int: ...
    def memory_bytes(self) -> int: ...
    def request_memory_bytes(self, req_id: int) -> int: ...
    def corpus_stats(self) -> tuple[int, int, int, int]:
        """(donated tokens held, static tokens held, corpus bytes, generation rotations)."""
        ...
