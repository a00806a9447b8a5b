"""The runtime activation reserve (``memory_budget.runtime_activation_reserve``): the sampled verify at the widest
width plus a chunked prefill, kept free before the default launch fits its widths at start.

What was RUN and what was READ:

(a) ``sampled_verify_reserve`` against SGLang's own sampling verify, RUN on the CPU: SGLang's ``eagle_sample`` (its
    sampling branch, opened on the CPU with ``sampling_verify_patches()``: temperature, top-k and top-p on) and then
    ``compute_spec_logprobs``, at 3 requests x width 5 x a 1,000-token vocabulary. A ``TorchDispatchMode`` records
    every full-vocabulary tensor SGLang's code makes (last dimension = vocab) and follows each one's storage until it
    is freed. The peak of live bytes equals the formula's logits + probability copies during the sampling, and its
    logits + logprob copies during the logprobs. Three parts are CUDA-only and do not run here: the tree kernel
    (SGLang's, in place), and FlashInfer's top-k / top-p renorms (FlashInfer is not installed on CPU machines). On the
    CPU the renorms are HYBRID's stand-ins, run with the recorder paused. Only the stand-in's returned tensor is
    counted, standing for FlashInfer's ``torch.empty_like(probs)`` output. The tree kernel stand-in counts nothing,
    as the kernel allocates nothing. Those three are READ: ``inspect.getsource`` asserts the lines the formula counts
    (the CUDA binding of the renorms to FlashInfer, the kernel without allocations, the temperature copy and
    ``torch.softmax`` of SGLang's softmax off sm 10.3, the float32 logits). FlashInfer's top-p workspace and its
    1 MiB top-k row states are checked against FlashInfer's own source only where FlashInfer is importable (a GPU
    machine); elsewhere that test is skipped.
    The chunked prefill reserve is READ only: SGLang's Llama layer, logits pruning and aux-state capture lines are
    asserted, and the formula is worked by hand at a small shape. No layer forward is run.
(b) ``fit_widths_at_start`` on a stand-in worker (SGLang's attribute layout, Llama-3.1-8B shapes, 128 requests): at
    7 GiB free it keeps 8 without the reserve and drops it with the reserve; the log line names the reserve.
(c) The issue's worked example: width 13 x 128 requests x vocabulary 128,256, float32: two 0.85 GB copies
    (``[1664, 128256]``) and more.
"""
from __future__ import annotations

import inspect
import logging
import types

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_hybrid.sglang_plugin import memory_budget as mb

pytestmark = pytest.mark.sglang
GiB, MiB = mb.GiB, mb.MiB
BS, N_NODES, VOCAB = 3, 4, 1000
W = N_NODES + 1


