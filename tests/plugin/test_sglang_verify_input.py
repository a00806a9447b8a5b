"""HYBRID's verify-input builder against SGLang's own tree kernels and our reference verification.

SGLang 0.5.23 ships the tree kernels it uses on GPUs (``reconstruct_indices_from_tree_mask``, ``verify_tree_greedy``)
as CUDA JIT modules plus Triton twins (``reconstruct_tree._reconstruct_tree_mask_kernel``,
``spec_tree.verify_tree_greedy_kernel_triton``). Without a GPU we run those Triton twins in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, in a subprocess because the flag must be set before Triton is imported:
``tests/plugin/_scripts/sglang_tree_kernels.py``). The CPU ``sgl_kernel`` ops are not installed, so the subprocess
stubs that import (never called) to load SGLang's module.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_hybrid.selector import VerifyTree  # noqa: E402
from sglang_hybrid.sglang_plugin.verify_input import (  # noqa: E402
    HybridVerifyInput, TreeMaskMode, build_verify_input, full_mask, tree_links_torch)
from sglang_hybrid.verify import greedy_accept  # noqa: E402
from tests.helpers.trees import N_NODES, mixed_batch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sglang
W = N_NODES + 1
VOCAB = 32


def test_batch_covers_every_case():
    tree = mixed_batch()
    src, valid = tree.source, tree.valid
    draft = valid.clone()
    draft[:, 0] = False
    assert ((src == 0) | ~draft).all(1)[0] and draft[0].any()          # EAGLE chain
    assert ((src == 1) | ~draft).all(1)[1] and draft[1].any()          # n-gram chain
    assert not draft[2].any()                                          # nothing worth verifying
    assert ((src == 2) & draft).any(1)[3] and ((src == 0) & draft).any(1)[3]   # merged tree
    assert (~valid).any(1)[5]                                          # padding nodes
    # row 3: the model branch sits after the n-gram branch, so accepting it is not a front prefix
    par = tree.parents[3].tolist()
    assert any(p >= 0 and p != i - 1 for i, p in enumerate(par) if i > 0 and tree.valid[3, i])


def _expected_links(tree: VerifyTree, seq_lens: torch.Tensor):
    """Per-node expectations straight from the VerifyTree's parents (python loops, tiny sizes)."""
    b, w = tree.tokens.shape
    pos, nxt, sib = [], [], []
    for r in range(b):
        par = [int(p) if tree.valid[r, i] else -2 for i, p in enumerate(tree.parents[r])]
        for i in range(w):
            pos.append(int(seq_lens[r]) + (int(tree.depth[r, i]) if tree.valid[r, i] else 0))
            kids = [k for k in range(w) if par[k] == i]
            nxt.append(kids[0] if kids else -1)
            if par[i] < 0:
                sib.append(-1)
            else:
                later = [k for k in range(i + 1, w) if par[k] == par[i]]
                sib.append(later[0] if later else -1)
    return (torch.tensor(pos), torch.tensor(nxt).view(b, w), torch.tensor(sib).view(b, w))


def test_builder_fields_match_tree():
    tree = mixed_batch()
    seq_lens = torch.tensor([7, 3, 12, 1, 9, 4])
    vi = build_verify_input(tree, seq_lens, num_steps=4, max_depth=4, mask_mode=TreeMaskMode.FULL_MASK,
                            seq_lens_sum=int(seq_lens.sum()))
    assert isinstance(vi, HybridVerifyInput)
    assert vi.max_tree_depth == 5 and vi.tree_topk == -1 and vi.draft_token_num == W and vi.spec_steps == 4
    pos, nxt, sib = _expected_links(tree, seq_lens)
    assert torch.equal(vi.positions, pos)
    assert torch.equal(vi.retrieve_next_token, nxt)
    assert torch.equal(vi.retrieve_next_sibling, sib)
    assert torch.equal(vi.retrieve_index, torch.arange(6 * W).view(6, W))
    # padding nodes carry the root token (a valid embedding id) and are unreachable
    dt = vi.draft_token.view(6, W)
    assert torch.equal(dt[~tree.valid], tree.tokens[:, :1].expand(6, W)[~tree.valid])
    assert (dt >= 0).all()
    reach = torch.zeros_like(tree.valid)
    for r in range(6):
        stack = [0]
        while stack:
            n = stack.pop()
            reach[r, n] = True
            c = int(nxt[r, n])
            while c >= 0:
                stack.append(c)
                c = int(sib[r, c])
    assert torch.equal(reach, tree.valid)


