"""Policy replay: the paper's throughput table, reproduced from per-position traces under a cost model.

Why replay instead of running engines: a trace recorded once by the CPU reference loop (target outputs + the EAGLE
chain drafted at every output position) determines what any policy would have accepted, because greedy decoding is
lossless -- the committed text is the same whatever was drafted -- and both drafters are deterministic functions of
the committed tokens. So we can simulate every policy at batch 4, 32 and 128 under any step-time model (measured on
this CPU, or GPU-shaped from a stated roofline) in seconds, with exactly the same requests and seeds.

The modules, one job each:
  bench.replay.cli        the command line (``python -m bench.replay``)
  bench.replay.traces     traces as arrays (read/written by sglang_hybrid.reference.trace), synthetic traces, workloads
  bench.replay.record     recording a real trace (--make-trace)
  bench.replay.drafts     the draft bank: every drafter's proposal at every output position
  bench.replay.costs      step-time models (GPU roofline, measured CPU table, your cost files)
  bench.replay.host       what each engine's own per-step work costs: host paths and kernel launches
  bench.replay.sim        the continuous-batching simulation (the replay rule) and its result
  bench.replay.report     tables, the paper's layout, targets met or missed, plots
  bench.replay.policies   the policies compared
  bench.replay.engine     the engine mechanics: as built (width buckets + lag, late n-gram proposals through the
                          plugin's alignment, measured host path, the decision's launches) or ideal (ragged, fresh)
  bench.replay.synth      the SIMULATED model drafter (chains and EAGLE trees) and the real-text workloads
  bench.replay.eagle_ranks  the real EAGLE head's rank-r hit rates the simulated trees use (measured, by hand)
  bench.replay.realistic  the headline run (--realistic): sweep, tuned baselines, oracle, bootstrap CIs, targets

Run: ``python -m bench.replay --realistic`` (the headline); ``python -m bench.replay --trace T.jsonl [...]`` (see
--help; engine as built unless --ideal); ``--synthetic`` runs on generated traces.
"""
