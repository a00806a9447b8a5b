"""CPU reference for Hybrid Spark: SmolLM2 offline (`models`), the EAGLE head (`eagle`), drafter adapters
(`drafters`), the batched speculative-decoding loop (`loop`), per-position traces (`trace`), prompts and corpora.
See docs/reference.md."""
