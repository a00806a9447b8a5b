"""The CPU engine's torch twin of SGLang's Triton decode-attention kernel (``cpu_engine/torch_attention.py``) against
the kernel itself.

The twin stands in for ``decode_attention_fwd`` in the live cases that run the twins and in the start-up benchmark,
whose draft-table probe is all decode attention; so it must give the kernel's output on what those forwards hand it:
ragged decode batches (one query token per request, each with its own KV length), GQA and MHA, KV rows scattered
through the pool, a batch smaller than the backend's index buffers (``q.shape[0]`` rows of a longer ``kv_indptr``,
as a padded graph batch or the probe's smaller batches are), ``k_scale``/``v_scale`` of 1. The kernel runs in Triton's
CPU interpreter, in a subprocess (this module run with ``python -m``): ``TRITON_INTERPRET`` must be set before
Triton's import. The extend twin is checked in ``test_ragged_verify.py``.
"""
from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.interpreted import enter_interpreter, interpreted_outputs

ATOL = 2e-3
#: (seed, KV length per request, q heads, kv heads, head dim, rows of kv_indptr beyond the batch)
DECODE = {
    "mha": (1, [1, 17, 300, 64, 5], 4, 4, 32, 0),
    "gqa2": (2, [129, 2, 64, 1000, 33, 1], 8, 4, 64, 0),
    "gqa4_short_batch": (3, [40, 7, 256], 8, 2, 64, 3),
}
MAX_KV_SPLITS = 8


def make_case(seed: int, lens: list[int], hq: int, hkv: int, dim: int, spare: int) -> dict:
    """A decode batch: request ``b`` reads ``lens[b]`` KV rows at random distinct slots of a pool with room to spare;
    ``kv_indptr`` has ``spare`` more (empty) requests than ``q`` has rows."""
    g = torch.Generator().manual_seed(seed)
    slots = sum(lens) * 2 + 16
    perm = torch.randperm(slots, generator=g)
    kv_indices = perm[:sum(lens)].to(torch.int64)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(lens).cumsum(0),
                           torch.full((spare,), sum(lens))]).to(torch.int32)
    return {"q": torch.randn(len(lens), hq, dim, generator=g), "k_buffer": torch.randn(slots, hkv, dim, generator=g),
            "v_buffer": torch.randn(slots, hkv, dim, generator=g), "kv_indptr": kv_indptr,
            "kv_indices": kv_indices, "sm_scale": dim ** -0.5}


def dense_reference(case: dict) -> torch.Tensor:
    """Per request, float64 softmax attention over its KV rows (query head h reads KV head h // group)."""
    q, k, v = case["q"].double(), case["k_buffer"].double(), case["v_buffer"].double()
    group = q.shape[1] // k.shape[1]
    ptr = case["kv_indptr"].tolist()
    out = []
    for b in range(q.shape[0]):
        idx = case["kv_indices"][ptr[b]:ptr[b + 1]]
        keys, vals = k[idx].repeat_interleave(group, 1), v[idx].repeat_interleave(group, 1)
        p = (torch.einsum("hd,shd->hs", q[b], keys) * case["sm_scale"]).softmax(-1)
        out.append(torch.einsum("hs,shd->hd", p, vals))
    return torch.stack(out)


def run_decode(fn, case: dict) -> torch.Tensor:
    """``fn`` (SGLang's ``decode_attention_fwd`` or the twin) on ``case``, with the backend's scratch buffers."""
    q = case["q"]
    o = torch.full_like(q, float("nan"))
    batch = case["kv_indptr"].shape[0] - 1
    attn_logits = torch.empty(batch, q.shape[1], MAX_KV_SPLITS, q.shape[2], dtype=torch.float32)
    attn_lse = torch.empty(batch, q.shape[1], MAX_KV_SPLITS, dtype=torch.float32)
    num_kv_splits = torch.full((batch,), MAX_KV_SPLITS, dtype=torch.int32)
    fn(q, case["k_buffer"], case["v_buffer"], o, case["kv_indptr"], case["kv_indices"], attn_logits, attn_lse,
       num_kv_splits, MAX_KV_SPLITS, case["sm_scale"], 1.0, 1.0)
    return o


def cases() -> dict:
    return {name: make_case(*spec) for name, spec in DECODE.items()}


def _kernel_main(out: str) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): every case through SGLang's Triton decode kernel."""
    enter_interpreter()
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    torch.save({name: run_decode(decode_attention_fwd, case) for name, case in cases().items()}, out)


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory) -> dict:
    return interpreted_outputs(__name__, tmp_path_factory, "decode_twin")


def test_decode_twin_matches_sglang_decode_kernel(kernel_outputs):
    """Twin and kernel give the dense reference on every batch, and each other; the twin writes exactly the batch's
    rows, as the kernel does."""
    from sglang_hybrid.cpu_engine.torch_attention import decode_attention_torch

    for name, case in cases().items():
        ref, want = dense_reference(case), kernel_outputs[name]
        got = run_decode(decode_attention_torch, case)
        assert not torch.isnan(want).any() and not torch.isnan(got).any(), name
        assert (want.double() - ref).abs().max() < ATOL, name
        assert (got.double() - ref).abs().max() < ATOL, name
        assert (got - want).abs().max() < ATOL, name


def test_decode_twin_reads_each_requests_own_rows(kernel_outputs):
    """Positive control: shifting one request's KV window (its first row dropped) changes that row only, in both."""
    from sglang_hybrid.cpu_engine.torch_attention import decode_attention_torch

    case = cases()["gqa2"]
    shifted = dict(case, kv_indptr=case["kv_indptr"].clone())
    shifted["kv_indptr"][0] = 1                                     # request 0 (129 rows) now reads 128
    base, moved = run_decode(decode_attention_torch, case), run_decode(decode_attention_torch, shifted)
    assert (moved[0] - base[0]).abs().max() > 1e-3
    assert torch.equal(moved[1:], base[1:])
    assert (moved[0].double() - dense_reference(shifted)[0]).abs().max() < ATOL
    assert (base - kernel_outputs["gqa2"]).abs().max() < ATOL


def test_decode_twin_refuses_what_it_does_not_implement():
    """Every kernel feature the twin lacks is refused by name, as is a request with no KV rows."""
    from sglang_hybrid.cpu_engine.torch_attention import decode_attention_torch

    case = cases()["mha"]
    q = case["q"]
    args = [q, case["k_buffer"], case["v_buffer"], torch.empty_like(q), case["kv_indptr"], case["kv_indices"],
            None, None, None, MAX_KV_SPLITS, case["sm_scale"], 1.0, 1.0]
    for feature, kwargs in (("sinks", {"sinks": torch.zeros(4)}), ("logit_cap", {"logit_cap": 30.0}),
                            ("mla", {"has_mla": True}), ("paged_kv", {"page_size": 16}),
                            ("xai_temperature", {"xai_temperature_len": 8})):
        with pytest.raises(NotImplementedError, match=f"decode_attention_torch .*{feature}"):
            decode_attention_torch(*args, **kwargs)
    empty = list(args)
    empty[4] = torch.tensor([0, 0, 18, 318, 382, 387], dtype=torch.int32)  # request 0 reads none
    with pytest.raises(ValueError, match="request 0 has no KV rows"):
        decode_attention_torch(*empty)


if __name__ == "__main__":
    _kernel_main(sys.argv[1])
