"""A small EAGLE-3 draft head for SmolLM2, written at test time in SGLang's EAGLE-3 layout (``LlamaForCausalLMEagle3``,
``sglang/srt/models/llama_eagle3.py``): ``fc`` over three auxiliary hidden states of the target (3 x 576 -> 576), one
decoder layer whose attention reads ``[norm(embedding), norm(hidden)]`` (1,152 wide), a final norm, an ``lm_head`` over
a reduced draft vocabulary, and ``d2t`` (draft id -> target id offsets, as EAGLE-3 checkpoints store them).

Why not a trained head: losslessness needs none (every drafted token is checked by the target), and what the live test
must show beyond it is that HYBRID compares EAGLE-3's drafts with the n-gram drafter's *in the target vocabulary*. So
the weights are random (seeded) except for one planted preference: ``fc``'s bias dominates the head's hidden state and
the ``lm_head`` row of one draft id points along it, so the head drafts that id, confidently, at every step. Its
``d2t`` entry maps it to ``token`` (a target id the caller picks, e.g. the commonest token of the plain outputs), and
the draft vocabulary (every fourth target id, plus ``token``) is laid out so that the draft id differs from ``token``.
A drafted token accepted by the target then proves the mapping reached the tree: the draft id itself, read as a
target id, is another token. The random parts still run every EAGLE-3 operation (auxiliary states through ``fc``, the
wide attention input, the reduced ``lm_head``), and the drafts are rejected whenever the target emits anything else.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

#: SGLang reads the aux-state count from ``eagle_aux_hidden_state_layer_ids``, else assumes 3 (its default layers 2,
#: L/2 and L-3 of the target)
NUM_AUX = 3
#: the draft vocabulary: every ``STRIDE``-th target id, plus the planted token
STRIDE = 4


def draft_vocabulary(vocab_size: int, token: int) -> torch.Tensor:
    """The target ids of the draft vocabulary, ascending (``hot_token_id`` in SGLang): every ``STRIDE``-th id and
    ``token``."""
    return torch.tensor(sorted(set(range(0, vocab_size, STRIDE)) | {int(token)}), dtype=torch.int64)


def write_eagle3_head(folder: Path, target_config: dict, token: int, seed: int = 0) -> dict:
    """Write ``config.json`` and ``model.safetensors`` of the head described in the module docstring into ``folder``
    for a Llama target with ``target_config`` (its ``config.json`` as a dict). Returns what the test needs: the
    planted draft id, the target id it maps to and the draft vocabulary size."""
    from safetensors.torch import save_file

    d = int(target_config["hidden_size"])
    heads, kv_heads = int(target_config["num_attention_heads"]), int(target_config["num_key_value_heads"])
    head_dim = int(target_config.get("head_dim") or d // heads)
    inter = int(target_config["intermediate_size"])
    vocab = int(target_config["vocab_size"])
    hot = draft_vocabulary(vocab, token)
    planted = int((hot == int(token)).nonzero()[0, 0])
    if planted == int(token):
        raise ValueError(f"the planted draft id equals its target id {token}: the test could not tell the "
                         "vocabularies apart")

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std

    direction = rand(d, std=1.0)
    direction /= direction.norm()
    lm_head = rand(len(hot), d)
    # the final norm turns the hidden state into about sqrt(d) * direction: this row's logit is then 20, the others'
    # about N(0, 0.5), so the planted id is drafted with probability ~1
    lm_head[planted] = direction * (20.0 / d ** 0.5)
    layer = "layers.0."
    weights = {
        # the aux states move the hidden state a little (random 1e-3 weights); the bias (norm 240) sets its direction
        "fc.weight": rand(d, NUM_AUX * d, std=1e-3), "fc.bias": direction * 240.0,
        layer + "hidden_norm.weight": torch.ones(d), layer + "input_layernorm.weight": torch.ones(d),
        layer + "post_attention_layernorm.weight": torch.ones(d),
        layer + "self_attn.q_proj.weight": rand(heads * head_dim, 2 * d),
        layer + "self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * d),
        layer + "self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * d),
        layer + "self_attn.o_proj.weight": rand(d, heads * head_dim),
        layer + "mlp.gate_proj.weight": rand(inter, d), layer + "mlp.up_proj.weight": rand(inter, d),
        layer + "mlp.down_proj.weight": rand(d, inter),
        "norm.weight": torch.ones(d), "lm_head.weight": lm_head,
        "d2t": hot - torch.arange(len(hot)),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, hot, True),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
            "hidden_act", "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "max_position_embeddings",
            "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
    config = {k: target_config[k] for k in keep if k in target_config}
    config.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                  draft_vocab_size=len(hot), tie_word_embeddings=False, bias=True, attention_bias=False,
                  mlp_bias=False, dtype="float32", torch_dtype="float32",
                  test_head={"what": "random weights with one planted draft id (tests/helpers/eagle3_head.py)",
                             "planted_draft_id": planted, "planted_target_id": int(token), "seed": seed})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return {"planted_draft_id": planted, "planted_target_id": int(token), "draft_vocab_size": len(hot)}
