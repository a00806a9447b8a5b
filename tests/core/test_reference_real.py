"""The real SmolLM2-135M-Instruct (fp32, CPU): every speculative mode reproduces plain greedy decoding token for
token on short code-editing and chat prompts, with the trained EAGLE head (shipped in sglang_hybrid/data)."""

import pytest
import torch

from sglang_hybrid.reference.loop import MODES, ReferenceLoop, plain_greedy

pytestmark = pytest.mark.real_model
torch.set_num_threads(2)
MAX_NEW = 24


@pytest.fixture(scope="module")
def setup():
    from sglang_hybrid.reference import eagle
    from sglang_hybrid.reference import prompts as P
    from sglang_hybrid.reference.models import load_smollm2
    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT

    lm = load_smollm2(full_check=False)
    if not (DEFAULT_OUT / "model.safetensors").is_file():
        pytest.fail(f"the trained EAGLE head is missing from {DEFAULT_OUT} (python -m sglang_hybrid.tools.train_eagle)")
    head = eagle.load_head(DEFAULT_OUT, lm.model.config)
    # Short versions of both workloads: a code edit (the file is in the prompt) and a chat question.
    code = P.encode(lm.tokenizer, P.CODE_EDITS[2])
    chat = P.encode(lm.tokenizer, P.Prompt("chat", "chat", "Explain in two sentences what a hash map is."))
    prompts = [code, chat]
    ref = [plain_greedy(lm.model, p, MAX_NEW) for p in prompts]
    from sglang_hybrid.cost import CostModel

    cost = CostModel.linear(0.05, 0.0008)  # a fixed cost model (measured magnitude), so the test is not timing-bound
    return lm, head, prompts, ref, cost


@pytest.mark.parametrize("mode", MODES)
def test_real_model_greedy_lossless(setup, mode):
    lm, head, prompts, ref, cost = setup
    res = ReferenceLoop(lm.model, mode=mode, head=head, cost=cost, n_nodes=10, eagle_k=6).generate(prompts, MAX_NEW)
    for r, x in zip(res, ref):
        assert r.output == x, (mode, lm.tokenizer.decode(r.output), lm.tokenizer.decode(x))


def test_shipped_head_checkpoint_fits_smollm2(setup):
    import json

    from sglang_hybrid.tools.train_eagle import DEFAULT_OUT

    lm, head, *_ = setup
    cfg = json.loads((DEFAULT_OUT / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"]
    assert cfg["hidden_size"] == lm.model.config.hidden_size == head.dims.hidden_size
    assert (DEFAULT_OUT / "model.safetensors").stat().st_size < 20_000_000


def test_eagle_rank_hit_rates_rank_the_heads_candidates_against_the_committed_tokens(setup, tmp_path):
    """`bench.replay.eagle_ranks` (the measured rates the replay's simulated EAGLE trees use): on a trace recorded
    with the shipped head, its rank-1 rate is exactly the trace's first-chain-token hit rate, every rate is a
    probability, and a trace whose chains another head drafted is refused."""
    import numpy as np

    from bench.replay import eagle_ranks
    from sglang_hybrid.reference import trace as TR

    lm, head, prompts, ref, _ = setup
    recs = []
    for i, (p, out) in enumerate(zip(prompts, ref)):
        toks, probs = TR.eagle_rows(lm.model, head, list(p), list(out), 8)
        recs.append(TR.TraceRecord(f"r{i}", "code" if i == 0 else "chat", list(p), list(out), toks, probs))
    path = TR.write_trace(tmp_path / "t.jsonl", TR.TraceHeader(model="SmolLM2", draft_model="shipped",
                                                               temperature=0.0, eagle_k=8), recs)
    rates, n = eagle_ranks.rank_hits(path, lm=lm, head=head)
    assert n == sum(len(out) for out in ref)
    first = np.mean([t[0] == o for r in recs for t, o in zip(r.eagle_tokens, r.output)])
    assert rates[0] == pytest.approx(first) and all(0.0 <= x <= 1.0 for x in rates)
    recs[0].eagle_tokens[0][0] = (recs[0].eagle_tokens[0][0] + 1) % lm.model.config.vocab_size
    TR.write_trace(path, TR.TraceHeader(model="SmolLM2", draft_model="other", temperature=0.0, eagle_k=8), recs)
    with pytest.raises(RuntimeError, match="differ from the trace's chains"):
        eagle_ranks.rank_hits(path, lm=lm, head=head)
