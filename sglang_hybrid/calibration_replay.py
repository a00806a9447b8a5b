"""Acceptance records from text: replay documents through ``NgramDrafter``, read model-drafter records from traces.

The text plays the target model's greedy output, so a draft token is "accepted" iff it equals the text's actual next
token. Replay rule (it mimics decode steps, so the features are distributed as in serving):

1. a document is ``(prompt, response)`` token ids; ``start(rid, prompt)``;
2. at response position ``pos`` propose a chain of ``k`` drafts; for ``j = 0, 1, ...`` record draft ``j`` (features +
   label) while all drafts before it hit -- records are *conditional*, exactly what ``a_j`` estimates -- stopping after
   the first miss;
3. ``extend`` by the accepted drafts plus the one bonus token (``step_mode="step"``, default) or by one token
   (``step_mode="token"``: more, but more correlated, records); repeat until the response ends;
4. ``finish(rid, donate=True)``: later documents can copy from it through the shared corpus (``source = 1``).

The shipped calibration is fit with this rule (``sglang_hybrid.tools.calibrate``) and checked against the target's
own outputs with it (``sglang_hybrid.tools.calibration_check``).
"""
from __future__ import annotations

import numpy as np

from .calibration_records import ModelRecords, NgramRecords


def trace_documents(path):
    """Documents ``(workload, prompt, output, id)`` from a reference-loop trace (docs/ARCHITECTURE.md)."""
    from .reference.trace import read_trace
    _header, records = read_trace(path)
    return [(r.workload, list(r.prompt), list(r.output), r.id) for r in records]


def model_records_from_trace(path) -> ModelRecords:
    """Model-drafter records from a trace: at every output position ``p`` the EAGLE chain ``eagle_tokens[p]`` is
    compared with ``output[p:]``; draft ``j`` is recorded (prob, depth ``j + 1``, hit) while all earlier drafts hit.
    The label is exact greedy acceptance for greedy traces (temperature 0), a proxy otherwise."""
    from .reference.trace import read_trace
    _header, records = read_trace(path)
    prob, depth, acc, work, doc = [], [], [], [], []
    for d, r in enumerate(records):
        out = r.output
        for p, (toks, probs) in enumerate(zip(r.eagle_tokens, r.eagle_probs)):
            for j, (t, q) in enumerate(zip(toks, probs)):
                if t < 0:
                    break
                hit = p + j < len(out) and int(t) == int(out[p + j])
                prob.append(float(q))
                depth.append(j + 1)
                acc.append(int(hit))
                work.append(r.workload)
                doc.append(d)
                if not hit:
                    break
    return ModelRecords(np.asarray(prob), np.asarray(depth), np.asarray(acc), workload=np.asarray(work, dtype=str),
                        doc=np.asarray(doc))


def _field(drafts, name):
    v = getattr(drafts, name, None)
    if v is None:
        return None
    return np.asarray(v)


def replay_document(drafter, rid: int, prompt, response, k: int, step_mode: str = "step") -> dict:
    """Replay one document; returns record columns (see module docstring for the rule)."""
    cols = {c: [] for c in ("match_len", "count", "total", "depth", "source", "accepted")}
    resp = np.asarray(response, dtype=np.int32)
    drafter.start(rid, np.asarray(prompt, dtype=np.int32))
    rid_arr = np.array([rid], dtype=np.int64)
    pos = 0
    n = resp.size
    while pos < n:
        d = drafter.propose(rid_arr, k)
        length = int(d.lengths[0])
        toks = np.asarray(d.tokens)[0]
        depth = _field(d, "depth")
        source = _field(d, "source")
        acc = 0
        for j in range(length):
            hit = pos + j < n and int(toks[j]) == int(resp[pos + j])
            cols["match_len"].append(int(d.match_len[0, j]))
            cols["count"].append(int(d.count[0, j]))
            cols["total"].append(int(d.total[0, j]))
            cols["depth"].append(int(depth[0, j]) if depth is not None else j + 1)
            cols["source"].append(int(source[0, j]) if source is not None else 0)
            cols["accepted"].append(int(hit))
            if not hit:
                break
            acc += 1
        step = acc + 1 if step_mode == "step" else 1
        step = min(step, n - pos)
        drafter.extend(rid, resp[pos:pos + step])
        pos += step
    drafter.finish(rid, donate=True)
    try:
        drafter.remove(rid)
    except Exception:  # finish may already release the request; remove is then a no-op or an error
        pass
    return cols


def replay(docs, k: int = 8, step_mode: str = "step", progress: bool = True, drafter_kwargs=None) -> NgramRecords:
    """Replay ``(workload, prompt, response, name)`` documents through one ``NgramDrafter`` (shared corpus)."""
    from .ngram import NgramDrafter
    from tqdm import tqdm
    drafter = NgramDrafter(max_draft=k, **(drafter_kwargs or {}))
    parts = []
    for doc_id, (workload, prompt, response, _name) in enumerate(
            tqdm(docs, desc="replay", unit="doc", disable=not progress)):
        c = replay_document(drafter, doc_id, prompt, response, k, step_mode)
        m = len(c["accepted"])
        parts.append(NgramRecords(**{key: np.asarray(v, dtype=np.int64) for key, v in c.items()},
                                  workload=np.full(m, workload), doc=np.full(m, doc_id, dtype=np.int64)))
    return NgramRecords.concat(parts)
