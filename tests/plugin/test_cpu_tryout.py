"""The try-out server's torch twins (``python -m sglang_hybrid.serve --cpu --torch-kernels``) against SGLang's Triton
kernels, and how the server chooses them.

Two twins written for it: ``create_flashinfer_kv_indices_torch`` (``cpu_engine/torch_kv_indices.py``; SGLang's KV-index
gather, launched by every forward's metadata) and ``verify_tree_greedy_torch`` (``cpu_engine/torch_tree_verify.py``;
SGLang's greedy tree verification). Each must write what its kernel writes, entry for entry, and leave alone what the
kernel leaves alone: for the gather, token and page entries, a start offset, a token mapping with negative ids, the
block-split grid, a grid smaller than the buffers, requests longer than the kernel's 512-entry copy block; for the
verify, random trees (chains, wide fans, trees deeper than the walk, padding nodes), full and partial acceptance. The
kernels run in Triton's CPU interpreter, in a subprocess (this module run with ``python -m``): ``TRITON_INTERPRET`` must
be set before Triton's import. Then the choice: ``--torch-kernels`` sets ``decision_kernels=torch`` (chosen, so no
``fallback_decision_torch``) and ``TORCH_KERNELS_ENV``, which installs every twin, where ``TORCH_ATTENTION_ENV`` (the
live cases' switch) leaves the gather and the tree verify to SGLang's kernels.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.interpreted import enter_interpreter, interpreted_outputs

REPO = Path(__file__).resolve().parents[2]
GATHER_ROWS, GATHER_LEN = 10, 1400
#: name -> (seed, ids per request, ENTRY_PAGE_SIZE, with kv_start_idx, with token_mapping, grid blocks, idle lanes)
GATHER_CASES = {
    "tokens": (1, [5, 600, 1, 77], 1, False, False, 1, 0),
    "start_offsets": (2, [40, 513, 3], 1, True, False, 1, 0),
    "page_entries": (3, [21, 140, 9], 4, False, False, 1, 0),
    "pages_with_start": (4, [30, 300], 4, True, False, 1, 0),
    "mapping": (5, [12, 700, 5], 1, False, True, 1, 0),
    "block_split": (6, [1100, 12, 600], 1, True, True, 3, 0),
    "padded_lanes": (7, [7, 0, 250], 1, False, False, 1, 3),
}
#: name -> (seed, requests, tree width, levels the walk may take, vocabulary, every level matches)
VERIFY_CASES = {
    "small_vocab": (11, 4, 12, 12, 2, False),
    "chains_accepted": (12, 3, 12, 4, 50, True),
    "wide_short_walk": (13, 5, 16, 4, 3, False),
    "one_request_no_match": (14, 1, 8, 8, 1000, False),
    "deep_truncated": (15, 2, 20, 5, 2, True),
}


# -- the KV-index gather --------------------------------------------------------------------------------------------
def make_gather_case(seed, lens, entry_page, with_start, with_mapping, blocks, idle) -> dict:
    """The gather's inputs as the KV index translator hands them to the kernel: a request-to-token table of distinct
    ids (page entries when ``entry_page`` > 1; one -1 entry where a mapping is tested), ``len(lens)`` requests on
    random rows (``idle`` more row lanes than the grid reads), ``kv_indptr`` offsets with a gap, an output buffer filled
    with a sentinel."""
    g = torch.Generator().manual_seed(seed)
    entries = GATHER_ROWS * GATHER_LEN
    table = torch.randperm(entries * 4, generator=g)[:entries].to(torch.int32).view(GATHER_ROWS, GATHER_LEN)
    if entry_page > 1:
        table = table // entry_page
    n = len(lens)
    rows = torch.randperm(GATHER_ROWS, generator=g)[:n + idle].to(torch.int64)
    if with_mapping:
        table[rows[0], 2] = -1                          # a negative id: the mapping leaves it -1
    starts = (torch.randint(0, 60, (n + idle,), generator=g) if with_start else torch.zeros(n + idle)).to(torch.int32)
    indptr = torch.zeros(n + idle + 1, dtype=torch.int32)
    indptr[1:n + 1] = torch.tensor(lens, dtype=torch.int32).cumsum(0) + 5       # request 0 written from offset 5
    indptr[0] = 5
    case = {
        "grid": (n, blocks) if blocks > 1 else (n,), "req_to_token": table, "req_pool_indices": rows,
        "page_kernel_lens": torch.tensor(lens + [3] * idle, dtype=torch.int32), "kv_indptr": indptr,
        "kv_start_idx": starts if with_start else None,
        "kv_indices": torch.full((sum(lens) + 64,), -7, dtype=torch.int64), "stride": GATHER_LEN,
        "ENTRY_PAGE_SIZE": entry_page, "TOKEN_BLOCK_PARALLEL": blocks > 1, "token_mapping": None,
    }
    if with_mapping:
        case["token_mapping"] = torch.randperm(entries * 4 * entry_page + 1, generator=g).to(torch.int32)
    return case


def gather(kernel, case: dict) -> torch.Tensor:
    """``kernel[grid](...)`` (SGLang's kernel or the twin) as ``kv_index_translator.pack_read_stream`` calls it, on a
    copy of the output buffer; returns it."""
    out = case["kv_indices"].clone()
    kernel[case["grid"]](case["req_to_token"], case["req_pool_indices"], case["page_kernel_lens"], case["kv_indptr"],
                         case["kv_start_idx"], out, case["stride"], ENTRY_PAGE_SIZE=case["ENTRY_PAGE_SIZE"],
                         TOKEN_BLOCK_PARALLEL=case["TOKEN_BLOCK_PARALLEL"], token_mapping=case["token_mapping"])
    return out


def gather_cases() -> dict:
    return {name: make_gather_case(*spec) for name, spec in GATHER_CASES.items()}


# -- the greedy tree verify ------------------------------------------------------------------------------------------
def make_verify_case(seed, bs, width, levels, vocab, accept_all) -> dict:
    """A greedy verify's inputs as SGLang's ``verify_tree_greedy_func`` hands them over: per request a random tree of
    ``width`` nodes (each node's parent drawn among the earlier ones, linked as first child / next sibling; the last
    two left out as padding where the width allows), candidate tokens from a ``vocab``-word vocabulary, the target's
    tokens (``accept_all``: the first half of the nodes a chain, each node's target its first child's token, so the
    walk accepts down the chain until the chain or the walk's levels run out), and the
    outputs as SGLang allocates them (``predicts`` and ``accept_index`` filled with sentinels)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.full((bs, width), -1, dtype=torch.int64)
    sibling = torch.full((bs, width), -1, dtype=torch.int64)
    used = width - 2 if width > 4 else width
    for b in range(bs):
        for i in range(1, used):
            chain = accept_all and i <= used // 2          # a chain's first half: nodes 1, 2, ... each the next's
            parent = i - 1 if chain else int(torch.randint(0, i, (1,), generator=g))
            if first[b, parent] < 0:
                first[b, parent] = i
            else:
                j = int(first[b, parent])
                while sibling[b, j] >= 0:
                    j = int(sibling[b, j])
                sibling[b, j] = i
    candidates = torch.randint(0, vocab, (bs, width), generator=g)
    target = torch.randint(0, vocab, (bs, width), generator=g)
    if accept_all:
        has_child = first >= 0
        target = torch.where(has_child, candidates.gather(1, first.clamp_min(0)), target)
    return {
        "candidates": candidates, "retrieve_index": torch.arange(bs * width).view(bs, width),
        "retrieve_next_token": first, "retrieve_next_sibling": sibling, "target_predict": target,
        "predicts": torch.full((bs * width,), -3, dtype=torch.int32),
        "accept_index": torch.full((bs, levels), -1, dtype=torch.int32),
        "accept_token_num": torch.full((bs,), -5, dtype=torch.int32),
    }


def verify_with(call, case: dict, names: str = "retrieve") -> dict:
    """``call(...)`` (SGLang's ``verify_tree_greedy_triton`` with ``retrieve_*`` keywords, or the twin as the stand-in
    op with the op schema's ``retrive_*``) on copies of the outputs; returns them."""
    out = {k: case[k].clone() for k in ("predicts", "accept_index", "accept_token_num")}
    trees = {f"{names}_{k}": case[f"retrieve_{k}"] for k in ("index", "next_token", "next_sibling")}
    call(**out, candidates=case["candidates"], target_predict=case["target_predict"], **trees)
    return out


def verify_cases() -> dict:
    return {name: make_verify_case(*spec) for name, spec in VERIFY_CASES.items()}


def _kernel_main(out: str) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): every case through SGLang's Triton kernels."""
    enter_interpreter()
    from sglang.kernels.ops.attention.kv_indices import create_flashinfer_kv_indices_triton
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    kv, tree = create_flashinfer_kv_indices_triton, verify_tree_greedy_triton
    torch.save({"gather": {name: gather(kv, case) for name, case in gather_cases().items()},
                "verify": {name: verify_with(tree, case) for name, case in verify_cases().items()}}, out)


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory) -> dict:
    return interpreted_outputs(__name__, tmp_path_factory, "cpu_tryout_twins")


