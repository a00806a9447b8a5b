"""Ragged tree verify: the plugin's layout (``sglang_plugin/ragged/layout.py``) and SGLang's Triton extend attention
kernel on a ragged batch of tree masks.

Each request verifies its own number of nodes (ragged ``qo_indptr``: 1, 3, 28, 2, ... tokens) with its own tree mask
(each node sees the whole prefix and its ancestors in the tree, itself included). The kernel is SGLang 0.5.23's
``sglang.kernels.ops.attention.extend_attention.extend_attention_fwd``, called exactly as ``TritonAttnBackend`` calls
it for TARGET_VERIFY (``forward_extend``): extend q/k/v contiguous ``[tokens, heads, head_dim]``, the prefix read from
the paged KV pool (page size 1) through ``kv_indptr``/``kv_indices`` over each request's committed ``seq_len``, the
FULL_MASK tree mask (per request ``n_i x (prefix_i + n_i)`` row-major, starting at ``mask_indptr[i]`` = running sum of
``n_i * (prefix_i + n_i)``; uint8 as the backend's graph buffer, bool as ``spec_info.custom_mask``), ``causal=True``
and the default ``skip_prefix_custom_mask=True``. It runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``), in a
subprocess because the flag must be set before Triton is imported and this test session may already have imported
it; the subprocess is this module run with ``python -m``. The outputs are compared with a dense float64 torch
reference ``softmax(Q K^T * scale + mask) V`` per request (``tests/helpers/ragged_cases.py``, with the batches). The
plugin's layout is checked against a per-request brute force (``ragged_full_mask``) and, through the kernel, against
the same reference; the live engine runs it in every case of ``tests/live/test_sglang_live.py``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.interpreted import run_interpreted
from tests.helpers.ragged_cases import (ATOL, HEAD_DIM, dense_reference, make_case, padded_case, padded_tree,
                                        plugin_layout, ragged_full_mask, with_mask)

pytestmark = pytest.mark.sglang
#: The kernel's query tile on this machine (``_get_block_sizes_for_extend_attention(64, 64)`` without CUDA or HIP).
BLOCK_M = 64


# ----------------------------------------------------------------------------------------------- kernel (subprocess)
KERNEL_ARGS = ("q", "k", "v", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask",
               "is_causal", "mask_indptr", "max_len_extend", "skip_prefix_custom_mask")


def _kernel_main(inp: str, out: str) -> None:
    """Subprocess entry: run ``extend_attention_fwd`` on every case of ``inp`` (TRITON_INTERPRET already set)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.modules.setdefault("vllm", None)
    torch.set_num_threads(1)
    from sglang.kernels.ops.attention.extend_attention import (_get_block_sizes_for_extend_attention,
                                                               extend_attention_fwd)

    assert _get_block_sizes_for_extend_attention(HEAD_DIM, HEAD_DIM)[3] == BLOCK_M
    results = []
    for case in torch.load(inp):
        o = torch.full_like(case["q"], float("nan"))  # rows the kernel never writes stay NaN
        t0 = time.perf_counter()
        extend_attention_fwd(case["q"], case["k"], case["v"], o, case["k_buffer"], case["v_buffer"],
                             case["qo_indptr"], case["kv_indptr"], case["kv_indices"], case["custom_mask"],
                             case["is_causal"], case["mask_indptr"], case["max_len_extend"], 1.0, 1.0,
                             sm_scale=None, skip_prefix_custom_mask=case["skip_prefix_custom_mask"])
        results.append({"o": o, "seconds": time.perf_counter() - t0})
    torch.save(results, out)


def run_kernel(cases: dict, tmp: Path) -> dict:
    """Run the named cases in one interpreter subprocess; returns ``{name: output}``."""
    names = list(cases)
    inp, out = tmp / "cases.pt", tmp / "outputs.pt"
    torch.save([{a: cases[n][a] for a in KERNEL_ARGS} for n in names], inp)
    run_interpreted(__name__, "kernel", inp, out)
    results = torch.load(out)
    for n, r in zip(names, results):
        print(f"{n}: kernel {r['seconds']:.2f} s")
    return {n: r["o"] for n, r in zip(names, results)}


# ----------------------------------------------------------------------------------------------- the batch
#: (seed, prefix lengths, extend lengths, q heads, kv heads, chain requests, mask dtype, is_causal).
#: Prefixes include 0 and ones spanning several 64-token prefix tiles; extends are ragged in 1..28.
RAGGED = {
    "mha_uint8": (1, [0, 17, 150, 5, 63], [3, 1, 28, 2, 11], 2, 2, (), torch.uint8, True),
    "gqa2_uint8": (2, [129, 0, 64, 7, 33, 1], [1, 28, 5, 13, 2, 27], 4, 2, (1,), torch.uint8, True),
    "gqa4_bool": (3, [40, 200, 0, 12], [28, 2, 7, 1], 4, 1, (0,), torch.bool, True),
    "gqa2_noncausal": (4, [0, 90, 3, 18], [9, 28, 1, 4], 4, 2, (), torch.uint8, False),
}


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    cases = {}
    for name, (seed, prefix, ext, hq, hkv, chains, dtype, causal) in RAGGED.items():
        cases[name] = make_case(seed, prefix, ext, hq, hkv, chains=chains, mask_dtype=dtype, is_causal=causal)
    base = cases["gqa2_uint8"]
    # Positive control: a causal mask over the extend part instead of the tree.
    cases["wrong_causal"] = with_mask(base, [torch.ones(n, n, dtype=torch.bool).tril() for n in base["ext_lens"]])
    # The plugin's own ragged layout of the same batch (trees held at width 30, as the worker holds them).
    layout = plugin_layout(base, 30)
    cases["plugin_layout"] = {**base, "qo_indptr": layout.qo_indptr, "custom_mask": layout.custom_mask,
                              "mask_indptr": layout.mask_indptr, "max_len_extend": layout.max_nodes}
    # ... as the worker runs it: the forward at its token tier (76 nodes -> 80 rows, the 4 spare rows owned by no
    # request, their q/k/v random), the query length fixed at the full width (30: what a captured graph fixes), the
    # mask in a buffer bounded by rows x (context + width)
    tiered = plugin_layout(base, 30, tier=True)
    spare = tiered.rows - tiered.total
    g = torch.Generator().manual_seed(12)
    cases["plugin_layout_tier"] = {
        **base, **{x: torch.cat([base[x], torch.randn((spare,) + tuple(base[x].shape[1:]), generator=g)])
                   for x in ("q", "k", "v")},
        "qo_indptr": tiered.qo_indptr, "custom_mask": tiered.custom_mask, "mask_indptr": tiered.mask_indptr,
        "max_len_extend": tiered.width}
    # Today's padded layout of the same batch (every request at W = 28).
    cases["padded"], real_rows = padded_case(base, seed=11)
    # skip_prefix_custom_mask=True (the backend's default) never reads the prefix columns: zero them.
    cases["prefix_cols_zero_skipped"] = with_mask(base, base["ancestors"], prefix_value=0)
    # With skip_prefix_custom_mask=False the prefix columns are read: all-ones gives the same result.
    cases["prefix_cols_read"] = with_mask(base, base["ancestors"], skip_prefix_custom_mask=False)
    # ... and all-zero prefix columns hide the prefix (proof that they are read).
    cases["prefix_cols_zero_read"] = with_mask(base, base["ancestors"], prefix_value=0, skip_prefix_custom_mask=False)
    # One request longer than the query tile (70 > BLOCK_M): a tree spanning two tiles, ancestors in the earlier one.
    cases["two_tiles"] = make_case(5, [0, 70, 9], [2, 70, 4], 2, 1, chains=(1,))
    # max_len_extend below the longest request's tile count: the grid is too short (see test below).
    cases["two_tiles_short_grid"] = {**cases["two_tiles"], "max_len_extend": 28}
    t0 = time.perf_counter()
    outputs = run_kernel(cases, tmp_path_factory.mktemp("ragged_verify"))
    print(f"interpreter subprocess: {time.perf_counter() - t0:.1f} s")
    return cases, outputs, real_rows


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("name", list(RAGGED))
def test_ragged_tree_verify_triton_extend_matches_dense_reference(kernel_run, name):
    cases, outputs, _ = kernel_run
    case, o = cases[name], outputs[name]
    assert not torch.isnan(o).any(), "rows left unwritten or NaN KV slots read"
    err = _max_err(o, dense_reference(case))
    print(f"{name}: ext {case['ext_lens']} prefix {case['prefix_lens']} max |kernel - reference| {err:.2e}")
    assert err < ATOL


