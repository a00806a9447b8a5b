"""Hybrid Spark: adaptive speculative decoding (model drafter + suffix-automaton n-gram drafter) for SGLang."""