class FullVocabTensors(TorchDispatchMode):
    """Records each tensor an op makes whose last dimension is ``vocab`` (a full-vocabulary tensor) and the peak of
    their live bytes: each storage is followed with a weak reference, so a tensor counts until its storage is
    freed (views do not count again). ``paused`` stops the recording inside stand-ins of CUDA-only kernels;
    ``adopt`` counts a tensor made elsewhere (the logits, a stand-in's output)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.live: dict = {}
        self.made: list = []
        self.peak = 0
        self.paused = False

    def adopt(self, t: torch.Tensor, label: str) -> None:
        st = t.untyped_storage()
        old = self.live.get(st.data_ptr())
        if old is not None and not old[0].expired():
            return                                  # a view, or an in-place op's result: the same storage
        self.live[st.data_ptr()] = (StorageWeakRef(st), st.nbytes(), label)
        self.made.append((label, st.nbytes()))
        self.update()

    def update(self) -> None:
        self.live = {p: v for p, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, self.live_bytes())

    def live_bytes(self) -> int:
        return sum(v[1] for v in self.live.values() if not v[0].expired())

    def reset_peak(self) -> None:
        self.update()
        self.peak = self.live_bytes()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                    self.adopt(t, str(func))
            self.update()
        return out


def _as_kernel(fn, rec: FullVocabTensors, label: str):
    """A CPU stand-in run as the CUDA kernel it stands for: its own temporaries unrecorded, its returned tensor (the
    renorms' ``torch.empty_like(probs)`` output) counted; in-place ops return None and count nothing."""
    def run(*args, **kwargs):
        rec.paused = True
        try:
            out = fn(*args, **kwargs)
        finally:
            rec.paused = False
        if isinstance(out, torch.Tensor):
            rec.adopt(out, label)
        return out
    return run


def _small_batch():
    """HYBRID's merged trees at width 5 for 3 requests (n-gram and model chains folded where they agree), SGLang's
    verify input for them, and temperature / top-k / top-p sampling info."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from sglang_hybrid.selector import Candidates, Source, select
    from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input

    model = Candidates.chain(torch.tensor([[1, 2, 3, 4], [20, 21, 22, 23], [5, 6, 7, 8]]),
                             torch.tensor([[.9, .8, .3, .2], [.6, .5, .4, .3], [.5, .4, .2, .1]]),
                             torch.tensor([4, 4, 4]), Source.MODEL)
    ngram = Candidates.chain(torch.tensor([[1, 2, 9], [24, 25, 26], [40, 41, 42]]),
                             torch.tensor([[.95, .9, .85], [.5, .4, .3], [.3, .2, .1]]),
                             torch.tensor([3, 3, 3]), Source.NGRAM)
    tree = select(torch.tensor([100, 101, 102]), [model, ngram], 0.0, mode="merge", n_nodes=N_NODES)
    assert tree.tokens.shape == (BS, W)
    seq_lens = torch.full((BS,), 11, dtype=torch.int64)
    vi = build_verify_input(tree, seq_lens, num_steps=N_NODES, max_depth=N_NODES, mask_mode=TreeMaskMode.QLEN_ONLY)
    info = SamplingBatchInfo(
        temperatures=torch.full((BS, 1), 0.8), top_ps=torch.full((BS,), 0.9),
        top_ks=torch.full((BS,), 50, dtype=torch.int32), min_ps=torch.zeros(BS), is_all_greedy=False,
        is_any_greedy=False, need_top_p_sampling=True, need_top_k_sampling=True, need_min_p_sampling=False,
        vocab_size=VOCAB)
    return vi, seq_lens, info


def test_sampled_headroom_reserve_matches_sglang_sampling_verify_run_on_cpu(sampling_verify):
    """(a) RUN: SGLang's ``eagle_sample`` (sampling branch) and ``compute_spec_logprobs`` at 3 x 5 x 1,000. The
    full-vocabulary tensors SGLang makes are, in order, the temperature copy, the softmax, the top-k and top-p
    renorms' outputs (the stand-ins' results, FlashInfer's ``empty_like``), the zero draft probabilities and then the
    logprobs' gather, temperature copy and log-softmax. Live at once, beyond the logits: 2 ``[15, 1000]`` float32
    copies during the sampling (the formula's ``probability copies``), 3 ``[3 x 5, 1000]`` during the logprobs
    (accept width 5 = depth 4 + 1). Each phase's peak, and the total, equal the formula with
    ``logits_buffered=False`` (the logits tensor counted) less FlashInfer's CUDA-only buffers."""
    from sglang.srt.layers.logprob_processor import compute_spec_logprobs
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import eagle_utils

    vi, seq_lens, info = _small_batch()
    rows = BS * W
    rec = FullVocabTensors(VOCAB)
    for name in ("top_k_renorm_prob", "top_p_renorm_prob", "tree_speculative_sampling_target_only"):
        sampling_verify.setattr(eagle_utils, name, _as_kernel(getattr(eagle_utils, name), rec, name))
    batch = types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens, device="cpu",
                                  sampling_info=info, return_logprob=True, top_logprobs_nums=None,
                                  token_ids_logprobs=None)
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    out = types.SimpleNamespace(next_token_logits=logits)
    torch.manual_seed(0)
    with rec:
        rec.adopt(logits, "logits")
        predict, accept_lens, accept_index = eagle_utils.eagle_sample(vi, batch, out)
        sampling_peak = rec.peak
        rec.reset_peak()
        compute_spec_logprobs(batch, out, predict, accept_index=accept_index)
        logprob_peak = rec.peak
    accept_width = accept_index.shape[1]
    assert accept_width == W and out.next_token_logprobs.shape == (BS, accept_width)
    full = rows * VOCAB * 4
    labels = [label for label, _ in rec.made]
    assert labels[0] == "logits" and "div" in labels[1] and "softmax" in labels[2]
    assert labels[3:5] == ["top_k_renorm_prob", "top_p_renorm_prob"] and "zeros_like" in labels[5], labels
    assert len(labels) == 9 and "log_softmax" in labels[-1], labels       # gather, temperature copy, log-softmax
    assert all(n == full for _, n in rec.made[:6]), rec.made
    assert all(n == BS * accept_width * VOCAB * 4 for _, n in rec.made[6:]), rec.made

    total, items = mb.sampled_verify_reserve(W, BS, VOCAB, logits_buffered=False, accept_width=accept_width)
    assert items["logits"] == full and items["probability copies"] == 2 * full
    cuda_only = items["top-p workspace"] + items["top-k row states"]
    assert sampling_peak == items["logits"] + items["probability copies"] == 3 * full
    assert logprob_peak == items["logits"] + 3 * BS * accept_width * VOCAB * 4
    # the logprobs' third copy (60,000 B) is below FlashInfer's top-p workspace at this size (282,368 B: 2,048-bin
    # histograms per row): no logprob excess here; at the issue's size it is 0 too (test (c))
    assert items["logprob copies"] == max(0, logprob_peak - sampling_peak - items["top-p workspace"]) == 0
    assert max(sampling_peak + items["top-p workspace"], logprob_peak) == total - items["top-k row states"]
    # with graphs the logits are SGLang's shared buffer, counted in the budget: the reserve drops them
    buffered, b_items = mb.sampled_verify_reserve(W, BS, VOCAB, accept_width=accept_width)
    assert b_items["logits"] == 0 and buffered == total - full
    assert sampling_peak - full == b_items["probability copies"] and cuda_only == b_items["top-p workspace"] + MiB


def test_sampled_headroom_cuda_only_parts_read_from_sglang_source():
    """(a) READ: what the CPU run cannot run, asserted in SGLang's source. On CUDA the renorms are FlashInfer's
    (``renorm.py``). The tree kernel allocates nothing (``kernels/ops/speculative/sampling.py``). SGLang's softmax is
    ``logits / temperatures`` then ``torch.softmax`` except FlashInfer's on sm 10.3, which also returns a new tensor.
    ``eagle_sample`` chains softmax, top-k, top-p and ``zeros_like`` (one ``target_probs`` name, so each stage's
    input dies after its output is made) and deletes them. The verify logits are float32: cast into the shared graph
    buffer, or ``logits.float()``."""
    import sglang.kernels.cake_kernels.sampling as cake
    import sglang.kernels.ops.sampling as sampling
    import sglang.kernels.ops.sampling.renorm as renorm
    import sglang.kernels.ops.speculative.sampling as kernel
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
    from sglang.srt.speculative import eagle_utils

    src = inspect.getsource(renorm)
    assert 'top_k_renorm_prob = LazyImport("flashinfer.sampling", "top_k_renorm_probs")' in src
    assert 'top_p_renorm_prob = LazyImport("flashinfer.sampling", "top_p_renorm_probs")' in src
    body = inspect.getsource(kernel.tree_speculative_sampling_target_only)
    assert "module.sample(" in body and not any(s in body for s in ("torch.empty", "torch.zeros", "_like(", ".new_"))
    soft = inspect.getsource(sampling.softmax)
    assert "logits = logits / temperatures" in soft and "return torch.softmax(logits, dim=-1)" in soft
    assert "get_device_capability(device_index) == (10, 3)" in inspect.getsource(cake)
    es = inspect.getsource(eagle_utils.eagle_sample)
    order = ["target_probs = sampling_softmax(", "target_probs = top_k_renorm_prob(",
             "target_probs = top_p_renorm_prob(",
             "target_probs = target_probs.reshape(bs, verify_input.draft_token_num, -1)",
             "else torch.zeros_like(target_probs)", "sampling_fn(", "del ("]
    at = [es.index(s) for s in order]
    assert at == sorted(at), order
    copy = inspect.getsource(LogitsProcessor._copy_logits_to_buffer)
    assert "return cast_to_float32_logits(logits, logits_buffer)" in copy and "logits = logits.float()" in copy
    assert "dtype=torch.float" in inspect.getsource(GraphSharedOutput.get_logits_buffer)


def test_sampled_headroom_flashinfer_buffers_match_flashinfer_source():
    """(a) READ where FlashInfer is installed (a GPU machine; skipped on CPU machines): the top-p renorm's AIR
    workspace terms and the top-k renorm's 1 MiB row states, as ``flashinfer_top_p_workspace_bytes`` and
    ``FLASHINFER_TOPK_ROW_STATES_BYTES`` count them, and the renorms' ``torch.empty_like(probs)`` outputs."""
    fs = pytest.importorskip("flashinfer.sampling")
    src = inspect.getsource(fs)
    for term in ("counter_size = 384", "buf_len = max(align256(vocab_size // 32), 256)",
                 "hist_entry_size = 8 if is_deterministic else 4", "align256(hist_entry_size * 2048 * batch_size)",
                 "align256(4 * 2048 * batch_size)", "align256(4 * buf_len * batch_size)", "buffer_bytes = 1024 * 1024",
                 "renorm_probs = torch.empty_like(probs)"):
        assert term in src, term
    assert mb.FLASHINFER_TOPK_ROW_STATES_BYTES == 1024 * 1024


def test_sampled_headroom_workspace_and_chunked_prefill_by_hand():
    """The formulas worked by hand. FlashInfer's top-p workspace at 15 rows x 1,000: 5,760 B of counters (256-aligned
    to 5,888), 122,880 B of histogram, 122,880 B of count histogram, two 15 x 256-float buffers. The chunked prefill
    at a small Llama-like shape. C = 64 tokens, hidden 32, intermediate 96, 4 heads / 2 KV heads of 8, vocab 100,
    bf16, EAGLE-3's 3 x 32 kept hidden states, 5 requests. Residual, input and output: 3 x 64 x 32 x 2 B. The MLP's
    64 x 3 x 96 x 2 B beats the attention's 64 x (8 + 4) x 8 x 2 B. Kept hidden: 64 x 96 x 2 B. Logits: 5 x 100 x
    (2 + 4) B."""
    assert mb.flashinfer_top_p_workspace_bytes(15, 1000) == 5888 + 122880 + 122880 + 2 * 15360
    assert mb.flashinfer_top_p_workspace_bytes(15, 1000, deterministic=True) == 5888 + 2 * 122880 + 122880 + 30720
    t = mb.ModelShape(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, vocab=100, intermediate=96)
    total, items = mb.chunked_prefill_reserve(64, t, requests=5, kept_hidden=96)
    assert items == {"hidden states": 3 * 64 * 32 * 2, "layer intermediate": 64 * 3 * 96 * 2,
                     "draft hidden states": 64 * 96 * 2, "last-token logits": 5 * 100 * 6}
    assert total == sum(items.values())
    # no MLP size known (0): the attention's qkv and output stand
    _, no_mlp = mb.chunked_prefill_reserve(64, mb.ModelShape(32, 2, 4, 2, 8, 100), requests=500, kept_hidden=32)
    assert no_mlp["layer intermediate"] == 64 * (2 * 4 + 2 * 2) * 8 * 2
    assert no_mlp["last-token logits"] == 64 * 100 * 6                       # at most one per token of the chunk


def test_sampled_headroom_chunked_prefill_read_from_sglang_source():
    """READ: the lines the chunked prefill reserve counts. Llama's MLP keeps ``gate_up`` [C, 2I] while its
    SiluAndMul output [C, I] feeds ``down_proj``. The attention makes qkv and an output. EAGLE-3's captured aux
    hidden states are clones. A prefill without input logprobs keeps each request's last token for the logits.
    SGLang sizes its own activation slack by the chunked prefill size (1.5 MiB a token). Any batch the breakable
    prefill graphs cannot replay runs eager."""
    from sglang.srt.arg_groups import memory_hook
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner
    from sglang.srt.models import llama

    mlp = inspect.getsource(llama.LlamaMLP.forward)
    at = [mlp.index(s) for s in ("gate_up, _ = self.gate_up_proj(x)", "x = self.act_fn(gate_up)",
                                 "x, _ = self.down_proj(x)")]
    assert at == sorted(at)
    assert "qkv, _ = self.qkv_proj(hidden_states)" in inspect.getsource(llama.LlamaAttention.forward_prepare_native)
    attn = inspect.getsource(llama.LlamaAttention.forward)
    assert "attn_output = self.attn(q, k, v, forward_batch)" in attn and "output, _ = self.o_proj(attn_output)" in attn
    assert "hidden.clone()" in inspect.getsource(AuxHiddenStateList.capture)
    pruned = inspect.getsource(LogitsProcessor._get_pruned_states)
    assert "last_index = torch.cumsum(logits_metadata.extend_seq_lens, dim=0) - 1" in pruned
    assert "pruned_states = hidden_states[last_index]" in pruned
    hook = inspect.getsource(memory_hook)
    assert "activation_tokens = max(cfg.chunked_prefill_size, 2048)" in hook
    assert "reserved_mem += activation_tokens * 1.5" in hook
    replay = inspect.getsource(PrefillCudaGraphRunner.can_replay_locally)
    assert "if input_embeds is not None:\n            return False" in replay


def _stand_in_worker(device: str):
    """A worker with SGLang's attribute layout: Llama-3.1-8B shapes (intermediate 14,336), an EAGLE-3 head, 128
    requests, a 131,072 context, FlashInfer, SGLang's 35 captured batch sizes up to 128, 8,192-token chunked prefill,
    HYBRID's step at 4 EAGLE steps (full width 13)."""
    from types import SimpleNamespace as NS

    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    class FlashInferAttnBackend:
        pass

    capture = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 129, 8)]

    def runner(layers, spec_eagle3):
        mc = NS(hidden_size=4096, num_hidden_layers=layers, num_attention_heads=32, get_num_kv_heads=lambda tp: 8,
                head_dim=128, vocab_size=128256, dtype=torch.bfloat16, context_len=131072, spec_hidden_size=4096,
                hf_config=NS(draft_vocab_size=32000, intermediate_size=14336))
        return NS(model_config=mc, model=torch.nn.Linear(4, 4), spec_algorithm=NS(is_eagle3=lambda: spec_eagle3),
                  attn_backend=FlashInferAttnBackend(), max_total_num_tokens=800_000, device=device,
                  decode_cuda_graph_runner=NS(capture_bs=capture), max_running_requests=128)

    step = HybridStep(HybridSettings(log_interval=0, decision_kernels="torch"), num_steps=4, pool_size=2,
                      device="cpu")
    step.context = NS(tokens=NS(shape=(128, 131090)))
    return NS(target_worker=NS(model_runner=runner(32, False)),
              _draft_worker=NS(draft_runner=runner(1, True), hot_token_id=None),
              req_to_token_pool=NS(req_to_token=NS(shape=(129, 131089))), topk=1, device=device, gpu_id=0,
              server_args=NS(tp_size=1, pp_size=1, mem_fraction_static=0.905, chunked_prefill_size=8192),
              hybrid_step=step, speculative_num_steps=4, speculative_num_draft_tokens=13,
              settings=HybridSettings())


