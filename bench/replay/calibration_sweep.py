"""The realistic replay's miscalibration sweep (``python -m bench.replay --realistic --miscalibration``).

Why a sweep of its own: the headline run's simulated head is honest by construction, so it cannot show what a
deployment with an over- or under-confident head, or with acceptance that comes in runs, gets from HYBRID. This mode
reruns the headline point (SIM alpha=0.7, copy 0.9) with the head's confidences distorted at each temperature of
`miscalibration.TEMPERATURES` and with bursty acceptance (`miscalibration`), and the real drafters' recorded
probabilities distorted at the same temperatures, every headline cell, HYBRID as the README launches it against
baselines retuned at every point. It prints HYBRID / best single drafter per cell, the model side's ECE per point
where the engine records calibration bins (``stats["model_calibration"]``; "not recorded", and that target MISSED,
where it does not), and the targets MET/MISSED. Its own time budget: 20 minutes.
"""
from __future__ import annotations

import dataclasses
import time

from bench.replay import miscalibration as MC
from bench.replay import realistic as RR
from bench.replay import synth

#: the sweep's HYBRID engine: the README's launch
MODE = "as built"


def sim_sources() -> list:
    """The simulated head's miscalibrated variants of the headline point: each temperature, then bursty."""
    return [(*RR.HEADLINE, f"T{t:g}") for t in MC.TEMPERATURES] + [(*RR.HEADLINE, "bursty")]


def real_sources() -> list:
    return [("real", f"T{t:g}") for t in MC.TEMPERATURES]


def _temperature(source) -> float:
    tag = source[-1]
    return 1.0 if tag == "bursty" else float(tag[1:])


def pooled_ece(runner, source, cells) -> tuple:
    """(ECE, tested tokens) of HYBRID's model side over the cells' evaluation runs: the runs' calibration bins
    (``stats["model_calibration"]``: per bin the summed acceptance and hits, and the tokens) pooled in one
    ``OutcomeBins``. (None, 0) when nothing was recorded."""
    from sglang_hybrid.online_calibration import OutcomeBins

    pooled = None
    for w, b in cells:
        for r in runner.seeds_of((source, MODE, w, b, "hybrid_merge"), RR.evaluation_seeds(runner.cfg.seeds)):
            got = r.stats.get("model_calibration")
            if got is None or not got["count"]:
                continue
            pooled = pooled or OutcomeBins(len(got["pred"]))
            pooled.merge(got["pred"], got["label"], got["count"])
    if pooled is None:
        return None, 0
    return pooled.ece, pooled.count


