"""Recording a real per-position trace for the replay (``python -m bench.replay --make-trace FILE``).

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
