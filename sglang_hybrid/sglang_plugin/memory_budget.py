"""Start-up memory budget: what HYBRID's speculative machinery takes on the device, against SGLang's plain EAGLE.

Why: HYBRID builds one SGLang ``SpecRuntimeState`` per (EAGLE depth, verify width) pair, assembled from a draft part
per depth (the multi-step draft backend and its draft decode graph set) and a verify part per width (a target backend
with its own FlashInfer workspace, the verify and the draft-extend backends' graph sets; ``runtime_states``, one
verify part under ragged verify). Their static buffers grow with ``max_bs x width x context``, and they are allocated
after SGLang has sized its KV pool, out of the memory it left free. A configuration that does not fit would otherwise
fail deep inside a graph capture with an out-of-memory error naming no setting. So the worker computes this budget at
start (``check_start``), logs it, and stops with the settings to change when it does not fit. The default launch (a
verify table measured at start, no ``verify_widths``) first picks its optional width buckets with the same budget
(``fit_widths_at_start``): each extra only while its verify part still fits. (Building a part also makes, and drops,
the draft worker's other backend at that shape: constructor wrappers only, freed before the next part, not counted.)

Every size below is SGLang 0.5.23's own sizing, read from its source (paths relative to ``sglang/``; "~" = approximate
line), and FlashInfer 0.7.2's (the version SGLang 0.5.23 requires; not installed on CPU machines, read from its wheel):

* FlashInfer backend (``srt/layers/attention/flashinfer_backend.py``): one process-wide workspace of
  ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` = 384 MiB (``srt/environ.py`` ~1221) shared by every backend built with
  ``init_new_workspace=False`` (``get_buffer("flashinfer_workspace")``, ~457-472): the target's, the draft decode
  steps' and the draft extend's. Plain EAGLE therefore holds ONE. ``build_adaptive_runtime_state`` builds each extra
  state's target backend with ``init_new_workspace=True`` (``srt/speculative/eagle_worker_v2.py`` ~1797-1803): one more
  384 MiB workspace per extra runtime state (the design note's assumption, verified). Each FlashInfer wrapper allocates
  an 8 MiB int workspace on the device (FlashInfer ``decode.py`` ~1347, ``prefill.py`` ~2152 paged, ~4171 ragged):
  a backend builds 4 (2 with ``skip_prefill``, ~523-562), and a captured graph set builds one wrapper set per
  captured batch size and keeps it (``_prepare_cuda_graph_metadata`` ~1315-1341, ``_create_decode_wrappers`` /
  ``_create_prefill_wrappers`` ~1142-1198): 35 x 8 MiB per graph set at 128 requests, ``steps - 1`` times that for
  the draft decode. ``init_cuda_graph_state`` (~1100-1140)
  allocates int32 KV indices of ``max_num_tokens x context`` and, unless ``skip_prefill``, a uint8 custom mask of the
  same count: ``5 x max_bs x width x context`` bytes for the target verify and the draft extend. The multi-step draft
  backend (~2442-2482, 2630-2646) holds ``steps - 1`` decode backends and int32 KV indices of
  ``steps x max_bs x topk x context`` (``srt/speculative/spec_utils.py`` ~298-309).
* Triton backend (``srt/layers/attention/triton_backend.py``): no workspace; ``init_cuda_graph_state`` (~1160-1255)
  allocates float32 split-KV logits ``max_num_tokens x heads x kv_splits x head_dim`` and their LSE, the lean-decode
  partials (one row set per SM), int64 KV indices ``max_num_tokens x context`` and, for the target verify, the uint8
  FULL_MASK verify mask ``max_bs x width x (context + width)`` (``srt/layers/attention/verify_mask.py`` ~11-26,
  57-81); the multi-step draft backend (~2762-2790) int64 KV indices ``steps x max_bs x topk x context``.
* HYBRID's draft parts below the start-up depth run in the start-up part's buffers (``shared_draft_steps``, chain
  drafts): on Triton they add no backend and no graph state, on FlashInfer no KV indices (their step backends and
  wrapper sets stay their own); their graph runners' input buffers count as any runner's.
* Graph runners: the target verify runner captures ``width`` tokens per request at every captured batch size and
  sizes its backend for ``max_bs x width`` tokens (``srt/model_executor/runner/decode_cuda_graph_runner.py``
  ~386-429); its input buffers (``srt/model_executor/runner_utils/buffers.py`` ~154-172) and the draft runners'
  (``srt/speculative/eagle_draft_cuda_graph_runner.py`` ~157-225, ``eagle_draft_extend_cuda_graph_runner.py``
  ~134-245) are coalesced process-wide by (name, size, dtype) (``srt/model_executor/input_buffers.py`` ~16-40), so
  runners of the same width share them. The draft decode graph exists only for ``steps > 1``
  (``eagle_worker_v2.py`` ~507); the draft extend graph for every state (~638).
* Logits: one float32 buffer per vocabulary, ``max_bs x max_draft_tokens`` rows, shared by every graph runner of the
  process (``srt/model_executor/graph_shared_output.py`` ~36-71, rows ``model_runner.py`` ~905-930).
* Captured batch sizes: SGLang's speculative list up to ``--cuda-graph-max-bs`` (default
  ``min(256, --max-running-requests)`` on an H200, ``srt/arg_groups/memory_hook.py`` ~135-178;
  list ``srt/arg_groups/cuda_graph_hook.py`` ~500-532): 35 sizes at 128.
* Draft KV: inside SGLang's KV pool, sized with the target's (``srt/model_executor/pool_configurator.py`` ~262-303):
  it takes KV tokens, not free memory; reported per token. The draft weights are loaded before the pool is sized
  (``srt/mem_cache/kv_cache_configurator.py`` ~2990-3050 charges them to ``--mem-fraction-static``).

Left out, the same for EAGLE and HYBRID or below a MiB: the graph memory pool (the captured forwards' activations;
one pool per process reused from capture to capture, ``srt/model_executor/runner_utils/pool.py`` ~109-115, whose
largest capture is the 8,192-token prefill graph, not a ``max_bs x width`` verify), the prefill graphs, index arrays
of ``max_bs + 1`` entries, the draft runner's own default backend, and HYBRID's KB-sized tensors (counters,
calibration and cost tables, the draft's per-step confidence). Pinned host memory (each FlashInfer wrapper also pins
8 MiB of host memory) is not device memory and is not counted.

HYBRID's own device buffers (``hybrid_buffer_bytes``): the proposal buffers and ring (``alignment.alloc_buffers``),
the device prompt lookup's table (``context_lookup.alloc_context``: slots x the ``req_to_token`` row), the EAGLE chain
copy, the online offsets, and the fused step's workspace at the largest batch (``kernels.Workspace``; its verify mask
when the backend has no preallocated one, FlashInfer's case, bounded by the KV pool's tokens); under ragged verify on
the Triton backend, the buffers its plan writes (``ragged_buffer_bytes``) and, with its token-tier graphs, their
inputs, logits buffer and hidden state buffer (``ragged_graph_bytes``; both: ``ragged_triton_bytes``); on the
FlashInfer backend, with its token-tier graphs, the buffers their wrappers plan into and the same graph inputs
(``ragged_flashinfer_bytes``; nothing eager).

Runtime activation reserve (``runtime_activation_reserve``): what the serving steps allocate beyond every static
buffer above, at their peak. The default launch's width fit (``fit_widths_at_start``) keeps it free, beside SGLang's
post-capture reserve, before it adds any extra width. It has two parts, summed as the issue asks. The sum is an upper
bound: a verify and a prefill never share a forward. A mixed-chunk step, off by default and off for plugin
algorithms, decodes its running requests one token each, without a verify (``srt/arg_groups/speculative_hook.py``
~1104-1116).

* The sampled verify at the widest width W and ``running`` requests (``sampled_verify_reserve``), ``rows = running x
  W``. Every request with a temperature above 0 takes ``eagle_sample``'s sampling branch (``srt/speculative/
  eagle_utils.py`` ~521-855, from ``run_eagle_verify``, ``eagle_worker_common.py`` ~680). An all-greedy batch takes
  its argmax and copies nothing. The logits ``[rows, V]`` are float32 (``srt/layers/logits_processor.py``
  ``_copy_logits_to_buffer`` ~1336-1369). With graphs they are cast into the shared logits buffer, already counted
  above as "logits buffers". Without graphs, or with more requests than the largest captured batch, SGLang calls
  ``logits.float()`` and makes a fresh tensor, counted here. The branch: ``expanded_temperature`` (~720), then the
  softmax at the temperature (~724, ``kernels/ops/sampling/__init__.py`` ``softmax`` ~38-57: ``logits /
  temperatures`` makes one copy and ``torch.softmax`` another; FlashInfer's softmax runs only on sm 10.3 and copies
  the same). Then the top-k renorm (~729) and the top-p renorm (~737). On CUDA these are FlashInfer's
  ``top_k_renorm_probs`` / ``top_p_renorm_probs`` (``kernels/ops/sampling/renorm.py`` ~12-13), and each returns a new
  ``torch.empty_like(probs)`` while its input is still referenced. Then ``torch.zeros_like(target_probs)`` for the
  draft probabilities (~748, ``[bs, W, V]``, the same size). The tree kernel (``kernels/ops/speculative/
  sampling.py``) writes in place, and ``del`` (~785) frees it all. Each step holds its input and its output, so at
  most TWO float32 ``[rows, V]`` copies are alive beyond the logits. During the top-p renorm FlashInfer's AIR top-p
  workspace is also alive: per row, 384 B of counters, the 2,048-bin histogram and count histogram (4 B each), and two
  buffers of ``align256(V / 32)`` floats. Add the top-k renorm's 1 MiB row-state cache (allocated once, then kept).
  FlashInfer's allocations are read from its ``flashinfer/sampling.py`` in the newest stored source (0.6.18; the
  0.7.2 that SGLang requires was not available to read). Requests that return logprobs then run
  ``compute_spec_logprobs`` (``srt/layers/logprob_processor.py`` ~386-432), after the sampling tensors are freed: a
  gather, a temperature copy and the log-softmax of ``[running x accept_width, V]`` float32, three copies, counted
  where they exceed the sampling's peak. Left out: the ``[bs, V]`` penalty and logit-bias rows (their
  ``repeat_interleave`` to ``[rows, V]`` is one transient copy, before the softmax, below the peak), the debug NaN
  checks (off by default), the watermark clone (only with watermarks and logprobs), and rejection sampling (its
  draft probabilities come from the draft, not ``zeros_like``).
* A chunked prefill of ``chunked_prefill_size`` tokens C (``chunked_prefill_reserve``; SGLang sizes its own
  activation slack by the same token count, 1.5 MiB a token, ``srt/arg_groups/memory_hook.py`` ~297-310). These
  are the eager forward's live activations at a dense decoder layer's peak (``srt/models/llama.py``). First the
  residual stream, the sublayer's input and its output, ``3 x [C, hidden]``. Then the larger of the MLP's
  ``gate_up`` ``[C, 2 x intermediate]`` with its SiluAndMul output ``[C, intermediate]`` (``LlamaMLP.forward``
  ~124-141) and the attention's qkv ``[C, (heads + 2 kv_heads) x head_dim]`` with its output
  ``[C, heads x head_dim]`` (``LlamaAttention.forward`` ~243-288), per TP rank. Then the hidden states kept for the
  draft's extend, ``[C, draft_input_hidden]`` (EAGLE-3's captured aux layers, ``srt/layers/aux_hidden_states.py``
  ``AuxHiddenStateList.capture`` clones them). Then the logits of each request's last token only
  (``logits_processor.py`` ~720-735: ``hidden_states[last_index]``), ``[requests, V]`` in the model's dtype and
  float32. SGLang's default breakable prefill graphs run the layer body in the graph pool captured at start, but
  any batch they cannot replay runs eager (``srt/model_executor/runner/prefill_cuda_graph_runner.py``
  ``can_replay_locally`` ~1325-1421: input embeddings, LoRA, some logprob batches, more requests than captured, too
  much padding), and the logits tail is always eager, so the whole eager peak is counted. This is an upper bound: the
  logits come after the layer temporaries are freed. Mixture-of-experts layers are not modelled (their
  ``intermediate`` stands for the dense MLP's).

No SGLang import at module level: the budget is plain arithmetic, testable from numbers
(tests/plugin/test_memory_budget.py); ``check_start`` is the worker's entry point and reads the live objects.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from .ragged.tiers import token_tiers
from .server_args import TREE_MASK_BACKENDS

logger = logging.getLogger(__name__)

MiB = 1 << 20
GiB = 1 << 30
#: ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` default (``srt/environ.py`` ~1221)
FLASHINFER_WORKSPACE_BYTES = 384 * MiB
#: device int workspace every FlashInfer wrapper allocates in its constructor
FLASHINFER_WRAPPER_BYTES = 8 * MiB
#: the KV length buffer a FlashInfer prefill wrapper allocates in its constructor (32,768 int32)
FLASHINFER_WRAPPER_KV_LENS_BYTES = 32768 * 4
#: Triton lean-decode rows per program (``kernels/ops/attention/decode_attention.py`` ~1323)
TRITON_LEAN_BLOCK_M = 16
#: the row-state buffer FlashInfer's ``top_k_renorm_probs`` caches per device (``flashinfer/sampling.py``)
FLASHINFER_TOPK_ROW_STATES_BYTES = 1 * MiB


class HybridMemoryError(RuntimeError):
    """HYBRID's runtime states do not fit the memory SGLang left; the message names the settings to change."""


