"""SGLang's objects, and HYBRID's, counted tensor by tensor on the CPU, for ``tests/plugin/test_memory_budget.py``
(under Triton's interpreter, which must be on before Triton's import):

    TRITON_INTERPRET=1 python -m tests.plugin._scripts.memory_budget_probe H200_MIB

Prints one JSON object (the last line): the bytes SGLang's graph input buffers, shared logits buffer, FlashInfer and
Triton backends' graph states and HYBRID's ``HybridStep`` allocate at small shapes, SGLang's captured batch sizes,
and what the worker's start-up check logs, refuses and fits on a stand-in worker with SGLang's attribute layout
(``h200_mib``: the device memory it reports on CUDA).
"""
import json
import logging
import sys
import tempfile
import types


def probe(h200_mib: int) -> dict:
    import torch

    out = {}
    from sglang.srt.arg_groups.cuda_graph_hook import (generate_decode_cuda_graph_batch_sizes,
                                                       generate_prefill_cuda_graph_batch_sizes)
    spec = types.SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm="EAGLE")
    out["capture_bs"] = {m: generate_decode_cuda_graph_batch_sizes(spec, m) for m in (4, 8, 32, 48, 128, 200)}
    out["prefill_graph_sizes_8192"] = len(generate_prefill_cuda_graph_batch_sizes(8192))

    def storage_bytes(objs):
        seen = {}
        def walk(v):
            if isinstance(v, torch.Tensor):
                seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
            elif isinstance(v, (list, tuple)):
                for x in v:
                    walk(x)
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(getattr(v, "buffer", None), torch.Tensor):     # SGLang's VerifyMask
                walk(v.buffer)
        for o in objs:
            walk(o)
        return sum(seen.values())

    M, W, C, H, S = 6, 5, 64, 48, 3           # max_bs, width, context, hidden, draft steps
    import sglang.srt.model_executor.runner_utils.buffers as bm
    bm.enable_num_token_non_padded = lambda: False      # expert parallelism only; reads the unpublished parallel config
    buf = bm.DecodeInputBuffers.create(
        device="cpu", max_bs=M, max_num_token=M * W, hidden_size=H, next_token_logits_buffer=torch.zeros(1),
        dtype=torch.bfloat16, num_dp_ranks=1, pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False,
        seq_len_fill_value=1, encoder_len_fill_value=0, num_tokens_per_req=W, cache_loc_dtype=torch.int64,
        enable_mamba_track=False)
    out["verify_input_buffers"] = storage_bytes([v for k, v in vars(buf).items()
                                                 if k not in ("next_token_logits_buffer", "seq_lens_cpu")])
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
    g = GraphSharedOutput(device="cpu", max_rows=M * W)
    out["logits"] = storage_bytes([g.get_logits_buffer(100, rows=M), g.get_logits_buffer(40, rows=M * W)])

    # FlashInfer's graph state on the CPU: SGLang's own method, its literal device="cuda" dropped
    from tests.helpers.sglang_backends_on_cpu import (flashinfer_module, flashinfer_multi_step, flashinfer_step,
                                                      triton_step)
    fb = flashinfer_module()
    def graph_state(b, *a, **k):
        before = set(vars(b))
        b.init_cuda_graph_state(*a, **k)
        return storage_bytes([v for key, v in vars(b).items() if key not in before])
    out["flashinfer_graph_state"] = graph_state(flashinfer_step(fb, max_bs=M, context=C, skip_prefill=False), M, M * W)
    ms = flashinfer_multi_step(fb, S, max_bs=M, context=C)
    ms.init_cuda_graph_state(M, M)
    out["flashinfer_draft_graph_state"] = storage_bytes([ms.cuda_graph_kv_indices] + [
        [v for k, v in vars(x).items() if k.startswith("cuda_graph")] for x in ms.attn_backends])

    # Triton's, with the FULL_MASK verify layout SGLang picks on a GPU
    import sglang.srt.layers.attention.verify_mask as vm
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    vm.default_tree_mask_mode = lambda: TreeMaskMode.FULL_MASK
    import sglang.srt.layers.attention.triton_backend as tb
    NH, SPLITS, HD, SMS = 4, 8, 16, 3
    def tri(skip_prefill, draft):
        return triton_step(context=C, heads=NH, kv_splits=SPLITS, head_dim=HD, sms=SMS, width=W,
                           skip_prefill=skip_prefill, draft=draft)
    out["triton_verify_graph_state"] = graph_state(tri(False, False), M, M * W)
    out["triton_extend_graph_state"] = graph_state(tri(False, True), M, M * W)
    tms = tb.TritonMultiStepDraftBackend.__new__(tb.TritonMultiStepDraftBackend)
    tms.topk, tms.max_context_len, tms.speculative_num_steps, tms.device, tms.window_rail = 1, C, S, "cpu", False
    tms.attn_backends = [tri(True, True) for _ in range(S - 1)]
    out["triton_draft_graph_state"] = graph_state(tms, M, M) + storage_bytes([
        [v for k, v in vars(x).items() if k.startswith("cuda_graph") and k not in ("cuda_graph_kv_indices",
                                                                                     "cuda_graph_num_kv_splits")]
        for x in tms.attn_backends])

    # HYBRID's HybridStep: fixed buffers, and the fused step's workspace after one step at its widest
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep
    from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode as HybridMask, build_verify_input
    tmp = tempfile.mkdtemp()
    CostModel.linear(0.01, 1e-4).save(tmp + "/c.json")
    CostModel.linear(1e-3, 1e-5).save(tmp + "/d.json")
    st = HybridStep(HybridSettings(mode="merge", ngram_k=3, cost_table=tmp + "/c.json",
                                   draft_cost_table=tmp + "/d.json", model_bias_eta=0.1, ngram_bias_eta=0.3,
                                   eagle_alternatives=2, log_interval=0),
                    num_steps=3, pool_size=4, device="cpu", max_context_len=32)
    first = st.first_alternatives                # position 0's, per slot
    out["hybrid_fixed"] = storage_bytes([list(st.buffers), list(st.context), st._chain, st.model_bias,
                                         st.model_bias_gen, st.ngram_bias, st.ngram_bias_gen, first.probs,
                                         first.tokens, first.gen])
    b = 3
    slots, seq, gen = torch.arange(b), torch.full((b,), 10), torch.zeros(b, dtype=torch.int64)
    pw = st.proposal_width
    alignment.publish(st.buffers, slots, torch.randint(0, 9, (b, pw)), torch.full((b,), pw), seq + 1, gen,
                      torch.full((b, pw), 9), torch.full((b, pw), 2), torch.full((b, pw), 3),
                      torch.zeros((b, pw), dtype=torch.int64))
    width = st.n_nodes + 1
    chain = torch.randint(0, 9, (b, 3))
    alt = (chain[:, :, None] + torch.tensor([1, 2])) % 9                # distinct from the chain's token
    d = st.select(torch.randint(0, 9, (b,)), chain, torch.rand((b, 3)), slots, gen, seq, width=width,
                  alt_tokens=alt, alt_conf=torch.rand((b, 3, 2)))
    build_verify_input(d.tree, seq, num_steps=3, max_depth=st.max_depth_at(width), mask_mode=HybridMask.FULL_MASK,
                       seq_lens_sum=int(seq.sum()), fused=True, workspace=st.workspace)
    out["hybrid_workspace"] = st.workspace.nbytes
    out["hybrid_shape"] = {"pw": pw, "width": width, "k": st.k, "depths": len(st.depths), "b": b,
                           "seq_sum": int(seq.sum())}

    # the worker's entry point on a stand-in worker with SGLang's attribute layout
    from types import SimpleNamespace as NS
    from sglang_hybrid.sglang_plugin import memory_budget as mb

    class FlashInferAttnBackend:
        pass
    def runner(layers, spec_eagle3, device):
        mc = NS(hidden_size=4096, num_hidden_layers=layers, num_attention_heads=32, get_num_kv_heads=lambda tp: 8,
                head_dim=128, vocab_size=128256, dtype=torch.bfloat16, context_len=131072, spec_hidden_size=4096,
                hf_config=NS(draft_vocab_size=32000, intermediate_size=14336))
        return NS(model_config=mc, model=torch.nn.Linear(4, 4), spec_algorithm=NS(is_eagle3=lambda: spec_eagle3),
                  attn_backend=FlashInferAttnBackend(), max_total_num_tokens=800_000, device=device,
                  decode_cuda_graph_runner=NS(capture_bs=out["capture_bs"][128]))
    def worker(device):
        step = HybridStep(HybridSettings(log_interval=0, decision_kernels="torch"), num_steps=4, pool_size=2,
                          device="cpu")
        step.context = NS(tokens=NS(shape=(128, 131090)))
        return NS(target_worker=NS(model_runner=runner(32, False, device)),
                  _draft_worker=NS(draft_runner=runner(1, True, device), hot_token_id=None),
                  req_to_token_pool=NS(req_to_token=NS(shape=(128, 131089))), topk=1, device=device, gpu_id=0,
                  server_args=NS(tp_size=1, pp_size=1, mem_fraction_static=0.905, chunked_prefill_size=8192),
                  hybrid_step=step,
                  speculative_num_steps=4, speculative_num_draft_tokens=13, settings=HybridSettings())
    states = [(d, w) for d in (1, 2, 3, 4) for w in (2, 4, 6, 7, 8, 13)]
    lines = []
    class Catch(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    mb.logger.addHandler(Catch())
    mb.logger.setLevel(logging.INFO)
    cpu = mb.check_start(worker("cpu"), states)
    out["cpu"] = {"line": lines[-1], "states": len(cpu.states), "total": cpu.total}
    import sglang.srt.utils as su
    su.get_available_gpu_memory = lambda device, gpu_id: 8.0
    torch.cuda.get_device_properties = lambda i: NS(multi_processor_count=132, total_memory=h200_mib * 2**20)
    try:
        mb.check_start(worker("cuda"), states)
        out["cuda"] = {"raised": None}
    except mb.HybridMemoryError as e:
        out["cuda"] = {"raised": str(e), "line": lines[-1]}
    out["cuda_one_state"] = mb.check_start(worker("cuda"), [(4, 13)]).to_build
    # ragged verify on the Triton backend: the buffers its plan writes join HYBRID's own
    class TritonAttnBackend:
        pass
    w = worker("cpu")
    w.target_worker.model_runner.attn_backend = TritonAttnBackend()
    w.target_worker.model_runner.max_running_requests = 48
    dep = mb.deployment_of(w, 1)
    padded = mb._start_budget(w, dep, [(4, 13)])
    w._ragged = True
    ragged = mb._start_budget(w, dep, [(4, 13)])
    w.settings = HybridSettings(ragged_graphs=False)
    eager = mb._start_budget(w, dep, [(4, 13)])
    out["ragged_triton_extra"] = {"total": ragged.total - padded.total, "eager": eager.total - padded.total,
                                  "backend": dep.attention_backend, "graph_bs": dep.cuda_graph_bs,
                                  "verify_hidden": dep.draft_input_hidden,
                                  "sglang_verify_set": padded.items["verify"],
                                  "verify_with_tiers": ragged.items["verify"],
                                  "verify_eager": eager.items["verify"],
                                  "verify_set_formula": mb._verify_graphs(dep, 13),
                                  "verify_inputs": padded.items["input buffers"] - ragged.items["input buffers"],
                                  "verify_only_inputs": sum(
                                      k[1] * k[2] for k, owner in mb._input_buffers(dep, 4, 13).items()
                                      if owner == "verify")}
    # the default launch's width fit at start (a table measured at start: EAGLE's width 5 and the full tree 13
    # required, then 8, then 4), at 15, 9 and 7 GiB free: what it keeps, its log line, and what each would need
    fit = {}
    for gib in (15.0, 9.0, 7.0):
        su.get_available_gpu_memory = lambda device, gpu_id, g=gib: g
        w = worker("cuda")
        kept = mb.fit_widths_at_start(w, (4,), (5, 13), (8, 4))
        dep = mb.deployment_of(w, 1)
        need = {",".join(map(str, ws)): mb._start_budget(w, dep, [(4, x) for x in ws]).to_build
                for ws in ((5, 13), (5, 8, 13), (4, 5, 13), (4, 5, 8, 13))}
        act = mb.runtime_activation_reserve(dep, 13, 128, accept_width=w.hybrid_step.max_depth_at(13) + 1)
        fit[str(gib)] = {"kept": list(kept), "line": lines[-1], "need": need, "activations": act[0]}
    out["fit"] = fit
    out["reserve"] = mb.post_capture_reserve_bytes()
    return out


if __name__ == "__main__":
    print(json.dumps(probe(int(sys.argv[1]))))
