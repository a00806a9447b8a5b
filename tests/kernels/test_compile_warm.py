"""Every Triton kernel variant the worker's launch can take is compiled at start (``kernels.warmup``), and what
compiles after start is counted (``triton_compiles_after_start``, 0 expected).

* the worker's per-step launches, run under the interpreter for several configurations (choose and merge, width and
  depth switching, ragged verify with its layout kernels, EAGLE alternatives M = 2 and 3, online offsets, tables at one
  and at two contexts, the Triton backend's uint8 mask and HYBRID's bool one), each recorded with its specialisation
  (``kernels.variants.key_of``: Triton's cache key, the kernels' ``do_not_specialize`` applied): every one is in
  ``launch_variants`` of its configuration; an enumeration that forgets one of SGLang's dtypes is caught (the
  positive control);
* the enumeration is not "everything": a width, a depth, a batch bucket or a dtype outside the configuration is not
  in it, and the sizes are the products of the configuration's choices;
* the key is Triton's (``native_specialize_impl``, the binder's own function) on ints, tensors, bools, floats, None;
* a launch outside the set is counted, under the interpreter (the host-side recorder) and with Triton's real CUDA
  compiler (no GPU: a compile-only driver; the compile hook counts a compile after start, a warmed variant's launch
  compiles nothing);
* the attention backend decides the verify mask's dtype and whether ragged verify's layout kernels run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hybrid.kernels import GPU_TILES_ENV
from sglang_hybrid.kernels import variants as kv

ROOT = Path(__file__).resolve().parents[2]
#: the code the tests below run in a child process (the interpreter, or the CUDA compiler, set before Triton's import)
SCRIPT = "tests.kernels._scripts.compile_warm"

#: worker configurations driven under the interpreter (``bench.gpu_compile.record_worker``)
WORKER_SPECS = [
    # the README launch's shape (merge, 4 steps, n-gram chains of 8) with both tables measured at start: adaptive
    # depths 1-4 and six width buckets switched between, prompt lookup on, HYBRID's bool mask (FlashInfer)
    {"settings": {"mode": "merge", "ngram_k": 8}, "num_steps": 4, "pool": 9, "cost": "context",
     "draft_cost": "context"},
    # choose, ragged verify (layout and compaction kernels, the Triton backend's uint8 mask), EAGLE alternatives M=2,
    # both online offsets, a user's verify table at one context and a draft table measured at two
    {"settings": {"mode": "choose", "ngram_k": 5, "eagle_alternatives": 2, "model_bias_eta": 0.1,
                  "ngram_bias_eta": "auto"},
     "num_steps": 3, "pool": 6, "ragged": True, "mask": "uint8", "cost": "plain", "draft_cost": "context"},
    # merge, M=3, no price (one depth, the full width only), no prompt lookup, a node budget below both chains'
    {"settings": {"mode": "merge", "ngram_k": 3, "eagle_alternatives": 3, "context_lookup": False, "n_nodes": 4},
     "num_steps": 2, "pool": 5, "mask": "uint8"},
    # merge, ragged, given widths, a verify table measured at two contexts, no draft table (one depth), M=3
    {"settings": {"mode": "merge", "ngram_k": 6, "eagle_alternatives": 3, "verify_widths": [4, 7]},
     "num_steps": 3, "pool": 7, "ragged": True, "cost": "context"},
]


def _interpreted_env() -> dict:
    env = dict(os.environ)
    env.update({"TRITON_INTERPRET": "1", GPU_TILES_ENV: "1"})
    return env


def _compiled_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", GPU_TILES_ENV)}


def _config(fields: dict) -> kv.LaunchConfig:
    return kv.LaunchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _readme(**overrides) -> kv.LaunchConfig:
    from bench.gpu_compile import README_LAUNCH

    return kv.LaunchConfig(**{**README_LAUNCH, "mask_dtypes": ("bool",), **overrides})


def test_compile_warm_every_worker_launch_is_in_the_start_up_set(tmp_path):
    out = tmp_path / "launches.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_compile", "--record-to", str(out), "--steps", "5",
                           "--seed", "1", "--worker-spec", json.dumps(WORKER_SPECS)], cwd=ROOT,
                          env=_interpreted_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads(out.read_text())
    launched = set()
    for spec, run in zip(WORKER_SPECS, runs):
        assert run["records"], spec
        # the child's own check (the recorder against the warmed set) ...
        assert run["outside"] == [] and run["compiles_after_start"] == 0, (spec, run["outside"][:3])
        # ... and the same from the records here, against a fresh enumeration of the configuration it reported
        cfg = _config(run["config"])
        keys = kv.variant_keys(cfg)
        assert run["variants"] == len(keys)
        missing = [r for r in run["records"] if kv.key_of(r) not in keys]
        assert missing == [], (spec, missing[:2])
        launched |= {f"{r['module']}.{r['kernel']}" for r in run["records"]}
    assert launched == set(kv.entry_kernels()), sorted(set(kv.entry_kernels()) - launched)


def test_compile_warm_a_launch_the_enumeration_forgot_is_caught():
    """The positive control of the test above: an enumeration without the int32 bonus tokens misses the two kernels
    that read them (the others take the root as int64 from the tree), and the recorder says so."""
    proc = subprocess.run([sys.executable, "-m", SCRIPT, "wrong_enumeration"], cwd=ROOT, env=_interpreted_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CAUGHT 2 ['_prepare_kernel', '_survivals_kernel']" in proc.stdout, proc.stdout[-2000:]


def test_compile_warm_enumeration_is_not_everything():
    cfg = _readme()
    variants = kv.launch_variants(cfg)
    keys = {kv.key_of(r) for r in variants}
    n = kv.by_kernel(variants)
    d, w, roots = len(cfg.depths), len(cfg.widths), len(cfg.root_dtypes)
    buckets = len({kv.pow2(b) for b in range(1, cfg.max_batch + 1)})               # 1, 2, 4, ..., 64: 7
    assert n == {"_after_verify_kernel": w * d, "_follow_kernel": 1, "_lookup_kernel": 1, "_plan_kernel": w,
                 "_prepare_kernel": roots, "_select_kernel": d, "_survivals_kernel": d * roots,
                 "_verify_input_kernel": w * buckets}, n
    assert kv.count_before(cfg) > 2 * len(variants)

    def select(**change):
        rec = next(r for r in variants if r["kernel"] == "_select_kernel")
        names = [p.name for p in kv.kernel_params(rec["module"], rec["kernel"])]
        args = list(rec["args"])
        for name, desc in change.items():
            args[names.index(name)] = desc
        return {**rec, "args": args}

    assert kv.key_of(select()) in keys
    # what the kernels do not specialise on: any batch size, stride, the alignment of SGLang's tokens
    assert kv.key_of(select(B={"value": 1}, mtok_s0={"value": 32})) in keys
    assert kv.key_of(select(B={"value": 17}, mtok_ptr={"tensor": "int64", "aligned": False})) in keys
    # the selection's verify width is a runtime int (it only masks the stores): any width shares its compile ...
    assert kv.key_of(select(WIDTH={"value": 3})) in keys
    # ... but a depth, a width (where it sets a block shape) or a dtype outside the configuration is not in the set
    assert kv.key_of(select(S={"value": 5})) not in keys
    plan = next(r for r in variants if r["kernel"] == "_plan_kernel")
    pnames = [p.name for p in kv.kernel_params(plan["module"], plan["kernel"])]
    wide = list(plan["args"])
    wide[pnames.index("WIDTH")], wide[pnames.index("W2")] = {"value": 3}, {"value": 4}
    assert kv.key_of({**plan, "args": wide}) not in keys
    assert kv.key_of(select(mtok_ptr={"tensor": "int32", "aligned": True})) not in keys
    # a HYBRID buffer's alignment is specialised: a misaligned one is another variant
    assert kv.key_of(select(o_tok_ptr={"tensor": "int64", "aligned": False})) not in keys
    # a batch past the running limit (bucket 128) is not in it either
    vi = next(r for r in variants if r["kernel"] == "_verify_input_kernel")
    names = [p.name for p in kv.kernel_params(vi["module"], vi["kernel"])]
    big = list(vi["args"])
    big[names.index("B2")] = {"value": 128}
    assert kv.key_of({**vi, "args": big}) not in keys
    # the configuration's switches change the set: alternatives, ragged verify
    alt = kv.by_kernel(kv.launch_variants(_readme(alternatives=2)))
    assert alt["_alternatives_kernel"] == d and alt["_outcome_kernel"] == w * d and alt["_record_kernel"] == 1
    rg = kv.by_kernel(kv.launch_variants(_readme(ragged=True, ragged_layout=True)))
    assert rg["_verify_input_kernel"] == buckets and rg["_layout_kernel"] == buckets and rg["_compact_kernel"] == 1
    assert rg["_after_verify_kernel"] == d                         # ragged: one tree width, the full one


def test_compile_warm_key_is_tritons():
    """``variants.key_of``'s rule gives equal keys exactly where Triton's binder (``native_specialize_impl``) does, for
    every parameter kind and flag."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends import BaseBackend

    t = torch.zeros(8, dtype=torch.int64)
    values = [0, 1, 2, 16, 17, 32, -5, 2**31 - 1, 2**31, 2**40, True, False, 0.5, None, t, t[1:], t.to(torch.int32),
              t.to(torch.bool), t.to(torch.float32)[1:]]
    for specialise in (True, False):
        for align in (True, False):
            p = kv.Param("x", False, specialise, align)
            ours = [kv._item(p, kv.describe(v)) for v in values]
            theirs = [native_specialize_impl(BaseBackend, v, False, specialise, align) for v in values]
            for i in range(len(values)):
                for j in range(len(values)):
                    assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (specialise, align, values[i],
                                                                              values[j], ours[i], theirs[i])


