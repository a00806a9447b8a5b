"""``HybridWorkerV2``: SGLang's ``EAGLEWorkerV2`` with HYBRID's draft selection between draft and verify.

Decode step (everything on the device except the host bullets, host work that never waits for the device):

* ``HybridDraftWorker.draft``: the EAGLE chain (topk = 1, ``num_steps`` tokens; CUDA graph when available) plus the
  softmax probability of every drafted token (``step_conf``, recorded inside ``draft_forward`` so the draft graph
  captures it) and, with the setting ``eagle_alternatives``, each position's next most likely tokens (``top_p`` /
  ``top_i``; position 0's from the previous draft extend, kept per slot: ``alternatives``). Nothing of HYBRID's host
  work comes before this launch: the device starts drafting at once;
* host, while the device drafts: feed the Rust n-gram automaton with the tokens SGLang has committed on the host (one
  step late under overlap scheduling), propose, publish the proposals into slot-indexed device buffers
  (``NgramFeeder``), and copy the context of a request new to its slot into the device prompt lookup's table
  (``context_lookup``, once per slot occupancy). A request's automaton is built from its prompt at its prefill
  (``NgramFeeder.admit``, after the prefill forward is queued), so admitting a long prompt costs no decode step;
* ``HybridStep.select``: align n-gram proposals (a row left without one takes the device prompt lookup's, over the
  batch's real contexts: a span from host-known sequence lengths, ``_longest_context``), then the
  core's ``step.DecisionStep`` (calibrate, survivals, price, choose or merge) -> ``VerifyTree`` at this step's
  verify width, plus the EAGLE depth and width bucket for a later step; under tensor parallelism every rank then
  takes rank 0's tree and plan (``TreeBroadcast``);
* ``build_verify_input`` -> ``HybridVerifyInput`` (FULL_MASK for FlashInfer and Triton, see ``verify_mask_buffer``);
  SGLang's verify body (``run_eagle_verify``) with the tree branch
  on, which compacts the accepted path to the front when it is not a front prefix (n-gram branch of a merged tree);
* ``on_publish``, draft extend (EAGLE's), then the emitted tokens go into the per-slot ring used by alignment.
* host, once the step's results are on the CPU (``on_verify_complete_cpu``, SGLang's hook for adaptive speculation):
  switch to the EAGLE depth and width bucket the device chose, if they changed (``_switch_plan``).

No silent fallbacks: where a step falls back (the first drafted token left at EAGLE's placeholder confidence, a batch
without a host view of its requests, the prompt lookup reading its whole table, a chosen shape without a runtime
state) the worker counts it in ``HybridCounters`` (``fallback_<cause>``) and logs it once per worker and cause with
what caused it (``Fallbacks``).

Width buckets and draft depths: SGLang captures draft, verify and draft-extend graphs for one (steps, width) pair.
HYBRID builds one SGLang ``SpecRuntimeState`` per (depth, width) pair at start, assembled from a draft part per depth
and a verify part per width (``runtime_states``: the attention backends and graphs SGLang's adaptive speculation
builds per step count, each built once), and swaps between them with SGLang's ``apply_runtime_state``. The pair is
decided on the device each step and read on the host one step late, so choosing graphs never waits for the device.
Under DP attention both are fixed (ranks must agree). Building the states, the rest of start-up and the switch between
states: ``worker_startup``.

Lossless: the verify rules are SGLang's (greedy tree walk; tree speculative sampling with zero draft probabilities,
exact for deterministic proposals distinct among siblings, which EAGLE's argmax chain, its alternatives (the draft's
next-ranked tokens, the chain's own taken out) and n-gram copies are). Padding nodes are
unreachable in the retrieve lists (see ``verify_input``).

Not supported (rejected at start by ``server_args.validate_server_args``): pipeline parallelism, disaggregation,
adaptive steps, multi-layer EAGLE, rejection sampling, page size > 1, and attention backends other than FlashInfer and
Triton: see ``server_args.TREE_MASK_BACKENDS``: backends that verify a topk=1 draft as a causal chain would ignore
the tree mask, so only FlashInfer and Triton are accepted (checked again at the first decode step).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Optional

import torch

import sglang.srt.speculative.eagle_worker_v2 as _eagle_v2
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft, run_eagle_verify
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from . import alternatives
from .config import load_settings
from .hybrid_step import HybridStep
from .metrics import HybridCounters
from .ngram_host import NgramFeeder
from .ragged import layout as ragged_layout
from .ragged.flashinfer_backend import RaggedTierBuffers
from .ragged.tiers import tier_rows
from .server_args import TREE_MASK_BACKEND_CLASSES
from .verify_input import TreeMaskMode, build_verify_input, verify_nodes
from .worker_startup import WorkerStartup
from sglang_hybrid.widths import widen

logger = logging.getLogger(__name__)

#: ``run_eagle_verify`` compacts the accepted path to the front of each request's block only for ``topk > 1``; any
#: value above one selects that branch (our trees are irregular, the value is not used as a branching factor there).
_TREE_VERIFY_TOPK = 2
_construct_lock = threading.Lock()
#: decode results in flight between launch and host processing (overlap scheduling keeps one) plus margin; the
#: pinned buffers cycle, so a buffer is reused only after its entry left the queue
_PLAN_IN_FLIGHT = 3
_PLAN_BUFFERS = _PLAN_IN_FLIGHT + 1


class _QuietWidthSwitch(logging.Filter):
    """SGLang logs every runtime-state switch at INFO (rare for its step adaptation); HYBRID may switch widths and
    depths every few steps, and the counters already report their distribution, so those lines are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Switch adaptive runtime state")


