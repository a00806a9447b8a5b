"""Drafter benchmark: our suffix-automaton n-gram drafter beside vLLM ngram, Arctic suffix decoding and SGLang's
n-gram corpus, in one run, on real code edits and real chat (see bench/data.py), with the targets of issues 2 and 15
(``ours[resp-only]`` is our drafter without prompt donation, for the with/without comparison).

Why one run: acceptance depends on the text and cost on the machine, so the only honest comparison is the same
requests, the same tokenizer and the same CPU at the same time; every target is a ratio between numbers printed here.

What is measured (``python -m bench.drafters --help`` for the knobs; ``--quick`` is a smoke run):

* **acceptance**: each request is replayed token by token. At each step the drafter proposes given prompt + output
  so far; ``accepted`` = the longest draft prefix equal to the true continuation (chains, k = 1..8) or the deepest
  root path of the draft tree that matches it (trees of 8 nodes); the replay then advances by ``accepted + 1`` (the
  bonus token) and gives the drafter exactly those tokens. Reported: mean accepted draft tokens per step. Each
  (drafter, k) pair starts from a fresh drafter and sees the requests in the same order, so shared corpora (ours,
  Arctic's global tree, SGLang's trie) only ever hold earlier requests' outputs.
* **latency**: one request whose context is a prefix of a long real-text stream (1k / 8k / 32k tokens, and up to 1M
  for ours); per step: propose k=8 (``propose``), then append the accepted + 1 true tokens (``update``); median and
  means over ``--steps`` steps after a warm-up, best of 3 rounds (the machine is shared).
* **batch**: 128 requests with 32k-token contexts (different windows of the stream); one step = each engine's own
  batched path (ours: one ``extend_batch`` + one ``propose``; vLLM: one ``NgramProposer.propose``; Arctic: vLLM's
  Python loop; SGLang: ``batch_put`` + ``batch_get``).
* **build**: time to register a 32k-token prompt (median of 3, fresh drafter each time).
* **memory**: bytes per context token, each drafter in a fresh subprocess holding one request of ``--mem-tokens``
  tokens: ours by ``memory_bytes()`` (and RSS delta), Arctic and SGLang by RSS delta (/proc/self/statm) around
  building it; vLLM holds nothing but the engine's int32 token buffer. ``ours-corpus``: our shared corpus filled to
  the default cap with donated prompts + responses, bytes per held token.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bench import anchors, data

# --------------------------------------------------------------------------------------------------------------------
# Metric: what greedy verification would accept
# --------------------------------------------------------------------------------------------------------------------


def accepted_chain(draft: np.ndarray, truth: np.ndarray) -> int:
    """Length of the longest prefix of ``draft`` equal to ``truth`` (the true continuation)."""
    n = min(len(draft), len(truth))
    if n == 0:
        return 0
    neq = np.flatnonzero(np.asarray(draft[:n]) != np.asarray(truth[:n]))
    return int(neq[0]) if len(neq) else n


def accepted_tree(tokens: np.ndarray, parents: np.ndarray, truth: np.ndarray) -> int:
    """Depth of the deepest root path of the tree equal to ``truth``'s prefix (greedy tree verification).

    ``parents[i] < i``, ``-1`` = child of the last committed token. Sibling tokens are assumed distinct (as in
    every drafter here); if not, the first matching sibling is followed."""
    cur = -1
    depth = 0
    n = len(tokens)
    while depth < len(truth):
        want = truth[depth]
        nxt = -1
        for i in range(n):
            if parents[i] == cur and tokens[i] == want:
                nxt = i
                break
        if nxt < 0:
            break
        cur = nxt
        depth += 1
    return depth


class ReplayStats:
    """Accumulates accepted tokens and steps; ``mean`` = accepted draft tokens per step."""

    def __init__(self):
        self.accepted = 0
        self.steps = 0
        self.tokens = 0

    def add(self, acc: int, emitted: int):
        self.accepted += acc
        self.steps += 1
        self.tokens += emitted

    @property
    def mean(self) -> float:
        return self.accepted / self.steps if self.steps else float("nan")


def replay(adapter: anchors.DrafterAdapter, requests: Sequence[data.Request], width: int, tree: bool,
           rid0: int = 0, trace: Optional[list] = None) -> ReplayStats:
    """Replays ``requests`` in order through ``adapter`` (chain of ``width`` tokens, or tree of ``width`` nodes).

    Every step: draft, score against the true continuation, emit ``min(accepted + 1, remaining)`` tokens, give the
    drafter exactly those. With ``trace`` a list, (position, draft, accepted) of every step is appended to it."""
    st = ReplayStats()
    for i, req in enumerate(requests):
        rid = rid0 + i
        adapter.start(rid, req.prompt)
        out = req.output
        pos = 0
        while pos < len(out):
            truth = out[pos : pos + width]
            if tree:
                toks, parents = adapter.propose_tree(rid, width)
                acc = accepted_tree(toks, parents, truth)
                draft = (toks, parents)
            else:
                draft = adapter.propose(rid, width)[:width]
                acc = accepted_chain(draft, truth)
            emitted = min(acc + 1, len(out) - pos)
            if trace is not None:
                trace.append((pos, draft, acc))
            adapter.extend(rid, out[pos : pos + emitted])
            st.add(acc, emitted)
            pos += emitted
        adapter.finish(rid)
    return st


# --------------------------------------------------------------------------------------------------------------------
# Drafter configurations under test
# --------------------------------------------------------------------------------------------------------------------


OURS_RESP_ONLY = "ours[resp-only]"
"""Our drafter with ``donate_prompts=False``: only responses enter the shared corpus (the pre-issue-15 default)."""


def _is_ours(name: str) -> bool:
    return name == "ours" or name.startswith("ours[")


def chain_factories(available: Sequence[str], width: int, max_len: int, sglang: bool = True) -> Dict[str, Callable]:
    """name -> zero-argument constructor of a fresh drafter drafting chains of ``width`` tokens (SGLang only when
    ``sglang``: its Python API costs ~0.5-1 ms per step, so by default it is replayed at k=8 only)."""
    f: Dict[str, Callable] = {}
    if "ours" in available:
        f["ours"] = lambda: anchors.OursAdapter(max_draft=max(8, width))
        # The same drafter donating only responses (the baseline for prompt donation).
        f[OURS_RESP_ONLY] = lambda: anchors.OursAdapter(max_draft=max(8, width), donate_prompts=False)
    if "vllm-ngram" in available:
        f["vllm-ngram"] = lambda: anchors.VllmNgramAdapter(k=width, max_model_len=max_len)
        f["vllm-ngram[2,5]"] = lambda: anchors.VllmNgramAdapter(k=width, min_n=2, max_n=5, max_model_len=max_len)
    if "arctic" in available:
        f["arctic"] = lambda: anchors.ArcticAdapter()
    if "sglang" in available and sglang:
        f["sglang"] = lambda: anchors.SglangAdapter(width=width, insert_prompt=False, breadth=1, name="sglang")
        f["sglang+prompt"] = lambda: anchors.SglangAdapter(width=width, insert_prompt=True, breadth=1,
                                                           name="sglang+prompt")
    return f


def tree_factories(available: Sequence[str], nodes: int) -> Dict[str, Callable]:
    f: Dict[str, Callable] = {}
    if "ours" in available:
        f["ours"] = lambda: anchors.OursAdapter(max_nodes=max(64, nodes))
        f[OURS_RESP_ONLY] = lambda: anchors.OursAdapter(max_nodes=max(64, nodes), donate_prompts=False)
    if "arctic" in available:
        f["arctic"] = lambda: anchors.ArcticAdapter()
    if "sglang" in available:
        f["sglang"] = lambda: anchors.SglangAdapter(width=nodes, insert_prompt=False, name="sglang")
        f["sglang+prompt"] = lambda: anchors.SglangAdapter(width=nodes, insert_prompt=True, name="sglang+prompt")
    return f


def cost_factories(available: Sequence[str], max_len: int, batch: int = 1) -> Dict[str, Callable]:
    """Drafters as configured for the cost measurements (k = 8 chains; SGLang as its worker runs: BFS, 8 nodes)."""
    f: Dict[str, Callable] = {}
    if "ours" in available:
        f["ours"] = lambda: anchors.OursAdapter()
    if "vllm-ngram" in available:
        f["vllm-ngram"] = lambda: anchors.VllmNgramAdapter(k=8, max_model_len=max_len, max_num_seqs=batch)
    if "arctic" in available:
        f["arctic"] = lambda: anchors.ArcticAdapter()
    if "sglang" in available:
        # Per request the worker inserts only the last 18 tokens each step; with insert_prompt=True the prompt is
        # inserted too (the only way it can copy from the prompt), which is what the single-request numbers use.
        f["sglang+prompt" if batch == 1 else "sglang"] = (
            lambda: anchors.SglangAdapter(width=8, insert_prompt=(batch == 1), name=None))
    return f


# --------------------------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------------------------


def measure_acceptance(available, workloads: Dict[str, List[data.Request]], ks: Sequence[int], tree_nodes: int,
                       log, sglang_ks: Optional[Sequence[int]] = None) -> Dict:
    """{workload: {drafter: {"k1": mean, ..., "tree8": mean}}} for every working drafter."""
    res: Dict[str, Dict[str, Dict[str, float]]] = {}
    for wname, reqs in workloads.items():
        max_len = max(len(r.prompt) + len(r.output) for r in reqs) + 64
        table: Dict[str, Dict[str, float]] = {}
        for k in ks:
            with_sglang = sglang_ks is None or k in sglang_ks
            for name, make in chain_factories(available, k, max_len, sglang=with_sglang).items():
                t0 = time.perf_counter()
                st = replay(make(), reqs, k, tree=False)
                table.setdefault(name, {})[f"k{k}"] = st.mean
                log(f"  {wname:5s} k={k} {name:16s} {st.mean:6.3f} accepted/step  ({st.steps} steps, "
                    f"{time.perf_counter() - t0:5.1f}s)")
        if tree_nodes:
            for name, make in tree_factories(available, tree_nodes).items():
                t0 = time.perf_counter()
                st = replay(make(), reqs, tree_nodes, tree=True)
                table.setdefault(name, {})[f"tree{tree_nodes}"] = st.mean
                log(f"  {wname:5s} tree{tree_nodes} {name:16s} {st.mean:6.3f} accepted/step  ({st.steps} steps, "
                    f"{time.perf_counter() - t0:5.1f}s)")
        res[wname] = table
    return res


def _step_times(adapter, stream: np.ndarray, ctx: int, steps: int, warmup: int = 10,
                k: int = 8) -> Dict[str, float]:
    """Per-step cost for one request at context ``ctx``: means of propose and update, mean and median of their sum
    (the median is what the targets use: this machine is shared, and a preempted step says nothing about a drafter)."""
    adapter.start(0, stream[:ctx])
    pos = ctx
    tp = tu = 0.0
    tot = []
    pc = time.perf_counter
    for s in range(warmup + steps):
        t0 = pc()
        draft = adapter.propose(0, k)
        t1 = pc()
        acc = accepted_chain(draft, stream[pos : pos + k])
        new = stream[pos : pos + acc + 1]
        t2 = pc()
        adapter.extend(0, new)
        t3 = pc()
        pos += len(new)
        if s >= warmup:
            tp += t1 - t0
            tu += t3 - t2
            tot.append((t1 - t0) + (t3 - t2))
    adapter.finish(0)
    return {"propose_us": tp / steps * 1e6, "update_us": tu / steps * 1e6, "mean_us": statistics.mean(tot) * 1e6,
            "step_us": statistics.median(tot) * 1e6}


def measure_latency(available, stream: np.ndarray, contexts: Sequence[int], flat_contexts: Sequence[int],
                    steps: int, log, rounds: int = 3) -> Dict:
    """{drafter: {ctx: {"propose_us", "update_us", "mean_us", "step_us" (median)}}}; ours also at ``flat_contexts``.

    Each point is measured in ``rounds`` interleaved rounds (fresh drafter each) and the round with the lowest median
    is kept: on a shared machine, interference only ever adds time."""
    res: Dict[str, Dict[int, Dict[str, float]]] = {}
    need = max(list(contexts) + list(flat_contexts)) + (steps + 20) * 9 + 16
    if len(stream) < need:
        raise ValueError(f"stream of {len(stream)} tokens too short for latency runs needing {need}")
    for rnd in range(rounds):
        for ctx in sorted(set(contexts) | set(flat_contexts)):
            facs = cost_factories(available, max_len=ctx + (steps + 20) * 9 + 16)
            for name, make in facs.items():
                if ctx not in contexts and name != "ours":
                    continue
                r = _step_times(make(), stream, ctx, steps)
                best = res.setdefault(name, {}).get(ctx)
                if best is None or r["step_us"] < best["step_us"]:
                    res[name][ctx] = r
                log(f"  latency round {rnd} ctx={ctx:>8d} {name:16s} propose {r['propose_us']:8.1f} us  update "
                    f"{r['update_us']:8.1f} us  step median {r['step_us']:8.1f} us")
    return res


def measure_batch(available, stream: np.ndarray, batch: int, ctx: int, steps: int, log,
                  only: Optional[Sequence[str]] = None) -> Dict:
    """{drafter: ms per batched step} for ``batch`` requests of ``ctx`` tokens (distinct windows of ``stream``)."""
    res = {}
    span = len(stream) - ctx - (steps + 4) * 9
    if span <= 0:
        raise ValueError("stream too short for the batch measurement")
    offsets = [(i * 7919) % span for i in range(batch)]
    for name, make in cost_factories(available, max_len=ctx + (steps + 4) * 9 + 16, batch=batch).items():
        if only and name not in only:
            continue
        a = make()
        t0 = time.perf_counter()
        for i, off in enumerate(offsets):
            a.start(i, stream[off : off + ctx])
        build = time.perf_counter() - t0
        pos = [off + ctx for off in offsets]
        rids = list(range(batch))
        new = [stream[p : p + 1] for p in pos]
        for i in range(batch):
            pos[i] += 1
        times = []
        for s in range(steps + 3):
            t0 = time.perf_counter()
            drafts = a.batch_step(rids, new, 8)
            dt = time.perf_counter() - t0
            if s >= 3:
                times.append(dt)
            new = []
            for i in range(batch):
                acc = accepted_chain(drafts[i][:8], stream[pos[i] : pos[i] + 8])
                new.append(stream[pos[i] : pos[i] + acc + 1])
                pos[i] += acc + 1
        res[name] = {"step_ms": 1e3 * statistics.mean(times), "median_ms": 1e3 * statistics.median(times),
                     "setup_s": build}
        log(f"  batch {batch}x{ctx} {name:16s} {res[name]['step_ms']:8.3f} ms/step (median "
            f"{res[name]['median_ms']:.3f}; setup {build:.1f}s)")
        del a
    return res


def measure_build(available, stream: np.ndarray, ctx: int, log, reps: int = 3) -> Dict:
    res = {}
    for name, make in cost_factories(available, max_len=ctx + 64).items():
        ts = []
        for _ in range(reps):
            a = make()
            t0 = time.perf_counter()
            a.start(0, stream[:ctx])
            ts.append(time.perf_counter() - t0)
            del a
        res[name] = {"build_ms": 1e3 * statistics.median(ts)}
        log(f"  build {ctx} tokens {name:16s} {res[name]['build_ms']:8.2f} ms")
    return res


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _heap_in_use() -> Optional[int]:
    """Bytes currently allocated through malloc (glibc ``mallinfo2``: in-use chunks + mmapped chunks), or None.

    Why not RSS alone: freed memory stays in the allocator and is reused without growing RSS, so an RSS delta can
    under-count; and C++/Rust heaps are invisible to tracemalloc. mallinfo2 counts every live malloc'd byte of C, C++,
    Rust (system allocator) and numpy, which is what a drafter holds."""
    import ctypes

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        f = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _MallInfo2
    m = f()
    return int(m.uordblks + m.hblkhd)


def memory_probe(name: str, n: int, seed: int) -> Dict:
    """Runs in a fresh process: bytes held per context token by one request of ``n`` tokens.

    Only the engine's own call is inside the measured window (the token list SGLang needs is built before it, our
    harness's context copy for Arctic is not made)."""
    stream = data.long_context_stream(n, seed=seed)
    warm = stream[:64]
    if name == "ours":
        from sglang_hybrid.ngram import NgramDrafter

        NgramDrafter().start(0, warm)
        d = NgramDrafter()
        def build():
            d.start(0, stream)

        def selfbytes():
            return d.memory_bytes()
    elif name == "ours-corpus":
        # The shared corpus filled to the default cap with donated requests (prompt + response, donate_prompts on):
        # n is ignored, the stream is as long as the cap (distinct text, so the automaton is not flattered).
        from sglang_hybrid.ngram import NgramDrafter

        NgramDrafter().start(0, warm)
        d = NgramDrafter()
        cap = d._core.config["corpus_cap_tokens"]
        doc, prompt = 4096, 3072
        stream = data.long_context_stream(cap + 4 * doc, seed=seed)

        def donate(drafter, i):
            off = i * doc
            drafter.start(i, stream[off : off + prompt])
            drafter.extend(i, stream[off + prompt : off + doc])
            drafter.finish(i, donate=True)
            drafter.remove(i)

        # Dry run: how many documents fill both generations (the most the corpus ever holds: one more would drop
        # the old generation).
        dry, fill, most = NgramDrafter(), 0, 0
        for i in range(len(stream) // doc):
            donate(dry, i)
            st = dry.corpus_stats()
            if st["rotations"] > 1:
                break
            if st["donated_tokens"] > most:
                fill, most = i + 1, st["donated_tokens"]
        del dry

        def build():
            for i in range(fill):
                donate(d, i)

        def selfbytes():
            return d.corpus_stats()["bytes"]
    elif name == "arctic":
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        SuffixDecodingCache(max_tree_depth=24).start_request(0, warm)
        c = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        def build():
            c.start_request(0, stream)

        def selfbytes():
            return None
    elif name == "sglang":
        anchors.SglangAdapter(capacity=18 * len(warm) + 64).start(0, warm)  # import + JIT load before the baseline
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        toks = [stream.tolist()]
        holder = []

        def build():
            c = NgramCorpus(max_trie_depth=18, min_bfs_breadth=1, max_bfs_breadth=10, draft_token_num=9,
                            match_type="BFS", capacity=18 * n + 64)
            c.batch_put(toks)
            c.synchronize()
            holder.append(c)

        def selfbytes():
            return None
    else:
        raise ValueError(f"no memory probe for {name}")
    h0, r0 = _heap_in_use(), _rss()
    build()
    h1, r1 = _heap_in_use(), _rss()
    if name == "ours-corpus":
        n = d.corpus_stats()["donated_tokens"]  # per token held (the old generation's text is still held)
    out = {"rss_bytes_per_token": (r1 - r0) / n, "tokens": n}
    if h0 is not None:
        out["heap_bytes_per_token"] = (h1 - h0) / n
    sb = selfbytes()
    if sb is not None:
        out["self_bytes_per_token"] = sb / n
    return out


def measure_memory(available, n: int, seed: int, log) -> Dict:
    res = {}
    for name in ("ours", "ours-corpus", "vllm-ngram", "arctic", "sglang"):
        if name.split("-")[0] != "ours" and name not in available:
            continue
        if name == "vllm-ngram":
            res[name] = {"bytes_per_token": 4.0, "method": anchors.VllmNgramAdapter.memory_note}
            log(f"  memory {name:16s} {4.0:8.1f} B/token ({res[name]['method']})")
            continue
        cmd = [sys.executable, "-m", "bench.drafters", "--memory-probe", name, "--mem-tokens", str(n),
               "--seed", str(seed)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        try:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
        except Exception:  # noqa: BLE001
            log(f"  memory {name}: probe failed: {proc.stderr.strip()[-300:]}")
            continue
        heap = r.get("heap_bytes_per_token")
        extra = (f"malloc heap delta {heap:.1f}, " if heap is not None else "") + \
            f"RSS delta {r['rss_bytes_per_token']:.1f} B/token, fresh process"
        if name == "ours-corpus":
            r["bytes_per_token"] = r["self_bytes_per_token"]
            r["method"] = f"corpus bytes / {r['tokens']} donated tokens held; {extra}"
        elif "self_bytes_per_token" in r:
            r["bytes_per_token"] = r["self_bytes_per_token"]
            r["method"] = f"memory_bytes(); {extra}"
        else:
            r["bytes_per_token"] = heap if heap is not None else r["rss_bytes_per_token"]
            sized = " (capacity = 18 x tokens + 64 trie nodes, preallocated)"
            r["method"] = extra + (sized if name == "sglang" else "")
        res[name] = r
        log(f"  memory {name:16s} {r['bytes_per_token']:8.1f} B/token ({r['method']})")
    return res


# --------------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------------


def _fmt(v, nd=2):
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    return f"{v:.{nd}f}"


def targets(res: Dict) -> List[Tuple[str, Optional[bool], str]]:
    """Each target of issues 2 and 15 as (text, met (None = not measurable in this run), numbers)."""
    out = []
    acc = res.get("acceptance", {})
    for wl, label in (("code", "code editing"), ("chat", "prose")):
        t = acc.get(wl) or {}
        # k=8 chains on both; trees on prose too (on code no tree target was set).
        cols = ["k8"] + (sorted(c for c in (t.get("ours") or {}) if c.startswith("tree")) if wl == "chat" else [])
        for col in cols:
            what = "k=8 chain" if col == "k8" else f"{col[4:]}-node tree"
            text = f"{what} acceptance on {label} above every anchor"
            if "ours" not in t or col not in t["ours"]:
                out.append((text, None, "not measured"))
                continue
            others = {n: v[col] for n, v in t.items() if not _is_ours(n) and col in v}
            if not others:
                out.append((text, None, "no anchor ran"))
                continue
            best = max(others, key=others.get)
            out.append((text, t["ours"][col] > others[best],
                        f"ours {t['ours'][col]:.3f} vs best anchor {best} {others[best]:.3f}"))
    # Prompt donation: prose gains, code does not lose.
    for wl, label in (("chat", "prose"), ("code", "code editing")):
        t = acc.get(wl) or {}
        o, r = t.get("ours") or {}, t.get(OURS_RESP_ONLY) or {}
        common = [c for c in o if c in r and (c == "k8" or c.startswith("tree"))]
        if not common:
            continue
        nums = ", ".join(f"{c}: {o[c]:.3f} vs {r[c]:.3f} ({o[c] - r[c]:+.3f})" for c in common)
        if wl == "code":
            out.append(("code acceptance with prompt donation not lower than responses only", all(
                o[c] >= r[c] for c in common), nums))
        else:
            out.append(("prose acceptance with prompt donation above responses only", all(
                o[c] > r[c] for c in common), nums))
    lat = res.get("latency", {})
    ours = lat.get("ours", {})
    c32 = 32768
    if c32 in ours and c32 in lat.get("arctic", {}):
        o, a = ours[c32]["step_us"], lat["arctic"][c32]["step_us"]
        out.append(("propose+update at 32k <= 1/5 of Arctic's", o <= a / 5,
                    f"median ours {o:.1f} us vs Arctic {a:.1f} us (ratio 1/{a / o:.1f})"))
    else:
        out.append(("propose+update at 32k <= 1/5 of Arctic's", None,
                    "Arctic not run" if c32 in ours else "not measured"))
    if len(ours) >= 2:
        lo, hi = min(ours), max(ours)
        vals = [ours[c]["step_us"] for c in sorted(ours)]
        ratio = max(vals) / min(vals)
        out.append((f"flat from {lo} to {hi} tokens (max/min step time <= 2)", ratio <= 2.0,
                    " / ".join(f"{c}: {ours[c]['step_us']:.1f}" for c in sorted(ours)) + f" us, max/min {ratio:.2f}"))
    b = res.get("batch", {})
    meta = res.get("meta", {})
    shape = f"{meta.get('batch', '?')} x {meta.get('batch_ctx', '?')}"
    if "ours" in b:
        o = b["ours"]["median_ms"]
        if (meta.get("batch"), meta.get("batch_ctx")) == (128, 32768):
            out.append(("batch step 128 x 32k <= 0.4 ms", o <= 0.4, f"median ours {o:.3f} ms"))
        else:
            out.append(("batch step 128 x 32k <= 0.4 ms", None, f"measured at {shape} only: {o:.3f} ms"))
        ran = {an: b[an]["median_ms"] for an in ("vllm-ngram", "arctic") if an in b}
        if ran:
            an = min(ran, key=ran.get)
            r = ran[an] / o
            out.append(("batch step >= 12x faster than the faster of vLLM and Arctic", r >= 12,
                        f"median ours {o:.3f} ms vs {an} {ran[an]:.3f} ms ({r:.1f}x)"))
        else:
            out.append(("batch step >= 12x faster than the faster of vLLM and Arctic", None,
                        "NOT RUN: neither vllm-ngram nor arctic ran"))
    bl = res.get("build", {})
    if "ours" in bl and "arctic" in bl:
        o, a = bl["ours"]["build_ms"], bl["arctic"]["build_ms"]
        n = meta.get("build_ctx", 32768)
        out.append((f"{n // 1024}k prompt build <= 1/4 of Arctic's", o <= a / 4,
                    f"ours {o:.2f} ms vs Arctic {a:.2f} ms (ratio {o / a:.2f})"))
    m = res.get("memory", {})
    if "ours" in m:
        v = m["ours"]["bytes_per_token"]
        out.append(("memory <= 200 B per context token", v <= 200, f"ours {v:.1f} B/token ({m['ours']['method']})"))
    if "ours-corpus" in m:
        v = m["ours-corpus"]["bytes_per_token"]
        out.append(("memory <= 200 B per token of the shared corpus (donated prompts + responses, default cap)",
                    v <= 200, f"ours {v:.1f} B/token ({m['ours-corpus']['method']})"))
    return out


def report(res: Dict) -> str:
    lines = []
    meta = res["meta"]
    lines.append(f"# Drafter benchmark — {meta['date']} — {meta['machine']}")
    lines.append("workloads: " + ", ".join(
        f"{w}: {n['requests']} requests, {n['prompt_tokens']} prompt / {n['output_tokens']} output tokens"
        for w, n in meta["workloads"].items()))
    vers = meta.get("versions", {})
    lines.append("drafters run: " + ", ".join(meta["available"]) + (
        "  (" + ", ".join(f"{k} {v}" for k, v in vers.items()) + ")" if vers else ""))
    for n, why in meta["missing"].items():
        lines.append(f"NOT RUN: {n}: {why}")
    for wl, t in res.get("acceptance", {}).items():
        cols = sorted({c for v in t.values() for c in v}, key=lambda c: (c.startswith("tree"), int(c.lstrip("ktre"))))
        lines.append("")
        lines.append(f"## Mean accepted draft tokens per step — {wl}")
        lines.append("| drafter | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---:|" * len(cols))
        for name, v in t.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(v.get(c), 3) for c in cols) + " |")
    lat = res.get("latency")
    if lat:
        ctxs = sorted({c for v in lat.values() for c in v})
        lines.append("")
        lines.append("## Per-step cost, one request, k=8 (us): median of propose+update (mean propose + mean update)")
        lines.append("| drafter | " + " | ".join(str(c) for c in ctxs) + " |")
        lines.append("|---|" + "---:|" * len(ctxs))
        for name, v in lat.items():
            cells = []
            for c in ctxs:
                x = v.get(c)
                cells.append("—" if x is None else f"{x['step_us']:.1f} ({x['propose_us']:.1f}+{x['update_us']:.1f})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    b = res.get("batch")
    if b:
        lines.append("")
        lines.append(f"## One step for {meta['batch']} requests x {meta['batch_ctx']} tokens (ms)")
        lines.append("| drafter | mean | median |")
        lines.append("|---|---:|---:|")
        for name, v in b.items():
            lines.append(f"| {name} | {v['step_ms']:.3f} | {v['median_ms']:.3f} |")
    bl = res.get("build")
    if bl:
        lines.append("")
        lines.append(f"## Build a {meta['build_ctx']}-token prompt (ms, median of 3)")
        lines.append("| drafter | ms |")
        lines.append("|---|---:|")
        for name, v in bl.items():
            lines.append(f"| {name} | {v['build_ms']:.2f} |")
    m = res.get("memory")
    if m:
        lines.append("")
        lines.append(f"## Memory per context token ({meta['mem_tokens']}-token request)")
        lines.append("| drafter | bytes/token | method |")
        lines.append("|---|---:|---|")
        for name, v in m.items():
            lines.append(f"| {name} | {v['bytes_per_token']:.1f} | {v['method']} |")
    lines.append("")
    lines.append("## Targets (issues 2 and 15)")
    for text, met, nums in targets(res):
        tag = {True: "MET", False: "MISSED", None: "N/A"}[met]
        lines.append(f"- [{tag}] {text}: {nums}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs visible, Python {platform.python_version()}"


def _versions() -> Dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("vllm", "numba", "arctic-inference", "sglang", "bpe-openai"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: few requests, k in {1,8}, small contexts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--code", type=int, default=None, help="code-edit requests (default 12; quick 2)")
    ap.add_argument("--chat", type=int, default=None, help="chat requests (default 40; quick 4)")
    ap.add_argument("--max-file-tokens", type=int, default=6000, help="largest old file for code edits")
    ap.add_argument("--ks", default=None, help="comma list of chain lengths (default 1..8; quick 1,8)")
    ap.add_argument("--sglang-ks", default="8", help="chain lengths at which SGLang is replayed (default 8: its "
                    "per-step Python cost dominates the run; 'all' = every k)")
    ap.add_argument("--tree-nodes", type=int, default=8)
    ap.add_argument("--contexts", default=None, help="latency contexts (default 1024,8192,32768)")
    ap.add_argument("--flat", default=None, help="extra contexts for ours only (default 131072,1048576; quick none)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per latency/batch point (default 200/20)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batch-ctx", type=int, default=32768)
    ap.add_argument("--build-ctx", type=int, default=32768)
    ap.add_argument("--mem-tokens", type=int, default=65536)
    ap.add_argument("--anchors", default="vllm-ngram,arctic,sglang", help="anchors to try (comma list; '' = none)")
    ap.add_argument("--skip", default="", help="sections to skip: acceptance,latency,batch,build,memory")
    ap.add_argument("--json", default=None, help="also write all numbers to this JSON file")
    ap.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, args.mem_tokens, args.seed)))
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    q = args.quick
    n_code = args.code if args.code is not None else (2 if q else 12)
    n_chat = args.chat if args.chat is not None else (4 if q else 40)
    ks = [int(x) for x in (args.ks or ("1,8" if q else "1,2,3,4,5,6,7,8")).split(",")]
    contexts = [int(x) for x in (args.contexts or ("1024,8192" if q else "1024,8192,32768")).split(",")]
    flat = [int(x) for x in (args.flat if args.flat is not None else ("" if q else "131072,1048576")).split(",") if x]
    steps = args.steps or (30 if q else 200)
    batch_steps = max(3, steps // 10)
    batch, batch_ctx = (args.batch if not q else min(args.batch, 16)), (args.batch_ctx if not q else 8192)
    build_ctx = args.build_ctx if not q else 8192
    mem_tokens = args.mem_tokens if not q else 16384
    skip = set(filter(None, args.skip.split(",")))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    names = ["ours"] + [a for a in args.anchors.split(",") if a]
    log(f"probing drafters: {', '.join(names)} (first SGLang use JIT-compiles its C++ corpus: ~1.5 min)")
    available, missing = anchors.load_adapters(names)
    for n in ("vllm-ngram", "arctic", "sglang"):
        if n not in names:
            missing[n] = "not requested (--anchors)"
    for n, why in missing.items():
        log(f"  NOT AVAILABLE {n}: {why}")
    if "ours" not in available:
        log("error: our drafter (sglang_hybrid.ngram) is not importable; build it with `pip install -e .` first")
        return 2

    log("building workloads ...")
    workloads: Dict[str, List[data.Request]] = {}
    wmeta = {}
    try:
        workloads["code"] = data.code_edit_requests(n_code, seed=args.seed, max_tokens=args.max_file_tokens)
    except data.DataUnavailable as e:
        missing["code workload"] = str(e)
        log(f"  code workload unavailable: {e}")
    workloads["chat"] = data.chat_requests(n_chat, seed=args.seed)
    for w, reqs in workloads.items():
        wmeta[w] = {"requests": len(reqs), "prompt_tokens": int(sum(len(r.prompt) for r in reqs)),
                    "output_tokens": int(sum(len(r.output) for r in reqs))}
    # One real-text stream serves every cost measurement; batch requests are distinct windows of it.
    stream_len = max(contexts + flat + [build_ctx, 2 * batch_ctx]) + (steps + 40) * 9
    stream = data.long_context_stream(stream_len, seed=args.seed)

    res: Dict = {"meta": {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": _machine(), "available": available,
        "missing": missing, "workloads": wmeta, "ks": ks, "tree_nodes": args.tree_nodes, "contexts": contexts,
        "flat": flat, "steps": steps, "batch": batch, "batch_ctx": batch_ctx, "build_ctx": build_ctx,
        "mem_tokens": mem_tokens, "seed": args.seed, "quick": q, "versions": _versions()}}
    t_all = time.perf_counter()
    if "acceptance" not in skip:
        log("acceptance ...")
        sk = None if args.sglang_ks == "all" else [int(x) for x in args.sglang_ks.split(",") if x]
        res["acceptance"] = measure_acceptance(available, workloads, ks, args.tree_nodes, log, sglang_ks=sk)
    if "latency" not in skip:
        log("latency ...")
        res["latency"] = measure_latency(available, stream, contexts, flat, steps, log, rounds=1 if q else 3)
    if "batch" not in skip:
        log("batch ...")
        res["batch"] = measure_batch(available, stream, batch, batch_ctx, batch_steps, log)
    if "build" not in skip:
        log("build ...")
        res["build"] = measure_build(available, stream, build_ctx, log)
    if "memory" not in skip:
        log("memory ...")
        res["memory"] = measure_memory(available, mem_tokens, args.seed, log)
    res["meta"]["seconds"] = time.perf_counter() - t_all
    text = report(res)
    print(text)
    print(f"\n(measurements took {res['meta']['seconds']:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return 0


if __name__ == "__main__":
    sys.exit(main())
