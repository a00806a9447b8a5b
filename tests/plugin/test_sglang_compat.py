"""The table of SGLang internals the plugin depends on (``sglang_hybrid.sglang_plugin.compat``), against the installed
SGLang: every entry resolves with the parameter names the plugin was written against, the table covers every SGLang
class the plugin extends and every SGLang method those subclasses redefine, and the check can fail."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from importlib import metadata

import pytest

import sglang_hybrid.cpu_engine
import sglang_hybrid.sglang_plugin
from sglang_hybrid.sglang_plugin import compat
from sglang_hybrid.sglang_plugin.compat import INTERNALS, KINDS, Internal, check, resolve

pytestmark = pytest.mark.sglang

#: modules that hold SGLang subclasses, wrappers and swaps, besides the two packages walked below
_OTHER_MODULES = ("sglang_hybrid.serve", "sglang_hybrid.http_guard", "sglang_hybrid.check")


def _plugin_modules() -> list:
    names = []
    for pkg in (sglang_hybrid.sglang_plugin, sglang_hybrid.cpu_engine):
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    return [importlib.import_module(n) for n in (*names, *_OTHER_MODULES)]


def _sglang_subclasses() -> list:
    """``(plugin class, its nearest SGLang base)`` for every class a plugin module defines on an SGLang class."""
    found = []
    for module in _plugin_modules():
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            base = next((b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "sglang"), None)
            if base is not None:
                found.append((cls, base))
    return found


def _redefined(cls, base) -> list:
    """Names ``cls`` defines in its own body that ``base`` also has: the SGLang attributes it overrides (ABC
    bookkeeping and dunders left out, ``__init__`` kept unless a dataclass generated it)."""
    names = []
    for name in vars(cls):
        if name == "_abc_impl" or not hasattr(base, name):
            continue
        if name.startswith("__") and (name != "__init__" or dataclasses.is_dataclass(cls)):
            continue
        names.append(name)
    return names


def test_sglang_compat_every_internal_resolves_with_the_expected_signature():
    assert check() == []


def test_sglang_compat_written_for_the_installed_and_supported_sglang():
    from sglang_hybrid.sglang_plugin.config import SUPPORTED_SGLANG

    assert compat.SGLANG_VERSION == metadata.version("sglang") == SUPPORTED_SGLANG


def test_sglang_compat_table_is_well_formed_and_names_real_plugin_objects():
    seen = set()
    for it in INTERNALS:
        assert it.kind in KINDS, it
        assert it.target.startswith("sglang.") and it.used_by.startswith("sglang_hybrid."), it
        assert it.params is None or (isinstance(it.params, tuple) and all(isinstance(p, str) for p in it.params)), it
        assert it.note and "\n" not in it.note, it
        assert (it.kind, it.target, it.used_by) not in seen, f"listed twice: {it}"
        seen.add((it.kind, it.target, it.used_by))
        resolve(it.used_by)                    # the plugin object still exists under that name


def test_sglang_compat_lists_every_sglang_subclass_and_the_methods_it_redefines():
    subclasses = _sglang_subclasses()
    names = {cls.__name__ for cls, _ in subclasses}
    # the scan sees the plugin's subclasses (a scan finding nothing would pass vacuously)
    assert {"HybridWorkerV2", "HybridDraftWorker", "HybridSpecAlgo", "HybridVerifyInput", "RaggedTritonAttnBackend",
            "RaggedFlashInferAttnBackend", "SharedDraftSteps", "SharedKVIndexRows"} <= names
    listed = [(it, resolve(it.target)) for it in INTERNALS if it.kind in ("subclass", "override", "mirror")]
    missing = []
    for cls, base in subclasses:
        path = f"{cls.__module__}.{cls.__qualname__}"
        if not any(it.kind == "subclass" and obj is base and it.used_by == path for it, obj in listed):
            missing.append(f"subclass {base.__module__}.{base.__qualname__} (used by {path})")
        for name in _redefined(cls, base):
            sglang_attr = inspect.getattr_static(base, name)
            if not any(it.kind in ("override", "mirror") and it.used_by == f"{path}.{name}"
                       and (obj is sglang_attr or obj is getattr(base, name)) for it, obj in listed):
                missing.append(f"override {base.__qualname__}.{name} (used by {path}.{name})")
    assert missing == []


def test_sglang_compat_check_reports_missing_targets_and_changed_signatures():
    worker = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
    fakes = [
        Internal("override", f"{worker}.verify", ("batch", "pp_proxy_tensors", "grammar_barrier"), "x", "as SGLang"),
        Internal("override", f"{worker}.verify", ("batch", "grammar_barrier"), "x", "a parameter short"),
        Internal("override", f"{worker}.verify", ("batch", "grammar_barrier", "pp_proxy_tensors"), "x", "reordered"),
        Internal("override", f"{worker}.no_such_method", (), "x", "renamed away"),
        Internal("subclass", "sglang.srt.speculative.no_such_module.Worker", None, "x", "moved away"),
        Internal("override", "sglang.srt.speculative.eagle_info.EagleVerifyInput.tree_topk", ("self",), "x",
                 "a property has no signature"),
        Internal("shim", f"{worker}.verify", None, "x", "not a kind"),
    ]
    problems = check(fakes)
    assert len(problems) == len(fakes) - 1, problems
    short, reordered, renamed, moved, prop, kind = problems
    assert "parameters ('batch', 'pp_proxy_tensors', 'grammar_barrier')" in short
    assert "expected ('batch', 'grammar_barrier')" in short
    assert "expected ('batch', 'grammar_barrier', 'pp_proxy_tensors')" in reordered
    assert "no_such_method" in renamed and "not found (AttributeError" in renamed
    assert "no_such_module" in moved and "not found" in moved
    assert "tree_topk" in prop and "no signature" in prop
    assert "shim" in kind and "unknown kind" in kind
