"""GPU check of the hybrid core: CUDA-graph capture, no host sync, equal to eager, timings.

    python -m bench.gpu_check [--batches 4,32,128] [--iters 20]
    python -m bench.gpu_check --cpu-dry-run      # exercise the script's logic on the CPU (no graph, no GPU)

For batch 4/32/128 and both modes (``chain``: choose over two 8-token chains; ``tree``: merge of an 8-token chain and a
16-node n-gram tree), one decode step of the core -- n-gram acceptance gather, model temperature scaling, survivals,
device price, select, greedy AND sampling verification -- is

1. run eagerly under ``torch.cuda.set_sync_debug_mode("error")`` (any hidden host sync raises),
2. captured in a CUDA graph (after warm-up on a side stream),
3. replayed under ``set_sync_debug_mode("error")``, and its outputs compared with eager (ints exact, floats 1e-6),
4. fed fresh inputs in place (device-side generators) and replayed again: must equal eager on the new inputs,
5. timed: eager vs replay, median of ``--iters`` runs with CUDA events.

Only pure-PyTorch modules are imported (no Rust extension): on a lent GPU machine only torch/triton need to exist.
Without a GPU it says so plainly and exits 0.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bench.step_cost import MODES, decide, make_step_inputs
from sglang_hybrid.verify import greedy_accept, sample_accept


def step(x, m):
    """Decide (acceptance -> survival -> price -> select) then both verification rules."""
    b_star, lam, tree = decide(x, m["mode"], m["n_nodes"], m["tree"])
    g = greedy_accept(tree, x["logits"])
    s = sample_accept(tree, x["logits"], x["temperature"], x["uniforms"])
    return (b_star, lam) + tuple(tree) + tuple(g) + tuple(s)


def compare(got, want, what: str) -> None:
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise AssertionError(f"{what}: output {i} has {a.dtype}{tuple(a.shape)}, eager {b.dtype}{tuple(b.shape)}")
        ok = torch.allclose(a, b, atol=1e-6) if a.is_floating_point() else torch.equal(a, b)
        if not ok:
            raise AssertionError(f"{what}: output {i} differs from eager")


def refresh_inputs(x, seed: int) -> None:
    """New values in the same (static) buffers, generated on the device (no host copy)."""
    g = torch.Generator(device=x["logits"].device).manual_seed(seed)
    dev = x["logits"].device
    x["logits"].copy_(torch.randn(x["logits"].shape, generator=g, device=dev))
    x["uniforms"].copy_(torch.rand(x["uniforms"].shape, generator=g, device=dev))
    x["prob"].copy_(torch.rand(x["prob"].shape, generator=g, device=dev))
    x["feats"]["match_len"].copy_(torch.randint(0, 40, x["feats"]["match_len"].shape, generator=g, device=dev))
    km, kn = x["model_tokens"].shape[1], x["ngram_tokens"].shape[1]
    x["model_len"].copy_(torch.randint(0, km + 1, x["model_len"].shape, generator=g, device=dev))
    x["ngram_len"].copy_(torch.randint(0, kn + 1, x["ngram_len"].shape, generator=g, device=dev))


def timed_ms(fn, iters: int) -> float:
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def check_gpu(batches, iters: int) -> int:
    dev = torch.device("cuda")
    print(f"GPU: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}")
    print(f"{'batch':>5} {'mode':>6} {'W':>3} {'eager ms':>9} {'graph ms':>9} {'speedup':>8}  result")
    failures = 0
    for b in batches:
        for name, m in MODES.items():
            x = make_step_inputs(b, m["km"], m["kn"], m["tree"], m["n_nodes"], device=dev)
            try:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                eager = step(x, m)
                torch.cuda.set_sync_debug_mode(0)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step(x, m)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = step(x, m)
                torch.cuda.set_sync_debug_mode("error")
                graph.replay()
                torch.cuda.set_sync_debug_mode(0)
                torch.cuda.synchronize()
                compare(static_out, eager, f"B={b} {name} replay")
                refresh_inputs(x, seed=b + 7)
                torch.cuda.set_sync_debug_mode("error")
                graph.replay()
                torch.cuda.set_sync_debug_mode(0)
                eager2 = step(x, m)
                torch.cuda.synchronize()
                compare(static_out, eager2, f"B={b} {name} replay on new inputs")
                t_eager = timed_ms(lambda x=x, m=m: step(x, m), iters)
                t_graph = timed_ms(graph.replay, iters)
                print(f"{b:>5} {name:>6} {m['n_nodes'] + 1:>3} {t_eager:>9.3f} {t_graph:>9.3f} "
                      f"{t_eager / t_graph:>7.1f}x  ok (no sync, equal to eager, twice)", flush=True)
            except Exception as e:  # report every configuration, then fail
                torch.cuda.set_sync_debug_mode(0)
                failures += 1
                print(f"{b:>5} {name:>6} {m['n_nodes'] + 1:>3} {'-':>9} {'-':>9} {'-':>8}  FAILED: "
                      f"{type(e).__name__}: {e}", flush=True)
            del x
    print("ALL OK" if not failures else f"{failures} configuration(s) FAILED")
    return 1 if failures else 0


def dry_run(batches) -> int:
    """CPU: same inputs, same step, static-buffer refresh and comparison logic; no graph (there is no GPU)."""
    print("CPU dry run (no GPU, no CUDA graph): checks the script's own logic only")
    for b in batches:
        for name, m in MODES.items():
            x = make_step_inputs(b, m["km"], m["kn"], m["tree"], m["n_nodes"], with_logits=True)
            out = step(x, m)
            compare(step(x, m), out, f"B={b} {name} determinism")
            refresh_inputs(x, seed=b + 7)
            out2 = step(x, m)
            changed = sum(not torch.equal(a, c) for a, c in zip(out, out2))
            print(f"  B={b:<4} {name:<6} outputs: {len(out)} tensors, deterministic; {changed} change on new inputs")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args(argv)
    batches = [int(v) for v in args.batches.split(",")]
    if args.cpu_dry_run:
        return dry_run([min(batches)])
    if not torch.cuda.is_available():
        print("NO GPU PRESENT: torch.cuda.is_available() is False on this machine, so the CUDA-graph / "
              "no-host-sync check was NOT run. (Run it on a machine with a CUDA GPU; --cpu-dry-run exercises the "
              "script on the CPU.)")
        return 0
    return check_gpu(batches, args.iters)


if __name__ == "__main__":
    sys.exit(main())
