"""Code shared by test modules (no test module imports another): test data builders, SGLang objects made on the
CPU, the interpreter runner and the live engines' driver."""
