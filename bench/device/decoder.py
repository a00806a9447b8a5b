"""A compact Llama-style decoder with tree-masked verify, and an EAGLE-3-shaped one-layer draft. Random weights.

This is NOT SGLang: no paged KV cache, no FlashInfer/FA3 kernels, no fused norms or activations. It is the work a
verify step must do -- every weight read once, ``B x W`` tokens through every GEMM, each request's query tile attending
to its ``ctx`` cached keys plus its own tree (``scaled_dot_product_attention`` with a boolean tree mask) -- written
plainly in PyTorch, so its step times are an honest measured shape of ``T(n)`` for a dense 8B target on one GPU,
not the figure SGLang would print.

Grouped-query attention without copying the KV heads: the ``G = heads / kv_heads`` query heads that share a KV head
are folded into the query length (``[B, KVH, G*W, D]``), and the ``W x (ctx + W)`` mask is tiled ``G`` times.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int

    @property
    def params(self) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h + 3 * h * self.inter + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h


#: Llama-3.1-8B (hidden 4096, 32 layers, 32 heads / 8 KV heads, MLP 14336, vocab 128256)
LLAMA_8B = Dims(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256)
#: EAGLE-3 head for Llama-3.1-8B: one layer at the target's width, 32k draft vocabulary
EAGLE3_DRAFT_VOCAB = 32000
#: the CPU mode's stand-in (same structure, tiny)
TINY = Dims(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, inter=256, vocab=1024)


def _w(shape, fan_in, device, dtype, g):
    return (torch.randn(shape, device=device, dtype=torch.float32, generator=g) / fan_in ** 0.5).to(dtype)


def rms_norm(x, w, eps: float = 1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, positions, theta: float = 500000.0):
    """Rotary embedding of ``x [B, heads, T, D]`` at ``positions [B, T]``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[:, None, :, None] * inv            # [B, 1, T, D/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(q, k_cache, v_cache, k_new, v_new, ctx: int, mask):
    """``q [B, H, W, D]``; caches ``[B, KVH, ctx + Wmax, D]`` (the new keys are written at ``ctx..ctx+W``);
    ``mask [B, 1, W, ctx + W]`` bool (True = visible). Returns ``[B, W, H*D]``."""
    b, h, w, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    k_cache[:, :, ctx:ctx + w] = k_new
    v_cache[:, :, ctx:ctx + w] = v_new
    k, v = k_cache[:, :, :ctx + w], v_cache[:, :, :ctx + w]
    qg = q.reshape(b, kvh, g * w, d)                                      # head kvh*g + i -> rows i*W .. i*W+W-1
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask.repeat(1, 1, g, 1))
    return o.reshape(b, h, w, d).transpose(1, 2).reshape(b, w, h * d)


