"""Applications built on the library, each run as ``python -m sglang_hybrid.tools.<name>``.

* ``calibrate``: fit the n-gram (and model-drafter) acceptance calibration from replayed text, a trace or verify logs;
* ``calibration_check``: check the shipped n-gram calibration on a reference-loop trace of the target's own outputs;
* ``cost_profile``: a cost table from SGLang's one-batch benchmark results;
* ``demo``: Hybrid Spark end to end on a CPU (the reference loop on SmolLM2-135M);
* ``train_eagle``: train the EAGLE draft head for SmolLM2 on a CPU.

The library never imports from here; what a tool shares with another lives in a library module.
"""