def test_cpu_tryout_gather_twin_writes_what_the_kernel_writes(kernel_outputs):
    """Entry for entry, every case; the sentinel left where the kernel leaves it."""
    from sglang_hybrid.cpu_engine.torch_kv_indices import create_flashinfer_kv_indices_torch

    for name, case in gather_cases().items():
        want, got = kernel_outputs["gather"][name], gather(create_flashinfer_kv_indices_torch, case)
        assert torch.equal(got, want), name
        assert (want != -7).sum() == int(case["page_kernel_lens"][:case["grid"][0]].sum()), name


def test_cpu_tryout_gather_twin_reads_each_requests_row():
    """From first principles, not against the kernel: request ``b``'s slice is its row from its start offset."""
    from sglang_hybrid.cpu_engine.torch_kv_indices import create_flashinfer_kv_indices_torch

    case = gather_cases()["start_offsets"]
    got = gather(create_flashinfer_kv_indices_torch, case)
    for b, n in enumerate(case["page_kernel_lens"].tolist()):
        at, s, row = int(case["kv_indptr"][b]), int(case["kv_start_idx"][b]), int(case["req_pool_indices"][b])
        assert torch.equal(got[at:at + n], case["req_to_token"][row, s:s + n].long()), b


def test_cpu_tryout_tree_verify_twin_writes_what_the_kernel_writes(kernel_outputs):
    """``predicts``, ``accept_index`` and ``accept_token_num`` equal the kernel's in every case, and the cases
    exercise both ends: some request accepts nothing, some the whole walk."""
    from sglang_hybrid.cpu_engine.torch_tree_verify import verify_tree_greedy_torch

    counts = []
    for name, case in verify_cases().items():
        want, got = kernel_outputs["verify"][name], verify_with(verify_tree_greedy_torch, case, names="retrive")
        for buf in ("predicts", "accept_index", "accept_token_num"):
            assert torch.equal(got[buf], want[buf]), (name, buf)
        counts += [(int(n), case["accept_index"].shape[1] - 1) for n in want["accept_token_num"]]
    assert any(n == 0 for n, _ in counts) and any(n == top for n, top in counts), counts


