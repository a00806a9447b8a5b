"""Ragged tree verify: each request verifies exactly its own nodes, with its own tree mask.

One job per module: ``layout`` (SGLang-free tensor code: where each request's nodes sit in the compact forward, its
packed mask, gathers and scatters between the compact and padded rows), ``tiers`` (the row counts a forward is padded
to, one verify graph each), ``triton_backend`` (SGLang's Triton backend planning a verify batch from a layout, in
buffers sized at start), ``flashinfer_plan`` (the arguments SGLang's FlashInfer backend plans a ragged verify from,
eager or at a token tier), ``flashinfer_backend`` (SGLang's FlashInfer backend planning one CUDA-graph wrapper per token
tier, in buffers sized at start), ``target`` (the verify forward run compact inside SGLang's unchanged verify body),
``graph_runner`` (that forward as one graph per token tier, from static buffers) and ``graph_capture`` (how a tier is
captured: a CUDA graph, or on the CPU a trace-checked eager replay). ``HybridWorkerV2`` composes them when the setting
``ragged_verify`` is on (docs/sglang.md, "Ragged verify"). A new attention backend is one more module here.
"""
