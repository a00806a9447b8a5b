"""Tests of the benchmark modules under ``bench/``."""
