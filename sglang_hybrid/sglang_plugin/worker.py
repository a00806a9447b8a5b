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
Under DP attention both are fixed (ranks must agree).

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

from sglang_hybrid.cost import ContextCostModel

from . import alternatives, memory_budget, runtime_states, spec_algo, startup_costs
from .config import ENV_PREFIX, load_settings, resolved_ngram_bias_eta
from .hybrid_step import HybridStep
from .metrics import HybridCounters
from .ngram_host import NgramFeeder
from .prometheus import server_exporter
from .ragged import layout as ragged_layout
from .ragged.flashinfer_backend import RaggedTierBuffers
from .ragged.target import RaggedVerifyTarget
from .ragged.tiers import tier_rows
from .server_args import TREE_MASK_BACKEND_CLASSES
from .tp_sync import TreeBroadcast
from .verify_input import TreeMaskMode, build_verify_input, verify_nodes
from sglang_hybrid.widths import MIN_CUT_SAVING, measured_table_buckets, paying_extras, start_width, widen

logger = logging.getLogger(__name__)

#: ``run_eagle_verify`` compacts the accepted path to the front of each request's block only for ``topk > 1``; any
#: value above one selects that branch (our trees are irregular, the value is not used as a branching factor there).
_TREE_VERIFY_TOPK = 2
_construct_lock = threading.Lock()
#: decode results in flight between launch and host processing (overlap scheduling keeps one) plus margin; the
#: pinned buffers cycle, so a buffer is reused only after its entry left the queue
_PLAN_IN_FLIGHT = 3
_PLAN_BUFFERS = _PLAN_IN_FLIGHT + 1
#: SGLang attention backends that plan a ragged verify (docs/sglang.md, "Ragged verify"): Triton through a subclass
#: (``ragged.triton_backend``), FlashInfer from the verify input as it is when eager (``ragged.flashinfer_plan``) and
#: through a subclass under the token-tier graphs (``ragged.flashinfer_backend``)
RAGGED_BACKENDS = TREE_MASK_BACKEND_CLASSES


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