def test_sampled_headroom_fit_keeps_fewer_widths_with_the_reserve(monkeypatch, caplog):
    """(b) ``fit_widths_at_start`` at 7 GiB free (EAGLE's width 5 and the full tree 13 required, extras 8 then 4,
    one depth). Without the activation reserve it keeps 8: the parts to build plus SGLang's runtime reserve fit.
    With it, the sampled verify at 13 x 128 and the 8,192-token chunked prefill, 2.79 GiB, 8 no longer fits and only
    the required widths stay. The log line names the reserve and its parts."""
    import sglang.srt.utils as su

    monkeypatch.setattr(su, "get_available_gpu_memory", lambda device, gpu_id, **kw: 7.0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(multi_processor_count=132, total_memory=143771 * MiB))
    worker = _stand_in_worker("cuda")
    dep = mb.deployment_of(worker, 1)
    assert dep.chunked_prefill_tokens == 8192 and dep.target.intermediate == 14336
    act, items = mb.runtime_activation_reserve(dep, 13, 128, accept_width=worker.hybrid_step.max_depth_at(13) + 1)
    assert round(act / GiB, 2) == 2.79 and items["sampled verify: logits"] == 0      # graphs up to 128: buffered
    reserve = mb.post_capture_reserve_bytes()
    need = {ws: mb._start_budget(worker, dep, [(4, w) for w in ws]).to_build + reserve
            for ws in ((5, 13), (5, 8, 13))}
    assert need[(5, 8, 13)] <= 7 * GiB < need[(5, 8, 13)] + act                     # 8 fits only without it

    with caplog.at_level(logging.INFO, logger=mb.logger.name):
        with_reserve = mb.fit_widths_at_start(worker, (4,), (5, 13), (8, 4))
    line = caplog.records[-1].getMessage()
    monkeypatch.setattr(mb, "runtime_activation_reserve", lambda *a, **k: (0, {}))
    without = mb.fit_widths_at_start(worker, (4,), (5, 13), (8, 4))
    assert without == (5, 8, 13) and with_reserve == (5, 13)
    assert "with 1.62 GiB kept for the runtime and 2.79 GiB for its activations at width 13 x 128 requests" in line
    assert "sampled verify 1.67 GiB (probability copies 1.59 GiB, top-p workspace 0.08 GiB" in line
    assert "chunked prefill 1.12 GiB (hidden states 0.19 GiB, layer intermediate 0.66 GiB" in line
    assert "left out: 8 (would need" in line and "4 (would need" in line


