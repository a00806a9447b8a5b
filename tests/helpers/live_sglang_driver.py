"""Live-engine scenarios the self-check does not cover, run in a process of their own (SGLang's CPU engine needs its
environment set before ``sglang`` is imported, so never inside the pytest process). Used by
``tests/live/test_sglang_live.py``.

    python -m tests.helpers.live_sglang_driver CASE PROMPTS.jsonl [--overlap]

run from the repository's root, where CASE is one of

    abort       HYBRID merge switching width buckets: streaming abort, then a batch
    retract     HYBRID merge with a KV pool too small for the batch
    sampling    HYBRID at temperature 0.8, top-p 0.9: SGLang's sampling verify with the CPU tree-sampling stand-in
    kv_window   HYBRID with SGLang's KV window planning (a GPU branch) lifted onto the CPU, padded verify
    eagle3      HYBRID with an EAGLE-3 head (reduced draft vocabulary, auxiliary hidden states)

and ``--overlap`` runs abort or retract with the HYBRID engine on SGLang's overlap scheduler (as on a GPU).

The engines' extend and decode attention are SGLang's Triton kernels (interpreter) unless
``HYBRID_CPU_ENGINE_TORCH_ATTENTION`` is set in the environment (their torch twins,
``sglang_hybrid/cpu_engine/torch_attention.py``; ``test_sglang_live.py`` chooses per case).

Prints one JSON object on the last line of stdout: the greedy reference (plain decoding, ``torch_native``) and what
HYBRID produced, so the test compares token ids itself.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

HEAD = Path(__file__).resolve().parents[2] / "sglang_hybrid" / "data" / "eagle_smollm2"
#: environment variable naming a directory where plain greedy references are kept between driver runs (``_reference``)
REFERENCE_CACHE = "HYBRID_LIVE_REFERENCE_CACHE"
GREEDY = {"temperature": 0.0}


def _engine(model: str, *, hybrid: bool, head: Path = HEAD, **overrides):
    import sglang

    from sglang_hybrid.cpu_engine import engine_kwargs

    spec = dict(speculative_algorithm="HYBRID", speculative_draft_model_path=str(head), speculative_num_steps=3)
    kw = engine_kwargs(model, speculative=spec if hybrid else None)
    kw.update(overrides)
    return sglang.Engine(**kw)


@contextlib.contextmanager
def _hybrid(model: str, env: dict, **overrides):
    """A HYBRID engine started with the HYBRID settings ``env`` (``SGLANG_HYBRID_*`` variables, read at start) in
    this process's environment; on exit it is shut down and the settings removed."""
    os.environ.update(env)
    try:
        eng = _engine(model, hybrid=True, **overrides)
        try:
            yield eng
        finally:
            eng.shutdown()
    finally:
        for key in env:
            os.environ.pop(key, None)


