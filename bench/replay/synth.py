"""SIMULATED model drafter on real text, and the real-text workloads of the realistic replay.

Why simulated: the only real EAGLE head here (SmolLM2-135M's) accepts ~0.4 tokens per step, far from the EAGLE-3
heads the paper measured on 8B models; the result then says little about the regime we ship for. So the realistic
replay runs real text (code edits between package releases, ShareGPT assistant turns, a mixed stream; `bench.data`)
with a model drafter whose strength is a stated parameter, and keeps the real SmolLM2 trace as the "real, small" row.

The simulated drafter (writes ordinary trace rows ``eagle_tokens`` / ``eagle_probs``, row p = the chain drafted
after output[:p]):

* token j of row p predicts output[p + j]; given that tokens 0..j-1 were right, it is right with probability
  ``c[p, j]``, its reported draft probability (so the confidence is calibrated by construction: P(right | c) = c);
* ``c`` is drawn from Beta(a * kappa, (1 - a) * kappa): mean ``a``, the same at every depth (flat per-position
  acceptance, as EAGLE-3 reports), informative but noisy (kappa = `KAPPA`);
* ``a = alpha`` except where a long n-gram match predicts the next token (our n-gram drafter, fresh at position
  q = p + j, has a match of at least `COPY_MATCH` tokens and its first token is output[q]): there ``a = alpha_copy``
  (real heads copy well from context);
* a wrong token is a different real-vocabulary token (never accepted); past the end of the output tokens are 0.
"""
from __future__ import annotations

import copy
from typing import List

import numpy as np

from bench import data
from bench.replay.traces import Trace, TraceRequest

KAPPA = 6.0          # Beta concentration of the simulated confidences
COPY_MATCH = 4       # "long" n-gram match: at least this many context tokens matched
VOCAB = 100_277      # cl100k


def real_text_requests(n: int, seed: int, out_tokens: int, k: int, edit_dense: bool = True) -> tuple:
    """(requests as `TraceRequest` with empty EAGLE rows, {workload: indices}): ``n`` code-edit windows ("code",
    copy-heavy: most are verbatim copies of the old file), ``n`` edit-dense code windows ("code-edit": each holds a
    changed line, from releases further apart; with ``edit_dense``), ``n`` ShareGPT assistant turns (outputs cut at
    ``out_tokens``) and a mixed workload of the first n/2 of the copy-heavy code and of the chats."""
    code = data.code_edit_windows(n, seed=seed, out_tokens=out_tokens)
    dense = data.code_edit_windows(n, seed=seed, out_tokens=out_tokens, edit_dense=True) if edit_dense else []
    chat = data.chat_requests(n, seed=seed, max_output=out_tokens)
    reqs: List[TraceRequest] = []
    for r in code + dense + chat:
        L = len(r.output)
        reqs.append(TraceRequest(r.id, r.workload, np.asarray(r.prompt, np.int32), np.asarray(r.output, np.int32),
                                 np.zeros((L, k), np.int32), np.zeros((L, k), np.float32)))
    nc, nd, nh = len(code), len(dense), len(chat)
    groups = {"code": list(range(nc)), "chat": list(range(nc + nd, nc + nd + nh)),
              "mixed": list(range(nc // 2)) + list(range(nc + nd, nc + nd + nh // 2))}
    if nd:
        groups["code-edit"] = list(range(nc, nc + nd))
    return reqs, groups


def verbatim_in_prompt(prompt: np.ndarray, output: np.ndarray) -> bool:
    """Whether ``output`` occurs as a contiguous run of tokens in ``prompt``."""
    p, o = np.ascontiguousarray(prompt, np.int32).tobytes(), np.ascontiguousarray(output, np.int32).tobytes()
    i = p.find(o)
    while i >= 0 and i % 4:                     # token-aligned matches only
        i = p.find(o, i + 1)
    return i >= 0


def edit_density(bank, flags: np.ndarray, idx) -> tuple:
    """(share of copy positions, share of requests whose whole output is a verbatim run of their prompt) over the
    requests ``idx`` of ``bank`` (`copy_flags` rows): how much of a workload a copying drafter could draft."""
    rows = np.concatenate([np.arange(bank.offset[i], bank.offset[i] + bank.lengths[i]) for i in idx])
    verbatim = np.mean([verbatim_in_prompt(bank.requests[i].prompt, bank.requests[i].output) for i in idx])
    return float(flags[rows].mean()), float(verbatim)


def copy_flags(bank) -> np.ndarray:
    """bool per bank row: a long n-gram match (fresh, at that position) predicts the row's next output token."""
    d = bank.ensure("ngram")
    truth = bank.out_pad[bank.out_off.repeat(bank.lengths) + _positions(bank)]
    return (d["lengths"] > 0) & (d["tokens"][:, 0] == truth) & (d["match_len"][:, 0] >= COPY_MATCH)


def _positions(bank) -> np.ndarray:
    return np.concatenate([np.arange(n) for n in bank.lengths]).astype(np.int64)


def simulated_eagle(bank, flags: np.ndarray, alpha: float, alpha_copy: float, k: int, seed: int) -> tuple:
    """(eagle_tokens int64 [rows, k], eagle_probs float32 [rows, k]) over every row of ``bank`` (module docstring)."""
    rng = np.random.default_rng([int(seed), int(round(alpha * 1000)), int(round(alpha_copy * 1000)), 7])
    rows = int(bank.lengths.sum())
    pos = _positions(bank)
    start = bank.out_off.repeat(bank.lengths)
    j = np.arange(k)[None, :]
    q = pos[:, None] + j                                                  # predicted output position
    inside = q < bank.lengths.repeat(bank.lengths)[:, None]
    flag_idx = np.minimum(np.arange(rows)[:, None] + j, rows - 1)         # row of position q in the same request
    cf = np.where(inside, flags[flag_idx], False)
    a = np.where(cf, alpha_copy, alpha)
    conf = rng.beta(np.maximum(a * KAPPA, 1e-3), np.maximum((1.0 - a) * KAPPA, 1e-3)).astype(np.float32)
    right = rng.random((rows, k)) < conf
    truth = bank.out_pad[start[:, None] + q]
    wrong = (np.maximum(truth, 0) + 1 + rng.integers(0, 1000, size=(rows, k))) % VOCAB
    toks = np.where(inside & right, truth, np.where(inside, wrong, 0)).astype(np.int64)
    return toks, np.clip(conf, 1e-4, 1.0 - 1e-4).astype(np.float32)


def with_eagle(bank, tokens: np.ndarray, probs: np.ndarray):
    """A view of ``bank`` (sharing its model-free drafts) with these EAGLE rows."""
    b = copy.copy(bank)
    b.eagle_tokens, b.eagle_probs = tokens, probs
    return b


def as_trace(bank, tokens, probs, alpha, alpha_copy) -> Trace:
    """The simulated drafter's rows as an ordinary trace (e.g. to write with `replay_traces.write_trace`)."""
    from sglang_hybrid.reference import trace as TR

    reqs = []
    for i, r in enumerate(bank.requests):
        sl = slice(bank.offset[i], bank.offset[i] + bank.lengths[i])
        reqs.append(TraceRequest(r.id, r.workload, r.prompt, r.output, tokens[sl].astype(np.int32), probs[sl]))
    header = TR.TraceHeader(model="real text (cl100k tokens; no target model run)",
                            draft_model=f"SIMULATED drafter alpha={alpha:g} alpha_copy={alpha_copy:g}",
                            temperature=0.0, eagle_k=int(tokens.shape[1]), created="bench.replay.synth")
    return Trace(header, reqs)
