"""The fused Triton step (``sglang_hybrid.kernels``) against the torch path it replaces, under Triton's interpreter, for
``tests/kernels/test_fused_decision.py``:

    TRITON_INTERPRET=1 python -m tests.kernels._scripts.fused_decision NAME

runs the function ``NAME`` of this module (from the repository's root: the shipped calibration is read by its path)
and prints its result as one JSON line, last.
"""
import json
import sys


def exactness() -> dict:
    """Both comparisons (random and adversarial decisions, evolving worker steps), both positive controls and ragged
    verify's layout, in one interpreter run (the start-up is shared)."""
    import bench.fused_exactness as fe
    out = {"decision": fe.run(400, seed=11, progress=False),
           "steps": fe.run_steps(40, seed=12, progress=False),
           "decision_control": fe.run(40, seed=13, control=True, progress=False),
           "steps_control": fe.run_steps(6, seed=14, control=True, progress=False),
           "ragged": fe.run_ragged(150, seed=15, progress=False)}
    return out


def gpu_rows() -> dict:
    """The same comparisons at the rows per program a GPU launches (run with ``kernels.GPU_TILES_ENV`` set)."""
    import torch
    import bench.fused_exactness as fe
    from sglang_hybrid.kernels import rows_per_program
    return {"rows": rows_per_program(torch.device("cpu")),
            "decision": fe.run(120, seed=21, progress=False),
            "steps": fe.run_steps(8, seed=22, progress=False),
            "ragged": fe.run_ragged(60, seed=23, progress=False)}


def recorded() -> dict:
    """Steps recorded from the CPU reference loop on real text (SmolLM2-135M), decided again by both paths."""
    import bench.fused_exactness as fe
    return fe.run_recorded(max_new=16)


