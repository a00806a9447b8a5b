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
