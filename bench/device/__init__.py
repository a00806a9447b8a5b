"""The device run: what a lent GPU machine (one H200, 15 minutes, no SGLang, no network) checks and measures.

    bash bench/device_run.sh              # GPU present: the full run; none: the CPU mode (small sizes, < 2 minutes)
    bash bench/device_run.sh --prepare    # here, before a GPU call: wheels into dist/device/, carry size checked

Jobs (one module each, run in this order by ``python -m bench.device``):

  cost_table  step time of a Llama-3.1-8B-shaped bf16 target (random weights, a compact PyTorch decoder -- NOT
              SGLang) verifying B x W tree tokens over a 2k context, CUDA graphs, plus an EAGLE-3-shaped one-layer
              draft step; written as a replay cost table (``bench/replay/cli.py --cost-table``) and a plot
  selection   ``HybridStep.select`` + the SGLang-free verify-input build (tree links, FULL_MASK) at the deployed
              shapes, captured in a CUDA graph, replayed under ``set_sync_debug_mode("error")``, equal to the eager
              CPU result; latency per batch beside the measured target step
  lossless    ``verify.greedy_accept`` / ``sample_accept`` on CUDA equal to the CPU; the reference loop's HYBRID greedy
              decode on a random-weight model equal to plain greedy decoding; a greedy HYBRID decode on the device
              (``decode.py``: select, verify input, accept, after_verify around a small decoder) equal to plain greedy

Helpers: ``decoder.py`` (the compact decoder and draft), ``carry.py`` (the 64 MiB transfer check), ``_env.py``.

Everything here imports neither SGLang nor anything the bare machine lacks beyond the carried wheels (pydantic for
``HybridSettings``; the Rust extension, an abi3 wheel, for the reference loop's n-gram drafter).
"""
