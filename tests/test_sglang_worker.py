"""``HybridWorkerV2`` / ``HybridDraftWorker`` glue on CPU.

Constructing the workers loads models and needs a GPU, so these tests build instances without ``__init__`` and set
the attributes SGLang would, then run our overrides. Where the body of an SGLang method (target forward, draft
forward) would run, the test substitutes a stand-in that follows that method's output contract, stated at each
substitution; everything of ours around it runs for real: publishing, selection, verify-input building, the verify
call's arguments, the confidence capture, recording of emitted tokens, two consecutive steps.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.speculative.eagle_worker_v2", reason="sglang is not installed (scripts/setup.sh installs it)")

import sglang.srt.speculative.base_spec_worker as base_spec_worker  # noqa: E402
import sglang.srt.speculative.eagle_worker_v2 as eagle_v2  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402

from sglang_hybrid.sglang_plugin import worker as hw  # noqa: E402
from sglang_hybrid.sglang_plugin.config import HybridSettings  # noqa: E402
from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep  # noqa: E402
from sglang_hybrid.sglang_plugin.metrics import HybridCounters  # noqa: E402
from sglang_hybrid.sglang_plugin.ngram_host import NgramFeeder  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import HybridVerifyInput, TreeMaskMode  # noqa: E402
from sglang_hybrid.verify import greedy_accept  # noqa: E402

from test_sglang_alignment import FakeDrafter, _req  # noqa: E402

pytestmark = pytest.mark.sglang
STEPS, K = 3, 4


def test_draft_worker_class_swap_is_scoped():
    original = eagle_v2.EagleDraftWorker
    with hw._draft_worker_class(hw.HybridDraftWorker):
        assert eagle_v2.EagleDraftWorker is hw.HybridDraftWorker
    assert eagle_v2.EagleDraftWorker is original
    with pytest.raises(RuntimeError):
        with hw._draft_worker_class(hw.HybridDraftWorker):
            raise RuntimeError("constructor failed")
    assert eagle_v2.EagleDraftWorker is original


def test_chain_buffers_for_a_wider_verify(monkeypatch):
    monkeypatch.setattr(base_spec_worker, "get_exec", lambda: SimpleNamespace(graph=SimpleNamespace(
        cuda_graph_config=None)))
    monkeypatch.setattr(base_spec_worker, "get_schedule", lambda: SimpleNamespace(max_running_requests=6))
    w = object.__new__(hw.HybridDraftWorker)
    w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = 1, STEPS, STEPS + K + 1
    w.server_args, w.device = None, "cpu"
    w._rebuild_topk1_chain_buffers()        # SGLang's version asserts num_draft_tokens == num_steps + 1
    assert w.speculative_num_draft_tokens == STEPS + K + 1
    assert w._topk1_parents_prealloc.shape == (6, STEPS) and w._topk1_score_indices_prealloc.shape == (6, STEPS)


def test_confidence_capture(monkeypatch):
    w = object.__new__(hw.HybridDraftWorker)
    w.speculative_num_steps = STEPS
    w.step_conf = torch.ones(4, STEPS)
    w._conf_col, w._extend_capture = None, None
    logits = [torch.randn(2, 16) for _ in range(STEPS - 1)]

    def base_draft_forward(self, forward_batch):
        # Stand-in for EagleDraftWorker.draft_forward: steps 1..S-1 each run one draft_runner.forward.
        for lg in logits:
            self._record(SimpleNamespace(next_token_logits=lg))
        return "draft-result"

    monkeypatch.setattr(eagle_v2.EagleDraftWorker, "draft_forward", base_draft_forward)
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False),
                         spec_info=SimpleNamespace(topk_p=torch.tensor([[0.3], [0.8]])))
    assert w.draft_forward(fb) == "draft-result"
    assert w.step_conf[:2, 0].tolist() == pytest.approx([0.3, 0.8])
    for j, lg in enumerate(logits, 1):
        assert torch.allclose(w.step_conf[:2, j], torch.softmax(lg, -1).amax(-1))
    assert w._conf_col is None
    w._record(SimpleNamespace(next_token_logits=torch.zeros(2, 16)))     # outside draft_forward: ignored
    assert torch.allclose(w.step_conf[:2, 1], torch.softmax(logits[0], -1).amax(-1))


def test_extend_confidence_replaces_constant_one(monkeypatch):
    w = object.__new__(hw.HybridDraftWorker)
    w.speculative_num_steps = STEPS
    w._conf_col, w._extend_capture = None, None
    w.cuda_graph_runner_for_draft_extend = None
    logits = torch.randn(2, 16)
    idx = logits.argmax(-1, keepdim=True)

    def base_extend(self, batch, batch_result, *, kv_loc_plan=None):
        # Stand-in for EagleDraftWorker._draft_extend_for_decode with topk=1: draft_runner.forward, row selection,
        # then topk_p = 1.0 and topk_index = argmax on next_draft_input.
        out = SimpleNamespace(next_token_logits=torch.cat([torch.randn(3, 16), logits]))
        self._record(out)
        out.next_token_logits = out.next_token_logits[3:]
        batch_result.next_draft_input.topk_p = torch.ones(2, 1)
        batch_result.next_draft_input.topk_index = idx

    monkeypatch.setattr(eagle_v2.EagleDraftWorker, "_draft_extend_for_decode", base_extend)
    res = SimpleNamespace(next_draft_input=SimpleNamespace(topk_p=None, topk_index=None))
    w._draft_extend_for_decode(None, res)
    assert torch.allclose(res.next_draft_input.topk_p, torch.softmax(logits, -1).gather(-1, idx))


def test_verify_requests_the_tree_branch(monkeypatch):
    seen = {}
    monkeypatch.setattr(hw, "run_eagle_verify", lambda batch, **kw: seen.update(kw) or "result")
    w = object.__new__(hw.HybridWorkerV2)
    w._target_worker, w.req_to_token_pool, w.token_to_kv_pool_allocator = "tw", "pool", "alloc"
    w.plan_stream = w.plan_stream_ctx = None
    w.speculative_num_draft_tokens, w.device, w.topk = STEPS + K + 1, "cpu", 1
    assert w.verify("batch") == "result"
    assert seen["topk"] > 1 and seen["finalize_tree_path"] is True
    assert seen["num_draft_tokens"] == STEPS + K + 1


class FlashInferAttnBackend:
    """Stand-in with the two attributes build_verify reads (named like SGLang's class, which it checks)."""
    verify_mask = None
    max_context_len = 64


class TritonAttnBackend(FlashInferAttnBackend):
    pass


class FlashAttentionBackend(FlashInferAttnBackend):
    pass


def _worker(mode="merge"):
    settings = HybridSettings(mode=mode, ngram_k=K, log_interval=0)
    w = object.__new__(hw.HybridWorkerV2)
    w.settings, w.device = settings, torch.device("cpu")
    w.speculative_num_steps = STEPS
    w.counters = HybridCounters("cpu")
    w.hybrid_step = HybridStep(settings, num_steps=STEPS, pool_size=8, device="cpu", counters=w.counters)
    w.speculative_num_draft_tokens = w.hybrid_step.n_nodes + 1
    w.feeder = NgramFeeder(FakeDrafter(), K, "cpu", max_bs=8)
    w.req_to_token_pool = SimpleNamespace(req_generation=torch.tensor([0, 3, 0, 5, 0, 0, 0, 0]))
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=FlashInferAttnBackend()))
    w._draft_worker = SimpleNamespace(tree_mask_mode=TreeMaskMode.FULL_MASK)
    w._cur_gen, w._last_tree = None, None
    return w


