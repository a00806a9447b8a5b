"""Pieces of the SGLang worker that can be checked against SGLang's real objects without starting an engine.

The decode step itself (draft, select, verify, draft extend, the n-gram feeder on real requests) runs end to end in a
live SGLang engine in ``tests/test_sglang_live.py``; nothing here stands in for an SGLang method's body.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("sglang.srt.speculative.eagle_worker_v2",
                    reason="sglang is not installed (scripts/setup.sh installs it)")

import sglang.srt.speculative.eagle_worker_v2 as eagle_v2  # noqa: E402
from sglang.srt.layers.attention.verify_mask import VerifyMask, maybe_create_verify_mask  # noqa: E402

from sglang_hybrid.selector import ancestors_from_parents  # noqa: E402
from sglang_hybrid.sglang_plugin import worker as hw  # noqa: E402
from sglang_hybrid.sglang_plugin.tp_sync import TreeBroadcast, pack_tree, unpack_tree  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode, build_verify_input  # noqa: E402

from test_sglang_verify_input import mixed_batch  # noqa: E402

pytestmark = pytest.mark.sglang
HEAD = Path(__file__).resolve().parents[1] / "sglang_hybrid" / "data" / "eagle_smollm2"


def test_draft_worker_class_swap_is_scoped():
    original = eagle_v2.EagleDraftWorker
    with hw._draft_worker_class(hw.HybridDraftWorker):
        assert eagle_v2.EagleDraftWorker is hw.HybridDraftWorker
    assert eagle_v2.EagleDraftWorker is original
    with pytest.raises(RuntimeError):
        with hw._draft_worker_class(hw.HybridDraftWorker):
            raise RuntimeError("constructor failed")
    assert eagle_v2.EagleDraftWorker is original


class _Backend:
    """Holds a verify mask the way SGLang's attention backends expose it (the ``verify_mask`` property)."""

    def __init__(self, verify_mask):
        self.verify_mask = verify_mask


def test_mask_into_tritons_uint8_buffer():
    """SGLang's Triton backend allocates its verify mask with ``maybe_create_verify_mask(dtype=torch.uint8)``; the
    builder must write the same mask into it that it builds as a fresh bool tensor (a bool scatter into the uint8
    buffer raised a dtype error before)."""
    tree, seq_lens = mixed_batch(), torch.tensor([7, 3, 12, 1, 9, 4])
    bs, w = tree.tokens.shape
    ctx = 64
    mask = maybe_create_verify_mask(is_draft_runner=False, skip_prefill=False, max_bs=bs, max_context_len=ctx,
                                    num_draft_tokens=w, device="cpu", is_read=True, dtype=torch.uint8)
    assert mask.buffer.dtype == torch.uint8
    assert mask.mode == TreeMaskMode.FULL_MASK         # outside a CPU engine, SGLang's default layout
    buf = hw.verify_mask_buffer(_Backend(mask), bs)
    assert buf is mask.buffer
    total = int(seq_lens.sum())
    mode = TreeMaskMode.FULL_MASK
    fresh = build_verify_input(tree, seq_lens, num_steps=3, max_depth=4, mask_mode=mode, seq_lens_sum=total)
    into = build_verify_input(tree, seq_lens, num_steps=3, max_depth=4, mask_mode=mode, seq_lens_sum=total,
                              mask_buf=buf)
    n = fresh.custom_mask.numel()
    assert into.custom_mask.data_ptr() == mask.buffer.data_ptr()
    assert torch.equal(into.custom_mask[:n].to(torch.bool), fresh.custom_mask)


