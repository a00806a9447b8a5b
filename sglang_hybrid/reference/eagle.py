"""EAGLE-1/2 draft head in the checkpoint layout SGLang 0.5.23 serves as `LlamaForCausalLMEagle`.

What SGLang expects (read from `sglang/srt/models/llama_eagle.py`, not copied):
* config: a Llama config with `architectures: ["LlamaForCausalLMEagle"]` and `num_hidden_layers: 1`;
* weights named *without* a `model.` prefix (its `load_weights` prepends it): `fc.weight`, `fc.bias` (a biased
  `Linear(2h -> h)` over `concat(embed(token), feature)`, embedding first), and one decoder layer `layers.0.*`
  whose `input_layernorm` is deleted (attention reads the fc output directly), with `post_attention_layernorm`
  and the gated SiLU MLP kept;
* no final norm: the target's `lm_head` is applied to the layer output directly;
* embeddings and `lm_head` are shared with the target at load time (`set_embed_and_head`), so the checkpoint does
  not carry them (which keeps it at ~8 MB in bf16).
* The feature is the target's hidden state as SGLang captures it for Llama: *after* the final RMSNorm (the tensor
  its LogitsProcessor multiplies by `lm_head`). Here that is `model.model(...).last_hidden_state`.

The head is self-contained PyTorch (its own RoPE/GQA attention with an explicit KV cache) so the reference loop can
append, draft and roll back its cache without depending on `transformers` cache internals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURE = "LlamaForCausalLMEagle"
WEIGHTS_FILE = "model.safetensors"


class EagleCheckpointError(ValueError):
    """An EAGLE head checkpoint is missing, malformed, or does not fit the target."""


@dataclass(frozen=True)
class HeadDims:
    """Shapes the head shares with its target."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int

    @classmethod
    def from_config(cls, cfg) -> "HeadDims":
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        hidden = get("hidden_size")
        heads = get("num_attention_heads")
        rope_theta = get("rope_theta")
        if rope_theta is None:
            rp = get("rope_parameters") or get("rope_scaling") or {}
            rope_theta = rp.get("rope_theta", 10000.0)
            if rp.get("rope_type", "default") not in ("default", None):
                raise EagleCheckpointError(f"unsupported rope_type {rp.get('rope_type')!r} (only default RoPE)")
        return cls(
            hidden_size=hidden, num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or hidden // heads, intermediate_size=get("intermediate_size"),
            rms_norm_eps=get("rms_norm_eps", 1e-5), rope_theta=float(rope_theta), vocab_size=get("vocab_size"),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (rotate-half) RoPE tables for `positions [B, T]` -> `[B, 1, T, head_dim]`."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    ang = positions.float()[..., None] * inv  # [B, T, d/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class EagleAttention(nn.Module):
    def __init__(self, d: HeadDims):
        super().__init__()
        self.d = d
        self.q_proj = nn.Linear(d.hidden_size, d.num_heads * d.head_dim, bias=False)
        self.k_proj = nn.Linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=False)
        self.v_proj = nn.Linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=False)
        self.o_proj = nn.Linear(d.num_heads * d.head_dim, d.hidden_size, bias=False)

    def forward(self, x, cos, sin, cache, mask):
        B, T, _ = x.shape
        d = self.d
        q = self.q_proj(x).view(B, T, d.num_heads, d.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, d.num_kv_heads, d.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, d.num_kv_heads, d.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        new_cache = (k, v)
        rep = d.num_heads // d.num_kv_heads
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        if mask is None:  # causal over the new tokens, full over the cache
            S = kk.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), new_cache


class EagleMLP(nn.Module):
    def __init__(self, d: HeadDims):
        super().__init__()
        self.gate_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.down_proj = nn.Linear(d.intermediate_size, d.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """Llama decoder layer without `input_layernorm` (EAGLE's first layer reads the fc output unnormalised)."""

    def __init__(self, d: HeadDims):
        super().__init__()
        self.self_attn = EagleAttention(d)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.mlp = EagleMLP(d)

    def forward(self, x, cos, sin, cache, mask):
        a, new_cache = self.self_attn(x, cos, sin, cache, mask)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), new_cache


