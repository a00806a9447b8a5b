"""The ragged verify forward as a graph per token tier: static buffers, a fixed request slot count, lazy capture.

Why a runner of HYBRID's own: SGLang's ``DecodeCudaGraphRunner`` captures ``bs x W`` tokens per batch size (its
compact ragged mode included: ``_capture_one_stream``), so it cannot host tiers finer than its batch-size grid
(docs/sglang.md, "Ragged verify"). A ragged verify needs one graph per token tier (``tiers``) and nothing else varies:

* rows: the layout's ``rows`` (the tier); the forward's tokens, positions and KV write slots are copied into static
  ``[max_rows]`` buffers (their first ``rows`` entries), the tier's spare rows already zero and writing to SGLang's
  sink (``layout.gather_rows``, ``layout.kv_write_cols``);
* requests: always ``slots`` (the running limit the backend's buffers were sized for). Requests past the step's ``B``
  are padding: no prefix (``seq_len`` 0), no rows (``qo_indptr`` and ``mask_indptr`` repeat their last entry), so
  the attention kernel's grid keeps its capture shape and their programs find nothing to do;
* the attention plan: ``RaggedTritonAttnBackend`` plans into the buffers it allocated once (``triton_backend``);
  the plan runs before each replay, outside the graph, as SGLang's runners do;
* outputs: the logits go to one ``[max_rows, vocab]`` buffer (``logits_buffer``), and the hidden states are copied,
  inside the graph, to one ``[max_rows, width]`` buffer (``keep_hidden``): a captured graph's outputs stay allocated
  in the graph pool for as long as it lives, so without it every captured tier would keep its own ``[rows, width]``
  (the sum over the tiers: 0.15 GiB for Llama-3.1-8B at 128 requests and width 13, three times that with EAGLE-3's
  concatenated layers), while its other activations return to the pool the tiers share.

``execute`` is what SGLang's eager runner would have run for the compacted batch (``RaggedVerifyEagerRunner`` routes
ragged verify batches here): load the static buffers, plan, then capture the tier's forward the first time a step
needs it and replay it after (``graph_capture``: a CUDA graph on a GPU, a trace-checked eager replay on the CPU).
The replayed output is the capture's, refreshed in place; a shallow copy is returned, so a caller that replaces its
fields (``RaggedVerifyTarget`` scatters the rows back) leaves the captured one alone.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from .graph_capture import static_buffer
from .layout import RaggedLayout


def pad_requests(layout, slots: int):
    """``layout`` (a ``RaggedLayout``, or a ``PendingLayout`` before its read) over ``slots`` requests: the step's
    ``B``, then ``slots - B`` padding requests of no rows (their ``qo_indptr`` and ``mask_indptr`` entries repeat the
    last real one). Device ops only, no host read."""
    b = int(layout.counts.shape[0])
    if not 1 <= b <= slots:
        raise ValueError(f"a ragged verify of {b} requests does not fit {slots} request slots")
    if b == slots:
        return layout
    padded = getattr(layout, "slot_arrays", None)
    if padded is not None and padded[0].shape[0] == slots:     # the layout kernel padded them already
        return dataclasses.replace(layout, counts=padded[0], qo_indptr=padded[1], mask_indptr=padded[2])
    pad = slots - b
    return dataclasses.replace(
        layout,
        counts=torch.cat([layout.counts, layout.counts.new_zeros(pad)]),
        qo_indptr=torch.cat([layout.qo_indptr, layout.qo_indptr[-1:].expand(pad)]),
        mask_indptr=torch.cat([layout.mask_indptr, layout.mask_indptr[-1:].expand(pad)]))


def logits_buffer(model_runner, rows: int) -> torch.Tensor:
    """``[rows, vocab]`` float32, the one buffer every tier's logits are written to (``next_token_logits_buffer``):
    the process-wide one SGLang's graph runners share when it has one that large (``GraphSharedOutput``), else one of
    the runner's own. Without it each captured tier would keep its own logits output alive in the graph pool: at
    Llama-3.1-8B's vocabulary, 0.5 MiB per row of every tier."""
    vocab = int(model_runner.model_config.vocab_size)
    shared = getattr(model_runner, "graph_shared_output", None)
    if shared is not None and shared.max_rows >= rows:
        return shared.get_logits_buffer(vocab, rows=rows)
    return torch.zeros((rows, vocab), dtype=torch.float32, device=model_runner.device)