def test_full_mask_layout():
    tree = mixed_batch()
    seq_lens = torch.tensor([7, 3, 12, 1, 9, 4])
    slack = 5  # an over-sized seq_lens_sum (SGLang's upper bound) must not move any block
    vi = build_verify_input(tree, seq_lens, num_steps=4, max_depth=4, mask_mode=TreeMaskMode.FULL_MASK,
                            seq_lens_sum=int(seq_lens.sum()) + slack)
    mask = vi.custom_mask
    assert mask.numel() == (int(seq_lens.sum()) + slack) * W + W * W * 6
    off = 0
    for r in range(6):
        n = int(seq_lens[r])
        block = mask[off: off + W * (n + W)].view(W, n + W)
        assert block[:, :n].all()
        anc = tree.ancestors[r] & tree.valid[r][:, None] & tree.valid[r][None, :]
        anc = anc | torch.eye(W, dtype=torch.bool)
        assert torch.equal(block[:, n:], anc)
        off += W * (n + W)
    assert mask[off:].all()
    q = build_verify_input(tree, seq_lens, num_steps=4, max_depth=4, mask_mode=TreeMaskMode.QLEN_ONLY)
    assert torch.equal(q.custom_mask.view(6, W, W)[0], mask[: W * (7 + W)].view(W, 7 + W)[:, 7:])


def test_builder_rejects_bad_input():
    tree = mixed_batch()
    with pytest.raises(ValueError, match="seq_lens"):
        build_verify_input(tree, torch.tensor([1, 2]), num_steps=4, max_depth=4, mask_mode=TreeMaskMode.QLEN_ONLY)
    with pytest.raises(ValueError, match="max_depth"):
        build_verify_input(tree, torch.ones(6, dtype=torch.long), num_steps=4, max_depth=W,
                           mask_mode=TreeMaskMode.QLEN_ONLY)
    with pytest.raises(ValueError, match="seq_lens_sum"):
        build_verify_input(tree, torch.ones(6, dtype=torch.long), num_steps=4, max_depth=4)
    with pytest.raises(NotImplementedError, match="QLEN_ONLY_BITPACKING"):
        build_verify_input(tree, torch.ones(6, dtype=torch.long), num_steps=4, max_depth=4,
                           mask_mode=TreeMaskMode.QLEN_ONLY_BITPACKING)
    with pytest.raises(ValueError, match="buffer"):
        full_mask(tree.ancestors, torch.ones(6, dtype=torch.long), 6, out=torch.ones(3, dtype=torch.bool))


def _target_logits(tree: VerifyTree, seed: int) -> torch.Tensor:
    """Target logits whose argmax follows some draft paths (so acceptances of every length occur), and whose
    argmax at the root of the last row equals the root token, which padding nodes carry."""
    g = torch.Generator().manual_seed(seed)
    b, w = tree.tokens.shape
    logits = torch.randn(b, w, VOCAB, generator=g)
    for r in range(b):
        for i in range(1, w):
            if tree.valid[r, i] and torch.rand((), generator=g) < 0.7:
                p = int(tree.parents[r, i])
                logits[r, p] = -5.0
                logits[r, p, int(tree.tokens[r, i])] = 5.0
    logits[5, 0] = -5.0
    logits[5, 0, int(tree.tokens[5, 0])] = 5.0
    return logits