@dataclass(frozen=True)
class ModelShape:
    """Per-rank attention shape of a model: ``heads`` and ``kv_heads`` already divided by the attention TP size;
    ``intermediate``: the dense MLP's intermediate size per TP rank (0 = unknown: the chunked prefill reserve then
    counts the attention's activations only)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2
    intermediate: int = 0


@dataclass(frozen=True)
class Deployment:
    """What the budget depends on. ``cuda_graph_bs``: the captured decode batch sizes (empty: no CUDA graphs, e.g. the
    CPU engine or ``--disable-cuda-graph``); ``context_len``: the model's context length (SGLang sizes graph buffers by
    it, not by the requests' real lengths); ``draft_logits_vocab``: the draft head's vocabulary (EAGLE-3's hot vocab,
    else the target's); ``draft_input_hidden``: the width of the target hidden states fed to the draft extend (EAGLE-3:
    the concatenated aux layers); ``draft_weight_bytes``: the draft model's own parameters (tensors shared with the
    target excluded); ``kv_pool_tokens``: the KV pool's token capacity (bounds a verify mask), None = unknown;
    ``chunked_prefill_tokens``: the largest prefill forward (``--chunked-prefill-size``, else
    ``--max-prefill-tokens``), 0 = none reserved (``runtime_activation_reserve``)."""

    target: ModelShape
    draft: ModelShape
    draft_logits_vocab: int
    draft_input_hidden: int
    draft_weight_bytes: int
    max_running_requests: int
    context_len: int
    cuda_graph_bs: tuple = ()
    attention_backend: str = "flashinfer"
    topk: int = 1
    flashinfer_workspace_bytes: int = FLASHINFER_WORKSPACE_BYTES
    triton_kv_splits: int = 8
    sm_count: int = 132
    kv_pool_tokens: Optional[int] = None
    chunked_prefill_tokens: int = 0

    def __post_init__(self):
        if self.attention_backend not in TREE_MASK_BACKENDS:
            raise ValueError(f"no memory model for attention backend {self.attention_backend!r} (HYBRID runs "
                             f"{' and '.join(TREE_MASK_BACKENDS)})")

    @property
    def max_bs(self) -> int:
        return max(self.cuda_graph_bs) if self.cuda_graph_bs else 0


@dataclass(frozen=True)
class HybridBuffers:
    """HYBRID's own device buffers, in bytes: the fixed ones (allocated when the worker allocates its memory pool) and
    the fused step's workspace, which grows to its largest size during the first steps at the largest batch."""

    fixed: int
    workspace: int

    @property
    def total(self) -> int:
        return self.fixed + self.workspace