def test_compile_warm_counts_a_launch_outside_the_set_under_the_interpreter():
    proc = subprocess.run([sys.executable, "-m", SCRIPT, "count_outside"], cwd=ROOT, env=_interpreted_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    assert "Triton kernel variants known at start (Triton's interpreter: nothing to compile" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("COUNT"))
    # two distinct specialisations outside the set (batch buckets 4 and 2 at the odd width), three launches
    assert line == "COUNT 2 3 ['_verify_input_kernel', '_verify_input_kernel']", line


def test_compile_warm_compiles_at_start_and_counts_compiles_after_with_the_cuda_compiler():
    proc = subprocess.run([sys.executable, "-m", SCRIPT, "compiled"], cwd=ROOT,
                          env={**_compiled_env(), GPU_TILES_ENV: "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(x.split() for x in proc.stdout.splitlines() if x.startswith("AFTER_"))
    assert lines == {"AFTER_WARMED": "0", "AFTER_OUTSIDE": "1"}, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("name", ["_select_kernel", "_verify_input_kernel", "_after_verify_kernel"])
def test_compile_warm_every_parameter_is_enumerated(name):
    """Each generator gives every parameter of its kernel (``_ordered`` refuses a missing or unknown one), so a kernel
    whose signature changed without its generator fails here rather than warming the wrong variant."""
    rec = next(r for r in kv.launch_variants(_readme()) if r["kernel"] == name)
    assert len(rec["args"]) == len(kv.kernel_params(rec["module"], name))
    with pytest.raises(KeyError, match="does not match the kernel's parameters"):
        kv._ordered(rec["module"], name, {"B": 1})


def test_compile_warm_reads_the_mask_dtype_and_the_ragged_layout_from_the_backend():
    from types import SimpleNamespace

    import torch

    from sglang_hybrid.sglang_plugin.verify_input import TreeMaskMode

    def mask(dtype, fits=True, mode=TreeMaskMode.FULL_MASK):
        return SimpleNamespace(buffer=torch.zeros(4, dtype=dtype), mode=mode, fits=lambda bs: fits)

    class RaggedTierBuffers:          # FlashInfer's token tiers (ragged.flashinfer_backend): no layout kernels
        mask = None

    triton = SimpleNamespace(verify_mask=mask(torch.uint8), ragged_buffers=SimpleNamespace(mask=torch.zeros(
        4, dtype=torch.uint8)))
    assert kv._backend_dtypes(triton, 48, ragged=True) == {"mask_dtypes": ("uint8",), "ragged_layout": True,
                                                           "layout_mask_dtypes": ("uint8",)}
    assert kv._backend_dtypes(triton, 48, ragged=False)["ragged_layout"] is False
    small = SimpleNamespace(verify_mask=mask(torch.uint8, fits=False))          # a batch it cannot hold: bool
    assert kv._backend_dtypes(small, 48, ragged=False)["mask_dtypes"] == ("uint8", "bool")
    qlen = SimpleNamespace(verify_mask=mask(torch.uint8, mode=TreeMaskMode.QLEN_ONLY))
    assert kv._backend_dtypes(qlen, 48, ragged=False)["mask_dtypes"] == ("bool",)
    flashinfer = SimpleNamespace(verify_mask=None, ragged_buffers=RaggedTierBuffers())
    assert kv._backend_dtypes(flashinfer, 48, ragged=True) == {"mask_dtypes": ("bool",), "ragged_layout": False}


def test_compile_warm_is_quiet_without_fused_kernels():
    from types import SimpleNamespace

    from sglang_hybrid.kernels import warmup

    assert warmup.warm_up_step(SimpleNamespace(fused=None), max_batch=8) == (0, 0.0)
    assert set(warmup.counters()) == {"triton_variants_warmed", "triton_warmup_seconds", "triton_warmup_failed",
                                      "triton_compiles_after_start", "triton_launches_outside_warmed"}
