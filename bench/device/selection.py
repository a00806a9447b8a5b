"""The plugin's per-step selection at deployed shapes: ``HybridStep.select`` + the SGLang-free verify-input build.

    python -m bench.device.selection          # GPU: graph capture + timing; no GPU: the CPU mode (see below)

Deployed shapes: EAGLE ``num_steps = 4``, n-gram ``k = 8``, merge mode, so ``n_nodes = 12`` and the verify width
``W = 13``; batch 1, 4, 16, 32, 64, 128; every request at a ~2k-token context. One step is what the worker runs between
the EAGLE draft and the verify forward: ``HybridStep.select`` (ring write, alignment of the late n-gram proposals, the
device prompt lookup over each row's 2k-token context for rows left without one, calibration, survivals, price from
the cost table, selection) then, from ``sglang_plugin.tree_mask`` (the code
``build_verify_input`` runs), ``verify_nodes``, ``tree_links_torch`` (positions and retrieve lists) and ``full_mask``
(FULL_MASK into a preallocated buffer, as the worker passes the attention backend's).

On a GPU the step runs the worker's default there, the fused Triton path (``sglang_hybrid.kernels``: the decision,
links and mask in a handful of launches); the CPU reference it is compared with runs the torch path. Per batch size:

1. one eager call (one-time initialisation: not sync-checked), then a second eager call under
   ``torch.cuda.set_sync_debug_mode("error")`` (any host sync in the steady-state step raises);
2. the step captured in a CUDA graph and replayed under ``set_sync_debug_mode("error")``;
3. the replay's outputs compared with the eager CUDA call (exact) and with the eager CPU result of a second
   ``HybridStep`` on identical inputs (integers and masks exact, floats to 1e-5);
4. latency: median of graph replays (CUDA events), beside the measured target step at the same batch and ``W = 13``
   (``cost_tables.json`` from the cost_table job); the target is "selection + verify-input build <= 5 % of the
   target step at batch 32 and 128", printed MET or MISSED only when both were measured.

The price uses the measured table of the same batch when the cost_table job ran, else a linear stand-in (said so).

Without a GPU (CPU mode): batch 1, 4, 16 at the same shapes; the step is traced by ``torch.compile(fullgraph=True,
backend="eager")`` -- a graph break (``.item()``, ``.tolist()``, data-dependent Python control flow) fails it, the
closest CPU proxy of a capturable step -- and the compiled step must equal the eager one. No latency is printed.
"""
from __future__ import annotations

import sys
import time
from typing import NamedTuple

import torch

from bench.device import _env

NUM_STEPS, NGRAM_K, MODE = 4, 8, "merge"
GPU_BATCHES = (1, 4, 16, 32, 64, 128)
CPU_BATCHES = (1, 4, 16)
#: (EAGLE steps, n-gram k) the realistic replay tunes HYBRID over besides the deployed (4, 8), at their widest and
#: shallowest (W = 29 and 31): the same checks at fewer batch sizes, no 5 % verdict (the cost table stops at W = 16)
TUNED_CONFIGS = ((2, 24), (6, 24))
TUNED_GPU_BATCHES = (4, 32, 128)
TUNED_CPU_BATCHES = (4,)
CONTEXT = 2048
VOCAB = 128256
TARGET_SHARE = 0.05
TARGET_BATCHES = (32, 128)
DEPLOYED = (NUM_STEPS, NGRAM_K)
#: the batch whose eager step's host time is profiled (GPU only)
PROFILE_BATCH = 32


def config_name(config) -> str:
    """``S<steps>/K<k>``, the replay's name for an (EAGLE steps, n-gram k) configuration."""
    return f"S{config[0]}/K{config[1]}"


class StepInputs(NamedTuple):
    root: torch.Tensor
    model_tokens: torch.Tensor
    model_conf: torch.Tensor
    slots: torch.Tensor
    cur_gen: torch.Tensor
    seq_lens: torch.Tensor


