"""Kernel launches of HYBRID's per-step device path, counted with the PyTorch profiler at several batch sizes.

    python -m bench.step_launches [--batches 1,32,128]

What is counted: one decode step of the SGLang worker's device work between the EAGLE draft and the verify forward
(``HybridStep.select``: n-gram alignment, the device prompt lookup for rows left without a proposal, the decision
with calibration, survivals, width and depth plans and selection, the counters), the verify input's node tokens,
tree links and FULL_MASK, and the ring and context updates after verify (``HybridStep.after_verify``), for both
decision paths the worker has (setting ``decision_kernels``):

* ``fused`` (the default wherever Triton runs: every GPU, and SGLang's CPU engine): Triton kernel launches, counted by
  wrapping Triton's launcher, plus every ATen operator the step still dispatches outside them that runs a kernel
  (allocations and views run none and are not counted; see ``NO_KERNEL``). Counted in a subprocess under Triton's
  CPU interpreter (``TRITON_INTERPRET=1``), whose own host work inside a launch is excluded.
* ``torch`` (the reference operators): every top-level ATen operator, as before; on a GPU each is (at most) one
  kernel launch, so the count is an upper bound on launches per step.

Configurations: ``choose`` and ``merge``, each with no plan (no cost tables: the full width every step), the width
plan (a cost table), the width and depth plans (both tables, a user's), and both plans with the tables the README's
launch measures at start (two contexts each, blended at each batch's context first: one launch more on the fused path;
the replay's as-built HYBRID), 4 EAGLE steps, ngram_k 8. The model-only adaptive baseline of the replay (the core's
``DecisionStep`` without an n-gram side, the same tree links and mask) is counted too: the replay charges each policy
its own count (``bench.replay.engine``).

Why it matters: eagerly, each launch costs several microseconds of host time on a GPU and a couple of microseconds of
GPU time even when tiny; a count in the hundreds is milliseconds per step on the critical path (the engine issue
asks for at most 12 launches). On this CPU only the count is meaningful; GPU latency of the same step captured in a
CUDA graph is measured by ``bench/device_run.sh`` when a GPU is lent.
"""
from __future__ import annotations

import argparse
import atexit
import functools
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

K, STEPS, VOCAB = 8, 4, 32000
#: context length of the device prompt lookup's table (its work per step is static in it, not in the batch)
CONTEXT = 2048
#: the fused-kernel target of the engine issue: launches per decision step
TARGET = 12
#: EAGLE alternatives per chain position of the counted row with them (setting ``eagle_alternatives``)
ALTERNATIVES = 3
#: (name, cost table, draft cost table, both at two contexts) of the counted configurations: the last is the README's
#: launch, whose tables are measured at start at two contexts and blended at each batch's context
PLANS = (("no plan", False, False, False), ("width plan", True, False, False),
         ("width + depth plans", True, True, False), ("both plans, measured at start", True, True, True))


#: ATen operators that only allocate or make views: no kernel runs (an instance whose children do run one counts)
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "empty", "empty_strided", "view", "_unsafe_view", "slice", "select", "as_strided", "reshape", "_reshape_alias",
    "unsqueeze", "squeeze", "expand", "permute", "t", "transpose", "alias", "detach", "unbind", "narrow", "to",
    "lift_fresh", "resolve_conj", "resolve_neg", "view_as", "expand_as"))
#: the name under which ``_count_triton`` records a Triton launch in the profile
_TRITON = "triton_launch::"