def test_cpu_tryout_twins_refuse_what_they_cannot_read():
    from sglang_hybrid.cpu_engine.torch_kv_indices import create_flashinfer_kv_indices_torch
    from sglang_hybrid.cpu_engine.torch_tree_verify import verify_tree_greedy_torch

    case = gather_cases()["tokens"]
    with pytest.raises(NotImplementedError, match="grid"):
        gather(create_flashinfer_kv_indices_torch, dict(case, grid=lambda meta: (4,)))
    with pytest.raises(NotImplementedError, match="req_to_token is not contiguous"):
        gather(create_flashinfer_kv_indices_torch, dict(case, req_to_token=case["req_to_token"][:, ::2]))
    tree = verify_cases()["small_vocab"]
    with pytest.raises(NotImplementedError, match="candidates is not contiguous"):
        verify_with(verify_tree_greedy_torch, dict(tree, candidates=tree["candidates"].t().contiguous().t()),
                    names="retrive")


# -- how the try-out server chooses them ----------------------------------------------------------------------------
@pytest.mark.usefixtures("clean_hybrid_env")
def test_cpu_tryout_decision_on_torch_is_chosen_not_a_fallback():
    """``--torch-kernels``'s settings resolve to ``decision_kernels=torch``, which builds no fused step and no
    fallback reason (``auto`` without Triton would count ``fallback_decision_torch`` every step)."""
    from sglang_hybrid.serve import TORCH_KERNEL_SETTINGS
    from sglang_hybrid.sglang_plugin.config import load_settings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    settings = load_settings(environ=dict(TORCH_KERNEL_SETTINGS))
    assert settings.decision_kernels == "torch"
    step = HybridStep(settings, num_steps=3, pool_size=4, device="cpu")
    assert step.fused is None and step.decision_fallback is None and step.workspace is None


