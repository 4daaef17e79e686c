"""Benchmark and accuracy tooling for EVS: video datasets, TTFT sweeps, MMMU and Video-MME runners.

Every tool reports what the server reports (``usage.prompt_tokens``, time to
first token); none assumes that pruning saved anything.
"""
