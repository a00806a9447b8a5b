"""Benchmarks (not tests), each run as ``python -m bench.<name>`` from the repository root.

  drafters      our n-gram drafter beside vLLM ngram, Arctic suffix decoding and SGLang's n-gram corpus
                (data.py: workloads; anchors.py: adapters for the other drafters)
  replay        policy replay, the paper's throughput table (replay_*.py, policies.py)
  step_cost     CPU time of the core's per-step decision against one target forward
  gpu_check     CUDA-graph capture / no host sync / equal-to-eager check of the core on a GPU
  vllm_compare  HYBRID side by side with vLLM's speculation
  memory_budget start-up memory of HYBRID's runtime states vs EAGLE per batch x context (computed, not measured)
  cost_tables   step-time tables for the replay (roofline.py: simulated GPU; profile_cpu.py: measured CPU)
"""
