"""Lossless checks: the verification rules on CUDA equal the CPU, and HYBRID greedy decoding equals plain greedy.

    python -m bench.device.lossless

1. ``verify.greedy_accept`` and ``verify.sample_accept`` on the same inputs on CUDA and on the CPU: the trees come from
   ``HybridStep.select`` at the deployed shapes (W = 13, batch 64), the target logits are random with the drafted
   token planted as the parent's argmax at about 70 % of the nodes (so paths of every length are accepted), sampling
   at per-request temperatures with given uniforms. Every output must be identical. Without a GPU this part is
   skipped (said so): comparing the CPU with itself proves nothing.
2. The CPU reference loop (``sglang_hybrid.reference.loop``, the project's oracle) in both HYBRID modes (merge and
   choose, greedy) on a small random-weight Llama (``reference.models.tiny_target``) with a random EAGLE head: its
   output must equal ``plain_greedy`` token for token. The loop runs on the CPU of whichever machine runs this (it is a
   CPU loop); it needs the Rust extension (n-gram drafter), carried to the GPU machine as an abi3 wheel -- without it
   this part is skipped and says why.
3. A greedy HYBRID decode on the device (``bench.device.decode``): ``HybridStep.select``, the verify input
   (positions and FULL_MASK blocks drive the forward), ``greedy_accept`` and ``after_verify`` on CUDA around a small
   random-weight decoder, in merge (W 13) and choose (W 9), and merge again through the ragged verify layout
   (compact rows in, padded logits out): equal to plain greedy decoding of the same model, token for token. GPU: 8
   requests x 48 tokens on CUDA; CPU mode: 3 x 24 on the CPU.
"""
from __future__ import annotations

import sys
import time

import torch

from bench.device import _env

VOCAB = 32000


def verify_inputs(batch: int = 64, seed: int = 3):
    """A batch of HYBRID verify trees (deployed shapes) and planted target logits, on the CPU."""
    from bench.device import selection

    _, factory = selection.make_step("cpu")
    step = factory(max(2 * batch, 8))
    _, publish = selection.make_inputs(step, batch, seed=seed)
    x = publish(step)
    x = x._replace(root=x.root % VOCAB, model_tokens=x.model_tokens % VOCAB)
    step.buffers.tokens.remainder_(VOCAB)
    out = step.select(x.root, x.model_tokens, x.model_conf, x.slots, x.cur_gen, x.seq_lens)
    tree = out.tree if hasattr(out, "tree") else out
    b, w = tree.tokens.shape
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((b, w, VOCAB), generator=g)
    plant = tree.valid & (tree.parents >= 0) & (torch.rand((b, w), generator=g) < 0.7)
    rows, nodes = plant.nonzero(as_tuple=True)
    logits[rows, tree.parents[rows, nodes], tree.tokens[rows, nodes]] += 12.0
    temperature = 0.5 + torch.rand(b, generator=g)
    uniforms = torch.rand((b, w), generator=g)
    return tree, logits, temperature, uniforms


def check_verify(on_gpu: bool, log) -> dict:
    from sglang_hybrid.verify import greedy_accept, sample_accept

    tree, logits, temperature, uniforms = verify_inputs()
    cpu_g = greedy_accept(tree, logits)
    cpu_s = sample_accept(tree, logits, temperature, uniforms)
    rec = {"batch": int(tree.tokens.shape[0]), "W": int(tree.tokens.shape[1]), "vocab": VOCAB,
           "greedy_mean_accept": float(cpu_g.accept_len.float().mean()),
           "sample_mean_accept": float(cpu_s.accept_len.float().mean())}
    if not on_gpu:
        rec["cuda_vs_cpu"] = "skipped: no GPU"
        log(f"  verify rules: CUDA comparison SKIPPED (no GPU); on the CPU B={rec['batch']} W={rec['W']}: mean "
            f"accepted {rec['greedy_mean_accept']:.2f} greedy, {rec['sample_mean_accept']:.2f} sampled")
        return rec
    dev = torch.device("cuda")
    tree_d = type(tree)(*[t.to(dev) for t in tree])
    gpu_g = greedy_accept(tree_d, logits.to(dev))
    gpu_s = sample_accept(tree_d, logits.to(dev), temperature.to(dev), uniforms.to(dev))
    diffs = []
    for name, a, b in (("greedy", cpu_g, gpu_g), ("sample", cpu_s, gpu_s)):
        for field, x, y in zip(a._fields, a, b):
            if not torch.equal(x, y.cpu()):
                rows = int((x != y.cpu()).reshape(x.shape[0], -1).any(1).sum())
                diffs.append(f"{name}.{field}: {rows} rows differ")
    rec["cuda_vs_cpu"] = "equal" if not diffs else diffs
    log(f"  verify rules B={rec['batch']} W={rec['W']} V={VOCAB}: CUDA "
        f"{'== CPU (greedy_accept and sample_accept, every output)' if not diffs else 'DIFFERS: ' + '; '.join(diffs)}"
        f"; mean accepted {rec['greedy_mean_accept']:.2f} greedy, {rec['sample_mean_accept']:.2f} sampled")
    return rec


