"""The replay's command line: ``python -m bench.replay --realistic`` (the headline run), ``--trace T.jsonl``,
``--synthetic`` or ``--make-trace FILE`` (the package docstring, `bench.replay`, lists the modules behind it)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

from bench.replay import policies as P
from bench.replay import realistic as RR
from bench.replay import costs as replay_costs, record as replay_record, synth as replay_synth, traces as replay_traces
from bench.replay import report as report
from bench.cost_tables import roofline
from bench.replay.drafts import DraftBank, DrafterUnavailable
from bench.replay.engine import COST_TABLES, RAGGED_SYNC_US, EngineConfig
from bench.replay.host import LaunchCost
from sglang_hybrid._checks import positive_or_none
from bench.replay.sim import RunResult, request_stream, simulate


def _eta_or_none(value: str):
    """``--model-bias-eta``: a learning rate > 0, or 'none' (the online offset off)."""
    try:
        return positive_or_none(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a learning rate > 0 or 'none', got {value!r}") from None


def _eta_auto_or_none(value: str):
    """``--ngram-bias-eta``: a learning rate > 0, 'none' (off) or 'auto' (the worker's default: on where verify runs
    ragged, off where padded)."""
    return "auto" if value.strip().lower() == "auto" else _eta_or_none(value)


def _alternatives(value: str) -> int:
    """EAGLE alternatives per chain position: 0 (none) up to the ranks the simulated drafter has measured rates for
    (``synth.RANK_HIT``: ranks 2 to 8)."""
    from bench.replay.synth import RANK_HIT

    try:
        x = int(value)
    except ValueError:
        x = -1
    if not 0 <= x <= len(RANK_HIT):
        raise argparse.ArgumentTypeError(f"must be an int from 0 to {len(RANK_HIT)} (the simulated drafter's ranks 2 "
                                         f"to {len(RANK_HIT) + 1}), got {value!r}")
    return x


def _positive_or_zero(value: str) -> float:
    """A cost in microseconds: a number >= 0."""
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x >= 0.0:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds >= 0, got {value!r}")
    return x


def _tree_shape(value: str) -> tuple:
    """``--eagle-trees``: one EAGLE tree as ``STEPS,TOPK,TOKENS`` (SGLang's three settings)."""
    try:
        steps, topk, tokens = (int(x) for x in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give an EAGLE tree as STEPS,TOPK,NUM_DRAFT_TOKENS, got {value!r}") from None
    if not (steps >= 1 and topk >= 2 and 2 <= tokens <= replay_synth.max_draft_tokens(steps, topk)):
        raise argparse.ArgumentTypeError(
            f"EAGLE tree {value!r}: need steps >= 1 (the simulated chains are drawn as deep), topk >= 2 and "
            "2 <= num_draft_tokens <= 1 + topk + (steps - 1) * topk^2")
    return steps, topk, tokens


#: the realistic replay's defaults (its command-line defaults are these, not copies of them)
_REALISTIC = RR.Config()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay",
                                 description="Replay speculation policies over per-position traces (the paper's "
                                             "HYBRID vs model-only adaptive table).")
    ap.add_argument("--trace", nargs="*", default=[], help="trace files (JSON Lines, docs/ARCHITECTURE.md)")
    ap.add_argument("--synthetic", action="store_true", help="use a generated synthetic trace (mechanics demo only)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(_REALISTIC.batches))
    ap.add_argument("--policies", nargs="+", default=list(P.ALL_POLICIES))
    ap.add_argument("--cost", nargs="+", default=["gpu", "cpu"],
                    help="'gpu' (roofline with a smooth knee and CUDA-graph buckets, simulated), 'gpu-hardmax' (the "
                         "hard-max knee), 'gpu-unpadded' (no bucket "
                         "padding), 'cpu' (measured SmolLM2 table) and/or cost JSON files")
    ap.add_argument("--cost-table", nargs="*", default=[], help="extra cost table files (yours, profiled on a GPU)")
    ap.add_argument("--gpu-context", type=int, default=roofline.Roofline.context_tokens,
                    help="context tokens per request of the GPU roofline's tables (the price's input); every step is "
                         "charged at its requests' real contexts")
    ap.add_argument("--launch-host-us", type=_positive_or_zero, default=LaunchCost.host_us,
                    help="host dispatch per kernel launch of an engine's own per-step work, microseconds "
                         "(bench.replay.host)")
    ap.add_argument("--launch-gpu-us", type=_positive_or_zero, default=LaunchCost.gpu_us,
                    help="GPU time per kernel launch of an engine's own per-step work, microseconds")
    ap.add_argument("--k", type=int, default=None, help="max draft length (default: the trace's eagle_k)")
    ap.add_argument("--eagle-k", type=int, default=4, help="EAGLE fixed-chain length")
    ap.add_argument("--merge-nodes", type=int, default=None, help="HYBRID merge node budget (default 2k)")
    ap.add_argument("--ngram-tree", action="store_true", help="HYBRID uses the n-gram tree instead of the chain")
    ap.add_argument("--model-calibration", default=None, help="ModelCalibration JSON (default: identity)")
    ap.add_argument("--ngram-calibration", default=None, help="NgramCalibration JSON (default: shipped)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lockstep-start", action="store_true",
                    help="start the first wave of every run at token 0 together, as earlier runs "
                         "did (default: at seeded uniform positions of their outputs, a server's steady state; "
                         "bench.replay.sim.start_positions)")
    ap.add_argument("--out", type=Path, default=Path("out/replay"))
    ap.add_argument("--make-trace", type=Path, default=None, metavar="FILE",
                    help="record a trace with SmolLM2 + the trained EAGLE head instead of replaying")
    ap.add_argument("--temperature", type=float, default=0.0, help="--make-trace: decode temperature")
    ap.add_argument("--n-code", type=int, default=8, help="--make-trace: code-editing prompts")
    ap.add_argument("--n-chat", type=int, default=8, help="--make-trace: chat prompts")
    ap.add_argument("--max-new", type=int, default=320, help="--make-trace: max new tokens per request")
    ap.add_argument("--head", default=None, help="--make-trace: EAGLE head folder (default: the shipped one)")
    ap.add_argument("--trace-alternatives", type=int, default=replay_record.ALTERNATIVES, metavar="M",
                    help="--make-trace: next-ranked EAGLE tokens recorded per chain position, 0 to 7 (default "
                         f"{replay_record.ALTERNATIVES}: any eagle_alternatives setting can then be replayed)")
    ap.add_argument("--record-real", type=Path, default=None, metavar="DIR",
                    help="record the real-drafter traces (SmolLM2 writes every output; tuning and evaluation from "
                         "different packages and conversations) in resumable parts under DIR, then assemble them "
                         "into bench/traces/ (bench/replay/record.py)")
    ap.add_argument("--parts", nargs="*", default=None, metavar="PREFIX",
                    help="--record-real: only the parts whose name starts with a PREFIX (e.g. chat-eval); no assembly")
    rg = ap.add_argument_group("realistic replay (--realistic: the headline run; bench/replay/realistic.py)")
    rg.add_argument("--realistic", action="store_true",
                    help="real-text workloads, SIMULATED model-drafter sweep, engine as built and --ideal side by side")
    rg.add_argument("--ideal", action="store_true",
                    help="--trace/--synthetic runs: the idealised engine (ragged verify, fresh n-gram proposals, no "
                         "host time) instead of the engine as built; --realistic always prints both side by side")
    rg.add_argument("--requests", type=int, default=_REALISTIC.requests, help="requests per workload (realistic)")
    rg.add_argument("--out-tokens", type=int, default=_REALISTIC.out_tokens,
                    help="output tokens per request (realistic)")
    rg.add_argument("--seeds", type=int, nargs="+", default=list(_REALISTIC.seeds),
                    help="seeds (realistic; the first tunes every choice, the others evaluate)")
    rg.add_argument("--width-lag", type=int, default=_REALISTIC.width_lag,
                    help="steps between choosing a width bucket (and EAGLE depth) and using it (2: GPU engine with "
                         "overlap scheduling, the default; 1: without overlap)")
    rg.add_argument("--ngram-lag", type=int, default=_REALISTIC.ngram_lag,
                    help="steps by which n-gram proposals are late (1: overlap scheduling, the default; 0: without)")
    rg.add_argument("--cost-tables", choices=list(COST_TABLES), default=_REALISTIC.cost_tables,
                    help="realistic: the as-built launch's cost tables: 'measured' (the default, the README's launch: "
                         "the verify table measured at start, widths = plain EAGLE's and the full tree, a fixed EAGLE "
                         "depth) or 'given' (both tables: every width bucket and adaptive drafting; does not start "
                         "on an H200 at batch 128, bench.memory_budget)")
    rg.add_argument("--fixed-depth", action="store_true",
                    help="HYBRID drafts every EAGLE step every step (no adaptive drafting: the worker without a draft "
                         "table, draft_depths = [])")
    rg.add_argument("--model-bias-eta", type=_eta_or_none, default=EngineConfig.model_bias_eta, metavar="ETA",
                    help="learning rate of HYBRID's online EAGLE offset (the worker's setting model_bias_eta; "
                         "default: as shipped, off)")
    rg.add_argument("--ngram-bias-eta", type=_eta_auto_or_none, default=EngineConfig.ngram_bias_eta, metavar="ETA",
                    help="learning rate of HYBRID's online n-gram offset (the worker's setting ngram_bias_eta), "
                         "'none' or 'auto'; default: as shipped, auto (learned where verify runs ragged, the ideal "
                         "engine's included, off where padded)")
    rg.add_argument("--ngram-logit-shift", type=float, default=0.0, metavar="X",
                    help="a what-if: move every cell of the n-gram calibration (--ngram-calibration, default the "
                         "shipped table) by X on the logit, as a stand-in for a table fit closer to the workload "
                         "(bench.replay.policies.shift_logit; default 0: the table as it is)")
    rg.add_argument("--ragged-sync-us", type=_positive_or_zero, default=RAGGED_SYNC_US, metavar="US",
                    help="realistic, the decomposition's ragged verify with a blocking read of the node counts: how "
                         "long the device idles per step (the read, measured on an H200, plus the host dispatch of "
                         "the launches that follow it, counted by bench.ragged_sync_ops: default "
                         f"{RAGGED_SYNC_US:g}; the decomposition also prints it at twice this)")
    rg.add_argument("--no-ragged-mode", action="store_true",
                    help="realistic: leave out HYBRID launched with ragged_verify=on (the mode 'as built, ragged' run "
                         "beside the README's launch on the headline point and the real trace)")
    rg.add_argument("--eagle-alternatives", type=_alternatives, default=3, metavar="M",
                    help="realistic: the worker's setting eagle_alternatives, run in the launch with "
                         "ragged_verify=on and the ideal engine, on the headline point and on the real trace where it "
                         "records them: the EAGLE side's next M most likely tokens at each chain position hung as "
                         "leaves (no draft forward beyond the chain's; default 3; 0 leaves those modes out)")
    rg.add_argument("--no-sweep", action="store_true", help="realistic: the headline point alpha=0.7/0.9 only")
    rg.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="realistic: processes the cells run in; --record-real: recording processes, one thread "
                         "each (default: this machine's usable cores; the results do not depend on it)")
    rg.add_argument("--hybrid-steps", type=int, nargs="*", default=list(_REALISTIC.hybrid_steps),
                    help="realistic: EAGLE step counts HYBRID is also run with besides the deployed 4, the best per "
                         "cell chosen on the first seed as the baselines' k is (none given: the deployed 4 only)")
    rg.add_argument("--hybrid-ngram-ks", type=int, nargs="*", default=list(_REALISTIC.hybrid_ngram_ks),
                    help="realistic: n-gram chain lengths (the worker's ngram_k) HYBRID is also run with besides the "
                         "deployed 8, with each EAGLE step count; the best per cell chosen on the first seed (none "
                         "given: the deployed 8 only)")
    rg.add_argument("--ngram-ks", type=int, nargs="+", default=list(_REALISTIC.ngram_ks),
                    help="realistic: chain lengths every model-free n-gram baseline is tuned over per cell")
    rg.add_argument("--eagle-trees", type=_tree_shape, nargs="*", default=list(_REALISTIC.eagle_trees),
                    metavar="STEPS,TOPK,TOKENS",
                    help="realistic: EAGLE trees (SGLang's --speculative-num-steps, --speculative-eagle-topk, "
                         "--speculative-num-draft-tokens) the model-only baseline is also tuned over, on the simulated "
                         "drafter (none given: chains only; default: "
                         + " ".join(",".join(map(str, t)) for t in _REALISTIC.eagle_trees) + ")")
    rg.add_argument("--real-traces", type=Path, default=RR.REAL_TRACES,
                    help="folder of the real-drafter traces (--record-real assembles them there; skipped with a note "
                         "when absent)")
    rg.add_argument("--measured-table", default=str(RR.MEASURED_TABLE),
                    help="realistic: a per-batch step-time table measured on a GPU (the device kit's cost_tables.json) "
                         "the headline contenders are rerun under; 'none' leaves it out")
    rg.add_argument("--plot", type=Path, default=None, help="realistic: ratio-vs-alpha plot (default docs/...png)")
    rg.add_argument("--results", default=None,
                    help="realistic: the results file the README's tables are rendered from, to write this run's "
                         "section into (the frozen evaluation: bench/results/realistic.json; default: none, the run "
                         "writes only under --out)")
    rg.add_argument("--miscalibration", action="store_true",
                    help="realistic: the miscalibration sweep instead of the headline run: the head's confidences "
                         "distorted at T in 0.5-2 and bursty acceptance, every headline cell "
                         "(bench/replay/calibration_sweep.py)")
    rg.add_argument("--sweep-ideal", action="store_true",
                    help="realistic: run the ideal engine at every sweep point too (default: headline point only)")
    args = ap.parse_args(argv)
    launch = LaunchCost(host_us=args.launch_host_us, gpu_us=args.launch_gpu_us)
    if args.realistic:
        if args.model_calibration is not None:
            ap.error("--model-calibration: the realistic replay prices the model side with the identity calibration "
                     "(its simulated drafter is calibrated by construction); leave it out")
        if any(not 1 <= k <= 32 for k in args.hybrid_ngram_ks):
            ap.error(f"--hybrid-ngram-ks {args.hybrid_ngram_ks}: each n-gram chain length must be in [1, 32] (the "
                     "worker's ngram_k range)")
        if any(k < 1 for k in args.ngram_ks):
            ap.error(f"--ngram-ks {args.ngram_ks}: each n-gram chain length must be at least 1")

        if args.jobs < 1:
            ap.error(f"--jobs {args.jobs}: give at least 1 process")
        batches = tuple(args.batches)
        cfg = RR.Config(jobs=args.jobs, requests=args.requests, out_tokens=args.out_tokens, seeds=tuple(args.seeds),
                        batches=batches, width_lag=args.width_lag, ngram_lag=args.ngram_lag,
                        lockstep_start=args.lockstep_start,
                        cost_tables=args.cost_tables,
                        adaptive_depth=not args.fixed_depth, hybrid_steps=tuple(args.hybrid_steps),
                        hybrid_ngram_ks=tuple(args.hybrid_ngram_ks), ngram_ks=tuple(args.ngram_ks),
                        eagle_trees=tuple(args.eagle_trees),
                        model_bias_eta=args.model_bias_eta, ngram_bias_eta=args.ngram_bias_eta,
                        gpu_context=args.gpu_context, real_traces=args.real_traces,
                        ngram_calibration=args.ngram_calibration, ngram_logit_shift=args.ngram_logit_shift,
                        launch=launch, ragged_sync_us=args.ragged_sync_us, ragged_mode=not args.no_ragged_mode,
                        eagle_alternatives=args.eagle_alternatives,
                        measured_table=None if args.measured_table == "none" else Path(args.measured_table),
                        sweep=not args.no_sweep, results=Path(args.results) if args.results else None,
                        out=args.out if args.out != Path("out/replay") else Path("out/replay_realistic"),
                        sweep_modes=RR.MODES if args.sweep_ideal else ("as built",),
                        **({"plot": args.plot} if args.plot else {}))
        if args.miscalibration:
            from bench.replay import calibration_sweep

            calibration_sweep.run(cfg)
            return 0
        return RR.run(cfg)
    if args.record_real:
        return replay_record.record_real(args.record_real, jobs=args.jobs, k=args.k or 8,
                                         alternatives=args.trace_alternatives, head_dir=args.head, only=args.parts)
    if args.make_trace:
        return replay_record.make_trace(args.make_trace, args.temperature, args.n_code, args.n_chat, args.max_new,
                                        args.k or 8, args.head, args.seed,
                                        alternatives=args.trace_alternatives)

    if not args.trace and not args.synthetic:
        ap.error("give --trace FILE... (from the reference loop) or --synthetic")
    t_start = time.perf_counter()
    by_t, trace_k, traces = replay_traces.load_workloads(args.trace, args.synthetic, args.seed)
    k = args.k or trace_k
    if k > trace_k or args.eagle_k > trace_k:
        ap.error(f"--k/--eagle-k cannot exceed the trace's eagle_k={trace_k}")
    merge_nodes = args.merge_nodes or 2 * k
    args.out.mkdir(parents=True, exist_ok=True)

    specs = [s.with_launch_cost(launch)
             for s in replay_costs.cost_specs(args.cost + args.cost_table, args.batches, args.gpu_context)]

    def core_factory():
        return P._Core(args.model_calibration, args.ngram_calibration, ngram_logit_shift=args.ngram_logit_shift)

    pols = P.build_policies(args.policies, k, args.eagle_k, merge_nodes, core_factory, args.ngram_tree)
    engine = None
    if not args.ideal and not args.ngram_tree:
        # the engine as built (bench/replay/engine.py): the core-decided policies run with padded width buckets,
        # the width lag, late n-gram proposals through the plugin's alignment and the measured host path
        from bench.replay.engine import EnginePolicy

        engine = EngineConfig(width_lag=args.width_lag, ngram_lag=args.ngram_lag, num_steps=k, ngram_k=k,
                              n_nodes=merge_nodes, adaptive_depth=not args.fixed_depth,
                              model_bias_eta=args.model_bias_eta, ngram_bias_eta=args.ngram_bias_eta)
        for i, pol in enumerate(pols):
            if pol.name in ("model_adaptive", "hybrid_choose", "hybrid_merge"):
                mode = "merge" if pol.name == "hybrid_merge" else "choose"
                pols[i] = EnginePolicy(pol.name, mode, k, getattr(pol, "n_nodes", k), pol.core, engine,
                                       ngram=pol.name != "model_adaptive", label=pol.label + " [as built]")
    print("# Hybrid Spark policy replay")
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}, seed {args.seed}, k={k}, EAGLE fixed k={args.eagle_k}, "
          f"merge node budget {merge_nodes}, n-gram {'tree' if args.ngram_tree else 'chain'} for HYBRID")
    print(f"engine: {engine.describe() if engine else 'ideal (ragged verify, fresh n-gram proposals; --ideal)'}")
    for t in traces:
        h = t.header
        print(f"trace: model {h.model}, draft {h.draft_model}, T={t.temperature:g}, "
              f"eagle_k={t.eagle_k}, {len(t.requests)} requests, created {h.created}"
              + ("  [SYNTHETIC: mechanics only, not a result]" if args.synthetic else ""))
    core = next((p.core for p in pols if hasattr(p, "core")), None)
    if core is not None:
        print(f"calibration: n-gram {core.ngram_cal_name}, model {core.model_cal_name}")
    for s in specs:
        print(f"\ncost model {s.name} ({s.kind}):")
        for a in s.assumptions:
            print(f"  - {a}")

    results: dict = {}
    temps = sorted(by_t)
    workloads_seen = []
    for temp in temps:
        reqs = by_t[temp]
        bank = DraftBank(reqs, k, progress=True, ngram_width=engine.proposal_width if engine else 0)
        groups = {}
        for w in ("code", "chat"):
            idx = [i for i, r in enumerate(reqs) if r.workload == w]
            if idx:
                groups[w] = idx
        others = sorted({r.workload for r in reqs} - {"code", "chat"})
        for w in others:
            groups[w] = [i for i, r in enumerate(reqs) if r.workload == w]
        if len(groups) > 1:
            groups["mixed"] = list(range(len(reqs)))
        for w in groups:
            if w not in workloads_seen:
                workloads_seen.append(w)
        for spec in specs:
            for w, idx in groups.items():
                for b in args.batches:
                    try:
                        cost = spec.for_batch(b)
                    except ValueError as e:
                        print(f"\n## {spec.name} | {w} | batch {b}: skipped ({e})")
                        continue
                    cell = []
                    for pol in pols:
                        try:
                            r = simulate(pol, bank, idx, b, cost, seed=args.seed * 1000 + b, workload=w,
                                         cost_name=spec.name, lockstep_start=args.lockstep_start)
                        except DrafterUnavailable as e:
                            if (pol.name, "warned") not in results:
                                print(f"  [skip] {pol.name}: {e}")
                                results[(pol.name, "warned")] = True
                            continue
                        results[(spec.name, w, temp, b, pol.name)] = r
                        cell.append(r)
                    print(f"\n## {spec.name} | {w} | T={temp:g} | batch {b} | {cell[0].requests_done if cell else 0}"
                          f" requests finished (no-spec run), stream of {len(request_stream(idx, b, 0))}")
                    print(report.fmt_table(cell))
    results = {k_: v for k_, v in results.items() if isinstance(v, RunResult)}

    verdicts = []
    print()
    for spec in specs:
        text, v = report.paper_layout(results, spec.name, temps, args.batches)
        print(text)
        verdicts += v if spec.kind != "measured" else []
        mc = report.merge_vs_choose(results, spec.name)
        if mc and spec.kind != "measured":
            verdicts.append(mc)
        if spec.kind == "measured":
            verdicts += report.hybrid_ahead(results, spec.name, temps, args.batches, args.policies)
        print()
    print("Targets:")
    for name, ok, detail in verdicts:
        print(f"  [{'MET' if ok else 'MISSED'}] {name}: {detail}")
    if args.synthetic:
        print("  (synthetic trace: these verdicts only exercise the mechanics)")

    pngs = []
    for spec in specs:
        for temp in temps:
            pth = report.plot(results, args.out / f"replay_{spec.name}_T{temp:g}.png", spec.name, workloads_seen,
                              [temp], args.batches, args.policies)
            if pth:
                pngs.append(str(pth))
    dump = [dict(dataclasses.asdict(r), temperature=key[2], tok_per_s=r.tok_per_s,
                 accepted_per_step=r.accepted_per_step, tokens_per_step=r.tokens_per_step)
            for key, r in results.items()]
    (args.out / "replay_results.json").write_text(json.dumps({"args": {k_: str(v) for k_, v in vars(args).items()},
                                                              "results": dump,
                                                              "verdicts": verdicts}, indent=1))
    print(f"\nwrote {args.out / 'replay_results.json'}" + (f", plots: {', '.join(pngs)}" if pngs else ""))
    print(f"replay wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