def count_ops(step_fn) -> int:
    """ATen operators one call of ``step_fn`` dispatches (after a warm-up call); top-level calls only: an operator
    implemented by other operators counts once."""
    from torch.profiler import ProfilerActivity, profile

    step_fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def count_launches(step_fn) -> int:
    """Kernel launches of one call of ``step_fn`` (after a warm-up call): Triton launches, plus the top-level ATen
    operators outside them that run a kernel (not in ``NO_KERNEL``, or with a child that is not)."""
    from torch.profiler import ProfilerActivity, profile

    def runs_kernel(e) -> bool:
        return e.name not in NO_KERNEL or any(runs_kernel(c) for c in e.cpu_children if c.name.startswith("aten::"))

    def in_triton(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith(_TRITON):
                return True
            p = p.cpu_parent
        return False

    with _count_triton():
        step_fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step_fn()
    n = 0
    for e in prof.events():
        if e.name.startswith(_TRITON):
            n += 1
        elif e.name.startswith("aten::") and not in_triton(e):
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            if parent is None and runs_kernel(e):
                n += 1
    return n


class _count_triton:
    """Records every Triton launch in the profile under ``_TRITON`` + the kernel's name (interpreter or compiled)."""

    def __enter__(self):
        from torch.profiler import record_function
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        self.saved = [(cls, cls.run) for cls in (InterpretedFunction, JITFunction)]
        for cls, run in self.saved:
            def wrapped(fn_self, *a, _run=run, **k):
                name = getattr(getattr(fn_self, "fn", None), "__name__", "kernel")
                with record_function(_TRITON + name):
                    return _run(fn_self, *a, **k)
            cls.run = wrapped

    def __exit__(self, *exc):
        for cls, run in self.saved:
            cls.run = run


def _hybrid_step_fn(step, b: int):
    from sglang_hybrid.kernels import fused_links_and_mask
    from sglang_hybrid.sglang_plugin import alignment
    from sglang_hybrid.sglang_plugin.tree_mask import full_mask, tree_links_torch, verify_nodes

    g = torch.Generator().manual_seed(b)
    slots = torch.arange(b)
    seq = torch.full((b,), 100)
    gen = torch.zeros(b, dtype=torch.int64)
    width = step.proposal_width
    alignment.publish(step.buffers, slots, torch.randint(0, VOCAB, (b, width), generator=g),
                      torch.full((b,), width), seq + 1, gen, torch.full((b, width), 9), torch.full((b, width), 2),
                      torch.full((b, width), 3), torch.zeros((b, width), dtype=torch.int64))
    root = torch.randint(0, VOCAB, (b,), generator=g)
    chain = torch.randint(0, VOCAB, (b, step.num_steps), generator=g)
    conf = torch.rand((b, step.num_steps), generator=g)
    w = step.widths[len(step.widths) // 2]
    m = step.alternatives
    if m:
        # the worker's share (setting eagle_alternatives): the draft extend's top tokens kept per slot, then the
        # step's alternatives from them and the draft forwards' records (those are taken inside the draft's graph).
        # The extend's softmax is the first drafted token's confidence's too (worker.extend_probabilities), taken
        # with or without the alternatives, so it is not theirs to count
        extend_probs = torch.softmax(torch.randn((b, VOCAB), generator=g), -1)
        rec_p = torch.rand((b, step.num_steps, m + 1), generator=g)
        rec_i = torch.randint(0, VOCAB, (b, step.num_steps, m + 1), generator=g)

    emitted = torch.zeros((b, w), dtype=torch.int64)                  # the verify's output (not the step's work)
    accepted = torch.ones(b, dtype=torch.int64)

    def one_step():
        alt = {}
        if m:
            alt_tokens, alt_conf = step.step_alternatives(slots, gen, rec_p, rec_i, chain)
            alt = dict(alt_tokens=alt_tokens, alt_conf=alt_conf)
        d = step.select(root, chain, conf, slots, gen, seq, width=w, **alt)
        if step.fused is not None:
            fused_links_and_mask(d.tree.tokens, d.tree.valid, d.tree.ancestors, seq, int(b * 101),
                                 workspace=step.workspace)
        else:
            _, anc = verify_nodes(d.tree.tokens, d.tree.valid, d.tree.ancestors)
            tree_links_torch(anc, seq)
            full_mask(anc, seq, int(b * 101))
        step.after_verify(d.tree, slots, seq, emitted, accepted)
        if m:
            step.keep_first_alternatives(slots, gen, extend_probs)

    return one_step


#: counts made so far, by (function, arguments): counting runs the step under the profiler (seconds each). A plain dict
#: rather than ``functools.lru_cache`` so that the replay's forked processes can hand theirs back to the process that
#: forks the next ones (``bench.replay.realistic.Runner.in_processes``)
COUNTS: dict = {}


def _memo(fn):
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = (fn.__name__, tuple(bound.arguments.values()))
        if key not in COUNTS:
            COUNTS[key] = fn(*args, **kwargs)
        return COUNTS[key]

    return counted


@_memo
def hybrid_launches(b: int, mode: str = "merge", num_steps: int = STEPS, ngram_k: int = K, width_plan: bool = True,
                    depth_plan: bool = True, context: int = CONTEXT, measured: bool = False,
                    kernels: str = "fused", alternatives: int = 0) -> int:
    """Launches of one HYBRID decode step of the worker (``HybridStep``) for ``b`` requests with decision path
    ``kernels`` ("fused": counted in a subprocess under Triton's interpreter; "torch": its ATen operators).
    ``measured``: the plans' tables are the kind measured at start (``cost.ContextCostModel``: two contexts, blended
    at each batch's), not a user's at one context. ``alternatives``: the setting ``eagle_alternatives`` (the worker's
    eager share of them counted too: the position-0 table's update after the draft extend, the step's alternatives
    before the decision, their counters after verify)."""
    args = (b, mode, num_steps, ngram_k, width_plan, depth_plan, context, measured, alternatives)
    if kernels == "fused":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return _hybrid_count(*args, "fused")
        return _FUSED_COUNTER.count(args)
    if kernels != "torch":
        raise ValueError(f"kernels must be 'fused' or 'torch', got {kernels!r}")
    return _hybrid_count(*args, "torch")


class _FusedCounter:
    """One subprocess under Triton's interpreter that counts fused steps on request, started at the first count.

    Why a subprocess: the interpreter must be switched on before Triton is imported, which the caller (the replay, a
    test) has done long before. Why one for all counts: starting Python, torch and Triton took seconds per count, and
    the realistic replay asks for dozens. A process forked from the caller (the replay's cells) starts its own: pipes
    are not shared between processes."""

    TIMEOUT_S = 600

    def __init__(self):
        self.proc, self.owner, self.log = None, None, None

    def count(self, args) -> int:
        if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], self.TIMEOUT_S)
            line = self.proc.stdout.readline() if ready else ""
            if line.startswith("count "):
                return int(line.split()[1])
            if not line:                    # it died or hung: say why, and start afresh on the next count
                self.proc.kill()
                self.proc.wait()            # reaped, so the next count cannot mistake it for a live one
                self.proc = None
                self.log.seek(0)
                raise RuntimeError(f"counting the fused step {args} failed:\n{self.log.read()[-3000:]}")

    def _start(self) -> None:
        self.log = tempfile.TemporaryFile("w+")
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.step_launches", "--serve-counts"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     cwd=Path(__file__).resolve().parent.parent)
        self.owner = os.getpid()
        atexit.register(self._stop, self.proc, self.log)

    @staticmethod
    def _stop(proc, log) -> None:
        """At exit: end of input ends the counter's loop."""
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stdout.close()
        log.close()