def test_mask_mode_follows_the_backend_not_the_platform():
    """On SGLang's CPU engine ``default_tree_mask_mode()`` answers QLEN_ONLY (intel_amx's layout), but Triton reads
    FULL_MASK: the worker builds FULL_MASK and never writes into a buffer of another layout."""
    qlen = VerifyMask(buffer=torch.zeros(4 * 13 * 13, dtype=torch.uint8), mode=TreeMaskMode.QLEN_ONLY, max_bs=4)
    assert hw.verify_mask_buffer(_Backend(qlen), 2) is None
    assert hw.verify_mask_buffer(_Backend(None), 2) is None
    full = VerifyMask(buffer=torch.zeros(2 * 13 * 80, dtype=torch.uint8), mode=TreeMaskMode.FULL_MASK, max_bs=2)
    assert hw.verify_mask_buffer(_Backend(full), 3) is None               # batch too large for it
    assert hw.verify_mask_buffer(_Backend(full), 2) is full.buffer


def test_tree_pack_roundtrip_is_exact():
    tree = mixed_batch()
    tree = tree._replace(survival=torch.rand(tree.survival.shape) * tree.valid,
                         expected_accepted=torch.rand(tree.tokens.shape[0]))
    back = unpack_tree(pack_tree(tree), tree.tokens.shape[1])
    for name in tree._fields:
        a, b = getattr(tree, name), getattr(back, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(back.ancestors, ancestors_from_parents(back.parents) & back.ancestors)


class _RecordingGroup:
    """Follows SGLang's ``GroupCoordinator.broadcast`` contract: fills ``input_`` in place with rank 0's tensor."""

    def __init__(self, world_size, rank0_tensor):
        self.world_size, self.rank0, self.calls = world_size, rank0_tensor, 0

    def broadcast(self, input_, src=0):
        assert src == 0
        self.calls += 1
        input_.copy_(self.rank0)
        return input_


def test_tree_broadcast_replaces_a_diverged_tree_with_rank0s():
    tree = mixed_batch()
    other = tree._replace(tokens=torch.where(tree.valid, tree.tokens + 1, tree.tokens))   # this rank diverged
    b = tree.tokens.shape[0]
    rank0_plan = torch.tensor([2, 4])                                  # EAGLE depth 2, verify width 4
    group = _RecordingGroup(2, torch.cat([pack_tree(tree), rank0_plan[None].expand(b, 2)], 1))
    got, plan = TreeBroadcast(group)(other, torch.tensor([4, 13]))   # this rank chose another plan too
    assert group.calls == 1 and torch.equal(got.tokens, tree.tokens) and plan.tolist() == [2, 4]
    single = TreeBroadcast(_RecordingGroup(1, None))
    mine = torch.tensor([4, 13])
    assert not single.enabled and single(other, mine) == (other, mine)
    assert not TreeBroadcast(None).enabled


def test_lookup_memory_span_from_host_known_lengths():
    """The worker bounds the prompt lookup by what the host knows without a device read: SGLang's CPU copy of the
    sequence lengths (exact, plus the root), else the feeder's committed lengths plus what the steps in flight can
    have committed, else nothing (the whole table). The batch's device lengths are meta tensors: reading their values
    would fail."""
    from types import SimpleNamespace

    worker = SimpleNamespace(_host_committed=None, hybrid_step=SimpleNamespace(max_depth=12))
    batch = SimpleNamespace(seq_lens=torch.empty(3, dtype=torch.int64, device="meta"),
                            seq_lens_cpu=torch.tensor([5, 2049, 3]))
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2050
    worker._host_committed = 2000
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2050          # the exact copy wins
    batch.seq_lens_cpu = None                                              # e.g. the Triton backend opts out of it
    assert hw.HybridWorkerV2._longest_context(worker, batch) == 2000 + hw._PLAN_IN_FLIGHT * 13
    worker._host_committed = None
    assert hw.HybridWorkerV2._longest_context(worker, batch) is None


def test_shipped_head_is_not_tied():
    """A tied EAGLE config makes ``lm_head`` the embedding module and SGLang's ``set_embed_and_head`` fails when the
    draft loads (``del self.lm_head.weight``); the live suite loads the shipped head in SGLang."""
    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    from sglang_hybrid.reference.eagle import head_config

    assert head_config(dict(cfg, tie_word_embeddings=True))["tie_word_embeddings"] is False