_eagle_v2.logger.addFilter(_QuietWidthSwitch())


class Fallbacks:
    """The worker's fallbacks, none silent: each is counted in the HYBRID counters (``fallback_<cause>``, see
    ``metrics.FALLBACKS``) and logged once per worker and cause, with its cause and what to do about it."""

    def __init__(self, counters: HybridCounters):
        self.counters = counters
        self.logged: set = set()

    def __call__(self, cause: str, n: int, message: str) -> None:
        self.counters.on_fallback(cause, n)
        if cause not in self.logged:
            self.logged.add(cause)
            logger.warning("HYBRID fallback %s: %s (counted as fallback_%s in the HYBRID counters; logged once)",
                           cause, message, cause)


def extend_probabilities(extend_output, draft_input) -> tuple:
    """The draft extend's next-token distribution, one row per request of ``draft_input``: ``(probabilities [B, V]
    float32, None)``, the softmax of the extend's row-selected logits (``extend_output``, a ``LogitsProcessorOutput``,
    or None when none was captured); else ``(None, why not)``, and ``(None, None)`` for an empty batch. Taken once a
    step: the first drafted token's confidence (``first_token_confidence``) and the EAGLE alternatives
    (``HybridStep.keep_first_alternatives``) both read it."""
    index = draft_input.topk_index
    if index is None:
        return None, "the draft input has no top-k index"
    rows = index.shape[0]
    if rows == 0:
        return None, None
    logits = getattr(extend_output, "next_token_logits", None)
    if logits is None:
        return None, "no draft-extend logits were captured"
    if logits.shape[0] != rows:
        return None, f"the draft-extend logits have {logits.shape[0]} rows for {rows} requests"
    return torch.softmax(logits.float(), dim=-1), None


def first_token_confidence(probs: torch.Tensor, draft_input) -> None:
    """Give the next step's first drafted token its draft probability: EAGLE's topk=1 draft extend reports a
    placeholder ``topk_p`` of 1.0; replace it with the probability of the drafted token (``topk_index``) in the
    extend's distribution ``probs`` (``extend_probabilities``)."""
    draft_input.topk_p = probs.gather(-1, draft_input.topk_index.to(torch.int64))


def missing_host_view(batch, bs: int) -> Optional[str]:
    """Why the host cannot see this decode batch's ``bs`` requests (the n-gram feeder needs ``batch.reqs`` in batch
    order and SGLang's host copy of the request-pool slots), or None when it can."""
    reqs = getattr(batch, "reqs", None)
    if reqs is None:
        return "the batch carries no request list (batch.reqs)"
    if len(reqs) != bs:
        return f"batch.reqs holds {len(reqs)} requests for {bs} request-pool slots"
    if getattr(batch, "req_pool_indices_cpu", None) is None:
        return "the batch carries no host copy of its request-pool slots (batch.req_pool_indices_cpu)"
    return None