def test_ragged_tree_verify_plugin_layout_matches_dense_reference(kernel_run):
    """The plugin's ``build_ragged_layout`` (qo_indptr, mask_indptr, packed mask, max_len_extend) drives SGLang's
    kernel to the dense reference on the ragged batch."""
    cases, outputs, _ = kernel_run
    o = outputs["plugin_layout"]
    assert not torch.isnan(o).any()
    assert _max_err(o, dense_reference(cases["gqa2_uint8"])) < ATOL


def test_ragged_tree_verify_at_the_token_tier_matches_dense_reference(kernel_run):
    """The layout as the worker builds it (forward padded to its token tier, query length fixed at the full width,
    mask bounded by rows x (context + width)): the real rows equal the dense reference, and the kernel never writes
    the tier's spare rows (they stay NaN), which belong to no request and are never read."""
    cases, outputs, _ = kernel_run
    o, base = outputs["plugin_layout_tier"], cases["gqa2_uint8"]
    total = sum(base["ext_lens"])
    assert o.shape[0] == 80 and total == 76
    assert not torch.isnan(o[:total]).any()
    assert _max_err(o[:total], dense_reference(base)) < ATOL
    assert torch.isnan(o[total:]).all()


@pytest.mark.parametrize("seed", range(6))
def test_ragged_layout_equals_brute_force(seed):
    """``build_ragged_layout`` against the per-request brute force (``ragged_full_mask`` above): the same mask entries
    up to ``mask_indptr[B]``, the same offsets, compact rows in request and node order; gather then scatter restores
    the real rows and zeroes the absent ones; at the token tier the same, with the spare rows zero in, KV to the sink
    and dropped on the way back."""
    from sglang_hybrid.sglang_plugin.ragged.layout import gather_rows, kv_write_cols, scatter_rows
    from sglang_hybrid.sglang_plugin.ragged.tiers import token_tier

    g = torch.Generator().manual_seed(seed)
    bs = int(torch.randint(1, 9, (), generator=g))
    width = int(torch.randint(2, 31, (), generator=g))
    ext = torch.randint(1, width + 1, (bs,), generator=g).tolist()
    prefix = torch.randint(0, 90, (bs,), generator=g).tolist()
    case = make_case(seed, prefix, ext, 2, 1, chains=(0,))
    for dtype in (torch.bool, torch.uint8):
        layout = plugin_layout(case, width, dtype)
        want, want_indptr = ragged_full_mask(case["ancestors"], prefix, dtype)
        assert torch.equal(layout.mask_indptr, want_indptr)
        assert torch.equal(layout.custom_mask[: int(want_indptr[-1])], want)
        assert torch.equal(layout.qo_indptr.to(torch.int64), case["qo_indptr"])
        assert (layout.total, layout.max_nodes) == (sum(ext), max(ext))
    want_index = torch.cat([b * width + torch.arange(n) for b, n in enumerate(ext)])
    assert torch.equal(layout.token_index, want_index)
    rows = torch.randn(bs * width, 3, generator=g)
    back = scatter_rows(gather_rows(rows, layout), layout)
    assert torch.equal(back[want_index], rows[want_index])
    absent = torch.ones(bs * width, dtype=torch.bool)
    absent[want_index] = False
    assert (back[absent] == 0).all()
    # at the token tier: the same mask, offsets and real rows; the spare rows gather zeros, write KV to the sink (-1)
    # and are dropped by the scatter, whatever the forward put in them
    tiered = plugin_layout(case, width, tier=True)
    t = sum(ext)
    assert tiered.rows == min(token_tier(t), bs * width) and tiered.total == t     # plugin_layout caps at B x W
    assert torch.equal(tiered.mask_indptr, want_indptr)
    assert torch.equal(tiered.custom_mask[: int(want_indptr[-1])], layout.custom_mask[: int(want_indptr[-1])])
    fwd = gather_rows(rows, tiered)
    assert fwd.shape == (tiered.rows, 3) and torch.equal(fwd[:t], rows[want_index]) and (fwd[t:] == 0).all()
    assert kv_write_cols(tiered).tolist() == want_index.tolist() + [-1] * (tiered.rows - t)
    fwd[t:] = float("nan")
    assert torch.equal(scatter_rows(fwd, tiered), back)