@dataclass(frozen=True)
class Budget:
    """The speculative machinery of one layout, in bytes.

    ``states``: the (EAGLE depth, verify width) runtime states, the start-up one first (SGLang's own, built before
    HYBRID's hook runs); ``draft_parts`` / ``verify_parts``: ``(depth, bytes)`` / ``(width, bytes)`` the parts the
    states are assembled from add (``runtime_states``), the start-up state's first; ``items``: the same total by
    component; ``graph_sets``: captured CUDA graph sets (a draft decode, a target verify or a draft extend graph set,
    each with one graph per captured batch size: ``graphs``); ``from_free``: the part allocated after SGLang sized its
    KV pool (everything but the draft weights), ``to_build``: the part the start-up check still has to place (the
    parts after the start-up state's and the workspace that has not grown yet); ``draft_kv_per_token``: draft KV bytes
    per KV-pool token (inside the pool)."""

    layout: str
    states: tuple
    draft_parts: tuple = ()
    verify_parts: tuple = ()
    items: dict = field(default_factory=dict)
    graph_sets: int = 0
    graphs: int = 0
    from_free: int = 0
    to_build: int = 0
    draft_kv_per_token: int = 0

    @property
    def total(self) -> int:
        return sum(self.items.values())


# -- SGLang's per-object sizes -----------------------------------------------------------------------------------------
def _fi_backend(skip_prefill: bool) -> int:
    """Wrapper int workspaces a ``FlashInferAttnBackend`` builds (ragged + decode, + paged and verify prefill)."""
    return (2 if skip_prefill else 4) * FLASHINFER_WRAPPER_BYTES


def _triton_graph_state(dep: Deployment, shape: ModelShape, max_bs: int, tokens: int, *, kv_indices: bool,
                        verify_width: int = 0) -> int:
    """``TritonAttnBackend.init_cuda_graph_state(max_bs, tokens)``: split-KV logits and LSE (float32), lean partials,
    split counts and int64 KV indices (unless shared from a multi-step backend), and the target's verify mask."""
    h, s, dv = shape.heads, dep.triton_kv_splits, shape.head_dim
    n = tokens * h * s * dv * 4 + tokens * h * s * 4
    n += dep.sm_count * TRITON_LEAN_BLOCK_M * (2 + dv) * 4 + dep.sm_count * 4 + 4     # lean partials, locks, flag
    if kv_indices:
        n += tokens * 4 + tokens * dep.context_len * 8
    if verify_width:
        n += max_bs * verify_width * (dep.context_len + verify_width)
    return n


def _verify_graphs(dep: Deployment, width: int) -> int:
    """Target verify graph set at ``width``: its backend's graph state and per-size wrappers (input buffers apart)."""
    m, c, n_bs = dep.max_bs, dep.context_len, len(dep.cuda_graph_bs)
    tokens = m * width
    if dep.attention_backend == "flashinfer":
        return tokens * c * 5 + n_bs * FLASHINFER_WRAPPER_BYTES
    return _triton_graph_state(dep, dep.target, m, tokens, kv_indices=True, verify_width=width)


def _extend_graphs(dep: Deployment, width: int) -> int:
    """Draft extend graph set at ``width`` (the draft backend's graph state and per-size wrappers)."""
    m, c, n_bs = dep.max_bs, dep.context_len, len(dep.cuda_graph_bs)
    tokens = m * width
    if dep.attention_backend == "flashinfer":
        return tokens * c * 5 + n_bs * FLASHINFER_WRAPPER_BYTES
    return _triton_graph_state(dep, dep.draft, m, tokens, kv_indices=True)


def _draft_graphs(dep: Deployment, depth: int, *, shared: bool = False) -> int:
    """Draft decode graph set at ``depth`` (>= 2): multi-step KV indices, its ``depth - 1`` backends' graph state.
    ``shared`` (FlashInfer): a depth below the start-up one, whose KV indices are the start-up part's
    (``shared_draft_steps``): its wrapper sets only."""
    m, c, n_bs, k = dep.max_bs, dep.context_len, len(dep.cuda_graph_bs), dep.topk
    if dep.attention_backend == "flashinfer":
        return (0 if shared else depth * m * k * c * 4) + (depth - 1) * n_bs * FLASHINFER_WRAPPER_BYTES
    steps = depth * m * k * c * 8 + m * k * 4
    return steps + (depth - 1) * _triton_graph_state(dep, dep.draft, m, m * k, kv_indices=False)


def _input_buffers(dep: Deployment, depth: int, width: int) -> dict:
    """Named static input buffers of a state's three graph runners: ``{(name, numel, itemsize): component}``; SGLang
    keeps one tensor per key process-wide. A verify mask of ``(max_bs x fill + tokens) x width`` bools (fill value 1
    for FlashInfer and Triton); the draft extend's ``select_index`` is not shared (per-runner key: one per verify
    part)."""
    m, t, d = dep.max_bs, dep.target, dep.draft
    n = m * width
    out = {}
    verify = (("input_ids", n, 8), ("input_embeds", n * t.hidden, t.dtype_bytes), ("out_cache_loc", n, 8),
              ("positions", n, 8), ("mrope_positions", 3 * n, 8), ("custom_mask", (m + n) * width, 1),
              ("req_pool_indices", m, 8), ("seq_lens", m, 8))
    extend = (("input_ids", n, 8), ("out_cache_loc", n, 8), ("positions", n, 8), ("mrope_positions", 3 * n, 8),
              ("hidden_states", n * dep.draft_input_hidden, d.dtype_bytes), ("req_pool_indices", m, 8),
              ("seq_lens", m, 8), ("extend_seq_lens", m, 4), ("num_correct_drafts", m, 4),
              ("num_accept_tokens", m, 4), (f"select_index@{width}", m, 8))
    out.update({k: "verify" for k in verify})
    for k in extend:
        out.setdefault(k, "draft extend")
    if depth > 1:
        r = m * dep.topk
        draft = (("input_ids", r, 8), ("out_cache_loc", r * depth, 8), ("positions", r, 8),
                 ("mrope_positions", 3 * r, 8), ("hidden_states", m * d.hidden, d.dtype_bytes), ("topk_p", r, 4),
                 ("topk_index", r, 8), ("req_pool_indices", m, 8), ("seq_lens", m, 8), ("extend_seq_lens", m, 4))
        for k in draft:
            out.setdefault(k, "draft decode")
    return out


