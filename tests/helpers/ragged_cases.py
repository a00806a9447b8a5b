"""Ragged verify batches and their dense reference, shared by ``tests/kernels/test_ragged_verify.py`` (SGLang's Triton
extend kernel and the plugin's layout on them) and ``tests/plugin/test_ragged_graphs.py`` (the same captured at a token
tier and replayed): random trees, the FULL_MASK layout with ragged widths, a batch in the layout ``TritonAttnBackend``
hands the kernel, the padded and the plugin's own layouts of it, and ``softmax(Q K^T * scale + mask) V`` in float64."""
from __future__ import annotations

import torch

HEAD_DIM = 64
#: the largest absolute difference allowed between the kernel (or its torch twin) and the float64 reference
ATOL = 1e-4


# ----------------------------------------------------------------------------------------------- case construction
def random_parents(n: int, g: torch.Generator, chain: bool = False) -> list:
    """A random tree of ``n`` nodes in topological order: node 0 the root, ``parents[i] < i``."""
    if chain:
        return [-1] + list(range(n - 1))
    return [-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]


def ancestors(parents: list) -> torch.Tensor:
    """``[n, n]`` bool, ``anc[i, j]``: ``j`` on the path root..i (reflexive)."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        anc[i] |= anc[parents[i]]
    return anc


def ragged_full_mask(masks: list, prefix_lens: list, dtype=torch.uint8, prefix_value: int = 1):
    """The FULL_MASK layout with ragged widths: request ``i`` owns ``n_i x (prefix_i + n_i)`` entries (row-major, row
    stride ``prefix_i + n_i``, the prefix columns first) from ``mask_indptr[i]``. ``masks[i]``: ``[n_i, n_i]`` bool."""
    parts, sizes = [], []
    for m, p in zip(masks, prefix_lens):
        n = m.shape[0]
        full = torch.full((n, p + n), prefix_value, dtype=torch.uint8)
        full[:, p:] = m.to(torch.uint8)
        parts.append(full.reshape(-1))
        sizes.append(n * (p + n))
    mask_indptr = torch.zeros(len(masks) + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
    return torch.cat(parts).to(dtype), mask_indptr


def make_case(seed: int, prefix_lens: list, ext_lens: list, q_heads: int, kv_heads: int, *, chains=(),
              mask_dtype=torch.uint8, is_causal: bool = True) -> dict:
    """A ragged verify batch in the layout ``TritonAttnBackend`` hands the kernel, plus what the reference needs.

    The KV pool (page size 1) holds the prefix tokens at scattered slots (slot 0 stays the pool's padding slot) and the
    extend tokens at their ``out_cache_loc`` (written before attention, as ``forward_extend`` does; the kernel reads the
    extend part from ``k``/``v`` themselves). Every other slot is NaN: a read outside a request's slots poisons its
    output."""
    g = torch.Generator().manual_seed(seed)
    bs, total = len(ext_lens), sum(ext_lens)
    trees = [random_parents(n, g, chain=i in chains) for i, n in enumerate(ext_lens)]
    anc = [ancestors(t) for t in trees]
    q = torch.randn(total, q_heads, HEAD_DIM, generator=g)
    k = torch.randn(total, kv_heads, HEAD_DIM, generator=g)
    v = torch.randn(total, kv_heads, HEAD_DIM, generator=g)
    pool = 1 + sum(prefix_lens) + total + 37
    slots = 1 + torch.randperm(pool - 1, generator=g)
    k_buffer = torch.full((pool, kv_heads, HEAD_DIM), float("nan"))
    v_buffer = torch.full((pool, kv_heads, HEAD_DIM), float("nan"))
    kv_indices, used = [], 0
    for p in prefix_lens:
        kv_indices.append(slots[used:used + p])
        used += p
    out_cache_loc = slots[used:used + total]
    kv_indices = torch.cat(kv_indices).to(torch.int64)
    prefix_k = torch.randn(len(kv_indices), kv_heads, HEAD_DIM, generator=g)
    prefix_v = torch.randn(len(kv_indices), kv_heads, HEAD_DIM, generator=g)
    k_buffer[kv_indices], v_buffer[kv_indices] = prefix_k, prefix_v
    k_buffer[out_cache_loc], v_buffer[out_cache_loc] = k, v
    custom_mask, mask_indptr = ragged_full_mask(anc, prefix_lens, mask_dtype)
    qo_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    qo_indptr[1:] = torch.cumsum(torch.tensor(ext_lens), 0)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
    return {"q": q, "k": k, "v": v, "k_buffer": k_buffer, "v_buffer": v_buffer, "qo_indptr": qo_indptr,
            "kv_indptr": kv_indptr, "kv_indices": kv_indices, "custom_mask": custom_mask, "mask_indptr": mask_indptr,
            "max_len_extend": max(ext_lens), "is_causal": is_causal, "skip_prefix_custom_mask": True,
            # for the reference and the other layouts
            "prefix_lens": list(prefix_lens), "ext_lens": list(ext_lens), "ancestors": anc, "parents": trees,
            "out_cache_loc": out_cache_loc}


def with_mask(case: dict, masks: list, **over) -> dict:
    """The same batch with other ``[n_i, n_i]`` extend masks (and other kernel arguments)."""
    custom_mask, mask_indptr = ragged_full_mask(masks, case["prefix_lens"], case["custom_mask"].dtype,
                                                over.pop("prefix_value", 1))
    return {**case, "custom_mask": custom_mask, "mask_indptr": mask_indptr, "ancestors": masks, **over}


def padded_case(case: dict, seed: int) -> tuple:
    """Today's layout: every request padded to ``W = max n_i`` nodes, the mask built by the plugin's own
    ``verify_nodes`` + ``full_mask`` (padding nodes see the prefix and themselves), ``qo_indptr = arange * W``. Padding
    rows get their own random q/k/v, written to fresh KV slots. Returns the kernel case and the real rows' indices."""
    from sglang_hybrid.sglang_plugin.tree_mask import full_mask

    g = torch.Generator().manual_seed(seed)
    lens, bs = case["ext_lens"], len(case["ext_lens"])
    w = max(lens)
    _, anc = padded_tree(case, w)
    seq_lens = torch.tensor(case["prefix_lens"])
    numel = int(seq_lens.sum()) * w + w * w * bs
    mask = full_mask(anc, seq_lens, int(seq_lens.sum()), torch.empty(numel, dtype=torch.uint8))  # backend's uint8
    q_heads, kv_heads = case["q"].shape[1], case["k"].shape[1]
    qp = torch.randn(bs * w, q_heads, HEAD_DIM, generator=g)
    kp = torch.randn(bs * w, kv_heads, HEAD_DIM, generator=g)
    vp = torch.randn(bs * w, kv_heads, HEAD_DIM, generator=g)
    real = torch.cat([i * w + torch.arange(n) for i, n in enumerate(lens)])
    qp[real], kp[real], vp[real] = case["q"], case["k"], case["v"]
    pad_rows = bs * w - len(real)
    k_buffer = torch.cat([case["k_buffer"], torch.full((pad_rows, kv_heads, HEAD_DIM), float("nan"))])
    v_buffer = torch.cat([case["v_buffer"], torch.full((pad_rows, kv_heads, HEAD_DIM), float("nan"))])
    is_pad = torch.ones(bs * w, dtype=torch.bool)
    is_pad[real] = False
    new_slots = case["k_buffer"].shape[0] + torch.arange(pad_rows)
    k_buffer[new_slots], v_buffer[new_slots] = kp[is_pad], vp[is_pad]
    seq_mask_len = w * (seq_lens + w)                    # TritonAttnBackend's eager TARGET_VERIFY metadata
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(seq_mask_len, 0)
    padded = {**case, "q": qp, "k": kp, "v": vp, "k_buffer": k_buffer, "v_buffer": v_buffer,
              "qo_indptr": torch.arange(0, (bs + 1) * w, w, dtype=torch.int64), "custom_mask": mask,
              "mask_indptr": mask_indptr, "max_len_extend": w}
    return padded, real


def padded_tree(case: dict, width: int) -> tuple:
    """The batch as the worker holds it: ``valid [B, W]`` (a prefix of each row) and the ancestor matrix restricted
    to real nodes (``verify_nodes``), ``W = width``."""
    from sglang_hybrid.sglang_plugin.tree_mask import verify_nodes

    lens, bs = case["ext_lens"], len(case["ext_lens"])
    anc = torch.zeros(bs, width, width, dtype=torch.bool)
    valid = torch.zeros(bs, width, dtype=torch.bool)
    for i, n in enumerate(lens):
        anc[i, :n, :n] = case["ancestors"][i]
        valid[i, :n] = True
    _, anc = verify_nodes(torch.zeros(bs, width, dtype=torch.int64), valid, anc)
    return valid, anc


def plugin_layout(case: dict, width: int, mask_dtype=torch.uint8, tier: bool = False):
    """The plugin's ``build_ragged_layout`` of the batch (what ``RaggedTritonAttnBackend`` hands the kernel); with
    ``tier`` as the worker builds it: the forward padded to its token tier and the mask bounded as the start-up
    buffer is (``row_bound`` = longest prefix + width, standing for the context length + width)."""
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, mask_numel_bound, node_counts
    from sglang_hybrid.sglang_plugin.ragged.tiers import tier_rows

    valid, anc = padded_tree(case, width)
    seq_lens = torch.tensor(case["prefix_lens"])
    counts = node_counts(valid)
    total, seq_sum = int(counts.sum()), int(seq_lens.sum())
    max_nodes = int(counts.max())
    rows = tier_rows(total, len(case["ext_lens"]) * width) if tier else None
    row_bound = max(case["prefix_lens"]) + width if tier else None
    buf = torch.zeros(mask_numel_bound(max_nodes, total, seq_sum, row_bound) + 5, dtype=mask_dtype)  # reused, larger
    return build_ragged_layout(valid, anc, seq_lens, seq_sum, counts, total=total, max_nodes=max_nodes, mask_out=buf,
                               rows=rows, row_bound=row_bound)


# ----------------------------------------------------------------------------------------------- dense reference
def dense_reference(case: dict, prefix_visible: bool = True) -> torch.Tensor:
    """``softmax(Q K^T * scale + mask) V`` per request in float64; mask: the prefix (all visible, or none), then
    ``case['ancestors']``."""
    q, k, v = case["q"].double(), case["k"].double(), case["v"].double()
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    qo, kvp = case["qo_indptr"], case["kv_indptr"]
    for i, n in enumerate(case["ext_lens"]):
        idx = case["kv_indices"][int(kvp[i]):int(kvp[i + 1])]
        keys = torch.cat([case["k_buffer"][idx].double(), k[int(qo[i]):int(qo[i]) + n]])
        vals = torch.cat([case["v_buffer"][idx].double(), v[int(qo[i]):int(qo[i]) + n]])
        keys = keys.repeat_interleave(group, dim=1)          # [S, Hq, D]: q head h reads kv head h // group
        vals = vals.repeat_interleave(group, dim=1)
        prefix = torch.full((n, len(idx)), prefix_visible, dtype=torch.bool)
        allowed = torch.cat([prefix, case["ancestors"][i].to(torch.bool)], 1)
        scores = torch.einsum("qhd,shd->hqs", q[int(qo[i]):int(qo[i]) + n], keys) / HEAD_DIM ** 0.5
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        out[int(qo[i]):int(qo[i]) + n] = torch.einsum("hqs,shd->qhd", scores.softmax(-1), vals)
    return out