@pytest.mark.parametrize("seed", range(6))
def test_ragged_pending_layout_read_equals_the_layout_built_after_the_read(seed):
    """``build_pending_layout`` (built before the node counts reach the host, shapes from the padded batch) then
    ``PendingLayout.read`` gives ``build_ragged_layout``'s layout: the same counts, offsets, compact rows, rows at the
    token tier and mask up to ``mask_indptr[B]``, in a buffer sized for the running limit as the Triton backend's is;
    the read reports the host counts and rows once; the sentinel rows past ``T`` write only the spare entry; the
    compaction queued before the read (``gather_ahead``, ``write_cols_ahead``) starts with ``gather_rows``' and
    ``kv_write_cols``' rows at the tier, zeros and the sink past them."""
    from sglang_hybrid.sglang_plugin.ragged.layout import (build_pending_layout, gather_rows, kv_write_cols,
                                                           mask_numel_bound, node_counts)
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows

    g = torch.Generator().manual_seed(100 + seed)
    bs = int(torch.randint(1, 9, (), generator=g))
    width = int(torch.randint(2, 31, (), generator=g))
    ext = torch.randint(1, width + 1, (bs,), generator=g).tolist()
    prefix = torch.randint(0, 90, (bs,), generator=g).tolist()
    case = make_case(seed, prefix, ext, 2, 1, chains=(0,))
    want = plugin_layout(case, width, tier=True)
    valid, anc = padded_tree(case, width)
    seq_lens, counts = torch.tensor(prefix), node_counts(valid)
    max_bs = bs + 2                                                     # the running limit: more than this step's
    row_bound = max(prefix) + width
    buf = torch.zeros(max_bs * width * row_bound + 1, dtype=torch.uint8)   # triton_backend.enable's size
    seen = []
    pending = build_pending_layout(valid, anc, seq_lens, int(seq_lens.sum()), counts, mask_out=buf,
                                   row_bound=row_bound, max_rows=bs * width, on_read=lambda h, r: seen.append((h, r)))
    assert pending.token_index.shape == (bs * width,) and (pending.token_index[sum(ext):] == bs * width).all()
    got = pending.read()
    assert seen == [(ext, tier_rows(sum(ext), bs * width))]
    assert (got.total, got.max_nodes, got.rows, got.width) == (want.total, want.max_nodes, want.rows, want.width)
    for name in ("counts", "token_index", "qo_indptr", "mask_indptr"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    end = int(want.mask_indptr[-1])
    assert got.custom_mask.data_ptr() == buf.data_ptr()
    assert torch.equal(got.custom_mask[:end], want.custom_mask[:end].to(torch.uint8))
    # past the requests' entries the buffer is ones up to the bound's spare entry: nothing else was written there
    bound = mask_numel_bound(width, bs * width, int(seq_lens.sum()), row_bound)
    assert (buf[end:bound - 1] == 1).all()
    # the compaction queued before the read: its first rows are gather_rows' and kv_write_cols' at the tier
    rows = torch.randn(bs * width, 3, generator=g)
    ahead = pending.gather_ahead(rows)
    assert ahead.shape[0] == pending.rows_bound() >= got.rows
    assert torch.equal(ahead[: got.rows], gather_rows(rows, want)) and (ahead[got.rows:] == 0).all()
    ids = torch.randint(0, 100, (bs * width,), generator=g)
    assert torch.equal(pending.gather_ahead(ids)[: got.rows], gather_rows(ids, want))
    assert torch.equal(pending.write_cols_ahead()[: got.rows], kv_write_cols(want))


def test_ragged_layout_kernels_refuse_what_they_cannot_build():
    """``kernels.ragged_layout`` checks its host-known inputs before it launches (the kernels themselves are compared
    with the torch builder under the interpreter, ``tests/kernels/test_fused_decision.py``): shapes that disagree, fewer
    slots than requests, a mask buffer too small or of a dtype no attention kernel reads, rows that are not the padded
    batch's, an output buffer too short; each error names what is wrong."""
    from sglang_hybrid.kernels.ragged_layout import compact_ahead, pending_layout
    from sglang_hybrid.sglang_plugin.ragged.layout import mask_numel_bound

    bs, w = 3, 5
    valid = torch.arange(w)[None] < torch.tensor([1, 3, 5])[:, None]
    anc = torch.ones(bs, w, w, dtype=torch.bool)
    seq = torch.tensor([4, 0, 9])
    need = mask_numel_bound(w, bs * w, 13, 14)
    ok = torch.ones(need, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"ancestors must be \[3, 5, 5\]"):
        pending_layout(valid, anc[:, :4], seq, 13, mask_out=ok, row_bound=14)
    with pytest.raises(ValueError, match=r"seq_lens \[3\]"):
        pending_layout(valid, anc, seq[:2], 13, mask_out=ok, row_bound=14)
    with pytest.raises(ValueError, match="does not fit 2 request slots"):
        pending_layout(valid, anc, seq, 13, mask_out=ok, row_bound=14, slots=2)
    with pytest.raises(ValueError, match=f"holds {need - 1} entries, this step needs up to {need}"):
        pending_layout(valid, anc, seq, 13, mask_out=ok[:-1], row_bound=14)
    with pytest.raises(ValueError, match="bool or uint8"):
        pending_layout(valid, anc, seq, 13, mask_out=torch.ones(need, dtype=torch.int32), row_bound=14)
    index = torch.arange(bs * w)
    with pytest.raises(ValueError, match=r"input_ids must be the padded batch's \[15\] rows"):
        compact_ahead(index, 16, torch.zeros(14, dtype=torch.int64), torch.zeros(15, dtype=torch.int64))
    with pytest.raises(ValueError, match="cannot take 16 rows"):
        compact_ahead(index, 16, torch.zeros(15, dtype=torch.int64), torch.zeros(15, dtype=torch.int64),
                      out=(torch.zeros(15, dtype=torch.int64), torch.zeros(16, dtype=torch.int64)))


def test_ragged_pending_layout_compiles_fullgraph_with_no_host_int_from_the_device():
    """The build before the read takes no host int derived from the device (``T`` and ``max(counts)`` are not
    known yet): ``torch.compile(fullgraph=True)`` traces it as a function of the device tensors only."""
    from sglang_hybrid.sglang_plugin.ragged.layout import build_pending_layout, node_counts

    case = make_case(8, [5, 0, 40], [4, 1, 9], 2, 1)
    valid, anc = padded_tree(case, 12)
    seq_lens = torch.tensor(case["prefix_lens"])

    def build(valid, anc, seq_lens):
        lay = build_pending_layout(valid, anc, seq_lens, 45, node_counts(valid), row_bound=52)
        return lay.token_index, lay.qo_indptr, lay.mask_indptr, lay.custom_mask

    torch._dynamo.reset()
    got = torch.compile(build, fullgraph=True, backend="eager")(valid, anc, seq_lens)
    for a, b in zip(got, build(valid, anc, seq_lens)):
        assert torch.equal(a, b)


def test_ragged_token_tiers_cover_every_row_count_under_the_cap():
    """``tiers``: every count of real rows 1..cap runs at the smallest listed tier holding it; the list is what
    ``token_tiers`` returns (the graphs to capture), ascending, ending at the cap; above 64 rows a tier pads under
    12.5 % unless the cap cuts it; the replay charges the same tiers (``bench.replay.engine.token_tier``)."""
    from bench.replay import engine as replay_engine
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows, token_tier, token_tiers

    assert replay_engine.token_tier is token_tier
    for cap in (1, 7, 8, 13, 100, 128 * 13, 48 * 25):
        listed = token_tiers(cap)
        assert listed == sorted(set(listed)) and listed[-1] == cap
        for n in range(1, cap + 1):
            t = tier_rows(n, cap)
            assert t == min(x for x in listed if x >= n)
            assert t == cap or (t - n) / n < 0.125 or n <= 64
    assert len(token_tiers(2048)) == 48 and token_tiers(20) == [8, 16, 20]
    with pytest.raises(ValueError, match="does not fit the 13 rows"):
        tier_rows(14, 13)
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        token_tiers(0)


def test_ragged_layout_does_not_depend_on_the_padded_width():
    """The same trees held at width 28 or at width 63 (``widths.widen``, what a ragged step at a narrower bucket
    does) give the same compact forward: counts, offsets and mask; only the padded rows the compact ones map to
    differ."""
    case = make_case(3, [12, 0, 77], [28, 1, 6], 2, 1)
    narrow, wide = plugin_layout(case, 28), plugin_layout(case, 63)
    for name in ("counts", "qo_indptr", "mask_indptr"):
        assert torch.equal(getattr(narrow, name), getattr(wide, name))
    end = int(narrow.mask_indptr[-1])
    assert torch.equal(narrow.custom_mask[:end], wide.custom_mask[:end])
    req = torch.div(narrow.token_index, 28, rounding_mode="floor")
    assert torch.equal(wide.token_index, narrow.token_index + req * (63 - 28))


def test_ragged_layout_errors_name_the_problem():
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, node_counts, ragged_full_mask as build

    case = make_case(0, [3, 4], [2, 3], 2, 1)
    valid, anc = padded_tree(case, 4)
    seq_lens, counts = torch.tensor([3, 4]), node_counts(valid)
    with pytest.raises(ValueError, match="total verify tokens 9 outside"):
        build_ragged_layout(valid, anc, seq_lens, 7, counts, total=9, max_nodes=3)
    with pytest.raises(ValueError, match="max nodes per request 5 outside"):
        build_ragged_layout(valid, anc, seq_lens, 7, counts, total=5, max_nodes=5)
    with pytest.raises(ValueError, match="counts must be"):
        build_ragged_layout(valid, anc, seq_lens, 7, counts[:1], total=5, max_nodes=3)
    with pytest.raises(ValueError, match="forward of 4 rows cannot hold 5 verify tokens"):
        build_ragged_layout(valid, anc, seq_lens, 7, counts, total=5, max_nodes=3, rows=4)
    index = torch.tensor([0, 1, 4, 5, 6])
    with pytest.raises(ValueError, match="holds 3 entries"):
        build(anc, counts, index, seq_lens, 7, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool or uint8"):
        build(anc, counts, index, seq_lens, 7, torch.ones(100, dtype=torch.int32))


def test_ragged_layout_compiles_fullgraph():
    """The layout build is static-shape tensor code given its host ints: ``torch.compile(fullgraph=True)`` traces it
    (no host read, no data-dependent branch) and gives the eager result."""
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, kv_write_cols, node_counts

    case = make_case(7, [5, 0, 40], [4, 1, 9], 2, 1)
    valid, anc = padded_tree(case, 12)
    seq_lens, counts = torch.tensor(case["prefix_lens"]), node_counts(valid)

    def build(valid, anc, seq_lens, counts):
        lay = build_ragged_layout(valid, anc, seq_lens, 45, counts, total=14, max_nodes=9, rows=16, row_bound=52)
        return lay.token_index, lay.qo_indptr, lay.mask_indptr, lay.custom_mask, kv_write_cols(lay)

    torch._dynamo.reset()
    got = torch.compile(build, fullgraph=True, backend="eager")(valid, anc, seq_lens, counts)
    for a, b in zip(got, build(valid, anc, seq_lens, counts)):
        assert torch.equal(a, b)


def test_ragged_triton_backend_buffers_are_sized_once_and_refuse_what_they_cannot_hold():
    """``triton_backend.enable`` turns SGLang's ``TritonAttnBackend`` (the real class, its index buffers set as its
    constructor sets them) into ``RaggedTritonAttnBackend`` with the plan's buffers sized once for the running limit at
    the full width (``max_bs x W`` rows, a mask of ``rows x (context + W)`` entries + 1); again with the same sizes it
    is a no-op, with others, another class or more requests than the backend's index buffers hold it refuses; a step's
    mask past the buffer (the layout build's own check) and a forward whose rows are not the layout's are refused by
    name."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sglang_hybrid.sglang_plugin.ragged import triton_backend as rt
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, node_counts

    backend = TritonAttnBackend.__new__(TritonAttnBackend)
    backend.qo_indptr = torch.zeros(9, dtype=torch.int64)                    # a request pool of 8
    backend.max_context_len, backend.device = 100, "cpu"
    rt.enable(backend, 6, 13)
    buf = backend.ragged_buffers
    assert type(backend) is rt.RaggedTritonAttnBackend
    assert (buf.max_bs, buf.width, buf.max_rows, buf.row_bound) == (6, 13, 78, 113)
    assert buf.kv_indices.shape == (600,) and buf.mask.shape == (78 * 113 + 1,) and buf.mask.dtype == torch.uint8
    rt.enable(backend, 6, 13)
    assert backend.ragged_buffers is buf
    with pytest.raises(ValueError, match="for 6 requests at width 13, not 6 at 25"):
        rt.enable(backend, 6, 25)
    with pytest.raises(TypeError, match="got object"):
        rt.enable(object(), 6, 13)
    other = TritonAttnBackend.__new__(TritonAttnBackend)
    other.qo_indptr, other.max_context_len, other.device = torch.zeros(9, dtype=torch.int64), 100, "cpu"
    with pytest.raises(ValueError, match="index buffers hold 8"):
        rt.enable(other, 9, 13)
    def full_chains(bs):                                                    # bs requests of 13 nodes, prefixes 100
        valid = torch.ones(bs, 13, dtype=torch.bool)
        anc = torch.ones(13, 13, dtype=torch.bool).tril().expand(bs, 13, 13).clone()
        return build_ragged_layout(valid, anc, torch.full((bs,), 100), 100 * bs, node_counts(valid), total=13 * bs,
                                   max_nodes=13, mask_out=buf.mask, rows=13 * bs, row_bound=buf.row_bound)

    assert full_chains(6).custom_mask is buf.mask                           # the bound at the running limit fits
    with pytest.raises(ValueError, match="holds 8815 entries, this step needs up to 10284"):
        full_chains(7)
    layout = SimpleNamespace(rows=16, batch_size=2, width=13)
    fb = SimpleNamespace(spec_info=SimpleNamespace(ragged=layout), input_ids=torch.zeros(12),
                         forward_mode=SimpleNamespace(is_target_verify=lambda: True))
    with pytest.raises(RuntimeError, match="holds 12 tokens but its layout 16 rows"):
        backend.init_forward_metadata(fb)
    fb.input_ids, layout.rows = torch.zeros(80), 80
    with pytest.raises(RuntimeError, match="2 requests, 80 rows at width 13 exceeds the buffers"):
        backend.init_forward_metadata(fb)


def test_ragged_counters_report_tokens_and_node_ranges():
    """``HybridCounters.on_ragged``: per step the verified tokens, the forward's rows (its token tier), what padding
    to the width would have cost, the fewest-most tokens per request and the steps per tier; in the periodic summary
    (cumulative) and its log line."""
    from sglang_hybrid.sglang_plugin.metrics import HybridCounters, format_summary

    counters = HybridCounters("cpu", log_interval=1)
    counters.on_ragged([1, 17, 3], 28, 24)
    counters.on_ragged([4, 4], 6, 8)
    counters.on_ragged([2, 17, 1], 28, 24)
    out = counters.maybe_log()
    assert (out["ragged_steps"], out["ragged_tokens"], out["ragged_padded_tokens"]) == (3, 49, 180)
    assert out["ragged_rows"] == 56 and out["ragged_tier_steps"] == {"8": 1, "24": 2}
    assert out["ragged_node_range_steps"] == {"1-17": 2, "4-4": 1}
    assert "ragged_tokens=49/180 rows=56" in format_summary(out)
    assert HybridCounters("cpu").snapshot()["ragged_steps"] == 0


def test_ragged_tree_verify_wrong_mask_is_detected(kernel_run):
    """Positive control: with a causal extend mask the kernel matches the causal reference, not the tree one."""
    cases, outputs, _ = kernel_run
    tree, wrong, o = cases["gqa2_uint8"], cases["wrong_causal"], outputs["wrong_causal"]
    assert _max_err(o, dense_reference(wrong)) < ATOL
    assert _max_err(o, dense_reference(tree)) > 1e-2
    # Rows whose tree ancestors are exactly their causal predecessors (chains, roots, single nodes) agree; others not.
    same_rows = torch.cat([(a == torch.ones_like(a).tril()).all(1) for a in tree["ancestors"]])
    diff = (o.double() - dense_reference(tree)).abs().amax((1, 2))
    assert (diff[same_rows] < ATOL).all() and (diff[~same_rows] > 1e-3).all()


def test_ragged_tree_verify_equals_padded_layout_on_real_rows(kernel_run):
    """Today's padded layout (plugin's ``verify_nodes`` + ``full_mask``, W = max n_i) gives the same real rows."""
    cases, outputs, real_rows = kernel_run
    padded = outputs["padded"]
    assert not torch.isnan(padded).any()
    assert _max_err(padded[real_rows], outputs["gqa2_uint8"]) < ATOL
    assert _max_err(padded[real_rows], dense_reference(cases["gqa2_uint8"])) < ATOL


def test_ragged_tree_verify_prefix_mask_columns_contract(kernel_run):
    """``skip_prefix_custom_mask=True`` ignores the prefix columns (all prefix visible, whatever they hold); with
    ``False`` they are read, so the layout must still carry them (all ones) -- the row stride is prefix_i + n_i."""
    cases, outputs, _ = kernel_run
    ref = dense_reference(cases["gqa2_uint8"])
    assert _max_err(outputs["prefix_cols_zero_skipped"], ref) < ATOL
    assert _max_err(outputs["prefix_cols_read"], ref) < ATOL
    assert _max_err(outputs["prefix_cols_zero_read"], dense_reference(cases["gqa2_uint8"], prefix_visible=False)) < ATOL
    assert _max_err(outputs["prefix_cols_zero_read"], ref) > 1e-2


def test_ragged_tree_verify_across_query_tiles(kernel_run):
    """A 70-node tree (longer than the 64-row query tile) with ``is_causal=True``: the causal bound on the extend
    columns, ``min(n_i, (tile + 1) * BLOCK_M)``, is harmless because ancestors precede their nodes (parents[i] < i)."""
    cases, outputs, _ = kernel_run
    assert not torch.isnan(outputs["two_tiles"]).any()
    assert _max_err(outputs["two_tiles"], dense_reference(cases["two_tiles"])) < ATOL


def _twin(case: dict) -> torch.Tensor:
    from sglang_hybrid.cpu_engine.torch_attention import extend_attention_torch

    o = torch.full_like(case["q"], float("nan"))
    extend_attention_torch(case["q"], case["k"], case["v"], o, case["k_buffer"], case["v_buffer"], case["qo_indptr"],
                           case["kv_indptr"], case["kv_indices"], case["custom_mask"], case["is_causal"],
                           case["mask_indptr"], case["max_len_extend"], 1.0, 1.0, sm_scale=None,
                           skip_prefix_custom_mask=case["skip_prefix_custom_mask"])
    return o


def test_ragged_torch_attention_twin_matches_sglang_kernel(kernel_run):
    """The CPU engine's torch twin of the extend kernel (``cpu_engine/torch_attention.py``, which the faster live
    cases run) gives SGLang's kernel's output on every batch above: ragged trees, GQA, causal and not, the plugin's
    layout (also at its token tier, whose spare rows neither writes), the padded layout, prefix mask columns skipped
    and read, a tree across query tiles, the wrong mask of the positive control. A ``max_len_extend`` shorter than a
    request, which the kernel silently half-writes, is refused.
    """
    cases, outputs, _ = kernel_run
    for name, case in cases.items():
        if name == "two_tiles_short_grid":
            with pytest.raises(ValueError, match="max_len_extend"):
                _twin(case)
            continue
        o, want = _twin(case), outputs[name]
        written = ~torch.isnan(want)                # all rows but the token tier's spare ones (owned by no request)
        assert torch.equal(~torch.isnan(o), written), name
        assert _max_err(o[written], want[written]) < ATOL, name


def test_ragged_torch_attention_twin_refuses_what_it_does_not_implement():
    """Every kernel feature the twin lacks is refused by name, as is a causal tree mask pointing at a later node
    (the kernel bounds a causal row at its query tile whatever the mask says)."""
    from sglang_hybrid.cpu_engine.torch_attention import extend_attention_torch

    case = make_case(0, [3, 4], [2, 3], 2, 1)
    args = [case[a] for a in ("q", "k", "v")] + [torch.empty_like(case["q"])] + [
        case[a] for a in ("k_buffer", "v_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask",
                          "is_causal", "mask_indptr", "max_len_extend")]
    for feature, kwargs in (("sliding_window", {"sliding_window_size": 8}), ("sinks", {"sinks": torch.zeros(2)}),
                            ("logit_cap", {"logit_cap": 30.0}), ("lse_output", {"lse_extend": torch.empty(5, 2)}),
                            ("paged_kv", {"page_size": 16}), ("kv_scales", {"k_scale": 0.5})):
        with pytest.raises(NotImplementedError, match=feature):
            extend_attention_torch(*args, **kwargs)
    later = with_mask(case, [torch.ones(n, n, dtype=torch.bool) for n in case["ext_lens"]])
    with pytest.raises(NotImplementedError, match="later extend key"):
        _twin({**later, "is_causal": True})


def test_ragged_tree_verify_max_len_extend_must_cover_longest_request(kernel_run):
    """Contract: the grid's query-tile axis is ``cdiv(max_len_extend, BLOCK_M)``, so ``max_len_extend`` must be at
    least the longest request's node count (rounded up to the tile). A uniform-width value (``TritonAttnBackend``'s
    ``max_extend_len = num_tokens_per_req``) smaller than a request's nodes leaves its later tiles unwritten."""
    cases, outputs, _ = kernel_run
    o, ref = outputs["two_tiles_short_grid"], dense_reference(cases["two_tiles"])
    qo = cases["two_tiles"]["qo_indptr"]
    long_req = torch.arange(int(qo[1]), int(qo[2]))
    written, unwritten = long_req[:BLOCK_M], long_req[BLOCK_M:]
    assert torch.isnan(o[unwritten]).all()
    keep = torch.ones(o.shape[0], dtype=torch.bool)
    keep[unwritten] = False
    assert _max_err(o[keep], ref[keep]) < ATOL and len(written) == BLOCK_M