def _verify_part(dep: Deployment, width: int, *, startup: bool, target_verify_graphs: bool = True) -> dict:
    """Bytes a verify part (``runtime_states.VerifyPart``) adds, by component (input buffers apart): the target's
    verify graph set and the draft extend's backend and graph set at ``width``. The start-up part's target backend is
    the one SGLang builds with or without speculation (the shared workspace); every later part builds a fresh target
    backend with its own workspace (``runtime_states.build_verify_part``, as ``build_adaptive_runtime_state`` does).
    ``target_verify_graphs`` False: SGLang captured no target verify graph set (ragged verify:
    ``HybridWorkerV2._skip_target_verify_capture``)."""
    fi = dep.attention_backend == "flashinfer"
    graphs = bool(dep.cuda_graph_bs)
    items = {"verify": _verify_graphs(dep, width) if graphs and target_verify_graphs else 0,
             "draft extend": (_extend_graphs(dep, width) if graphs else 0) + (_fi_backend(False) if fi else 0),
             "target workspaces": 0}
    if not startup and fi:
        items["target workspaces"] = dep.flashinfer_workspace_bytes + _fi_backend(False)
    return items


def _draft_part(dep: Deployment, depth: int, startup_depth: int) -> dict:
    """Bytes a draft part (``runtime_states.DraftPart``) adds: the multi-step draft decode backend (``depth - 1`` step
    backends) and its graph set; nothing at depth 1. Below the start-up depth, with chain drafts, it runs in the
    start-up part's buffers (``shared_draft_steps``): on Triton it adds nothing, on FlashInfer no KV indices (its
    graph set's input buffers apart)."""
    if depth <= 1:
        return {"draft decode": 0}
    fi = dep.attention_backend == "flashinfer"
    shared = depth < startup_depth and dep.topk == 1 and dep.attention_backend in TREE_MASK_BACKENDS
    if shared and not fi:
        return {"draft decode": 0}
    return {"draft decode": ((_draft_graphs(dep, depth, shared=shared) if dep.cuda_graph_bs else 0)
                             + ((depth - 1) * _fi_backend(True) if fi else 0))}


def budget(dep: Deployment, states: Sequence, *, layout: str, max_draft_tokens: int,
           own: Optional[HybridBuffers] = None, target_verify_graphs: bool = True) -> Budget:
    """The budget of building ``states`` ((depth, width) pairs, the start-up state first) at ``dep``: one draft part
    per distinct depth and one verify part per distinct width (``runtime_states``), the start-up state's first.
    ``max_draft_tokens``: the widest width SGLang was configured with (rows of the shared logits buffers); ``own``:
    HYBRID's own buffers (None for plain EAGLE); ``target_verify_graphs`` False: SGLang's target verify graphs were
    not captured (their graph state and input buffers are not allocated; ragged verify, in HYBRID's token-tier
    graphs, whose buffers ``own`` counts, or eager)."""
    states = tuple(dict.fromkeys((int(d), int(w)) for d, w in states))
    if not states:
        raise ValueError("a budget needs at least the start-up runtime state")
    depths = tuple(dict.fromkeys(d for d, _ in states))
    widths = tuple(dict.fromkeys(w for _, w in states))
    items = {"verify": 0, "draft extend": 0, "draft decode": 0, "target workspaces": 0, "input buffers": 0}
    keys: dict = {}
    graphs = bool(dep.cuda_graph_bs)

    def add(part: dict, depth: int, width: int, components: tuple) -> int:
        fresh = 0
        if graphs:
            for key, owner in _input_buffers(dep, depth, width).items():
                if owner in components and key not in keys:
                    keys[key] = True
                    fresh += key[1] * key[2]
        part["input buffers"] = fresh
        for k, v in part.items():
            items[k] += v
        return sum(part.values())

    d0, w0 = states[0]
    verify_parts = tuple((w, add(_verify_part(dep, w, startup=i == 0, target_verify_graphs=target_verify_graphs),
                                 d0, w, ("verify", "draft extend") if target_verify_graphs else ("draft extend",)))
                         for i, w in enumerate(widths))
    draft_parts = tuple((d, add(_draft_part(dep, d, d0), d, w0, ("draft decode",))) for d in depths)
    rows = dep.max_bs * max_draft_tokens
    logits = 0
    if graphs:
        logits = rows * dep.target.vocab * 4
        if dep.draft_logits_vocab != dep.target.vocab:
            logits += rows * dep.draft_logits_vocab * 4
    items["logits buffers"] = logits
    items["draft weights"] = dep.draft_weight_bytes
    items["hybrid buffers"] = own.total if own is not None else 0
    sets = (2 * len(widths) + sum(d > 1 for d in depths)) if graphs else 0
    d = dep.draft
    total = sum(items.values())
    later = sum(b for _, b in draft_parts[1:]) + sum(b for _, b in verify_parts[1:])
    return Budget(layout=layout, states=states, draft_parts=draft_parts, verify_parts=verify_parts, items=items,
                  graph_sets=sets, graphs=sets * len(dep.cuda_graph_bs), from_free=total - dep.draft_weight_bytes,
                  to_build=later + (own.workspace if own is not None else 0),
                  draft_kv_per_token=2 * d.layers * d.kv_heads * d.head_dim * d.dtype_bytes)


def eagle_budget(dep: Deployment, num_steps: int) -> Budget:
    """SGLang's plain EAGLE (topk 1) at ``num_steps``: one state, ``num_steps + 1`` draft tokens."""
    return budget(dep, [(num_steps, num_steps + 1)], layout="EAGLE", max_draft_tokens=num_steps + 1)