def test_sampled_headroom_issue_example():
    """(c) The issue's example: a sampled verify at width 13 and 128 requests over Llama-3's 128,256-token vocabulary
    in float32 allocates copies of ``[1664, 128256]`` float32, 0.85 GB each. At least two are alive at once,
    1.71 GB, plus FlashInfer's top-p workspace (82 MB). 1.67 GiB in all, the logits in SGLang's shared graph buffer.
    The logprobs at the deepest path (8 + 1) stay below that peak; on a chain they do not, and count."""
    total, items = mb.sampled_verify_reserve(13, 128, 128256, accept_width=9)
    copy = 1664 * 128256 * 4
    assert round(copy / 1e9, 2) == 0.85
    assert items["probability copies"] == 2 * copy >= 2 * 0.85e9
    assert total >= 2 * 0.85e9 and round(total / GiB, 2) == 1.67
    assert items["top-p workspace"] == 82_427_904 and items["logprob copies"] == 0 and items["logits"] == 0
    eager, e_items = mb.sampled_verify_reserve(13, 128, 128256, accept_width=9, logits_buffered=False)
    assert e_items["logits"] == copy and eager - total == copy        # without graphs the logits are a third copy
    # a chain (plain EAGLE's width 5, every node on the path): the logprobs' three copies exceed the sampling's two
    # and the workspace, and the excess is counted
    chain, c_items = mb.sampled_verify_reserve(5, 128, 128256, accept_width=5)
    one = 128 * 5 * 128256 * 4
    assert c_items["logprob copies"] == one - c_items["top-p workspace"] > 0
    assert chain == 3 * one + c_items["top-k row states"]


