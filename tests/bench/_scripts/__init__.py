"""Code the benchmark tests run in a fresh interpreter (``python -m tests.bench._scripts.<name>``): what must be
checked in a process of its own (its imports, its OpenMP pool). Each prints what it found; the assertions stay in the
test modules."""