def _reference(model: str, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Plain greedy decoding of ``prompts`` (no speculation). With ``REFERENCE_CACHE`` set (the live suite sets it to
    one directory per session) the outputs are kept there by model, prompts, length and attention (SGLang's Triton
    kernels or their torch twins, ``TORCH_ATTENTION_ENV``), so cases that decode the same prompts to the same length
    on the same attention start one plain engine between them: greedy decoding is deterministic on one engine build,
    and the cached ids are the same engine's, whichever case ran first."""
    from sglang_hybrid.cpu_engine.torch_attention import TORCH_ATTENTION_ENV

    cache = os.environ.get(REFERENCE_CACHE)
    path = None
    if cache:
        twins = bool(os.environ.get(TORCH_ATTENTION_ENV))
        key = hashlib.sha256(json.dumps([model, prompts, max_new_tokens, twins]).encode()).hexdigest()[:16]
        path = Path(cache) / f"reference_{key}.json"
        if path.exists():
            return json.loads(path.read_text())
    eng = _engine(model, hybrid=False)
    try:
        out = [o["output_ids"] for o in eng.generate(prompts, dict(GREEDY, max_new_tokens=max_new_tokens))]
    finally:
        eng.shutdown()
    if path is not None:
        path.write_text(json.dumps(out))
    return out


def _dear_slots(tmp: Path) -> dict:
    """HYBRID settings with a cost table where verify slots are dear (T(n) = 10 ms + 1 ms per token), a draft forward
    that costs 4 ms, and per-step counters: the price picks narrow widths and shallow drafts for weak drafts and wide,
    deep ones for long copies, so the engine switches between its (depth, width) runtime states during a batch."""
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    CostModel.linear(0.010, 0.001, max_tokens=4096).save(tmp / "cost.json")
    CostModel.linear(0.004, 0.0, max_tokens=4096).save(tmp / "draft_cost.json")
    return {ENV_PREFIX + "COST_TABLE": str(tmp / "cost.json"), ENV_PREFIX + "COUNTERS_FILE": str(tmp / "counters.json"),
            ENV_PREFIX + "DRAFT_COST_TABLE": str(tmp / "draft_cost.json"), ENV_PREFIX + "LOG_INTERVAL": "1"}


def abort_case(model: str, prompts: list[str], overlap: bool = False) -> dict:
    """A streaming request aborted after its second chunk; then a code edit and the chat, as one batch of different
    lengths. The engine prices verify slots and draft forwards (``_dear_slots``), so it also switches EAGLE depths and
    verify widths, and learns each request's online EAGLE and n-gram offsets (``model_bias_eta``, ``ngram_bias_eta``,
    off by default), which a request taking over the aborted one's slot must not inherit, nor the first position's
    EAGLE alternatives kept for its slot (``eagle_alternatives = 2``). It runs the long n-gram chain recommended with
    a cost table (``ngram_k = 24``: widths up to 28, for which the alternatives compete with the chains' nodes,
    49-token proposals; docs/sglang.md, "The n-gram chain length")."""
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    n_new = 8
    prompts = prompts[:2]
    reference = _reference(model, prompts, n_new)
    tmp = Path(tempfile.mkdtemp(prefix="hybrid_abort_"))
    env = {**_dear_slots(tmp), ENV_PREFIX + "MODEL_BIAS_ETA": "0.1", ENV_PREFIX + "NGRAM_BIAS_ETA": "0.3",
           ENV_PREFIX + "NGRAM_K": "24", ENV_PREFIX + "EAGLE_ALTERNATIVES": "2"}
    with _hybrid(model, env, disable_overlap_schedule=not overlap) as eng:
        async def stream_then_abort():
            chunks, last = 0, None
            gen = await eng.async_generate(prompts[0], dict(GREEDY, max_new_tokens=64), stream=True)
            async for chunk in gen:
                chunks, last = chunks + 1, chunk
                if chunks == 2:
                    eng.tokenizer_manager.abort_request(chunk["meta_info"]["id"])
            return chunks, last

        chunks, last = eng.loop.run_until_complete(stream_then_abort())
        after = eng.generate(prompts, dict(GREEDY, max_new_tokens=n_new))
    return {"reference": reference, "hybrid": [o["output_ids"] for o in after],
            "aborted_chunks": chunks, "aborted_finish": last["meta_info"]["finish_reason"],
            "aborted_tokens": last["meta_info"]["completion_tokens"],
            "accept_lengths": [o["meta_info"].get("spec_accept_length") for o in after],
            "counters": json.loads((tmp / "counters.json").read_text())}


def retract_case(model: str, prompts: list[str], overlap: bool = False) -> dict:
    """The two code edits admitted together into a KV pool that holds their prompts plus a few tokens: admission is
    made optimistic (``schedule_conservativeness``), so decoding runs out of KV, SGLang retracts a running request
    and re-prefills it later. HYBRID's drafter state for a retracted request must be rebuilt, never reused. The engine
    prices verify slots and draft forwards (``_dear_slots``) and drafts at EAGLE depth 2 or 3 (``draft_depths =
    [2]``): depth 2 runs in the start-up depth's draft backend (``shared_draft_steps``). Each chain position offers
    two EAGLE alternatives (``eagle_alternatives = 2``), the first position's kept per request slot: a re-prefilled
    request must not read what its slot held before."""
    from transformers import AutoTokenizer

    n_new = 16
    code = [p for p in prompts if "```python" in p][:2]
    reference = _reference(model, code, n_new)
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    tok = AutoTokenizer.from_pretrained(model)
    prompt_tokens = sum(len(tok(p)["input_ids"]) for p in code)
    tmp = Path(tempfile.mkdtemp(prefix="hybrid_retract_"))
    env = {**_dear_slots(tmp), ENV_PREFIX + "DRAFT_DEPTHS": "[2]", ENV_PREFIX + "EAGLE_ALTERNATIVES": "2"}
    with _hybrid(model, env, max_total_tokens=prompt_tokens + 32, schedule_conservativeness=0.01,
                 max_running_requests=2, disable_overlap_schedule=not overlap) as eng:
        out = eng.generate(code, dict(GREEDY, max_new_tokens=n_new))
    return {"reference": reference, "hybrid": [o["output_ids"] for o in out],
            "retractions": [o["meta_info"].get("num_retractions", 0) for o in out], "pool": prompt_tokens + 32,
            "counters": json.loads((tmp / "counters.json").read_text())}


def sampling_case(model: str, prompts: list[str], counts: Path) -> dict:
    """A code edit and the chat at temperature 0.8, top-p 0.9 (``ignore_eos``, 8 new tokens) through HYBRID merge:
    SGLang's sampling verify branch (``eagle_sample`` with tree speculative sampling) on HYBRID's trees, with the CPU
    stand-in op (``sglang_hybrid/cpu_engine/tree_sampling.py``, installed in the engine by ``main``), the trees
    holding two EAGLE alternatives per chain position (``eagle_alternatives = 2``). No reference:
    sampled text differs run to run; the op's own counts and HYBRID's counters show the branch ran."""
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    n_new = 8
    tmp = Path(tempfile.mkdtemp(prefix="hybrid_sampling_"))
    env = {ENV_PREFIX + "COUNTERS_FILE": str(tmp / "counters.json"), ENV_PREFIX + "LOG_INTERVAL": "1",
           ENV_PREFIX + "MODE": "merge", ENV_PREFIX + "EAGLE_ALTERNATIVES": "2"}
    with _hybrid(model, env) as eng:
        out = eng.generate(prompts[:2], {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": n_new,
                                         "ignore_eos": True})
        vocab = eng.tokenizer_manager.tokenizer.vocab_size
    return {"output_ids": [o["output_ids"] for o in out], "text": [o["text"] for o in out], "vocab": vocab,
            "n_new": n_new, "stand_in": json.loads(counts.read_text()) if counts.exists() else None,
            "counters": json.loads((tmp / "counters.json").read_text())}


def kv_window_case(model: str, prompts: list[str]) -> dict:
    """A code edit and the chat with SGLang's KV window planning on (``cpu_engine.kv_window``: the draft plans each
    iteration's write window and HYBRID hands the plan to its verify, as on a GPU), padded verify (``ragged_verify =
    off``) under the dear-slot verify cost table but no draft cost table, so every step drafts 3 EAGLE tokens while
    the width buckets go down to 2: steps at widths up to the depth, where SGLang plans no window (a case only HYBRID
    produces), beside wider ones, where it does. Each chain position offers two EAGLE alternatives
    (``eagle_alternatives = 2``), which the padded step's width buckets truncate like any node."""
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX

    n_new = 8
    prompts = prompts[:2]
    reference = _reference(model, prompts, n_new)
    tmp = Path(tempfile.mkdtemp(prefix="hybrid_kv_window_"))
    env = {**_dear_slots(tmp), ENV_PREFIX + "RAGGED_VERIFY": "off", ENV_PREFIX + "EAGLE_ALTERNATIVES": "2"}
    del env[ENV_PREFIX + "DRAFT_COST_TABLE"]
    with _hybrid(model, env) as eng:
        out = eng.generate(prompts, dict(GREEDY, max_new_tokens=n_new))
    return {"reference": reference, "hybrid": [o["output_ids"] for o in out],
            "counters": json.loads((tmp / "counters.json").read_text())}


def eagle3_case(model: str, prompts: list[str]) -> dict:
    """A code edit and the chat through HYBRID (default settings, merge, the verify cost table measured at start as
    on a GPU) with an EAGLE-3 head written at test time
    (``tests/helpers/eagle3_head.py``: SGLang's EAGLE-3 layout, a reduced draft vocabulary with ``d2t``, three auxiliary
    hidden states of the target; random weights that draft one planted token, mapped by ``d2t`` to the commonest token
    of the plain outputs). SGLang's launcher detects the architecture, the target captures its auxiliary states and
    the draft maps its ids to the target's before HYBRID builds its trees."""
    from collections import Counter

    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX
    from tests.helpers.eagle3_head import write_eagle3_head

    n_new = 8
    prompts = prompts[:2]
    reference = _reference(model, prompts, n_new)
    token = Counter(t for ids in reference for t in ids).most_common(1)[0][0]
    tmp = Path(tempfile.mkdtemp(prefix="hybrid_eagle3_"))
    head = write_eagle3_head(tmp / "head", json.loads((Path(model) / "config.json").read_text()), token)
    env = {ENV_PREFIX + "COUNTERS_FILE": str(tmp / "counters.json"), ENV_PREFIX + "LOG_INTERVAL": "1",
           ENV_PREFIX + "MEASURE_COST_TABLE": "on"}
    with _hybrid(model, env, head=tmp / "head") as eng:
        out = eng.generate(prompts, dict(GREEDY, max_new_tokens=n_new))
    return {"reference": reference, "hybrid": [o["output_ids"] for o in out], "head": head,
            "counters": json.loads((tmp / "counters.json").read_text())}


def main() -> None:
    case, prompts_file = sys.argv[1], sys.argv[2]
    overlap = "--overlap" in sys.argv[3:]
    from sglang_hybrid.cpu_engine import prepare_environment

    counts = Path(tempfile.mkdtemp(prefix="hybrid_tree_sampling_")) / "stand_in_counts.json"
    # the retraction case also plans KV windows: its ragged verify then compacts a planned window, as on a GPU
    prepare_environment(tree_sampling_counts=str(counts) if case == "sampling" else None,
                        kv_window=case in ("kv_window", "retract"))
    from sglang_hybrid.check import load_tokenizer, read_prompts, render
    from sglang_hybrid.reference.models import ensure_converted

    model = str(ensure_converted())
    # chat-message lines rendered with SmolLM2's chat template (its tokenizer adds no BOS of its own, so the engine
    # makes the same ids of this text as the self-check sends)
    tokenizer = load_tokenizer(model)
    prompts = [render(p, tokenizer) for p in read_prompts(prompts_file)]
    if case == "sampling":
        result = sampling_case(model, prompts, counts)
    elif case in ("abort", "retract"):
        result = {"abort": abort_case, "retract": retract_case}[case](model, prompts, overlap=overlap)
    else:
        result = {"kv_window": kv_window_case, "eagle3": eagle3_case}[case](model, prompts)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