_FUSED_COUNTER = _FusedCounter()


def _serve_counts() -> None:
    """The counter's side: one JSON list of ``_hybrid_count`` arguments per line in, ``count N`` per line out."""
    for line in sys.stdin:
        print(f"count {_hybrid_count(*json.loads(line), 'fused')}", flush=True)


def _table(base: float, per_token: float, measured: bool):
    """A linear table; ``measured``: at two contexts, the shorter one's a little cheaper, as measured at start."""
    from sglang_hybrid.cost import ContextCostModel, CostModel

    long = CostModel.linear(base, per_token)
    if not measured:
        return long
    return ContextCostModel(long.sizes, long.seconds, long.seconds * 0.8, 256, 2048)


def _hybrid_count(b, mode, num_steps, ngram_k, width_plan, depth_plan, context, measured, alternatives,
                  kernels) -> int:
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    with tempfile.TemporaryDirectory() as tmp:
        kw = {}
        if width_plan:
            kw["cost_table"] = str(Path(tmp) / "cost.json")
            _table(0.01, 0.0001, measured).save(kw["cost_table"])
        if depth_plan:
            kw["draft_cost_table"] = str(Path(tmp) / "draft.json")
            _table(0.001, 0.00001, measured).save(kw["draft_cost_table"])
        settings = HybridSettings(mode=mode, ngram_k=ngram_k, decision_kernels=kernels,
                                  eagle_alternatives=alternatives, **kw)
        with _one_thread():
            step = HybridStep(settings, num_steps=num_steps, pool_size=max(b, 1), device="cpu",
                              max_context_len=context)
            fn = _hybrid_step_fn(step, b)
            return count_launches(fn) if kernels == "fused" else count_ops(fn)


