"""Patch a module of SGLang in the CPU engine's own processes, right after the module has executed.

Why: the CPU engine's stand-ins (``tree_sampling``, ``kv_window``) must change a module of SGLang inside the engine's
scheduler processes, which the test process never runs code in. The stand-in ``sgl_kernel`` every CPU engine process
imports calls their installers; a module not imported yet is patched the moment its import finishes (a
``sys.meta_path`` finder that wraps the module's loader once), one already imported is patched at once.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` has executed, then leaves ``sys.meta_path``."""

    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_then_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def patch_after_import(name: str, patch: Callable) -> None:
    """``patch(module)`` for the module ``name``: now if it is imported, else right after its import (once: a second
    call while the first waits is a no-op)."""
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _PatchOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


__all__ = ["patch_after_import"]
