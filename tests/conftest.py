"""Fixtures shared by test modules: the SGLang argument pipeline's model folders (``test_sglang_plugin.py``,
``test_server_cli.py``), a clean HYBRID environment, and SGLang's sampling verify opened on CPU
(``test_sglang_tree_sampling.py``, ``test_sampled_headroom.py``)."""
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


@pytest.fixture
def sampling_verify(monkeypatch):
    """SGLang's ``eagle_sample`` with its sampling branch open on CPU (the CPU tree-sampling stand-ins installed, the
    CPU gate lifted: ``cpu_engine.tree_sampling.sampling_verify_patches``) and the runtime context a scheduler would
    publish (no rejection sampling, thresholds 1, one TP rank)."""
    import types

    import sglang.srt.runtime_context as runtime_context
    from sglang.srt.speculative import eagle_utils

    from sglang_hybrid.cpu_engine.tree_sampling import sampling_verify_patches

    for module, name, value in sampling_verify_patches():
        monkeypatch.setattr(module, name, value)
    spec = types.SimpleNamespace(speculative_use_rejection_sampling=False, speculative_use_block_verification=False,
                                 speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0)
    monkeypatch.setattr(eagle_utils, "get_spec", lambda: spec)
    parallel = types.SimpleNamespace(tp_group=types.SimpleNamespace(world_size=1),
                                     attn_tp_group=types.SimpleNamespace(world_size=1))
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: parallel)
    return monkeypatch
