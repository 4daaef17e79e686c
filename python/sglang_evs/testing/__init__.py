"""Offline test fixtures: a tiny random Qwen3-VL checkpoint and synthetic media."""
