"""The CPU engine's KV-window switch (``sglang_hybrid/cpu_engine/kv_window.py``) against SGLang's real module: what
a live engine process does at ``sgl_kernel`` import when ``prepare_environment(kv_window=True)`` asked for it."""
from __future__ import annotations

import inspect
import re

import pytest

pytestmark = pytest.mark.sglang
import sglang.srt.speculative.eagle_worker_common as eagle_worker_common  # noqa: E402


def test_kv_window_gate_is_the_only_use_of_is_cpu_in_sglangs_module():
    """The switch sets the module's ``_is_cpu`` to False; in SGLang 0.5.23 its only reader is the KV-window
    condition of ``prepare_for_draft``, so nothing else of that module changes behaviour."""
    source = inspect.getsource(eagle_worker_common)
    uses = [m.start() for m in re.finditer(r"\b_is_cpu\b", source)]
    assert len(uses) == 2, "SGLang's eagle_worker_common changed: review what lifting _is_cpu affects"
    assert re.search(r"^_is_cpu = is_cpu\(\)$", source, re.M)
    assert "and not _is_cpu" in inspect.getsource(eagle_worker_common.prepare_for_draft)


def test_kv_window_fused_commit_gate_is_the_prediction_device():
    """SGLang 0.5.23 takes the fused commit branch of ``run_eagle_verify`` on ``predict.is_cuda`` alone, and for
    ``topk > 1`` (HYBRID's verify) replaces ``predict`` by the compacted copy of ``_finalize_accept_tree_path`` before
    returning it: the claim of ``claim_cuda_predictions`` reaches that test and no later reader."""
    source = inspect.getsource(eagle_worker_common.run_eagle_verify)
    assert "fused_commit_outputs = predict.is_cuda and not batch.forward_mode.is_idle()" in source
    assert source.count("predict.is_cuda") == 1
    assert "predict = _finalize_accept_tree_path(" in source


def test_kv_window_claimed_predictions_reach_the_commit_kernel(monkeypatch, caplog):
    """The wrapped ``eagle_sample`` hands back predictions that claim CUDA (values and device unchanged, operations
    on them plain tensors); the wrapped commit kernel logs its first call only; installing twice wraps once."""
    import torch

    from sglang_hybrid.cpu_engine import kv_window

    predict = torch.tensor([5, 7, 9])
    monkeypatch.setattr(eagle_worker_common, "eagle_sample", lambda *a, **k: (predict, torch.tensor([1]),
                                                                              torch.tensor([[0, -1]])))
    calls = []
    monkeypatch.setattr(eagle_worker_common, "prepare_verify_commit_outputs", lambda *a, **k: calls.append(a) or a)
    kv_window.claim_cuda_predictions(eagle_worker_common)
    kv_window.claim_cuda_predictions(eagle_worker_common)
    got, _, _ = eagle_worker_common.eagle_sample()
    assert got.is_cuda and not predict.is_cuda and got.device.type == "cpu" and torch.equal(got, predict)
    assert type(got[torch.tensor([0, 2])]) is torch.Tensor and type(got.clone()) is torch.Tensor
    with caplog.at_level("WARNING", logger=kv_window.__name__):
        eagle_worker_common.prepare_verify_commit_outputs(got)
        eagle_worker_common.prepare_verify_commit_outputs(got)
    assert len(calls) == 2 and [r.message for r in caplog.records].count(kv_window.COMMIT_LOG) == 1


def test_kv_window_draft_extend_gate_is_accept_lens_device():
    """SGLang 0.5.23's draft extend takes ``prepared_draft_extend_inputs`` first, else the kernel when
    ``accept_lens.is_cuda`` (the call ``prepare_extend_inputs_on_device`` makes itself), else torch ops."""
    from sglang.srt.speculative import eagle_worker_v2

    source = inspect.getsource(eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode)
    first, gpu = source.index("prepared_draft_extend_inputs is not None"), source.index("accept_lens.is_cuda")
    assert first < gpu and source.count(".is_cuda") == 1
    assert re.search(r"prepare_draft_extend_inputs\(\s*batch_result\.accept_lens,\s*batch_result\.next_token_ids,"
                     r"\s*self\.speculative_num_draft_tokens,?\s*\)", source)


def test_kv_window_draft_extend_inputs_come_from_the_kernel(monkeypatch, caplog):
    """The wrapped draft extend hands the method the kernel's inputs (computed from the batch result and the
    state's width), logs the first time only, leaves idle batches and inputs already prepared alone, and wraps once."""
    import types

    import torch
    from sglang.kernels.ops.speculative import eagle as eagle_kernels

    from sglang_hybrid.cpu_engine import kv_window

    calls = []
    monkeypatch.setattr(eagle_kernels, "prepare_draft_extend_inputs",
                        lambda lens, ids, width: calls.append(width) or ("correct", "select", "ids"))

    class Worker:
        speculative_num_draft_tokens = 7

        def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
            return batch_result.prepared_draft_extend_inputs, kv_loc_plan

    fake = types.SimpleNamespace(EagleDraftWorker=Worker)
    kv_window.prepare_extend_inputs_on_device(fake)
    kv_window.prepare_extend_inputs_on_device(fake)
    busy = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    idle = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: True))

    def result(prepared=None):
        return types.SimpleNamespace(prepared_draft_extend_inputs=prepared, accept_lens=torch.tensor([1, 3]),
                                     next_token_ids=torch.arange(14))

    with caplog.at_level("WARNING", logger=kv_window.__name__):
        assert Worker()._draft_extend_for_decode(busy, result(), kv_loc_plan="plan") == (
            ("correct", "select", "ids"), "plan")
        assert Worker()._draft_extend_for_decode(busy, result())[0] == ("correct", "select", "ids")
        assert Worker()._draft_extend_for_decode(idle, result())[0] is None
        assert Worker()._draft_extend_for_decode(busy, result("given"))[0] == "given"
    assert calls == [7, 7] and [r.message for r in caplog.records].count(kv_window.EXTEND_LOG) == 1


def test_kv_window_installs_from_the_environment(monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2

    from sglang_hybrid.cpu_engine import kv_window

    monkeypatch.setattr(eagle_worker_common, "_is_cpu", True)               # restored after the test, as are
    for name in ("eagle_sample", "prepare_verify_commit_outputs"):          # the functions it wraps
        monkeypatch.setattr(eagle_worker_common, name, getattr(eagle_worker_common, name))
    monkeypatch.setattr(eagle_worker_v2.EagleDraftWorker, "_draft_extend_for_decode",
                        eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode)
    monkeypatch.delenv(kv_window.KV_WINDOW_ENV, raising=False)
    assert kv_window.install_when_imported() is False
    assert eagle_worker_common._is_cpu is True
    monkeypatch.setenv(kv_window.KV_WINDOW_ENV, "1")
    assert kv_window.install_when_imported() is True                         # module already imported: at once
    assert eagle_worker_common._is_cpu is False
    assert eagle_worker_common.eagle_sample.claims_cuda
    assert eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode.prepares_on_device


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
