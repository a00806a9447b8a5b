"""Tests of the pure decision core (``sglang_hybrid`` without SGLang) and the CPU reference loop."""