def hybrid_buffer_bytes(*, pool_size: int, num_steps: int, ngram_k: int, proposal_width: int,
                        context_cols: Optional[int], model_bias: bool, fused: bool, max_bs: int, width: int,
                        depths: int, mask_entries: int, ngram_bias: bool = False,
                        alternatives: int = 0, model_calibration: bool = True) -> HybridBuffers:
    """HYBRID's own device buffers (``HybridStep``), from its allocation code.

    Fixed: the proposal buffers (int64, ``alignment.alloc_buffers``: tokens and four features ``[P, pw]``, length,
    position and generation ``[P]``, the ring ``[P, max(2 pw, 16) + 1]``), the prompt lookup table
    (``context_lookup.alloc_context``: int32 ``[P, context_cols + 1]`` and int64 ``[P]``; ``context_cols`` = SGLang's
    ``req_to_token`` row, None = setting off), the EAGLE chain copy (int64 ``[P, steps]``) and the online offsets
    (float32 and int64 ``[P]`` per side, settings ``model_bias_eta`` and ``ngram_bias_eta``); with ``alternatives``
    (M, setting ``eagle_alternatives``) the position-0 top tokens per slot (``alternatives.FirstAlternatives``:
    float32 and int64 ``[P, M + 1]``, int64 ``[P]``) and the draft's records of every position's (float32 and int64
    ``[max_bs, steps, M + 1]``, ``HybridDraftWorker``).

    Workspace (``fused``: the fused step, ``kernels/__init__.py`` and ``kernels/decision.py``): at ``max_bs`` requests,
    the full ``width`` and ``depths`` candidate depths, its proposals, decision and verify-input arrays, the EAGLE
    chain's probabilities kept for the online temperature (float32 ``[max_bs, steps]``, ``model_calibration``: setting
    ``model_calibration_eta``, on by default), plus the verify mask when the target backend keeps none
    (``mask_entries`` bools, 0 when it does)."""
    p, pw = pool_size, proposal_width
    ring = max(2 * pw, 16)
    fixed = 8 * (5 * p * pw + 3 * p + p * (ring + 1)) + 8 * p * num_steps
    if context_cols is not None:
        fixed += 4 * p * (context_cols + 1) + 8 * p
    fixed += 12 * p * (int(model_bias) + int(ngram_bias))
    m = alternatives
    if m:
        fixed += 12 * p * (m + 1) + 8 * p + 12 * max_bs * num_steps * (m + 1)
    ws = 0
    if fused and max_bs:
        b, w, k, s = max_bs, width, ngram_k, num_steps
        adaptive = depths > 1
        ws = 6 * b * pw * 8 + 2 * b * 8 + 4 * b * (int(model_bias) + int(ngram_bias))
        ws += b if context_cols is not None else 0
        ws += 2 * b * s * 4 + 2 * b * k * 4 + ((b * s * 4 + b * 4) if adaptive else 0) + b * s * m * 4
        ws += b * s * 4 if model_calibration else 0
        ws += depths * b * w * 8 + depths * b * 4
        ws += 3 * b * w * 8 + b * w * w + 2 * b * w + b * w * 4 + b * 4 + (8 + 8 + 4 + 8)
        ws += 5 * b * w * 8 + mask_entries
    return HybridBuffers(fixed=fixed, workspace=ws)


def ragged_buffer_bytes(max_bs: int, width: int, context_len: int) -> int:
    """The buffers a ragged verify on SGLang's Triton backend plans into, allocated once at start
    (``ragged.triton_backend.enable``): int64 KV indices of ``max_bs`` committed prefixes and the uint8 packed mask of
    ``max_bs x width`` rows of ``context + width`` entries, plus one."""
    return 8 * max_bs * context_len + max_bs * width * (context_len + width) + 1


def ragged_graph_bytes(max_bs: int, width: int, *, vocab: int, hidden: int, hidden_bytes: int,
                       own_logits: bool) -> int:
    """What the token-tier verify graphs hold (``ragged.graph_runner``): their static inputs (int64 tokens, positions
    and KV write slots of ``max_bs x width`` rows; sequence lengths and request indices of ``max_bs``), the float32
    ``[rows, vocab]`` logits buffer every tier writes (``own_logits``: none shared by SGLang's graph runners, as
    under ``--disable-cuda-graph``), and the one ``[rows, hidden]`` buffer every tier copies its hidden states to
    (``keep_hidden``; ``hidden``: the verify forward's hidden state width, ``Deployment.draft_input_hidden``)."""
    rows = max_bs * width
    n = 8 * (3 * rows + 2 * max_bs)
    if own_logits:
        n += rows * vocab * 4
    return n + rows * hidden * hidden_bytes


#: the buffers of ``flashinfer_tier_buffer_sizes`` that hold bytes (uint8); the others hold int32
FLASHINFER_TIER_BYTE_BUFFERS = ("mask", "int_workspace")


def flashinfer_tier_buffer_sizes(max_bs: int, width: int, context_len: int) -> dict:
    """Entries of each buffer ragged verify's token-tier graphs on the FlashInfer backend plan into, allocated once
    at start (``ragged.flashinfer_backend.enable``): int32 indptrs of ``max_bs`` requests and the spare rows' owner,
    int32 KV indices (each request's ``context + width`` at most, the owner's spare rows below ``max_bs x width``),
    the bit-packed uint8 mask (the requests' ``n_b x (s_b + n_b)`` bits, at most ``max_bs x width x (context +
    width)``, and the owner's ``spare x spare``, packed to whole bytes per request), and one FlashInfer int
    workspace (bytes) every tier's wrapper shares."""
    rows = max_bs * width
    bits = rows * (context_len + width) + rows * rows
    return {"qo_indptr": max_bs + 2, "kv_indptr": max_bs + 2, "last_page_len": max_bs + 1,
            "kv_indices": max_bs * (context_len + width) + rows, "mask": bits // 8 + max_bs + 2,
            "mask_indptr": max_bs + 2, "int_workspace": FLASHINFER_WRAPPER_BYTES}


def ragged_flashinfer_bytes(dep: Deployment, running: int, width: int, *, tier_graphs: bool) -> int:
    """What ragged verify on the FlashInfer backend adds to HYBRID's own buffers at ``running`` requests and
    ``width``: nothing eager (its plan's arguments are made per step, as SGLang's eager verify makes its own); with
    the token-tier graphs, the buffers they plan into (``flashinfer_tier_buffer_sizes``: int32 but the mask and the
    workspace), each tier's wrapper's own KV length buffer (FlashInfer ``prefill.py`` ~2149: 32,768 int32; its int
    workspace is the shared one), and the graphs' inputs, hidden states and logits buffer (``ragged_graph_bytes``)."""
    if not tier_graphs:
        return 0
    sizes = flashinfer_tier_buffer_sizes(running, width, dep.context_len)
    n = sum(v if k in FLASHINFER_TIER_BYTE_BUFFERS else 4 * v for k, v in sizes.items())
    n += len(token_tiers(running * width)) * FLASHINFER_WRAPPER_KV_LENS_BYTES
    return n + ragged_graph_bytes(running, width, vocab=dep.target.vocab, hidden=dep.draft_input_hidden,
                                  hidden_bytes=dep.target.dtype_bytes, own_logits=not dep.cuda_graph_bs)


def ragged_triton_bytes(dep: Deployment, running: int, width: int, *, tier_graphs: bool) -> int:
    """What ragged verify on the Triton backend adds to HYBRID's own buffers at ``running`` requests and ``width``:
    the buffers its plan writes (``ragged_buffer_bytes``) and, with its token-tier graphs (``tier_graphs``), their
    inputs, hidden states and logits buffer (``ragged_graph_bytes``). Under ragged verify SGLang's target verify
    graph set is not captured, graphs or not: ``budget(target_verify_graphs=False)``."""
    n = ragged_buffer_bytes(running, width, dep.context_len)
    if tier_graphs:
        n += ragged_graph_bytes(running, width, vocab=dep.target.vocab, hidden=dep.draft_input_hidden,
                                hidden_bytes=dep.target.dtype_bytes, own_logits=not dep.cuda_graph_bs)
    return n