def host_reads() -> dict:
    """Two fused worker steps (one with EAGLE alternatives) with every host read and, once warm, every allocation
    outside the kernels refused; the trace-checked replay of the step; what the fused decision refuses."""
    import tempfile

    import torch
    from triton.runtime.interpreter import InterpretedFunction
    from sglang_hybrid import kernels
    from sglang_hybrid.calibration import NgramCalibration
    from sglang_hybrid.cost import ContextCostModel
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep
    from sglang_hybrid.step import DecisionStep, NgramDraft

    inside = [0]
    run = InterpretedFunction.run
    def counted(self, *a, **k):
        inside[0] += 1
        try:
            return run(self, *a, **k)
        finally:
            inside[0] -= 1
    InterpretedFunction.run = counted
    reads = []
    def guard(name, orig):
        def f(self, *a, **k):
            if not inside[0]:
                reads.append(name)
                raise RuntimeError(f"host read: Tensor.{name}")
            return orig(self, *a, **k)
        return f
    def refuse(name, orig):
        def f(*a, **k):
            if not inside[0]:
                reads.append("torch." + name)
                raise RuntimeError(f"allocation: torch.{name}")
            return orig(*a, **k)
        return f
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    tmp = tempfile.mkdtemp()
    # tables at two contexts, as measured at start: the step blends them at its batch's context in place
    ContextCostModel([1, 64, 4096], [0.0101, 0.0164, 0.4196], [0.01, 0.012, 0.3], 16, 128).save(tmp + "/c.json")
    ContextCostModel([1, 8, 64], [1e-3, 1.2e-3, 2e-3], [1e-3, 1.1e-3, 1.5e-3], 16, 128).save(tmp + "/d.json")
    st = HybridStep(HybridSettings(mode="merge", ngram_k=6, cost_table=tmp + "/c.json",
                                   draft_cost_table=tmp + "/d.json", model_bias_eta=0.1, log_interval=0),
                    num_steps=4, pool_size=8, device="cpu", max_context_len=256)
    assert st.fused is not None
    long_seconds = st.cost.seconds.clone()
    sa = HybridStep(HybridSettings(mode="merge", ngram_k=6, eagle_alternatives=2, log_interval=0), num_steps=4,
                    pool_size=8, device="cpu", max_context_len=256)
    assert sa.fused is not None and sa.widths == (4 + 6 + 1,)         # the leaves share the chains' nodes
    b = 5
    slots, seq = torch.arange(b), torch.full((b,), 40)
    gen = torch.zeros(b, dtype=torch.int64)
    pw = st.proposal_width
    alignment.publish(st.buffers, slots, torch.randint(0, 9, (b, pw)), torch.full((b,), pw), seq + 1, gen,
                      torch.full((b, pw), 9), torch.full((b, pw), 2), torch.full((b, pw), 3),
                      torch.zeros((b, pw), dtype=torch.int64))
    root, chain, conf = torch.randint(0, 9, (b,)), torch.randint(0, 9, (b, 4)), torch.rand((b, 4))
    emitted, acc = torch.randint(0, 9, (b, 7)), torch.full((b,), 2)
    span = st.lookup_span(41)
    rec_p, rec_i = torch.rand((b, 4, 3)), torch.randint(0, 9, (b, 4, 3))
    extend_probs = torch.softmax(torch.randn((b, 50)), -1)    # the draft extend's (worker.extend_probabilities)
    alt_emitted = torch.randint(0, 9, (b, 11))
    def step():
        d = st.select(root, chain, conf, slots, gen, seq, width=7, lookup_span=span)
        kernels.fused_links_and_mask(d.tree.tokens, d.tree.valid, d.tree.ancestors, seq, 4 * b * 41,
                                     workspace=st.workspace)
        st.after_verify(d.tree, slots, seq, emitted, acc)
        alt = sa.step_alternatives(slots, gen, rec_p, rec_i, chain)
        da = sa.select(root, chain, conf, slots, gen, seq, width=11, alt_tokens=alt[0], alt_conf=alt[1])
        kernels.fused_links_and_mask(da.tree.tokens, da.tree.valid, da.tree.ancestors, seq, 4 * b * 41,
                                     workspace=sa.workspace)
        sa.after_verify(da.tree, slots, seq, alt_emitted, acc)
        sa.keep_first_alternatives(slots, gen, extend_probs)
        return d

    makers = ("empty", "zeros", "ones", "full", "tensor", "empty_like", "zeros_like", "full_like", "arange")
    saved_makers = {n: getattr(torch, n) for n in makers}
    for n in names:
        setattr(torch.Tensor, n, guard(n, saved[n]))
    try:
        first = step()
        held, ptr, alt_held = st.workspace.nbytes, first.tree.tokens.data_ptr(), sa.workspace.nbytes
        for n in makers:                   # a warmed-up step allocates nothing outside the kernels
            setattr(torch, n, refuse(n, saved_makers[n]))
        second = step()
    finally:
        for n in names:
            setattr(torch.Tensor, n, saved[n])
        for n in makers:
            setattr(torch, n, saved_makers[n])
    same_place = (st.workspace.nbytes == held and second.tree.tokens.data_ptr() == ptr
                  and sa.workspace.nbytes == alt_held)
    followed = bool((st.cost.seconds < long_seconds).any())     # 40 tokens a request: priced below 128's
    # replayable as one graph: captured once, then three steps on new drafts, each the same launches and
    # operators on the same buffers (the CPU's trace-checked replay, ragged.graph_capture; raises otherwise)
    from sglang_hybrid.sglang_plugin.ragged.graph_capture import TracedEagerCapture
    cap = TracedEagerCapture()
    cap.run("step", step)
    for _ in range(3):
        root.copy_(torch.randint(0, 9, (b,)))
        chain.copy_(torch.randint(0, 9, (b, 4)))
        conf.copy_(torch.rand((b, 4)))
        cap.run("step", step)
    errors = []
    cal = NgramCalibration.load("sglang_hybrid/data/ngram_calibration.json").to("cpu")
    for kw in (dict(widths=None), dict(widths=[5], depths=[0, 4])):
        try:
            kernels.FusedDecisionStep(DecisionStep(mode="merge", n_nodes=4, ngram_calibration=cal, **kw), "cpu")
        except ValueError as e:
            errors.append(str(e))
    fd = kernels.FusedDecisionStep(DecisionStep(mode="merge", n_nodes=4, ngram_calibration=cal, widths=[5]),
                                   "cpu")
    z = torch.zeros((1, 2), dtype=torch.int64)
    try:
        fd(torch.zeros(1, dtype=torch.int64), z, torch.zeros((1, 2)),
           NgramDraft(z, z, torch.zeros(1, dtype=torch.int64), z, z, z, z, z, tree=True))
    except ValueError as e:
        errors.append(str(e))
    return {"reads": reads, "steps": st.counters.decision_steps, "errors": errors,
            "alt_steps": sa.counters.decision_steps,
            "alt_nodes": sa.counters.snapshot()["alternatives_verified"],
            "alt_table": int((sa.first_alternatives.gen[slots] == gen).sum()),
            "same_place": same_place, "traced_replays": cap.replays["step"], "followed": followed}


def context_blend() -> dict:
    """``kernels.follow_context`` against ``ContextCostTables.follow`` on random tables and batches."""
    import numpy as np
    import torch

    from sglang_hybrid import kernels
    from sglang_hybrid.cost import ContextCostModel

    rng = np.random.default_rng(5)
    def table(ns=None):
        ns = ns or int(rng.integers(1, 17))
        sizes = np.cumsum(rng.integers(1, 60, ns))
        short = np.cumsum(rng.random(ns)) + 0.01
        long = short + np.cumsum(rng.random(ns)) * rng.random()
        lo = int(rng.integers(1, 400))
        return ContextCostModel(sizes, long, short, lo, lo + int(rng.integers(1, 3000)))
    cases, failed = 0, []
    for i in range(61):
        # the last: tables longer than the kernel unrolls (a user's file), followed by the torch rule
        verify, draft = (table(), table()) if i < 60 else (table(70), table(3))
        seq = torch.as_tensor(rng.integers(1, 8000, int(rng.integers(1, 700))))
        which = (True, True) if i % 3 == 0 else (True, False) if i % 3 == 1 else (False, True)
        fused = [m.to("cpu") if on else None for m, on in zip((verify, draft), which)]
        ref = [m.to("cpu") if on else None for m, on in zip((verify, draft), which)]
        kernels.follow_context(seq, *fused)
        for f, r in zip(fused, ref):
            if r is not None:
                r.follow(seq)
                cases += 1
                if not (torch.equal(f.seconds, r.seconds) and torch.equal(f._seg_slope, r._seg_slope)):
                    failed.append(i)
    return {"cases": cases, "failed": failed}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
