"""The CPU engine's torch twin of SGLang's Triton kernel ``generate_draft_decode_kv_indices``
(``cpu_engine/torch_kv_indices.py``) against the kernel itself.

The twin lays out the EAGLE draft step's KV indices in the live cases that run the twins and in the start-up
benchmark's draft-table probe, so it must write what the kernel writes, entry for entry, and leave alone what the kernel
leaves alone: chains (top-k 1, what HYBRID drafts) and top-k branches, one to four steps, contexts longer than the
kernel's 128-entry copy block, a batch smaller than the buffers, page entries, ids translated through ``v2p``, a draft
window with sinks, and the block-split grid (``NUM_STEPS``). The kernel runs in Triton's CPU interpreter, in a
subprocess (this module run with ``python -m``): ``TRITON_INTERPRET`` must be set before Triton's import.
"""
from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.interpreted import enter_interpreter, interpreted_outputs

POOL_ROWS, POOL_LEN, MAX_BS = 12, 640, 8
#: name -> (seed, context per request, steps, topk, page_size, ENTRY_PAGE_SIZE, translate, window, sink, block-split)
CASES = {
    "chain": (1, [5, 300, 1, 77], 3, 1, 1, 1, False, 0, 0, False),
    "chain_one_step": (2, [129, 2], 1, 1, 1, 1, False, 0, 0, False),
    "chain_four_steps_long": (3, [513, 40, 260], 4, 1, 1, 1, False, 0, 0, False),
    "topk2": (4, [9, 150, 33], 3, 2, 1, 1, False, 0, 0, False),
    "topk2_paged": (5, [10, 37, 3], 3, 2, 4, 1, False, 0, 0, False),
    "page_entries": (6, [21, 140], 2, 1, 4, 4, False, 0, 0, False),
    "translated": (7, [50, 6, 200], 3, 1, 1, 1, True, 0, 0, False),
    "translated_paged": (8, [50, 19], 2, 1, 4, 1, True, 0, 0, False),
    "window": (9, [3, 40, 300, 11], 3, 1, 1, 1, False, 16, 4, False),
    "block_split": (10, [600, 12, 129], 3, 1, 1, 1, False, 0, 0, True),
}


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def make_case(seed, lens, steps, topk, page_size, entry_page, translate, window, sink, split) -> dict:
    """A draft plan's inputs as SGLang's Triton draft backend hands them to the kernel: a request-to-token table of
    distinct ids (page entries when ``entry_page`` > 1), ``len(lens)`` requests on random rows, positions at each
    request's context (one per branch), output buffers of the backend's shape filled with a sentinel."""
    g = torch.Generator().manual_seed(seed)
    entries = POOL_ROWS * POOL_LEN
    table = torch.randperm(entries * 4, generator=g)[:entries].to(torch.int32).view(POOL_ROWS, POOL_LEN)
    if entry_page > 1:
        table = table // entry_page
    n = len(lens)
    rows = torch.randperm(POOL_ROWS, generator=g)[:n].to(torch.int64)
    seq_lens = torch.tensor(lens, dtype=torch.int64)
    width = (sum(lens) + n * steps) * topk + 64
    grid0 = steps * 2 if split else steps
    case = {
        "grid": (grid0, n, topk), "req_pool_indices": rows, "req_to_token": table, "paged_kernel_lens": seq_lens,
        "kv_indices": torch.full((steps, width), -7, dtype=torch.int64),
        "kv_indptr": torch.full((steps, MAX_BS * topk + 1), -7, dtype=torch.int32),
        "positions": seq_lens.repeat_interleave(topk), "row_stride": POOL_LEN,
        "page_size": page_size, "window_size": window, "sink_size": sink,
        "NUM_STEPS": steps if split else 0, "ENTRY_PAGE_SIZE": entry_page, "TRANSLATE": translate,
        "v2p": None, "steps": steps,
    }
    case["kv_indptr"][:, 0] = 0
    if translate:
        pages = entries * 4 * entry_page // page_size + 1
        case["v2p"] = torch.randperm(pages, generator=g).to(torch.int32)
        case["v2p"][table[rows[0], :3].long() // page_size] = -1    # pages mapped below zero: clamped to id 0
    return case


def launch(kernel, case: dict) -> dict:
    """``kernel[grid](...)`` (SGLang's kernel or the twin) as the Triton draft backend calls it, on copies of the
    output buffers; returns them."""
    out = {"kv_indices": case["kv_indices"].clone(), "kv_indptr": case["kv_indptr"].clone()}
    steps, n, topk = case["steps"], len(case["req_pool_indices"]), case["positions"].numel() // len(
        case["req_pool_indices"])
    kernel[case["grid"]](
        case["req_pool_indices"], case["req_to_token"], case["paged_kernel_lens"], out["kv_indices"],
        out["kv_indptr"], case["positions"], case["row_stride"], out["kv_indices"].shape[1],
        out["kv_indptr"].shape[1], _pow2(n), _pow2(steps), _pow2(n * topk), case["page_size"], case["window_size"],
        case["sink_size"], NUM_STEPS=case["NUM_STEPS"], ENTRY_PAGE_SIZE=case["ENTRY_PAGE_SIZE"], v2p=case["v2p"],
        TRANSLATE=case["TRANSLATE"])
    return out


