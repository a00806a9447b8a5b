"""The CPU engine's KV-window switch (``sglang_hybrid/cpu_engine/kv_window.py``) against SGLang's real module: what
a live engine process does at ``sgl_kernel`` import when ``prepare_environment(kv_window=True)`` asked for it."""
from __future__ import annotations

import inspect
import re

import pytest

pytestmark = pytest.mark.sglang
eagle_worker_common = pytest.importorskip("sglang.srt.speculative.eagle_worker_common",
                                          reason="sglang is not installed (scripts/setup.sh installs it)")


def test_kv_window_gate_is_the_only_use_of_is_cpu_in_sglangs_module():
    """The switch sets the module's ``_is_cpu`` to False; in SGLang 0.5.23 its only reader is the KV-window
    condition of ``prepare_for_draft``, so nothing else of that module changes behaviour."""
    source = inspect.getsource(eagle_worker_common)
    uses = [m.start() for m in re.finditer(r"\b_is_cpu\b", source)]
    assert len(uses) == 2, "SGLang's eagle_worker_common changed: review what lifting _is_cpu affects"
    assert re.search(r"^_is_cpu = is_cpu\(\)$", source, re.M)
    assert "and not _is_cpu" in inspect.getsource(eagle_worker_common.prepare_for_draft)


def test_kv_window_installs_from_the_environment(monkeypatch):
    from sglang_hybrid.cpu_engine import kv_window

    monkeypatch.setattr(eagle_worker_common, "_is_cpu", True)               # restored after the test
    monkeypatch.delenv(kv_window.KV_WINDOW_ENV, raising=False)
    assert kv_window.install_when_imported() is False
    assert eagle_worker_common._is_cpu is True
    monkeypatch.setenv(kv_window.KV_WINDOW_ENV, "1")
    assert kv_window.install_when_imported() is True                         # module already imported: at once
    assert eagle_worker_common._is_cpu is False


def test_patch_after_import_waits_for_the_import(monkeypatch, tmp_path):
    """A module not imported yet is patched the moment its import finishes, once."""
    import sys

    from sglang_hybrid.cpu_engine.import_hook import patch_after_import

    (tmp_path / "hybrid_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hybrid_hook_probe", raising=False)
    calls = []

    def patch(module):
        calls.append(module.VALUE)
        module.VALUE = 2

    patch_after_import("hybrid_hook_probe", patch)
    patch_after_import("hybrid_hook_probe", patch)                           # already waiting: not twice
    assert calls == []
    import hybrid_hook_probe

    assert calls == [1] and hybrid_hook_probe.VALUE == 2
    patch_after_import("hybrid_hook_probe", patch)                           # imported: patched at once
    assert calls == [1, 2]