def test_sampled_headroom_bench_prints_the_reserve(capsys):
    """``python -m bench.memory_budget`` prints the reserve per batch with its breakdown (GiB). At 128 requests:
    sampled verify 1.67 (two copies 1.59, top-p workspace 0.08), chunked prefill 1.12 (hidden states 0.19, layer
    intermediate 0.66, draft hidden states 0.19, last-token logits 0.09), 2.79 in all. It also prints the default
    launch's widths without and with the reserve: at 128 x 131,072 the worker's fit keeps only 5 and 13 where the
    fit without the reserve (the replay's) keeps 4, 5, 8 and 13."""
    from bench import memory_budget as BM

    assert BM.main([]) == 0
    out = capsys.readouterr().out
    assert "Runtime activation reserve the worker keeps free before fitting widths at start" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("4", "32", "128") and "=" in line.split()}
    assert rows["128"] == ["128", "1.67", "=", "1.59", "0.08", "0.00", "0.00", "0.00",
                           "1.12", "=", "0.19", "0.66", "0.19", "0.09", "2.79"], rows["128"]
    assert rows["4"][-1] == "1.09" and rows["32"][-1] == "1.47"
    widths = [line.split() for line in out.splitlines() if line.split()[1:2] == ["x"] and line.split()[0].isdigit()]
    assert len(widths) == len(BM.BATCHES) * len(BM.CONTEXTS)
    assert ["128", "x", "131,072", "4,5,8,13", "5,13"] in widths
    assert all(w[3] == "4,5,8,13" for w in widths)