def verify_mask_buffer(attn, bs: int) -> Optional[torch.Tensor]:
    """The target backend's preallocated verify-mask buffer to write a FULL_MASK batch of ``bs`` requests into, or
    None (then the builder allocates a fresh mask).

    HYBRID always builds FULL_MASK (per request ``W x (seq_len + W)``): FlashInfer and Triton, the only backends it
    accepts, read that layout. SGLang 0.5.23 asks ``default_tree_mask_mode()``, which answers QLEN_ONLY on a CPU engine
    (the layout of its intel_amx kernel): with the Triton backend on CPU that mask is read as FULL_MASK and verification
    is silently wrong. So the layout follows the backend, not the platform. The preallocated buffer (which the verify
    CUDA graph reads) is used only when it has that layout and fits the batch, as SGLang's
    ``build_eagle_verify_input`` does.
    """
    verify_mask = attn.verify_mask
    if verify_mask is not None and verify_mask.mode == TreeMaskMode.FULL_MASK and verify_mask.fits(bs):
        return verify_mask.buffer
    return None


@contextlib.contextmanager
def _draft_worker_class(cls):
    """``EAGLEWorkerV2.__init__`` instantiates ``EagleDraftWorker`` by its module-level name; let it build ours.

    Scoped to the constructor call and serialised by a lock; the module attribute is restored afterwards.
    """
    with _construct_lock:
        original = _eagle_v2.EagleDraftWorker
        _eagle_v2.EagleDraftWorker = cls
        try:
            yield
        finally:
            _eagle_v2.EagleDraftWorker = original