@_memo
def model_only_launches(b: int, k: int = STEPS, measured: bool = False) -> int:
    """ATen operators of one step of the replay's model-only adaptive baseline for ``b`` requests: the core's
    ``DecisionStep`` on an EAGLE chain of ``k`` (no n-gram side) at a width bucket, with the verify tree links and
    mask; ``measured``: its table measured at start as the worker's (two contexts), blended at the batch's first."""
    from sglang_hybrid.calibration import ModelCalibration
    from sglang_hybrid.sglang_plugin.verify_input import full_mask, tree_links_torch
    from sglang_hybrid.step import DecisionStep, ModelDraft
    from sglang_hybrid.widths import default_buckets

    widths = default_buckets(k + 1)
    decide = DecisionStep(mode="choose", n_nodes=k, model_calibration=ModelCalibration.identity().to("cpu"),
                          widths=widths)
    cost = _table(0.01, 0.0001, measured).to("cpu")
    g = torch.Generator().manual_seed(b)
    root = torch.randint(0, VOCAB, (b,), generator=g)
    model = ModelDraft(torch.randint(0, VOCAB, (b, k), generator=g), torch.rand((b, k), generator=g),
                       torch.full((b,), k, dtype=torch.int64))
    seq = torch.full((b,), 100)
    w = widths[len(widths) // 2]

    def one_step():
        if measured:
            cost.follow(seq)
        d = decide(root, model, None, cost=cost, check_values=False, width=w)
        tree_links_torch(d.tree.ancestors, seq)
        full_mask(d.tree.ancestors, seq, int(b * 101))

    with _one_thread():
        return count_ops(one_step)


class _one_thread:
    """Counts do not depend on threads; one keeps the profiler's run short on a shared machine."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--serve-counts", action="store_true", help=argparse.SUPPRESS)   # internal: _FusedCounter's side
    args = ap.parse_args(argv)
    if args.serve_counts:
        _serve_counts()
        return 0
    batches = [int(x) for x in args.batches.split(",")]
    print("Launches per decode step (HybridStep.select + verify-input node tokens, tree links and mask + "
          f"after_verify), CPU profiler; {STEPS} EAGLE steps, ngram_k {K}, prompt-lookup context {CONTEXT}")
    print(f"{'configuration':<62}" + "".join(f"{'B=' + str(b):>10}" for b in batches))
    counts = {}
    for kernels, label in (("fused", "kernel launches, fused"), ("torch", "ATen operators, torch")):
        for mode in ("choose", "merge"):
            for plan, wp, dp, measured in PLANS:
                row = [hybrid_launches(b, mode, width_plan=wp, depth_plan=dp, kernels=kernels, measured=measured)
                       for b in batches]
                counts[(kernels, mode, plan)] = row
                print(f"{label + ', ' + mode + ', ' + plan:<62}" + "".join(f"{n:>10}" for n in row))
    alt = [hybrid_launches(b, "merge", measured=True, alternatives=ALTERNATIVES) for b in batches]
    print(f"{f'kernel launches, fused, merge, measured + eagle_alternatives={ALTERNATIVES}':<62}"
          + "".join(f"{n:>10}" for n in alt))
    mo = [model_only_launches(b, measured=True) for b in batches]
    print(f"{'ATen operators, model-only adaptive (replay), measured':<62}" + "".join(f"{n:>10}" for n in mo))
    fused = [row for (k, *_), row in counts.items() if k == "fused"]
    const = all(len(set(row)) == 1 for row in counts.values())
    print(f"{'MET' if const else 'MISSED'}: launch count independent of batch size")
    worst = max(max(row) for row in fused)
    torch_worst = max(max(row) for (k, *_), row in counts.items() if k == "torch")
    print(f"{'MET' if worst <= TARGET else 'MISSED'}: <= {TARGET} launches per decision step at every size and "
          f"configuration (fused path, the worker's default where Triton runs: most {worst}; the torch path "
          f"dispatches up to {torch_worst} operators)")
    extra = max(alt) - max(counts[("fused", "merge", PLANS[-1][0])])
    print(f"(with eagle_alternatives={ALTERNATIVES}, off by default, the worker adds {extra} launches: the top-k of "
          "the draft extend's distribution (its softmax is the first drafted token's confidence's, taken anyway), the "
          "position-0 table's update, the step's alternatives and their counters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