def make_step(device, cost_model=None, num_steps: int = NUM_STEPS, ngram_k: int = NGRAM_K):
    """A ``HybridStep`` as the worker builds it (deployed settings unless given); ``cost_model`` replaces the
    settings' table."""
    from sglang_hybrid.sglang_plugin.config import HybridSettings
    from sglang_hybrid.sglang_plugin.hybrid_step import HybridStep

    settings = HybridSettings(mode=MODE, ngram_k=ngram_k)
    return settings, (lambda pool: _with_cost(HybridStep(settings, num_steps=num_steps, pool_size=pool,
                                                         device=device, max_context_len=CONTEXT), cost_model))


def _with_cost(step, cost_model):
    if cost_model is not None:
        step.cost = cost_model.to(step.device)
    return step


def make_inputs(step, batch: int, seed: int = 0):
    """Random step inputs plus published n-gram proposals (some aligned after 0-2 accepted tokens, some stale), built
    on the CPU; ``publish(step, host)`` copies them into a step's buffers and returns the device inputs."""
    from sglang_hybrid.sglang_plugin import alignment

    g = torch.Generator().manual_seed(seed)
    pool = step.buffers.tokens.shape[0]
    pw = step.buffers.tokens.shape[1]
    r = step.buffers.ring.shape[1] - 1
    slots = torch.randperm(pool, generator=g)[:batch]
    cur_gen = torch.randint(1, 4, (batch,), generator=g)
    seq_lens = torch.randint(CONTEXT - 512, CONTEXT - 16, (batch,), generator=g)
    root = torch.randint(0, VOCAB, (batch,), generator=g)
    model_tokens = torch.randint(0, VOCAB, (batch, step.num_steps), generator=g)
    model_conf = torch.rand((batch, step.num_steps), generator=g) ** 0.3
    d = torch.randint(0, 3, (batch,), generator=g)                        # tokens accepted since the proposal
    tokens = torch.randint(0, VOCAB, (batch, pw), generator=g)
    tokens[:, 0] = torch.where(d == 0, torch.where(torch.rand(batch, generator=g) < 0.5, model_tokens[:, 0],
                                                   tokens[:, 0]), tokens[:, 0])
    prev = torch.randint(0, VOCAB, (batch,), generator=g)                 # committed token at seq_len - 1
    tokens[:, 0] = torch.where(d == 1, root, torch.where(d == 2, prev, tokens[:, 0]))
    tokens[:, 1] = torch.where(d == 2, root, tokens[:, 1])
    length = torch.randint(0, pw + 1, (batch,), generator=g)
    at = seq_lens + 1 - d
    gen = torch.where(torch.rand(batch, generator=g) < 0.85, cur_gen, cur_gen - 1)   # 15 % stale
    feats = [torch.randint(0, 40, (batch, pw), generator=g), torch.randint(1, 4, (batch, pw), generator=g),
             torch.randint(4, 8, (batch, pw), generator=g), torch.randint(0, 2, (batch, pw), generator=g)]
    # committed contexts for the device prompt lookup (a 64-token vocabulary: plenty of earlier matches)
    context = torch.randint(0, 64, (batch, CONTEXT), generator=g)
    host = dict(inputs=StepInputs(root, model_tokens, model_conf, slots, cur_gen, seq_lens),
                publish=(tokens, length, at, gen, *feats), prev=(slots, (seq_lens - 1) % r, prev),
                context=(slots.repeat_interleave(CONTEXT), torch.arange(CONTEXT).repeat(batch), context.flatten(),
                         slots, cur_gen))

    def publish(target_step):
        from sglang_hybrid.sglang_plugin import context_lookup

        dev = target_step.device
        alignment.publish(target_step.buffers, slots.to(dev), *[t.to(dev) for t in host["publish"]])
        s, col, val = (t.to(dev) for t in host["prev"])
        target_step.buffers.ring[s, col] = val
        if target_step.context is not None:
            context_lookup.write_context(target_step.context, *[t.to(dev) for t in host["context"]])
        return StepInputs(*[t.to(dev) for t in host["inputs"]])

    return host, publish


