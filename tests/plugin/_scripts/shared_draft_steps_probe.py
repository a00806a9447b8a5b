"""SGLang's multi-step draft backends (Triton and FlashInfer) run on the CPU with a depth's view of the start-up
depth's buffers (``sglang_hybrid.sglang_plugin.shared_draft_steps``), SGLang's KV index kernel under Triton's
interpreter, for ``tests/plugin/test_shared_draft_steps.py``:

    TRITON_INTERPRET=1 python -m tests.plugin._scripts.shared_draft_steps_probe

Prints ``RESULT`` and one JSON object: the storages, shapes and written rows of the views against backends of their
own, and the refusals' messages.
"""
import json


def probe() -> dict:
    import torch
    import sglang.srt.layers.attention.triton_backend as tb
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTable
    from sglang_hybrid.sglang_plugin.shared_draft_steps import SharedDraftSteps, shallower_backend
    from tests.helpers.sglang_backends_on_cpu import flashinfer_module, flashinfer_multi_step, triton_step

    M, C, NH, SPLITS, HD, SMS, POOL = 6, 64, 4, 8, 16, 3, 8      # max_bs, context, heads, kv splits, head dim, SMs
    req_to_token = torch.arange(POOL * C, dtype=torch.int32).reshape(POOL, C) * 7 % 1009

    class Passthrough:
        """SGLang's ``KVIndexTranslator`` on a static pool: reads stay the ``req_to_token`` rows."""
        def read_source(self, plan, *, req_pool_indices, bs, kind=None):
            return KVIndexTable(ids=req_to_token, row_ids=req_pool_indices, row_stride=req_to_token.stride(0),
                                entry_page_size=1, is_translated=False)

    def step_backend():
        return triton_step(context=C, heads=NH, kv_splits=SPLITS, head_dim=HD, sms=SMS, width=5)

    def multi_step(steps):
        ms = tb.TritonMultiStepDraftBackend.__new__(tb.TritonMultiStepDraftBackend)
        ms.topk, ms.speculative_num_steps, ms.max_context_len, ms.device = 1, steps, C, "cpu"
        ms.kv_indptr = torch.zeros((steps, POOL + 1), dtype=torch.int32)
        ms.attn_backends = [step_backend() for _ in range(steps - 1)]
        ms.window_rail, ms.window_kv_indptr, ms.cuda_graph_window_kv_indices = False, None, None
        ms.kv_index_translator, ms.page_size, ms.draft_window_size, ms.draft_sink_size = Passthrough(), 1, 0, 0
        return ms

    def tensors(obj):
        out = []
        for v in vars(obj).values():
            out += [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, torch.Tensor)]
        return out

    def storages(objs):
        return {t.untyped_storage().data_ptr() for o in objs for t in tensors(o)}

    def batch(lens):
        seq = torch.tensor(lens, dtype=torch.int64)
        return type("Batch", (), dict(batch_size=len(lens), seq_lens_sum=int(seq.sum()), kv_loc_plan=None,
                                      req_pool_indices=torch.arange(len(lens), dtype=torch.int64) + 2,
                                      seq_lens=seq, positions=seq.clone(), spec_info=None))()

    out = {}
    start = multi_step(4)
    def refuse():
        raise AssertionError("a Triton view is made, not built")
    out["chosen"] = [type(shallower_backend(start, 2, 1, refuse)).__name__,
                     shallower_backend(start, 2, 2, lambda: "built at top-k 2")]
    start.init_cuda_graph_state(M, M)
    owned = storages([start, *start.attn_backends])
    view = SharedDraftSteps(start, 2)
    view.init_cuda_graph_state(M, M)
    out["new_storages"] = len(storages([view, *view.attn_backends]) - owned)
    out["steps"] = [view.speculative_num_steps, len(view.attn_backends),
                    view.attn_backends[0] is start.attn_backends[0]]
    out["shapes"] = [list(view.kv_indptr.shape), list(view.cuda_graph_kv_indices.shape)]

    # the start-up depth leaves its rows dirty; then the view and a depth-2 backend of its own take the same batch
    start.init_forward_metadata_out_graph(batch([40, 3, 17, 9, 22, 5]))
    own = multi_step(2)
    own.init_cuda_graph_state(M, M)
    fb = batch([11, 30, 2, 25])
    view.init_forward_metadata_out_graph(fb)
    own.init_forward_metadata_out_graph(fb)
    bs = fb.batch_size
    used = [int(own.kv_indptr[i, bs]) for i in range(2)]
    out["used"] = used
    out["indptr_equal"] = torch.equal(view.kv_indptr[:, :bs + 1], own.kv_indptr[:, :bs + 1])
    out["indices_equal"] = all(torch.equal(view.cuda_graph_kv_indices[i, :used[i]],
                                           own.cuda_graph_kv_indices[i, :used[i]]) for i in range(2))
    out["splits_equal"] = torch.equal(view.cuda_graph_num_kv_splits[:bs], own.cuda_graph_num_kv_splits[:bs])
    out["written_in_start"] = torch.equal(start.kv_indptr[:2, :bs + 1], own.kv_indptr[:, :bs + 1])
    # the step-0 KV indices: each request's prefix, then its one draft slot
    first = torch.cat([torch.cat([req_to_token[r, :n], req_to_token[r, n:n + 1]]) for r, n in
                       zip(fb.req_pool_indices.tolist(), fb.seq_lens.tolist())])
    out["step0_is_prefix_plus_one"] = torch.equal(own.cuda_graph_kv_indices[0, :used[0]], first.to(torch.int64))

    # FlashInfer's (its constructors and wrappers need CUDA: SGLang's own methods with its literal device="cuda"
    # dropped)
    fb = flashinfer_module()
    def fi_multi(steps):
        return flashinfer_multi_step(fb, steps, max_bs=M, context=C)
    fstart = fi_multi(4)
    fstart.init_cuda_graph_state(M, M)
    fowned = storages([fstart, *fstart.attn_backends])
    fown = fi_multi(2)
    made = shallower_backend(fstart, 2, 1, lambda: fown)
    fowned |= storages([made, *made.attn_backends])          # what its constructor made (here, its step's indptr)
    made.init_cuda_graph_state(M, M)
    alone = fi_multi(2)
    alone.init_cuda_graph_state(M, M)
    out["flashinfer"] = {
        "class": type(made).__name__, "same_object": made is fown, "own_steps": made.attn_backends[0] is not
        fstart.attn_backends[0], "new_storages": len(storages([made, *made.attn_backends]) - fowned),
        "rows_shared": [made.attn_backends[0].cuda_graph_kv_indices[0].data_ptr()
                        == fstart.cuda_graph_kv_indices[0].data_ptr(),
                        made.cuda_graph_kv_indices.shape[0]],
        "alone_bytes": sum(t.untyped_storage().nbytes() for t in tensors(alone))}

    errors = {}
    for name, make in (("depth_1", lambda: SharedDraftSteps(start, 1)), ("depth_4", lambda: SharedDraftSteps(start, 4)),
                       ("no_graph_state", lambda: SharedDraftSteps(multi_step(4), 2).init_cuda_graph_state(M, M)),
                       ("larger", lambda: SharedDraftSteps(start, 3).init_cuda_graph_state(M + 1, M + 1)),
                       ("flashinfer_larger", lambda: shallower_backend(fstart, 3, 1, lambda: fi_multi(3))
                        .init_cuda_graph_state(M + 1, M + 1)),
                       ("flashinfer_other_class", lambda: shallower_backend(fstart, 2, 1, lambda: start))):
        try:
            make()
            errors[name] = None
        except (ValueError, RuntimeError, TypeError) as e:
            errors[name] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(probe()))
