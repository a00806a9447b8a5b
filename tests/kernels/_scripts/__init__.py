"""Code the kernel tests run in a child process (``python -m tests.kernels._scripts.<name> ...``): Triton's interpreter
must be on (``TRITON_INTERPRET=1``) before Triton's import, so it cannot run in the test process. Each prints or
saves what it measured; the assertions stay in the test modules."""