class HybridDraftWorker(EagleDraftWorker):
    """EAGLE draft worker that records per-step draft confidence and hands the chain to HYBRID's selection."""

    hybrid_owner: Optional["HybridWorkerV2"] = None

    def __init__(self, *args, **kwargs):
        self._conf_col: Optional[int] = None
        self._extend_capture: Optional[list] = None
        super().__init__(*args, **kwargs)
        cap = self._topk1_parents_prealloc.shape[0]
        #: [max_bs, num_steps] softmax probability of each drafted token (column 0 from draft extend)
        self.step_conf = torch.ones((cap, self.speculative_num_steps), dtype=torch.float32, device=self.device)
        #: setting ``eagle_alternatives`` (M): the top M + 1 tokens of each draft forward's distribution, recorded
        #: beside the confidence ([max_bs, num_steps, M + 1]; column 0 is the draft extend's, kept per slot by the
        #: owner's step: ``HybridStep.keep_first_alternatives``); None when off
        self.alternatives = load_settings().eagle_alternatives
        shape = (cap, self.speculative_num_steps, self.alternatives + 1)
        self.top_p = torch.zeros(shape, dtype=torch.float32, device=self.device) if self.alternatives else None
        self.top_i = torch.zeros(shape, dtype=torch.int64, device=self.device) if self.alternatives else None
        original_forward = self.draft_runner.forward

        def forward_recording_confidence(*args, **kwargs):
            out = original_forward(*args, **kwargs)
            self._record(out.logits_output)
            return out

        self.draft_runner.forward = forward_recording_confidence

    def _rebuild_topk1_chain_buffers(self) -> None:
        # The chain buffers depend on num_steps only; SGLang asserts num_draft_tokens == num_steps + 1 because
        # EAGLE's verify width is the chain. HYBRID's verify width is larger (chain + n-gram branch).
        width = self.speculative_num_draft_tokens
        self.speculative_num_draft_tokens = self.speculative_num_steps + 1
        try:
            super()._rebuild_topk1_chain_buffers()
        finally:
            self.speculative_num_draft_tokens = width

    def _record(self, logits_output) -> None:
        if self._extend_capture is not None:
            self._extend_capture.append(logits_output)
        if self._conf_col is None or self._conf_col >= self.speculative_num_steps:
            return
        probs = torch.softmax(logits_output.next_token_logits.float(), dim=-1)
        if self.alternatives:
            top_p, top_i = alternatives.top_tokens(probs, self.alternatives, self.hot_token_id)
            n = top_p.shape[0]
            self.top_p[:n, self._conf_col].copy_(top_p)
            self.top_i[:n, self._conf_col].copy_(top_i)
            p = top_p[:, 0]                                        # the chain is argmax-drafted
        else:
            p = probs.amax(dim=-1)
        self.step_conf[: p.shape[0], self._conf_col].copy_(p)
        self._conf_col += 1

    def draft_forward(self, forward_batch):
        if forward_batch.forward_mode.is_idle():
            return super().draft_forward(forward_batch)
        topk_p = forward_batch.spec_info.topk_p
        self.step_conf[: topk_p.shape[0], 0].copy_(topk_p[:, 0])
        self._conf_col = 1
        try:
            out = super().draft_forward(forward_batch)
            written = self._conf_col
        finally:
            self._conf_col = None
        if written < self.speculative_num_steps and self.hybrid_owner is not None:
            # Host-side and once per Python run: per eager step, or once at a draft graph's capture, whose replays
            # then never write the missing columns either
            self.hybrid_owner.fallbacks(
                "conf_unwritten", int(topk_p.shape[0]),
                f"the draft runner's forward wrapped at start (HybridDraftWorker.__init__) ran {written - 1} of the "
                f"{self.speculative_num_steps - 1} draft forwards of this step: EAGLE tokens at positions {written} "
                f"and on keep the confidence of an earlier step (1.0 at first) and are priced as such (lossless). "
                "SGLang's draft_forward no longer calls self.draft_runner.forward in this build")
        return out

    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
        # Step-0 confidence: EAGLE's topk=1 extend reports 1.0; recompute the drafted token's probability from the
        # extend logits (row-selected by the time the base method returns, on both eager and graph paths).
        captured: list = []
        runner = self.cuda_graph_runner_for_draft_extend
        original_execute = runner.execute if runner is not None else None
        if runner is not None:
            def execute_capturing(*args, **kwargs):
                out = original_execute(*args, **kwargs)
                captured.append(out)
                return out
            runner.execute = execute_capturing
        self._extend_capture = captured
        try:
            super()._draft_extend_for_decode(batch, batch_result, kv_loc_plan=kv_loc_plan)
        finally:
            self._extend_capture = None
            if runner is not None:
                runner.execute = original_execute
        self._after_extend(batch, batch_result.next_draft_input, captured)

    def _after_extend(self, batch, draft_input, captured: list) -> None:
        """From the last captured extend output's distribution (``extend_probabilities``, one softmax): the first
        drafted token's confidence (``first_token_confidence``) and, with the setting ``eagle_alternatives``, the next
        step's position-0 alternatives (``HybridWorkerV2.keep_first_alternatives``). Where the distribution is
        missing, the placeholder stays and the fallback is counted and logged once (and the alternatives kept for
        those slots are dropped)."""
        probs, why = extend_probabilities(captured[-1] if captured else None, draft_input)
        if probs is not None:
            first_token_confidence(probs, draft_input)
        if self.alternatives and self.hybrid_owner is not None:
            self.hybrid_owner.keep_first_alternatives(batch, probs, self.hot_token_id)
        n = int(batch.seq_lens.shape[0])
        if why is not None and n and self.hybrid_owner is not None:
            self.hybrid_owner.fallbacks(
                "conf_placeholder", n,
                f"{why}: the first drafted token of the next step keeps EAGLE's placeholder confidence 1.0 and is "
                "priced as certain (more EAGLE nodes chosen than the draft deserves; lossless). HYBRID's draft "
                "extend hook (HybridDraftWorker._draft_extend_for_decode) does not match this SGLang build")

    def draft(self, batch, *, with_topology: bool = False):
        if with_topology:
            raise NotImplementedError("HYBRID does not support pipeline parallelism (PP tail-draft)")
        draft_input = batch.spec_info
        forward_batch, can_graph, kv_loc_plan = prepare_for_draft(
            draft_input, self.req_to_token_pool, batch, self.cuda_graph_runner, self.draft_runner, self.topk,
            self.speculative_num_steps, target_translator=self.target_worker.model_runner.kv_index_translator,
            num_draft_tokens=self.speculative_num_draft_tokens)
        if batch.forward_mode.is_idle():
            # An idle DP rank runs the draft exactly as SGLang's EAGLE does (the captured graph when it can), so it
            # enters the same collectives as the busy ranks; it selects nothing (its attention-TP group is idle too).
            if can_graph:
                self.cuda_graph_runner.execute(forward_batch)
            else:
                self.draft_forward(forward_batch)
            return EagleVerifyInput.create_idle_input(self.topk, self.speculative_num_steps,
                                                      self.speculative_num_draft_tokens, self.device)
        if can_graph:
            _, _, draft_tokens, _ = self.cuda_graph_runner.execute(forward_batch)
        else:
            if self.speculative_num_steps > 1:
                self.draft_attn_backend.init_forward_metadata(forward_batch)
                forward_batch.mark_forward_metadata_ready()
            _, _, draft_tokens, _ = self.draft_forward(forward_batch)
        # the draft is queued: the host's n-gram work runs now, under it, not before the step's first launch
        self.hybrid_owner.host_proposals(batch)
        bs, depth = draft_tokens.shape
        verify_input = self.hybrid_owner.build_verify(batch, draft_input, draft_tokens, self.step_conf[:bs, :depth])
        if kv_loc_plan is not None:
            verify_input.kv_loc_plan = kv_loc_plan
            verify_input.prepared_out_cache_loc = kv_loc_plan.write_virtual
            self.hybrid_owner.counters.kv_window_steps += 1
        return verify_input