def run_step(step, x: StepInputs, seq_lens_sum: int, mask_buf: torch.Tensor):
    """What the worker runs per decode step before the verify forward (SGLang-free part). Returns a tuple."""
    from sglang_hybrid.sglang_plugin.tree_mask import full_mask, tree_links_torch, verify_nodes

    out = step.select(x.root, x.model_tokens, x.model_conf, x.slots, x.cur_gen, x.seq_lens)
    tree = out.tree if hasattr(out, "tree") else out          # newer HybridStep.select returns the Decision
    if getattr(step, "fused", None) is not None:              # the fused path: links and mask in one launch
        from sglang_hybrid.kernels import fused_links_and_mask

        return tuple(tree) + fused_links_and_mask(tree.tokens, tree.valid, tree.ancestors, x.seq_lens, seq_lens_sum,
                                                  mask_buf)
    draft_token, anc = verify_nodes(tree.tokens, tree.valid, tree.ancestors)
    positions, r_index, r_next, r_sib = tree_links_torch(anc, x.seq_lens)
    mask = full_mask(anc, x.seq_lens, seq_lens_sum, mask_buf)
    return tuple(tree) + (draft_token, positions, r_index, r_next, r_sib, mask)


NAMES = ("tokens", "parents", "ancestors", "depth", "valid", "source", "survival", "expected_accepted",
         "draft_token", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "custom_mask")


def compare(got, want, exact_floats: bool) -> list:
    """Names of the outputs that differ (integers/bools exact; floats exact or to 1e-5)."""
    bad = []
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = a.detach().cpu(), b.detach().cpu()
        name = NAMES[i] if i < len(NAMES) else f"out{i}"
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append(f"{name} shape/dtype {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        elif a.is_floating_point():
            if not (torch.equal(a, b) if exact_floats else torch.allclose(a, b, atol=1e-5, rtol=1e-5)):
                bad.append(f"{name} (max diff {float((a - b).abs().max()):.3g})")
        elif not torch.equal(a, b):
            rows = int((a != b).reshape(a.shape[0], -1).any(1).sum()) if a.dim() > 1 else int((a != b).sum())
            bad.append(f"{name} ({rows} rows/entries differ)")
    return bad


def _cost_for(cost_doc, batch: int):
    from sglang_hybrid.cost import CostModel

    if cost_doc and str(batch) in cost_doc.get("tables", {}):
        t = cost_doc["tables"][str(batch)]
        return CostModel(t["tokens"], t["seconds"]), "measured table"
    return CostModel.linear(0.006, 2e-6), "linear stand-in (no measured table)"


def _target_step_ms(cost_doc, batch: int, width: int):
    if not cost_doc or cost_doc.get("source", "").startswith("CPU smoke"):
        return None
    t = cost_doc.get("tables", {}).get(str(batch))
    if not t or width not in t.get("widths", []):
        return None
    return t["raw_seconds"][t["widths"].index(width)] * 1e3


def check_batch_gpu(batch: int, cost_doc, iters: int, log, config=DEPLOYED) -> dict:
    dev = torch.device("cuda")
    cost, cost_src = _cost_for(cost_doc, batch)
    settings, factory = make_step(dev, cost, *config)
    pool = max(2 * batch, 8)
    gpu_step, cpu_step = factory(pool), make_step("cpu", cost, *config)[1](pool)
    w = gpu_step.n_nodes + 1
    host, publish = make_inputs(cpu_step, batch, seed=batch)
    x_cpu, x_gpu = publish(cpu_step), publish(gpu_step)
    seq_lens_sum = batch * CONTEXT                                        # host int upper bound, as the worker's
    numel = seq_lens_sum * w + w * w * batch
    buf_cpu = torch.ones(numel, dtype=torch.bool)
    buf_gpu = torch.ones(numel, dtype=torch.bool, device=dev)
    rec = {"config": config_name(config), "batch": batch, "W": w, "n_nodes": gpu_step.n_nodes,
           "cost": cost_src}
    want = run_step(cpu_step, x_cpu, seq_lens_sum, buf_cpu)
    want = tuple(t.clone() for t in want)
    run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu)                     # one-time init (not sync-checked)
    torch.cuda.synchronize()
    with _env.no_host_sync():
        eager = run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu)
        eager = tuple(t.clone() for t in eager)
    rec["eager_no_sync"] = True
    graph, static = _env.capture(lambda: run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu))
    with _env.no_host_sync():
        graph.replay()
    torch.cuda.synchronize()
    rec["replay_no_sync"] = True
    rec["replay_vs_eager_cuda"] = compare(static, eager, exact_floats=True) or "equal"
    rec["replay_vs_eager_cpu"] = compare(static, want, exact_floats=False) or "equal"
    rec["valid_nodes_per_request"] = float(static[4].float().sum(1).mean())
    ms = _env.cuda_ms(graph.replay, iters)
    rec["graph_ms"] = _env.median(ms)
    rec["eager_ms"] = _env.median(_env.cuda_ms(lambda: run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu), 30))
    rec["eager_host_ms"] = host_ms(lambda: run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu))
    if batch == PROFILE_BATCH and config == DEPLOYED:
        rec["eager_host_profile"] = host_profile(lambda: run_step(gpu_step, x_gpu, seq_lens_sum, buf_gpu), log)
    target = _target_step_ms(cost_doc, batch, w)
    rec["target_step_ms"] = target
    rec["share"] = rec["graph_ms"] / target if target else None
    del graph
    return rec