class RaggedVerifyGraphRunner:
    """One graph per token tier for the target's ragged verify forward (contract in the module docstring)."""

    def __init__(self, model_runner, backend, capture, on_step=None):
        buf = backend.ragged_buffers
        self.model_runner = model_runner
        self.backend = backend
        self.capture = capture
        #: called after each forward with whether it captured its tier's graph (``HybridCounters.on_ragged_graph``)
        self.on_step = on_step
        self.slots, self.max_rows = buf.max_bs, buf.max_rows
        dev = model_runner.device
        self.input_ids = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(self.slots, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(self.slots, dtype=torch.int64, device=dev)
        self.logits = logits_buffer(model_runner, self.max_rows)
        #: ``[max_rows, width]``: every tier's hidden states (``keep_hidden``), made at the first forward, whose output
        #: gives the width (the target's hidden size, or EAGLE-3's concatenated layers)
        self.hidden = None
        #: what ``load_ahead`` loaded for the step in flight: (its layout's counts, the layout padded to the slots,
        #: the host prefix lengths padded), taken by that step's ``_static_batch``
        self._ahead = None

    def load_ahead(self, fb, pending, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Before the step's read of its node counts (``layout.PendingLayout.read``), queue what ``execute`` would
        copy and plan that does not need the row count, while the device still runs the draft and the decision:
        every row the step can take (``input_ids``, ``positions`` and ``fb.out_cache_loc``, ``pending.rows_bound()``
        of each: the tier's spare rows zero and writing to the sink) into the static buffers, the requests' prefixes
        padded to the slots, and the attention plan's device half (``RaggedTritonAttnBackend.plan_ahead``). The
        step's ``execute`` finds them loaded and, after the read, launches nothing before the replay but what needs
        the rows. Why: on a GPU each launch after that read is host time with the device idle
        (``bench.ragged_sync_ops``)."""
        n, b = int(input_ids.shape[0]), int(pending.counts.shape[0])
        if n > self.max_rows or fb.out_cache_loc.shape[0] != n or positions.shape[0] != n:
            raise RuntimeError(f"ragged verify graphs: {n} rows loaded ahead (at most {self.max_rows}), with "
                               f"{positions.shape[0]} positions and {fb.out_cache_loc.shape[0]} KV write slots")
        for dst, src in ((self.input_ids, input_ids), (self.positions, positions),
                         (self.out_cache_loc, fb.out_cache_loc)):
            if src.data_ptr() != dst.data_ptr():        # not compacted into the buffer already (compact_ahead's out)
                dst[:n].copy_(src)
        seq_lens_cpu = self._load_requests(fb, b)
        padded = pad_requests(pending, self.slots)
        self.backend.plan_ahead(fb.kv_loc_plan, self.slots, self.seq_lens, self.req_pool_indices, padded)
        self._ahead = (pending.counts, padded, seq_lens_cpu)

    def _load_requests(self, fb, b: int):
        """The step's ``b`` requests' prefix lengths and pool rows into the static buffers, the slots past them
        zero; returns the host prefix lengths padded alike (None where the batch has none)."""
        for dst, src in ((self.seq_lens, fb.seq_lens), (self.req_pool_indices, fb.req_pool_indices)):
            dst[:b].copy_(src)
            dst[b:].zero_()
        if fb.seq_lens_cpu is None:
            return None
        return torch.cat([fb.seq_lens_cpu, fb.seq_lens_cpu.new_zeros(self.slots - b)])

    def _static_batch(self, fb, layout: RaggedLayout):
        """The batch the tier's forward reads: ``fb`` with its tensors in the static buffers, padded to the slots
        (loaded by ``load_ahead`` when it ran for this step's layout, else here), and whether ``load_ahead`` loaded
        it (then the attention plan's device half is queued too)."""
        rows, b = layout.rows, layout.batch_size
        if fb.input_ids.shape[0] != rows:
            raise RuntimeError(f"ragged verify graphs: the batch holds {fb.input_ids.shape[0]} tokens, its layout "
                               f"{rows} rows (not compacted by RaggedVerifyTarget)")
        if fb.input_embeds is not None or fb.mrope_positions is not None:
            raise RuntimeError("ragged verify graphs take token ids and 1-D positions only (input_embeds or mrope "
                               "positions given); run with HYBRID setting ragged_verify=off")
        if rows > self.max_rows:
            raise RuntimeError(f"ragged verify graphs: a step of {rows} rows exceeds the {self.max_rows} sized at "
                               "start")
        ahead, self._ahead = self._ahead, None
        spec = copy.copy(fb.spec_info)
        loaded = ahead is not None and ahead[0] is layout.counts
        if loaded:
            _, padded, seq_lens_cpu = ahead
            spec.ragged = dataclasses.replace(layout, counts=padded.counts, qo_indptr=padded.qo_indptr,
                                              mask_indptr=padded.mask_indptr)
        else:
            for dst, src in ((self.input_ids, fb.input_ids), (self.positions, fb.positions),
                             (self.out_cache_loc, fb.out_cache_loc)):
                dst[:rows].copy_(src)
            seq_lens_cpu = self._load_requests(fb, b)
            spec.ragged = pad_requests(layout, self.slots)
        static = dataclasses.replace(
            fb, batch_size=self.slots, input_ids=self.input_ids[:rows], positions=self.positions[:rows],
            seq_lens=self.seq_lens, orig_seq_lens=self.seq_lens, req_pool_indices=self.req_pool_indices,
            seq_lens_cpu=seq_lens_cpu, spec_info=spec, next_token_logits_buffer=self.logits[:rows])
        fb.kv_loc_plan.bind_replay(static, self.model_runner.kv_index_translator,
                                   slots=self.out_cache_loc[:rows])
        return static, loaded

    def keep_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` (a forward's ``[rows, width]`` hidden states) copied to the runner's one buffer; returns the copy.
        The buffer is made by the first call, a warm-up forward on a GPU (``CudaGraphCapture`` warms up before it
        records), so no graph allocates it, and on the CPU outside the trace and recorded as external to it
        (``graph_capture.static_buffer``): a buffer made once, which every capture and replay then finds at the same
        address, as one made at start would be."""
        if self.hidden is None:
            self.hidden = static_buffer(lambda: torch.empty((self.max_rows, *hidden.shape[1:]), dtype=hidden.dtype,
                                                            device=hidden.device))
        if hidden.shape[1:] != self.hidden.shape[1:] or hidden.dtype != self.hidden.dtype:
            raise RuntimeError(f"ragged verify graphs: hidden states of {tuple(hidden.shape[1:])} {hidden.dtype}, the "
                               f"buffer holds {tuple(self.hidden.shape[1:])} {self.hidden.dtype}")
        kept = self.hidden[: hidden.shape[0]]
        kept.copy_(hidden)
        return kept

    def execute(self, fb):
        """The verify forward of the compacted batch ``fb`` (``fb.spec_info.ragged`` set): its logits output, rows as
        the layout's."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode

        layout = fb.spec_info.ragged
        if self.model_runner.attn_backend is not self.backend:
            raise RuntimeError("ragged verify graphs: the target's attention backend is not the one they were "
                               "built for")
        static, loaded = self._static_batch(fb, layout)
        if loaded:
            self.backend.finish_plan_ahead(static)
        else:
            self.backend.init_forward_metadata(static)
        captured = layout.rows not in self.capture
        model, backend = self.model_runner.model, self.backend

        def forward():
            # used only by the tier's capture: its replays rerun the captured closure (over the capture's static
            # batch, the same buffers), as its graph does
            with forward_context(ForwardContext(attn_backend=backend), forward_batch=static):
                out = model.forward(static.input_ids, static.positions, static)
            if out.hidden_states is not None:
                out.hidden_states = self.keep_hidden(out.hidden_states)
            return out

        # SGLang's capture mode (model code takes its graph-safe branches, dispose_tensor is off) around the capture
        # and every replay: a CUDA graph replays what its capture recorded, and the CPU's traced replay reruns it
        with model_capture_mode():
            out = copy.copy(self.capture.run(layout.rows, forward))
        if self.on_step is not None:
            self.on_step(captured)
        return out


class RaggedVerifyEagerRunner:
    """SGLang's ``EagerRunner`` (``model_runner.eager_runner``), except that a ragged verify batch runs through the
    graph runner. SGLang's model runner hands a verify forward to its eager runner whenever no CUDA graph of its own
    runs it (``ModelRunner._forward_raw``): on the CPU engine, and under ragged verify, for which SGLang captures no
    target verify graphs (``HybridWorkerV2._skip_target_verify_capture``), or the worker drops those it captured
    (``HybridWorkerV2._drop_target_verify_graphs``); every other batch, and every other
    attribute, is the real eager runner's."""

    def __init__(self, eager, graphs: RaggedVerifyGraphRunner):
        self._eager = eager
        self.graphs = graphs

    def __getattr__(self, name):
        return getattr(self._eager, name)

    def execute(self, forward_batch, pp_proxy_tensors=None, **kwargs):
        ragged = getattr(getattr(forward_batch, "spec_info", None), "ragged", None)
        if ragged is None or pp_proxy_tensors is not None or not forward_batch.forward_mode.is_target_verify():
            return self._eager.execute(forward_batch, pp_proxy_tensors=pp_proxy_tensors, **kwargs)
        with self._eager.model_context():
            return self.graphs.execute(forward_batch)


__all__ = ["RaggedVerifyEagerRunner", "RaggedVerifyGraphRunner", "logits_buffer", "pad_requests"]
