"""sglang-evs: Efficient Video Sampling (EVS) for Qwen3-VL in SGLang.

Subpackages:
  evs/         pure-torch EVS algorithms (no SGLang imports)
  multimodal/  the model-agnostic embedding routine and its model contract
  models/      SGLang model classes (Qwen3-VL with EVS and deepstack on the ForwardBatch)
  processors/  SGLang multimodal processors (prompt layout under pruning, usage reporting)
  runtime/     CPU-only support so SGLang 0.5.23 runs without a GPU
  testing/     offline tiny Qwen3-VL builder and synthetic media
  bench/       benchmark and accuracy tooling
sglang_compat.py is the one module that names SGLang internals; plugin.py the entry point.
"""

__version__ = "0.1.0"