def workspace_mask_entries(dep: Deployment, width: int) -> int:
    """Entries of the FULL_MASK verify mask HYBRID's workspace keeps (``worker.verify_mask_buffer``): none where the
    target backend preallocated one (SGLang's Triton backend under graphs), else one for the largest batch, ``seq_len x
    width + width x width`` per request, the contexts bounded by the model's context and by the KV pool's tokens."""
    if dep.attention_backend == "triton" and dep.cuda_graph_bs:
        return 0
    batch = dep.max_bs or dep.max_running_requests
    seq_sum = batch * dep.context_len
    if dep.kv_pool_tokens:
        seq_sum = min(seq_sum, dep.kv_pool_tokens)
    return seq_sum * width + width * width * batch


def post_capture_reserve_bytes(tp_size: int = 1, pp_size: int = 1) -> int:
    """Free memory to keep for the runtime once every graph is captured: SGLang's own reserve when it sizes the KV pool
    after capture (1536 MiB + tp x pp / 8 GiB, ``srt/arg_groups/memory_hook.py`` ~291-295)."""
    return int((1536 + tp_size * pp_size / 8 * 1024) * MiB)


# -- the runtime activation reserve (module docstring, "Runtime activation reserve") -----------------------------------
def _align256(n: int) -> int:
    return (n + 255) // 256 * 256


