"""Code the core tests run in a child process (``python -m tests.core._scripts.<name>``): Triton's interpreter must be
on (``TRITON_INTERPRET=1``) before Triton's import, so it cannot run in the test process. Each prints what it
measured; the assertions stay in the test modules."""
