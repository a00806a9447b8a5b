"""SGLang's Triton tree kernels (``reconstruct_tree._reconstruct_tree_mask_kernel``,
``spec_tree.verify_tree_greedy_kernel_triton``) and its GPU-only commit kernels
(``eagle.prepare_verify_commit_outputs``, ``eagle.prepare_draft_extend_inputs``) on HYBRID's verify inputs, in
Triton's interpreter, for ``tests/plugin/test_sglang_verify_input.py``:

    TRITON_INTERPRET=1 python -m tests.plugin._scripts.sglang_tree_kernels IN.pt OUT.pt

``IN.pt``: a list of cases (``torch.save``); ``OUT.pt``: what the kernels wrote for each.
"""
import sys
import types


def _load_sglang():
    """SGLang's kernel modules. ``reconstruct_tree`` imports the compiled CPU op at module level; it is not installed
    and never called here, so a stub stands in for the import."""
    sys.modules.setdefault("vllm", None)
    _sk = types.ModuleType("sgl_kernel")
    _sks = types.ModuleType("sgl_kernel.speculative")
    _sks.reconstruct_indices_from_tree_mask = None
    _sk.speculative = _sks
    _sk.fill_accept_out_cache_loc_cpu = _sk.fill_bonus_tokens_cpu = None     # eagle.py's CPU imports, unused here
    sys.modules.setdefault("sgl_kernel", _sk)
    sys.modules.setdefault("sgl_kernel.speculative", _sks)
    from sglang.kernels.ops.speculative import eagle, reconstruct_tree, spec_tree
    from sglang.srt.utils import next_power_of_2

    return eagle, reconstruct_tree, spec_tree, next_power_of_2


def run(d: dict) -> dict:
    import torch

    eagle, reconstruct_tree, spec_tree, next_power_of_2 = _load_sglang()
    bs, w = d["bs"], d["w"]
    pos = torch.empty(bs * w, dtype=torch.int64)
    ri, rn, rs = (torch.empty(bs * w, dtype=torch.int64) for _ in range(3))
    reconstruct_tree._reconstruct_tree_mask_kernel[(bs,)](d["tree_mask"], d["seq_lens"], pos, ri, rn, rs, w,
                                                          next_power_of_2(w), num_warps=1)
    depth = d["max_depth"] + 1
    predicts = torch.full((bs * w,), -1, dtype=torch.int64)
    accept_index = torch.full((bs, depth), -1, dtype=torch.int64)
    accept_num = torch.zeros(bs, dtype=torch.int64)
    spec_tree.verify_tree_greedy_kernel_triton[(bs,)](
        predicts, accept_index, accept_num, d["candidates"], d["retrieve_index"], d["retrieve_next_token"],
        d["retrieve_next_sibling"], d["target_predict"], batch_size=bs, num_speculative_tokens=depth,
        num_draft_tokens=w)
    # the commit path SGLang takes only on a GPU (``predict.is_cuda`` in run_eagle_verify, ``accept_lens.is_cuda``
    # in the draft extend), fed what the verify kernel just produced on HYBRID's tree
    accept_lens = (accept_num + 1).to(torch.int32)
    new_seq_lens, bonus = eagle.prepare_verify_commit_outputs(predicts, accept_index, accept_lens, d["seq_lens"])
    correct, select, ids = eagle.prepare_draft_extend_inputs(accept_lens, predicts, w)
    return {"positions": pos, "retrieve_index": ri.view(bs, w), "retrieve_next_token": rn.view(bs, w),
            "retrieve_next_sibling": rs.view(bs, w), "predicts": predicts, "accept_index": accept_index,
            "accept_num": accept_num, "commit": {"new_seq_lens": new_seq_lens, "bonus": bonus},
            "draft_extend": {"correct": correct, "select": select, "ids": ids}}


def main(inp: str, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    _load_sglang()
    torch.save([run(d) for d in torch.load(inp)], out)


if __name__ == "__main__":
    main(*sys.argv[1:])