def test_build_verify_full_mask_without_host_lengths():
    w = _worker()
    batch = SimpleNamespace(req_pool_indices=torch.tensor([1, 3]), seq_lens=torch.tensor([5, 9]), seq_lens_sum=None)
    vi = w.build_verify(batch, SimpleNamespace(bonus_tokens=torch.tensor([7, 8])), torch.tensor([[1, 2, 3], [4, 5, 6]]),
                        torch.full((2, STEPS), 0.9))
    width = w.speculative_num_draft_tokens
    assert isinstance(vi, HybridVerifyInput) and vi.draft_token_num == width
    assert vi.custom_mask.numel() == 2 * 64 * width + 2 * width * width     # bs * max_context_len upper bound
    assert vi.max_tree_depth == w.hybrid_step.max_depth + 1
    assert w._last_tree is not None
    # A backend with a preallocated verify mask (Triton, for its verify CUDA graph): the mask goes into its buffer.
    from sglang.srt.layers.attention.verify_mask import VerifyMask

    triton = TritonAttnBackend()
    triton.verify_mask = VerifyMask(buffer=torch.zeros(4 * width * (64 + width), dtype=torch.bool),
                                    mode=TreeMaskMode.FULL_MASK, max_bs=4)
    w._target_worker.model_runner.attn_backend = triton
    batch.seq_lens_sum = 14
    vi2 = w.build_verify(batch, SimpleNamespace(bonus_tokens=torch.tensor([7, 8])),
                         torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.full((2, STEPS), 0.9))
    assert vi2.custom_mask.data_ptr() == triton.verify_mask.buffer.data_ptr()
    assert torch.equal(vi2.custom_mask[: 14 * width + 2 * width * width], vi.custom_mask[: 14 * width + 2 * width * width])
    w._target_worker.model_runner.attn_backend = FlashAttentionBackend()
    with pytest.raises(NotImplementedError, match="--attention-backend flashinfer"):
        w.build_verify(batch, SimpleNamespace(bonus_tokens=torch.tensor([7, 8])),
                       torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.full((2, STEPS), 0.9))


