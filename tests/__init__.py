"""The pytest suite, by layer (docs/testing.md describes what each proves).

* ``core``: the pure torch/numpy decision core of ``sglang_hybrid`` (step, selector, calibration, cost and price,
  verification, widths, graph safety, request bias) and the CPU reference loop, its models and EAGLE head;
* ``ngram``: the Rust n-gram drafter's Python API and the device prompt lookup;
* ``kernels``: Triton kernels (HYBRID's and SGLang's) against torch or float64 oracles, in Triton's CPU interpreter,
  and their compilation for GPUs;
* ``plugin``: the SGLang plugin's objects against SGLang's real code, without a live engine;
* ``live``: live SGLang engines and HTTP servers on the CPU (marker ``live_sglang``);
* ``bench``: the benchmark modules under ``bench/``;
* ``test_docs.py``: the repository's documentation.

Shared code lives in ``helpers`` and fixtures in ``conftest.py``; no test module imports another. Code a test runs in
a child process (Triton's interpreter must be switched on before Triton's import) is a module of the layer's
``_scripts`` package, run with ``python -m``.
"""