def run(cfg: RR.Config, log=print) -> list:
    """Run the sweep; returns its verdicts (name, met, detail), also printed."""
    t_start = time.perf_counter()
    cfg = dataclasses.replace(cfg, ragged_mode=False, eagle_alternatives=0, decompose=False, sweep=False)
    runner = RR.Runner(cfg)
    # the temperatures of one head report other probabilities for the same tokens: what reads none runs once
    runner.token_twins.update({src: (*RR.HEADLINE, "T1") for src in sim_sources() if src[-1] != "bursty"})
    runner.token_twins.update({src: ("real", "T1") for src in real_sources()})
    log("# Miscalibrated heads (python -m bench.replay --realistic --miscalibration)")
    log(f"headline point {RR.label(RR.HEADLINE)}: the head's confidences distorted at T in "
        f"{list(MC.TEMPERATURES)} (the engine sees sigmoid(logit(c) / T) of the true c) and bursty acceptance "
        f"(rho={MC.BURST_RHO}, persistence {MC.BURST_PERSISTENCE}); the real drafters' recorded probabilities "
        "distorted alike. HYBRID as built (the README's launch) with "
        f"{runner.engines[MODE].describe()}; baselines retuned at every point on the tuning seed")
    banks, groups = RR.text_banks(runner, cfg)
    flags = {s: synth.copy_flags(banks[s]) for s in cfg.seeds}
    cells = [(w, b) for w in RR.WORKLOADS if w in groups[cfg.seeds[0]] for b in cfg.batches]
    sources = []
    for src in sim_sources():
        burst = MC.BURST_RHO if src[-1] == "bursty" else 0.0
        eb = {}
        for s in cfg.seeds:
            toks, probs = synth.simulated_eagle(banks[s], flags[s], src[0], src[1], RR.simulated_depth(cfg), s,
                                                 burst=burst)
            trees = synth.SimulatedEagleTrees(banks[s], flags[s], src[0], src[1], toks, probs, s)
            eb[s] = MC.distorted(synth.with_eagle(banks[s], toks, probs, trees), _temperature(src))
        runner.run_source(src, eb, groups, cells, list(cfg.seeds), (MODE,), log)
        sources.append(src)
        log(f"[{time.perf_counter() - t_start:.0f} s] {RR.label(src)} done")
    real_cells = []
    if cfg.real_traces is not None:
        from bench.replay import traces as replay_traces

        try:
            tune, evals, _ = replay_traces.read_real_traces(cfg.real_traces)
        except FileNotFoundError as e:
            log(f"real-drafter rows: NOT RUN: {e}")
        else:
            for src in real_sources():
                rb, rg = RR.real_banks(runner, cfg, tune, evals, _temperature(src))
                real_cells = [(w, b) for w in RR.WORKLOADS if w in rg[cfg.seeds[0]] for b in cfg.batches]
                runner.run_source(src, rb, rg, real_cells, list(cfg.seeds), (MODE,), log)
                sources.append(src)
                log(f"[{time.perf_counter() - t_start:.0f} s] {RR.label(src)} done")
    log("")
    log("HYBRID as built / best single drafter [95% CI] per cell; model side's ECE over the tested chain tokens after "
        "each run's first verified steps (its calibration as HYBRID priced it, the online correction applied):")
    verdicts = []
    worst_ece = []
    for src in sources:
        these = real_cells if src[0] == "real" else cells
        got = [(c, w, b) for w, b in these if (c := runner.cell(src, MODE, w, b)) is not None]
        ece, n = pooled_ece(runner, src, these)
        log(f"  {RR.label(src)}: " + "; ".join(f"{w} B={b} {RR.fmt_ci(c['vs_single'])}" for c, w, b in got)
            + (f"; ECE {ece:.3f} over {n} tokens" if ece is not None else "; ECE not recorded"))
        if got:
            low = min(got, key=lambda cwb: cwb[0]["vs_single"][0])
            bad = [g for g in got if g[0]["vs_single"][0] < 0.97]
            verdicts.append((f"miscalibrated head: HYBRID >= 0.97x the best single drafter in every cell, "
                             f"{RR.label(src)}", not bad,
                             f"worst {RR.fmt_ci(low[0]['vs_single'])} vs {low[0]['single_name']} at {low[1]} "
                             f"B={low[2]}; {len(bad)} of {len(got)} cells below 0.97"
                             + RR.ci_note(low[0]["vs_single"], 0.97)))
        worst_ece.append((ece, src, n))
    rec = [(e, s, n) for e, s, n in worst_ece if e is not None]
    if rec:
        e, s, n = max(rec, key=lambda esn: esn[0])
        verdicts.append(("miscalibrated head: the model side's ECE <= 0.05 after 2,000 verified steps, every point",
                         all(x <= 0.05 for x, _, _ in rec), f"worst {e:.3f} at {RR.label(s)} ({n} tokens)"))
    else:
        verdicts.append(("miscalibrated head: the model side's ECE <= 0.05 after 2,000 verified steps, every point",
                         False, "not recorded: the engine kept no calibration bins"))
    wall = time.perf_counter() - t_start
    verdicts.append(("the miscalibration sweep takes <= 20 minutes on this machine", wall <= 20 * 60,
                     f"{wall / 60:.1f} min"))
    log("")
    log("Targets:")
    for name, ok, detail in verdicts:
        log(f"  [{'MET' if ok else 'MISSED'}] {name}: {detail}")
    section = RR.results_section(runner, cfg, "python -m bench.replay --realistic --miscalibration", wall, verdicts)
    section["ece"] = {RR.label(src): [e, n] for e, src, n in worst_ece}
    if cfg.results is not None:
        from bench.replay import results as replay_results

        path = replay_results.write_section("miscalibration", section, cfg.results)
        log(f"wrote the miscalibration section of {path}")
    return verdicts