def flashinfer_top_p_workspace_bytes(rows: int, vocab: int, *, deterministic: bool = False) -> int:
    """The workspace FlashInfer's ``top_p_renorm_probs`` allocates for ``rows`` float32 rows of ``vocab`` (AIR top-p,
    ``flashinfer/sampling.py``, "Must match GetAirTopPRenormWorkspaceSize"): 384-byte counters, a 2,048-bin histogram
    (4 B, 8 B deterministic) and count histogram (4 B), two buffers of ``align256(vocab / 32)`` floats, per row, each
    part 256-aligned. SGLang calls it without ``is_deterministic`` (False)."""
    buf_len = max(_align256(vocab // 32), 256)
    hist = 8 if deterministic else 4
    return (_align256(384 * rows) + _align256(hist * 2048 * rows) + _align256(4 * 2048 * rows)
            + 2 * _align256(4 * buf_len * rows))


def sampled_verify_reserve(width: int, running: int, vocab: int, *, logits_dtype_bytes: int = 4,
                           logits_buffered: bool = True, accept_width: Optional[int] = None) -> tuple[int, dict]:
    """Peak bytes SGLang's sampled tree verify (``eagle_sample``'s sampling branch, temperature, top-k and top-p on)
    allocates at ``width`` tokens per request, ``running`` requests and a ``vocab``-token vocabulary, with its
    breakdown (values sum to the total):

    * ``logits``: the ``[rows, vocab]`` logits (``rows = running x width``; float32, ``logits_dtype_bytes``) when they
      are not in SGLang's shared graph logits buffer (``logits_buffered`` False: no graphs, a batch above the largest
      captured one, or ragged verify's padded scatter, ``ragged.layout.scatter_rows``), else 0 (counted in the budget);
    * ``probability copies``: the two float32 ``[rows, vocab]`` tensors every stage holds, its input and its output
      (the temperature copy and the softmax, the softmax and the top-k renorm, the top-k and the top-p renorms, the
      top-p renorm and the zero draft probabilities);
    * ``top-p workspace``: FlashInfer's AIR top-p workspace at ``rows`` (``flashinfer_top_p_workspace_bytes``), alive
      with the top-p renorm's input and output;
    * ``top-k row states``: FlashInfer's cached 1 MiB top-k row states;
    * ``logprob copies``: with ``accept_width`` (the ``accept_index`` width, the deepest path + 1), what the three
      float32 ``[running x accept_width, vocab]`` tensors of ``compute_spec_logprobs`` (requests returning
      logprobs; after the sampling's are freed) take beyond the sampling's peak, usually 0.

    The sources are in the module docstring ("Runtime activation reserve")."""
    rows = running * width
    copy = rows * vocab * 4
    items = {"logits": 0 if logits_buffered else rows * vocab * logits_dtype_bytes,
             "probability copies": 2 * copy,
             "top-p workspace": flashinfer_top_p_workspace_bytes(rows, vocab),
             "top-k row states": FLASHINFER_TOPK_ROW_STATES_BYTES}
    sampling = items["probability copies"] + items["top-p workspace"]
    logprobs = 3 * running * accept_width * vocab * 4 if accept_width else 0
    items["logprob copies"] = max(0, logprobs - sampling)
    return sum(items.values()), items


def chunked_prefill_reserve(chunk: int, target: ModelShape, *, requests: int, kept_hidden: int) -> tuple[int, dict]:
    """Peak bytes an eager prefill forward of ``chunk`` tokens allocates for ``target``'s activations (per TP rank),
    with its breakdown (values sum to the total):

    * ``hidden states``: the residual stream, a sublayer's input and its output, ``3 x [chunk, hidden]``;
    * ``layer intermediate``: the larger of the MLP's ``gate_up`` and activation output,
      ``[chunk, 3 x intermediate]``, and the attention's qkv and output, ``[chunk, (2 heads + 2 kv_heads) x
      head_dim]``;
    * ``draft hidden states``: the target hidden states kept for the draft's extend, ``[chunk, kept_hidden]``
      (``Deployment.draft_input_hidden``);
    * ``last-token logits``: ``[requests, vocab]`` in the model's dtype and float32 (the logits processor keeps each
      request's last token only). It comes after the layers' temporaries are freed, so summing it over-counts.

    Sources in the module docstring ("Runtime activation reserve")."""
    b, t = target.dtype_bytes, target
    attention = (2 * t.heads + 2 * t.kv_heads) * t.head_dim
    items = {"hidden states": 3 * chunk * t.hidden * b,
             "layer intermediate": chunk * max(3 * t.intermediate, attention) * b,
             "draft hidden states": chunk * kept_hidden * b,
             "last-token logits": min(requests, chunk) * t.vocab * (b + 4)}
    return sum(items.values()), items


def runtime_activation_reserve(dep: Deployment, width: int, running: Optional[int] = None, *,
                               accept_width: Optional[int] = None,
                               logits_buffered: Optional[bool] = None) -> tuple[int, dict]:
    """The memory the serving steps need beyond the static buffers at ``dep``: the sampled verify at ``width`` (the
    widest verify width) and ``running`` requests (default ``dep.max_running_requests``) plus a chunked prefill of
    ``dep.chunked_prefill_tokens``. Returns the total and the breakdown, keyed ``"sampled verify: <item>"`` and
    ``"chunked prefill: <item>"``. ``logits_buffered`` defaults to padded verify's case: the verify logits are in
    SGLang's shared graph logits buffer when graphs were captured up to ``running`` requests."""
    running = int(running if running is not None else dep.max_running_requests)
    if logits_buffered is None:
        logits_buffered = bool(dep.cuda_graph_bs) and running <= dep.max_bs
    _, verify = sampled_verify_reserve(width, running, dep.target.vocab, logits_buffered=logits_buffered,
                                       accept_width=accept_width)
    items = {f"sampled verify: {k}": v for k, v in verify.items()}
    if dep.chunked_prefill_tokens > 0:
        _, prefill = chunked_prefill_reserve(dep.chunked_prefill_tokens, dep.target, requests=running,
                                             kept_hidden=dep.draft_input_hidden)
        items.update({f"chunked prefill: {k}": v for k, v in prefill.items()})
    return sum(items.values()), items


def describe_reserve(items: dict) -> str:
    """``items`` (a reserve's breakdown) as one phrase, zero items left out: ``"sampled verify 1.67 GiB (...)"``."""
    parts = {}
    for key, v in items.items():
        group, _, item = key.partition(": ")
        if v:
            parts.setdefault(group, []).append(f"{item} {_gib(v)}")
    totals = {g: sum(v for k, v in items.items() if k.partition(": ")[0] == g) for g in parts}
    return " + ".join(f"{g} {_gib(totals[g])} ({', '.join(p)})" for g, p in parts.items())


# -- the start-up check ------------------------------------------------------------------------------------------------
def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def log_line(hybrid: Budget, eagle: Budget, free: Optional[int], reserve: Optional[int]) -> str:
    """The one start-up line: HYBRID's machinery by component and graph sets, against plain EAGLE's."""
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in hybrid.items.items() if v)
    ratio = hybrid.total / eagle.total if eagle.total else float("inf")
    n = len(hybrid.states)
    line = (f"HYBRID start-up memory: {n} runtime state{'s' if n > 1 else ''} {list(hybrid.states)} from draft "
            f"parts at depths {[d for d, _ in hybrid.draft_parts]} and verify parts at widths "
            f"{[w for w, _ in hybrid.verify_parts]}, {hybrid.graph_sets} graph sets ({hybrid.graphs} graphs), "
            f"speculative machinery {_gib(hybrid.total)} "
            f"({parts}); plain EAGLE at the same settings {_gib(eagle.total)}, {eagle.graph_sets} graph sets "
            f"({ratio:.2f}x); draft KV {hybrid.draft_kv_per_token} B/token in the KV pool")
    if free is not None:
        line += (f"; still to build {_gib(hybrid.to_build)} + runtime reserve {_gib(reserve)} "
                 f"against {_gib(free)} free")
    return line


def check_fits(hybrid: Budget, free: int, reserve: int, *, total_memory: Optional[int] = None,
               mem_fraction_static: Optional[float] = None) -> None:
    """Raise ``HybridMemoryError`` naming the settings to change when the parts still to build and the runtime
    reserve do not fit ``free`` bytes."""
    need = hybrid.to_build + reserve
    if need <= free:
        return
    short = need - free
    later = [*hybrid.draft_parts[1:], *hybrid.verify_parts[1:]]
    dearest_verify = max((b for _, b in hybrid.verify_parts[1:]), default=0)
    dearest_draft = max((b for _, b in hybrid.draft_parts[1:]), default=0)
    fix = [f"fewer runtime parts: HYBRID builds a verify part per verify width ({len(hybrid.verify_parts)} here, the "
           f"dearest still to build {_gib(dearest_verify)}) and a draft part per EAGLE depth "
           f"({len(hybrid.draft_parts)} here, the dearest still to build {_gib(dearest_draft)}); shorten the HYBRID "
           "settings verify_widths / draft_depths (e.g. SGLANG_HYBRID_VERIFY_WIDTHS='[4]', "
           "SGLANG_HYBRID_DRAFT_DEPTHS='[]': one depth, even with a draft table given or measured), or leave "
           "out cost_table and verify_widths (the table measured at start keeps only the extra widths that fit)"
           if later else "the start-up runtime state and HYBRID's workspace themselves do not fit"]
    if len(hybrid.verify_parts) > 1:
        fix.append("ragged verify (SGLANG_HYBRID_RAGGED_VERIFY=on with --attention-backend triton or flashinfer): one "
                   "verify part serves every width, and SGLang captures no target verify graphs")
    fix.append("a lower --cuda-graph-max-bs (every graph buffer grows with the largest captured batch)")
    fix.append("a shorter --context-length (graph buffers are sized by it)")
    if mem_fraction_static is not None and total_memory:
        fix.append(f"a lower --mem-fraction-static (at most {mem_fraction_static - short / total_memory:.3f}, "
                   f"now {mem_fraction_static:.3f}: it leaves the memory SGLang does not give the KV pool)")
    else:
        fix.append("a lower --mem-fraction-static")
    raise HybridMemoryError(
        f"HYBRID's runtime states do not fit the GPU memory SGLang left after sizing its KV pool: building the "
        f"{len(later)} parts after the start-up state's and HYBRID's workspace needs {_gib(hybrid.to_build)}, plus "
        f"{_gib(reserve)} kept free for the runtime (SGLang's post-capture reserve), but {_gib(free)} is free "
        f"({_gib(short)} short). Change one of: " + "; ".join(fix) + ".")


def deployment_of(worker, tp_size: int) -> Deployment:
    """The worker's live configuration: model shapes, captured batch sizes and backend as SGLang built them."""
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim

    target_runner = worker.target_worker.model_runner
    draft_runner = worker._draft_worker.draft_runner

    def shape(runner) -> ModelShape:
        mc = runner.model_config
        inter = int(getattr(getattr(mc, "hf_config", None), "intermediate_size", 0) or 0)
        return ModelShape(hidden=mc.hidden_size, layers=mc.num_hidden_layers,
                          heads=max(mc.num_attention_heads // tp_size, 1), kv_heads=mc.get_num_kv_heads(tp_size),
                          head_dim=mc.head_dim, vocab=mc.vocab_size, dtype_bytes=mc.dtype.itemsize,
                          intermediate=-(-inter // tp_size))

    target, draft = shape(target_runner), shape(draft_runner)
    hf = draft_runner.model_config.hf_config
    hot = getattr(worker._draft_worker, "hot_token_id", None)
    # the draft extend runner's rule for the draft head's vocabulary (eagle_draft_extend_cuda_graph_runner.py ~226-240)
    vocab = (getattr(hf, "draft_vocab_size", None) or getattr(hf, "hot_vocab_size", None)
             or (len(hot) if hot is not None else draft.vocab))
    shared = {t.data_ptr() for t in target_runner.model.parameters()}
    tensors = {t.data_ptr(): t for t in [*draft_runner.model.parameters(), *draft_runner.model.buffers()]}
    weights = sum(t.numel() * t.element_size() for ptr, t in tensors.items() if ptr not in shared)
    classes = {c.__name__ for c in type(target_runner.attn_backend).__mro__}
    backend = ("flashinfer" if "FlashInferAttnBackend" in classes else "triton" if "TritonAttnBackend" in classes
               else type(target_runner.attn_backend).__name__)      # any other: Deployment names it and refuses
    cuda = torch.device(worker.device).type == "cuda"
    return Deployment(
        target=target, draft=draft, draft_logits_vocab=int(vocab),
        draft_input_hidden=int(get_draft_input_from_target_hidden_dim(draft_runner)), draft_weight_bytes=weights,
        max_running_requests=int(worker.req_to_token_pool.req_to_token.shape[0]),
        context_len=int(target_runner.model_config.context_len),
        cuda_graph_bs=_captured_bs(worker, target_runner),
        attention_backend=backend, topk=int(worker.topk),
        flashinfer_workspace_bytes=int(envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get()),
        sm_count=torch.cuda.get_device_properties(worker.gpu_id).multi_processor_count if cuda else 132,
        kv_pool_tokens=int(getattr(target_runner, "max_total_num_tokens", 0) or 0) or None,
        chunked_prefill_tokens=_prefill_tokens(worker.server_args))


def _prefill_tokens(args) -> int:
    """The largest prefill forward SGLang runs: ``--chunked-prefill-size``, or ``--max-prefill-tokens`` where chunked
    prefill is off (<= 0); 0 where neither is set."""
    chunk = int(getattr(args, "chunked_prefill_size", 0) or 0)
    if chunk > 0:
        return chunk
    return max(int(getattr(args, "max_prefill_tokens", 0) or 0), 0)


def _captured_bs(worker, target_runner) -> tuple:
    """The decode batch sizes SGLang captured graphs at: its target verify runner's or, where it captured none for
    the target (ragged verify in HYBRID's token-tier graphs: ``HybridWorkerV2._skip_target_verify_capture``; its
    eager runner stands in, with no list), its draft runners' (the same list: ``get_batch_sizes_to_capture`` of the
    same server arguments); none without graphs."""
    draft = getattr(worker, "_draft_worker", None)
    for runner in (target_runner.decode_cuda_graph_runner, getattr(draft, "cuda_graph_runner", None),
                   getattr(draft, "cuda_graph_runner_for_draft_extend", None)):
        captured = getattr(runner, "capture_bs", None)
        if captured:
            return tuple(captured)
    return ()


def _start_budget(worker, dep: Deployment, states: Sequence) -> Budget:
    """HYBRID's budget at ``dep`` for the start-up state (SGLang's, built) and ``states``."""
    step = worker.hybrid_step
    width = worker.speculative_num_draft_tokens
    own = hybrid_buffer_bytes(
        pool_size=dep.max_running_requests, num_steps=worker.speculative_num_steps, ngram_k=step.k,
        proposal_width=step.proposal_width,
        context_cols=step.context.tokens.shape[1] - 1 if step.context is not None else None,
        model_bias=step.model_bias is not None, ngram_bias=step.ngram_bias is not None, fused=step.fused is not None,
        max_bs=dep.max_bs or dep.max_running_requests, width=width, depths=len(step.depths),
        mask_entries=workspace_mask_entries(dep, width), alternatives=worker.settings.eagle_alternatives,
        model_calibration=step.online_temperature is not None)
    ragged = getattr(worker, "_ragged", False)
    if ragged:
        from .ragged.graph_capture import tier_graph_kind

        runner = worker.target_worker.model_runner
        kind, _ = tier_graph_kind(runner, tp_size_of(worker), ragged=True, ragged_graphs=worker.settings.ragged_graphs)
        running = int(runner.max_running_requests)
        extra = ragged_triton_bytes if dep.attention_backend == "triton" else ragged_flashinfer_bytes
        own = replace(own, fixed=own.fixed + extra(dep, running, width, tier_graphs=kind is not None))
    return budget(dep, [(worker.speculative_num_steps, width), *states], layout="HYBRID", max_draft_tokens=width,
                  own=own, target_verify_graphs=not ragged)


def _free_and_reserve(worker, *, across_tp: bool = False) -> tuple[int, int]:
    """The GPU memory free now (SGLang's ``get_available_gpu_memory``; ``across_tp``: its minimum over the tensor
    parallel ranks, so every rank makes the same choice) and SGLang's post-capture runtime reserve."""
    from sglang.srt.utils import get_available_gpu_memory

    args = worker.server_args
    tp = tp_size_of(worker)
    if across_tp and tp > 1:
        from sglang.srt.distributed import get_tp_group

        free = get_available_gpu_memory(worker.device, worker.gpu_id, distributed=True,
                                        cpu_group=get_tp_group().cpu_group)
    else:
        free = get_available_gpu_memory(worker.device, worker.gpu_id)
    free = int(free * GiB)
    return free, post_capture_reserve_bytes(tp, int(getattr(args, "pp_size", 1) or 1))


def tp_size_of(worker) -> int:
    return max(int(getattr(worker.server_args, "tp_size", 1) or 1), 1)


def fit_widths(fits: Callable[[tuple], bool], required: Sequence[int], extras: Sequence[int]) -> tuple:
    """The verify widths to build: ``required``, then each of ``extras`` in order whose runtime states, with the
    widths kept so far, still ``fits`` (a predicate on a sorted width tuple); sorted. An extra that does not fit is
    skipped and a later, cheaper one still tried (a narrower width's states are smaller)."""
    kept = tuple(sorted(set(required)))
    for w in extras:
        trial = tuple(sorted({*kept, int(w)}))
        if trial != kept and fits(trial):
            kept = trial
    return kept


def fit_widths_at_start(worker, depths: Sequence[int], required: Sequence[int], extras: Sequence[int]) -> tuple:
    """At start on a GPU (the default launch, ``HybridSettings.fits_widths_to_memory``): the widths whose runtime
    parts (a verify part per width, a draft part per depth, padded verify) fit the memory free now, with SGLang's
    runtime reserve and the runtime activation reserve kept free (``runtime_activation_reserve``: a sampled verify
    at the widest width and the running limit, plus a chunked prefill); ``required`` are kept whatever they need
    (``check_start`` then refuses with the fix). One log line names both reserves and what was left out and why."""
    dep = deployment_of(worker, tp_size_of(worker))
    free, reserve = _free_and_reserve(worker, across_tp=True)   # the runtime states must agree across TP ranks
    widest = max([int(w) for w in (*required, *extras)] + [int(worker.speculative_num_draft_tokens)])
    running = int(getattr(worker.target_worker.model_runner, "max_running_requests", 0) or dep.max_running_requests)
    step = getattr(worker, "hybrid_step", None)
    accept = step.max_depth_at(widest) + 1 if hasattr(step, "max_depth_at") else widest
    activations, items = runtime_activation_reserve(dep, widest, running, accept_width=accept)

    def need(widths: tuple) -> int:
        return _start_budget(worker, dep, [(d, w) for d in depths for w in widths]).to_build + reserve + activations

    kept = fit_widths(lambda ws: need(ws) <= free, required, extras)
    left = [w for w in extras if w not in kept]
    logger.info("HYBRID: verify widths %s (plain EAGLE's and the full tree, then the extras that pay, %s, while their "
                "runtime states fit %s free with %s kept for the runtime and %s for its activations at width %d x %d "
                "requests: %s)%s; setting verify_widths chooses them instead",
                list(kept), list(extras) or "none", _gib(free), _gib(reserve), _gib(activations), widest, running,
                describe_reserve(items),
                "; left out: " + ", ".join(f"{w} (would need {_gib(need(tuple(sorted({*kept, w}))))})" for w in left)
                if left else "")
    return kept


def check_start(worker, states: Sequence) -> Budget:
    """At start, once the runtime states are known and before they are built: HYBRID's budget for ``states`` (after
    the start-up state, which SGLang has built) and plain EAGLE's at the same settings, one log line, and on a GPU
    the refusal when the rest does not fit the free memory (SGLang's ``get_available_gpu_memory``, read once here).
    Never refuses on the CPU engine."""
    import torch

    args = worker.server_args
    dep = deployment_of(worker, tp_size_of(worker))
    hybrid = _start_budget(worker, dep, states)
    eagle = eagle_budget(dep, worker.speculative_num_steps)
    if torch.device(worker.device).type != "cuda":
        logger.info(log_line(hybrid, eagle, None, None))
        return hybrid
    free, reserve = _free_and_reserve(worker)
    logger.info(log_line(hybrid, eagle, free, reserve))
    check_fits(hybrid, free, reserve, total_memory=torch.cuda.get_device_properties(worker.gpu_id).total_memory,
               mem_fraction_static=getattr(args, "mem_fraction_static", None))
    return hybrid
