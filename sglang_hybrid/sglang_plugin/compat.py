"""One place for SGLang's internals: every SGLang symbol HYBRID depends on in a way that breaks silently.

Why: SGLang's internals are not a stable API. The plugin subclasses SGLang's speculative worker, attention backends
and speculative-algorithm class, redefines their methods, wraps and swaps objects SGLang built, and transcribes some
of SGLang's function bodies. A release that renames a method, adds a parameter, or changes a body the plugin copied
does not fail at import: an override is simply no longer called, a wrapper wraps nothing, a transcription drifts from
the code it copied. This module is the checklist to re-read on an SGLang upgrade, and ``check()`` the part of it a
machine can do: every target still resolves, with the parameter names the plugin was written against.

Kinds (``Internal.kind``):

* ``override``: a method of an SGLang class redefined in a plugin subclass (most call the base method);
* ``wrap``: an SGLang callable or object the plugin puts behaviour around (an instance method replaced by a wrapper,
  a proxy standing in for an SGLang object, a call made under a changed state);
* ``subclass``: an SGLang class the plugin extends;
* ``swap``: SGLang state the plugin replaces or edits: a module global, an object's ``__class__``, a private list;
* ``mirror``: SGLang code the plugin copies or transcribes, or a call it makes exactly as a transcribed SGLang body
  makes it; the note says what differs.

``params`` are the target's parameter names in SGLang ``SGLANG_VERSION`` (``self`` left out), checked by ``check()``;
None where a signature check makes no sense (a class whose constructor the plugin never calls, a module global, a
property). For a mirror they are the mirrored function's: a changed signature says its body changed too. What
``check()`` cannot see -- a body's behaviour, an instance attribute -- is in the notes: read them on an upgrade.

``python -m sglang_hybrid.sglang_plugin.compat`` prints the problems (none: exit 0). Importing this module imports
no SGLang; ``resolve`` and ``check`` do.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Iterable, Optional

#: the SGLang release the table was written against (``config.SUPPORTED_SGLANG`` is the one ``register()`` accepts)
SGLANG_VERSION = "0.5.23"
KINDS = ("override", "wrap", "subclass", "swap", "mirror")


@dataclass(frozen=True)
class Internal:
    """One SGLang internal the plugin depends on (see the module docstring)."""

    kind: str                          # one of KINDS
    target: str                        # dotted path: module, then attributes
    params: Optional[tuple]            # parameter names the plugin expects (no ``self``), or None: not checked
    used_by: str                       # dotted path of the plugin object that depends on it
    note: str                          # what the plugin relies on, or what its copy changes


_V2 = "sglang.srt.speculative.eagle_worker_v2"     # only to keep the table's lines short

INTERNALS: tuple = (
    # -- the speculative-algorithm class (spec_algo, server_args) ---------------------------------------------------
    Internal("subclass", "sglang.srt.speculative.spec_registry.CustomSpecAlgo", None,
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo",
             "the spec_class registered for HYBRID; SGLang dispatches on its is_eagle()/is_eagle3() answers"),
    Internal("override", "sglang.srt.speculative.spec_registry.CustomSpecAlgo.is_eagle", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.is_eagle",
             "True: HYBRID rides SGLang's EAGLE branches (verify graphs, KV reservation, FutureMap relay, draft "
             "extend)"),
    Internal("override", "sglang.srt.speculative.spec_registry.CustomSpecAlgo.is_eagle3", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.is_eagle3",
             "follows the draft's architecture (environment set by the launcher, else runtime_context.get_spec())"),
    Internal("override", "sglang.srt.speculative.spec_registry.CustomSpecAlgo.supports_grammar_overlap", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.supports_grammar_overlap",
             "False: grammar batches stay on the synchronous path"),
    Internal("override", "sglang.srt.speculative.spec_registry.CustomSpecAlgo.handle_server_args", ("server_args",),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.handle_server_args",
             "called during ServerArgs.resolve_once with a view that records attribute writes as declarations"),
    Internal("mirror", "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.carries_draft_hidden_states", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.carries_draft_hidden_states",
             "SpeculativeAlgorithm's, which CustomSpecAlgo lacks: is_eagle(), i.e. True"),
    Internal("mirror", "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_future_map",
             ("device", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay"),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.create_future_map",
             "copied body: FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)"),
    Internal("mirror", "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.need_topk", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.need_topk",
             "True, as for EAGLE: the FutureMap relays topk_p (step-0 draft confidence) and topk_index"),
    Internal("mirror", "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.get_platform_worker_cls", (),
             "sglang_hybrid.sglang_plugin.spec_algo.HybridSpecAlgo.get_platform_worker_cls",
             "None on every platform: no out-of-tree replacement worker (SGLang asks current_platform)"),
    Internal("mirror", "sglang.srt.arg_groups.speculative_hook._handle_eagle_family", ("server_args",),
             "sglang_hybrid.sglang_plugin.server_args.handle_server_args",
             "sets steps, topk, draft tokens and max_running_requests as it does for the literal EAGLE names; "
             "user_value reads the resolution pipeline's private server_args._raw_input"),

    # -- the draft worker (worker.HybridDraftWorker) -----------------------------------------------------------------
    Internal("subclass", f"{_V2}.EagleDraftWorker", None, "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker",
             "records per-step draft confidence and alternatives; hands the chain to HybridWorkerV2.build_verify"),
    Internal("swap", f"{_V2}.EagleDraftWorker", None, "sglang_hybrid.sglang_plugin.worker._draft_worker_class",
             "EAGLEWorkerV2.__init__ builds its draft worker by this module-level name: swapped for "
             "HybridDraftWorker around the constructor, under a lock"),
    Internal("override", f"{_V2}.EagleDraftWorker.__init__", ("server_args", "gpu_id", "nccl_port", "target_worker"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker.__init__",
             "passes its arguments through, then reads _topk1_parents_prealloc (rows: max batch), "
             "speculative_num_steps, device, hot_token_id and draft_runner"),
    Internal("override", f"{_V2}.EagleDraftWorker._rebuild_topk1_chain_buffers", (),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker._rebuild_topk1_chain_buffers",
             "defined on EagleDraftWorkerBase; its assert num_draft_tokens == num_steps + 1 is met by setting the "
             "draft token count to steps + 1 for the call"),
    Internal("override", f"{_V2}.EagleDraftWorker.draft_forward", ("forward_batch",),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker.draft_forward",
             "column 0 of step_conf from spec_info.topk_p; the base body must call draft_runner.forward once per "
             "step after the first (the wrapper below fills the next columns)"),
    Internal("override", f"{_V2}.EagleDraftWorker._draft_extend_for_decode", ("batch", "batch_result", "kv_loc_plan"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker._draft_extend_for_decode",
             "captures the extend's logits output (graph runner execute or draft_runner.forward); relies on the base "
             "selecting its rows in place and setting batch_result.next_draft_input.topk_p/topk_index"),
    Internal("mirror", f"{_V2}.EagleDraftWorker.draft", ("batch", "with_topology"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker.draft",
             "transcribed; differs: verify input from HybridWorkerV2.build_verify (not build_eagle_verify_input), "
             "idle ranks get create_idle_input, no canary-manager context, no DSA top-k seeding, no PP topology"),
    Internal("mirror", "sglang.srt.speculative.eagle_worker_common.prepare_for_draft",
             ("draft_input", "req_to_token_pool", "batch", "cuda_graph_runner", "draft_model_runner", "topk",
              "num_steps", "target_translator", "num_draft_tokens"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker.draft",
             "called exactly as EagleDraftWorker.draft calls it; its KV window plan goes on the verify input"),
    Internal("wrap", "sglang.srt.model_executor.model_runner.ModelRunner.forward",
             ("forward_batch", "skip_attn_backend_init", "pp_proxy_tensors", "reinit_attn_backend",
              "split_forward_count"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker.__init__",
             "draft_runner.forward replaced on the instance; the wrapper reads .logits_output.next_token_logits"),
    Internal("wrap", "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner"
             ".execute", ("forward_batch", "select_index"),
             "sglang_hybrid.sglang_plugin.worker.HybridDraftWorker._draft_extend_for_decode",
             "replaced on the instance for one call; returns the extend's logits output, rows already selected"),

    # -- the speculative worker (worker.HybridWorkerV2) -------------------------------------------------------------
    Internal("subclass", f"{_V2}.EAGLEWorkerV2", None, "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2",
             "the worker registered for HYBRID (sglang_plugin._register_hybrid)"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.__init__", ("server_args", "gpu_id", "nccl_port", "target_worker"),
             "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2.__init__",
             "reads _draft_worker, device, speculative_num_draft_tokens after the base constructor"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.alloc_memory_pool",
             ("memory_pool_config", "req_to_token_pool", "token_to_kv_pool_allocator"),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup.alloc_memory_pool",
             "defined on BaseSpecWorker; sizes HYBRID's slot buffers from req_to_token_pool.req_to_token's shape"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.init_cuda_graphs", (),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup.init_cuda_graphs",
             "HYBRID's runtime states after SGLang's graphs; SGLang's adaptive controller stays off "
             "(--speculative-adaptive is refused)"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.on_verify_complete_cpu", ("num_correct_drafts_per_req", "batch_size"),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup.on_verify_complete_cpu",
             "SGLang's host hook for adaptive speculation: once per processed decode result, in launch order"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.forward_batch_generation",
             ("batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"),
             "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2.forward_batch_generation",
             "decode = the base's non-extend branch; reads batch.reqs, req_pool_indices_cpu, seq_lens_cpu, "
             "req_to_token_pool.req_generation and the result's next_token_ids [bs x W] and accept_lens"),
    Internal("mirror", f"{_V2}.EAGLEWorkerV2.verify", ("batch", "pp_proxy_tensors", "grammar_barrier"),
             "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2.verify",
             "transcribed (one run_eagle_verify call); differs: target_worker may be the ragged proxy, and topk=2"),
    Internal("mirror", "sglang.srt.speculative.eagle_worker_common.run_eagle_verify",
             ("batch", "target_worker", "req_to_token_pool", "token_to_kv_pool_allocator", "plan_stream",
              "plan_stream_ctx", "topk", "num_draft_tokens", "device", "metadata_ready_pre_pad", "finalize_tree_path",
              "pp_proxy_tensors", "grammar_barrier", "uno_target_max_top_k"),
             "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2.verify",
             "called as EAGLEWorkerV2.verify calls it; relies on topk > 1 compacting an accepted path that is not a "
             "front prefix, and on target_worker.forward_batch_generation being called by keyword"),
    Internal("override", f"{_V2}.EAGLEWorkerV2.note_request_finished", ("rid", "natural_stop"),
             "sglang_hybrid.sglang_plugin.worker.HybridWorkerV2.note_request_finished",
             "defined on BaseSpecWorker; the n-gram feeder forgets the request"),
    Internal("mirror", "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input",
             ("batch", "draft_input", "parent_list", "top_scores_index", "draft_tokens", "draft_probs",
              "target_worker", "topk", "num_steps", "num_draft_tokens", "tree_mask_mode", "device"),
             "sglang_hybrid.sglang_plugin.worker.verify_mask_buffer",
             "same rule for the backend's verify_mask (mode, fits(bs), buffer); differs: always FULL_MASK, the whole "
             "mask written (is_read ignored), seq_lens_sum bound bs x max_context_len even with a buffer"),
    Internal("wrap", "sglang.srt.managers.tp_worker.TpModelWorker.init_cuda_graphs", ("capture_decode_cuda_graph",),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup._skip_target_verify_capture",
             "replaced on the target worker; False under ragged verify. Relies on Scheduler.init_all_cuda_graphs "
             "capturing the target's graphs before the draft's, backends already built"),
    Internal("wrap", f"{_V2}.EAGLEWorkerV2.apply_runtime_state", ("state",),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup._apply_plan",
             "its early return on an unchanged step count is lifted (speculative_num_steps = -1 for the call); it "
             "must swap every SpecRuntimeState field and append one get_context().override entry"),
    Internal("swap", "sglang.srt.runtime_context.RuntimeContext._overrides_log", None,
             "sglang_hybrid.sglang_plugin.runtime_states.apply_state",
             "entries apply_runtime_state appends through RuntimeContext.override are removed, by identity, once a "
             "later switch supersedes them"),
    Internal("wrap", f"{_V2}.logger", None, "sglang_hybrid.sglang_plugin.worker._QuietWidthSwitch",
             "a filter drops records starting 'Switch adaptive runtime state' (apply_runtime_state's log line)"),
    Internal("mirror", f"{_V2}.draft_tp_context", ("layout",),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup._build_runtime_states",
             "read from eagle_worker_v2's namespace with speculative_moe_backend_context and "
             "speculative_moe_a2a_backend_context: the contexts EAGLEWorkerV2.init_cuda_graphs builds states in"),
    Internal("mirror", "sglang.srt.speculative.spec_tp_sync.SpecTpSync", ("tp_group",),
             "sglang_hybrid.sglang_plugin.tp_sync.TreeBroadcast",
             "rank 0's decision broadcast over get_dp_tp_group() (group.broadcast(tensor, src=0), world_size), "
             "the group SGLang's own SpecTpSync is given"),

    # -- runtime states per (depth, width) (runtime_states) ---------------------------------------------------------
    Internal("mirror", f"{_V2}.EAGLEWorkerV2.build_adaptive_runtime_state",
             ("speculative_num_steps", "speculative_num_draft_tokens", "cuda_graph_bs"),
             "sglang_hybrid.sglang_plugin.runtime_states.build_verify_part",
             "split into a verify part per width and a draft part per depth (build_draft_part); no "
             "_capture_cuda_graphs: runners of the start-up classes; shallower draft parts share buffers"),
    Internal("mirror", f"{_V2}.EAGLEWorkerV2._override_worker_state",
             ("speculative_num_steps", "speculative_num_draft_tokens", "cuda_graph_bs"),
             "sglang_hybrid.sglang_plugin.runtime_states.build_verify_part",
             "each part is built under it, as build_adaptive_runtime_state does; it restores the draft worker's "
             "backends and graph runners after"),
    Internal("mirror", "sglang.srt.model_executor.model_runner.ModelRunner._get_attention_backend",
             ("init_new_workspace",), "sglang_hybrid.sglang_plugin.runtime_states.build_verify_part",
             "init_new_workspace=True with runner.init_new_workspace saved and restored, as "
             "build_adaptive_runtime_state does (memory_budget counts the extra FlashInfer workspace)"),
    Internal("mirror", f"{_V2}.EagleDraftWorker.init_attention_backend", (),
             "sglang_hybrid.sglang_plugin.runtime_states.build_draft_part",
             "builds the draft decode and the draft extend backend; a draft part keeps the first, a verify part "
             "(build_verify_part) the second"),
    Internal("mirror", "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner",
             ("model_runner", "attn_backend", "speculative_num_steps", "speculative_num_draft_tokens",
              "record_nolora_graph"),
             "sglang_hybrid.sglang_plugin.runtime_states.build_verify_part",
             "the start-up verify runner's class, constructed by keyword as build_adaptive_runtime_state does"),
    Internal("mirror", "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner",
             ("eagle_worker", "draft_attn_backend", "speculative_num_steps"),
             "sglang_hybrid.sglang_plugin.runtime_states.build_draft_part",
             "the start-up draft runner's class, with draft_attn_backend and speculative_num_steps by keyword"),
    Internal("mirror", "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner",
             ("eagle_worker", "draft_extend_attn_backend", "speculative_num_steps"),
             "sglang_hybrid.sglang_plugin.runtime_states.build_verify_part",
             "the start-up draft-extend runner's class, with draft_extend_attn_backend by keyword"),
    Internal("mirror", "sglang.srt.speculative.adaptive_runtime_state.SpecRuntimeState",
             ("speculative_num_steps", "speculative_num_draft_tokens", "draft_attn_backend", "cuda_graph_runner",
              "target_attn_backend", "target_graph_runner", "draft_extend_attn_backend",
              "cuda_graph_runner_for_draft_extend"),
             "sglang_hybrid.sglang_plugin.runtime_states.assemble",
             "built by keyword as build_adaptive_runtime_state builds it: a new field must be filled here too"),

    # -- the verify input (verify_input, tree_mask) -----------------------------------------------------------------
    Internal("subclass", "sglang.srt.speculative.eagle_info.EagleVerifyInput",
             ("draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token",
              "retrieve_next_sibling", "retrieve_cum_len", "spec_steps", "topk", "draft_token_num",
              "capture_hidden_mode", "seq_lens_sum", "seq_lens_cpu", "draft_probs", "prepared_out_cache_loc",
              "prepared_mrope_positions", "kv_loc_plan", "num_tokens_per_req"),
             "sglang_hybrid.sglang_plugin.verify_input.HybridVerifyInput",
             "a dataclass extending SGLang's (hybrid_max_depth, ragged appended) built by keyword in _verify_input"),
    Internal("override", "sglang.srt.speculative.eagle_info.EagleVerifyInput.max_tree_depth", None,
             "sglang_hybrid.sglang_plugin.verify_input.HybridVerifyInput.max_tree_depth",
             "property: the accept_index width, from HYBRID's static deepest path"),
    Internal("override", "sglang.srt.speculative.eagle_info.EagleVerifyInput.tree_topk", None,
             "sglang_hybrid.sglang_plugin.verify_input.HybridVerifyInput.tree_topk",
             "property: -1, an irregular tree"),
    Internal("override", "sglang.srt.speculative.eagle_info.EagleVerifyInput.generate_attn_arg_prefill",
             ("req_pool_indices", "paged_kernel_lens", "paged_kernel_lens_sum", "translator", "plan", "kind"),
             "sglang_hybrid.sglang_plugin.verify_input.HybridVerifyInput.generate_attn_arg_prefill",
             "FlashInfer's TARGET_VERIFY plan arguments; under ragged verify flashinfer_plan.paged_verify_args, "
             "which takes the same keywords"),
    Internal("mirror", "sglang.kernels.ops.speculative.spec_tree.TreeMaskMode", None,
             "sglang_hybrid.sglang_plugin.verify_input.TreeMaskMode",
             "imported, else a copy (FULL_MASK 0, QLEN_ONLY 1, QLEN_ONLY_BITPACKING 2): the fallback is silent"),
    Internal("mirror", "sglang.kernels.ops.speculative.tree.reconstruct_indices_from_tree_mask",
             ("tree_mask", "verified_seq_len", "positions", "retrive_index", "retrive_next_token",
              "retrive_next_sibling", "batch_size", "draft_token_num"),
             "sglang_hybrid.sglang_plugin.tree_mask.tree_links_torch",
             "its torch twin off CUDA (same contract); on CUDA verify_input._reconstruct_sglang calls it positionally"),

    # -- ragged verify on Triton (ragged.triton_backend) ------------------------------------------------------------
    Internal("subclass", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend", None,
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend",
             "plans a ragged TARGET_VERIFY from spec_info.ragged; the worker also matches this class by name "
             "(TREE_MASK_BACKEND_CLASSES, RAGGED_BACKENDS, graph_capture.TRITON_BACKENDS, memory_budget)"),
    Internal("swap", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend", None,
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.enable",
             "a backend SGLang built is retyped (__class__) and given ragged_buffers; reads qo_indptr, mask_indptr, "
             "kv_indptr, max_context_len, device, sliding_window_size"),
    Internal("override", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata",
             ("forward_batch",),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend.init_forward_metadata",
             "a ragged verify is planned through init_forward_metadata_out_graph(fb, in_capture=True)"),
    Internal("override", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._update_target_verify_buffers",
             ("plan", "bs", "seq_lens", "spec_info", "req_pool_indices"),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend._update_target_verify_buffers",
             "the layout's qo_indptr and mask_indptr instead of arange x W; no sliding-window branch"),
    Internal("override",
             "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._build_cuda_graph_forward_metadata",
             ("bs", "forward_mode", "spec_info", "swa_out_cache_loc"),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend"
             "._build_cuda_graph_forward_metadata",
             "ForwardMetadata over the ragged buffers, max_extend_len = W"),
    Internal("mirror", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._init_forward_metadata_out_graph",
             ("forward_batch", "in_capture"),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend.finish_plan_ahead",
             "its in-capture TARGET_VERIFY path split in two: plan_ahead (_update_target_verify_buffers), then "
             "_build_cuda_graph_forward_metadata(.., _fill_cuda_graph_swa_out_cache_loc(fb, in_capture=True))"),
    Internal("mirror", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._fill_kv_indptr_and_indices",
             ("plan", "bs", "seq_lens", "req_pool_indices", "kv_indices", "kv_indptr"),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend._update_target_verify_buffers",
             "called as the base _update_target_verify_buffers calls it, into ragged_buffers.kv_indices"),
    Internal("mirror", "sglang.srt.layers.attention.triton_backend.ForwardMetadata",
             ("attn_logits", "attn_lse", "max_extend_len", "num_kv_splits", "kv_indptr", "kv_indices", "qo_indptr",
              "custom_mask", "mask_indptr", "window_kv_indptr", "window_kv_indices", "window_num_kv_splits",
              "window_kv_offsets", "swa_attn_logits", "swa_out_cache_loc", "aligned_window_kv_indptr",
              "aligned_window_kv_indices", "lean_Mp", "lean_Lp", "lean_Op", "lean_locks", "uneven_batch"),
             "sglang_hybrid.sglang_plugin.ragged.triton_backend.RaggedTritonAttnBackend"
             "._build_cuda_graph_forward_metadata",
             "built by keyword; the fields after swa_out_cache_loc (SWA logits, aligned windows, lean decode) keep "
             "their defaults"),

    # -- ragged verify on FlashInfer (ragged.flashinfer_backend, ragged.flashinfer_plan) ----------------------------
    Internal("subclass", "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend", None,
             "sglang_hybrid.sglang_plugin.ragged.flashinfer_backend.RaggedFlashInferAttnBackend",
             "one CUDA-graph wrapper per token tier, made from the module's BatchPrefillWithPagedKVCacheWrapper "
             "(present only where flashinfer is installed); matched by class name as Triton's is"),
    Internal("swap", "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend", None,
             "sglang_hybrid.sglang_plugin.ragged.flashinfer_backend.enable",
             "retyped (__class__); reads num_wrappers, prefill_uses_dequant_workspace, kv_indptr, max_context_len, "
             "workspace_buffer, prefill_backend, indices_updater_prefill, kv_index_translator"),
    Internal("override", "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata",
             ("forward_batch",),
             "sglang_hybrid.sglang_plugin.ragged.flashinfer_backend.RaggedFlashInferAttnBackend.init_forward_metadata",
             "a ragged verify at the graph runner's slots plans its tier's wrapper; anything else goes to the base"),
    Internal("mirror",
             "sglang.srt.layers.attention.flashinfer_backend.FlashInferIndicesUpdaterPrefill.call_begin_forward",
             ("wrapper_ragged", "wrapper_paged", "req_pool_indices", "paged_kernel_lens", "paged_kernel_lens_sum",
              "seq_lens", "prefix_lens", "kv_start_idx", "kv_indptr", "qo_indptr", "use_ragged", "spec_info",
              "use_sliding_window_kv_pool", "fixed_split_size", "multi_item_params", "cross_attention_custom_mask",
              "seq_lens_cpu", "custom_kv_indices", "window_left", "plan"),
             "sglang_hybrid.sglang_plugin.ragged.flashinfer_backend.RaggedFlashInferAttnBackend.init_forward_metadata",
             "its TARGET_VERIFY paged plan call with a tier's arguments; differs: plan() not begin_forward, no "
             "fixed_split_size, multi-item scoring, window_left or fast_prefill_plan"),
    Internal("mirror", "sglang.srt.layers.attention.flashinfer_backend.PrefillMetadata",
             ("prefill_wrappers", "use_ragged", "extend_no_prefix", "multi_item_params", "swa_out_cache_loc"),
             "sglang_hybrid.sglang_plugin.ragged.flashinfer_backend.RaggedFlashInferAttnBackend.init_forward_metadata",
             "built positionally: ([wrapper], use_ragged=False, extend_no_prefix=False)"),

    # -- the ragged verify forward (ragged.target, ragged.graph_runner) ---------------------------------------------
    Internal("wrap", "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
             ("batch", "forward_batch", "pp_proxy_tensors", "is_verify", "skip_attn_backend_init",
              "capture_hidden_mode", "return_kv_loc_plan"),
             "sglang_hybrid.sglang_plugin.ragged.target.RaggedVerifyTarget",
             "a proxy passed to run_eagle_verify as target_worker; uses KVLocPlan.bind(cols=), "
             "ForwardBatch._init_num_token_non_padded, forward_metadata_ready, kv_loc_cols, out_cache_loc_virtual"),
    Internal("wrap", "sglang.srt.model_executor.runner.eager_runner.EagerRunner.execute",
             ("forward_batch", "pp_proxy_tensors", "kwargs"),
             "sglang_hybrid.sglang_plugin.ragged.graph_runner.RaggedVerifyEagerRunner",
             "installed as model_runner.eager_runner; relies on ModelRunner._forward_raw handing a verify without a "
             "decode graph to eager_runner.execute, and on BaseRunner.model_context"),
    Internal("swap", "sglang.srt.model_executor.model_runner.ModelRunner._forward_raw",
             ("forward_batch", "pp_proxy_tensors", "reinit_attn_backend", "split_forward_count"),
             "sglang_hybrid.sglang_plugin.worker_startup.WorkerStartup._drop_target_verify_graphs",
             "model_runner.decode_cuda_graph_runner (and every state's target_graph_runner) set to None, so that "
             "this method, which asks it first, runs the ragged verify on eager_runner"),

    # -- shallower draft depths in the start-up buffers (shared_draft_steps) ----------------------------------------
    Internal("subclass", "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend", None,
             "sglang_hybrid.sglang_plugin.shared_draft_steps.SharedDraftSteps",
             "a view of the start-up backend: its first depth - 1 step backends and first depth buffer rows"),
    Internal("override", "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend.__init__",
             ("model_runner", "topk", "speculative_num_steps"),
             "sglang_hybrid.sglang_plugin.shared_draft_steps.SharedDraftSteps.__init__",
             "never called: the view copies the start-up backend's __dict__ and slices attn_backends, kv_indptr, "
             "window_kv_indptr; any per-step state SGLang adds must be sliced here too"),
    Internal("override", "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend.init_cuda_graph_state",
             ("max_bs", "max_num_tokens"),
             "sglang_hybrid.sglang_plugin.shared_draft_steps.SharedDraftSteps.init_cuda_graph_state",
             "takes the start-up graph state (cuda_graph_kv_indices rows, num_kv_splits, window indices); relies on "
             "step i's KV index rows not depending on the step count"),
    Internal("subclass", "sglang.srt.layers.attention.flashinfer_backend.FlashInferMultiStepDraftBackend", None,
             "sglang_hybrid.sglang_plugin.shared_draft_steps.SharedKVIndexRows",
             "own step backends and wrappers, the start-up backend's KV index rows"),
    Internal("swap", "sglang.srt.layers.attention.flashinfer_backend.FlashInferMultiStepDraftBackend", None,
             "sglang_hybrid.sglang_plugin.shared_draft_steps.shallower_backend",
             "a backend SGLang built at the shallower depth is retyped (__class__) to SharedKVIndexRows"),
    Internal("mirror",
             "sglang.srt.layers.attention.flashinfer_backend.FlashInferMultiStepDraftBackend.init_cuda_graph_state",
             ("max_bs", "max_num_tokens"),
             "sglang_hybrid.sglang_plugin.shared_draft_steps.SharedKVIndexRows.init_cuda_graph_state",
             "transcribed; differs: the start-up backend's KV index rows (draft_kv_indices_buffer_width checked) "
             "instead of a new int32 tensor"),

    # -- start-up memory budget and cost tables (memory_budget, startup_costs) --------------------------------------
    Internal("mirror", "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_cuda_graph_state",
             ("max_bs", "max_num_tokens", "kv_indices_buf"), "sglang_hybrid.sglang_plugin.memory_budget._verify_graphs",
             "its allocations as arithmetic: int32 KV indices and uint8 custom mask of max_num_tokens x context"),
    Internal("mirror", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_cuda_graph_state",
             ("max_bs", "max_num_tokens", "kv_indices_buf", "cuda_graph_num_kv_splits_buf"),
             "sglang_hybrid.sglang_plugin.memory_budget._triton_graph_state",
             "its allocations as arithmetic: split-KV logits and LSE, lean partials, int64 KV indices, verify mask"),
    Internal("mirror", "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend.init_cuda_graph_state",
             ("max_bs", "max_num_tokens"), "sglang_hybrid.sglang_plugin.memory_budget._draft_graphs",
             "steps x max_bs x topk x context KV indices (int64 on Triton, int32 on FlashInfer) and step states"),
    Internal("mirror", "sglang.srt.arg_groups.memory_hook.handle_gpu_memory_settings", ("server_args",),
             "sglang_hybrid.sglang_plugin.memory_budget.post_capture_reserve_bytes",
             "the post-capture KV sizing reserve: 1536 MiB + tp x pp / 8 GiB"),
    Internal("mirror", "sglang.srt.model_executor.runner.base_runner.BaseRunner._dummy_run",
             ("batch_size", "run_ctx", "forward_mode_override", "buffers", "extend_num_tokens_per_req"),
             "sglang_hybrid.sglang_plugin.startup_costs.measure_verify_costs",
             "times SGLang's warm-up forward as its autotune runs it: buffers from _alloc_dummy_decode_buffers("
             "max_bs, num_tokens_per_req=, allocate_logits_buffer=False), seq_lens and custom_mask rewritten"),
    Internal("mirror", f"{_V2}.EagleDraftWorker.draft_forward", ("forward_batch",),
             "sglang_hybrid.sglang_plugin.startup_costs.measure_draft_costs",
             "one eager draft step by hand: ForwardBatch and EagleDraftInput built, bind_runner_slots, the multi-step "
             "backend's plan, draft_runner.forward under forward_context(attn_backends[0])"),

    # -- the CPU engine's test switches (cpu_engine; never in a GPU deployment) -------------------------------------
    Internal("swap", "sglang.srt.speculative.eagle_worker_common._is_cpu", None,
             "sglang_hybrid.cpu_engine.kv_window.lift_gate",
             "set False so prepare_for_draft plans KV windows on the CPU; must have no other use in that module"),
    Internal("wrap", "sglang.srt.speculative.eagle_worker_common.eagle_sample",
             ("verify_input", "batch", "logits_output", "grammar_mask", "uno_target_max_top_k", "watermark_state",
              "watermark_full_mask"),
             "sglang_hybrid.cpu_engine.kv_window.claim_cuda_predictions",
             "the module's name replaced; predict claims is_cuda so run_eagle_verify takes its fused commit; relies "
             "on the 3-tuple return and _finalize_accept_tree_path replacing predict before other reads"),
    Internal("wrap", "sglang.srt.speculative.eagle_worker_common.prepare_verify_commit_outputs",
             ("predict", "accept_index", "accept_lens", "seq_lens", "num_draft_tokens", "mamba_track_interval"),
             "sglang_hybrid.cpu_engine.kv_window.claim_cuda_predictions",
             "the module's name replaced: logs its first call"),
    Internal("wrap", f"{_V2}.EagleDraftWorker._draft_extend_for_decode", ("batch", "batch_result", "kv_loc_plan"),
             "sglang_hybrid.cpu_engine.kv_window.prepare_extend_inputs_on_device",
             "replaced on the class; fills batch_result.prepared_draft_extend_inputs, which the base takes first"),
    Internal("mirror", "sglang.kernels.ops.speculative.eagle.prepare_draft_extend_inputs",
             ("accept_lens", "predict", "num_draft_tokens"),
             "sglang_hybrid.cpu_engine.kv_window.prepare_extend_inputs_on_device",
             "called as _draft_extend_for_decode's CUDA branch calls it (accept_lens, next_token_ids, W)"),
    Internal("wrap", "sglang.srt.speculative.eagle_utils._verify_uses_greedy",
             ("is_all_greedy", "is_cpu", "is_hip", "is_xpu", "use_rejection_sampling"),
             "sglang_hybrid.cpu_engine.tree_sampling.lifted_verify_uses_greedy",
             "the module's name replaced; calls the original with is_cpu=False (keyword-only parameters)"),
    Internal("swap", "sglang.srt.speculative.eagle_utils.tree_speculative_sampling_target_only", None,
             "sglang_hybrid.cpu_engine.tree_sampling.sampling_verify_patches",
             "None on the CPU; replaced by tree_speculative_sampling_target_only_cpu"),
    Internal("swap", "sglang.srt.speculative.eagle_utils.top_k_renorm_prob", None,
             "sglang_hybrid.cpu_engine.tree_sampling.sampling_verify_patches",
             "None on the CPU; replaced by top_k_renorm_prob_cpu"),
    Internal("swap", "sglang.srt.speculative.eagle_utils.top_p_renorm_prob", None,
             "sglang_hybrid.cpu_engine.tree_sampling.sampling_verify_patches",
             "None on the CPU; replaced by top_p_renorm_prob_cpu"),
    Internal("mirror", "sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only",
             ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
              "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
              "draft_probs", "threshold_single", "threshold_acc", "deterministic"),
             "sglang_hybrid.cpu_engine.tree_sampling.tree_speculative_sampling_target_only_cpu",
             "the CUDA kernel step for step; differs: the residual's cumsum order (torch's, not the block scan)"),
    Internal("mirror", "sglang.kernels.ops.sampling.renorm_triton.top_k_renorm_probs_triton", ("probs", "top_k"),
             "sglang_hybrid.cpu_engine.tree_sampling.top_k_renorm_prob_cpu", "same pivot rule, ties kept"),
    Internal("mirror", "sglang.kernels.ops.sampling.renorm_triton.top_p_renorm_probs_triton", ("probs", "top_p"),
             "sglang_hybrid.cpu_engine.tree_sampling.top_p_renorm_prob_cpu", "same pivot rule, ties kept"),
    Internal("swap", "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd",
             ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
              "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale",
              "sm_scale", "logit_cap", "skip_prefix_custom_mask", "sliding_window_size", "sinks", "window_kv_offsets",
              "xai_temperature_len", "lse_extend", "skip_prefix", "skip_extend", "page_size", "score_mod",
              "aux_tensors", "extend_seq_lens_cpu", "identity_kv_indices"),
             "sglang_hybrid.cpu_engine.torch_attention.swap_kernel",
             "replaced by extend_attention_torch, which mirrors the kernel's contract and refuses what it lacks"),
    Internal("swap", "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd",
             ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse", "num_kv_splits",
              "max_kv_splits", "sm_scale", "k_scale", "v_scale", "logit_cap", "sinks", "xai_temperature_len",
              "has_mla", "use_pdl", "page_size", "score_mod", "aux_tensors", "enable_lean", "lean_Mp", "lean_Lp",
              "lean_Op", "lean_locks", "uneven_batch"),
             "sglang_hybrid.cpu_engine.torch_attention.swap_decode_kernel",
             "replaced by decode_attention_torch (no split-KV scratch written, refuses what it lacks)"),
    Internal("swap", "sglang.srt.layers.attention.triton_backend.generate_draft_decode_kv_indices", None,
             "sglang_hybrid.cpu_engine.torch_kv_indices.swap_kv_indices_kernel",
             "the name the Triton draft backend launches as kernel[grid](...), imported at its import"),
    Internal("mirror", "sglang.kernels.ops.speculative.cache_locs.generate_draft_decode_kv_indices",
             ("req_pool_indices", "req_to_token", "paged_kernel_lens", "kv_indices", "kv_indptr", "positions",
              "row_stride", "kv_indices_stride", "kv_indptr_stride", "bs_upper", "iter_upper", "num_tokens_upper",
              "page_size", "window_size", "sink_size", "NUM_STEPS", "ENTRY_PAGE_SIZE", "v2p", "TRANSLATE"),
             "sglang_hybrid.cpu_engine.torch_kv_indices.draft_decode_kv_indices",
             "the Triton kernel in torch, same arguments (a Triton JIT function: its arg_names are checked)"),
    Internal("swap", "sglang.srt.mem_cache.kv_index_translator.create_flashinfer_kv_indices_triton", None,
             "sglang_hybrid.cpu_engine.torch_kv_indices.swap_kv_gather_kernel",
             "the name pack_read_stream launches as kernel[grid](...), imported at the module's import; replaced under "
             "HYBRID_CPU_ENGINE_TORCH_KERNELS only"),
    Internal("mirror", "sglang.kernels.ops.attention.kv_indices.create_flashinfer_kv_indices_triton",
             ("req_to_token_ptr", "req_pool_indices_ptr", "page_kernel_lens_ptr", "kv_indptr", "kv_start_idx",
              "kv_indices_ptr", "req_to_token_ptr_stride", "ENTRY_PAGE_SIZE", "TOKEN_BLOCK_PARALLEL", "token_mapping"),
             "sglang_hybrid.cpu_engine.torch_kv_indices.kv_indices_gather",
             "the Triton kernel in torch, same arguments (a Triton JIT function: its arg_names are checked)"),
    Internal("mirror", "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_kernel_triton",
             ("predicts_ptr", "accept_index_ptr", "accept_token_num_ptr", "candidates_ptr", "retrieve_index_ptr",
              "retrieve_next_token_ptr", "retrieve_next_sibling_ptr", "target_predict_ptr", "batch_size",
              "num_speculative_tokens", "num_draft_tokens"),
             "sglang_hybrid.cpu_engine.torch_tree_verify.verify_tree_greedy_torch",
             "the Triton kernel in torch, called as the stand-in's verify_tree_greedy_cpu (retrive_* keywords)"),
    # the stand-in sgl_kernel: each op follows the call SGLang's CPU branch makes (positional unless noted)
    Internal("mirror", "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func",
             ("req_pool_indices", "req_to_token", "start_offset", "end_offset", "out_cache_loc", "batch_size"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.assign_req_to_token_pool_cpu",
             "its CPU branch's call; batch_size replaced by pool_len = req_to_token.shape[1]"),
    Internal("mirror", "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func",
             ("req_pool_indices", "req_to_token", "start_offset", "end_offset", "batch_size", "draft_token_num",
              "device"), "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.assign_extend_cache_locs_cpu",
             "its CPU branch's call (and fill_front_out_cache_loc_func's)"),
    Internal("mirror", "sglang.kernels.ops.speculative.cache_locs.assign_draft_cache_locs_contiguous_func",
             ("req_pool_indices", "req_to_token", "seq_lens", "out_cache_loc", "topk", "num_cols", "positions",
              "mrope"), "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.assign_draft_cache_locs_contiguous_cpu",
             "its CPU branch's call, pool_len inserted before topk; no positions written"),
    Internal("mirror", "sglang.kernels.ops.speculative.eagle.fill_bonus_tokens_func",
             ("accept_tokens", "accept_lens", "bonus_tokens", "accept_stride", "batch_size"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.fill_bonus_tokens_cpu", "its CPU branch's call"),
    Internal("mirror", "sglang.kernels.ops.speculative.eagle.fill_accept_out_cache_loc_func",
             ("accept_index", "out_cache_loc", "accept_out_cache_loc", "size"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.fill_accept_out_cache_loc_cpu", "its CPU branch's call"),
    Internal("mirror", "sglang.kernels.ops.kvcache.cache_move.copy_all_layer_kv_cache_func",
             ("data_ptrs", "strides", "tgt_loc", "src_loc", "num_locs", "num_locs_upper", "kv_copy_config"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.copy_all_layer_kv_cache_cpu",
             "its CPU branch's call with the locations cut to num_locs (copy_all_layer_kv_cache_tiled's job)"),
    Internal("mirror", "sglang.kernels.ops.speculative.spec_tree.sgl_build_tree_kernel_triton",
             ("parent_list", "selected_index", "verified_seq_len", "tree_mask", "positions", "retrieve_index",
              "retrieve_next_token", "retrieve_next_sibling", "topk", "depth", "draft_token_num", "tree_mask_mode"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.build_tree_kernel_efficient_cpu",
             "build_tree_kernel_efficient_func's CPU call forwarded positionally to this (its XPU path)"),
    Internal("mirror", "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton",
             ("predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
              "retrieve_next_sibling", "target_predict"),
             "sglang_hybrid.cpu_engine.stand_in.sgl_kernel.verify_tree_greedy_cpu",
             "called by keyword (retrieve_*); SGLang calls the stand-in with the op schema's retrive_* names"),

    # -- the CPU server and the self-check (serve, http_guard, check) -----------------------------------------------
    Internal("mirror", "sglang.launch_server.run_server", ("server_args",), "sglang_hybrid.serve.main",
             "launch_server's __main__ block: load_plugins(), prepare_server_args(argv), run_server, then "
             "kill_process_tree(os.getpid(), include_parent=False)"),
    Internal("wrap", "sglang.srt.entrypoints.http_server.app", None,
             "sglang_hybrid.http_guard.install_on_sglang_server",
             "OpenAIRequestGuard added as ASGI middleware on SGLang's FastAPI app before the server starts"),
    Internal("mirror", "sglang.srt.entrypoints.http_server.available_models", (),
             "sglang_hybrid.http_guard.install_on_sglang_server",
             "the served name read as this route reads it: the private _global_state.tokenizer_manager"
             ".served_model_name, and get_lora().enable_lora"),
    Internal("mirror", "sglang.srt.entrypoints.http_server.retrieve_model", ("model",),
             "sglang_hybrid.http_guard.refusal",
             "its 404 body for an unknown model (model_not_found), with the served name added to the message"),
    Internal("mirror", "sglang.srt.entrypoints.openai.protocol.DEFAULT_MODEL_NAME", None,
             "sglang_hybrid.http_guard.SGLANG_DEFAULT_MODEL", "copied as the literal 'default'"),
    Internal("mirror", "sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
             ("meta_info", "recv_obj", "i"), "sglang_hybrid.check.not_checked_reason",
             "its rule: meta_info carries spec_verify_ct only when a request had a verify step"),
)


def resolve(target: str):
    """The object at ``target``: the longest importable module prefix, then ``getattr`` for the rest. Raises
    ``ImportError`` or ``AttributeError`` when it is not there (and whatever importing the module raises)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue                           # no such module: the rest are attributes
            raise
        break
    else:
        raise ImportError(f"no module in {target!r}")
    for attr in parts[i:]:
        obj = getattr(obj, attr)
    return obj