@pytest.mark.usefixtures("clean_hybrid_env")
@pytest.mark.parametrize("argv, env, words", [
    (["--cpu", "--no-speculation", "--torch-kernels"], {}, ["--torch-kernels", "drop --torch-kernels"]),
    (["--cpu", "--torch-kernels"], {"SGLANG_HYBRID_DECISION_KERNELS": "fused"},
     ["SGLANG_HYBRID_DECISION_KERNELS=torch", "'fused'"]),
])
def test_cpu_tryout_serve_refuses_contradictions(argv, env, words, monkeypatch, capsys):
    from sglang_hybrid import serve

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert serve.main(argv) == serve.EXIT_BAD_USE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and all(w in err for w in words), err


def test_cpu_tryout_switch_installs_every_twin_where_the_live_switch_leaves_two_kernels(monkeypatch):
    """``TORCH_KERNELS_ENV`` swaps the gather in SGLang's KV index translator besides the attention and draft
    KV-index twins; ``TORCH_ATTENTION_ENV`` alone leaves the gather to SGLang's kernel."""
    from sglang.kernels.ops.attention import decode_attention, extend_attention
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.mem_cache import kv_index_translator

    from sglang_hybrid.cpu_engine import torch_attention, torch_kv_indices

    swapped = ((extend_attention, "extend_attention_fwd"), (decode_attention, "decode_attention_fwd"),
               (triton_backend, "generate_draft_decode_kv_indices"),
               (kv_index_translator, "create_flashinfer_kv_indices_triton"))
    originals = {name: getattr(module, name) for module, name in swapped}
    for module, name in swapped:
        monkeypatch.setattr(module, name, originals[name])               # restored after the test
    monkeypatch.delenv(torch_attention.TORCH_KERNELS_ENV, raising=False)
    monkeypatch.setenv(torch_attention.TORCH_ATTENTION_ENV, "1")
    assert torch_attention.install_when_imported() is True
    assert extend_attention.extend_attention_fwd is torch_attention.extend_attention_torch
    assert kv_index_translator.create_flashinfer_kv_indices_triton is originals["create_flashinfer_kv_indices_triton"]
    monkeypatch.delenv(torch_attention.TORCH_ATTENTION_ENV)
    monkeypatch.setenv(torch_attention.TORCH_KERNELS_ENV, "1")
    assert torch_attention.install_when_imported() is True
    assert decode_attention.decode_attention_fwd is torch_attention.decode_attention_torch
    assert triton_backend.generate_draft_decode_kv_indices is torch_kv_indices.generate_draft_decode_kv_indices_torch
    gather_twin = torch_kv_indices.create_flashinfer_kv_indices_torch
    assert kv_index_translator.create_flashinfer_kv_indices_triton is gather_twin


@pytest.mark.usefixtures("clean_hybrid_env")
def test_cpu_tryout_bench_starts_servers_serve_accepts():
    """``bench.cpu_serving``'s contenders are command lines ``serve`` accepts, the try-out one with
    ``--torch-kernels`` and plain decoding with ``--no-speculation``; the rest goes to SGLang."""
    from bench.cpu_serving import COMMON_FLAGS, SERVERS
    from sglang_hybrid import serve

    for name, flags in SERVERS.items():
        args, rest = serve.build_parser().parse_known_args(["--cpu", *flags, *COMMON_FLAGS])
        serve.validate(args)
        assert rest == COMMON_FLAGS, name
        assert (args.torch_kernels, args.no_speculation) == {"plain": (False, True), "HYBRID": (True, False),
                                                            "interpreted": (False, False)}[name]


@pytest.mark.parametrize("switch, twin", [(True, True), (False, False)])
def test_cpu_tryout_stand_in_tree_verify_follows_the_switch(switch, twin):
    """The stand-in ``sgl_kernel`` (imported in a child, as in an engine process) answers ``verify_tree_greedy_cpu``
    with the twin under ``TORCH_KERNELS_ENV``, and with SGLang's kernel otherwise."""
    from sglang_hybrid.cpu_engine import STAND_IN_DIR
    from sglang_hybrid.sglang_plugin.config import TORCH_ATTENTION_ENV, TORCH_KERNELS_ENV

    env = {k: v for k, v in os.environ.items() if k not in (TORCH_KERNELS_ENV, TORCH_ATTENTION_ENV)}
    if switch:
        env[TORCH_KERNELS_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(STAND_IN_DIR), str(REPO)])
    probe = ("import sgl_kernel\nfrom sglang_hybrid.cpu_engine.torch_tree_verify import verify_tree_greedy_torch\n"
             "print(sgl_kernel.verify_tree_greedy_cpu is verify_tree_greedy_torch)")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(twin), proc.stdout


if __name__ == "__main__":
    _kernel_main(sys.argv[1])
