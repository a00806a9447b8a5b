"""Fixtures shared by the SGLang argument-pipeline tests (``test_sglang_plugin.py``, ``test_server_cli.py``)."""
from __future__ import annotations

import json
import os

import pytest

#: a tiny Llama config: SGLang's argument pipeline reads model folders' config.json, never weights
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 512, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders holding only a config.json: the target, an EAGLE head and an EAGLE-3 head (``{name: path}``)."""
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for name, arch, layers in (("target", "LlamaForCausalLM", 2), ("eagle", "LlamaForCausalLMEagle", 1),
                               ("eagle3", "LlamaForCausalLMEagle3", 1)):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(dict(TINY_LLAMA, architectures=[arch], num_hidden_layers=layers)))
        paths[name] = str(d)
    return paths


@pytest.fixture
def clean_hybrid_env(monkeypatch):
    """No ``SGLANG_HYBRID_*`` setting of the caller's environment leaks into the test."""
    for k in list(os.environ):
        if k.startswith("SGLANG_HYBRID_"):
            monkeypatch.delenv(k)