def test_forward_batch_generation_two_steps(monkeypatch):
    """Our forward_batch_generation around a stand-in for EAGLEWorkerV2.forward_batch_generation that follows its
    decode contract: draft (our build_verify with an EAGLE chain), verify, and a GenerationBatchResult whose
    next_token_ids hold each request's accepted path compacted to the front (bonus last) and accept_lens = accepted
    drafts + 1. The target is greedy with argmax following the n-gram proposal of request r1."""
    w = _worker()
    width = w.speculative_num_draft_tokens
    reqs = [_req("r0", [10, 11, 12], [13], 1), _req("r1", [20, 21], [22], 3)]
    verified = []

    def base_forward(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        chain = torch.tensor([[40, 41, 42], [50, 51, 52]])
        vi = self.build_verify(batch, batch.spec_info, chain, torch.full((2, STEPS), 0.5))
        tree = self._last_tree
        logits = torch.full((2, width, 128), -1.0)
        for b in range(2):
            for i in range(width):
                # argmax continues r1's own context (FakeDrafter proposes last token + 1, + 2, ...)
                nxt = int(tree.tokens[b, i]) + 1 if b == 1 else 99
                logits[b, i, max(nxt, 0) % 128] = 1.0
        res = greedy_accept(tree, logits)
        pred = torch.full((2, width), -1, dtype=torch.int32)
        for b in range(2):
            n = int(res.accept_len[b])
            pred[b, :n] = tree.tokens[b, res.accepted_nodes[b, 1:1 + n]].to(torch.int32)
            pred[b, n] = int(res.bonus[b])
        verified.append((vi, res))
        new_lens = batch.seq_lens + res.accept_len + 1
        if on_publish is not None:
            on_publish(new_lens)
        return GenerationBatchResult(next_token_ids=pred.reshape(-1), accept_lens=(res.accept_len + 1).to(torch.int32),
                                     new_seq_lens=new_lens)

    monkeypatch.setattr(eagle_v2.EAGLEWorkerV2, "forward_batch_generation", base_forward)
    decode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False)
    batch = SimpleNamespace(forward_mode=decode, is_extend_in_batch=False, reqs=reqs,
                            req_pool_indices=torch.tensor([1, 3]), seq_lens=torch.tensor([3, 2]), seq_lens_sum=5,
                            spec_info=SimpleNamespace(bonus_tokens=torch.tensor([13, 22])))
    published = []
    out = w.forward_batch_generation(batch, on_publish=published.append)
    assert published and len(verified) == 1
    res = verified[0][1]
    # r1's n-gram proposal (23, 24, 25, 26) is exactly what the target wants: all K accepted
    assert int(res.accept_len[1]) == K and int(res.accept_len[0]) == 0
    snap = w.counters.snapshot()
    assert snap["steps"] == 1 and snap["mean_accepted_ngram"] + snap["mean_accepted_mixed"] > 0
    # ring holds the emitted tokens at their positions: r1 committed 20 21 22 | 23 24 25 26 27
    ring = w.hybrid_step.buffers.ring[3]
    r = ring.shape[0] - 1
    assert [int(ring[p % r]) for p in range(2, 8)] == [22, 23, 24, 25, 26, 27]
    # step 2: the host has not processed step 1 yet (output_ids unchanged): proposals are one step late
    batch.seq_lens = out.new_seq_lens
    batch.seq_lens_sum = int(out.new_seq_lens.sum())
    nt = out.next_token_ids.view(2, width)
    batch.spec_info = SimpleNamespace(bonus_tokens=nt.gather(1, (out.accept_lens.long() - 1)[:, None])[:, 0].long())
    w.forward_batch_generation(batch)
    tree2 = w._last_tree if w._last_tree is not None else None
    assert tree2 is None          # cleared after the step
    vi2, res2 = verified[1]
    # the late proposal (computed at 3 committed tokens: 23 24 25 26) was entirely consumed by step 1 (d = 5 >= 4):
    # no n-gram candidate for r1, never a stale one
    draft_tokens = vi2.draft_token.view(2, width)[1]
    assert not ({23, 24, 25, 26} & set(draft_tokens[1:].tolist()))
