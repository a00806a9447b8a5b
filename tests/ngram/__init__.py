"""Tests of the Rust n-gram drafter's Python API and the device prompt lookup."""