def cases() -> dict:
    return {name: make_case(*spec) for name, spec in CASES.items()}


def _kernel_main(out: str) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): every case through SGLang's Triton kernel."""
    enter_interpreter()
    from sglang.kernels.ops.speculative.cache_locs import generate_draft_decode_kv_indices

    torch.save({name: launch(generate_draft_decode_kv_indices, case) for name, case in cases().items()}, out)


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory) -> dict:
    return interpreted_outputs(__name__, tmp_path_factory, "kv_indices_twin")


def test_kv_indices_twin_writes_what_the_kernel_writes(kernel_outputs):
    """Entry for entry, both buffers, every case; the sentinel left where the kernel leaves it."""
    from sglang_hybrid.cpu_engine.torch_kv_indices import generate_draft_decode_kv_indices_torch

    for name, case in cases().items():
        want, got = kernel_outputs[name], launch(generate_draft_decode_kv_indices_torch, case)
        for buf in ("kv_indices", "kv_indptr"):
            assert torch.equal(got[buf], want[buf]), (name, buf)
        assert (want["kv_indices"] != -7).sum() > 0, name      # the kernel wrote something to compare


def test_kv_indices_twin_lays_out_a_chain_as_the_backend_reads_it(kernel_outputs):
    """For a chain (what HYBRID drafts), step ``s`` gives request ``b`` the slice ``kv_indptr[s, b]:kv_indptr[s, b+1]``
    of its committed ids then its ``s + 1`` draft slots, read straight off ``req_to_token``: the layout the attention
    backend reads, checked from first principles rather than against the kernel."""
    case = cases()["chain"]
    got = kernel_outputs["chain"]
    table, rows, lens = case["req_to_token"], case["req_pool_indices"], case["paged_kernel_lens"].tolist()
    for s in range(case["steps"]):
        ptr = got["kv_indptr"][s].tolist()
        for b, length in enumerate(lens):
            want = table[rows[b], :length + s + 1].long()
            assert torch.equal(got["kv_indices"][s, ptr[b]:ptr[b + 1]], want), (s, b)


def test_kv_indices_twin_follows_each_requests_context(kernel_outputs):
    """Positive control: one more committed token in request 1 moves its slice and every later request's offset."""
    from sglang_hybrid.cpu_engine.torch_kv_indices import generate_draft_decode_kv_indices_torch

    case = cases()["chain"]
    longer = dict(case, paged_kernel_lens=case["paged_kernel_lens"].clone(), positions=case["positions"].clone())
    longer["paged_kernel_lens"][1] += 1
    longer["positions"][1] += 1
    base, moved = kernel_outputs["chain"], launch(generate_draft_decode_kv_indices_torch, longer)
    assert torch.equal(moved["kv_indptr"][:, :2], base["kv_indptr"][:, :2])
    assert torch.equal(moved["kv_indptr"][:, 2:5], base["kv_indptr"][:, 2:5] + 1)
    assert not torch.equal(moved["kv_indices"], base["kv_indices"])


def test_kv_indices_twin_refuses_what_it_cannot_read():
    """A callable grid and a non-contiguous buffer are refused by name."""
    from sglang_hybrid.cpu_engine.torch_kv_indices import generate_draft_decode_kv_indices_torch

    case = cases()["chain"]
    with pytest.raises(NotImplementedError, match="grid"):
        launch(generate_draft_decode_kv_indices_torch, dict(case, grid=lambda meta: (3, 4, 1)))
    with pytest.raises(NotImplementedError, match="req_to_token is not contiguous"):
        launch(generate_draft_decode_kv_indices_torch, dict(case, req_to_token=case["req_to_token"].t().t()[:, ::2]))


if __name__ == "__main__":
    _kernel_main(sys.argv[1])