class HybridWorkerV2(WorkerStartup, EAGLEWorkerV2):
    """SGLang V2 speculative worker for ``--speculative-algorithm HYBRID``: its state, and the per-step path this
    module's docstring walks; start-up and the (depth, width) plan switching come from ``WorkerStartup``."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        with _draft_worker_class(HybridDraftWorker):
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.settings = load_settings()
        self.counters = HybridCounters(self.device, self.settings.log_interval)
        self.fallbacks = Fallbacks(self.counters)
        self.hybrid_step: Optional[HybridStep] = None
        self.feeder: Optional[NgramFeeder] = None
        self._cur_gen: Optional[torch.Tensor] = None
        #: the decode batch's longest committed context as the host last saw it (``NgramFeeder``'s lengths), or None
        self._host_committed: Optional[int] = None
        self._last_tree = None
        #: DP ranks' forwards meet in collectives, so under DP attention every step drafts the configured depth and
        #: verifies at the full width
        self._fixed_shapes = bool(getattr(server_args, "enable_dp_attention", False))
        #: one SGLang runtime state (attention backends + graphs) per (EAGLE depth, verify width) pair
        self.runtime_states: dict = {}
        #: chosen (depth, width) pairs on their way to the host, oldest first: (host buffer, copy event or None, the
        #: deciding step's launch count)
        self._plan_fifo: collections.deque = collections.deque()
        cuda = torch.device(self.device).type == "cuda"
        self._plan_host = [torch.zeros(2, dtype=torch.int64, pin_memory=cuda) for _ in range(_PLAN_BUFFERS)]
        self._plan_next_buf = 0
        #: decode steps launched, and decode results the host has processed (``on_verify_complete_cpu``): their
        #: difference is how many results are in flight, 1 under overlap scheduling (``HybridCounters.lag_steps``)
        self._launched = 0
        self._processed = 0
        #: the runtime context's override-log entries of the last state switch (``runtime_states.apply_state`` keeps
        #: the log from growing with every switch)
        self._switch_log_entries: tuple = ()
        #: the target worker SGLang's verify body runs: the real one, or its ragged proxy (``_enable_ragged``)
        self._verify_target = None
        #: whether the device's (depth, width) plan reaches the host (more than one depth or width to choose from)
        self._plans_switch = False
        #: ragged verify (``_ragged_wanted``): runtime states per depth at the full width, and the width bucket (host
        #: int, one step late like the depth) caps the trees instead (``_tree_width``; None: the full width)
        self._ragged = False
        self._full_width = self.speculative_num_draft_tokens
        self._tree_width: Optional[int] = None
        if self._draft_worker is not None:
            self._draft_worker.hybrid_owner = self
        #: whether SGLang captured no target verify graphs at start (``_skip_target_verify_capture``)
        self._target_verify_skipped = False
        #: ``_ragged_wanted``'s answer, once asked (``_ragged_decided``)
        self._ragged_decision: Optional[bool] = None
        target_worker.init_cuda_graphs = self._skip_target_verify_capture(target_worker.init_cuda_graphs)

    # -- per step ---------------------------------------------------------------------------------------------------
    def build_verify(self, batch, draft_input, draft_tokens: torch.Tensor, conf: torch.Tensor):
        """Called by ``HybridDraftWorker.draft`` with the EAGLE chain; returns the verify input."""
        attn = self.target_worker.model_runner.attn_backend
        if not any(c.__name__ in TREE_MASK_BACKEND_CLASSES for c in type(attn).__mro__):   # ragged: a subclass
            raise NotImplementedError(
                f"HYBRID needs an attention backend whose topk=1 verify applies the tree mask "
                f"({', '.join(TREE_MASK_BACKEND_CLASSES)}), got {type(attn).__name__}; use --attention-backend "
                "flashinfer")
        slots = batch.req_pool_indices
        cur_gen = self._generations(slots)
        width = self.speculative_num_draft_tokens
        bs = draft_tokens.shape[0]
        dw = self._draft_worker
        alt_tokens, alt_conf = self.hybrid_step.step_alternatives(
            slots, cur_gen, None if dw.top_p is None else dw.top_p[:bs], None if dw.top_i is None else dw.top_i[:bs],
            draft_tokens)
        decision = self.hybrid_step.select(draft_input.bonus_tokens, draft_tokens, conf, slots, cur_gen,
                                           batch.seq_lens, width=self._tree_width or width,
                                           lookup_span=self._lookup_span(batch), alt_tokens=alt_tokens,
                                           alt_conf=alt_conf)
        tree, plan = self.tree_broadcast(decision.tree, torch.stack([decision.next_depth, decision.next_width]))
        tree = widen(tree, width)           # ragged verify at a narrower bucket: absent nodes cost nothing
        self._stage_plan(plan)
        self._last_tree = tree
        # Same mask placement rule as SGLang's build_eagle_verify_input: the backend's preallocated buffer (which its
        # verify CUDA graph reads) when it has one and the batch fits, else a fresh tensor.
        bs = batch.seq_lens.shape[0]
        seq_lens_sum = batch.seq_lens_sum if batch.seq_lens_sum is not None else bs * attn.max_context_len
        verify_input = build_verify_input(
            tree, batch.seq_lens, num_steps=self.speculative_num_steps, max_depth=self.hybrid_step.max_depth_at(width),
            mask_mode=TreeMaskMode.FULL_MASK, seq_lens_sum=seq_lens_sum, mask_buf=verify_mask_buffer(attn, bs),
            fused=self.hybrid_step.fused is not None, workspace=self.hybrid_step.workspace)
        if self._ragged:
            verify_input.ragged = self._ragged_layout(attn, tree, batch.seq_lens, seq_lens_sum)
        return verify_input

    def keep_first_alternatives(self, batch, extend_probs: Optional[torch.Tensor], hot_token_id) -> None:
        """``HybridStep.keep_first_alternatives`` for this batch's slots and generations: the draft extend's
        distribution (``extend_probabilities``; None where it did not match the batch) gives the next step's
        position-0 alternatives."""
        slots = batch.req_pool_indices
        self.hybrid_step.keep_first_alternatives(slots, self._generations(slots), extend_probs, hot_token_id)

    def _generations(self, slots: torch.Tensor) -> torch.Tensor:
        """The generations of the requests in ``slots`` this step: the ones the host published with their proposals
        (``NgramFeeder.publish``), else, where it had no view of the batch, the device buffer's."""
        return self._cur_gen if self._cur_gen is not None else self.hybrid_step.buffers.gen[slots]

    def _ragged_layout(self, attn, tree, seq_lens: torch.Tensor, seq_lens_sum: int):
        """The step's ragged layout; its node counts reach the host once per step (they size the forward, see
        ``_ragged_wanted``) and are counted (``HybridCounters.on_ragged``).

        On the Triton backend (``RaggedTritonAttnBackend``) the forward is padded to the token tier of its node count
        (``ragged.tiers``) and the mask built in the buffer the backend plans from, as a captured graph needs. There the
        layout is built before the counts are read (``layout.build_pending_layout``: its shapes come from the padded
        batch) and the read waits until the verify forward (``RaggedVerifyTarget``), after SGLang's verify preparation
        is queued too: the device idles only for what follows the read (``bench.ragged_sync_ops``). On FlashInfer the
        mask is made fresh, sized by the counts (``ragged.flashinfer_plan``), so they are read first; the forward is
        unpadded when eager and padded to its tier under the token-tier graphs (``ragged.flashinfer_backend``, whose
        plan packs the mask into its own buffer). With the fused step (setting ``decision_kernels``) the layout before
        the read is one Triton launch, and so is its compaction (``kernels.ragged_layout``)."""
        width = tree.valid.shape[1]
        buffers = getattr(attn, "ragged_buffers", None)
        if buffers is None or isinstance(buffers, RaggedTierBuffers):
            # FlashInfer: the counts first; the rows unpadded (eager) or at their tier (token-tier graphs)
            return self._read_layout(tree, seq_lens, seq_lens_sum, width,
                                     max_rows=None if buffers is None else buffers.max_rows)
        kw = dict(mask_out=buffers.mask, row_bound=buffers.row_bound, max_rows=buffers.max_rows,
                  on_read=lambda host, rows: self.counters.on_ragged(host, width, rows))
        if self.hybrid_step.fused is not None:
            from sglang_hybrid.kernels.ragged_layout import pending_layout

            return pending_layout(tree.valid, tree.ancestors, seq_lens, seq_lens_sum, slots=buffers.max_bs, **kw)
        counts = ragged_layout.node_counts(tree.valid)
        _, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
        return ragged_layout.build_pending_layout(tree.valid, anc, seq_lens, seq_lens_sum, counts, **kw)

    def _read_layout(self, tree, seq_lens: torch.Tensor, seq_lens_sum: int, width: int, max_rows=None):
        """The step's ragged layout built after its node counts are read (FlashInfer: its mask is sized by them),
        unpadded, or padded to its token tier under ``max_rows`` (``ragged.tiers``)."""
        counts = ragged_layout.node_counts(tree.valid)
        _, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
        host = counts.tolist()
        total, max_nodes = sum(host), max(host)
        rows = total if max_rows is None else tier_rows(total, max_rows)
        self.counters.on_ragged(host, width, rows)
        return ragged_layout.build_ragged_layout(tree.valid, anc, seq_lens, seq_lens_sum, counts, total=total,
                                                 max_nodes=max_nodes, rows=rows)

    def _longest_context(self, batch) -> Optional[int]:
        """A host-known bound on the batch's committed tokens per request (root included), read without waiting for
        the device, so the device prompt lookup reads the batch's real contexts instead of the whole table
        (``HybridStep.lookup_span``).

        SGLang's CPU copy of the sequence lengths when it keeps one (exact: the root sits at ``seq_len``; SGLang
        keeps it when an attention backend reads it, FlashInfer does); else the host's committed lengths
        (``NgramFeeder``, one step late under overlap scheduling) plus what the steps in flight can have committed
        since; else None (the whole table). A bound too low would only cost proposals: a row longer than the span
        gets none (``context_lookup.lookup``)."""
        cpu = getattr(batch, "seq_lens_cpu", None)
        if cpu is not None and 0 < cpu.numel() == batch.seq_lens.shape[0]:
            return int(cpu.max()) + 1                   # a host tensor: no device read
        if self._host_committed is not None:
            return self._host_committed + _PLAN_IN_FLIGHT * (self.hybrid_step.max_depth + 1)
        return None

    def _lookup_span(self, batch) -> Optional[int]:
        """The prompt lookup's span for this batch (``HybridStep.lookup_span`` of ``_longest_context``); reading the
        whole table for want of a host-known bound is a fallback, counted and logged once."""
        longest = self._longest_context(batch)
        if longest is None and self.hybrid_step.context is not None:
            t = self.hybrid_step.context.tokens
            self.fallbacks(
                "lookup_whole_table", int(batch.seq_lens.shape[0]),
                f"no host-known bound on the batch's contexts (no batch.seq_lens_cpu, which the attention backend "
                f"decides, and no host view of the requests): the device prompt lookup reads all {t.shape[1] - 1} "
                "positions of each row instead of the batch's real contexts (about 43 bytes per row and position; "
                "same proposals). Use --attention-backend flashinfer (it keeps seq_lens_cpu) or turn the setting "
                "context_lookup off")
        return self.hybrid_step.lookup_span(longest)

    def _stage_plan(self, plan: torch.Tensor) -> None:
        """Start the copy of the chosen (depth, width) to the host (non-blocking on CUDA); ``_switch_plan`` reads it
        when the step's results are processed. The queue is bounded: entries whose results never came (a batch
        dropped between launch and processing) are discarded oldest first."""
        if not self._plans_switch:
            return
        while len(self._plan_fifo) >= _PLAN_IN_FLIGHT:
            self._plan_fifo.popleft()
        host = self._plan_host[self._plan_next_buf]
        self._plan_next_buf = (self._plan_next_buf + 1) % _PLAN_BUFFERS
        cuda = plan.is_cuda
        host.copy_(plan, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        self._plan_fifo.append((host, event, self._launched))

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        decode = not (extend or batch.forward_mode.is_idle())
        slots, seq_before = self.before_launch(batch) if decode else (None, None)
        out = super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                               pp_proxy_tensors=pp_proxy_tensors)
        if extend and self.feeder is not None and getattr(batch, "reqs", None):
            self._admit(batch)
        if decode and self._last_tree is not None and slots is not None:
            bs = slots.shape[0]
            emitted = out.next_token_ids.view(bs, self.speculative_num_draft_tokens).to(torch.int64)
            self.hybrid_step.after_verify(self._last_tree, slots, seq_before, emitted, out.accept_lens)
        self._last_tree = None
        self._cur_gen = self._host_committed = None
        self.counters.maybe_log()
        return out

    def _admit(self, batch) -> None:
        """After a prefill forward is queued: build the new requests' n-gram automata and copy their contexts into
        the device prompt lookup's table while the device prefills (``NgramFeeder.admit``), so their first decode step
        does neither. Without SGLang's host copy of the slots the contexts wait for that step."""
        slots_cpu = getattr(batch, "req_pool_indices_cpu", None)
        gens = None
        if slots_cpu is not None and len(slots_cpu) == len(batch.reqs):
            gens = self.req_to_token_pool.req_generation[slots_cpu.to(torch.int64)]
            slots_cpu = slots_cpu.tolist()
        else:
            slots_cpu = None
        staged = self.feeder.admit(batch.reqs, gens, slots_cpu)
        if staged is not None and self.hybrid_step.context is not None:
            self.feeder.publish_context(staged, self.hybrid_step.context)

    def before_launch(self, batch) -> tuple:
        """All of HYBRID's host work in a decode step before the step's first launch (the EAGLE draft), so the device
        never waits for HYBRID to start a step: count the launch, keep the slots and the sequence lengths for
        ``after_verify`` (a device copy, queued). The n-gram work waits until the draft is queued (``host_proposals``);
        ``python -m bench.host_path`` times both. Returns ``(slots, seq_lens before the step)``, or Nones without
        an n-gram feeder."""
        self._launched += 1
        if self.feeder is None:
            return None, None
        return batch.req_pool_indices, batch.seq_lens.clone()

    def host_proposals(self, batch) -> None:
        """Host part of a decode step, called by ``HybridDraftWorker.draft`` once the draft is queued: feed the n-gram
        drafter with the batch's requests and publish its proposals (and contexts new to their slots) to the device.
        Without a host view of the requests (``missing_host_view``) their proposals are invalidated for the step, a
        fallback counted and logged once."""
        if self.feeder is None:
            return
        slots = batch.req_pool_indices
        why = missing_host_view(batch, int(slots.shape[0]))
        if why is None:
            reqs, slots_cpu = batch.reqs, batch.req_pool_indices_cpu
            # Generations are a host tensor in SGLang's pool: one vectorised lookup, no device read.
            gens = self.req_to_token_pool.req_generation[slots_cpu.to(torch.int64)]
            staged = self.feeder.stage_batch(reqs, gens, slots_cpu.tolist())
            # the results not yet processed: the committed tokens the host has not seen (alignment absorbs them)
            self.counters.on_lag("proposal", self._launched - 1 - self._processed)
            at = staged["scalars"][:, 1]                    # committed lengths, pinned host memory: no device read
            self._host_committed = int(at.max()) if at.numel() else None
            self._cur_gen = self.feeder.publish(staged, slots, self.hybrid_step.buffers, self.hybrid_step.context)
            self.feeder.drop_absent({r.rid for r in reqs})
            return
        # No host view of this batch's requests: invalidate their proposals (no n-gram candidate this step).
        self.hybrid_step.buffers.length[slots] = 0
        self._cur_gen = self._host_committed = None
        self.fallbacks(
            "no_host_view", int(slots.shape[0]),
            f"{why}: the host n-gram proposals of this step's requests are dropped and contexts new to their slots "
            "are not copied to the device prompt lookup (EAGLE drafts continue; lossless). HYBRID expects SGLang's "
            "ScheduleBatch, which has both; a scheduler path that passes another batch object is not supported")

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        return run_eagle_verify(
            batch, pp_proxy_tensors=pp_proxy_tensors, target_worker=self._verify_target or self.target_worker,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            plan_stream=self.plan_stream, plan_stream_ctx=self.plan_stream_ctx, topk=_TREE_VERIFY_TOPK,
            num_draft_tokens=self.speculative_num_draft_tokens, device=self.device, metadata_ready_pre_pad=False,
            finalize_tree_path=True, grammar_barrier=grammar_barrier)

    # -- host hooks -------------------------------------------------------------------------------------------------
    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        super().note_request_finished(rid=rid, natural_stop=natural_stop)
        if self.feeder is not None:
            self.feeder.finish(rid, natural_stop)
