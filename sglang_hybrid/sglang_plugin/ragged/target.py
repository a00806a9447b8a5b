"""The target worker as SGLang's verify body sees it, running the verify forward on the ragged rows only.

Why a proxy around the target worker: SGLang's verify body (``run_eagle_verify``) builds a padded ``B x W`` forward
batch and, after the forward, walks the trees, commits KV and feeds the draft extend from ``B x W`` rows. Only the
forward itself needs to change, so ``RaggedVerifyTarget.forward_batch_generation`` compacts the batch's node tokens
and positions to the layout's ``T`` rows, padded to its token tier (``layout.gather_rows``; a layout built before its
node counts were read, ``layout.PendingLayout``, reads them here first), and its KV writes too
(SGLang's own ``KVLocPlan.bind`` with the compact rows as a flat index into the verify window, the tier's spare rows
to SGLang's sink: ``layout.kv_write_cols``), runs the real forward (the backend plans it ragged in its graph-state
buffers: ``triton_backend``), then scatters the first ``T`` rows' logits and hidden states back to their padded rows
(``layout.scatter_rows``). Absent nodes get no KV write and zero logits; they are unreachable from the root, so
neither is ever read. Everything else is delegated to the real worker untouched.
"""
from __future__ import annotations

from .graph_runner import RaggedVerifyEagerRunner
from .layout import PendingLayout, gather_rows, kv_write_cols, scatter_rows


class RaggedVerifyTarget:
    """Delegates to ``target_worker``; a verify forward whose ``spec_info.ragged`` is set runs compact."""

    def __init__(self, target_worker):
        self._target = target_worker

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify: bool = False, **kwargs):
        layout = getattr(getattr(forward_batch, "spec_info", None), "ragged", None)
        if not is_verify or layout is None or forward_batch.forward_mode.is_idle():
            return self._target.forward_batch_generation(batch=batch, forward_batch=forward_batch,
                                                         is_verify=is_verify, **kwargs)
        fb = forward_batch
        if fb.forward_metadata_ready:
            raise RuntimeError(
                "ragged verify: the verify batch was already planned (a CUDA graph of SGLang's loaded it at the padded "
                "width); SGLang's target verify graphs should not have been captured or have been dropped at start "
                "(HybridWorkerV2._skip_target_verify_capture, _drop_target_verify_graphs)")
        plan, cols = fb.kv_loc_plan, fb.kv_loc_cols
        if cols is not None:
            raise RuntimeError("ragged verify: the verify batch already writes part of its KV window (kv_loc_cols); "
                               "it compacts whole verify windows only")
        translator = self._target.model_runner.kv_index_translator
        padded = fb.input_ids, fb.positions
        # KV writes: SGLang's own plan selects the compact rows of the verify window (``cols`` as a flat index into
        # the window: out_cache_loc and its virtual mirror both follow, element by element).
        if isinstance(layout, PendingLayout):
            # compact ahead of the step's one blocking read, then read as late as it can be: the layout, SGLang's
            # verify preparation, the compaction and the KV write ids of every row the step can take are queued on
            # the device by then (``layout.PendingLayout``), and with the token-tier graphs their static buffers and
            # attention plan too (``graph_runner.load_ahead``); the step's rows are then the first ``rows`` of each
            eager = getattr(self._target.model_runner, "eager_runner", None)
            graphs = eager.graphs if isinstance(eager, RaggedVerifyEagerRunner) else None
            ahead = layout.compact_ahead(*padded, out=None if graphs is None else (graphs.input_ids,
                                                                                  graphs.positions))
            plan.bind(fb, translator, cols=ahead[2])
            if graphs is not None:
                graphs.load_ahead(fb, layout, ahead[0], ahead[1])
            layout = fb.spec_info.ragged = layout.read()
            fb.input_ids, fb.positions, fb.kv_loc_cols, fb.out_cache_loc = (
                t[: layout.rows] for t in (*ahead, fb.out_cache_loc))
            if fb.out_cache_loc_virtual is not None:
                fb.out_cache_loc_virtual = fb.out_cache_loc_virtual[: layout.rows]
        else:
            fb.input_ids, fb.positions = (gather_rows(t, layout) for t in padded)
            plan.bind(fb, translator, cols=kv_write_cols(layout))
        # The batch's token count feeds SGLang's padding bookkeeping (num_token_non_padded): recount after compaction.
        fb._init_num_token_non_padded(device=fb.input_ids.device, is_draft_worker=False)
        try:
            out = self._target.forward_batch_generation(batch=batch, forward_batch=fb, is_verify=True, **kwargs)
        finally:
            fb.input_ids, fb.positions = padded
            plan.bind(fb, translator, cols=None)
            fb._init_num_token_non_padded(device=fb.input_ids.device, is_draft_worker=False)
        logits = out.logits_output
        if logits.hidden_states_token_indices is not None:
            raise RuntimeError("ragged verify: the forward returned hidden states of selected tokens only "
                               "(hidden_states_token_indices); it scatters full-row outputs only")
        logits.next_token_logits = scatter_rows(logits.next_token_logits, layout)
        if logits.hidden_states is not None:
            logits.hidden_states = scatter_rows(logits.hidden_states, layout)
        return out


__all__ = ["RaggedVerifyTarget"]