def host_ms(fn, calls: int = 30, rounds: int = 5) -> float:
    """Host milliseconds one eager call takes to dispatch (wall clock over ``calls`` calls without a sync between
    them, median of ``rounds``): the host time the replay charges the worker's eager step, measured directly rather
    than through the device's timeline."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    torch.cuda.synchronize()
    return _env.median(times)


def host_profile(fn, log, calls: int = 30, top: int = 12) -> list:
    """Where the eager step's host time goes (``cProfile`` over ``calls`` calls, the ``top`` functions by own time):
    the eager step is host-bound (its CUDA-event time is ~10x the graph replay's), and this says whether Python
    around the launches or the launches themselves take it -- what capturing or trimming the step would buy."""
    import cProfile
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    out = [{"function": f"{fn_[0].split('/')[-1]}:{fn_[1]}({fn_[2]})", "own_us_per_step": round(v[2] / calls * 1e6, 1),
            "calls_per_step": round(v[1] / calls, 1)} for fn_, v in rows]
    log(f"  eager step host profile (B={PROFILE_BATCH}, deployed, {calls} calls): {total / calls * 1e6:.0f} us of "
        "Python per step (profiled: inflated by the profiler); by own time:")
    for r in out:
        log(f"    {r['own_us_per_step']:>8.1f} us  x{r['calls_per_step']:<5g} {r['function']}")
    return out


def check_batch_cpu(batch: int, log, config=DEPLOYED) -> dict:
    cost, cost_src = _cost_for(None, batch)
    _, factory = make_step("cpu", cost, *config)
    pool = max(2 * batch, 8)
    step_a, step_b = factory(pool), factory(pool)
    w = step_a.n_nodes + 1
    _, publish = make_inputs(step_a, batch, seed=batch)
    xa, xb = publish(step_a), publish(step_b)
    seq_lens_sum = batch * CONTEXT
    numel = seq_lens_sum * w + w * w * batch
    buf_a, buf_b = torch.ones(numel, dtype=torch.bool), torch.ones(numel, dtype=torch.bool)
    want = tuple(t.clone() for t in run_step(step_a, xa, seq_lens_sum, buf_a))
    t0 = time.perf_counter()
    compiled = torch.compile(lambda x: run_step(step_b, x, seq_lens_sum, buf_b), fullgraph=True, backend="eager")
    got = compiled(xb)
    trace_s = time.perf_counter() - t0
    return {"config": config_name(config), "batch": batch, "W": w, "n_nodes": step_a.n_nodes,
            "cost": cost_src,
            "fullgraph_trace": "ok (no graph break)", "compiled_vs_eager_cpu": compare(got, want, True) or "equal",
            "valid_nodes_per_request": float(want[4].float().sum(1).mean()), "trace_seconds": round(trace_s, 1)}


def run(cost_doc=None, log=print) -> dict:
    on_gpu = _env.gpu()
    results, failures = [], 0
    plan = [(DEPLOYED, b) for b in (GPU_BATCHES if on_gpu else CPU_BATCHES)]
    plan += [(c, b) for c in TUNED_CONFIGS for b in (TUNED_GPU_BATCHES if on_gpu else TUNED_CPU_BATCHES)]
    log(f"[selection] {MODE}; deployed steps {NUM_STEPS}, ngram k {NGRAM_K}: W = {NUM_STEPS + NGRAM_K + 1}, batches "
        f"{list(GPU_BATCHES if on_gpu else CPU_BATCHES)}; the replay's tuned "
        + ", ".join(config_name(c) for c in TUNED_CONFIGS)
        + f" at {list(TUNED_GPU_BATCHES if on_gpu else TUNED_CPU_BATCHES)}; "
        + ("GPU, CUDA graph" if on_gpu else "CPU mode: eager vs torch.compile(fullgraph) trace"))
    if on_gpu:
        log(f"  {'config':<7} {'B':>4} {'W':>3} {'graph ms':>9} {'eager ms':>9} {'host ms':>8} {'target ms':>10} "
            f"{'share':>7}  checks")
    for config, b in plan:
        name = config_name(config)
        try:
            rec = (check_batch_gpu(b, cost_doc, 50, log, config) if on_gpu else check_batch_cpu(b, log, config))
        except Exception as e:  # report every batch, then fail (_env.no_host_sync restored the sync mode)
            failures += 1
            rec = {"config": name, "batch": b, "error": _env.failure(e)}
            log(f"  {name} B={b}: FAILED {rec['error']}")
            results.append(rec)
            continue
        cmp_keys = [k for k in rec if k.endswith("_cpu") or k.endswith("_cuda")]
        bad = [f"{k}: {rec[k]}" for k in cmp_keys if rec[k] != "equal"]
        failures += bool(bad)
        checks = "no host sync; " if on_gpu else "fullgraph trace ok; "
        checks += "equal to eager" + (" CUDA and CPU" if on_gpu else " CPU") if not bad else "DIFFERS " + "; ".join(bad)
        if on_gpu:
            tgt = f"{rec['target_step_ms']:>10.3f}" if rec["target_step_ms"] else f"{'-':>10}"
            share = f"{100 * rec['share']:>6.2f}%" if rec["share"] else f"{'-':>7}"
            log(f"  {name:<7} {b:>4} {rec['W']:>3} {rec['graph_ms']:>9.4f} {rec['eager_ms']:>9.3f} "
                f"{rec['eager_host_ms']:>8.3f} {tgt} {share}  {checks}")
        else:
            log(f"  {name} B={b:<4} W={rec['W']} {rec['valid_nodes_per_request']:.1f} valid nodes/request; {checks}")
        results.append(rec)
    verdicts = []
    if on_gpu:
        for b in TARGET_BATCHES:
            rec = next((r for r in results if r["batch"] == b and r.get("config") == config_name(DEPLOYED)
                        and r.get("share") is not None), None)
            if rec is None:
                verdicts.append(f"target <= 5 % of the target step at B={b}: NOT MEASURED")
                continue
            ok = rec["share"] <= TARGET_SHARE
            verdicts.append(f"target <= 5 % of the target step at B={b}: {'MET' if ok else 'MISSED'} "
                            f"({100 * rec['share']:.2f} %: {rec['graph_ms']:.4f} ms vs {rec['target_step_ms']:.3f} ms)")
        for v in verdicts:
            log("  " + v)
    else:
        log("  (no latency, no 5 % verdict: nothing was measured on a GPU)")
    doc = {"on_gpu": on_gpu, "results": results, "verdicts": verdicts, "failures": failures}
    _env.write_json("selection.json", doc)
    return doc


def main(argv=None) -> int:
    import json

    cost_doc = None
    path = _env.out_dir() / "cost_tables.json"
    if path.is_file():
        cost_doc = json.loads(path.read_text())
    if not _env.gpu():
        torch.set_num_threads(1)
    return 1 if run(cost_doc)["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
