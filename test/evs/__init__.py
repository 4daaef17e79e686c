"""Tests of the pure-torch EVS core (sglang_evs.evs)."""
