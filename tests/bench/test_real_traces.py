"""The real-drafter traces: prompts split into tuning and evaluation by source (`bench.replay.real_prompts`), the
committed traces (`bench/traces/`, `bench.replay.record.assemble_real`) and how the realistic replay reads them."""
from __future__ import annotations

import collections
import dataclasses
import gzip
import json

import numpy as np
import pytest

from bench.replay import real_prompts as RP
from bench.replay import realistic as RR
from bench.replay import record
from bench.replay import traces as T

#: what the replay needs per workload on held-out requests
MIN_EVAL_REQUESTS = 48


@pytest.fixture(scope="module")
def prompts():
    return RP.real_prompts()


@pytest.fixture(scope="module")
def committed():
    return T.read_real_traces(RR.REAL_TRACES)


def test_held_out_split_prompts_come_from_disjoint_sources(prompts):
    by = collections.defaultdict(set)
    for p in prompts:
        by[(p.workload, p.split)].add(p.source)
    for w in ("code", "code-edit"):
        assert by[(w, "tune")] and by[(w, "eval")] and not by[(w, "tune")] & by[(w, "eval")]
        assert by[(w, "eval")] <= {pkg for pkg, _ in RP.EVAL_PACKAGES}
        assert by[(w, "tune")] <= {pkg for pkg, _ in RP.TUNE_PACKAGES}
    chat = {s: {p.id for p in prompts if p.workload == "chat" and p.split == s} for s in RP.SPLITS}
    assert chat["tune"] and chat["eval"] and not chat["tune"] & chat["eval"]
    for p in prompts:
        if p.workload == "chat":        # after the head's training records, and split by the record's number
            i = int(p.id.rsplit(":", 1)[1])
            assert i >= RP.CHAT_FIRST_RECORD and RP.chat_split(i) == p.split
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    counts = collections.Counter((p.workload, p.split) for p in prompts)
    assert counts == collections.Counter(RP.CANDIDATES)
    assert RP.real_prompts() == prompts                                    # deterministic


def test_held_out_split_parts_are_stable_and_cover_every_candidate(prompts):
    parts = record.real_parts()
    names = [n for n, _ in parts]
    assert len(names) == len(set(names)) and all(len(ps) <= record.PART_SIZE for _, ps in parts)
    assert sorted(p.id for _, ps in parts for p in ps) == sorted(p.id for p in prompts)
    for name, ps in parts:
        assert {f"{p.workload}-{p.split}" for p in ps} == {name.rsplit("-", 1)[0]}


def test_held_out_split_code_pieces_are_whole_blocks():
    src = ("import os\n\n\ndef a(x):\n    return x\n\n\n" + "@dec\ndef b(y):\n" + "    y += 1\n" * 120
           + "    return y\n" + "\n\nclass C:\n    def m(self):\n        pass\n")
    pieces = RP.code_pieces(src)
    assert pieces and all(RP.MIN_CHARS <= len(p) <= RP.MAX_CHARS for p in pieces)
    assert "".join(pieces) in src and "@dec\ndef b(y):" in pieces[0]


def test_held_out_split_committed_traces(committed):
    tune, evals, manifest = committed
    for trace, split in ((tune, "tune"), (evals, "eval")):
        assert trace.eagle_k == manifest["eagle_k"] == 8 and trace.eagle_alternatives == manifest["eagle_alternatives"]
        for r in trace.requests:
            assert len(r.output) == record.REAL_OUTPUT_TOKENS == manifest["output_tokens"]
            assert r.id.startswith(r.workload + ":")
    n = collections.Counter(r.workload for r in evals.requests)
    assert all(n[w] >= MIN_EVAL_REQUESTS for w in RP.WORKLOADS), n
    assert {r.id for r in tune.requests}.isdisjoint(r.id for r in evals.requests)
    # the records' sources: tuning code from the tuning packages only, evaluation code from the others
    header, recs = T.TR.read_trace(RR.REAL_TRACES / "smollm2_real_eval.jsonl.gz")
    src = {r.extra["source"] for r in recs if r.workload != "chat"}
    assert src <= {pkg for pkg, _ in RP.EVAL_PACKAGES} and all(r.extra["split"] == "eval" for r in recs)
    for w, cell in manifest["workloads"].items():
        assert cell["kept"] <= cell["candidates"] and cell["output_tokens"] == cell["kept"] * 256


def test_held_out_split_checksum_is_checked(committed, tmp_path):
    for name in ("smollm2_real.json", "smollm2_real_tune.jsonl.gz", "smollm2_real_eval.jsonl.gz"):
        (tmp_path / name).write_bytes((RR.REAL_TRACES / name).read_bytes())
    T.read_real_traces(tmp_path)
    path = tmp_path / "smollm2_real_eval.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    rec = json.loads(lines[1])
    rec["output"][0] += 1
    lines[1] = json.dumps(rec)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(T.TraceError, match="checksum differs"):
        T.read_real_traces(tmp_path)
    with pytest.raises(FileNotFoundError, match="--record-real"):
        T.read_real_traces(tmp_path / "absent")


def test_held_out_split_replay_tunes_on_tuning_requests_only(committed):
    tune, evals, _ = committed
    cfg = RR.Config(seeds=(0, 1, 2), batches=(4,), sweep=False, ragged_mode=False, eagle_alternatives=0)
    runner = RR.Runner(cfg)
    banks, groups = RR.real_banks(runner, cfg, tune, evals)
    tune_ids = {r.id for r in tune.requests}
    assert {r.id for r in banks[0].requests} == tune_ids
    for s in (1, 2):
        assert tune_ids.isdisjoint(r.id for r in banks[s].requests)
        assert set(groups[s]) == {"code", "code-edit", "chat", "mixed"}
    hot = RR.real_banks(runner, cfg, tune, evals, temperature=0.5)[0]
    assert not np.allclose(hot[1].eagle_probs, banks[1].eagle_probs)
    assert np.array_equal(hot[1].eagle_tokens, banks[1].eagle_tokens)
    assert dataclasses.replace(cfg).real_traces is None