class EagleHead(nn.Module):
    """`fc(concat(embed(x_{t+1}), f_t)) -> one decoder layer -> g_t ~ f_{t+1}`; logits come from the target's lm_head.

    `forward(embeds [B,T,h], feats [B,T,h], positions [B,T], cache=None, mask=None)` returns `(g [B,T,h], cache)`
    where `cache = (k, v)`, each `[B, kv_heads, S, head_dim]`, includes the new tokens. `mask` (bool, True = may
    attend, broadcastable to `[B, heads, T, S]`) defaults to causal-over-new / full-over-cache.
    """

    def __init__(self, dims: HeadDims):
        super().__init__()
        self.dims = dims
        self.fc = nn.Linear(2 * dims.hidden_size, dims.hidden_size, bias=True)
        self.layers = nn.ModuleList([EagleLayer(dims)])

    def forward(self, embeds, feats, positions, cache=None, mask=None):
        if embeds.shape != feats.shape:
            raise ValueError(f"embeds {tuple(embeds.shape)} and feats {tuple(feats.shape)} must have equal shapes")
        x = self.fc(torch.cat([embeds, feats], dim=-1))
        cos, sin = rope_cos_sin(positions, self.dims.head_dim, self.dims.rope_theta, x.dtype)
        x, cache = self.layers[0](x, cos, sin, cache, mask)
        return x, cache


def new_head(target_config, seed: int = 0) -> EagleHead:
    """A freshly initialised head for a target (deterministic in `seed`); fc starts as 'copy the feature'."""
    g = torch.Generator().manual_seed(seed)
    head = EagleHead(HeadDims.from_config(target_config))
    h = head.dims.hidden_size
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(p.shape[1])))
            else:
                p.zero_()
        # Start close to "g_t = f_t": an identity block on the feature half of fc, a small embedding half.
        head.fc.weight[:, h:] += torch.eye(h)
        head.layers[0].self_attn.o_proj.weight.mul_(0.1)
        head.layers[0].mlp.down_proj.weight.mul_(0.1)
    return head


def head_config(target_config, extra: dict | None = None) -> dict:
    """The draft config SGLang reads: the target's Llama config with one layer and the EAGLE architecture."""
    cfg = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    for k in ("quantization_config", "_name_or_path", "transformers_version", "auto_map"):
        cfg.pop(k, None)
    # Never tied: the head has no lm_head of its own (SGLang's ``set_embed_and_head`` installs the target's), and a
    # tied config makes ``lm_head`` the embedding module, which ``set_embed_and_head`` cannot replace.
    cfg.update({"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"})
    if extra:
        cfg["hybrid_spark"] = extra
    return cfg


def save_head(head: EagleHead, folder: str | Path, target_config, dtype=torch.bfloat16,
              extra: dict | None = None) -> Path:
    """Write `config.json` + `model.safetensors` (weights in `dtype`) for SGLang's `LlamaForCausalLMEagle`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "architecture": ARCHITECTURE})
    tmp.replace(folder / WEIGHTS_FILE)
    cfg = head_config(target_config, extra)
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return folder


def expected_keys(dims: HeadDims) -> dict[str, tuple[int, ...]]:
    h, a, kv, i = dims.hidden_size, dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim, \
        dims.intermediate_size
    p = "layers.0."
    return {
        "fc.weight": (h, 2 * h), "fc.bias": (h,),
        p + "self_attn.q_proj.weight": (a, h), p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, a),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
    }


def load_head(folder: str | Path, target_config=None, dtype=torch.float32) -> EagleHead:
    """Load a head saved by `save_head` (or any EAGLE-1 checkpoint in the same layout), checking names and shapes,
    and, when `target_config` is given, that it fits that target (hidden size, heads, vocabulary)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, w_path = folder / "config.json", folder / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise EagleCheckpointError(f"{folder}: expected config.json and {WEIGHTS_FILE}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise EagleCheckpointError(f"{cfg_path}: invalid JSON ({e})") from None
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise EagleCheckpointError(f"{cfg_path}: architectures must contain {ARCHITECTURE!r}")
    dims = HeadDims.from_config(cfg)
    if target_config is not None:
        tdims = HeadDims.from_config(target_config)
        if (tdims.hidden_size, tdims.num_heads, tdims.num_kv_heads, tdims.vocab_size) != \
                (dims.hidden_size, dims.num_heads, dims.num_kv_heads, dims.vocab_size):
            raise EagleCheckpointError(f"{folder}: head dims {dims} do not fit the target {tdims}")
    try:
        state = load_file(str(w_path))
    except Exception as e:  # safetensors raises several types for damaged files
        raise EagleCheckpointError(f"{w_path}: unreadable safetensors ({e})") from None
    state = {k: v for k, v in state.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    want = expected_keys(dims)
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise EagleCheckpointError(f"{w_path}: missing {missing}, unexpected {extra}")
    for k, shape in want.items():
        if tuple(state[k].shape) != shape:
            raise EagleCheckpointError(f"{w_path}: {k} has shape {tuple(state[k].shape)}, expected {shape}")
    head = EagleHead(dims)
    head.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return head.to(dtype).eval()