class HybridWorkerV2(EAGLEWorkerV2):
    """SGLang V2 speculative worker for ``--speculative-algorithm HYBRID``."""

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

    # -- setup ------------------------------------------------------------------------------------------------------
    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(memory_pool_config=memory_pool_config, req_to_token_pool=req_to_token_pool,
                                  token_to_kv_pool_allocator=token_to_kv_pool_allocator)
        pool_size = int(self.req_to_token_pool.req_to_token.shape[0])
        self.hybrid_step = HybridStep(self.settings, num_steps=self.speculative_num_steps, pool_size=pool_size,
                                      device=self.device, counters=self.counters, fixed_shapes=self._fixed_shapes,
                                      max_context_len=int(self.req_to_token_pool.req_to_token.shape[1]))
        if self.hybrid_step.n_nodes + 1 != self.speculative_num_draft_tokens:
            raise RuntimeError(
                f"HYBRID settings changed between argument resolution and worker start: verify width "
                f"{self.speculative_num_draft_tokens} vs n_nodes + 1 = {self.hybrid_step.n_nodes + 1}")
        if self.hybrid_step.context is not None:
            t = self.hybrid_step.context.tokens
            logger.info("HYBRID: device prompt lookup table %d slots x %d tokens, int32, %.1f MiB (setting "
                        "context_lookup)", t.shape[0], t.shape[1] - 1, t.numel() * t.element_size() / 2**20)
        from sglang_hybrid.ngram import NgramDrafter

        width = self.hybrid_step.proposal_width
        drafter = NgramDrafter(max_draft=width, **self.settings.ngram_options)
        self.feeder = NgramFeeder(drafter, width, self.device, pool_size, self.settings.ngram_donate,
                                  context=self.hybrid_step.context is not None)
        from sglang.srt.layers.dp_attention import get_dp_tp_group

        group = get_dp_tp_group()
        self.tree_broadcast = TreeBroadcast(group)
        if getattr(group, "rank_in_group", 0) == 0:
            self.counters.snapshot_path = self.settings.counters_file
            self.counters.exporter = server_exporter(self.settings.log_interval)

    def _skip_target_verify_capture(self, init_cuda_graphs):
        """SGLang's ``TpModelWorker.init_cuda_graphs`` of the target, without its verify graphs when verify runs
        ragged (``_ragged_wanted``). SGLang captures the target's graphs before the draft's
        (``Scheduler.init_all_cuda_graphs``), with the attention backends already built, so the choice can be made
        here: SGLang's set, captured at one width per batch size, cannot take a ragged batch and would be dropped
        unused (``_drop_target_verify_graphs``) after its buffers (``max_bs x W x context`` entries and, on
        FlashInfer, a wrapper set per batch size) and its capture time were spent. The verify then runs in HYBRID's
        token-tier graphs (``_enable_ragged_graphs``, Triton) or eager. SGLang's own switch does it
        (``capture_decode_cuda_graph=False``: its eager runner stands in, as for a draft worker); its prefill graphs
        and everything else stay."""

        def init(capture_decode_cuda_graph: bool = True):
            if capture_decode_cuda_graph and self._ragged_decided():
                capture_decode_cuda_graph = False
                self._target_verify_skipped = True
                logger.info("HYBRID: SGLang's target verify CUDA graphs not captured: verify runs ragged (setting "
                            "ragged_verify=%s)", self.settings.ragged_verify)
            return init_cuda_graphs(capture_decode_cuda_graph=capture_decode_cuda_graph)

        return init

    def _ragged_decided(self) -> bool:
        """``_ragged_wanted``, decided (and logged) once: it is asked at the target's graph capture and again here."""
        if self._ragged_decision is None:
            self._ragged_decision = self._ragged_wanted()
        return self._ragged_decision

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        if spec_algo.EAGLE3_PROBE_FAILURES:
            self.counters.on_fallback("eagle3_probe", len(spec_algo.EAGLE3_PROBE_FAILURES))   # logged where it failed
        self._measure_cost_table()
        self._ragged = self._ragged_decided()
        self._resolve_ngram_bias_eta()
        self._build_runtime_states()
        if self._ragged:
            self._enable_ragged()
        else:
            self._verify_target = self.target_worker
            runner = self.target_worker.model_runner
            captured = runner.decode_cuda_graph_runner not in (None, getattr(runner, "eager_runner", None))
            self.counters.target_verify_graphs = "captured" if captured else "none"
        # every Triton kernel variant the step can launch, compiled now that depths, widths, tables and the verify
        # layout are final (after _enable_ragged, which gives the backends their ragged buffers); one log line
        from sglang_hybrid.kernels import warmup as kernel_warmup

        runner = self.target_worker.model_runner
        kernel_warmup.warm_up_step(self.hybrid_step, max_batch=int(runner.max_running_requests), ragged=self._ragged,
                                   attn_backend=runner.attn_backend)

    def _resolve_ngram_bias_eta(self) -> None:
        """``ngram_bias_eta = "auto"``: the n-gram offset learned where verify runs ragged, off where it runs padded
        (``config.resolved_ngram_bias_eta``), now that the layout is decided; before the memory check counts its
        buffers (``_build_runtime_states``)."""
        if self.hybrid_step is None:
            return
        if self.settings.ngram_bias_eta == "auto":
            eta = resolved_ngram_bias_eta("auto", self._ragged)
            self.hybrid_step.set_ngram_bias_eta(eta)
            logger.info("HYBRID: n-gram online offset %s (setting ngram_bias_eta=auto, %s verify)",
                        "off" if eta is None else f"learned at eta={eta:g}", "ragged" if self._ragged else "padded")
        self.counters.ngram_offset_eta = self.hybrid_step.ngram_bias_eta

    def _measure_cost_table(self) -> None:
        """Without a ``cost_table``, time the target verify now and price with that table; without a
        ``draft_cost_table``, where the depths are adaptive, time one EAGLE draft forward and price the depths with
        that (setting ``measure_cost_table``; ``startup_costs``). Before the runtime states are built, so the probes'
        buffers are freed before the states take their memory."""
        step, settings = self.hybrid_step, self.settings
        if step is None:
            return
        if self._fixed_shapes:
            if settings.measures_cost_table(step.device.type):
                logger.info("HYBRID: cost tables not measured (DP attention fixes the verify width and the depth; no "
                            "price)")
            return
        runner = self.target_worker.model_runner
        sizes = dict(max_batch=int(runner.max_running_requests), context_len=int(runner.model_config.context_len),
                     budget=startup_costs.StartBudget(agree=self._rank0_decides))
        if settings.measures_cost_table(step.device.type):
            table = self._measured("target verify's cost table", f"{ENV_PREFIX}COST_TABLE",
                                   lambda: startup_costs.measure_verify_costs(
                                       runner, width=self.speculative_num_draft_tokens, **sizes))
            step.set_cost(table, "measured")
            self._log_measured("cost table", table)
            self._rounds_skipped("target verify's cost table", table)
        if len(step.depths) > 1 and step.draft_cost is None:
            table = self._measured("draft forward's cost table", f"{ENV_PREFIX}DRAFT_COST_TABLE",
                                   lambda: startup_costs.measure_draft_costs(self._draft_worker, **sizes))
            step.set_draft_cost(table, "measured")
            self._log_measured(f"draft cost table (EAGLE depths {list(step.depths)})", table)
            self._rounds_skipped("draft forward's cost table", table)

    def _rank0_decides(self, local: bool) -> bool:
        """Rank 0's ``local`` on every rank of the tree broadcast's group (``TreeBroadcast``, built with the step in
        ``alloc_memory_pool``): the start-up probes' rounds are decided by each rank's clock, and every rank must run
        the same forwards, whose collectives meet. One broadcast of one flag per decision, at start only; ``local``
        for a group of one."""
        group = self.tree_broadcast.group
        if group is None:
            return local
        flag = torch.tensor([int(local)], dtype=torch.int64, device=self.device)
        group.broadcast(flag, src=0)
        return bool(flag.item())

    @staticmethod
    def _measured(what: str, setting: str, measure):
        """``measure()``, any failure stopping the start with the settings that avoid it."""
        try:
            return measure()
        except Exception as e:  # noqa: BLE001 -- any failure stops the start, with the settings that avoid it
            raise RuntimeError(
                f"HYBRID: measuring the {what} at start failed ({type(e).__name__}: {e}); give a table instead "
                f"({setting}, see docs/sglang.md 'Fitting for a deployment') or set "
                f"{ENV_PREFIX}MEASURE_COST_TABLE=off (no price: every step verifies the full tree at one depth)") from e

    def _rounds_skipped(self, what: str, table) -> None:
        """Count and name the probe rounds the start's time budget did not afford (``startup_costs.StartBudget``)."""
        meta = table.meta
        skipped = startup_costs.ROUNDS - int(meta["rounds"])
        if skipped > 0:
            self.fallbacks(
                "probe_rounds_skipped", skipped,
                f"the {what} was measured in {meta['rounds']} of {startup_costs.ROUNDS} probe rounds: the start's time "
                f"budget ({meta['start_budget_s']:.2f} s, a share of the start so far) did not afford more, so each "
                "size is one timing instead of the minimum of several (a noisier price; on a GPU the budget affords "
                "every round). For a steadier price give a profiled table (setting cost_table / draft_cost_table, "
                "docs/sglang.md 'Fitting for a deployment')")

    @staticmethod
    def _log_measured(what: str, table) -> None:
        at = ([(table.short_context, table.short_seconds), (table.long_context, table.seconds)]
              if isinstance(table, ContextCostModel) else [(table.meta["context_tokens"][-1], table.seconds)])
        logger.info("HYBRID: %s measured at start in %.1f s (setting measure_cost_table; %s)%s: %s", what,
                    table.meta["seconds_spent"], table.meta["forward"],
                    ", priced each step at its batch's mean context" if len(at) > 1 else "",
                    "; ".join(f"at {c} context tokens per request " +
                              ", ".join(f"T({n})={1e3 * t:.2f} ms" for n, t in zip(table.sizes, secs))
                              for c, secs in at))

    def _ragged_wanted(self) -> bool:
        """Whether verify runs ragged (setting ``ragged_verify``; docs/sglang.md, "Ragged verify").

        It runs on SGLang's Triton or FlashInfer backend: on Triton in HYBRID's own token-tier graphs
        (``_enable_ragged_graphs``), beside SGLang's draft graphs (SGLang's target verify graphs, captured at one
        width, are not captured under ragged verify, ``_skip_target_verify_capture``, and dropped if SGLang captured
        them anyway, ``_drop_target_verify_graphs``). ``auto`` turns it on only on SGLang's CPU engine, where
        reading the step's node counts to the host costs nothing; on a GPU that read stalls the host until the draft
        and the decision finish, and the path has not run on a GPU yet, so there it takes ``on`` (the GPU checks in
        ``bench/sglang_gpu.sh`` do). ``on`` where it cannot run stops the start with the fix."""
        from sglang.srt.utils import is_cpu

        mode = self.settings.ragged_verify
        runner = self.target_worker.model_runner
        backend = type(runner.attn_backend).__name__
        cannot = None
        if backend not in RAGGED_BACKENDS:
            cannot = (f"ragged verify plans through SGLang's {' or '.join(RAGGED_BACKENDS)}, the target runs "
                      f"{backend}")
        if mode == "on" and cannot is not None:
            raise RuntimeError(f"HYBRID setting ragged_verify=on: {cannot}. Run with --attention-backend triton "
                               "(or flashinfer), or set SGLANG_HYBRID_RAGGED_VERIFY=auto (padded verify here)")
        why_padded = cannot or (None if is_cpu() or mode == "on" else
                                "off the CPU engine ragged verify reads each step's node counts to the host, a sync "
                                "(ragged_verify=on runs it anyway)")
        if mode == "off" or why_padded is not None:
            logger.info("HYBRID: padded verify (setting ragged_verify=%s%s)", mode,
                        f": {why_padded}" if why_padded else "")
            return False
        return True

    def _enable_ragged(self) -> None:
        """Every target backend (one per runtime state) plans ragged batches, and verify runs through
        ``RaggedVerifyTarget``: SGLang's Triton backends become ``RaggedTritonAttnBackend``; SGLang's FlashInfer
        backend plans an eager forward from the verify input as it is (``ragged.flashinfer_plan``) and, under the
        token-tier graphs, becomes ``RaggedFlashInferAttnBackend`` (``ragged.flashinfer_backend``)."""
        from .ragged import flashinfer_backend, graph_capture, triton_backend

        runner = self.target_worker.model_runner
        kind, why = graph_capture.tier_graph_kind(runner, memory_budget.tp_size_of(self), ragged=True,
                                                  ragged_graphs=self.settings.ragged_graphs)
        backends = [runner.attn_backend]
        backends += [s.target_attn_backend for s in self.runtime_states.values()]
        max_bs = int(runner.max_running_requests)
        for backend in backends:
            if type(backend).__name__ in graph_capture.FLASHINFER_BACKENDS:
                if kind is not None:
                    flashinfer_backend.enable(backend, max_bs, self.speculative_num_draft_tokens)
                continue
            triton_backend.enable(backend, max_bs, self.speculative_num_draft_tokens)
        self._verify_target = RaggedVerifyTarget(self.target_worker)
        dropped = self._drop_target_verify_graphs()
        self.counters.target_verify_graphs = ("not captured" if self._target_verify_skipped else
                                              "dropped" if dropped else "none")
        graphs = self._enable_ragged_graphs(kind, why)
        skipped = "; SGLang's target verify CUDA graphs not captured" if self._target_verify_skipped else ""
        logger.info("HYBRID: ragged verify (each request verifies its own nodes; setting ragged_verify=%s), %s%s",
                    self.settings.ragged_verify, graphs,
                    "; SGLang's target verify CUDA graphs dropped (captured at one width)" if dropped else skipped)

    def _drop_target_verify_graphs(self) -> bool:
        """Drop SGLang's target verify CUDA graphs, if it captured any: they are captured per batch size at the full
        width and would take the compacted ragged batch (``eagle_prepare_for_verify`` and ``ModelRunner._forward_raw``
        ask the target's ``decode_cuda_graph_runner`` first). Without them SGLang hands the verify forward to its eager
        runner, which ``_enable_ragged_graphs`` routes to HYBRID's token-tier graphs on Triton (else it runs eager);
        SGLang's draft and draft-extend graphs stay. Every runtime state's reference goes too, since
        ``apply_runtime_state`` restores it. They have already timed the verify table at start
        (``_measure_cost_table``). Returns whether there were any."""
        runner = self.target_worker.model_runner
        graphs = runner.decode_cuda_graph_runner
        if graphs is None or graphs is getattr(runner, "eager_runner", None):
            return False
        runner.decode_cuda_graph_runner = None
        for state in self.runtime_states.values():
            state.target_graph_runner = None
        return True

    def _enable_ragged_graphs(self, kind, why: str) -> str:
        """On the Triton and FlashInfer backends the ragged verify forward runs as one graph per token tier
        (``ragged.graph_runner``), captured the first time a step needs its tier: CUDA graphs on a GPU at TP 1; on
        the CPU engine (Triton) the same runner with a trace-checked eager replay
        (``graph_capture.TracedEagerCapture``), so that the live suite runs the graph path. Elsewhere (CUDA at TP > 1,
        whose collectives SGLang registers for capture inside its own runner; a FlashInfer backend that cannot plan
        tiers) the forward stays eager, and so it does with the setting ``ragged_graphs`` false. ``kind`` and ``why``:
        ``graph_capture.tier_graph_kind``'s answer. Returns how it runs, for the start-up log."""
        from .ragged import graph_capture, graph_runner

        runner = self.target_worker.model_runner
        if kind is None:
            return f"eager verify forward ({why})"
        if kind == "traced":
            capture, how = graph_capture.TracedEagerCapture(), "token-tier graphs (CPU: trace-checked eager replays)"
        else:
            capture, how = graph_capture.CudaGraphCapture(), "token-tier CUDA graphs"
        graphs = graph_runner.RaggedVerifyGraphRunner(runner, runner.attn_backend, capture,
                                                      on_step=self.counters.on_ragged_graph)
        runner.eager_runner = graph_runner.RaggedVerifyEagerRunner(runner.eager_runner, graphs)
        return how

    def _build_runtime_states(self) -> None:
        """One ``SpecRuntimeState`` per (EAGLE depth, verify width) pair, assembled from a draft part per depth and a
        verify part per width (``runtime_states``: SGLang's own backends and graph runners, each built once), in the
        contexts SGLang's adaptive speculation builds them in. Under ragged verify one verify part, at the full
        width: padding costs nothing there, and the step's width bucket only caps the nodes each request verifies
        (``build_verify``). The default launch on a GPU (a table measured at start, no ``verify_widths``) first keeps
        only the extra widths whose verify parts fit the free memory (``memory_budget.fit_widths_at_start``)."""
        step = self.hybrid_step
        if self._draft_worker is None or step is None:
            return
        if (not self._ragged and not self._fixed_shapes
                and self.settings.fits_widths_to_memory(torch.device(self.device).type)):
            # the default launch on a GPU: the extra width buckets that pay at the running limit by the table just
            # measured, and only while their states fit the free memory
            steps, full = self.speculative_num_steps, self.speculative_num_draft_tokens
            required, extras = measured_table_buckets(steps, full)
            batch = int(self._target_worker.model_runner.max_running_requests)
            paying = paying_extras(steps, full, extras, step.cost_model.step_time_at, batch)
            unpaid = [w for w in extras if w not in paying]
            if unpaid:
                self.fallbacks(
                    "widths_unpaid", len(unpaid),
                    f"extra verify widths {unpaid} left out at start: at the running limit ({batch} requests) the "
                    f"full tree's verify takes less than {MIN_CUT_SAVING}x theirs by the table measured at start, so "
                    "cutting trees to them saves too little to pay a runtime state (widths.paying_extras); kept: "
                    f"{sorted({*required, *paying})}")
            extras = paying
            step.restrict_widths(memory_budget.fit_widths_at_start(self, step.depths, required, extras))
        self._plans_switch = len(step.widths) * len(step.depths) > 1
        widths = (self.speculative_num_draft_tokens,) if self._ragged else step.widths
        memory_budget.check_start(self, [(d, w) for d in step.depths for w in widths])   # logs; refuses if too big
        if not self._plans_switch:
            return
        dw = self._draft_worker
        with (_eagle_v2.draft_tp_context(dw.parallel_layout), _eagle_v2.speculative_moe_backend_context(),
              _eagle_v2.speculative_moe_a2a_backend_context()):
            self.runtime_states = runtime_states.build_states(self, step.depths, widths)
        self.counters.runtime_parts = runtime_states.parts_built(self.runtime_states)
        logger.info("HYBRID: runtime states (EAGLE depth, verify width) %s",
                    ", ".join(f"({d}, {w})" for d, w in sorted(self.runtime_states)))
        # Until the first decision reaches the host (one step late, two with overlap scheduling) verify at plain
        # EAGLE's shape rather than the widest tree (widths.start_width).
        self._apply_plan(self.speculative_num_steps, start_width(step.widths, self.speculative_num_steps))

    def _switch_plan(self) -> None:
        """Draft and verify later steps at the (depth, width) the device chose for the step whose results just reached
        the host.

        Called once per processed decode result, in launch order, so the oldest queued plan belongs to that step.
        Its copy was enqueued before that step's verify, whose outputs are already on the host: the event has
        completed and ``synchronize`` returns at once. Every TP rank sees the same sequence of steps and the same
        broadcast plan, so all switch alike."""
        if not self._plans_switch or not self._plan_fifo:
            return
        host, event, launched_at = self._plan_fifo.popleft()
        if event is not None:
            event.synchronize()
        self.counters.on_lag("plan", self._launched - launched_at)
        self._apply_plan(*(int(v) for v in host))

    def _apply_plan(self, depth: int, width: int) -> None:
        """Switch to the runtime state of (``depth``, ``width``) unless it is the current one (under ragged verify the
        depth's, with ``width`` kept as the next trees' width). Through ``runtime_states.apply_state``: each switch
        leaves one entry in SGLang's runtime-context overrides log (the state in force), not one per switch."""
        key = (depth, width)
        if self._ragged:
            self._tree_width, key = width, (depth, self._full_width)
        current = (self.speculative_num_steps, self.speculative_num_draft_tokens)
        state = self.runtime_states.get(key)
        if state is None and self.runtime_states and key != current:
            self.fallbacks("plan_missing", 1,
                           f"the step chose EAGLE depth {depth} and verify width {width}, for which no runtime state "
                           f"was built (built: {sorted(self.runtime_states)}); kept depth {current[0]} and width "
                           f"{current[1]}. The decision's depths and widths (settings) and the states built at start "
                           "(_build_runtime_states) disagree")
        if state is None or key == current:
            return
        # SGLang's apply_runtime_state swaps every depth- and width-dependent resource, but returns early when the step
        # count is unchanged (it was written for step switching); HYBRID also switches width at a fixed step count, so
        # the guard is lifted for the call (the method sets the step count from the state).
        steps = self.speculative_num_steps
        self.speculative_num_steps = -1
        try:
            self._switch_log_entries = runtime_states.apply_state(self.apply_runtime_state, state,
                                                                  self._switch_log_entries)
        except BaseException:
            self.speculative_num_steps = steps
            raise

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        self._processed += 1
        self._switch_plan()

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
