"""Triton compiles at start and after it (``sglang_hybrid.kernels.warmup``), for ``tests/kernels/test_compile_warm.py``:

    TRITON_INTERPRET=1 HYBRID_INTERPRETER_GPU_TILES=1 python -m tests.kernels._scripts.compile_warm wrong_enumeration
    TRITON_INTERPRET=1 HYBRID_INTERPRETER_GPU_TILES=1 python -m tests.kernels._scripts.compile_warm count_outside
    HYBRID_INTERPRETER_GPU_TILES=1 python -m tests.kernels._scripts.compile_warm compiled   # Triton's CUDA compiler

Each prints the lines the test reads (``CAUGHT``, ``COUNT``, ``AFTER_*``).
"""
import sys


def wrong_enumeration() -> None:
    """The positive control: an enumeration that forgets SGLang's int32 bonus tokens, and what the recorder says of a
    worker's launches against it (``CAUGHT`` count kernels)."""
    from sglang_hybrid.kernels import variants as kv
    from bench import gpu_compile
    full = kv.LaunchConfig.from_step.__func__

    def int64_roots_only(cls, step, **kw):          # an enumeration that forgets SGLang's int32 bonus tokens
        cfg = full(cls, step, **kw)
        return cls(**{**cfg.__dict__, "root_dtypes": ("int64",)})

    kv.LaunchConfig.from_step = classmethod(int64_roots_only)
    run = gpu_compile.record_worker({"settings": {"mode": "choose", "ngram_k": 3}, "num_steps": 2, "pool": 3}, steps=4)
    print("CAUGHT", run["compiles_after_start"], sorted({r["kernel"] for r in run["outside"]}))


def count_outside() -> None:
    """A worker step warmed at start, then launches inside and outside its set under the interpreter (the host-side
    recorder): ``COUNT`` compiles, launches, kernels."""
    import logging
    import tempfile

    import torch

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    from bench.gpu_compile import _worker_step
    from sglang_hybrid import kernels
    from sglang_hybrid.kernels import warmup

    with tempfile.TemporaryDirectory() as tmp:
        step = _worker_step({"settings": {"mode": "merge", "ngram_k": 3}, "num_steps": 2, "pool": 4}, tmp)
    count, seconds = warmup.warm_up_step(step, max_batch=4)
    assert count > 0 and seconds < 5 and warmup.compiles_after_start() == 0, (count, seconds)

    def links(b, w):
        tokens = torch.zeros(b, w, dtype=torch.int64)
        valid = torch.ones(b, w, dtype=torch.bool)
        anc = torch.eye(w, dtype=torch.bool).expand(b, w, w).contiguous()
        seq = torch.full((b,), 5, dtype=torch.int64)
        kernels.fused_links_and_mask(tokens, valid, anc, seq, 5 * b)

    links(3, step.widths[-1])                    # inside: the full width, batch bucket 4
    assert warmup.compiles_after_start() == 0, warmup.outside()
    links(3, step.widths[-1] + 2)                # a width the configuration never verifies at
    links(2, step.widths[-1] + 2)                # the same specialisation again (batch 2 buckets elsewhere: 2)
    links(4, step.widths[-1] + 2)                # ... bucket 4 again: the same key as the first
    print("COUNT", warmup.compiles_after_start(), warmup.counters()["triton_launches_outside_warmed"],
          sorted(r["kernel"] for r in warmup.outside()))


def compiled() -> None:
    """Triton's real CUDA compiler behind a compile-only driver (no GPU): the warmed variants' launch sites compile
    nothing (``AFTER_WARMED``), a variant outside the set compiles once, counted (``AFTER_OUTSIDE``)."""
    import torch
    from triton.runtime import driver
    from bench.gpu_compile import CompileOnlyDriver
    driver.set_active(CompileOnlyDriver(90))
    from sglang_hybrid.cost import ContextCostModel
    from sglang_hybrid.kernels import cost_context, ragged_layout, warmup
    from sglang_hybrid.kernels import variants as kv

    cfg = kv.LaunchConfig(mode="merge", depths=(2,), widths=(3,), n_nodes=2, ngram_k=1, proposal_width=4, ring=16,
                          cost=3, cost_follows=True, max_batch=4, ragged=True, ragged_layout=True)
    chosen = [r for r in kv.launch_variants(cfg) if r["kernel"] in ("_follow_kernel", "_compact_kernel")]
    count, seconds = warmup.warm_up("cuda", chosen)
    assert count == 2 and seconds > 0 and warmup.counters()["triton_warmup_failed"] == 0, warmup.counters()

    def launch(fn, *args):
        try:                     # compiles on a cache miss, then fails to load: there is no GPU
            fn(*args)
        except Exception:
            pass

    table = ContextCostModel([1, 8, 64], [0.01, 0.02, 0.05], [0.005, 0.01, 0.03], 10, 100).to("cpu")
    # the launch sites themselves, at batch sizes and rows the warm-up never saw: no compile
    for b in (1, 3, 4):
        launch(cost_context.follow_context, torch.arange(1, b + 1, dtype=torch.int64), table, None)
    idx = torch.arange(12, dtype=torch.int64)
    for rows in (1, 5, 12):
        launch(ragged_layout.compact_ahead, idx, rows, torch.arange(12), torch.arange(12))
    print("AFTER_WARMED", warmup.compiles_after_start())
    # a variant outside the set (a 2-table follow the configuration does not blend): one compile, counted
    launch(cost_context.follow_context, torch.ones(2, dtype=torch.int64), table, table)
    launch(cost_context.follow_context, torch.ones(3, dtype=torch.int64), table, table)
    print("AFTER_OUTSIDE", warmup.compiles_after_start())


if __name__ == "__main__":
    globals()[sys.argv[1]]()