def parameters(obj) -> Optional[tuple]:
    """``obj``'s parameter names (``self``/``cls`` of a function read off its class left out), or None when it has
    no signature. A Triton JIT function answers with its kernel's ``arg_names``."""
    arg_names = getattr(obj, "arg_names", None)
    if isinstance(arg_names, list):
        return tuple(arg_names)
    try:
        names = [p.name for p in inspect.signature(obj).parameters.values()]
    except (TypeError, ValueError):
        return None
    if names and names[0] in ("self", "cls") and not inspect.isclass(obj):
        names = names[1:]
    return tuple(names)


def check(internals: Iterable[Internal] = INTERNALS) -> list:
    """The problems with ``internals`` in the installed SGLang: an unknown kind, a target that does not resolve, or
    parameter names other than ``params``. Empty when all is well."""
    problems = []
    for it in internals:
        where = f"{it.kind} {it.target} (used by {it.used_by})"
        if it.kind not in KINDS:
            problems.append(f"{where}: unknown kind, expected one of {KINDS}")
            continue
        try:
            obj = resolve(it.target)
        except Exception as e:  # noqa: BLE001 -- whatever stops the import is the problem to report
            problems.append(f"{where}: not found ({type(e).__name__}: {e})")
            continue
        if it.params is None:
            continue
        found = parameters(obj)
        if found is None:
            problems.append(f"{where}: no signature to check, expected parameters {tuple(it.params)}")
        elif found != tuple(it.params):
            problems.append(f"{where}: parameters {found}, expected {tuple(it.params)}")
    return problems


__all__ = ["INTERNALS", "KINDS", "SGLANG_VERSION", "Internal", "check", "parameters", "resolve"]


if __name__ == "__main__":
    import sys

    found = check()
    print("\n".join(found) if found else f"all {len(INTERNALS)} SGLang internals resolve as in SGLang {SGLANG_VERSION}")
    sys.exit(1 if found else 0)