class Target:
    """Llama-shaped target: ``verify(tokens [B, W], positions [B, W], mask, ctx)`` -> logits ``[B, W, V]``."""

    def __init__(self, dims: Dims, device, dtype, max_batch: int, max_len: int, seed: int = 0):
        self.dims, self.device, self.dtype = dims, torch.device(device), dtype
        g = torch.Generator(device=self.device).manual_seed(seed)
        h, d = dims.hidden, dims.head_dim
        self.embed = _w((dims.vocab, h), 1, device, dtype, g)
        self.layers = []
        for _ in range(dims.layers):
            self.layers.append(dict(
                ln1=torch.ones(h, device=device, dtype=dtype), ln2=torch.ones(h, device=device, dtype=dtype),
                wqkv=_w(((dims.heads + 2 * dims.kv_heads) * d, h), h, device, dtype, g),
                wo=_w((h, dims.heads * d), dims.heads * d, device, dtype, g),
                wgu=_w((2 * dims.inter, h), h, device, dtype, g),
                wd=_w((h, dims.inter), dims.inter, device, dtype, g)))
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = _w((dims.vocab, h), h, device, dtype, g)
        shape = (max_batch, dims.kv_heads, max_len, d)
        # KV cache contents do not change the timing: zeros, allocated once for the largest batch
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(dims.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(dims.layers)]

    def verify(self, tokens, positions, mask, ctx: int):
        dims = self.dims
        b, w = tokens.shape
        hq, hk, d = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.head_dim
        x = self.embed[tokens]                                            # [B, W, h]
        for i, lay in enumerate(self.layers):
            y = rms_norm(x, lay["ln1"])
            qkv = y @ lay["wqkv"].t()
            q = qkv[..., :hq].reshape(b, w, dims.heads, d).transpose(1, 2)
            k = qkv[..., hq:hq + hk].reshape(b, w, dims.kv_heads, d).transpose(1, 2)
            v = qkv[..., hq + hk:].reshape(b, w, dims.kv_heads, d).transpose(1, 2)
            q, k = rope(q, positions), rope(k, positions)
            x = x + attention(q, self.k[i][:b], self.v[i][:b], k, v, ctx, mask) @ lay["wo"].t()
            y = rms_norm(x, lay["ln2"])
            gate, up = (y @ lay["wgu"].t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ lay["wd"].t()
        return rms_norm(x, self.norm) @ self.lm_head.t()


class EagleDraft:
    """EAGLE-3-shaped draft: ``fc`` folds three target hidden states, one decoder layer whose attention reads
    ``[embedding, hidden]`` (``2h`` wide), its own KV at the same context, a ``draft_vocab`` head.
    ``step(tokens [B, 1], hidden [B, 1, 3h], positions [B, 1], ctx)`` -> draft logits ``[B, 1, draft_vocab]``."""

    def __init__(self, dims: Dims, draft_vocab: int, device, dtype, max_batch: int, max_len: int, seed: int = 1):
        self.dims, self.draft_vocab = dims, draft_vocab
        g = torch.Generator(device=torch.device(device)).manual_seed(seed)
        h, d = dims.hidden, dims.head_dim
        self.embed = _w((dims.vocab, h), 1, device, dtype, g)   # EAGLE-3 shares the target's; allocated for shape
        self.fc = _w((h, 3 * h), 3 * h, device, dtype, g)
        self.ln_e = torch.ones(h, device=device, dtype=dtype)
        self.ln_h = torch.ones(h, device=device, dtype=dtype)
        self.ln2 = torch.ones(h, device=device, dtype=dtype)
        self.wqkv = _w(((dims.heads + 2 * dims.kv_heads) * d, 2 * h), 2 * h, device, dtype, g)
        self.wo = _w((h, dims.heads * d), dims.heads * d, device, dtype, g)
        self.wgu = _w((2 * dims.inter, h), h, device, dtype, g)
        self.wd = _w((h, dims.inter), dims.inter, device, dtype, g)
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = _w((draft_vocab, h), h, device, dtype, g)
        shape = (max_batch, dims.kv_heads, max_len, d)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def step(self, tokens, hidden3, positions, ctx: int):
        dims = self.dims
        b, w = tokens.shape
        hq, hk, d = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.head_dim
        hid = hidden3 @ self.fc.t()
        y = torch.cat([rms_norm(self.embed[tokens], self.ln_e), rms_norm(hid, self.ln_h)], -1)
        qkv = y @ self.wqkv.t()
        q = qkv[..., :hq].reshape(b, w, dims.heads, d).transpose(1, 2)
        k = qkv[..., hq:hq + hk].reshape(b, w, dims.kv_heads, d).transpose(1, 2)
        v = qkv[..., hq + hk:].reshape(b, w, dims.kv_heads, d).transpose(1, 2)
        q, k = rope(q, positions), rope(k, positions)
        mask = torch.ones(b, 1, w, ctx + w, dtype=torch.bool, device=tokens.device)
        x = hid + attention(q, self.k[:b], self.v[:b], k, v, ctx, mask) @ self.wo.t()
        y = rms_norm(x, self.ln2)
        gate, up = (y @ self.wgu.t()).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ self.wd.t()
        return rms_norm(x, self.norm) @ self.lm_head.t()


def tree_mask(batch: int, width: int, ctx: int, device) -> torch.Tensor:
    """``[B, 1, W, ctx + W]`` bool: the prefix visible, then a two-branch tree (the shape HYBRID's merge verifies:
    a model chain and an n-gram chain under the root)."""
    par = [-1] + [0 if i in (1, (width + 1) // 2) else i - 1 for i in range(1, width)]
    anc = torch.zeros(width, width, dtype=torch.bool)
    for i in range(width):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = par[j]
    m = torch.ones(batch, 1, width, ctx + width, dtype=torch.bool)
    m[:, 0, :, ctx:] = anc
    return m.to(device), anc.sum(1).to(device) - 1                       # mask, depth per node
