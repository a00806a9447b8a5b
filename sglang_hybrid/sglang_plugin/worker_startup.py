"""Start-up and planning of ``HybridWorkerV2`` (``worker``): what runs once, after SGLang built the worker, and the
host's switch between the runtime states the device plans.

Start-up, in SGLang's order: ``alloc_memory_pool`` builds the decision (``HybridStep``), the n-gram feeder and the
tree broadcast; the target's graph capture skips SGLang's verify graphs when verify will run ragged
(``_skip_target_verify_capture``); ``init_cuda_graphs`` then measures the cost tables (``_measure_cost_table``),
decides the verify layout (``_ragged_wanted``), resolves the n-gram offset, keeps the widths that pay and fit the
memory and builds one SGLang runtime state per (EAGLE depth, verify width) pair (``_build_runtime_states``), turns
ragged verify on where chosen (``_enable_ragged``), and compiles every Triton kernel variant the step can launch.

Planning: every step the device chooses the (depth, width) of a later step and copies it to a pinned host buffer
(the per-step path's ``_stage_plan``); once that step's results reach the host (``on_verify_complete_cpu``) the
host applies it (``_switch_plan``, ``_apply_plan``): choosing graphs never waits for the device.

Kept apart from the per-step path so that each reads as one job; the class is a mixin whose methods use the state
``HybridWorkerV2.__init__`` sets.
"""
from __future__ import annotations

import logging

import torch

import sglang.srt.speculative.eagle_worker_v2 as _eagle_v2

from sglang_hybrid.cost import ContextCostModel

from . import memory_budget, runtime_states, spec_algo, startup_costs
from .config import ENV_PREFIX, resolved_ngram_bias_eta
from .hybrid_step import HybridStep
from .ngram_host import NgramFeeder
from .prometheus import server_exporter
from .ragged.target import RaggedVerifyTarget
from .server_args import TREE_MASK_BACKEND_CLASSES
from .tp_sync import TreeBroadcast
from sglang_hybrid.widths import MIN_CUT_SAVING, measured_table_buckets, paying_extras, start_width

logger = logging.getLogger(__name__)

#: SGLang attention backends that plan a ragged verify (docs/sglang.md, "Ragged verify"): Triton through a subclass
#: (``ragged.triton_backend``), FlashInfer from the verify input as it is when eager (``ragged.flashinfer_plan``) and
#: through a subclass under the token-tier graphs (``ragged.flashinfer_backend``)
RAGGED_BACKENDS = TREE_MASK_BACKEND_CLASSES


class WorkerStartup:
    """``HybridWorkerV2``'s start-up (SGLang's ``alloc_memory_pool`` and ``init_cuda_graphs``, overridden) and its
    switch between runtime states as the device plans them (``on_verify_complete_cpu``, overridden)."""

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
