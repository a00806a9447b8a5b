"""Triton kernels against torch or float64 oracles (Triton's CPU interpreter), and their GPU compilation."""
