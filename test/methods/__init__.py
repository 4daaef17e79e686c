"""Tests of the pure-torch pruning methods (sglang_evs.methods)."""