# ----------------------------------------------------------------------------------------------- FlashInfer's plan
def _flashinfer_args_main(inp: str, out: str) -> None:
    """Subprocess entry: ``HybridVerifyInput.generate_attn_arg_prefill`` of a ragged step, with SGLang's own KV index
    translator and KV plan over the case's request rows (TRITON_INTERPRET set: the translator packs with a Triton
    kernel)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.modules.setdefault("vllm", None)
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind, KVLocPlan

    from sglang_hybrid.sglang_plugin.verify_input import HybridVerifyInput

    case = torch.load(inp, weights_only=False)
    translator = KVIndexTranslator(req_to_token=case["req_to_token"], token_to_kv_pool_allocator=object(),
                                   token_to_kv_pool=object(), page_size=1, device="cpu")
    rows, seq_lens = case["req_pool_indices"], case["seq_lens"]
    plan = KVLocPlan(source=translator, req_pool_indices=rows, seq_lens=seq_lens, seq_lens_cpu=seq_lens,
                     write_virtual=case["window"].reshape(-1), read_extent=case["width"])
    kw = dict(req_pool_indices=rows, paged_kernel_lens=seq_lens, paged_kernel_lens_sum=int(seq_lens.sum()),
              translator=translator, plan=plan, kind=IdSpaceKind.FULL)
    if case["tier"]:        # the token-tier graphs' plan, through the backend, over the graph runner's slots
        torch.save(_plan_through_tier_backend(case, translator, plan), out)
        return
    verify = HybridVerifyInput.__new__(HybridVerifyInput)      # the eager plan: SGLang's backend asks the verify input
    verify.ragged = case["layout"]
    torch.save(verify.generate_attn_arg_prefill(**kw), out)


class FlashInferGraphWrapperContract:
    """FlashInfer 0.7.2's ``BatchPrefillWithPagedKVCacheWrapper`` with ``use_cuda_graph=True``, its Python contract
    only, as its source states it (``prefill.py``: ``__init__`` ~2161-2197, ``plan`` ~2770-2825, ``run``'s row check
    ~3441): the request count fixed by the buffers; the rows fixed at the first plan (later plans at most that many);
    the indices, the indptrs and the packed mask copied into the buffers given at construction (each request's bits
    packed to whole bytes, ``segment_packbits``); ``run`` takes ``qo_indptr[-1]`` query rows. No kernel: FlashInfer has
    none on the CPU. It records each plan's arguments, which the test runs through the float64 model of its kernel."""

    def __init__(self, float_workspace, layout, *, use_cuda_graph, backend, qo_indptr_buf, paged_kv_indptr_buf,
                 paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf):
        assert use_cuda_graph and layout == "NHD" and backend == "fa2"
        self.fixed_batch_size = len(qo_indptr_buf) - 1
        if len(paged_kv_indptr_buf) != self.fixed_batch_size + 1:
            raise ValueError("paged_kv_indptr_buf must have length batch_size + 1")
        if len(paged_kv_last_page_len_buf) != self.fixed_batch_size:
            raise ValueError("paged_kv_last_page_len_buf must have length batch_size")
        self.bufs = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
                     custom_mask_buf, mask_indptr_buf)
        self.max_total_num_rows, self.plans, self.workspaces = None, [], []

    def reset_workspace_buffer(self, float_workspace, int_workspace):
        self.workspaces.append((float_workspace, int_workspace))

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim, page_size, *, q_data_type, kv_data_type, custom_mask, non_blocking):
        qo_buf, kv_buf, idx_buf, last_buf, mask_buf, mask_indptr_buf = self.bufs
        rows, batch = int(qo_indptr[-1]), len(qo_indptr) - 1
        if self.max_total_num_rows is None:
            self.max_total_num_rows = rows
        elif rows > self.max_total_num_rows:
            raise ValueError("The total number of rows in qo_indptr in cuda graph mode cannot exceed the number of "
                             "rows set during initialization")
        if batch != self.fixed_batch_size:
            raise ValueError("The batch size should be fixed during the lifecycle of the wrapper in cuda graph mode")
        if len(paged_kv_indices) > len(idx_buf):
            raise ValueError("The length of paged_kv_indices exceeds the allocated buffer size.")
        bits = (qo_indptr.diff().long() * paged_kv_indptr.diff().long()).tolist()     # page size 1
        packed = [(b + 7) // 8 for b in bits]
        if sum(packed) > len(mask_buf):
            raise RuntimeError("the packed custom mask exceeds custom_mask_buf")
        qo_buf.copy_(qo_indptr)
        kv_buf.copy_(paged_kv_indptr)
        last_buf.copy_(paged_kv_last_page_len)
        idx_buf[: len(paged_kv_indices)].copy_(paged_kv_indices)
        mask_indptr_buf.copy_(torch.tensor([0] + packed).cumsum(0))
        self.plans.append({"args": (paged_kv_indices.clone(), paged_kv_indptr.clone(), qo_indptr.clone(),
                                    custom_mask.clone()), "last_page_len": paged_kv_last_page_len.clone(),
                           "heads": (num_qo_heads, num_kv_heads, head_dim, page_size),
                           "dtypes": (q_data_type, kv_data_type), "non_blocking": non_blocking})

    def run_rows_check(self, q_rows: int) -> None:
        if q_rows != int(self.bufs[0][-1]):
            raise ValueError("q.shape[0] does not match qo_indptr[-1]")


def _plan_through_tier_backend(case: dict, translator, plan) -> dict:
    """The case's step planned by ``RaggedFlashInferAttnBackend`` (SGLang's real ``FlashInferAttnBackend`` object,
    made with ``__new__`` and the attributes its plan reads, ``tests.helpers.sglang_backends_on_cpu.flashinfer_step``,
    turned by ``flashinfer_backend.enable``), its wrappers
    FlashInfer's contract (``FlashInferGraphWrapperContract``): the step at its tier, the same step at the next tier (a
    second wrapper), then at its tier again (the first wrapper, planned again as before a replay)."""
    import dataclasses
    from types import SimpleNamespace

    import sglang.srt.layers.attention.flashinfer_backend as fb
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_hybrid.sglang_plugin.ragged import flashinfer_backend as rf
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows
    from tests.helpers.sglang_backends_on_cpu import flashinfer_step

    fb.BatchPrefillWithPagedKVCacheWrapper = FlashInferGraphWrapperContract
    layout, slots, width = case["layout"], int(case["seq_lens"].numel()), case["width"]
    backend = flashinfer_step(fb, max_bs=slots, context=200)
    backend.prefill_uses_dequant_workspace, backend.kv_index_translator = False, translator
    backend.workspace_buffer, backend.prefill_backend = torch.empty(64, dtype=torch.uint8), "fa2"
    backend.indices_updater_prefill = SimpleNamespace(num_qo_heads=4, num_kv_heads=2, head_dim=HEAD_DIM,
                                                      q_data_type=torch.bfloat16, data_type=torch.bfloat16)
    rf.enable(backend, slots, width)
    seq_lens = case["seq_lens"]
    next_rows = tier_rows(layout.rows + 1, slots * width)
    steps = []
    for rows in (layout.rows, next_rows, layout.rows):
        step = dataclasses.replace(layout, rows=rows)
        batch = SimpleNamespace(spec_info=SimpleNamespace(ragged=step), forward_mode=ForwardMode.TARGET_VERIFY,
                                batch_size=slots, input_ids=torch.zeros(rows, dtype=torch.int64),
                                req_pool_indices=case["req_pool_indices"], seq_lens=seq_lens,
                                seq_lens_sum=int(seq_lens.sum()), kv_loc_plan=plan)
        backend.init_forward_metadata(batch)
        (wrapper,) = backend.forward_metadata.prefill_wrappers
        wrapper.run_rows_check(rows)
        steps.append({"rows": rows, "wrapper": id(wrapper), "plan": wrapper.plans[-1],
                      "workspaces": [tuple(t.data_ptr() for t in w) for w in wrapper.workspaces],
                      "use_ragged": backend.forward_metadata.use_ragged})
    buf = backend.ragged_buffers
    return {"steps": steps, "wrappers": sorted(backend.tier_wrappers), "next_rows": next_rows,
            "shared_workspace": (backend.workspace_buffer.data_ptr(), buf.int_workspace.data_ptr()),
            "class": type(backend).__name__}


def flashinfer_reference(args: tuple, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> tuple:
    """FlashInfer 0.7.2's paged prefill with a custom mask, as its source defines it (``prefill.py`` ~1594-1614: page
    size 1, every request's bits ``qo_len x kv_len`` row-major at the running sum of those products), in float64:
    ``(output, mask_indptr)``."""
    kv_indices, kv_indptr, qo_indptr, mask = args
    qo_len, kv_len = qo_indptr.diff().long(), kv_indptr.diff().long()
    mask_indptr = torch.zeros(len(qo_len) + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(qo_len * kv_len, 0)
    group = q.shape[1] // k_buffer.shape[1]
    out = torch.empty_like(q, dtype=torch.float64)
    for b in range(len(qo_len)):
        q0, n, s = int(qo_indptr[b]), int(qo_len[b]), int(kv_len[b])
        idx = kv_indices[int(kv_indptr[b]):int(kv_indptr[b]) + s].long()
        keys = k_buffer[idx].double().repeat_interleave(group, dim=1)
        vals = v_buffer[idx].double().repeat_interleave(group, dim=1)
        bits = mask[int(mask_indptr[b]):int(mask_indptr[b + 1])].reshape(n, s)
        scores = torch.einsum("qhd,shd->hqs", q[q0:q0 + n].double(), keys) / HEAD_DIM ** 0.5
        out[q0:q0 + n] = torch.einsum("hqs,shd->qhd", scores.masked_fill(~bits[None], float("-inf")).softmax(-1),
                                      vals)
    return out, mask_indptr


def _flashinfer_args(tmp_path, width: int, prefix: list, ext: list, *, slots: int | None = None) -> tuple:
    """A ragged step's FlashInfer plan, computed in the interpreter with SGLang's own KV index translator and KV plan:
    eager (``slots`` None: the arguments of ``HybridVerifyInput.generate_attn_arg_prefill``) or for the token-tier
    graphs over ``slots`` requests (the layout padded to its tier and to the slots, as ``graph_runner`` hands it over,
    planned by the backend: ``_plan_through_tier_backend``'s record). ``(case, layout, planned, pool_rows,
    req_to_token)``."""
    from sglang_hybrid.sglang_plugin.ragged.graph_runner import pad_requests
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, node_counts
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows

    case = make_case(2, prefix, ext, 4, 2, chains=(1,))
    valid, anc = padded_tree(case, width)
    seq_lens = torch.tensor(prefix)
    counts = node_counts(valid)
    rows = sum(ext) if slots is None else tier_rows(sum(ext), slots * width)
    layout = build_ragged_layout(valid, anc, seq_lens, int(seq_lens.sum()), counts, total=sum(ext),
                                 max_nodes=max(ext), rows=rows)
    # SGLang's request rows: the prefix slots, then the verify window (the real nodes' slots first: out_cache_loc,
    # then fresh slots for the absent nodes), in request rows other than the batch order
    g = torch.Generator().manual_seed(5)
    pool_rows = torch.randperm(9, generator=g)[: len(ext)]
    req_to_token = torch.zeros(9, max(prefix) + width, dtype=torch.int32)
    window = torch.zeros(len(ext), width, dtype=torch.int64)
    spare = iter(range(2000, 3000))
    kvp, qo = case["kv_indptr"], case["qo_indptr"]
    for b, (r, p, n) in enumerate(zip(pool_rows.tolist(), prefix, ext)):
        window[b, :n] = case["out_cache_loc"][int(qo[b]):int(qo[b]) + n]
        window[b, n:] = torch.tensor([next(spare) for _ in range(width - n)])
        req_to_token[r, :p] = case["kv_indices"][int(kvp[b]):int(kvp[b + 1])]
        req_to_token[r, p:p + width] = window[b]
    req_pool_indices = pool_rows
    if slots is not None:   # the graph runner's static batch: the slots past the step's requests empty
        layout = pad_requests(layout, slots)
        pad = slots - len(ext)
        req_pool_indices = torch.cat([pool_rows, pool_rows.new_zeros(pad)])
        seq_lens = torch.cat([seq_lens, seq_lens.new_zeros(pad)])
        window = torch.cat([window, window.new_zeros(pad, width)])
    inp, out = tmp_path / "case.pt", tmp_path / "args.pt"
    torch.save({"req_to_token": req_to_token, "req_pool_indices": req_pool_indices, "seq_lens": seq_lens,
                "window": window, "width": width, "layout": layout, "tier": slots is not None}, inp)
    run_interpreted(__name__, "flashinfer_args", inp, out)
    return case, layout, torch.load(out, weights_only=False), pool_rows, req_to_token


def _assert_request_kv(args, prefix: list, ext: list, pool_rows, req_to_token) -> None:
    """Each request's paged KV: its prefix, then its first ``n_b`` verify slots (where the ragged forward writes its
    real nodes)."""
    kv_indices, kv_indptr = args[0], args[1]
    want_lens = torch.tensor(prefix) + torch.tensor(ext)
    assert kv_indptr[: len(ext) + 1].tolist() == [0] + torch.cumsum(want_lens, 0).tolist()
    for b, r in enumerate(pool_rows.tolist()):
        got = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        assert torch.equal(got, req_to_token[r, : int(want_lens[b])]), b


def test_ragged_verify_flashinfer_plan_args_give_the_dense_reference(tmp_path):
    """What HYBRID's verify input hands SGLang's FlashInfer backend for an eager ragged step
    (``ragged.flashinfer_plan``), computed with SGLang's own KV index translator and KV plan: ``qo_indptr`` the
    layout's; the paged KV of each request its prefix then its first ``n_b`` verify slots (where the ragged forward
    writes its real nodes); the mask FlashInfer indexes by ``qo_len x kv_len`` per request equal to the layout's.
    Through FlashInfer's documented semantics (a float64 model of its kernel: FlashInfer has no CPU kernels) they give
    the dense reference. A padded step still gets SGLang's own arguments (the same entry with no layout: another path,
    not run here)."""
    prefix, ext = [129, 0, 64, 7, 33, 1], [1, 28, 5, 13, 2, 27]
    case, layout, args, pool_rows, req_to_token = _flashinfer_args(tmp_path, 30, prefix, ext)
    qo_indptr, mask = args[2], args[3]
    assert torch.equal(qo_indptr, layout.qo_indptr) and mask.dtype == torch.bool
    _assert_request_kv(args, prefix, ext, pool_rows, req_to_token)
    # the case's KV pool is as the ragged forward leaves it: the prefix, and each real node's KV at its verify slot
    o, mask_indptr = flashinfer_reference(args, case["q"], case["k_buffer"], case["v_buffer"])
    assert torch.equal(mask_indptr, layout.mask_indptr)
    assert _max_err(o, dense_reference(case)) < ATOL


@pytest.mark.parametrize("ext, want_spare", [([1, 28, 5, 13, 2, 27], 4), ([3, 3, 2, 3, 2, 4], 7),
                                             ([3, 3, 2, 3, 2, 3], 0), ([30, 30, 30, 30, 30, 30], 12)])
def test_ragged_verify_flashinfer_tier_args_give_the_dense_reference(tmp_path, ext, want_spare):
    """What the token-tier graphs' FlashInfer wrapper is planned with (``flashinfer_plan.tier_verify_args``, through
    ``RaggedFlashInferAttnBackend.init_forward_metadata`` on SGLang's real backend object, its wrappers a model of
    FlashInfer 0.7.2's CUDA-graph wrapper contract: ``FlashInferGraphWrapperContract``): the step's 6 requests padded
    to 8 slots, the forward padded to its token tier, and one more request owning the tier's spare rows, so that every
    plan of the tier has the request count (slots + 1) and the rows (``qo_indptr[-1]``) a CUDA-graph wrapper fixes at
    its capture; one wrapper per tier, planned again before each replay. Through the float64 model of
    FlashInfer's masked paged prefill: the real rows equal the dense reference (every slot a request does not own is
    NaN, so a read past its own KV would poison it); the spare rows read only SGLang's sink slot (id 0), which they
    wrote; the padding slots own nothing. Cases: ragged (76 tokens in the tier of 80), short (17 in 24), a tier filled
    exactly (16: no spare rows, the owner empty), every request at the full width (180 in 192)."""
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows

    width, slots, prefix = 30, 8, [129, 0, 64, 7, 33, 1]
    case, layout, planned, pool_rows, req_to_token = _flashinfer_args(tmp_path, width, prefix, ext, slots=slots)
    # the backend: one wrapper per tier, each planned with FlashInfer's contract kept (request count, rows at most its
    # first plan's, buffer sizes, q rows = qo_indptr[-1]), every wrapper on the one int workspace, SGLang's paged path
    first, other, again = planned["steps"]
    assert planned["class"] == "RaggedFlashInferAttnBackend"
    assert planned["wrappers"] == sorted({layout.rows, planned["next_rows"]}) and layout.rows < planned["next_rows"]
    assert first["wrapper"] == again["wrapper"] != other["wrapper"] and not first["use_ragged"]
    assert first["workspaces"] == other["workspaces"] == [planned["shared_workspace"]]
    plan = again["plan"]
    assert plan["heads"] == (4, 2, HEAD_DIM, 1) and plan["dtypes"] == (torch.bfloat16, torch.bfloat16)
    assert plan["last_page_len"].tolist() == [1] * (slots + 1) and plan["non_blocking"]
    assert all(torch.equal(a, b) for a, b in zip(first["plan"]["args"], plan["args"]))
    assert int(other["plan"]["args"][2][-1]) == planned["next_rows"]
    args = kv_indices, kv_indptr, qo_indptr, mask = plan["args"]
    total = sum(ext)
    rows = tier_rows(total, slots * width)
    spare = rows - total
    assert layout.rows == rows and spare == want_spare
    # slots + 1 requests; the padding slots own no rows and no KV; the owner the spare rows over the sink
    assert len(qo_indptr) == len(kv_indptr) == slots + 2 and mask.dtype == torch.bool
    assert qo_indptr.tolist() == [0] + torch.cumsum(torch.tensor(ext), 0).tolist() + [total] * 2 + [rows]
    _assert_request_kv(args, prefix, ext, pool_rows, req_to_token)
    real_kv = int(kv_indptr[len(ext)])
    assert kv_indptr[len(ext):slots + 1].tolist() == [real_kv] * (slots + 1 - len(ext))
    assert int(kv_indptr[-1]) - real_kv == spare and kv_indices[real_kv:real_kv + spare].tolist() == [0] * spare
    # the forward as the graph runs it: the real rows, then the spare rows, which wrote their KV to the sink
    g = torch.Generator().manual_seed(11)
    q = torch.cat([case["q"], torch.randn(spare, *case["q"].shape[1:], generator=g)])
    k_buffer, v_buffer = case["k_buffer"].clone(), case["v_buffer"].clone()
    k_buffer[0], v_buffer[0] = torch.randn(2, *k_buffer.shape[1:], generator=g)
    o, mask_indptr = flashinfer_reference(args, q, k_buffer, v_buffer)
    assert torch.equal(mask_indptr[: slots + 1], layout.mask_indptr)
    assert mask_indptr[-1] - mask_indptr[-2] == spare * spare
    assert _max_err(o[:total], dense_reference(case)) < ATOL
    group = q.shape[1] // k_buffer.shape[1]
    assert torch.allclose(o[total:], v_buffer[0].double().repeat_interleave(group, dim=0).expand(spare, -1, -1))
    # what the plan copies fits the buffers sized at start for this context (the longest prefix here): the KV indices,
    # and the mask once FlashInfer packs each request's bits to whole bytes (``segment_packbits``)
    from sglang_hybrid.sglang_plugin.memory_budget import flashinfer_tier_buffer_sizes

    sizes = flashinfer_tier_buffer_sizes(slots, width, max(prefix))
    packed = sum((int(n) + 7) // 8 for n in mask_indptr.diff())
    assert len(kv_indices) <= sizes["kv_indices"] and packed <= sizes["mask"]


def test_ragged_verify_flashinfer_tier_args_refuse_a_layout_short_of_its_tokens():
    """A layout whose rows do not hold its verify tokens is refused by name, before any argument is made."""
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.ragged.flashinfer_plan import tier_verify_args

    with pytest.raises(ValueError, match="cannot hold 9 verify tokens"):
        tier_verify_args(SimpleNamespace(rows=8, total=9), req_pool_indices=None, paged_kernel_lens=None,
                         paged_kernel_lens_sum=0, translator=None, plan=None)


if __name__ == "__main__":
    {"kernel": _kernel_main, "flashinfer_args": _flashinfer_args_main}[sys.argv[1]](*sys.argv[2:])
