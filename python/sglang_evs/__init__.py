"""sglang-evs: Efficient Video Sampling (EVS) for Qwen3-VL in SGLang.

Subpackages:
  evs/         pure-torch EVS algorithms (no SGLang imports)
  models/      SGLang model classes (Qwen3-VL with EVS)
  processors/  SGLang multimodal processors (prompt layout under pruning)
  runtime/     CPU-only support so SGLang 0.5.23 runs without a GPU
  testing/     offline tiny Qwen3-VL builder and synthetic media
  bench/       benchmark and accuracy tooling
"""

__version__ = "0.1.0"