def test_sglang_kernels_accept_builder_output(tmp_path):
    """SGLang's own Triton tree kernels (CPU interpreter) on our verify input: identical positions/retrieve arrays,
    greedy acceptance equal to ``sglang_hybrid.verify.greedy_accept`` (the project's reference), and its GPU-only
    commit kernels equal to its CPU branch (``_assert_commit_paths_agree``)."""
    tree = mixed_batch()
    bs = tree.tokens.shape[0]
    seq_lens = torch.tensor([7, 3, 12, 1, 9, 4])
    vi = build_verify_input(tree, seq_lens, num_steps=4, max_depth=4, mask_mode=TreeMaskMode.QLEN_ONLY)
    cases = []
    for seed in range(4):
        logits = _target_logits(tree, seed)
        cases.append((logits, greedy_accept(tree, logits)))
    inp, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save([{"bs": bs, "w": W, "max_depth": 4, "tree_mask": vi.custom_mask.clone(), "seq_lens": seq_lens,
                 "candidates": vi.draft_token.view(bs, W).clone(), "retrieve_index": vi.retrieve_index,
                 "retrieve_next_token": vi.retrieve_next_token, "retrieve_next_sibling": vi.retrieve_next_sibling,
                 "target_predict": logits.argmax(-1)} for logits, _ in cases], inp)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "tests.plugin._scripts.sglang_tree_kernels", str(inp), str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = torch.load(out)
    assert len(outputs) == len(cases)
    lens_seen = set()
    for got, (logits, ref) in zip(outputs, cases):
        assert torch.equal(got["positions"], vi.positions)
        assert torch.equal(got["retrieve_index"], vi.retrieve_index)
        assert torch.equal(got["retrieve_next_token"], vi.retrieve_next_token)
        assert torch.equal(got["retrieve_next_sibling"], vi.retrieve_next_sibling)
        assert torch.equal(got["accept_num"], ref.accept_len)
        for r in range(bs):
            n = int(ref.accept_len[r])
            lens_seen.add(n)
            path = got["accept_index"][r, : n + 1] - r * W
            assert torch.equal(path, ref.accepted_nodes[r, : n + 1])
            assert (got["accept_index"][r, n + 1:] == -1).all()
            assert bool(tree.valid[r, path].all())                       # never a padding node
            assert int(got["predicts"][r * W + int(path[-1])]) == int(ref.bonus[r])
        _assert_commit_paths_agree(got, seq_lens, ref.bonus)
    assert len(lens_seen) >= 3


def _assert_commit_paths_agree(got: dict, seq_lens: torch.Tensor, bonus: torch.Tensor) -> None:
    """SGLang's GPU-only commit kernels (``prepare_verify_commit_outputs``, ``prepare_draft_extend_inputs``, run in
    the interpreter) agree with what its CPU branch computes from the same verify outputs (``run_eagle_verify``:
    ``seq_lens + accept_lens`` and the last accepted token; ``_draft_extend_for_decode``: ``accept_lens - 1`` and
    ``row * width + accept_lens - 1``), and with HYBRID's reference bonus token, on HYBRID's trees, whose accepted
    paths need not be a front prefix of the block (the draft extend reads the block after SGLang's ``topk > 1``
    compaction, which HYBRID's verify requests)."""
    accept_lens = got["accept_num"] + 1
    bs = accept_lens.shape[0]
    accept_tokens = got["predicts"][got["accept_index"]].view(-1)           # the CPU branch's gather
    cpu_bonus = accept_tokens[torch.arange(bs) * got["accept_index"].shape[1] + accept_lens - 1]
    assert torch.equal(got["commit"]["new_seq_lens"], seq_lens + accept_lens)
    assert torch.equal(got["commit"]["bonus"].long(), cpu_bonus) and torch.equal(cpu_bonus, bonus.long())
    assert torch.equal(got["draft_extend"]["correct"].long(), accept_lens - 1)
    assert torch.equal(got["draft_extend"]["select"], torch.arange(bs) * W + accept_lens - 1)
    assert torch.equal(got["draft_extend"]["ids"], got["predicts"])


def test_tree_links_torch_compiles_fullgraph():
    tree = mixed_batch()
    seq_lens = torch.tensor([7, 3, 12, 1, 9, 4])
    compiled = torch.compile(tree_links_torch, fullgraph=True, backend="eager")
    for a, b in zip(compiled(tree.ancestors, seq_lens), tree_links_torch(tree.ancestors, seq_lens)):
        assert torch.equal(a, b)
