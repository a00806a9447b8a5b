"""Recording real per-position traces for the replay: ``--make-trace FILE`` (a small trace, one process) and
``--record-real DIR`` (the real-drafter traces at scale, in parts that resume and run in parallel).

SmolLM2-135M-Instruct decodes code-editing and chat prompts (greedy output = any lossless speculative mode's output),
then the trained EAGLE head's chain at every output position, with each chain position's next-ranked tokens (the
worker's setting ``eagle_alternatives``), is computed by `sglang_hybrid.reference.trace.eagle_rows` and the file is
written by `sglang_hybrid.reference.trace.write_trace`.
"""
from __future__ import annotations

import json
from pathlib import Path


def code_edit_prompts(n: int):
    """The reference loop's code-editing prompts, then edits of held-out standard-library files (real code nobody
    here wrote; every 10th stdlib file, which the EAGLE head's training excludes): first renaming the first top-level
    function of the short files (1200-3500 characters), then, only when more are asked for, the first function or
    method of the remaining files up to 6000 characters (appended, so the first prompts never change)."""
    import re

    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference.corpus import stdlib_python_files

    out = list(PR.CODE_EDITS[:n])
    sources = []
    for f in stdlib_python_files()[::10]:
        try:
            sources.append((f, f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    used = set()
    passes = ((r"^def ([a-z_][a-z0-9_]*)\(", 3500, ""), (r"^(?:    )?def ([a-z_][a-z0-9_]*)\(", 6000, "__"))
    for pattern, max_chars, skip_prefix in passes:
        for f, src in sources:
            if len(out) >= n:
                return out
            names = [x for x in re.findall(pattern, src, flags=re.M) if not (skip_prefix and x.startswith(skip_prefix))]
            if f in used or not (1200 <= len(src) <= max_chars) or not names:
                continue
            used.add(f)
            pid = f"code-{f.stem}"
            if any(p.id == pid for p in out):          # e.g. two packages' __init__.py: ids key the outputs cache
                pid = f"code-{f.parent.name}-{f.stem}"
            fn = names[0]
            text = (f"Here is the file `{f.name}`:\n```python\n{src}```\nRename the function `{fn}` to "
                    f"`{fn}_renamed` everywhere. Reply with the complete updated file.")
            out.append(PR.Prompt(pid, "code", text))
    return out


def _decode_batch(target, prompts, max_new, temperature, seed, eos):
    """The target's own continuation of each prompt, all prompts in one left-padded `generate` call (about ten times
    faster on CPU than one at a time). Temperature 0 = greedy; otherwise plain multinomial sampling (no top-k/p).
    Each output ends at its first EOS (kept) or after `max_new` tokens."""
    import torch

    pad = eos if eos is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    with torch.no_grad():
        gen = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=1,
                              pad_token_id=pad, eos_token_id=eos, **kw)
    outs = []
    for row in gen[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        outs.append(row)
    return outs


#: next-ranked tokens recorded per chain position: the worker's largest ``eagle_alternatives``, so a replay can run
#: any setting on the recorded drafts
ALTERNATIVES = 7


def make_trace(out_path, temperature=0.0, n_code=8, n_chat=8, max_new=320, k=8, head_dir=None, seed=0,
               threads=1, alternatives=ALTERNATIVES) -> int:
    """Record a per-position trace with the reference loop's pieces: the target's own decode of each prompt (greedy
    output = any lossless speculative mode's output), then the EAGLE rows by `reference.trace.eagle_rows`, each
    chain position with its next ``alternatives`` tokens.
    Outputs are cached next to the trace (`.outputs.json`) so decoding survives a missing head or a restart."""
    if not 0 <= int(alternatives) <= ALTERNATIVES:
        raise ValueError(f"--trace-alternatives {alternatives}: the worker's eagle_alternatives goes from 0 to "
                         f"{ALTERNATIVES}, so record 0 to {ALTERNATIVES}")
    import torch
    from tqdm import tqdm

    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference import trace as TR
    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2

    torch.set_num_threads(threads)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path = out_path.with_suffix(".outputs.json")
    lm = load_smollm2()
    prompts = code_edit_prompts(n_code) + PR.chat_prompts(n_chat)
    done = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    key = f"T{temperature:g}-max{max_new}-seed{seed}"
    got = done.setdefault(key, {})
    todo = [pr for pr in prompts if pr.id not in got]
    if todo:
        print(f"decoding {len(todo)} prompts (T={temperature:g}, up to {max_new} tokens) in one batch ...", flush=True)
        enc = [PR.encode(lm.tokenizer, pr) for pr in todo]
        outs = _decode_batch(lm.model, enc, max_new, temperature, seed, lm.eos_token_id)
        for pr, ids, o in zip(todo, enc, outs):
            got[pr.id] = {"workload": pr.workload, "prompt": ids, "output": o}
        cache_path.write_text(json.dumps(done))
    if head_dir is None:
        from sglang_hybrid.check import DEFAULT_DRAFT as head_dir      # the shipped head
    head_dir = Path(head_dir)
    try:
        head = load_head(head_dir, lm.model.config).eval()
    except Exception as e:  # noqa: BLE001 - report and keep the decoded outputs
        print(f"cannot load the EAGLE head from {head_dir} ({e}); decoded outputs kept in {cache_path}; "
              "rerun when the head exists (python -m sglang_hybrid.tools.train_eagle)")
        return 2
    recs = []
    for pid, r in tqdm(got.items(), desc="EAGLE rows"):
        rows = TR.eagle_rows(lm.model, head, r["prompt"], r["output"], k, alternatives)
        alt = dict(eagle_alt_tokens=rows[2], eagle_alt_probs=rows[3]) if alternatives else {}
        recs.append(TR.TraceRecord(pid, r["workload"], r["prompt"], r["output"], rows[0], rows[1], **alt))
    header = TR.TraceHeader(model=lm.name, draft_model=str(head_dir), temperature=float(temperature), eagle_k=k,
                            eagle_alternatives=alternatives)
    TR.write_trace(out_path, header, recs)
    print(f"wrote {out_path}: {len(recs)} requests, {sum(len(r.output) for r in recs)} output tokens")
    return 0


#: the real-drafter traces: every request's output is the model's greedy reply, cut at this many tokens; a candidate
#: whose reply ends sooner is left out (so every kept request has exactly this many output tokens)
REAL_OUTPUT_TOKENS = 256
#: candidates decoded together in one left-padded `generate` call: one resumable part
PART_SIZE = 8
#: the committed files' probabilities are rounded to this many decimals (a third of their size; far below any
#: difference a price or a calibration bin sees)
PROB_DECIMALS = 4
#: the committed real-drafter traces, one file per split (`assemble_real`)
REAL_TRACE_DIR = Path(__file__).resolve().parent.parent / "traces"


def real_parts() -> list:
    """[(part name, [RealPrompt])]: each (workload, split)'s candidates sorted by prompt length (little padding in a
    batch), cut into parts of `PART_SIZE`. Deterministic, so a part's name always means the same prompts."""
    from bench.replay.real_prompts import real_prompts

    groups: dict = {}
    for p in real_prompts():
        groups.setdefault((p.workload, p.split), []).append(p)
    parts = []
    for (workload, split), ps in groups.items():
        ps = sorted(ps, key=lambda p: (len(p.text), p.id))
        for i in range(0, len(ps), PART_SIZE):
            parts.append((f"{workload}-{split}-{i // PART_SIZE:02d}", ps[i:i + PART_SIZE]))
    return parts


_WORKER: dict = {}


def _worker_init(head_dir: str) -> None:
    """Load the target and the head once per worker process, on one thread (two processes use both cores)."""
    import torch

    from sglang_hybrid.reference.eagle import load_head
    from sglang_hybrid.reference.models import load_smollm2

    torch.set_num_threads(1)
    lm = load_smollm2()
    _WORKER.update(lm=lm, head=load_head(Path(head_dir), lm.model.config).eval(), head_dir=head_dir)


def _record_part(job) -> tuple:
    """Decode one part greedily, then the EAGLE rows of every reply that reached `REAL_OUTPUT_TOKENS`; write the part's
    trace (gzip) and then its `.done.json` (which marks the part complete, so a restart skips it)."""
    import time

    from sglang_hybrid.reference import prompts as PR
    from sglang_hybrid.reference import trace as TR

    name, prompts, out_dir, k, alternatives = job
    t0 = time.perf_counter()
    lm, head = _WORKER["lm"], _WORKER["head"]
    enc = [PR.encode(lm.tokenizer, p) for p in prompts]
    outs = _decode_batch(lm.model, enc, REAL_OUTPUT_TOKENS, 0.0, 0, lm.eos_token_id)
    recs, dropped = [], []
    for p, ids, out in zip(prompts, enc, outs):
        if len(out) < REAL_OUTPUT_TOKENS or (lm.eos_token_id is not None and lm.eos_token_id in out):
            dropped.append(p.id)
            continue
        rows = TR.eagle_rows(lm.model, head, ids, out, k, alternatives)
        recs.append(TR.TraceRecord(p.id, p.workload, ids, out, rows[0], rows[1],
                                   extra={"split": p.split, "source": p.source},
                                   eagle_alt_tokens=rows[2], eagle_alt_probs=rows[3]))
    header = TR.TraceHeader(model=lm.name, draft_model=Path(_WORKER["head_dir"]).name, temperature=0.0, eagle_k=k,
                            eagle_alternatives=alternatives)
    TR.write_trace(out_dir / f"{name}.jsonl.gz", header, recs)
    seconds = time.perf_counter() - t0
    done = {"part": name, "candidates": [p.id for p in prompts], "dropped": dropped, "seconds": round(seconds, 1)}
    (out_dir / f"{name}.done.json").write_text(json.dumps(done, indent=1) + "\n")
    return name, len(recs), len(dropped), seconds


def record_real(work_dir, jobs: int = 2, k: int = 8, alternatives: int = ALTERNATIVES, head_dir=None,
                only=None) -> int:
    """Record every part of the real-drafter traces not yet done under ``work_dir`` (`jobs` processes, one thread
    each), then assemble them (`assemble_real`). Prints each part's time and the total."""
    import time
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm import tqdm

    if head_dir is None:
        from sglang_hybrid.check import DEFAULT_DRAFT as head_dir      # the shipped head
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    parts = [(n, ps) for n, ps in real_parts() if only is None or n.startswith(tuple(only))]
    todo = [(n, ps, work_dir, k, alternatives) for n, ps in parts if not (work_dir / f"{n}.done.json").is_file()]
    print(f"real traces: {len(parts)} parts, {len(parts) - len(todo)} already done in {work_dir}; recording "
          f"{len(todo)} with {jobs} process(es)", flush=True)
    t0 = time.perf_counter()
    if todo:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init, initargs=(str(head_dir),)) as ex:
            futs = [ex.submit(_record_part, job) for job in todo]
            for f in tqdm(as_completed(futs), total=len(futs), desc="parts"):
                name, kept, dropped, seconds = f.result()
                tqdm.write(f"  {name}: {kept} kept, {dropped} ended before {REAL_OUTPUT_TOKENS} tokens, "
                           f"{seconds:.0f} s")
    print(f"recorded {len(todo)} parts in {time.perf_counter() - t0:.0f} s", flush=True)
    if only is not None:
        return 0
    return assemble_real(work_dir)


def assemble_real(work_dir, out_dir=REAL_TRACE_DIR) -> int:
    """Join the parts into one gzip trace per split (`smollm2_real_{tune,eval}.jsonl.gz`, probabilities rounded to
    `PROB_DECIMALS`) and write
    `smollm2_real.json`: per file its SHA-256 and per (workload, split) the candidates, the kept requests and the
    recording seconds, so the replay can check what it reads and the docs can say how it was made."""
    import hashlib

    from sglang_hybrid.reference import trace as TR

    work_dir, out_dir = Path(work_dir), Path(out_dir)
    names = [n for n, _ in real_parts()]
    missing = [n for n in names if not (work_dir / f"{n}.done.json").is_file()]
    if missing:
        print(f"{len(missing)} part(s) not recorded yet (first: {missing[0]}); rerun --record-real to resume")
        return 2
    by_split: dict = {}
    header = None
    summary: dict = {}
    seconds = 0.0
    for n in names:
        header, recs = TR.read_trace(work_dir / f"{n}.jsonl.gz")
        done = json.loads((work_dir / f"{n}.done.json").read_text())
        workload, split = n.rsplit("-", 2)[0], n.rsplit("-", 2)[1]
        cell = summary.setdefault(f"{workload}/{split}", {"candidates": 0, "kept": 0, "output_tokens": 0})
        cell["candidates"] += len(done["candidates"])
        cell["kept"] += len(recs)
        cell["output_tokens"] += sum(len(r.output) for r in recs)
        seconds += done["seconds"]
        for r in recs:
            r.eagle_probs = TR.rounded(r.eagle_probs, PROB_DECIMALS)
            r.eagle_alt_probs = ([TR.rounded(row, PROB_DECIMALS) for row in r.eagle_alt_probs] if r.eagle_alt_probs
                                 else None)
        by_split.setdefault(split, []).extend(recs)
    files = {}
    for split, recs in by_split.items():
        path = TR.write_trace(out_dir / f"smollm2_real_{split}.jsonl.gz", header, recs)
        files[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = {"model": header.model, "draft_model": header.draft_model, "eagle_k": header.eagle_k,
                "eagle_alternatives": header.eagle_alternatives, "output_tokens": REAL_OUTPUT_TOKENS,
                "files": files, "workloads": summary, "recording_seconds_one_core": round(seconds)}
    (out_dir / "smollm2_real.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for key, cell in summary.items():
        print(f"  {key}: {cell['kept']} of {cell['candidates']} candidates kept, {cell['output_tokens']} tokens")
    print(f"wrote {', '.join(files)} and smollm2_real.json in {out_dir}")
    return 0