def check_reference_loop(log, new_tokens: int = 32) -> dict:
    ext = _env.use_carried_extension()
    if not ext.startswith("ok"):
        log(f"  reference loop: SKIPPED, the Rust extension is {ext} (bash bench/device_run.sh --prepare carries it)")
        return {"status": "skipped", "extension": ext}
    from sglang_hybrid.cost import CostModel
    from sglang_hybrid.reference import eagle
    from sglang_hybrid.reference.loop import ReferenceLoop, plain_greedy
    from sglang_hybrid.reference.models import tiny_target

    model = tiny_target(0).model
    head = eagle.new_head(model.config, seed=1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (5, 12, 20)]
    prompts[-1] = prompts[-1][:8] * 3                                    # repetitive: the n-gram drafter matches
    t0 = time.perf_counter()
    ref = [plain_greedy(model, p, new_tokens, eos_token_id=-1) for p in prompts]
    rec = {"extension": ext, "prompts": len(prompts), "new_tokens": new_tokens, "modes": {}}
    for mode in ("merge", "choose"):
        loop = ReferenceLoop(model, mode=mode, head=head, cost=CostModel.linear(0.01, 0.0005), eos_token_id=-1,
                             n_nodes=12, eagle_k=4, ngram_k=8)
        res = loop.generate(prompts, new_tokens)
        equal = all(r.output == x for r, x in zip(res, ref))
        accepted = sum(s.accepted for r in res for s in r.steps)
        steps = sum(len(r.steps) for r in res)
        rec["modes"][mode] = {"equal_to_plain_greedy": equal, "accepted_draft_tokens": accepted, "steps": steps}
        log(f"  reference loop {mode:<6} greedy: {'== plain greedy' if equal else 'DIFFERS from plain greedy'} "
            f"({len(prompts)} prompts x {new_tokens} tokens in {steps} steps, {accepted} draft tokens accepted)")
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


def check_decode(on_gpu: bool, log) -> dict:
    from bench.device import decode

    if on_gpu:
        torch.set_float32_matmul_precision("highest")   # fp32 GEMMs, no TF32: the oracle and the tree forward alike
        return decode.check("cuda", 8, 48, log)
    return decode.check("cpu", 3, 24, log)


def run(log=print) -> dict:
    on_gpu = _env.gpu()
    log(f"[lossless] {'GPU and CPU' if on_gpu else 'CPU mode (no GPU)'}")
    doc = {"on_gpu": on_gpu, "failures": 0}
    jobs = (("verify", lambda: check_verify(on_gpu, log)), ("reference_loop", lambda: check_reference_loop(log)),
            ("decode", lambda: check_decode(on_gpu, log)))
    for name, fn in jobs:
        try:
            doc[name] = fn()
        except Exception as e:  # report, then fail
            doc[name] = {"error": _env.failure(e)}
            log(f"  {name}: FAILED {doc[name]['error']}")
            doc["failures"] += 1
    v = doc["verify"].get("cuda_vs_cpu")
    doc["failures"] += isinstance(v, list)
    for name in ("reference_loop", "decode"):
        modes = doc[name].get("modes", {})
        doc["failures"] += sum(not m["equal_to_plain_greedy"] for m in modes.values())
    _env.write_json("lossless.json", doc)
    return doc


def main(argv=None) -> int:
    if not _env.gpu():
        torch.set_num_threads(1)
    return 1 if run()["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
